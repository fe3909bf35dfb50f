"""``synthetic-mixture``: the FedEM / PPFL binary mixture generator (Marfoq et al. 2021).

Each client's labels come from a mixture of K* = 3 logistic components; the true
components and memberships are available for recovery tests
(:func:`~pflarena.core.federation.synthetic_mixture_truth`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pflarena.core.datasets.base import DatasetError, DatasetInfo, NaturalDataset
from pflarena.core.datasets.registry import DatasetSpec, register_dataset

__all__ = [
    "MIXTURE_ALPHA",
    "MIXTURE_BOX",
    "MIXTURE_COMPONENTS",
    "MIXTURE_DIMENSION",
    "MIXTURE_INFO",
    "MIXTURE_LABEL_MODES",
    "MIXTURE_MAX_SIZE",
    "MIXTURE_MIN_SIZE",
    "MIXTURE_NOISE_LEVEL",
    "SyntheticMixture",
    "generate_synthetic_mixture",
    "mixture_labels",
    "mixture_sample_counts",
]

#: Marfoq et al. (2021) mixture generator defaults (ppfl.md §5.1).
MIXTURE_COMPONENTS = 3
MIXTURE_DIMENSION = 150
MIXTURE_ALPHA = 0.4
MIXTURE_NOISE_LEVEL = 0.1
MIXTURE_BOX = (-1.0, 1.0)
MIXTURE_MIN_SIZE = 50
MIXTURE_MAX_SIZE = 1000
MIXTURE_LABEL_MODES: tuple[str, ...] = ("fixed", "faithful")

MIXTURE_INFO = DatasetInfo("synthetic-mixture", 2, (MIXTURE_DIMENSION,))


@dataclass(frozen=True)
class SyntheticMixture:
    """Output of :func:`generate_synthetic_mixture`.

    Parameters
    ----------
    components : numpy.ndarray
        True component parameters θ*, ``(K, d)``.
    mixture_weights : numpy.ndarray
        True memberships α, ``(num_clients, K)``.
    clients : list of (numpy.ndarray, numpy.ndarray)
        Each client's generated ``float32`` samples and ``int64`` labels.
    test_clients : list of (numpy.ndarray, numpy.ndarray) or None
        The reference's separate per-client test sets when ``n_test > 0``, else ``None``.
    """

    components: np.ndarray
    mixture_weights: np.ndarray
    clients: list[tuple[np.ndarray, np.ndarray]]
    test_clients: list[tuple[np.ndarray, np.ndarray]] | None = None


def mixture_sample_counts(num_clients: int, rng: np.random.RandomState) -> np.ndarray:
    """Per-client training sizes ``min(floor(LogNormal(4, 2)) + 50, 1000)``.

    Parameters
    ----------
    num_clients : int
        Number of clients.
    rng : numpy.random.RandomState
        Random source, in the reference's call order.

    Returns
    -------
    numpy.ndarray
        ``int64`` sizes ``(num_clients,)``.
    """
    sizes = rng.lognormal(4, 2, num_clients).astype(int)
    return np.minimum(sizes + MIXTURE_MIN_SIZE, MIXTURE_MAX_SIZE).astype(np.int64)


def mixture_labels(
    x: np.ndarray,
    components: np.ndarray,
    counts: Sequence[int],
    noises: Sequence[np.ndarray],
    label_mode: str,
) -> np.ndarray:
    """Labels of one generated batch, before the reference's final shuffle.

    Component k owns ``counts[k]`` samples; its label is
    ``round(sigmoid(x · θ_k + noise))``.

    * ``"fixed"``: component k labels the block of rows that follows the blocks of
      components ``0 .. k-1``.
    * ``"faithful"``: the reference code never advances ``current_index``, so every
      component labels rows ``0 .. counts[k] - 1`` from ``x[0 : counts[k]]`` and
      overwrites the previous components. Rows ``≥ max(counts)`` keep the label 0.

    Parameters
    ----------
    x : numpy.ndarray
        Samples ``(n, d)`` with ``n == sum(counts)``.
    components : numpy.ndarray
        θ*, ``(K, d)``.
    counts : sequence of int
        Samples per component (a multinomial draw).
    noises : sequence of numpy.ndarray
        Per-component Gaussian noise, ``noises[k]`` of length ``counts[k]``.
    label_mode : {"fixed", "faithful"}
        Whether to reproduce the reference bug.

    Returns
    -------
    numpy.ndarray
        ``int64`` labels ``(n,)`` in row order of ``x``.
    """
    if label_mode not in MIXTURE_LABEL_MODES:
        raise DatasetError(
            f"unknown mixture_label_mode {label_mode!r}; allowed: {', '.join(MIXTURE_LABEL_MODES)}"
        )
    labels = np.zeros(len(x), dtype=np.int64)
    start = 0
    for component, (count, noise) in enumerate(zip(counts, noises, strict=True)):
        rows = slice(start, start + int(count))
        logits = x[rows] @ components[component] + noise
        labels[rows] = np.round(1.0 / (1.0 + np.exp(-logits))).astype(np.int64)
        if label_mode == "fixed":
            start += int(count)
    return labels


def _mixture_batch(
    rng: np.random.RandomState,
    n_samples: int,
    weights: np.ndarray,
    components: np.ndarray,
    label_mode: str,
) -> tuple[np.ndarray, np.ndarray]:
    """One ``generate_data`` call of the reference, with its RNG call order."""
    from sklearn.utils import shuffle

    counts = rng.multinomial(n_samples, weights)
    x = rng.uniform(MIXTURE_BOX[0], MIXTURE_BOX[1], size=(n_samples, components.shape[1]))
    noises = [rng.normal(size=int(count), scale=MIXTURE_NOISE_LEVEL) for count in counts]
    y = mixture_labels(x, components, counts, noises, label_mode)
    x, y = shuffle(x, y, random_state=rng)
    return x.astype(np.float32), y


def generate_synthetic_mixture(
    num_clients: int,
    seed: int = 0,
    label_mode: str = "fixed",
    n_components: int = MIXTURE_COMPONENTS,
    dimension: int = MIXTURE_DIMENSION,
    alpha: float = MIXTURE_ALPHA,
    n_test: int = 0,
    truth_only: bool = False,
) -> SyntheticMixture:
    """Generate the FedEM / PPFL binary mixture data (Marfoq et al. 2021; ppfl.md §5.1).

    With one ``numpy.random.RandomState(seed)`` standing in for the reference's global
    RNG, and the same call order:

    1. sizes ``n_i = min(floor(LogNormal(4, 2)) + 50, 1000)``;
    2. memberships ``α_i ~ Dir(alpha · 1_K)``, client by client;
    3. components ``θ_k* ~ U(-1, 1)^d``;
    4. per client, per batch: counts ``~ Mult(n, α_i)``, ``x ~ U(-1, 1)^d``, per-component
       noise ``N(0, 0.1²)``, labels by :func:`mixture_labels`, then a shuffle.

    The reference draws a separate 5,000-sample test set per client right after each
    training set (``n_test=5000`` reproduces that, and then the training sets of
    ``seed=12345, num_clients=300`` are the reference's). :func:`build_federation
    <pflarena.core.federation.build_federation>` uses ``n_test=0`` and splits each
    client's own samples with ``test_fraction`` instead.

    Parameters
    ----------
    num_clients : int
        Number of clients (the paper uses 300).
    seed : int
        RNG seed (the reference uses 12345).
    label_mode : {"fixed", "faithful"}
        ``"faithful"`` reproduces the reference's ``current_index`` bug.
    n_components, dimension : int
        K* and d.
    alpha : float
        Dirichlet concentration of the memberships.
    n_test : int
        Size of a separate per-client test set drawn as the reference does; 0 for none.
    truth_only : bool
        Stop after drawing θ* and α (no samples).

    Returns
    -------
    SyntheticMixture
        Components, memberships and the per-client data.
    """
    if label_mode not in MIXTURE_LABEL_MODES:
        raise DatasetError(
            f"unknown mixture_label_mode {label_mode!r}; allowed: {', '.join(MIXTURE_LABEL_MODES)}"
        )
    rng = np.random.RandomState(seed)
    sizes = mixture_sample_counts(num_clients, rng)
    concentration = alpha * np.ones(n_components)
    weights = np.zeros((num_clients, n_components))
    for client in range(num_clients):
        weights[client] = rng.dirichlet(alpha=concentration)
    components = rng.uniform(MIXTURE_BOX[0], MIXTURE_BOX[1], size=(n_components, dimension))
    if truth_only:
        return SyntheticMixture(components, weights, clients=[])
    clients = []
    test_clients: list[tuple[np.ndarray, np.ndarray]] | None = [] if n_test > 0 else None
    for client in range(num_clients):
        batch = _mixture_batch(rng, int(sizes[client]), weights[client], components, label_mode)
        clients.append(batch)
        if test_clients is not None:
            test_clients.append(
                _mixture_batch(rng, n_test, weights[client], components, label_mode)
            )
    return SyntheticMixture(components, weights, clients, test_clients)


def _load(num_clients: int, seed: int, mixture_label_mode: str) -> NaturalDataset:
    mixture = generate_synthetic_mixture(num_clients, seed, mixture_label_mode)
    return NaturalDataset(clients=mixture.clients, info=MIXTURE_INFO)


register_dataset(
    DatasetSpec(
        name="synthetic-mixture",
        info=MIXTURE_INFO,
        kind="natural",
        loader=_load,
        reads=("num_clients", "seed", "mixture_label_mode"),
        embedded=True,
        default_model="logreg",
    )
)
