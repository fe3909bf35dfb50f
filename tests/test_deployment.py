"""Every method that needs a deployment check, on one loopback deployment: a real SuperLink and
three SuperNodes on 127.0.0.1, each holding its own shard, driven by ``flwr run``
(``deployment_harness.py``).

One deployment serves every test of this module (starting one costs tens of seconds): FedAvg,
the test suite's two-exchange plug-in method (``tests/pflarena_test_methods.py``, loaded through
``PFLARENA_PLUGINS`` by the ServerApp and every ClientApp), and each seed paper's method. A new
method that needs a deployment check joins ``SEED_METHODS`` here and costs its rounds only.
``test_deployment_faults.py`` stops the SuperLink and kills a SuperNode on a deployment of its
own; ``test_deployment_secure.py`` runs with TLS and SuperNode authentication.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from deployment_harness import (
    PLUGINS,
    Deployment,
    completed_rounds,
    run_config,
    started_deployment,
)
from helpers import grid_for, run_local

from pflarena.server.build import parse_config

pytestmark = pytest.mark.slow

#: The seed issues ask for their methods on three SuperNodes that each hold their own shard.
NUM_NODES = 3


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One SuperLink and its three SuperNodes for every test of this module."""
    yield from started_deployment(tmp_path_factory, NUM_NODES)


# --------------------------------------------------------------------------- tests
def test_fedavg_on_the_supernodes_shards(deployment: Deployment, tmp_path: Path) -> None:
    shards = deployment.shards
    out = tmp_path / "out"
    cfg = run_config(out, num_clients=NUM_NODES, num_rounds=1, round_timeout=120.0)
    proc = deployment.submit(cfg)
    rc = deployment.wait(proc, expected=[*deployment.supernodes, deployment.superlink])
    rounds = completed_rounds(deployment, out, rc)
    logs = deployment.log_tails

    assert [r["round"] for r in rounds] == [0, 1], f"{rounds}\n{logs()}"
    trained = rounds[1]["train"]
    assert trained["sampled"] == list(range(NUM_NODES)), f"{trained}\n{logs()}"
    assert (trained["clients"], trained["failures"]) == (NUM_NODES, 0), trained

    # The client ids and test-set sizes come from the shard files: node i used shard i.
    test_sizes = {str(i): len(np.load(path)["y_test"]) for i, path in enumerate(shards)}
    for record in (rounds[0], rounds[-1]):
        per_client = record["evaluation"]["per_client"]
        assert {k: v["test_samples"] for k, v in per_client.items()} == test_sizes, record
    acc0 = rounds[0]["evaluation"]["personalized"]["mean"]
    acc1 = rounds[-1]["evaluation"]["personalized"]["mean"]
    assert acc1 > acc0, f"personalized accuracy did not rise: {acc0:.4f} -> {acc1:.4f}"

    # The same run in-process, on the same shard files, reaches the same accuracy (up to
    # the order in which replies are summed).
    local_cfg = cfg.model_copy(update={"output_dir": ""})
    grid = grid_for(local_cfg, node_configs=[{"data-path": str(p)} for p in shards])
    local = run_local(local_cfg, tmp_path / "in-process", grid=grid)
    local_acc = local.rounds[-1]["evaluation"]["personalized"]["mean"]
    assert acc1 == pytest.approx(local_acc, abs=0.02), (acc1, local_acc)


def test_two_exchanges_per_round_on_the_deployment(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plug-in line search: a gradient and a line-search exchange in every round."""
    monkeypatch.setenv("PFLARENA_PLUGINS", PLUGINS)  # to validate its config here too
    out = tmp_path / "out"
    cfg = parse_config(
        {
            "strategy": "line-search",
            "dataset": "digits",
            "partition": "iid",
            "num-clients": NUM_NODES,
            "num-rounds": 1,
            "round-timeout": 120.0,
            "output-dir": str(out),
        }
    )
    proc = deployment.submit(cfg)
    rc = deployment.wait(proc, expected=[*deployment.supernodes, deployment.superlink])
    rounds = completed_rounds(deployment, out, rc)
    logs = deployment.log_tails
    assert [r["round"] for r in rounds] == [0, 1], f"{rounds}\n{logs()}"
    record = rounds[1]
    names = [e["name"] for e in record["exchanges"]]
    assert names == ["gradients", "line-search"], f"{record}\n{logs()}"
    for exchange in record["exchanges"]:
        assert exchange["sent"] == NUM_NODES and exchange["failures"] == 0, exchange
        assert exchange["bytes_down"] > 0 and exchange["bytes_up"] > 0, exchange
    assert record["bytes_up"] == sum(e["bytes_up"] for e in record["exchanges"])
    assert (
        rounds[-1]["evaluation"]["personalized"]["mean"]
        > rounds[0]["evaluation"]["personalized"]["mean"]
    )


#: Every seed paper's method, with what its run needs beyond the defaults, and the client
#: state entry that must persist from round to round on each node.
SEED_METHODS: dict[str, tuple[dict[str, Any], str]] = {
    "pfedgt": ({}, "pfedgt/personal-model"),
    "pfedsv": ({"validation-fraction": 0.2}, "pfedsv/personal-model"),
    "fedpg": ({}, "fedpg/personal-model"),
    "ppfl": ({}, "ppfl/membership"),
    "page": ({"server-fraction": 0.1}, "page/agent"),
}


@pytest.mark.parametrize("method", sorted(SEED_METHODS))
def test_seed_method_on_the_deployment(deployment: Deployment, tmp_path: Path, method: str) -> None:
    """Two rounds of each seed method on the one deployment (the seed issues' acceptance),
    every node training on its own shard; every node's client state holds the method's
    entry from both rounds."""
    extra, entry = SEED_METHODS[method]
    out = tmp_path / "out"
    cfg = parse_config(
        {
            "strategy": method,
            "dataset": "digits",
            "partition": "iid",
            "seed": 0,
            "num-clients": NUM_NODES,
            "num-rounds": 2,
            "eval-every": 2,
            "fraction-train": 1.0,
            "round-timeout": 120.0,
            "output-dir": str(out),
            **extra,
        }
    )
    proc = deployment.submit(cfg)
    rc = deployment.wait(proc, expected=[*deployment.supernodes, deployment.superlink])
    rounds = completed_rounds(deployment, out, rc)
    logs = deployment.log_tails
    assert [r["round"] for r in rounds] == [0, 1, 2], f"{rounds}\n{logs()}"
    for record in rounds[1:]:
        assert record["train"]["sampled"] == list(range(NUM_NODES)), f"{record}\n{logs()}"
        assert record["train"]["failures"] == 0, f"{record}\n{logs()}"
    assert sorted(rounds[-1]["evaluation"]["per_client"]) == [str(i) for i in range(NUM_NODES)]
    # On each node: versions of this run's client state from round 1 and from round 2
    # (update ids r·100 + exchange), each holding the method's entry. The run's state lies
    # under the state key the server drew for the run and recorded in config.json.
    key = json.loads((out / "config.json").read_text())["state_key"]
    stored = entry.replace("/", "__") + ".npz"  # core/versions.py's file name
    for node in range(NUM_NODES):
        versions = list((deployment.root / f"state-sn{node}" / key).glob("client-*/v*"))
        by_round = {int(v.name[1:]) // 100 for v in versions if (v / stored).exists()}
        assert {1, 2} <= by_round, f"node {node}: {sorted(v.name for v in versions)}\n{logs()}"
