"""``synthetic`` and ``synthetic-on-demand``: FedProx Synthetic(α, β) with PAGE's sizes, one
generated share per client.

Two readings of the generator, ``synthetic-model``:

``per-client`` (default)
    FedProx's Synthetic(α, β): every client labels its features with its own ``W_k, b_k``.
    The clients' labelling rules conflict, so no single model fits the pool: a centralised
    logistic regression on Synthetic(0.5, 0.5) reaches about 71 % (``tests/test_datasets``).
``shared``
    One ``W, b ~ N(0, 1)`` for every client, the features still per client (``v_k`` with
    β): FedDyn's ``iid_sol`` option, the reading PAGE's Synthetic takes (its model and,
    by its own account, a low degree of heterogeneity). A centralised logistic regression
    reaches about 97 % there, the level of PAGE's best global baselines (Table 1).

``synthetic-on-demand`` is the same model with each client drawn from a random stream of its
own (:func:`synthetic_on_demand_client`): a client's share is built alone and the same in any
federation, and every client's size is its stream's first draw
(:func:`synthetic_on_demand_counts`), so a virtual federation of 100,000 clients costs its
sampled clients only. Its draws are not ``synthetic``'s.

``synthetic-samples`` fixes every client's sample count (0: lognormal with mean 300).
PAGE's counts, 210 train and 90 test samples per client and 7,500 on the server, are
``synthetic-samples = 375`` with ``server-fraction = 0.2`` (75 per client to the server)
and ``test-fraction = 0.3`` (90 of the remaining 300).
"""

from __future__ import annotations

import numpy as np

from pflarena.core.datasets.base import DatasetInfo, NaturalDataset
from pflarena.core.datasets.registry import DatasetSpec, register_dataset

__all__ = [
    "SYNTHETIC_DIMENSION",
    "SYNTHETIC_INFO",
    "SYNTHETIC_MEAN_SIZE",
    "SYNTHETIC_MIN_SIZE",
    "SYNTHETIC_MODELS",
    "SYNTHETIC_NUM_CLASSES",
    "SYNTHETIC_ON_DEMAND_INFO",
    "SYNTHETIC_SIZE_SIGMA",
    "generate_synthetic",
    "synthetic_on_demand_client",
    "synthetic_on_demand_counts",
    "synthetic_sizes",
]

#: Synthetic(α, β) of PAGE (docs/papers/page.md §5.1): 30 features, 30 classes.
SYNTHETIC_DIMENSION = 30
SYNTHETIC_NUM_CLASSES = 30
SYNTHETIC_MEAN_SIZE = 300.0
SYNTHETIC_SIZE_SIGMA = 0.5
SYNTHETIC_MIN_SIZE = 20
#: ``synthetic-model``: a labelling model per client (FedProx) or one shared (FedDyn's
#: ``iid_sol``).
SYNTHETIC_MODELS: tuple[str, ...] = ("per-client", "shared")

SYNTHETIC_INFO = DatasetInfo("synthetic", SYNTHETIC_NUM_CLASSES, (SYNTHETIC_DIMENSION,))
#: What both data sets' loaders read of the federation spec.
_READS = (
    "num_clients",
    "seed",
    "synthetic_alpha",
    "synthetic_beta",
    "synthetic_model",
    "synthetic_samples",
)


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
    model: str = "per-client",
    samples: int = 0,
) -> NaturalDataset:
    """FedProx Synthetic(α, β) with PAGE's sizes (docs/papers/page.md §5.1), or its shared-model
    reading.

    Per client k, following FedProx's ``generate_synthetic`` (``α`` and ``β`` are used as
    standard deviations there, as here):

    * ``u_k ~ N(0, α²)``, ``B_k ~ N(0, β²)``;
    * ``W_k ∈ R^{d×C}`` with entries ``~ N(u_k, 1)``, ``b_k ∈ R^C`` with entries
      ``~ N(u_k, 1)``;
    * ``v_k ∈ R^d`` with entries ``~ N(B_k, 1)``;
    * ``x ~ N(v_k, Σ)``, ``Σ = diag(j^{-1.2})``, and ``y = argmax(W_kᵀ x + b_k)``.

    ``model="shared"`` (FedDyn's ``iid_sol``) draws one ``W ∈ R^{d×C}`` and ``b ∈ R^C``
    with entries ``~ N(0, 1)`` for all clients (α is then unused); the features keep their
    per-client means ``v_k``, so β still sets how the clients' inputs differ.

    Sizes are lognormal with mean 300 (σ = 0.5, at least 20), see :func:`synthetic_sizes`,
    unless ``samples`` fixes them.

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
    model : {"per-client", "shared"}
        A labelling model per client (FedProx), or one for all (FedDyn's ``iid_sol``).
    samples : int
        Samples per client; 0: lognormal sizes with mean 300.

    Returns
    -------
    NaturalDataset
        ``float32`` features ``(n_k, dimension)`` and ``int64`` labels per client.
    """
    if model not in SYNTHETIC_MODELS:
        raise ValueError(f"synthetic-model must be one of {SYNTHETIC_MODELS}, got {model!r}")
    if samples < 0:
        raise ValueError(f"synthetic-samples must be >= 0 (0: lognormal sizes), got {samples}")
    rng = np.random.default_rng(seed)
    if samples:
        sizes = np.full(num_clients, samples, dtype=np.int64)
    else:
        sizes = synthetic_sizes(num_clients, rng)
    model_means = rng.normal(0.0, alpha, num_clients)
    feature_means = rng.normal(0.0, beta, num_clients)
    feature_scale = np.power(np.arange(1, dimension + 1, dtype=np.float64), -1.2 / 2.0)
    if model == "shared":
        shared_weights = rng.normal(0.0, 1.0, (dimension, num_classes))
        shared_bias = rng.normal(0.0, 1.0, num_classes)
    clients = []
    for client in range(num_clients):
        center = rng.normal(feature_means[client], 1.0, dimension)
        if model == "shared":
            weights, bias = shared_weights, shared_bias
        else:
            weights = rng.normal(model_means[client], 1.0, (dimension, num_classes))
            bias = rng.normal(model_means[client], 1.0, num_classes)
        x = center + rng.standard_normal((int(sizes[client]), dimension)) * feature_scale
        y = np.argmax(x @ weights + bias, axis=1).astype(np.int64)
        clients.append((x.astype(np.float32), y))
    info = DatasetInfo("synthetic", num_classes, (dimension,))
    return NaturalDataset(clients=clients, info=info)


def _load(
    num_clients: int,
    seed: int,
    synthetic_alpha: float,
    synthetic_beta: float,
    synthetic_model: str,
    synthetic_samples: int,
) -> NaturalDataset:
    return generate_synthetic(
        num_clients,
        synthetic_alpha,
        synthetic_beta,
        seed,
        model=synthetic_model,
        samples=synthetic_samples,
    )


register_dataset(
    DatasetSpec(
        name="synthetic",
        info=SYNTHETIC_INFO,
        kind="natural",
        loader=_load,
        reads=_READS,
        embedded=True,
        default_model="logreg",
    )
)


# ------------------------------------------------------------------ synthetic-on-demand
#: ``synthetic-on-demand``'s description: Synthetic(α, β)'s shapes.
SYNTHETIC_ON_DEMAND_INFO = DatasetInfo(
    "synthetic-on-demand", SYNTHETIC_NUM_CLASSES, (SYNTHETIC_DIMENSION,)
)


def _client_stream(seed: int, client_id: int) -> np.random.Generator:
    """Client ``client_id``'s own random stream: child ``client_id`` of the seed's
    ``SeedSequence`` (what ``SeedSequence(seed).spawn`` gives it), independent of every
    other client's and of the number of clients."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(client_id,)))


def _on_demand_size(rng: np.random.Generator, samples: int) -> int:
    """The stream's first draw: the client's lognormal size (mean 300, σ = 0.5, at least
    20), drawn even where ``samples`` fixes it, so that the rest of the stream is the same."""
    mu = np.log(SYNTHETIC_MEAN_SIZE) - SYNTHETIC_SIZE_SIGMA**2 / 2.0
    size = max(int(rng.lognormal(mu, SYNTHETIC_SIZE_SIGMA)), SYNTHETIC_MIN_SIZE)
    return samples or size


def synthetic_on_demand_client(
    client_id: int,
    num_clients: int,
    alpha: float = 0.5,
    beta: float = 0.5,
    seed: int = 0,
    model: str = "per-client",
    samples: int = 0,
    dimension: int = SYNTHETIC_DIMENSION,
    num_classes: int = SYNTHETIC_NUM_CLASSES,
) -> tuple[np.ndarray, np.ndarray]:
    """One client's share of ``synthetic-on-demand``, drawn alone.

    The model of :func:`generate_synthetic` (FedProx's Synthetic(α, β), or its shared-model
    reading), each client drawn from its own stream (:func:`_client_stream`): its size,
    ``u_k``, ``B_k``, ``v_k``, ``W_k, b_k`` and its samples, in that order. A client's
    data is then the same in a federation of 10 or of 100,000 clients, and building it
    costs that client alone: the data of a virtual federation too large to draw whole.
    ``model="shared"`` draws the one ``W, b`` from the seed's root stream.
    ``num_clients`` only bounds ``client_id``.
    """
    if model not in SYNTHETIC_MODELS:
        raise ValueError(f"synthetic-model must be one of {SYNTHETIC_MODELS}, got {model!r}")
    if samples < 0:
        raise ValueError(f"synthetic-samples must be >= 0 (0: lognormal sizes), got {samples}")
    if not 0 <= client_id < num_clients:
        raise ValueError(f"client_id {client_id} out of range for {num_clients} clients")
    rng = _client_stream(seed, client_id)
    size = _on_demand_size(rng, samples)
    model_mean = rng.normal(0.0, alpha)
    feature_mean = rng.normal(0.0, beta)
    center = rng.normal(feature_mean, 1.0, dimension)
    if model == "shared":
        root = np.random.default_rng(np.random.SeedSequence(seed))
        weights = root.normal(0.0, 1.0, (dimension, num_classes))
        bias = root.normal(0.0, 1.0, num_classes)
    else:
        weights = rng.normal(model_mean, 1.0, (dimension, num_classes))
        bias = rng.normal(model_mean, 1.0, num_classes)
    feature_scale = np.power(np.arange(1, dimension + 1, dtype=np.float64), -1.2 / 2.0)
    x = center + rng.standard_normal((size, dimension)) * feature_scale
    y = np.argmax(x @ weights + bias, axis=1).astype(np.int64)
    return x.astype(np.float32), y


def synthetic_on_demand_counts(num_clients: int, seed: int, samples: int = 0) -> np.ndarray:
    """Every client's size in ``synthetic-on-demand``: each stream's first draw only."""
    if samples:
        return np.full(num_clients, samples, dtype=np.int64)
    return np.array(
        [_on_demand_size(_client_stream(seed, k), 0) for k in range(num_clients)], dtype=np.int64
    )


def _client_on_demand(
    client_id: int,
    num_clients: int,
    seed: int,
    synthetic_alpha: float,
    synthetic_beta: float,
    synthetic_model: str,
    synthetic_samples: int,
) -> tuple[np.ndarray, np.ndarray]:
    return synthetic_on_demand_client(
        client_id,
        num_clients,
        synthetic_alpha,
        synthetic_beta,
        seed,
        model=synthetic_model,
        samples=synthetic_samples,
    )


def _load_on_demand(
    num_clients: int,
    seed: int,
    synthetic_alpha: float,
    synthetic_beta: float,
    synthetic_model: str,
    synthetic_samples: int,
) -> NaturalDataset:
    clients = [
        _client_on_demand(
            k,
            num_clients,
            seed,
            synthetic_alpha,
            synthetic_beta,
            synthetic_model,
            synthetic_samples,
        )  # fmt: skip
        for k in range(num_clients)
    ]
    return NaturalDataset(clients=clients, info=SYNTHETIC_ON_DEMAND_INFO)


def _counts_on_demand(
    num_clients: int,
    seed: int,
    synthetic_alpha: float,
    synthetic_beta: float,
    synthetic_model: str,
    synthetic_samples: int,
) -> np.ndarray:
    return synthetic_on_demand_counts(num_clients, seed, synthetic_samples)


register_dataset(
    DatasetSpec(
        name="synthetic-on-demand",
        info=SYNTHETIC_ON_DEMAND_INFO,
        kind="natural",
        loader=_load_on_demand,
        client_loader=_client_on_demand,
        client_counts=_counts_on_demand,
        reads=_READS,
        embedded=True,
        default_model="logreg",
    )
)
