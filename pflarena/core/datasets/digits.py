"""``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 samples, 10 classes)."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

from pflarena.core.datasets.base import DatasetError, DatasetInfo
from pflarena.core.datasets.registry import DatasetSpec, register_dataset

__all__ = ["DIGITS_INFO", "digits_file", "load_digits_arrays"]

DIGITS_INFO = DatasetInfo("digits", 10, (1, 8, 8))


#: The file scikit-learn's ``load_digits`` reads, inside the installed ``sklearn`` package.
DIGITS_FILE = ("datasets", "data", "digits.csv.gz")


def digits_file() -> Path:
    """scikit-learn's ``digits.csv.gz``, found without importing scikit-learn (whose import
    takes about a second: pandas, scipy)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("digits: scikit-learn is not installed (it ships the digits data)")
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*DIGITS_FILE)


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Load scikit-learn's bundled 8x8 digits (1,797 samples).

    Reads scikit-learn's data file as its ``load_digits`` does (``np.loadtxt`` of the
    gzipped CSV: 64 grey levels, then the label), the same arrays without its import.

    Returns
    -------
    x : numpy.ndarray
        ``float32`` images ``(1797, 1, 8, 8)`` scaled from the 17 grey levels to ``[0, 1]``.
    y : numpy.ndarray
        ``int64`` labels ``(1797,)``.
    """
    with gzip.open(digits_file(), mode="rt", encoding="utf-8") as text:
        data = np.loadtxt(text, delimiter=",")
    images = data[:, :-1].reshape(-1, 8, 8)
    x = (np.asarray(images, dtype=np.float32) / 16.0)[:, None, :, :]
    return np.ascontiguousarray(x), np.asarray(data[:, -1].astype(int), dtype=np.int64)


register_dataset(
    DatasetSpec(
        name="digits",
        info=DIGITS_INFO,
        kind="pooled",
        loader=load_digits_arrays,
        embedded=True,
        default_model="mlp",
    )
)
