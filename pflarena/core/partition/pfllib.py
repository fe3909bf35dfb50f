"""``pfllib-dirichlet``: PFLlib's ``separate_data`` Dirichlet procedure.

The split behind the pFedGT paper's Table 5, written here with its own ``RandomState``
so that the RNG calls are exactly PFLlib's.
"""

from __future__ import annotations

import numpy as np

from pflarena.core.datasets import DatasetError
from pflarena.core.partition.registry import PartitionSpec, check_clients, register_partition

__all__ = [
    "PFLLIB_LEAST_SAMPLES",
    "PFLLIB_MAX_ATTEMPTS",
    "pfllib_dirichlet_attempt",
    "pfllib_dirichlet_partition",
]

#: PFLlib's older default ``batch_size / (1 - train_size)`` with batch size 10 and a
#: 0.75 train share. With seed 1 on CIFAR-10 (20 clients) any threshold up to 1164
#: gives the same partition as PFLlib's current default of 1.
PFLLIB_LEAST_SAMPLES = 40

#: Upper bound on PFLlib-Dirichlet re-draws before giving up.
PFLLIB_MAX_ATTEMPTS = 1000


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
    check_clients(labels, num_clients)
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


register_partition(
    PartitionSpec(
        "pfllib-dirichlet",
        pfllib_dirichlet_partition,
        reads=("num_clients", "alpha", "seed", "num_classes"),
    )
)
