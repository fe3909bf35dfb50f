"""A method whose clients misbehave on purpose, loaded through ``PFLARENA_PLUGINS`` by the
executor tests (``tests/test_executor.py``).

``fault-avg`` is ``toy-avg`` (FedAvg with a server step) whose clients follow the plan in the
file ``$PFLARENA_FAULT_PLAN`` names (read at every train message, so one deployment can run
several plans; no file, no faults), a comma-separated list of ``kind@client:round``: client
``client``, when it trains in round ``round``,

* ``crash``: dies at once (``os._exit``), as a segfault would leave it: no reply, no status;
* ``kill``: sends itself SIGKILL, as the kernel's OOM killer would;
* ``hang``: sleeps for an hour;
* ``memory``: allocates 64 GiB (past any ``--task-memory-mb``: a ``MemoryError``);
* ``raise``: raises a Python exception (Flower's error reply).

Every other message trains as ``toy-avg`` does.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pflarena_test_methods as toy

from pflarena.core.methods import MethodDeclaration

MODULE = __name__
FAULTS = ("crash", "kill", "hang", "memory", "raise")
PLAN_ENV = "PFLARENA_FAULT_PLAN"


def parse_plan(plan: str) -> dict[tuple[int, int], str]:
    """``"crash@0:1,hang@1:2"`` -> ``{(0, 1): "crash", (1, 2): "hang"}`` (client, round)."""
    faults = {}
    for item in filter(None, (part.strip() for part in plan.split(","))):
        kind, _, where = item.partition("@")
        client, _, server_round = where.partition(":")
        if kind not in FAULTS or not client.isdigit() or not server_round.isdigit():
            raise ValueError(
                f"fault {item!r}: write kind@client:round, kind one of {', '.join(FAULTS)}"
            )
        faults[int(client), int(server_round)] = kind
    return faults


def current_plan() -> dict[tuple[int, int], str]:
    """The plan in the file ``$PFLARENA_FAULT_PLAN`` names (none without one)."""
    path = os.environ.get(PLAN_ENV)
    if not path or not Path(path).is_file():
        return {}
    return parse_plan(Path(path).read_text())


class FaultAvg(toy.ToyAvg):
    declaration = MethodDeclaration(
        name="fault-avg",
        kind="plugin",
        reference="tests/pflarena_fault_methods.py",
        summary="toy-avg whose clients fail on purpose as planned",
        solver=MODULE,
        params=toy.ToyAvgParams,
    )


PFLARENA_STRATEGIES = [FaultAvg]


def train(job):
    fault = current_plan().get((job.client_id, job.server_round))
    if fault == "crash":
        os._exit(70)
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "hang":
        time.sleep(3600)
    if fault == "memory":
        hoard = bytearray(64 * 1024**3)
        del hoard  # not reached under --task-memory-mb: the allocation fails
    if fault == "raise":
        raise RuntimeError("fault-avg: this client fails on purpose")
    return toy.train_toy_avg(job)


evaluate = toy.evaluate
