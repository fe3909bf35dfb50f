"""The PPFL paper's pathological group split (partition ``label-groups``)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pflarena.core.datasets import DatasetError
from pflarena.core.federation import FederationSpec, build_federation
from pflarena.core.partition import group_labels, label_group_partition, partition_indices


def _authors_split(labels: np.ndarray, n_clients: int, seed: int) -> list[list[int]]:
    """The authors' pathological/data/mnist/generate_data.py for 4 components (MIT/Apache,
    INFORMSJoC 2023.0376), transcribed literally: domain_labels, then main()'s loop."""
    rng = random.Random(seed)
    all_labels = list(range(10))
    domains = []
    for _ in range(2):
        sub = rng.sample(all_labels, k=2)
        all_labels = list(set(all_labels) - set(sub))
        domains.append(sub)
    sub = rng.sample(all_labels, k=3)
    all_labels = list(set(all_labels) - set(sub))
    domains.append(sub)
    domains.append(all_labels)

    per_domain_clients, clients_residual = n_clients // 4, n_clients % 4
    domain_clients = [per_domain_clients] * 4
    for i in range(clients_residual):
        domain_clients[i] += 1
    rng = random.Random(seed)
    client_sampleidx = []
    for i, domain in enumerate(domains):
        domain_idx = []
        for label in domain:
            domain_idx.extend(np.where(labels == label)[0])
        rng.shuffle(domain_idx)
        per_client_sample, sample_residual = divmod(len(domain_idx), domain_clients[i])
        start_idx = 0
        for _ in range(sample_residual):
            client_sampleidx.append(domain_idx[start_idx : start_idx + per_client_sample + 1])
            start_idx += per_client_sample + 1
        for _ in range(sample_residual, domain_clients[i]):
            client_sampleidx.append(domain_idx[start_idx : start_idx + per_client_sample])
            start_idx += per_client_sample
    client_idx = list(range(n_clients))
    rng.shuffle(client_idx)
    return [[int(v) for v in client_sampleidx[i]] for i in client_idx]


@pytest.mark.parametrize(("clients", "seed"), [(100, 12345), (18, 3), (7, 0)])
def test_it_is_the_authors_split(clients, seed):
    labels = np.random.default_rng(seed).integers(0, 10, size=3000)
    ours = label_group_partition(labels, clients, 4, seed, 10)
    assert [part.tolist() for part in ours] == _authors_split(labels, clients, seed)


def test_the_papers_groups_are_two_two_three_three_digits():
    groups = group_labels(10, 4, 12345)
    assert [len(g) for g in groups] == [2, 2, 3, 3]
    assert sorted(c for g in groups for c in g) == list(range(10))
    assert [len(g) for g in group_labels(10, 3, 1)] == [3, 3, 4]
    assert [len(g) for g in group_labels(10, 2, 1)] == [5, 5]
    assert [len(g) for g in group_labels(7, 7, 1)] == [1] * 7


def test_every_client_holds_one_group_and_groups_are_disjoint():
    labels = np.random.default_rng(1).integers(0, 10, size=5000)
    parts = partition_indices(labels, 20, "label-groups", seed=7, label_groups=4, num_classes=10)
    groups = [set(g) for g in group_labels(10, 4, 7)]
    owner = []
    for part in parts:
        held = set(labels[part].tolist())
        matching = [g for g, classes in enumerate(groups) if held <= classes]
        assert len(matching) == 1 and held == groups[matching[0]]
        owner.append(matching[0])
    assert sorted(np.bincount(owner).tolist()) == [5, 5, 5, 5]
    everything = np.concatenate(parts)
    assert len(everything) == len(labels) == len(set(everything.tolist()))
    sizes = {
        g: sorted({len(p) for p, o in zip(parts, owner, strict=True) if o == g}) for g in range(4)
    }
    assert all(s[-1] - s[0] <= 1 for s in sizes.values())  # equal shares within a group


def test_impossible_requests_say_why():
    labels = np.arange(40) % 10
    with pytest.raises(DatasetError, match="groups"):
        label_group_partition(labels, 20, 11, 0, 10)
    with pytest.raises(DatasetError, match="at least one client per group"):
        label_group_partition(labels, 3, 4, 0, 10)
    with pytest.raises(DatasetError, match="fewer clients"):
        label_group_partition(labels, 36, 4, 0, 10)


def test_a_federation_on_digits_uses_it():
    spec = FederationSpec(dataset="digits", num_clients=8, partition="label-groups", label_groups=4)
    federation = build_federation(spec)
    groups = [set(g) for g in group_labels(10, 4, spec.seed)]
    for client in federation.clients:
        held = set(client.y_train.tolist()) | set(client.y_test.tolist())
        assert any(held == g for g in groups)
