"""``femnist``: LEAF's Federated EMNIST, one client per writer.

LEAF's ``data/femnist/preprocess/data_to_json.py`` turns each 128x128 NIST character image
into a 28x28 grey-level image, flattened to 784 values ``pixel / 255`` (ink dark on a
white background, as written; no inversion), and its class into 62 labels: ``0-9``
digits, ``10-35`` upper-case and ``36-61`` lower-case letters (the EMNIST ``byclass``
label set). Here the values are stored back as the ``uint8`` pixels they came from, so
:func:`~pflarena.core.datasets.to_tensors` gives the LEAF values ``pixel / 255`` again
(no further normalisation, as LEAF's CNN reads them). The LEAF format, the user filter
and the per-writer train/test split are :mod:`pflarena.core.datasets.leaf`'s.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from pflarena.core.datasets.base import DatasetError, DatasetInfo, NaturalDataset
from pflarena.core.datasets.leaf import (
    LEAF_URL,
    check_leaf_files,
    choose_clients,
    leaf_layout,
    load_leaf_users,
)
from pflarena.core.datasets.registry import DatasetSpec, register_dataset

__all__ = ["FEMNIST_CLASSES", "FEMNIST_INFO", "load_femnist"]

#: Digits, upper-case then lower-case letters: LEAF's label order.
FEMNIST_CLASSES = 62
_SIDE = 28

FEMNIST_INFO = DatasetInfo("femnist", FEMNIST_CLASSES, (1, _SIDE, _SIDE))


def _decode_user(xs: list[Any], ys: list[Any], where: str) -> tuple[np.ndarray, np.ndarray, int]:
    """One writer's images ``(n, 1, 28, 28)`` ``uint8`` and labels ``(n,)``."""
    try:
        values = np.asarray(xs, dtype=np.float64)
        labels = np.asarray(ys, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise DatasetError(
            f"{where}: 'x' must be lists of 784 numbers and 'y' integers ({error})"
        ) from error
    if values.ndim != 2 or values.shape[1] != _SIDE * _SIDE:
        raise DatasetError(
            f"{where}: each 'x' must be a flattened 28x28 image of 784 values in [0, 1], "
            f"got an array of shape {values.shape}"
        )
    if values.size and (np.nanmin(values) < 0 or np.nanmax(values) > 1 or np.isnan(values).any()):
        raise DatasetError(f"{where}: pixel values must lie in [0, 1] (LEAF's pixel / 255)")
    if labels.ndim != 1 or np.any(labels != np.round(labels)):
        raise DatasetError(f"{where}: 'y' must be integer class labels")
    if labels.size and (labels.min() < 0 or labels.max() >= FEMNIST_CLASSES):
        raise DatasetError(
            f"{where}: labels must be 0..{FEMNIST_CLASSES - 1}, found "
            f"{int(labels.min())}..{int(labels.max())}"
        )
    pixels = np.rint(values * 255.0).astype(np.uint8).reshape(-1, 1, _SIDE, _SIDE)
    return pixels, labels.astype(np.int64), 0


def load_femnist(
    data_dir: str | Path,
    num_clients: int,
    min_client_samples: int = 0,
    seed: int = 0,
    cache: str | Path | None = None,
) -> NaturalDataset:
    """Load LEAF FEMNIST as one client per writer.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        LEAF's ``data/`` folder: the files are under ``femnist/data/``.
    num_clients : int
        Writers to use as clients (all eligible writers, or a seeded sample of them); ``0`` for every eligible one.
    min_client_samples : int
        Writers with this many samples or fewer are dropped (LEAF's ``-k``; LEAF's
        FEMNIST examples use 64).
    seed : int
        Seed of the choice of writers.
    cache : str or pathlib.Path, optional
        Cache folder for the decoded arrays.

    Returns
    -------
    NaturalDataset
        One ``(x, y)`` per writer: ``uint8`` images ``(n, 1, 28, 28)`` and labels 0..61.

    Raises
    ------
    DatasetError
        Files missing or malformed, or fewer eligible writers than clients.
    """
    users = load_leaf_users(
        data_dir,
        "femnist",
        _decode_user,
        sample_shape=(1, _SIDE, _SIDE),
        sample_dtype=np.uint8,
        decoder_version="femnist-1",
        cache=cache,
    )
    return choose_clients(users, FEMNIST_INFO, num_clients, min_client_samples, seed)


register_dataset(
    DatasetSpec(
        name="femnist",
        info=FEMNIST_INFO,
        kind="natural",
        loader=load_femnist,
        reads=("data_dir", "num_clients", "min_client_samples", "seed"),
        default_model="cnn",
        check=functools.partial(check_leaf_files, "femnist"),
        source=f"LEAF ({LEAF_URL}): data/femnist/preprocess.sh, e.g. "
        "'./preprocess.sh -s niid --sf 1.0 -k 0 -t sample'",
        layout=leaf_layout("femnist"),
    )
)
