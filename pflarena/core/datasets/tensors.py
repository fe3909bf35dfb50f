"""From stored arrays to model-ready tensors."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pflarena.core.datasets.base import DatasetInfo

if TYPE_CHECKING:  # torch is imported where tensors are made, so this module loads fast
    import torch

__all__ = ["to_tensors"]


def to_tensors(
    x: np.ndarray, y: np.ndarray, info: DatasetInfo
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn stored arrays into model-ready tensors.

    Parameters
    ----------
    x : numpy.ndarray
        Samples. Token ids (``info.vocabulary_size > 0``) become ``int64``, unchanged.
        Otherwise ``uint8`` images ``(N, C, H, W)`` are scaled to ``[0, 1]`` and then,
        when ``info.mean`` and ``info.std`` are set, normalised per channel as
        ``(x - mean) / std``; float inputs are returned unchanged (as ``float32``).
    y : numpy.ndarray
        Labels.
    info : DatasetInfo
        Normalisation statistics.

    Returns
    -------
    features : torch.Tensor
        ``float32`` tensor (``int64`` for token ids) of the same shape as ``x``.
    labels : torch.Tensor
        ``int64`` tensor of shape ``(N,)``.
    """
    import torch

    if info.tokens:
        features = torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64))
    elif x.dtype == np.uint8:
        features = torch.from_numpy(np.ascontiguousarray(x)).to(torch.float32).div_(255.0)
        if info.mean is not None and info.std is not None:
            shape = (1, len(info.mean)) + (1,) * (features.dim() - 2)
            mean = torch.tensor(info.mean, dtype=torch.float32).view(shape)
            std = torch.tensor(info.std, dtype=torch.float32).view(shape)
            features = features.sub_(mean).div_(std)
    else:
        features = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    labels = torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64))
    return features, labels
