"""Partitioners built on flwr-datasets: ``iid``, ``dirichlet``, ``pathological``, ``shards``.

Each runs a flwr-datasets partitioner over an in-memory ``datasets.Dataset`` with a
``label`` and an ``index`` column and reads back every partition's ``index`` column, but
``dirichlet`` (the default partition) and ``iid``: :func:`dirichlet_indices` computes
flwr-datasets' ``DirichletPartitioner`` in numpy, the same draws in the same order, so that a
run, and ``pflarena run --check``, do not import flwr-datasets and Hugging Face ``datasets``
(pandas, pyarrow: over a second), and :func:`iid_indices` its ``IidPartitioner``, whose
shards ``datasets`` cut at 2.5 ms a client; ``tests/test_partition.py`` compares each with
flwr-datasets.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import numpy as np

from pflarena.core.datasets import DatasetError
from pflarena.core.partition.registry import PartitionSpec, check_clients, register_partition

__all__ = [
    "DIRICHLET_ATTEMPTS",
    "DIRICHLET_MIN_PARTITION_SIZE",
    "FLWR_PARTITIONS",
    "dirichlet_indices",
    "dirichlet_partition",
    "iid_indices",
    "iid_partition",
    "pathological_partition",
    "shard_partition",
]

#: Dirichlet (flwr-datasets) minimum partition size, capped by what the data allows.
DIRICHLET_MIN_PARTITION_SIZE = 10
#: How many times flwr-datasets' partitioner is run (each re-drawing up to 11 times) before
#: a Dirichlet split with its minimum size is declared out of reach.
DIRICHLET_ATTEMPTS = 20


def _label_dataset(labels: np.ndarray, order: np.ndarray | None = None) -> Any:
    """Build an in-memory ``datasets.Dataset`` with columns ``label`` and ``index``."""
    import datasets

    index = np.arange(len(labels), dtype=np.int64) if order is None else order
    return datasets.Dataset.from_dict({"label": np.asarray(labels)[index], "index": index})


def _run_partitioner(
    partitioner: Any, labels: np.ndarray, num_clients: int, order: np.ndarray | None = None
) -> list[np.ndarray]:
    """Attach the label data set and read each partition's ``index`` column."""
    partitioner.dataset = _label_dataset(labels, order)
    with warnings.catch_warnings():
        # Re-sampling notices and pyarrow deprecations; failures still raise.
        warnings.simplefilter("ignore")
        try:
            return [
                np.asarray(
                    partitioner.load_partition(client).with_format("numpy")[:]["index"],
                    dtype=np.int64,
                )
                for client in range(num_clients)
            ]
        except ValueError as error:
            raise DatasetError(f"{type(partitioner).__name__}: {error}") from error


def iid_partition(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """Uniformly random, (almost) equal-size partition.

    flwr-datasets' ``IidPartitioner`` cuts contiguous shards, so the rows are put in a
    seeded random order first.

    Parameters
    ----------
    labels : numpy.ndarray
        Pooled labels ``(N,)``.
    num_clients : int
        Number of clients.
    seed : int
        Seed of the row permutation.

    Returns
    -------
    list of numpy.ndarray
        Sample indices of each client.
    """
    check_clients(labels, num_clients)
    order = np.random.default_rng(seed).permutation(len(labels)).astype(np.int64)
    return iid_indices(order, num_clients)


def iid_indices(order: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """flwr-datasets' ``IidPartitioner`` over rows in ``order``, computed in numpy.

    The partitioner cuts ``num_clients`` contiguous shards (Hugging Face's
    ``Dataset.shard(contiguous=True)``): client ``i`` gets ``n // k`` rows, one more for the
    first ``n % k`` clients, in order. Run through ``datasets`` it took 2.5 ms a client (9 s
    for 3,550 clients); ``tests/test_partition.py`` compares the two."""
    # numpy's array_split cuts the same blocks: the first len % k one row longer
    return [part.astype(np.int64) for part in np.array_split(order, num_clients)]


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    seed: int,
    min_partition_size: int | None = None,
) -> list[np.ndarray]:
    """Per-class Dirichlet split (Hsu et al. 2019) with flwr-datasets.

    ``DirichletPartitioner(partition_by="label", alpha, min_partition_size,
    self_balancing=False, seed)``. It re-draws until every client has at least
    ``min_partition_size`` samples and gives up after 11 draws; then it is run again with a
    seed derived from ``(seed, attempt)``, up to :data:`DIRICHLET_ATTEMPTS` times, before a
    :class:`DatasetError`. A seed whose first run succeeds gets flwr-datasets' split
    unchanged; the later attempts continue the same rejection sampling (a Dirichlet draw
    conditioned on the minimum size), which 11 draws leave out of reach on small data (the
    embedded digits with 20 clients at α = 0.1 fails for seeds 3 and 6).

    Parameters
    ----------
    labels : numpy.ndarray
        Pooled labels ``(N,)``.
    num_clients : int
        Number of clients.
    alpha : float
        Dirichlet concentration; smaller is more skewed.
    seed : int
        Partitioner seed.
    min_partition_size : int, optional
        Default ``min(10, N // (2 * num_clients))`` but at least 2, so that each client
        can be split into train and test.

    Returns
    -------
    list of numpy.ndarray
        Sample indices of each client.
    """
    check_clients(labels, num_clients)
    if alpha <= 0:
        raise DatasetError(f"alpha must be positive, got {alpha}")
    if min_partition_size is None:
        min_partition_size = max(
            2, min(DIRICHLET_MIN_PARTITION_SIZE, len(labels) // (2 * num_clients))
        )
    if min_partition_size * num_clients > len(labels):
        raise DatasetError(
            f"dirichlet: {num_clients} clients with at least {min_partition_size} samples "
            f"need {min_partition_size * num_clients} samples, the dataset has {len(labels)}; "
            "use fewer clients"
        )
    for attempt in range(DIRICHLET_ATTEMPTS):
        try:
            return dirichlet_indices(
                labels,
                num_clients,
                float(alpha),
                min_partition_size,
                seed if attempt == 0 else _attempt_seed(seed, attempt),
            )
        except DatasetError as error:
            last = error
    raise DatasetError(
        f"dirichlet: could not give every one of {num_clients} clients at least "
        f"{min_partition_size} samples with alpha={alpha} in {DIRICHLET_ATTEMPTS} x 11 draws "
        f"({last}); use a larger alpha or fewer clients"
    ) from last


#: flwr-datasets' ``DirichletPartitioner``: draws after the first before it gives up.
DIRICHLET_REDRAWS = 10


def dirichlet_indices(
    labels: np.ndarray, num_clients: int, alpha: float, min_partition_size: int, seed: int
) -> list[np.ndarray]:
    """flwr-datasets 0.6's ``DirichletPartitioner(num_partitions=num_clients,
    partition_by="label", alpha=alpha, min_partition_size=min_partition_size,
    self_balancing=False, shuffle=True, seed=seed)``, each partition's indices as its
    ``load_partition`` gives them, computed in numpy.

    Its algorithm: one ``numpy.random.default_rng(seed)``; per draw, for each class in
    sorted order, a Dirichlet(α, ..., α) proportion per client, the class's samples (in
    data order) cut at ``int(cumsum(proportions) · n_k)``; a draw whose smallest client
    has fewer than ``min_partition_size`` samples is drawn again, up to
    :data:`DIRICHLET_REDRAWS` times (then a :class:`DatasetError` with flwr-datasets'
    message); finally each client's list is shuffled with the same generator.
    """
    targets = np.asarray(labels)
    if num_clients > len(targets):
        raise DatasetError(
            "DirichletPartitioner: The number of partitions needs to be smaller than the "
            "number of samples in the dataset."
        )
    rng = np.random.default_rng(seed)
    concentration = np.array([float(alpha)], dtype=float).repeat(num_clients)
    classes = sorted(np.unique(targets).tolist())
    for sampling_try in range(DIRICHLET_REDRAWS + 1):
        partitions: list[list[int]] = [[] for _ in range(num_clients)]
        for k in classes:
            indices = np.nonzero(targets == k)[0]
            proportions = rng.dirichlet(concentration)
            cuts = (np.cumsum(proportions.tolist()) * len(indices)).astype(int)[:-1]
            for client, part in enumerate(np.split(indices, cuts)):
                partitions[client].extend(part.tolist())
        if min(len(part) for part in partitions) >= min_partition_size:
            break
        if sampling_try == DIRICHLET_REDRAWS:
            raise DatasetError(
                "DirichletPartitioner: The max number of attempts (10) was reached. Please "
                "update the values of alpha and try again."
            )
    for part in partitions:
        rng.shuffle(part)
    return [np.asarray(part, dtype=np.int64) for part in partitions]


def _attempt_seed(seed: int, attempt: int) -> int:
    """The seed of a later attempt: fixed by (seed, attempt), 32 bits as numpy takes them."""
    digest = hashlib.sha256(f"dirichlet/{seed}/{attempt}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def pathological_partition(
    labels: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    seed: int,
    class_assignment: str = "first-deterministic",
) -> list[np.ndarray]:
    """Each client holds exactly ``classes_per_client`` classes (flwr-datasets).

    ``PathologicalPartitioner(class_assignment_mode=class_assignment)``. The default,
    ``"first-deterministic"``: client i gets class ``i mod C`` and ``classes_per_client -
    1`` further random classes. ``"deterministic"``: client i gets classes ``i, ..., i +
    classes_per_client - 1 (mod C)``, so with ``num_clients = C`` every class is held by
    exactly ``classes_per_client`` clients and no two clients hold the same set (pFedSV's
    pathological split). ``"random"``: random classes. Each class is split evenly over the
    clients that hold it. With fewer than ``C / classes_per_client`` clients some classes
    are held by nobody and their samples are left out (flwr-datasets behaviour).

    Parameters
    ----------
    labels : numpy.ndarray
        Pooled labels ``(N,)``.
    num_clients : int
        Number of clients.
    classes_per_client : int
        Classes per client.
    seed : int
        Seed of the class assignment and shuffles.
    class_assignment : str
        ``"first-deterministic"``, ``"deterministic"`` or ``"random"`` (see above).

    Returns
    -------
    list of numpy.ndarray
        Sample indices of each client.
    """
    from flwr_datasets.partitioner import PathologicalPartitioner

    check_clients(labels, num_clients)
    num_present = len(np.unique(labels))
    if not 1 <= classes_per_client <= num_present:
        raise DatasetError(
            f"pathological: classes_per_client={classes_per_client} is impossible, the "
            f"dataset has {num_present} classes"
        )
    partitioner = PathologicalPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        num_classes_per_partition=classes_per_client,
        class_assignment_mode=class_assignment,
        seed=seed,
    )
    return _run_partitioner(partitioner, labels, num_clients)


def shard_partition(
    labels: np.ndarray, num_clients: int, shards_per_client: int, seed: int
) -> list[np.ndarray]:
    """McMahan et al. shards: sort by label, cut equal shards, deal them out at random.

    flwr-datasets' ``ShardPartitioner(num_shards_per_partition=shards_per_client)``.
    Shards hold ``N // (num_clients * shards_per_client)`` samples each; the remaining
    ``N mod (num_clients * shards_per_client)`` samples are left out.

    Parameters
    ----------
    labels : numpy.ndarray
        Pooled labels ``(N,)``.
    num_clients : int
        Number of clients.
    shards_per_client : int
        Shards per client.
    seed : int
        Seed of the shard assignment and shuffles.

    Returns
    -------
    list of numpy.ndarray
        Sample indices of each client.
    """
    from flwr_datasets.partitioner import ShardPartitioner

    check_clients(labels, num_clients)
    if shards_per_client < 1 or num_clients * shards_per_client > len(labels):
        raise DatasetError(
            f"shards: {num_clients} clients x {shards_per_client} shards is impossible "
            f"with {len(labels)} samples"
        )
    partitioner = ShardPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        num_shards_per_partition=shards_per_client,
        seed=seed,
    )
    return _run_partitioner(partitioner, labels, num_clients)


_DECLARATIONS: tuple[PartitionSpec, ...] = (
    PartitionSpec("iid", iid_partition, reads=("num_clients", "seed")),
    PartitionSpec("dirichlet", dirichlet_partition, reads=("num_clients", "alpha", "seed")),
    PartitionSpec(
        "pathological",
        pathological_partition,
        reads=("num_clients", "classes_per_client", "seed", "class_assignment"),
    ),
    PartitionSpec("shards", shard_partition, reads=("num_clients", "shards_per_client", "seed")),
)
for _declaration in _DECLARATIONS:
    register_partition(_declaration)

#: The partitions this module declares.
FLWR_PARTITIONS: tuple[str, ...] = tuple(declaration.name for declaration in _DECLARATIONS)
