"""A method whose client 1 replies with a hostile packed record, loaded through
``PFLARENA_PLUGINS`` by the loopback fault tests (``tests/test_deployment_faults.py``).

``hostile-avg`` is ``toy-avg`` whose client 1, when it trains, replies with its arrays as one
packed record whose table is JSON nested 100,000 deep (``[[[[...``): the reply that raised
``RecursionError`` in the ServerApp's parser and ended deployed runs. The ClientApp leaves a
one-array record as it is, so it travels as the client wrote it.
"""

from __future__ import annotations

import pflarena_test_methods as toy
from flwr.app import Array, ArrayRecord

from pflarena.core.methods import MethodDeclaration
from pflarena.core.packing import PACKED_KEY, PACKED_STYPE

MODULE = __name__
#: The client whose replies are hostile.
HOSTILE_CLIENT = 1
#: Its packed record: the format's header, then a table nested 100,000 deep.
TABLE = b"[" * 100_000
BLOB = b"PFLPACK1" + len(TABLE).to_bytes(4, "big") + TABLE


class HostileAvg(toy.ToyAvg):
    declaration = MethodDeclaration(
        name="hostile-avg",
        kind="plugin",
        reference="tests/pflarena_hostile_methods.py",
        summary="toy-avg whose client 1 replies with a hostile packed record",
        solver=MODULE,
        params=toy.ToyAvgParams,
    )


PFLARENA_STRATEGIES = [HostileAvg]


def train(job):
    records, metrics = toy.train_toy_avg(job)
    if job.client_id == HOSTILE_CLIENT:
        packed = Array(dtype="bytes", shape=(len(BLOB),), stype=PACKED_STYPE, data=BLOB)
        records = {name: ArrayRecord({PACKED_KEY: packed}) for name in records}
    return records, metrics


evaluate = toy.evaluate
