"""pflarena's start-up of Flower's runtime, and its in-process engine, give the results of
`flwr run` on a SuperLink."""

from __future__ import annotations

import json

import pytest
from test_resume import comparable

from pflarena.runtime.engines import WORKER_START_ENV
from pflarena.runtime.launch import run_simulations, simulate
from pflarena.server.build import parse_config
from pflarena.server.results import read_rounds

pytestmark = pytest.mark.slow

#: Client sampling (pFedGT at 50%) and client state kept across rounds (both methods).
CONFIGS = {
    "pfedgt": {"strategy": "pfedgt", "num-clients": 6, "num-rounds": 3, "fraction-train": 0.5},
    "ditto": {"strategy": "ditto", "num-clients": 4, "num-rounds": 2, "alpha": 0.3},
}


def test_runs_on_one_runtime_and_in_process_give_the_rounds_of_flwr_run_on_a_superlink(
    tmp_path, monkeypatch
):
    """Catches a runtime (pflarena's start-up of Flower's Ray engine, or the in-process
    engine without Ray, one by one or in worker processes, forked as on the CPU or spawned
    as on a GPU) that changes what a run computes: a different fused run config,
    node config or client state, or a ClientApp changing the server's records in place.
    The first two are both on Ray, whose two actors finish the clients of a round in
    varying order: equal rounds also mean the order does not matter."""

    def cfg(name: str, where: str):
        return parse_config(CONFIGS[name] | {"output-dir": str(tmp_path / where / name)})

    for name in CONFIGS:
        simulate(cfg(name, "superlink"), verbosity=0, superlink=True)
    # both runs in one simulation process: the second one on the first one's actors
    code, tail = run_simulations(
        [cfg(name, "runtime") for name in CONFIGS], verbosity=0, engine="ray"
    )
    assert code == 0, "".join(tail)
    # in-process, one by one and in worker processes (the default)
    code, tail = run_simulations(
        [cfg(name, "inprocess") for name in CONFIGS], verbosity=0, engine="inprocess", workers=1
    )
    assert code == 0, "".join(tail)
    code, tail = run_simulations(
        [cfg(name, "workers") for name in CONFIGS], verbosity=0, engine="inprocess", workers=3
    )
    assert code == 0, "".join(tail)
    # the GPU's code path on the CPU: workers spawned, started before the first client
    monkeypatch.setenv(WORKER_START_ENV, "spawn")
    code, tail = run_simulations(
        [cfg(name, "spawned") for name in CONFIGS], verbosity=0, engine="inprocess", workers=2
    )
    assert code == 0, "".join(tail)
    for name in CONFIGS:
        before = read_rounds(tmp_path / "superlink" / name / "rounds.jsonl")
        for where in ("runtime", "inprocess", "workers", "spawned"):
            after = read_rounds(tmp_path / where / name / "rounds.jsonl")
            assert len(after) == CONFIGS[name]["num-rounds"] + 1
            assert comparable(after) == comparable(before), (name, where)
            summary = json.loads((tmp_path / where / name / "summary.json").read_text())
            assert summary["status"] == "completed"
