"""``synthetic-on-demand``: a client's data drawn alone, the same as in its federation, and
the server's counts of a large federation without drawing it."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from pflarena.core import federation as federation_module
from pflarena.core.datasets import (
    DatasetInfo,
    DatasetSpec,
    dataset_spec,
    generate_synthetic,
    registry,
    synthetic_on_demand_client,
    synthetic_on_demand_counts,
)
from pflarena.core.federation import (
    FederationSpec,
    build_federation,
    clear_caches,
    client_sizes,
    load_client,
)


def _spec(**fields) -> FederationSpec:
    base = {"dataset": "synthetic-on-demand", "num_clients": 12, "partition": "natural", "seed": 3}
    return FederationSpec(**(base | fields))


def test_a_client_is_the_same_in_any_federation():
    """Client 3's share does not depend on how many clients there are, nor on the others."""
    small = synthetic_on_demand_client(3, 10, seed=7)
    large = synthetic_on_demand_client(3, 100_000, seed=7)
    np.testing.assert_array_equal(small[0], large[0])
    np.testing.assert_array_equal(small[1], large[1])
    other_seed = synthetic_on_demand_client(3, 10, seed=8)
    assert not np.array_equal(other_seed[1], small[1])
    x, y = small
    assert x.dtype == np.float32 and x.shape == (len(y), 30)
    assert y.dtype == np.int64 and y.min() >= 0 and y.max() < 30


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"server_fraction": 0.1, "validation_fraction": 0.2},
        {"max_client_samples": 150, "test_fraction": 0.3, "label_permutation_groups": 3},
        {"synthetic_model": "shared", "synthetic_samples": 40},
    ],
)
def test_a_client_built_alone_is_its_share_of_the_federation(fields, monkeypatch):
    """load_client draws one client (the federation is never built) and gets the arrays
    build_federation gives that client: the server's share, the cap, the splits and the
    label permutation applied alike."""
    spec = _spec(**fields)
    whole = build_federation(spec)
    clear_caches()
    monkeypatch.setattr(
        federation_module, "build_federation", lambda spec: pytest.fail("built the federation")
    )
    for client_id in range(spec.num_clients):
        alone, info = load_client(spec, client_id)
        assert info == whole.info
        expected = whole.clients[client_id]
        for field in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
            np.testing.assert_array_equal(getattr(alone, field), getattr(expected, field), field)
    with pytest.raises(ValueError, match="out of range"):
        load_client(spec, spec.num_clients)


@pytest.mark.parametrize(
    "fields",
    [
        {"validation_fraction": 0.2, "max_client_samples": 250},
        {"server_fraction": 0.1},  # the server's share is drawn by label: every client drawn
        {"synthetic_samples": 33, "test_fraction": 0.5},
    ],
)
def test_the_counts_are_the_federations(fields):
    spec = _spec(**fields)
    whole = build_federation(spec)
    expected = (
        [len(c.y_train) for c in whole.clients],
        [len(c.y_val) for c in whole.clients],
        [len(c.y_test) for c in whole.clients],
    )
    assert client_sizes(spec) == expected


def test_the_counts_of_a_large_federation_draw_no_sample(monkeypatch):
    """Without a server share, 100,000 clients are counted from their sizes alone: the
    client loader is never called."""
    declared = dataset_spec("synthetic-on-demand")

    def refuse(client_id, num_clients, seed, synthetic_alpha, synthetic_beta, synthetic_model,
               synthetic_samples):  # fmt: skip
        raise AssertionError("a client was drawn")

    monkeypatch.setitem(
        registry._REGISTRY,
        "synthetic-on-demand",
        dataclasses.replace(declared, client_loader=refuse),
    )
    spec = _spec(num_clients=100_000)
    start = time.monotonic()
    train, val, test = client_sizes(spec)
    assert len(train) == 100_000 and min(train) > 0 and min(test) > 0
    counts = synthetic_on_demand_counts(100_000, 3)
    assert [a + b + c for a, b, c in zip(train, val, test, strict=True)] == counts.tolist()
    assert time.monotonic() - start < 120  # a guard against drawing: drawing takes minutes


def test_sizes_are_lognormal_with_mean_300_or_fixed():
    counts = synthetic_on_demand_counts(4000, 0)
    assert counts.min() >= 20 and 285 < counts.mean() < 315
    assert (synthetic_on_demand_counts(50, 0, samples=40) == 40).all()
    # a client's size is its stream's first draw: the samples that follow do not move it
    assert len(synthetic_on_demand_client(5, 10, seed=0)[1]) == counts[5]


def _centralised_accuracy(clients: list[tuple[np.ndarray, np.ndarray]]) -> float:
    x = np.concatenate([c[0] for c in clients])
    y = np.concatenate([c[1] for c in clients])
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    half = len(y) // 2
    fit = LogisticRegression(max_iter=2000).fit(x[:half], y[:half])
    return float(fit.score(x[half:], y[half:]))


def test_the_generators_model_is_fedprox_synthetic():
    """The labels follow Synthetic(α, β): one shared labelling model is learnt by a
    centralised logistic regression almost perfectly; a model per client caps it, about as
    low as for ``synthetic`` drawn from one stream (the same model, other draws)."""
    shared = [
        synthetic_on_demand_client(k, 60, seed=1, model="shared", samples=120) for k in range(60)
    ]
    per_client = [synthetic_on_demand_client(k, 60, seed=1, samples=120) for k in range(60)]
    sequential = generate_synthetic(60, seed=1, samples=120).clients
    shared_accuracy = _centralised_accuracy(shared)
    per_client_accuracy = _centralised_accuracy(per_client)
    sequential_accuracy = _centralised_accuracy(sequential)
    assert shared_accuracy > 0.9
    assert per_client_accuracy < shared_accuracy - 0.1
    assert abs(per_client_accuracy - sequential_accuracy) < 0.1, (
        per_client_accuracy,
        sequential_accuracy,
    )


def test_a_declaration_with_client_functions_is_checked():
    info = DatasetInfo("odd", 2, (1,))

    def load(num_clients):
        return None

    def alone(client_id, num_clients):
        return None

    with pytest.raises(ValueError, match="client_counts needs a client_loader"):
        DatasetSpec("odd", info, "natural", load, ("num_clients",), True, client_counts=load)
    with pytest.raises(ValueError, match="only a natural data set"):
        DatasetSpec("odd", info, "pooled", lambda data_dir: None, (), True, client_loader=alone)

    def blind(client_id):
        return None

    with pytest.raises(ValueError, match="the client_loader takes no"):
        DatasetSpec("odd", info, "natural", load, ("num_clients",), True, client_loader=blind)
