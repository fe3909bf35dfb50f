"""``digits``: scikit-learn's bundled 8x8 handwritten digits (1,797 samples, 10 classes)."""

from __future__ import annotations

import numpy as np

from pflarena.core.datasets.base import DatasetInfo
from pflarena.core.datasets.registry import DatasetSpec, register_dataset

__all__ = ["DIGITS_INFO", "load_digits_arrays"]

DIGITS_INFO = DatasetInfo("digits", 10, (1, 8, 8))


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Load scikit-learn's bundled 8x8 digits (1,797 samples).

    Returns
    -------
    x : numpy.ndarray
        ``float32`` images ``(1797, 1, 8, 8)`` scaled from the 17 grey levels to ``[0, 1]``.
    y : numpy.ndarray
        ``int64`` labels ``(1797,)``.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float32) / 16.0)[:, None, :, :]
    return np.ascontiguousarray(x), np.asarray(bunch.target, dtype=np.int64)


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
