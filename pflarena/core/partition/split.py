"""Seeded splits of one sample set into roles: train/test, validation, server-held.

Every split draws from its own seed, derived from the run seed (and the client id where
the split is per client) with :class:`numpy.random.SeedSequence`, so that no two splits
share a random stream:

* :func:`train_test_indices` splits a client's share into training and test samples
  (seed :func:`split_seed`);
* :func:`validation_indices` carves a validation split out of a client's training split
  (seed :func:`validation_seed`);
* :func:`server_indices` sets aside the samples the server holds, from the pool of a
  pooled data set or from each client's share of a natural one (seed :func:`server_seed`);
* :func:`cap_indices` keeps a seeded choice of at most a given number of a natural
  client's samples (seed :func:`cap_seed`).

The label permutations of ``label-permutation-groups`` draw from a stream of their own too
(:func:`label_permutation_seed`, used by :mod:`~pflarena.core.partition.label_permutation`).

Each takes ``ceil(fraction · n)`` samples for the part it sets aside (the rule of
``sklearn.model_selection.train_test_split``), and a fraction of 0 sets nothing aside. The
splits are scikit-learn's ``train_test_split`` computed without importing scikit-learn
(seconds: pandas, scipy): :func:`shuffle_split` unstratified, :func:`stratified_split` the
server's, stratified by label.
"""

from __future__ import annotations

from math import ceil

import numpy as np

from pflarena.core.datasets import DatasetError

__all__ = [
    "cap_indices",
    "cap_seed",
    "label_permutation_seed",
    "server_indices",
    "server_seed",
    "shuffle_split",
    "split_seed",
    "train_test_indices",
    "validation_indices",
    "validation_seed",
]

#: Spawn-key tags that keep the validation and server streams apart from each other and
#: from :func:`split_seed`'s.
_VALIDATION_STREAM = 1
_SERVER_STREAM = 2
_CAP_STREAM = 3
_LABEL_PERMUTATION_STREAM = 4


def _seed(sequence: np.random.SeedSequence) -> int:
    return int(sequence.generate_state(1)[0])


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
    return _seed(np.random.SeedSequence([seed, client_id]))


def validation_seed(seed: int, client_id: int) -> int:
    """Seed of one client's validation split (a different stream from :func:`split_seed`).

    Parameters
    ----------
    seed, client_id : int
        Run seed and client id.

    Returns
    -------
    int
        A 32-bit seed.
    """
    return _seed(np.random.SeedSequence(seed, spawn_key=(_VALIDATION_STREAM, client_id)))


def label_permutation_seed(seed: int) -> int:
    """Seed of the label permutations of ``label-permutation-groups`` (a stream of its own).

    Parameters
    ----------
    seed : int
        Run seed.

    Returns
    -------
    int
        A 32-bit seed.
    """
    return _seed(np.random.SeedSequence(seed, spawn_key=(_LABEL_PERMUTATION_STREAM,)))


def server_seed(seed: int, client_id: int | None = None) -> int:
    """Seed of the server's share: of the whole pool, or of one client's natural share.

    Parameters
    ----------
    seed : int
        Run seed.
    client_id : int, optional
        The client whose share is split (natural data sets); ``None`` for the pool.

    Returns
    -------
    int
        A 32-bit seed.
    """
    key = (_SERVER_STREAM,) if client_id is None else (_SERVER_STREAM, client_id)
    return _seed(np.random.SeedSequence(seed, spawn_key=key))


def shuffle_split(
    positions: np.ndarray, test_fraction: float, random_state: int
) -> tuple[np.ndarray, np.ndarray]:
    """``sklearn.model_selection.train_test_split(positions, test_size=test_fraction,
    random_state=random_state)`` (unstratified, shuffled), the same arrays and the same
    ``ValueError`` for an empty training part, without importing scikit-learn.

    scikit-learn's rule: ``n_test = ceil(test_fraction · n)``, ``n_train = n - n_test``,
    one permutation from ``numpy.random.RandomState(random_state)``, its first ``n_test``
    positions the test part and the next ``n_train`` the training part
    (``ShuffleSplit``); ``tests/test_partition.py`` compares it with scikit-learn's.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(
            f"test_size={test_fraction} should be either positive and smaller than the "
            f"number of samples {len(positions)} or a float in the (0, 1) range"
        )
    n_samples = len(positions)
    n_test = ceil(test_fraction * n_samples)
    n_train = n_samples - n_test
    if n_train == 0:
        raise ValueError(
            f"With n_samples={n_samples}, test_size={test_fraction} and train_size=None, the "
            "resulting train set will be empty. Adjust any of the aforementioned parameters."
        )
    permutation = np.random.RandomState(random_state).permutation(n_samples)
    return positions[permutation[n_test : n_test + n_train]], positions[permutation[:n_test]]


def stratified_split(
    positions: np.ndarray, labels: np.ndarray, test_fraction: float, random_state: int
) -> tuple[np.ndarray, np.ndarray]:
    """``sklearn.model_selection.train_test_split(positions, test_size=test_fraction,
    random_state=random_state, stratify=labels)``: the same arrays, and a ``ValueError``
    where scikit-learn raises one (a class with one sample, fewer samples on either side
    than classes, an empty training part), without importing scikit-learn (scipy and
    pandas come with it: seconds before a ``run --check`` could answer).

    scikit-learn's rule (``StratifiedShuffleSplit``): the classes in sorted order, each
    class's positions in their order; ``n_i`` training and ``t_i`` test samples per class
    from :func:`_approximate_mode` (the training counts first, the test counts from what
    remains); then, from one ``numpy.random.RandomState(random_state)``, a permutation of
    each class in turn, its first ``n_i`` to training and the next ``t_i`` to test; then a
    permutation of each part. ``tests/test_partition.py`` compares it with scikit-learn's.
    """
    n_samples = len(positions)
    n_test = ceil(test_fraction * n_samples)
    n_train = n_samples - n_test
    if not 0.0 < test_fraction < 1.0 or n_train == 0:
        return shuffle_split(positions, test_fraction, random_state)  # raises its ValueError
    classes, y_indices = np.unique(np.asarray(labels), return_inverse=True)
    class_counts = np.bincount(y_indices.ravel())
    if class_counts.min() < 2 or n_train < len(classes) or n_test < len(classes):
        raise ValueError("a class too small, or fewer samples on a side than classes")
    class_indices = np.split(
        np.argsort(y_indices.ravel(), kind="mergesort"), np.cumsum(class_counts)[:-1]
    )
    rng = np.random.RandomState(random_state)
    n_i = _approximate_mode(class_counts, n_train, rng)
    t_i = _approximate_mode(class_counts - n_i, n_test, rng)
    train: list[int] = []
    test: list[int] = []
    for index, members in enumerate(class_indices):
        shuffled = members.take(rng.permutation(class_counts[index]), mode="clip")
        train.extend(shuffled[: n_i[index]])
        test.extend(shuffled[n_i[index] : n_i[index] + t_i[index]])
    return positions[rng.permutation(train)], positions[rng.permutation(test)]


def _approximate_mode(
    class_counts: np.ndarray, n_draws: int, rng: np.random.RandomState
) -> np.ndarray:
    """scikit-learn's ``_approximate_mode``: ``n_draws`` shared out over the classes in
    proportion to ``class_counts``, floored, the draws left over going to the classes with
    the largest remainders (ties broken at random from ``rng``)."""
    continuous = class_counts / class_counts.sum() * n_draws
    floored = np.floor(continuous)
    need_to_add = int(n_draws - floored.sum())
    if need_to_add > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (tied,) = np.where(remainder == value)
            add_now = min(len(tied), need_to_add)
            floored[rng.choice(tied, size=add_now, replace=False)] += 1
            need_to_add -= add_now
            if need_to_add == 0:
                break
    return floored.astype(int)


def train_test_indices(
    num_samples: int, test_fraction: float, seed: int, client_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random train/test split of one client's samples.

    ``sklearn.model_selection.train_test_split`` (not stratified, :func:`shuffle_split`)
    with ``random_state = split_seed(seed, client_id)``; the test part has
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
    try:
        train, test = shuffle_split(positions, test_fraction, split_seed(seed, client_id))
    except ValueError as error:
        raise DatasetError(
            f"client {client_id}: cannot split {num_samples} samples with "
            f"test_fraction={test_fraction} ({error}); use fewer clients or a larger alpha"
        ) from error
    return np.asarray(train), np.asarray(test)


def validation_indices(
    num_train: int, validation_fraction: float, seed: int, client_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random validation split of one client's training split.

    ``train_test_split`` (not stratified) with ``random_state = validation_seed(seed,
    client_id)``: the validation part has ``ceil(validation_fraction · num_train)``
    samples, the rest stays for training. Both parts are returned in increasing order,
    so the remaining training samples keep the order of the training split.
    ``validation_fraction == 0`` keeps everything for training.

    Parameters
    ----------
    num_train : int
        Size of the client's training split.
    validation_fraction : float
        Share of the training split for validation, in ``[0, 1)``.
    seed, client_id : int
        Run seed and client id.

    Returns
    -------
    train, validation : numpy.ndarray
        Positions into the client's training split.

    Raises
    ------
    DatasetError
        The fraction is out of range, or it would leave no training sample.
    """
    if not 0.0 <= validation_fraction < 1.0:
        raise DatasetError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
    positions = np.arange(num_train, dtype=np.int64)
    if validation_fraction == 0.0:
        return positions, np.zeros(0, dtype=np.int64)
    try:
        train, validation = shuffle_split(
            positions, validation_fraction, validation_seed(seed, client_id)
        )
    except ValueError as error:
        raise DatasetError(
            f"client {client_id}: cannot hold out validation_fraction={validation_fraction} "
            f"of its {num_train} training samples ({error}); use fewer clients or a smaller "
            "validation_fraction"
        ) from error
    return np.sort(train), np.sort(validation)


def server_indices(
    labels: np.ndarray, server_fraction: float, seed: int, client_id: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of a sample set into what the clients keep and what the server holds.

    ``train_test_split`` with ``random_state = server_seed(seed, client_id)``, stratified
    by label; when stratifying is impossible (a class with a single sample, or fewer
    server samples than classes) the split is drawn unstratified instead. The server
    part has ``ceil(server_fraction · n)`` samples. Both parts are returned in increasing
    order, so the kept samples keep their original order. ``server_fraction == 0`` keeps
    everything.

    Parameters
    ----------
    labels : numpy.ndarray
        Labels of the sample set ``(n,)``: the pool, or one client's natural share.
    server_fraction : float
        Share held by the server, in ``[0, 1)``.
    seed : int
        Run seed.
    client_id : int, optional
        The client whose share is split; ``None`` for a pool.

    Returns
    -------
    kept, server : numpy.ndarray
        Positions into ``labels``.

    Raises
    ------
    DatasetError
        The fraction is out of range, or it would leave nothing to the clients.
    """
    if not 0.0 <= server_fraction < 1.0:
        raise DatasetError(f"server_fraction must be in [0, 1), got {server_fraction}")
    labels = np.asarray(labels)
    positions = np.arange(len(labels), dtype=np.int64)
    if server_fraction == 0.0:
        return positions, np.zeros(0, dtype=np.int64)
    random_state = server_seed(seed, client_id)
    owner = "the pool" if client_id is None else f"client {client_id}'s share"
    try:
        try:
            kept, server = stratified_split(positions, labels, server_fraction, random_state)
        except ValueError:  # a class too small to stratify: draw unstratified
            kept, server = shuffle_split(positions, server_fraction, random_state)
    except ValueError as error:
        raise DatasetError(
            f"cannot hold out server_fraction={server_fraction} of the {len(labels)} "
            f"samples of {owner} ({error}); use a smaller server_fraction"
        ) from error
    return np.sort(kept), np.sort(server)


def cap_seed(seed: int, client_id: int) -> int:
    """Seed of the choice of a natural client's kept samples (:func:`cap_indices`).

    Parameters
    ----------
    seed, client_id : int
        Run seed and client id.

    Returns
    -------
    int
        A 32-bit seed.
    """
    return _seed(np.random.SeedSequence(seed, spawn_key=(_CAP_STREAM, client_id)))


def cap_indices(num_samples: int, max_samples: int, seed: int, client_id: int) -> np.ndarray:
    """Seeded choice of at most ``max_samples`` of a client's ``num_samples`` samples.

    A uniform draw without replacement (PAGE's "7 000 random samples" of each Shakespeare
    role), returned in increasing order so the kept samples keep their order.
    ``max_samples == 0``, or no more samples than that, keeps everything.

    Parameters
    ----------
    num_samples : int
        The client's number of samples.
    max_samples : int
        The cap; ``0`` for none.
    seed, client_id : int
        Run seed and client id.

    Returns
    -------
    numpy.ndarray
        Positions into the client's samples.
    """
    positions = np.arange(num_samples, dtype=np.int64)
    if max_samples == 0 or num_samples <= max_samples:
        return positions
    rng = np.random.default_rng(cap_seed(seed, client_id))
    return np.sort(rng.choice(num_samples, size=max_samples, replace=False))
