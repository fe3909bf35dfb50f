"""Partitioners over pooled labels, and the per-client train/test split.

Every partitioner takes the pooled label array and returns one array of sample indices
per client. ``iid``, ``dirichlet``, ``pathological`` and ``shards`` run flwr-datasets
partitioners over an in-memory ``datasets.Dataset`` with a ``label`` and an ``index``
column; ``pfllib-dirichlet`` is PFLlib's ``separate_data`` Dirichlet procedure (the split
behind the pFedGT paper's Table 5), written here with its own ``RandomState``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from pflarena.core.datasets import DatasetError

__all__ = [
    "FLWR_PARTITIONS",
    "PARTITIONS",
    "PFLLIB_LEAST_SAMPLES",
    "check_partition_name",
    "dirichlet_partition",
    "iid_partition",
    "partition_indices",
    "pathological_partition",
    "pfllib_dirichlet_attempt",
    "pfllib_dirichlet_partition",
    "shard_partition",
    "split_seed",
    "train_test_indices",
]

PARTITIONS: tuple[str, ...] = (
    "iid",
    "dirichlet",
    "pathological",
    "shards",
    "pfllib-dirichlet",
    "natural",
)
FLWR_PARTITIONS: tuple[str, ...] = ("iid", "dirichlet", "pathological", "shards")

#: PFLlib's older default ``batch_size / (1 - train_size)`` with batch size 10 and a
#: 0.75 train share. With seed 1 on CIFAR-10 (20 clients) any threshold up to 1164
#: gives the same partition as PFLlib's current default of 1.
PFLLIB_LEAST_SAMPLES = 40

#: Upper bound on PFLlib-Dirichlet re-draws before giving up.
PFLLIB_MAX_ATTEMPTS = 1000

#: Dirichlet (flwr-datasets) minimum partition size, capped by what the data allows.
DIRICHLET_MIN_PARTITION_SIZE = 10


def check_partition_name(partition: str) -> None:
    """Raise :class:`DatasetError` unless ``partition`` is one of :data:`PARTITIONS`.

    Parameters
    ----------
    partition : str
        Partition name to check.
    """
    if partition not in PARTITIONS:
        raise DatasetError(f"unknown partition {partition!r}; allowed: {', '.join(PARTITIONS)}")


# --------------------------------------------------------------------------------------
# flwr-datasets partitioners
# --------------------------------------------------------------------------------------


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


def _check_clients(labels: np.ndarray, num_clients: int) -> None:
    if num_clients < 1:
        raise DatasetError(f"num_clients must be at least 1, got {num_clients}")
    if num_clients > len(labels):
        raise DatasetError(
            f"cannot split {len(labels)} samples over {num_clients} clients; use fewer clients"
        )


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
    from flwr_datasets.partitioner import IidPartitioner

    _check_clients(labels, num_clients)
    order = np.random.default_rng(seed).permutation(len(labels)).astype(np.int64)
    return _run_partitioner(IidPartitioner(num_partitions=num_clients), labels, num_clients, order)


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
    ``min_partition_size`` samples and gives up after 11 draws, which surfaces here as
    :class:`DatasetError`.

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
    from flwr_datasets.partitioner import DirichletPartitioner

    _check_clients(labels, num_clients)
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
    partitioner = DirichletPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        alpha=float(alpha),
        min_partition_size=min_partition_size,
        self_balancing=False,
        seed=seed,
    )
    try:
        return _run_partitioner(partitioner, labels, num_clients)
    except DatasetError as error:
        raise DatasetError(
            f"dirichlet: could not give every one of {num_clients} clients at least "
            f"{min_partition_size} samples with alpha={alpha} ({error}); use a larger alpha "
            "or fewer clients"
        ) from error


def pathological_partition(
    labels: np.ndarray, num_clients: int, classes_per_client: int, seed: int
) -> list[np.ndarray]:
    """Each client holds exactly ``classes_per_client`` classes (flwr-datasets).

    ``PathologicalPartitioner(class_assignment_mode="first-deterministic")``: client i
    gets class ``i mod C`` and ``classes_per_client - 1`` further random classes; each
    class is split evenly over the clients that hold it. With fewer than
    ``C / classes_per_client`` clients some classes are held by nobody and their samples
    are left out (flwr-datasets behaviour).

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

    Returns
    -------
    list of numpy.ndarray
        Sample indices of each client.
    """
    from flwr_datasets.partitioner import PathologicalPartitioner

    _check_clients(labels, num_clients)
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
        class_assignment_mode="first-deterministic",
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

    _check_clients(labels, num_clients)
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


# --------------------------------------------------------------------------------------
# PFLlib Dirichlet
# --------------------------------------------------------------------------------------


def pfllib_dirichlet_attempt(
    labels: np.ndarray, num_clients: int, num_classes: int, alpha: float, rng: np.random.RandomState
) -> list[np.ndarray]:
    """One pass of PFLlib's ``separate_data(partition="dir")`` loop body.

    For each class k in order: take its indices in pool order, shuffle them, draw
    ``p ~ Dir(alpha · 1_m)`` over clients, zero ``p_j`` for clients already holding at
    least ``N / m`` samples, renormalise, and cut the shuffled indices at
    ``int(cumsum(p) · n_k)``. The RNG calls are exactly PFLlib's: one ``shuffle`` and one
    ``dirichlet`` per class.

    Parameters
    ----------
    labels : numpy.ndarray
        Pooled labels ``(N,)``.
    num_clients, num_classes : int
        m and K.
    alpha : float
        Dirichlet concentration.
    rng : numpy.random.RandomState
        Plays the role of PFLlib's global NumPy RNG.

    Returns
    -------
    list of numpy.ndarray
        Sample indices of each client (class by class, in draw order).
    """
    total = len(labels)
    pieces: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    sizes = np.zeros(num_clients, dtype=np.int64)
    concentration = np.repeat(alpha, num_clients)
    for label in range(num_classes):
        class_indices = np.where(labels == label)[0]
        rng.shuffle(class_indices)
        proportions = rng.dirichlet(concentration)
        proportions = proportions * (sizes < total / num_clients)
        mass = proportions.sum()
        if mass > 0:
            proportions = proportions / mass
        else:  # every open client drew an underflowed 0: give the class to the open ones
            proportions = (sizes < total / num_clients) / np.sum(sizes < total / num_clients)
        cuts = (np.cumsum(proportions) * len(class_indices)).astype(int)[:-1]
        for client, piece in enumerate(np.split(class_indices, cuts)):
            pieces[client].append(piece)
            sizes[client] += len(piece)
    return [
        np.concatenate(client_pieces).astype(np.int64) if client_pieces else np.zeros(0, np.int64)
        for client_pieces in pieces
    ]


def pfllib_dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    seed: int = 1,
    num_classes: int | None = None,
    least_samples: int = PFLLIB_LEAST_SAMPLES,
    max_attempts: int = PFLLIB_MAX_ATTEMPTS,
) -> list[np.ndarray]:
    """PFLlib's unbalanced Dirichlet split (pfedgt.md §5.2), repeated until it fits.

    Calls :func:`pfllib_dirichlet_attempt` with one ``numpy.random.RandomState(seed)``
    until the smallest client holds at least ``least_samples`` samples. PFLlib seeds the
    global RNG with ``np.random.seed(1)`` and makes no other draws before
    ``separate_data``, so ``seed=1`` on the CIFAR-10 labels (train then test) gives the
    client sizes of the pFedGT paper's Table 5.

    Parameters
    ----------
    labels : numpy.ndarray
        Pooled labels ``(N,)`` with values ``0 .. num_classes - 1``.
    num_clients : int
        Number of clients m.
    alpha : float
        Dirichlet concentration.
    seed : int
        RandomState seed (PFLlib: 1).
    num_classes : int, optional
        K; default ``labels.max() + 1``.
    least_samples : int
        Minimum client size; default :data:`PFLLIB_LEAST_SAMPLES` (40).
    max_attempts : int
        Draws before giving up with :class:`DatasetError`.

    Returns
    -------
    list of numpy.ndarray
        Sample indices of each client.
    """
    labels = np.asarray(labels)
    _check_clients(labels, num_clients)
    if alpha <= 0:
        raise DatasetError(f"alpha must be positive, got {alpha}")
    if least_samples * num_clients > len(labels):
        raise DatasetError(
            f"pfllib-dirichlet: {num_clients} clients with at least {least_samples} samples "
            f"need {least_samples * num_clients} samples, the dataset has {len(labels)}; "
            "use fewer clients"
        )
    classes = int(labels.max()) + 1 if num_classes is None else num_classes
    rng = np.random.RandomState(seed)
    smallest = 0
    for _ in range(max_attempts):
        clients = pfllib_dirichlet_attempt(labels, num_clients, classes, alpha, rng)
        smallest = min(len(indices) for indices in clients)
        if smallest >= least_samples:
            return clients
    raise DatasetError(
        f"pfllib-dirichlet: after {max_attempts} draws the smallest of {num_clients} "
        f"clients still had {smallest} < least_samples={least_samples} samples with "
        f"alpha={alpha}; use a larger alpha or fewer clients"
    )


# --------------------------------------------------------------------------------------
# Dispatch and train/test split
# --------------------------------------------------------------------------------------


def partition_indices(
    labels: np.ndarray,
    num_clients: int,
    partition: str,
    *,
    seed: int = 0,
    alpha: float = 0.5,
    classes_per_client: int = 2,
    shards_per_client: int = 2,
    num_classes: int | None = None,
) -> list[np.ndarray]:
    """Divide a pooled data set's labels over clients with the named partitioner.

    Parameters
    ----------
    labels : numpy.ndarray
        Pooled labels ``(N,)``.
    num_clients : int
        Number of clients.
    partition : str
        One of :data:`PARTITIONS` except ``"natural"``.
    seed : int
        Partitioner seed.
    alpha : float
        Dirichlet concentration (``dirichlet``, ``pfllib-dirichlet``).
    classes_per_client : int
        For ``pathological``.
    shards_per_client : int
        For ``shards``.
    num_classes : int, optional
        Number of classes (``pfllib-dirichlet``); default ``labels.max() + 1``.

    Returns
    -------
    list of numpy.ndarray
        Sample indices of each client.
    """
    check_partition_name(partition)
    labels = np.asarray(labels)
    builders: dict[str, Callable[[], list[np.ndarray]]] = {
        "iid": lambda: iid_partition(labels, num_clients, seed),
        "dirichlet": lambda: dirichlet_partition(labels, num_clients, alpha, seed),
        "pathological": lambda: pathological_partition(
            labels, num_clients, classes_per_client, seed
        ),
        "shards": lambda: shard_partition(labels, num_clients, shards_per_client, seed),
        "pfllib-dirichlet": lambda: pfllib_dirichlet_partition(
            labels, num_clients, alpha, seed, num_classes
        ),
    }
    if partition not in builders:
        raise DatasetError(
            f"partition {partition!r} only applies to natively federated datasets; "
            f"for a pooled dataset use one of: {', '.join(builders)}"
        )
    return builders[partition]()


def split_seed(seed: int, client_id: int) -> int:
    """Seed of one client's train/test split, derived from the run seed and client id.

    Parameters
    ----------
    seed, client_id : int
        Run seed and client id.

    Returns
    -------
    int
        A 32-bit seed.
    """
    return int(np.random.SeedSequence([seed, client_id]).generate_state(1)[0])


def train_test_indices(
    num_samples: int, test_fraction: float, seed: int, client_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random train/test split of one client's samples.

    ``sklearn.model_selection.train_test_split`` (not stratified) with
    ``random_state = split_seed(seed, client_id)``; the test part has
    ``ceil(test_fraction · n)`` samples. ``test_fraction == 0`` keeps everything for
    training.

    Parameters
    ----------
    num_samples : int
        The client's number of samples.
    test_fraction : float
        Share of samples for testing, in ``[0, 1)``.
    seed, client_id : int
        Run seed and client id.

    Returns
    -------
    train, test : numpy.ndarray
        Positions into the client's samples.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise DatasetError(f"test_fraction must be in [0, 1), got {test_fraction}")
    if num_samples < 2:
        raise DatasetError(
            f"client {client_id} has {num_samples} sample(s), at least 2 are needed for a "
            "train/test split; use fewer clients or a larger alpha"
        )
    positions = np.arange(num_samples, dtype=np.int64)
    if test_fraction == 0.0:
        return positions, np.zeros(0, dtype=np.int64)
    from sklearn.model_selection import train_test_split

    try:
        train, test = train_test_split(
            positions, test_size=test_fraction, random_state=split_seed(seed, client_id)
        )
    except ValueError as error:
        raise DatasetError(
            f"client {client_id}: cannot split {num_samples} samples with "
            f"test_fraction={test_fraction} ({error}); use fewer clients or a larger alpha"
        ) from error
    return np.asarray(train), np.asarray(test)
