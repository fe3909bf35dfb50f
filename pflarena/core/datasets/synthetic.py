"""``synthetic``: FedProx Synthetic(α, β) with PAGE's sizes, one generated share per client."""

from __future__ import annotations

import numpy as np

from pflarena.core.datasets.base import DatasetInfo, NaturalDataset
from pflarena.core.datasets.registry import DatasetSpec, register_dataset

__all__ = [
    "SYNTHETIC_DIMENSION",
    "SYNTHETIC_INFO",
    "SYNTHETIC_MEAN_SIZE",
    "SYNTHETIC_MIN_SIZE",
    "SYNTHETIC_NUM_CLASSES",
    "SYNTHETIC_SIZE_SIGMA",
    "generate_synthetic",
    "synthetic_sizes",
]

#: Synthetic(α, β) of PAGE (page.md §5.1): 30 features, 30 classes.
SYNTHETIC_DIMENSION = 30
SYNTHETIC_NUM_CLASSES = 30
SYNTHETIC_MEAN_SIZE = 300.0
SYNTHETIC_SIZE_SIGMA = 0.5
SYNTHETIC_MIN_SIZE = 20

SYNTHETIC_INFO = DatasetInfo("synthetic", SYNTHETIC_NUM_CLASSES, (SYNTHETIC_DIMENSION,))


def synthetic_sizes(num_clients: int, rng: np.random.Generator) -> np.ndarray:
    """Per-client sample counts: lognormal with mean 300 and σ = 0.5, at least 20.

    Parameters
    ----------
    num_clients : int
        Number of clients.
    rng : numpy.random.Generator
        Random source.

    Returns
    -------
    numpy.ndarray
        ``int64`` sizes ``(num_clients,)``.
    """
    mu = np.log(SYNTHETIC_MEAN_SIZE) - SYNTHETIC_SIZE_SIGMA**2 / 2.0  # mean-preserving
    sizes = rng.lognormal(mu, SYNTHETIC_SIZE_SIGMA, num_clients).astype(np.int64)
    return np.maximum(sizes, SYNTHETIC_MIN_SIZE)


def generate_synthetic(
    num_clients: int,
    alpha: float = 0.5,
    beta: float = 0.5,
    seed: int = 0,
    dimension: int = SYNTHETIC_DIMENSION,
    num_classes: int = SYNTHETIC_NUM_CLASSES,
) -> NaturalDataset:
    """FedProx Synthetic(α, β) with PAGE's sizes (page.md §5.1).

    Per client k, following FedProx's ``generate_synthetic`` (``α`` and ``β`` are used as
    standard deviations there, as here):

    * ``u_k ~ N(0, α²)``, ``B_k ~ N(0, β²)``;
    * ``W_k ∈ R^{d×C}`` with entries ``~ N(u_k, 1)``, ``b_k ∈ R^C`` with entries
      ``~ N(u_k, 1)``;
    * ``v_k ∈ R^d`` with entries ``~ N(B_k, 1)``;
    * ``x ~ N(v_k, Σ)``, ``Σ = diag(j^{-1.2})``, and ``y = argmax(W_kᵀ x + b_k)``.

    Sizes are lognormal with mean 300 (σ = 0.5, at least 20), see :func:`synthetic_sizes`.

    Parameters
    ----------
    num_clients : int
        Number of clients (PAGE uses 100).
    alpha, beta : float
        Model and feature heterogeneity.
    seed : int
        Seed of the ``numpy.random.Generator`` that draws everything.
    dimension, num_classes : int
        Features and classes (PAGE: 30 and 30; FedProx: 60 and 10).

    Returns
    -------
    NaturalDataset
        ``float32`` features ``(n_k, dimension)`` and ``int64`` labels per client.
    """
    rng = np.random.default_rng(seed)
    sizes = synthetic_sizes(num_clients, rng)
    model_means = rng.normal(0.0, alpha, num_clients)
    feature_means = rng.normal(0.0, beta, num_clients)
    feature_scale = np.power(np.arange(1, dimension + 1, dtype=np.float64), -1.2 / 2.0)
    clients = []
    for client in range(num_clients):
        center = rng.normal(feature_means[client], 1.0, dimension)
        weights = rng.normal(model_means[client], 1.0, (dimension, num_classes))
        bias = rng.normal(model_means[client], 1.0, num_classes)
        x = center + rng.standard_normal((int(sizes[client]), dimension)) * feature_scale
        y = np.argmax(x @ weights + bias, axis=1).astype(np.int64)
        clients.append((x.astype(np.float32), y))
    info = DatasetInfo("synthetic", num_classes, (dimension,))
    return NaturalDataset(clients=clients, info=info)


def _load(
    num_clients: int, seed: int, synthetic_alpha: float, synthetic_beta: float
) -> NaturalDataset:
    return generate_synthetic(num_clients, synthetic_alpha, synthetic_beta, seed)


register_dataset(
    DatasetSpec(
        name="synthetic",
        info=SYNTHETIC_INFO,
        kind="natural",
        loader=_load,
        reads=("num_clients", "seed", "synthetic_alpha", "synthetic_beta"),
        embedded=True,
        default_model="logreg",
    )
)
