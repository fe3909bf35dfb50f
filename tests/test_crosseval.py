"""Cross-evaluation: personalized models tested on other clients' test splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord, RecordDict
from helpers import config, grid_for, run_local, stored

from pflarena.core import keys
from pflarena.core.config import ConfigError
from pflarena.core.federation import load_client
from pflarena.core.models import build_model
from pflarena.methods.local.solver import MODEL_KEY
from pflarena.server.crosseval import (
    cross_owners,
    cross_scores,
    score_problem,
    synthetic_partners,
)
from pflarena.server.results import summarize_rounds
from pflarena.strategies.replies import ClientSizes


# --------------------------------------------------------------------------- the draws
def test_owners_are_a_seeded_sample_of_the_requested_size():
    owners = cross_owners(20, 6, seed=3)
    assert owners == sorted(set(owners)) and len(owners) == 6
    assert all(0 <= c < 20 for c in owners)
    assert cross_owners(20, 6, seed=3) == owners
    assert cross_owners(20, 20, seed=3) == list(range(20))
    assert len({tuple(cross_owners(20, 6, seed=s)) for s in range(10)}) > 1
    with pytest.raises(ValueError, match="cross-eval-clients"):
        cross_owners(5, 6, seed=0)


@pytest.mark.parametrize(
    ("num_clients", "fraction", "size"),
    [(101, 0.5, 50), (11, 0.0, 0), (11, 1.0, 10), (10, 0.5, 5), (4, 0.5, 2), (100, 0.1, 10)],
)
def test_synthetic_partners_are_round_m_minus_1_times_c_other_clients(num_clients, fraction, size):
    for owner in (0, num_clients - 1):
        partners = synthetic_partners(num_clients, owner, fraction, seed=1)
        assert len(partners) == size == len(set(partners))
        assert owner not in partners and all(0 <= j < num_clients for j in partners)
        assert synthetic_partners(num_clients, owner, fraction, seed=1) == partners


def test_scores_by_hand():
    accuracy = {
        0: {0: 0.9, 1: 0.2, 2: 0.4, 3: 0.5},
        2: {0: 0.1, 1: 0.3, 2: 0.8, 3: 0.6},
        3: {0: 0.7, 1: 0.5, 2: 0.3},  # client 3 did not score model 3
    }
    out = cross_scores(accuracy, num_clients=4, fraction=1 / 3, seed=0)
    # One partner each (round(3 · 1/3) = 1): the means over {i, partner}.
    locals_, synthetics, globals_ = [], [], []
    for owner, row in accuracy.items():
        (partner,) = synthetic_partners(4, owner, 1 / 3, seed=0)
        mine = [row[j] for j in (owner, partner) if j in row]
        synthetics.append(sum(mine) / len(mine))
        globals_.append(sum(row.values()) / len(row))
        if owner in row:
            locals_.append(row[owner])
        assert out["per_owner"][str(owner)]["global"] == pytest.approx(globals_[-1])
    assert out["per_owner"]["3"]["local"] is None
    assert out["local"]["mean"] == pytest.approx(np.mean(locals_))
    assert out["synthetic"]["mean"] == pytest.approx(np.mean(synthetics))
    assert out["synthetic"]["std"] == pytest.approx(np.std(synthetics))
    assert out["global"]["mean"] == pytest.approx(np.mean(globals_))


def _scores(owners: list[int], correct: list[float], count: list[float]) -> RecordDict:
    metrics = {keys.CROSS_OWNERS: owners, keys.CROSS_CORRECT: correct, keys.CROSS_COUNT: count}
    return RecordDict({keys.METRICS: MetricRecord(metrics)})


def test_score_counts_must_be_the_scoring_clients_test_split():
    """A client's scores of the exported models count its own test split, which the server
    knows from the manifest or the federation's spec: 40 samples for client 1 here. Any other count,
    a fraction, more correct than counted, or the wrong models is refused, naming why."""
    sizes = ClientSizes(num_train=(100, 120), num_val=(10, 12), num_test=(30, 40))
    ok = _scores([0, 1], [12.0, 33.0], [40.0, 40.0])
    assert score_problem(ok, [0, 1], 1, sizes) is None
    inflated = _scores([0, 1], [12.0, 900.0], [40.0, 1000.0])
    assert "is not client 1's 40 test samples" in score_problem(inflated, [0, 1], 1, sizes)
    assert "whole numbers" in score_problem(
        _scores([0, 1], [12.5, 3.0], [40.0, 40.0]), [0, 1], 1, sizes
    )
    assert "counts are not counts" in score_problem(
        _scores([0, 1], [41.0, 3.0], [40.0, 40.0]), [0, 1], 1, sizes
    )
    assert "was sent [0, 1]" in score_problem(
        _scores([1, 0], [1.0, 1.0], [40.0, 40.0]), [0, 1], 1, sizes
    )
    # where the server knows no sizes, a bound
    assert score_problem(inflated, [0, 1], 1, None) is None
    huge = _scores([0], [1.0], [1e12])
    assert "exceeds" in score_problem(huge, [0], 1, None)


# --------------------------------------------------------------------------- in runs
def _accuracy(cfg, weights: dict[str, torch.Tensor], client: int) -> float:
    """Plain torch, outside the solver's evaluation code: argmax on the test split."""
    data, info = load_client(cfg.federation_spec(), client)
    model = build_model(cfg.model_name(), tuple(info.input_shape), info.num_classes)
    model.load_state_dict(weights)
    model.eval()
    with torch.no_grad():
        predicted = model(torch.as_tensor(data.x_test)).argmax(dim=1).numpy()
    return float((predicted == data.y_test).mean())


def test_local_models_scored_on_every_client_match_an_independent_evaluation(tmp_path):
    cfg = config(
        strategy="local", num_clients=4, num_rounds=2, cross_eval_clients=3, cross_eval_fraction=1.0
    )
    grid = grid_for(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid)
    rounds = outcome.rounds
    for record in rounds:  # every evaluation, round 0 included
        assert record["evaluation"]["cross"]["owners"] == cross_owners(4, 3, cfg.seed)
    last = rounds[-1]["evaluation"]
    cross = last["cross"]
    assert cross["clients"] == [0, 1, 2, 3] and cross["failures"] == 0

    models = {}
    for context in grid.contexts.values():
        client = int(context.node_config["partition-id"])
        models[client] = stored(context, MODEL_KEY).to_torch_state_dict()
    for row, owner in zip(cross["matrix"], cross["owners"], strict=True):
        expected = [_accuracy(cfg, models[owner], j) for j in cross["clients"]]
        assert row == pytest.approx(expected, abs=1e-12)
        # its own column is the protocol's personalized accuracy of that client
        assert cross["per_owner"][str(owner)]["local"] == pytest.approx(
            last["per_client"][str(owner)]["personalized"]
        )
    # c = 1: synthetic accuracy is global accuracy; local models generalize worse than that
    assert cross["synthetic"]["mean"] == pytest.approx(cross["global"]["mean"])
    assert cross["local"]["mean"] > cross["global"]["mean"]
    # its traffic is counted apart: 3 models up, 3 models to each of 4 clients down
    size = rounds[-1]["cross_eval_bytes_up"] / 3
    assert size > 0 and rounds[-1]["cross_eval_bytes_down"] == pytest.approx(12 * size, rel=0.01)
    summary = summarize_rounds(rounds)
    assert summary["cross"]["global"] == cross["global"] and summary["cross"]["round"] == 2
    assert summary["cross_eval_bytes_up"] == sum(r["cross_eval_bytes_up"] for r in rounds)


def test_fedavg_personalized_model_is_the_global_model_on_every_client(tmp_path):
    cfg = config(strategy="fedavg", num_clients=4, num_rounds=1, cross_eval_clients=4)
    last = run_local(cfg, tmp_path).rounds[-1]["evaluation"]
    cross = last["cross"]
    rows = np.array(cross["matrix"], dtype=float)
    np.testing.assert_allclose(rows, np.tile(rows[0], (4, 1)))  # one model, four owners
    per_client = [last["per_client"][str(j)]["personalized"] for j in cross["clients"]]
    np.testing.assert_allclose(rows[0], per_client)
    assert cross["global"]["std"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize(
    ("strategy", "key"),
    [
        ("fedavg", "fedavg/local-result"),
        ("fedprox", "fedprox/local-result"),
        ("fedmgda", "fedmgda/personal-model"),
    ],
)
def test_local_result_p_models_are_each_clients_latest_trained_model(tmp_path, strategy, key):
    cfg = config(
        strategy=strategy,
        num_clients=4,
        num_rounds=2,
        fraction_train=1.0,
        cross_eval_clients=4,
        cross_eval_fraction=1.0,
        **{f"{strategy}.personal-model": "local-result"},
    )
    grid = grid_for(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid)
    last = outcome.rounds[-1]["evaluation"]
    cross = last["cross"]
    assert cross["owners"] == cross["clients"] == [0, 1, 2, 3] and cross["failures"] == 0

    kept = {
        int(context.node_config["partition-id"]): stored(context, key).to_torch_state_dict()
        for context in grid.contexts.values()
    }
    rows = np.array(cross["matrix"], dtype=float)
    for row, owner in zip(rows, cross["owners"], strict=True):
        assert row == pytest.approx([_accuracy(cfg, kept[owner], j) for j in range(4)], abs=1e-12)
        assert last["per_client"][str(owner)]["personalized"] == pytest.approx(row[owner])
    assert len({tuple(row) for row in rows}) > 1  # four models, not one global model
    final = outcome.arrays.to_torch_state_dict()
    global_acc = [_accuracy(cfg, final, j) for j in range(4)]
    assert last["global"]["mean"] == pytest.approx(np.mean(global_acc))
    if strategy != "fedmgda":  # FedAvg's update: the example-weighted mean of the kept models
        sizes = np.array([len(load_client(cfg.federation_spec(), c)[0].y_train) for c in range(4)])
        for name, tensor in final.items():
            mean = sum(w * kept[c][name] for c, w in enumerate(sizes / sizes.sum()))
            torch.testing.assert_close(tensor, mean.to(tensor.dtype), rtol=1e-5, atol=1e-6)


def test_an_unknown_personal_model_is_refused_by_name():
    with pytest.raises(ConfigError, match="fedmgda.personal-model: Input should be 'global'"):
        config(strategy="fedmgda", **{"fedmgda.personal-model": "local"})


def test_off_by_default_and_more_owners_than_clients_is_refused(tmp_path):
    rounds = run_local(config(strategy="fedavg", num_clients=3, num_rounds=1), tmp_path).rounds
    assert all("cross" not in r["evaluation"] for r in rounds)
    assert all("cross_eval_bytes_down" not in r for r in rounds)
    with pytest.raises(ConfigError, match="cross-eval-clients=4 is more than num-clients=3"):
        config(strategy="fedavg", num_clients=3, cross_eval_clients=4)


def test_cross_eval_every_k_rounds_and_at_the_last(tmp_path):
    cfg = config(
        strategy="fedavg", num_clients=3, num_rounds=5, cross_eval_clients=2, cross_eval_every=2
    )
    rounds = run_local(cfg, tmp_path).rounds
    crossed = [r["round"] for r in rounds if "cross" in r["evaluation"]]
    assert crossed == [0, 2, 4, 5]  # every 2 rounds, round 0 included, and the last
    assert [r["round"] for r in rounds if "cross_eval_bytes_down" in r] == crossed
    summary = summarize_rounds(rounds)
    assert summary["cross"]["round"] == 5
    with pytest.raises(ConfigError, match="cross-eval-every=3 is not a multiple of eval-every=2"):
        config(strategy="fedavg", cross_eval_clients=2, eval_every=2, cross_eval_every=3)
