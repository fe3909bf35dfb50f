"""The types every data set module shares: errors, descriptions and the two data forms."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DatasetError", "DatasetInfo", "NaturalDataset", "PooledDataset", "counted"]


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, plural unless ``count`` is 1: ``counted(1, "shard file")``
    is ``"1 shard file"``, ``counted(3, "shard file")`` is ``"3 shard files"``."""
    return f"{count} {noun if count == 1 else (plural or noun + 's')}"


class DatasetError(ValueError):
    """A data set or partition cannot be built as asked.

    Raised for an unknown data set or partition name (the message lists the allowed
    ones), files that are not in ``data_dir`` (the message names the paths tried and how
    to get the files), and impossible partitions.
    """


@dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about a data set.

    Parameters
    ----------
    name : str
        Data set name, one of :data:`~pflarena.core.datasets.DATASETS`.
    num_classes : int
        Number of label classes; labels are ``0 .. num_classes - 1``.
    input_shape : tuple of int
        Shape of one sample, channel-first for images.
    mean, std : tuple of float or None
        Per-channel normalisation that :func:`~pflarena.core.datasets.to_tensors`
        applies to ``uint8`` images after scaling them to ``[0, 1]``.
    vocabulary_size : int
        ``0`` (the default): samples are numbers (images, signals, features). Above 0:
        samples are sequences of token ids ``0 .. vocabulary_size - 1`` (stored as
        unsigned integers), which :func:`~pflarena.core.datasets.to_tensors` hands to the
        model as ``int64`` for an embedding layer (Shakespeare's characters).
    """

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    vocabulary_size: int = 0

    @property
    def tokens(self) -> bool:
        """Whether samples are token ids (``vocabulary_size > 0``)."""
        return self.vocabulary_size > 0


@dataclass(frozen=True)
class PooledDataset:
    """A data set as one pool of samples, to be divided by a partitioner.

    Parameters
    ----------
    x : numpy.ndarray
        Samples, ``(N, *info.input_shape)``.
    y : numpy.ndarray
        ``int64`` labels, ``(N,)``.
    info : DatasetInfo
        Description of the data set.
    """

    x: np.ndarray
    y: np.ndarray
    info: DatasetInfo


@dataclass(frozen=True)
class NaturalDataset:
    """A natively federated data set: one ``(x, y)`` pair per client.

    Parameters
    ----------
    clients : list of (numpy.ndarray, numpy.ndarray)
        Samples and ``int64`` labels of each client, in client-id order.
    info : DatasetInfo
        Description of the data set.
    """

    clients: list[tuple[np.ndarray, np.ndarray]]
    info: DatasetInfo
