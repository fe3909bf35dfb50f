"""``inner-dirichlet``: clients of set sizes whose class mix follows a Dirichlet prior.

The partition the PAGE paper describes for CIFAR-100 and Tiny-ImageNet ("divided
uniformly into 100 parts ... the class proportions follow Dir(0.3)", docs/papers/page.md §5.1),
which is FedLab's ``client_inner_dirichlet_partition`` (the toolkit PAGE cites):

1. Client sizes: equal parts of ``floor(N / m)`` samples (the ``N mod m`` left over stay
   unused), or with ``quantity_sigma > 0`` FedLab's ``lognormal_unbalance_split``: sizes
   drawn from ``LogNormal(log(N / m), sigma^2)``, scaled to sum to ``N`` and rounded
   down, the shortfall added to the first client (PAGE Table 3's quantity skew σ).
2. Each client draws a class prior ``q_i ~ Dir(alpha · 1_C)``.
3. Until every client is full: pick a client uniformly among those that still need
   samples, draw a class from ``q_i``, and give the client one not yet used sample of
   that class.

FedLab redraws the class when its pool is empty, which can spin for a long time with a
small ``alpha``. Here the class is drawn from ``q_i`` restricted to the classes that
still have samples and renormalised (the fallback of docs/papers/page.md §9.19). That is exactly
the distribution of FedLab's redraw loop (rejection sampling from ``q_i`` until a non-empty
class comes up), reached in one draw; a client whose prior has no mass left on any
non-empty class takes a class uniformly among them. Drawing a client among those that
still need samples is, likewise, FedLab's draw among all clients with the full ones
rejected.
"""

from __future__ import annotations

import numpy as np

from pflarena.core.datasets import DatasetError
from pflarena.core.partition.registry import PartitionSpec, check_clients, register_partition

__all__ = ["client_sizes", "fill_clients", "inner_dirichlet_partition"]


def client_sizes(
    num_samples: int, num_clients: int, quantity_sigma: float, rng: np.random.Generator
) -> np.ndarray:
    """How many samples each client gets (FedLab's balanced or log-normal split).

    Parameters
    ----------
    num_samples : int
        N, the samples to share.
    num_clients : int
        m.
    quantity_sigma : float
        0 for equal sizes ``floor(N / m)``; above 0, the log-normal σ.
    rng : numpy.random.Generator
        Draws the log-normal sizes.

    Returns
    -------
    numpy.ndarray
        ``int64`` sizes ``(m,)``.
    """
    per_client = num_samples // num_clients
    if quantity_sigma == 0:
        return np.full(num_clients, per_client, dtype=np.int64)
    raw = rng.lognormal(mean=np.log(per_client), sigma=quantity_sigma, size=num_clients)
    sizes = (raw / raw.sum() * num_samples).astype(np.int64)
    sizes[0] += num_samples - sizes.sum()
    return sizes


def fill_clients(
    labels: np.ndarray,
    priors: np.ndarray,
    sizes: np.ndarray,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Step 3: fill clients one sample at a time, classes drawn from their priors.

    Parameters
    ----------
    labels : numpy.ndarray
        Pooled labels ``(N,)``, values ``0 .. C - 1``.
    priors : numpy.ndarray
        Class priors ``(m, C)``, rows summing to 1.
    sizes : numpy.ndarray
        Samples each client needs; their sum must not exceed ``N``.
    rng : numpy.random.Generator
        Draws clients, classes and the order of each class's samples.

    Returns
    -------
    list of numpy.ndarray
        Sample indices of each client, in the order they were given.
    """
    num_classes = priors.shape[1]
    pools = [rng.permutation(np.flatnonzero(labels == label)) for label in range(num_classes)]
    remaining = np.array([len(pool) for pool in pools], dtype=np.int64)
    needed = np.asarray(sizes, dtype=np.int64).copy()
    given: list[list[int]] = [[] for _ in range(len(needed))]
    open_clients = list(np.flatnonzero(needed > 0))
    while open_clients:
        position = int(rng.integers(len(open_clients)))
        client = int(open_clients[position])
        weights = priors[client] * (remaining > 0)
        mass = weights.sum()
        if mass <= 0:  # no prior mass on any class left: any non-empty class
            weights, mass = (remaining > 0).astype(np.float64), float((remaining > 0).sum())
        label = int(rng.choice(num_classes, p=weights / mass))
        remaining[label] -= 1
        given[client].append(int(pools[label][remaining[label]]))
        needed[client] -= 1
        if needed[client] == 0:
            open_clients.pop(position)
    return [np.array(indices, dtype=np.int64) for indices in given]


def inner_dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    alpha: float,
    seed: int = 0,
    num_classes: int | None = None,
    quantity_sigma: float = 0.0,
) -> list[np.ndarray]:
    """Set client sizes, then fill each client by its own Dirichlet class prior.

    Parameters
    ----------
    labels : numpy.ndarray
        Pooled labels ``(N,)``.
    num_clients : int
        m.
    alpha : float
        Concentration δ of the class priors (PAGE: 0.3).
    seed : int
        Seed of every draw.
    num_classes : int, optional
        C; default ``labels.max() + 1``.
    quantity_sigma : float
        Log-normal σ of the client sizes; 0 for equal sizes.

    Returns
    -------
    list of numpy.ndarray
        Sample indices of each client.

    Raises
    ------
    DatasetError
        Too few samples for the clients, or a non-positive ``alpha``.
    """
    labels = np.asarray(labels)
    check_clients(labels, num_clients)
    if alpha <= 0:
        raise DatasetError(f"alpha must be positive, got {alpha}")
    classes = int(labels.max()) + 1 if num_classes is None else num_classes
    rng = np.random.default_rng(seed)
    sizes = client_sizes(len(labels), num_clients, quantity_sigma, rng)
    if sizes.min() < 1:
        raise DatasetError(
            f"inner-dirichlet: quantity-sigma={quantity_sigma} left a client of {num_clients} "
            f"with {sizes.min()} of the {len(labels)} samples; use a smaller quantity-sigma "
            "or fewer clients"
        )
    priors = rng.dirichlet(np.full(classes, alpha), size=num_clients)
    return fill_clients(labels, priors, sizes, rng)


register_partition(
    PartitionSpec(
        "inner-dirichlet",
        inner_dirichlet_partition,
        reads=("num_clients", "alpha", "seed", "num_classes", "quantity_sigma"),
    )
)
