"""``slow-fedavg``: FedAvg whose client 0 sleeps in training, loaded through
``PFLARENA_PLUGINS``: a client that runs past the round timeout (tests/test_slow_client.py).

How long it sleeps is ``PFLARENA_TEST_SLEEP_S`` (seconds, default 60), read by the client.
"""

from __future__ import annotations

import os
import time

from pflarena.core.methods import MethodDeclaration
from pflarena.methods.fedavg import solver as fedavg
from pflarena.methods.fedavg.strategy import FedAvg

#: The client that sleeps.
SLOW_CLIENT = 0


class SlowFedAvg(FedAvg):
    declaration = MethodDeclaration(
        name="slow-fedavg",
        kind="plugin",
        reference="tests/slow_client_methods.py",
        summary="FedAvg whose client 0 sleeps in training",
        solver=__name__,
    )


PFLARENA_STRATEGIES = (SlowFedAvg,)


def train(job):
    if job.client_id == SLOW_CLIENT:
        time.sleep(float(os.environ.get("PFLARENA_TEST_SLEEP_S", "60")))
    return fedavg.train(job)


evaluate = fedavg.evaluate
personalized_model = fedavg.personalized_model
