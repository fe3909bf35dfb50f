"""Image data sets read with torchvision: MNIST, Fashion-MNIST, CIFAR-10, CIFAR-100, EMNIST.

Each is one pool (train then test) of ``uint8`` images ``(N, C, H, W)``. torchvision opens
its files under ``data_dir`` with ``download=False``: nothing touches the network. When
they are missing, MNIST and CIFAR-10 fall back to their offline copies
(:mod:`pflarena.core.datasets.io`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pflarena.core.datasets.base import DatasetError, DatasetInfo
from pflarena.core.datasets.io import (
    CIFAR10_TAR,
    MNIST_NPZ,
    images_to_nchw,
    read_cifar10_jpeg_tar,
    read_mnist_npz,
)
from pflarena.core.datasets.registry import DatasetSpec, register_dataset

__all__ = [
    "TORCHVISION_DATASETS",
    "TorchvisionSource",
    "check_torchvision_files",
    "download_torchvision",
    "load_torchvision_pool",
]


@dataclass(frozen=True)
class TorchvisionSource:
    """Where the files of a torchvision data set are, and how to read them.

    Parameters
    ----------
    class_name : str
        Class in ``torchvision.datasets``.
    layout : str
        What torchvision looks for under its root, for error messages.
    extra : mapping
        Further constructor arguments (EMNIST's ``split``).
    offline : pathlib.Path, optional
        Offline copy relative to ``data_dir``, tried when the torchvision files are missing.
    offline_reader : callable, optional
        Reads the offline copy into ``(x, y)``.
    offline_label : str
        What the offline copy is, for error messages.
    """

    class_name: str
    layout: str
    extra: Mapping[str, str] = field(default_factory=dict)
    offline: Path | None = None
    offline_reader: Callable[[Path], tuple[np.ndarray, np.ndarray]] | None = None
    offline_label: str = ""

    def offline_hint(self) -> str:
        """``", or the offline copy <data_dir>/..."`` when there is one, else ``""``."""
        if self.offline is None:
            return ""
        return f", or the offline copy <data_dir>/{self.offline.as_posix()}"


_SOURCES: dict[str, TorchvisionSource] = {}


def load_torchvision_pool(
    name: str, source: TorchvisionSource, data_dir: str | Path
) -> tuple[np.ndarray, np.ndarray]:
    """Load a torchvision data set, falling back to its offline copy.

    Parameters
    ----------
    name : str
        Data set name, for messages.
    source : TorchvisionSource
        Where its files are.
    data_dir : str or pathlib.Path
        Root folder; ``""`` means not given.

    Returns
    -------
    x : numpy.ndarray
        ``uint8`` images ``(N, C, H, W)``, train then test.
    y : numpy.ndarray
        ``int64`` labels ``(N,)``.

    Raises
    ------
    DatasetError
        No ``data_dir``, or neither the torchvision files nor the offline copy are there
        (the message names every path tried).
    """
    if not str(data_dir):
        raise DatasetError(
            f"dataset {name!r} needs data_dir (data-dir): a folder with the torchvision "
            f"files ({source.layout}){source.offline_hint()}. Nothing is "
            "downloaded; fetch the files on a machine with network, e.g. "
            f"torchvision.datasets.{source.class_name}(root, download=True)."
        )
    root = Path(data_dir)
    arrays = _read_torchvision(source, root)
    if arrays is not None:
        return arrays
    tried = [f"{root / source.layout} (torchvision layout)"]
    if source.offline is not None and source.offline_reader is not None:
        path = root / source.offline
        if path.is_file():
            return source.offline_reader(path)
        tried.append(f"{path} ({source.offline_label})")
    raise DatasetError(
        f"dataset {name!r} not found; tried: {'; '.join(tried)}. Nothing is downloaded: "
        "fetch the files on a machine with network, e.g. "
        f"torchvision.datasets.{source.class_name}({str(root)!r}, "
        f"download=True){source.offline_hint()}."
    )


def _read_torchvision(
    source: TorchvisionSource, root: Path
) -> tuple[np.ndarray, np.ndarray] | None:
    """Read train+test of a torchvision data set, or ``None`` if its files are missing."""
    import torchvision.datasets as tvd

    dataset_class = getattr(tvd, source.class_name)
    try:
        parts = [
            dataset_class(str(root), train=train, download=False, **source.extra)
            for train in (True, False)
        ]
    except (RuntimeError, FileNotFoundError, OSError):
        return None
    xs = [images_to_nchw(np.asarray(part.data)) for part in parts]
    ys = [np.asarray(part.targets, dtype=np.int64) for part in parts]
    return np.concatenate(xs), np.concatenate(ys)


def download_torchvision(name: str, data_dir: str | Path) -> None:
    """Download a torchvision data set's train and test files into ``data_dir``, through
    torchvision's own ``download=True`` (it checks each file's MD5 and lays them out where
    :func:`load_torchvision_pool` reads them; its progress bar goes to stderr).

    Raises
    ------
    DatasetError
        Not a torchvision data set, or the download failed (the message says why).
    """
    import torchvision.datasets as tvd

    source = _SOURCES.get(name)
    if source is None:
        raise DatasetError(
            f"{name!r} is not a torchvision data set; those are {', '.join(_SOURCES)}"
        )
    dataset_class = getattr(tvd, source.class_name)
    for train in (True, False):
        try:
            dataset_class(str(data_dir), train=train, download=True, **source.extra)
        except (RuntimeError, OSError) as error:
            raise DatasetError(
                f"torchvision could not download {name} into {data_dir}: {error}"
            ) from None


def check_torchvision_files(name: str, source: TorchvisionSource, data_dir: Path) -> None:
    """Raise :class:`DatasetError` unless the torchvision folder or the offline copy is there.

    Parameters
    ----------
    name : str
        Data set name, for messages.
    source : TorchvisionSource
        Where its files are.
    data_dir : pathlib.Path
        Root folder.
    """
    if (data_dir / source.layout).is_dir():
        return
    if source.offline is not None and (data_dir / source.offline).is_file():
        return
    tried = [f"{data_dir / source.layout} (torchvision layout)"]
    if source.offline is not None:
        tried.append(f"{data_dir / source.offline} ({source.offline_label})")
    raise DatasetError(
        f"dataset {name!r} not found; tried: {'; '.join(tried)}. Nothing is downloaded: "
        "fetch the files on a machine with network, e.g. "
        f"torchvision.datasets.{source.class_name}({str(data_dir)!r}, "
        f"download=True){source.offline_hint()}."
    )


def _register(info: DatasetInfo, source: TorchvisionSource) -> None:
    _SOURCES[info.name] = source
    register_dataset(
        DatasetSpec(
            name=info.name,
            info=info,
            kind="pooled",
            loader=functools.partial(load_torchvision_pool, info.name, source),
            reads=("data_dir",),
            default_model="cnn",
            check=functools.partial(check_torchvision_files, info.name, source),
            source=f"torchvision.datasets.{source.class_name}(root, download=True)"
            + source.offline_hint().replace(", or", " or"),
            layout=f"the torchvision folder {source.layout}{source.offline_hint()}",
        )
    )


_register(
    DatasetInfo("mnist", 10, (1, 28, 28), (0.1307,), (0.3081,)),
    TorchvisionSource(
        "MNIST",
        "MNIST/raw/",
        offline=MNIST_NPZ,
        offline_reader=read_mnist_npz,
        offline_label="offline npz",
    ),
)
_register(
    DatasetInfo("fashion-mnist", 10, (1, 28, 28), (0.2860,), (0.3530,)),
    TorchvisionSource("FashionMNIST", "FashionMNIST/raw/"),
)
_register(
    DatasetInfo("cifar10", 10, (3, 32, 32), (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    TorchvisionSource(
        "CIFAR10",
        "cifar-10-batches-py/",
        offline=CIFAR10_TAR,
        offline_reader=read_cifar10_jpeg_tar,
        offline_label="offline JPEG tar",
    ),
)
_register(
    DatasetInfo("cifar100", 100, (3, 32, 32), (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    TorchvisionSource("CIFAR100", "cifar-100-python/"),
)
# EMNIST "byclass" (62 classes, 814,255 images: the FEMNIST label set). The statistics
# are the commonly quoted ones for EMNIST and approximate.
_register(
    DatasetInfo("emnist", 62, (1, 28, 28), (0.1736,), (0.3317,)),
    TorchvisionSource("EMNIST", "EMNIST/raw/", extra={"split": "byclass"}),
)

TORCHVISION_DATASETS: tuple[str, ...] = tuple(_SOURCES)
