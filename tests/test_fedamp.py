"""FedAMP: attention weights as convex combinations, the reduction to FedAvg, real runs."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from helpers import config, run_local

from pflarena.core import keys
from pflarena.methods.fedamp.strategy import attention_weights, cloud_model, squared_distances
from pflarena.server.build import build_strategy


def _records(vectors):
    """One model per row: a weight matrix and a bias, float32 like a real state_dict."""
    return [
        ArrayRecord(
            {
                "weight": Array(np.asarray(v[:6], dtype=np.float32).reshape(2, 3)),
                "bias": Array(np.asarray(v[6:], dtype=np.float32)),
            }
        )
        for v in vectors
    ]


def _fedavg(records):
    """FedAvg's aggregate (Flower's own example-weighted average, equal examples)."""
    contents = [
        RecordDict({keys.ARRAYS: r, keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: 10})})
        for r in records
    ]
    return aggregate_arrayrecords(contents, keys.NUM_EXAMPLES)


@pytest.mark.parametrize("alpha", [1e-3, 0.1, 1.0, 10.0])
@pytest.mark.parametrize("sigma", [0.1, 1.0, 10.0])
def test_attention_weights_form_a_convex_combination_per_client(alpha, sigma):
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(6, 8)) * rng.uniform(0.05, 2.0, size=(6, 1))
    distances = squared_distances(vectors)
    # the distances themselves, against the plain formula
    expected = ((vectors[:, None, :] - vectors[None, :, :]) ** 2).sum(axis=-1)
    np.testing.assert_allclose(distances, expected, rtol=1e-12)
    for own in range(len(vectors)):
        weights = attention_weights(distances[own], own, alpha, sigma)
        assert (weights >= 0).all()
        assert weights.sum() == pytest.approx(1.0, abs=1e-12)
        # Eq. (the message passing): ξ_ij = α A'(d_ij) = α e^{−d_ij/σ}/σ while they leave
        # room for ξ_ii ≥ 0; otherwise they are scaled to sum to one and ξ_ii = 0
        others = np.arange(len(vectors)) != own
        raw = alpha * np.exp(-distances[own, others] / sigma) / sigma
        if raw.sum() <= 1.0:
            np.testing.assert_allclose(weights[others], raw, rtol=1e-12)
            assert weights[own] == pytest.approx(1.0 - raw.sum())
        else:
            np.testing.assert_allclose(weights[others], raw / raw.sum(), rtol=1e-12)
            assert weights[own] == 0.0


def test_closer_clients_get_more_weight():
    vectors = np.array([[0.0, 0.0], [0.1, 0.0], [2.0, 0.0]])
    weights = attention_weights(squared_distances(vectors)[0], 0, alpha=0.1, sigma=1.0)
    assert weights[1] > weights[2] > 0


def test_identical_clients_get_fedavgs_model():
    vector = np.random.default_rng(1).normal(size=8)
    records = _records([vector] * 4)
    distances = squared_distances(np.stack([vector] * 4))
    reference = _fedavg(records)
    for own in range(4):
        weights = attention_weights(distances[own], own, alpha=1.0, sigma=1.0)
        cloud = cloud_model(records, weights)
        for name in reference.keys():
            np.testing.assert_allclose(
                cloud[name].numpy(), reference[name].numpy(), rtol=1e-6, atol=1e-7
            )


def test_equal_attention_is_fedavg_of_distinct_models():
    """With A' constant (σ → ∞) and α = σ/m every ξ_ij is 1/m: u_i is FedAvg's average for
    every client, whatever the models."""
    m, sigma = 5, 1e12
    vectors = np.random.default_rng(2).normal(size=(m, 8))
    records = _records(vectors)
    distances = squared_distances(vectors)
    reference = _fedavg(records)
    for own in range(m):
        weights = attention_weights(distances[own], own, alpha=sigma / m, sigma=sigma)
        np.testing.assert_allclose(weights, np.full(m, 1.0 / m), rtol=1e-9)
        cloud = cloud_model(records, weights)
        for name in reference.keys():
            np.testing.assert_allclose(cloud[name].numpy(), reference[name].numpy(), rtol=1e-5)


def test_the_cloud_model_is_the_weighted_sum():
    vectors = np.random.default_rng(3).normal(size=(3, 8))
    records = _records(vectors)
    weights = np.array([0.5, 0.3, 0.2])
    cloud = cloud_model(records, weights)
    expected = weights @ vectors
    # float32 entries, summed in float64
    np.testing.assert_allclose(cloud["weight"].numpy().ravel(), expected[:6], atol=1e-6)
    np.testing.assert_allclose(cloud["bias"].numpy(), expected[6:], atol=1e-6)


# --------------------------------------------------------------------------- runs
def test_fedamp_learns_on_digits_and_its_attention_rows_are_convex(tmp_path):
    # the default proximal weight λ/α_k = 1 holds a client within about ‖∇F_i‖ of u_i each
    # round (43% after these 4 rounds); λ = 0.1 lets it move
    cfg = config(
        strategy="fedamp",
        num_rounds=4,
        local_epochs=3,
        fraction_train=1.0,
        **{"fedamp.lambda": 0.1},
    )
    strategy = build_strategy(cfg)
    outcome = run_local(cfg, tmp_path, strategy=strategy)
    accuracy = [r["evaluation"]["personalized"]["mean"] for r in outcome.rounds]
    assert accuracy[-1] > accuracy[0] + 0.3, accuracy
    assert outcome.rounds[-1]["evaluation"]["global"] is None  # no global model
    attention = strategy.attention
    assert not np.isnan(attention).any()  # every client was sent a cloud model
    assert (attention >= 0).all()
    np.testing.assert_allclose(attention.sum(axis=1), 1.0, atol=1e-12)
