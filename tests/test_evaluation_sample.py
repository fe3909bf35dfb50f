"""``fraction-evaluate``: evaluations that test a seeded sample of the clients.

Round 0 tests every client (it learns which client each node holds) unless
``initial-evaluation=sample`` on an engine that knows each node's client without a message,
the rounds between a fresh sample of ``fraction-evaluate`` of them, the last every client
again unless ``final-evaluation=sample``; the round's record says how many were asked, of how
many.
"""

from __future__ import annotations

import logging

import pytest
from helpers import (
    comparable,
    config,
    die_in_round,
    grid_for,
    run_local,
    run_resumable,
    stateful_grid,
)

from pflarena.core.config import ConfigError
from pflarena.core.federation import build_federation
from pflarena.core.shard_format import write_shards
from pflarena.reporting.compare import clients_cell
from pflarena.server.loop import evaluation_fraction, summary_record
from pflarena.server.results import read_rounds


def _evaluated(rounds: list[dict]) -> list[list[int]]:
    return [sorted(int(c) for c in r["evaluation"]["per_client"]) for r in rounds]


def test_round_zero_and_the_last_test_every_client_unless_asked():
    cfg = config(num_rounds=4, fraction_evaluate=0.3)
    assert [evaluation_fraction(cfg, r) for r in range(5)] == [1.0, 0.3, 0.3, 0.3, 1.0]
    sampled = config(num_rounds=4, fraction_evaluate=0.3, final_evaluation="sample")
    assert [evaluation_fraction(sampled, r) for r in range(5)] == [1.0, 0.3, 0.3, 0.3, 0.3]
    assert [evaluation_fraction(config(num_rounds=2), r) for r in range(3)] == [1.0] * 3
    first = config(num_rounds=2, fraction_evaluate=0.3, initial_evaluation="sample")
    assert [evaluation_fraction(first, r) for r in range(3)] == [0.3, 0.3, 1.0]


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("fraction_evaluate", 0.0, "fraction-evaluate"),
        ("fraction_evaluate", 1.5, "fraction-evaluate"),
        ("final_evaluation", "some", "final-evaluation"),
        ("initial_evaluation", "none", "initial-evaluation"),
    ],
)
def test_bad_values_are_refused_by_name(key, value, says):
    with pytest.raises(ConfigError, match=says):
        config(**{key: value})


def test_a_sampled_run_evaluates_a_fresh_seeded_sample_and_trains_as_without(tmp_path):
    cfg = config(strategy="fedavg", num_clients=10, num_rounds=4, fraction_train=0.3, seed=3)
    full = run_local(cfg, tmp_path / "full").rounds
    sampled_cfg = cfg.model_copy(update={"fraction_evaluate": 0.3})
    sampled = run_local(sampled_cfg, tmp_path / "sampled").rounds

    everyone = list(range(10))
    evaluated = _evaluated(sampled)
    assert evaluated[0] == evaluated[4] == everyone
    assert all(len(clients) == 3 for clients in evaluated[1:4]), evaluated
    assert len({tuple(c) for c in evaluated[1:4]}) > 1, "the same sample every round"
    for record in sampled[1:4]:
        assert record["evaluation"]["sample"] == {"asked": 3, "connected": 10, "fraction": 0.3}
        assert record["evaluation"]["personalized"]["num_clients"] == 3
    assert all("sample" not in r["evaluation"] for r in (sampled[0], sampled[4]))
    # the evaluations carried fewer bytes down, and the sample did not change training: the
    # same clients trained to the same model (the evaluation draws from a stream of its own)
    assert sampled[2]["eval_bytes_down"] * 10 == full[2]["eval_bytes_down"] * 3
    assert [r["train"]["sampled"] for r in sampled[1:]] == [r["train"]["sampled"] for r in full[1:]]
    assert sampled[4]["evaluation"] == full[4]["evaluation"]
    # each sampled client's figure is the one the full evaluation gives it
    for got, whole in zip(sampled[1:4], full[1:4], strict=True):
        per_client = got["evaluation"]["per_client"]
        assert per_client == {c: whole["evaluation"]["per_client"][c] for c in per_client}

    again = run_local(sampled_cfg, tmp_path / "again").rounds
    assert _evaluated(again) == evaluated


def test_a_sampled_last_evaluation_is_stated_beside_its_figures(tmp_path):
    cfg = config(
        strategy="fedavg",
        num_clients=8,
        num_rounds=2,
        fraction_evaluate=0.25,
        final_evaluation="sample",
    )
    rounds = run_local(cfg, tmp_path).rounds
    assert _evaluated(rounds)[0] == list(range(8))
    assert [len(c) for c in _evaluated(rounds)[1:]] == [2, 2]
    summary = summary_record(cfg, rounds, status="completed", wall_time_s=1.0)
    assert summary["personalized"]["last"]["clients"] == 2
    assert clients_cell(summary) == "8 (2 evaluated)"


@pytest.mark.parametrize("strategy", ["pfedhn", "splitgp"])
def test_methods_with_their_own_evaluation_messages_sample_too(strategy, tmp_path):
    """pFedHN sends each client its own generated model, SplitGP its auxiliary classifier."""
    cfg = config(strategy=strategy, num_clients=6, num_rounds=2, fraction_evaluate=0.5)
    rounds = run_local(cfg, tmp_path).rounds
    assert [len(c) for c in _evaluated(rounds)] == [6, 3, 6]
    assert all(r["evaluation"]["failures"] == 0 for r in rounds)


def test_a_resumed_run_evaluates_the_samples_of_the_uninterrupted_one(tmp_path):
    """After a restart the nodes have new ids: the sample is drawn over client ids."""
    cfg = config(strategy="ditto", num_clients=6, num_rounds=5, fraction_evaluate=0.5)
    whole, _ = run_resumable(
        cfg, tmp_path / "whole", stateful_grid(cfg, tmp_path / "state-whole", 1_000_003)
    )
    grid = stateful_grid(cfg, tmp_path / "state-broken", 2_000_003)
    die_in_round(grid, 4)
    with pytest.raises(KeyboardInterrupt):
        run_resumable(cfg, tmp_path / "broken", grid)
    resumed, _ = run_resumable(
        cfg, tmp_path / "broken", stateful_grid(cfg, tmp_path / "state-broken", 3_000_017), True
    )
    assert [len(c) for c in _evaluated(whole.rounds)] == [6, 3, 3, 3, 3, 6]
    assert comparable(read_rounds(tmp_path / "broken" / "rounds.jsonl")) == comparable(whole.rounds)
    assert comparable(resumed.rounds) == comparable(whole.rounds)


@pytest.mark.parametrize("strategy", ["fedavg", "pfedhn"])
def test_a_sampled_round_zero_trains_as_a_full_one(strategy, tmp_path):
    """``initial-evaluation=sample``: the in-process engine knows each simulated node's
    client (its partition id), so round 0 tests a sample and the strategy still knows every
    client: the same clients train to the same results as with a full round 0 (pFedHN: each
    generated model is its client's embedding's), and each sampled client's round-0 figure
    is its figure in the full evaluation (FedAvg's)."""
    cfg = config(strategy=strategy, num_clients=8, num_rounds=3, fraction_train=0.5, seed=5)
    full = run_local(cfg, tmp_path / "full").rounds
    sampled_cfg = cfg.model_copy(update={"fraction_evaluate": 0.25, "initial_evaluation": "sample"})
    sampled = run_local(sampled_cfg, tmp_path / "sampled").rounds

    assert [len(c) for c in _evaluated(sampled)] == [2, 2, 2, 8]
    assert sampled[0]["evaluation"]["sample"] == {"asked": 2, "connected": 8, "fraction": 0.25}
    per_client = sampled[0]["evaluation"]["per_client"]
    if strategy == "fedavg":
        assert per_client == {c: full[0]["evaluation"]["per_client"][c] for c in per_client}
    # (pFedHN: a node whose client is unknown tests the initial model, a known one the model
    # its embedding generates: a full round 0 knows no client yet, a sampled one every client)
    assert [r["train"]["sampled"] for r in sampled[1:]] == [r["train"]["sampled"] for r in full[1:]]
    assert [r["train"]["failures"] for r in sampled[1:]] == [0, 0, 0]
    assert sampled[3]["evaluation"]["per_client"] == full[3]["evaluation"]["per_client"]
    assert sampled[0]["eval_bytes_down"] * 4 == full[0]["eval_bytes_down"]


def test_where_the_engine_cannot_tell_round_zero_tests_every_client(tmp_path, caplog):
    """Nodes that read files of their own (a deployment's ``data-path``): only their replies
    say which client each holds, so round 0 tests them all, and the log says why."""
    cfg = config(num_clients=4, num_rounds=1, fraction_evaluate=0.5, initial_evaluation="sample")
    spec = cfg.federation_spec()
    shards = write_shards(build_federation(spec), tmp_path / "shards", spec)
    grid = grid_for(cfg, node_configs=[{"data-path": str(path)} for path in shards])
    assert grid.known_client_ids() is None
    with caplog.at_level(logging.WARNING):
        rounds = run_local(cfg, tmp_path / "run", grid=grid).rounds
    assert [len(c) for c in _evaluated(rounds)] == [4, 4]
    assert "sample" not in rounds[0]["evaluation"]
    assert "round 0 tests every client" in caplog.text
