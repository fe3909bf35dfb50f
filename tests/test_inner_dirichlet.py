"""The inner-Dirichlet partition (FedLab's, the PAGE paper's) against a literal transcription."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pflarena.core.datasets import DatasetError
from pflarena.core.federation import FederationSpec, build_federation
from pflarena.core.partition import (
    client_sizes,
    fill_clients,
    inner_dirichlet_partition,
    partition_indices,
)


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """2,003 labels over 10 unevenly sized classes, in random order."""
    rng = np.random.default_rng(5)
    return rng.choice(10, size=2003, p=np.linspace(1, 3, 10) / 20)


def fedlab_redraw_loop(
    labels: np.ndarray, priors: np.ndarray, sizes: list[int], rng: np.random.Generator
) -> np.ndarray:
    """FedLab's client_inner_dirichlet_partition loop as docs/papers/page.md §9.19 describes it:
    pick a client at random (again if it is full), draw a class from its cumulative prior by a
    uniform number (again while that class is empty), pop a sample. Returns the client x
    class counts."""
    remaining = np.bincount(labels, minlength=priors.shape[1])
    needed = list(sizes)
    counts = np.zeros(priors.shape, dtype=np.int64)
    cumulative = np.cumsum(priors, axis=1)
    while sum(needed):
        client = int(rng.integers(len(needed)))
        if needed[client] <= 0:
            continue
        needed[client] -= 1
        while True:
            label = int(np.argmax(rng.uniform() <= cumulative[client]))
            if remaining[label] > 0:
                break
        remaining[label] -= 1
        counts[client, label] += 1
    return counts


def test_renormalised_draws_have_the_distribution_of_fedlabs_redraw_loop() -> None:
    # 12 samples for 12 places: the pools run dry, so the redraws (and ours) matter.
    labels = np.repeat([0, 1, 2], [5, 4, 3])
    priors = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.34, 0.33, 0.33]])
    sizes = [4, 4, 4]
    trials = 3000
    ours = np.zeros((3, 3))
    reference = np.zeros((3, 3))
    for trial in range(trials):
        parts = fill_clients(labels, priors, np.array(sizes), np.random.default_rng(trial))
        ours += np.array([np.bincount(labels[p], minlength=3) for p in parts])
        reference += fedlab_redraw_loop(labels, priors, sizes, np.random.default_rng(10**6 + trial))
    ours, reference = ours / trials, reference / trials
    # Counts are at most 4: a standard error below 2 / sqrt(3000) = 0.037 per cell.
    assert np.abs(ours - reference).max() < 0.12, (ours, reference)
    assert np.allclose(ours.sum(axis=1), 4) and np.allclose(ours.sum(axis=0), [5, 4, 3])


def test_equal_sizes_disjoint_and_the_remainder_unused(labels: np.ndarray) -> None:
    parts = inner_dirichlet_partition(labels, 10, alpha=0.3, seed=0)
    assert [len(part) for part in parts] == [200] * 10  # floor(2003 / 10)
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == 2000 and joined.min() >= 0 and joined.max() < 2003


def test_each_client_follows_its_own_prior(labels: np.ndarray) -> None:
    # With a large concentration every prior is near uniform; with a small one each client
    # is dominated by a few classes (and the classes still cover every sample handed out).
    def entropy(parts):
        values = []
        for part in parts:
            share = np.bincount(labels[part], minlength=10) / len(part)
            share = share[share > 0]
            values.append(-(share * np.log(share)).sum())
        return float(np.mean(values))

    flat = inner_dirichlet_partition(labels, 10, alpha=1000.0, seed=1)
    skewed = inner_dirichlet_partition(labels, 10, alpha=0.1, seed=1)
    assert entropy(flat) > 0.95 * math.log(10)
    assert entropy(skewed) < entropy(flat) - 0.8


def test_log_normal_sizes_sum_to_the_pool_and_spread_with_sigma() -> None:
    spreads = []
    for sigma in (0.1, 0.5):
        sizes = client_sizes(50_000, 100, sigma, np.random.default_rng(0))
        assert sizes.sum() == 50_000 and sizes.min() > 0
        spreads.append(sizes.std() / sizes.mean())
    # The coefficient of variation of a log-normal is sqrt(exp(sigma^2) - 1).
    assert spreads[0] == pytest.approx(math.sqrt(math.exp(0.01) - 1), rel=0.3)
    assert spreads[1] == pytest.approx(math.sqrt(math.exp(0.25) - 1), rel=0.3)
    assert list(client_sizes(103, 10, 0.0, np.random.default_rng(0))) == [10] * 10


def test_seeded_and_reachable_from_a_federation(labels: np.ndarray) -> None:
    first = partition_indices(labels, 8, "inner-dirichlet", seed=3, alpha=0.3, num_classes=10)
    again = partition_indices(labels, 8, "inner-dirichlet", seed=3, alpha=0.3, num_classes=10)
    other = partition_indices(labels, 8, "inner-dirichlet", seed=4, alpha=0.3, num_classes=10)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))
    skewed = partition_indices(
        labels, 8, "inner-dirichlet", seed=3, alpha=0.3, num_classes=10, quantity_sigma=0.5
    )
    assert len({len(part) for part in skewed}) > 1
    federation = build_federation(
        FederationSpec(dataset="digits", num_clients=6, partition="inner-dirichlet", alpha=0.3)
    )
    assert {len(c.y_train) + len(c.y_test) for c in federation.clients} == {1797 // 6}


def test_impossible_requests_are_named(labels: np.ndarray) -> None:
    with pytest.raises(DatasetError, match="alpha must be positive"):
        inner_dirichlet_partition(labels, 4, alpha=0.0)
    with pytest.raises(DatasetError, match="quantity-sigma=8.0 left a client"):
        inner_dirichlet_partition(labels[:40], 20, alpha=1.0, quantity_sigma=8.0)
