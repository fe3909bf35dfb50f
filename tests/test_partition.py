"""Tests of pflarena.core.partition: registry, partitioners and the per-client train/test split."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pflarena.core.datasets import DatasetError
from pflarena.core.partition import (
    FLWR_PARTITIONS,
    PARTITION_ARGUMENTS,
    PARTITIONS,
    PartitionSpec,
    partition_indices,
    partition_names,
    partition_spec,
    pathological_partition,
    pfllib_dirichlet_partition,
    register_partition,
    registry,
    shard_partition,
    split_seed,
    train_test_indices,
)

NUM_CLASSES = 10


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """2,000 labels over 10 classes, unevenly sized classes, in random order."""
    rng = np.random.default_rng(7)
    return rng.choice(NUM_CLASSES, size=2000, p=np.linspace(1, 2, NUM_CLASSES) / 15)


def mean_label_entropy(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    """Mean over clients of the entropy (nats) of the client's label distribution."""
    entropies = []
    for indices in parts:
        counts = np.bincount(labels[indices], minlength=NUM_CLASSES)
        share = counts[counts > 0] / counts.sum()
        entropies.append(float(-(share * np.log(share)).sum()))
    return float(np.mean(entropies))


def assert_disjoint(parts: list[np.ndarray], total: int) -> np.ndarray:
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined), "an index is in two clients"
    assert joined.min() >= 0 and joined.max() < total
    return joined


# --------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------


def test_partition_names_are_derived_from_the_registry() -> None:
    assert PARTITIONS == (
        "iid",
        "dirichlet",
        "pathological",
        "shards",
        "pfllib-dirichlet",
        "inner-dirichlet",
        "natural",
        "label-groups",
    )
    assert partition_names() == PARTITIONS
    assert partition_names(natural=True) == ("natural",)
    assert FLWR_PARTITIONS == ("iid", "dirichlet", "pathological", "shards")
    assert partition_spec("natural").function is None
    reads = {name: partition_spec(name).reads for name in partition_names(natural=False)}
    assert reads == {
        "iid": ("num_clients", "seed"),
        "dirichlet": ("num_clients", "alpha", "seed"),
        "pathological": ("num_clients", "classes_per_client", "seed", "class_assignment"),
        "shards": ("num_clients", "shards_per_client", "seed"),
        "pfllib-dirichlet": ("num_clients", "alpha", "seed", "num_classes"),
        "inner-dirichlet": ("num_clients", "alpha", "seed", "num_classes", "quantity_sigma"),
        "label-groups": ("num_clients", "label_groups", "seed", "num_classes"),
    }
    assert all(set(fields) <= set(PARTITION_ARGUMENTS) for fields in reads.values())


def test_partition_declarations_are_checked() -> None:
    with pytest.raises(ValueError, match="may read"):
        PartitionSpec("p", lambda labels, beta: [], reads=("beta",))
    with pytest.raises(ValueError, match="takes no"):
        PartitionSpec("p", lambda labels: [], reads=("seed",))
    with pytest.raises(ValueError, match="no function"):
        PartitionSpec("p", None)
    with pytest.raises(ValueError, match="already registered"):
        register_partition(partition_spec("iid"))


def test_a_registered_partition_gets_what_it_reads(labels: np.ndarray) -> None:
    def halves(labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
        return np.array_split(np.arange(len(labels)), num_clients)

    register_partition(PartitionSpec("halves", halves, reads=("num_clients",)))
    try:
        parts = partition_indices(labels, 2, "halves", seed=3, alpha=9.0)
        assert [len(part) for part in parts] == [1000, 1000]
    finally:
        del registry._REGISTRY["halves"]


# --------------------------------------------------------------------------------------
# Partitioners
# --------------------------------------------------------------------------------------


FULL_COVERAGE = ["iid", "dirichlet", "pathological", "pfllib-dirichlet"]


@pytest.mark.parametrize("partition", FULL_COVERAGE)
def test_partitions_cover_every_sample_once(labels: np.ndarray, partition: str) -> None:
    parts = partition_indices(labels, 10, partition, seed=1, alpha=0.5, classes_per_client=2)
    assert len(parts) == 10
    joined = assert_disjoint(parts, len(labels))
    assert sum(len(p) for p in parts) == len(labels)
    np.testing.assert_array_equal(np.sort(joined), np.arange(len(labels)))


def test_iid_sizes_are_balanced_and_labels_mixed(labels: np.ndarray) -> None:
    parts = partition_indices(labels, 8, "iid", seed=0)
    assert {len(p) for p in parts} == {250}
    assert all(len(np.unique(labels[p])) == NUM_CLASSES for p in parts)


def test_shards_equal_sizes_and_few_left_out(labels: np.ndarray) -> None:
    parts = shard_partition(labels, 7, shards_per_client=3, seed=0)
    assert_disjoint(parts, len(labels))
    shard_size = len(labels) // 21
    assert {len(p) for p in parts} == {3 * shard_size}
    assert len(labels) - sum(len(p) for p in parts) == len(labels) % 21
    # shards are cut from label-sorted data: each client sees at most 2 classes per shard
    assert all(len(np.unique(labels[p])) <= 6 for p in parts)


@pytest.mark.parametrize("classes", [1, 2, 3])
def test_pathological_clients_hold_exactly_k_classes(labels: np.ndarray, classes: int) -> None:
    parts = pathological_partition(labels, 12, classes_per_client=classes, seed=3)
    assert all(len(np.unique(labels[p])) == classes for p in parts)
    assert_disjoint(parts, len(labels))


def test_pathological_more_classes_than_exist_is_rejected(labels: np.ndarray) -> None:
    with pytest.raises(DatasetError, match="11"):
        pathological_partition(labels, 5, classes_per_client=11, seed=0)


@pytest.mark.parametrize("partition", ["dirichlet", "pfllib-dirichlet"])
def test_dirichlet_small_alpha_is_more_skewed(labels: np.ndarray, partition: str) -> None:
    skewed = partition_indices(labels, 10, partition, seed=0, alpha=0.1)
    flat = partition_indices(labels, 10, partition, seed=0, alpha=100.0)
    assert mean_label_entropy(labels, skewed) < mean_label_entropy(labels, flat) - 0.8
    assert mean_label_entropy(labels, flat) > 0.95 * math.log(NUM_CLASSES)


@pytest.mark.parametrize(
    "partition", ["iid", "dirichlet", "pathological", "shards", "pfllib-dirichlet"]
)
def test_partitions_are_deterministic_and_seeded(labels: np.ndarray, partition: str) -> None:
    first = partition_indices(labels, 10, partition, seed=11)
    second = partition_indices(labels, 10, partition, seed=11)
    other = partition_indices(labels, 10, partition, seed=12)
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_dirichlet_impossible_minimum_terminates_with_error() -> None:
    labels = np.repeat(np.arange(NUM_CLASSES), 10)
    # alpha -> 0 puts each class on about one client: 40 clients can never all get 2.
    with pytest.raises(DatasetError, match="larger alpha"):
        partition_indices(labels, 40, "dirichlet", seed=0, alpha=1e-3)


def test_unknown_partition_lists_allowed_names(labels: np.ndarray) -> None:
    with pytest.raises(DatasetError) as error:
        partition_indices(labels, 4, "quantity-skew")
    for name in PARTITIONS:
        assert name in str(error.value)


def test_natural_partition_needs_a_natively_federated_dataset(labels: np.ndarray) -> None:
    with pytest.raises(DatasetError, match="natively federated"):
        partition_indices(labels, 4, "natural")


def test_more_clients_than_samples_is_rejected() -> None:
    with pytest.raises(DatasetError, match="fewer clients"):
        partition_indices(np.zeros(5, dtype=np.int64), 6, "iid")


# --------------------------------------------------------------------------------------
# PFLlib Dirichlet
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.05, 0.3, 5.0])
def test_pfllib_dirichlet_properties(labels: np.ndarray, alpha: float) -> None:
    parts = pfllib_dirichlet_partition(labels, 20, alpha, seed=1, least_samples=25)
    assert min(len(p) for p in parts) >= 25
    joined = assert_disjoint(parts, len(labels))
    np.testing.assert_array_equal(np.sort(joined), np.arange(len(labels)))
    # A client that already holds N/m samples gets nothing more, so nobody exceeds
    # N/m plus one class.
    largest_class = np.bincount(labels).max()
    assert max(len(p) for p in parts) < len(labels) / 20 + largest_class


def test_pfllib_dirichlet_reproduces_pfedgt_table5() -> None:
    # Sizes depend only on the class counts: CIFAR-10, 6,000 per class, train then test.
    cifar_labels = np.concatenate([np.repeat(np.arange(10), 5000), np.repeat(np.arange(10), 1000)])
    expected = {0.1: 1434.73, 1.0: 563.97, 10.0: 233.21}
    for alpha, paper_std in expected.items():
        sizes = np.array([len(p) for p in pfllib_dirichlet_partition(cifar_labels, 20, alpha)])
        assert sizes.mean() == 3000
        assert round(float(sizes.std(ddof=0)), 2) == paper_std
        if alpha == 0.1:
            assert (sizes.max(), sizes.min()) == (5994, 1164)


def test_pfllib_dirichlet_redraws_until_least_samples(labels: np.ndarray) -> None:
    loose = pfllib_dirichlet_partition(labels, 20, 0.1, seed=1, least_samples=1)
    strict = pfllib_dirichlet_partition(labels, 20, 0.1, seed=1, least_samples=40)
    assert min(len(p) for p in loose) < 40 <= min(len(p) for p in strict)


def test_pfllib_dirichlet_impossible_requests(labels: np.ndarray) -> None:
    with pytest.raises(DatasetError, match="fewer clients"):
        pfllib_dirichlet_partition(labels, 50, 0.5, least_samples=41)
    with pytest.raises(DatasetError, match="after 5 draws"):
        pfllib_dirichlet_partition(labels, 40, 1e-3, least_samples=45, max_attempts=5)


# --------------------------------------------------------------------------------------
# Train/test split
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_samples", [2, 3, 10, 101, 400])
def test_train_test_split_shares(num_samples: int) -> None:
    train, test = train_test_indices(num_samples, 0.25, seed=0, client_id=3)
    assert len(test) == math.ceil(0.25 * num_samples)
    assert len(train) + len(test) == num_samples
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(num_samples))


def test_train_test_split_is_deterministic_per_seed_and_client() -> None:
    base = train_test_indices(200, 0.25, seed=5, client_id=2)[1]
    np.testing.assert_array_equal(train_test_indices(200, 0.25, seed=5, client_id=2)[1], base)
    assert not np.array_equal(train_test_indices(200, 0.25, seed=6, client_id=2)[1], base)
    assert not np.array_equal(train_test_indices(200, 0.25, seed=5, client_id=3)[1], base)


def test_train_test_split_without_test_share() -> None:
    train, test = train_test_indices(5, 0.0, seed=0, client_id=0)
    assert train.tolist() == [0, 1, 2, 3, 4] and len(test) == 0


def test_split_seed_is_the_seed_sequence_of_seed_and_client() -> None:
    expected = int(np.random.SeedSequence([5, 2]).generate_state(1)[0])
    assert split_seed(5, 2) == expected


def test_client_with_one_sample_cannot_be_split() -> None:
    with pytest.raises(DatasetError, match="client 17 .*fewer clients or a larger alpha"):
        train_test_indices(1, 0.25, seed=0, client_id=17)


def test_deterministic_class_assignment_is_a_ring() -> None:
    """With C clients and k classes each, client i holds i..i+k−1 (mod C): each class is
    held by exactly k clients and no two clients hold the same set (pFedSV's split)."""
    labels = np.repeat(np.arange(10), 50)
    parts = partition_indices(
        labels, 10, "pathological", classes_per_client=2, class_assignment="deterministic"
    )
    held = [set(labels[p].tolist()) for p in parts]
    assert held == [{i, (i + 1) % 10} for i in range(10)]


def _flwr_dirichlet(labels: np.ndarray, num_clients: int, alpha: float, seed: int, size: int):
    """flwr-datasets' DirichletPartitioner run once, as pflarena's first attempt runs it;
    None when it gives up."""
    from flwr_datasets.partitioner import DirichletPartitioner

    from pflarena.core.partition.flwr_partitioners import _run_partitioner

    partitioner = DirichletPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        alpha=alpha,
        min_partition_size=size,
        self_balancing=False,
        seed=seed,
    )
    try:
        return _run_partitioner(partitioner, labels, num_clients)
    except DatasetError:
        return None


def test_dirichlet_runs_flwr_again_where_its_draws_run_out(labels: np.ndarray) -> None:
    """A seed flwr-datasets splits gets its split unchanged; a seed whose 11 draws leave a
    client under the minimum is split on a later, seeded attempt: every client at the
    minimum, the same split every time, and the labels' skew of a Dirichlet(α) draw."""
    from pflarena.core.partition.flwr_partitioners import dirichlet_partition

    skewed = labels[:1000]
    first = {seed: _flwr_dirichlet(skewed, 20, 0.1, seed, 10) for seed in range(12)}
    assert any(v is None for v in first.values()) and any(v is not None for v in first.values())
    for seed, reference in first.items():
        parts = dirichlet_partition(skewed, 20, 0.1, seed)
        assert min(len(p) for p in parts) >= 10
        assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
        if reference is not None:
            assert all(np.array_equal(a, b) for a, b in zip(parts, reference, strict=True))
        else:
            again = dirichlet_partition(skewed, 20, 0.1, seed)
            assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
            assert mean_label_entropy(skewed, parts) < 0.6 * math.log(NUM_CLASSES)


def _flwr_dirichlet_raising(
    labels: np.ndarray, clients: int, alpha: float, minimum: int, seed: int
):
    """flwr-datasets' own DirichletPartitioner, as the partition ran before its numpy port."""
    from flwr_datasets.partitioner import DirichletPartitioner

    from pflarena.core.partition.flwr_partitioners import _run_partitioner

    partitioner = DirichletPartitioner(
        num_partitions=clients,
        partition_by="label",
        alpha=alpha,
        min_partition_size=minimum,
        self_balancing=False,
        seed=seed,
    )
    return _run_partitioner(partitioner, labels, clients)


@pytest.mark.parametrize(
    "clients, alpha, minimum, seeds",
    [(4, 0.5, 10, range(6)), (10, 0.1, 10, range(6)), (20, 0.1, 10, (3, 6)), (7, 100.0, 2, (1,))],
)
def test_the_numpy_dirichlet_is_flwr_datasets_own(clients, alpha, minimum, seeds) -> None:
    """Catches the numpy port (which spares a run importing flwr-datasets and Hugging Face
    datasets) drifting from flwr-datasets' DirichletPartitioner: the same indices in the same
    order, and the same error once its redraws run out (20 clients at α = 0.1, seeds 3 and
    6, on the embedded digits)."""
    from pflarena.core.datasets import load_pooled
    from pflarena.core.partition.flwr_partitioners import dirichlet_indices

    digits = load_pooled("digits").y
    for seed in seeds:
        try:
            expected = _flwr_dirichlet_raising(digits, clients, alpha, minimum, seed)
        except DatasetError as error:
            with pytest.raises(DatasetError) as ours:
                dirichlet_indices(digits, clients, alpha, minimum, seed)
            assert str(ours.value) == str(error)
            continue
        got = dirichlet_indices(digits, clients, alpha, minimum, seed)
        assert [part.tolist() for part in got] == [part.tolist() for part in expected]
        assert all(part.dtype == np.int64 for part in got)


@pytest.mark.parametrize("rows, clients", [(10, 10), (11, 3), (1797, 7), (1797, 100), (50, 49)])
def test_the_numpy_iid_is_flwr_datasets_own(rows, clients) -> None:
    """Catches the numpy port of flwr-datasets' IidPartitioner (contiguous shards of the
    shuffled rows) cutting them elsewhere: the same indices in the same order."""
    from flwr_datasets.partitioner import IidPartitioner

    from pflarena.core.partition.flwr_partitioners import _run_partitioner, iid_partition

    labels = np.arange(rows) % 10
    order = np.random.default_rng(rows).permutation(rows).astype(np.int64)
    expected = _run_partitioner(IidPartitioner(num_partitions=clients), labels, clients, order)
    got = iid_partition(labels, clients, seed=rows)
    assert [part.tolist() for part in got] == [part.tolist() for part in expected]
    assert all(part.dtype == np.int64 for part in got)


@pytest.mark.parametrize("num_samples", [2, 3, 7, 10, 51, 180])
@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.25, 0.5, 0.9])
def test_the_unstratified_split_is_scikit_learns_own(num_samples, fraction) -> None:
    """Catches :func:`shuffle_split` (scikit-learn's train_test_split without importing
    scikit-learn) drifting from scikit-learn: the same parts, the same empty-train error."""
    from sklearn.model_selection import train_test_split

    from pflarena.core.partition.split import shuffle_split

    positions = np.arange(num_samples, dtype=np.int64)
    for state in (0, 1, 12345, 2**32 - 1):
        try:
            expected = train_test_split(positions, test_size=fraction, random_state=state)
        except ValueError as error:
            with pytest.raises(ValueError) as ours:
                shuffle_split(positions, fraction, state)
            assert str(ours.value) == str(error)
            continue
        got = shuffle_split(positions, fraction, state)
        assert [part.tolist() for part in got] == [part.tolist() for part in expected]
        assert all(part.dtype == np.int64 for part in got)


@pytest.mark.parametrize("num_samples", [4, 9, 20, 51, 180])
@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.5, 0.9])
def test_the_stratified_split_is_scikit_learns_own(num_samples, fraction) -> None:
    """Catches :func:`stratified_split` (scikit-learn's stratified train_test_split without
    importing scikit-learn) drifting from scikit-learn: the same parts, in the same order,
    on balanced, skewed and tied label counts, and a ValueError wherever scikit-learn
    raises one."""
    from sklearn.model_selection import train_test_split

    from pflarena.core.partition.split import stratified_split

    positions = np.arange(num_samples, dtype=np.int64) * 3 + 1
    rng = np.random.default_rng(num_samples)
    labelings = [
        np.arange(num_samples) % 3,  # balanced
        rng.choice(4, size=num_samples, p=[0.55, 0.25, 0.15, 0.05]),  # skewed
        np.repeat([7, 2], [num_samples // 2, num_samples - num_samples // 2]),  # tied
        np.where(np.arange(num_samples) == 0, 5, 1),  # a class of one sample
    ]
    checked = 0
    for labels in labelings:
        for state in (0, 1, 12345, 2**32 - 1):
            try:
                expected = train_test_split(
                    positions, test_size=fraction, random_state=state, stratify=labels
                )
            except ValueError:
                with pytest.raises(ValueError):
                    stratified_split(positions, labels, fraction, state)
                continue
            got = stratified_split(positions, labels, fraction, state)
            assert [part.tolist() for part in got] == [part.tolist() for part in expected]
            checked += 1
    assert checked > 0 or num_samples < 10


def test_the_digits_are_scikit_learns_own() -> None:
    """Catches the digits read from scikit-learn's file (without importing it) differing
    from what its load_digits gives."""
    from sklearn.datasets import load_digits

    from pflarena.core.datasets.digits import load_digits_arrays

    x, y = load_digits_arrays()
    bunch = load_digits()
    assert (
        x.tobytes()
        == np.ascontiguousarray(bunch.images[:, None] / 16.0, dtype=np.float32).tobytes()
    )
    assert y.tolist() == bunch.target.tolist() and y.dtype == np.int64
