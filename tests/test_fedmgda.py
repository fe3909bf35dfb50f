"""FedMGDA+: the ε-constrained min-norm QP against cvxpy, the update on hand-made replies, a run."""

from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord
from helpers import config, grid_for, run_local

from pflarena.algorithms.mgda import min_norm_weights
from pflarena.core import keys
from pflarena.core.config import ConfigError
from pflarena.methods.fedmgda.strategy import FedMGDA, box_projection, min_norm_weights_box
from pflarena.methods.fedpg import keys as fedpg_keys
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy, parse_config
from pflarena.strategies.aggregation import flatten


def _reference_projection(v, lo, hi):
    x = cp.Variable(v.size)
    cp.Problem(cp.Minimize(cp.sum_squares(x - v)), [cp.sum(x) == 1, x >= lo, x <= hi]).solve(
        solver="CLARABEL"
    )
    return x.value


@pytest.mark.parametrize("seed", range(5))
def test_the_box_projection_is_the_euclidean_projection(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 12))
    v = rng.normal(size=k) * 3
    eps = float(rng.uniform(0.01, 0.5))
    lo, hi = np.full(k, max(0, 1 / k - eps)), np.full(k, min(1, 1 / k + eps))
    x = box_projection(v, lo, hi)
    assert x.sum() == pytest.approx(1.0) and (x >= lo - 1e-12).all() and (x <= hi + 1e-12).all()
    np.testing.assert_allclose(x, _reference_projection(v, lo, hi), atol=1e-6)


def _objective(p, lam):
    return 0.5 * lam @ p @ lam


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("epsilon", [0.02, 0.1, 0.3, 1.0])
def test_constrained_min_norm_matches_cvxpy(seed, epsilon):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 15))
    dim = int(rng.choice([3, 50]))  # rank-deficient (more clients than dimensions) or not
    grads = rng.normal(size=(k, dim)) + rng.uniform(-1, 1)
    grads /= np.linalg.norm(grads, axis=1, keepdims=True)
    p = grads @ grads.T
    ours = min_norm_weights_box(p, epsilon)
    reference = min_norm_weights_box(p, epsilon, solver="cvxpy")
    lo, hi = max(0.0, 1 / k - epsilon), min(1.0, 1 / k + epsilon)
    assert ours.sum() == pytest.approx(1.0)
    assert (ours >= lo - 1e-9).all() and (ours <= hi + 1e-9).all()
    best = _objective(p, reference)
    assert _objective(p, ours) <= best + 1e-6 * max(best, 1e-12) + 1e-12


def test_epsilon_zero_is_uniform_and_epsilon_one_is_mgda():
    rng = np.random.default_rng(3)
    grads = rng.normal(size=(6, 20))
    p = grads @ grads.T
    np.testing.assert_allclose(min_norm_weights_box(p, 0.0), 1 / 6)
    full = min_norm_weights_box(p, 1.0)
    assert _objective(p, full) == pytest.approx(_objective(p, min_norm_weights(grads)), rel=1e-6)
    tight = min_norm_weights_box(p, 0.05)
    assert _objective(p, tight) >= _objective(p, full) - 1e-12
    assert np.abs(tight - 1 / 6).max() <= 0.05 + 1e-9


def test_bad_config_is_refused():
    with pytest.raises(ConfigError, match=r"fedmgda\.epsilon"):
        parse_config({"strategy": "fedmgda", "fedmgda.epsilon": 1.5})
    with pytest.raises(ConfigError, match=r"fedmgda\.server-lr"):
        parse_config({"strategy": "fedmgda", "fedmgda.server-lr": 0})
    with pytest.raises(ConfigError, match=r"fedmgda\.solver"):
        parse_config({"strategy": "fedmgda", "fedmgda.solver": "osqp"})
    with pytest.raises(ValueError, match="epsilon"):
        FedMGDA(epsilon=-1)


def test_the_update_is_theta_minus_eta_times_the_constrained_combination(tmp_path):
    cfg = config(
        strategy="fedmgda", num_clients=3, num_rounds=1, fraction_train=1.0,
        **{"fedmgda.epsilon": 0.1, "fedmgda.server-lr": 0.7},
    )  # fmt: skip
    grid = grid_for(cfg)
    rng = np.random.default_rng(11)
    made: dict[int, np.ndarray] = {}
    base = {n: rng.normal(size=a.numpy().shape) for n, a in initial_arrays(cfg).items()}

    def swap(reply):
        if fedpg_keys.GRADIENT in reply.content.array_records:
            client = int(reply.content[keys.METRICS][keys.CLIENT_ID])
            real = reply.content[fedpg_keys.GRADIENT]
            sign = -0.5 if client == 2 else 1.0  # client 2 conflicts with 0 and 1
            arrays = {
                n: ((sign * base[n] + 0.3 * rng.normal(size=base[n].shape)) * (client + 1)).astype(
                    np.float32
                )
                for n in real
            }
            made[client] = arrays
            reply.content[fedpg_keys.GRADIENT] = ArrayRecord(
                {n: Array(v) for n, v in arrays.items()}
            )
        return reply

    grid.reply_filter = swap
    strategy = build_strategy(cfg)
    outcome = run_local(cfg, tmp_path, grid=grid, strategy=strategy)
    names = strategy.trainable
    unit = np.stack(
        [flatten(ArrayRecord({n: Array(v) for n, v in made[c].items()}), names) for c in range(3)]
    )
    unit /= np.linalg.norm(unit, axis=1, keepdims=True)
    lam = cp.Variable(3)
    cp.Problem(
        cp.Minimize(cp.sum_squares(unit.T @ lam)),
        [cp.sum(lam) == 1, lam >= 1 / 3 - 0.1, lam <= 1 / 3 + 0.1],
    ).solve(solver="CLARABEL")
    expected = flatten(initial_arrays(cfg), names) - 0.7 * (lam.value @ unit)
    np.testing.assert_allclose(flatten(outcome.arrays, names), expected, atol=2e-5)
    assert strategy.last_weights == pytest.approx(dict(enumerate(lam.value)), abs=1e-5)
    # MGDA alone would favour the conflicting client far more: λ sits on the ball's edge
    assert max(abs(w - 1 / 3) for w in strategy.last_weights.values()) == pytest.approx(
        0.1, abs=1e-6
    )


def test_fedmgda_learns_on_digits(tmp_path):
    cfg = config(strategy="fedmgda", num_clients=4, num_rounds=3, fraction_train=1.0)
    outcome = run_local(cfg, tmp_path)
    start, end = outcome.rounds[0]["evaluation"], outcome.rounds[-1]["evaluation"]
    assert end["personalized"]["mean"] > start["personalized"]["mean"] + 0.3
    assert end["personalized"] == end["global"]  # no personalization
    assert [e["name"] for e in outcome.rounds[1]["exchanges"]] == ["train"]
