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
    "TorchvisionResource",
    "TorchvisionSource",
    "check_torchvision_files",
    "load_torchvision_pool",
    "torchvision_resources",
    "torchvision_source",
    "unpack_torchvision",
]


@dataclass(frozen=True)
class TorchvisionSource:
    """Where the files of a torchvision data set are, and how to read them.

    Parameters
    ----------
    class_name : str
        Class in ``torchvision.datasets``.
    layout : str
        The folder torchvision reads under its root (``MNIST/raw/``).
    files : tuple of str
        The files torchvision reads in that folder (the unpacked ones): the folder counts
        as there only when it holds all of them.
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
    files: tuple[str, ...] = ()
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
            f"downloaded here: {_fetch_hint(name, 'DIR')}"
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
        f"dataset {name!r} not found; tried: {'; '.join(tried)}. Nothing is downloaded "
        f"here: {_fetch_hint(name, root)}"
    )


def _fetch_hint(name: str, data_dir: str | Path) -> str:
    """How to get data set ``name``'s files into ``data_dir``, for error messages."""
    return (
        f"`pflarena data fetch {name} --data-dir {data_dir}` downloads them (without "
        "network: add `--from PATH`, a copy of the files torchvision downloads)."
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


@dataclass(frozen=True)
class TorchvisionResource:
    """One file torchvision downloads for a data set, as its class declares it.

    Parameters
    ----------
    urls : tuple of str
        Where it is: the first URL, then its mirrors.
    filename : str
        Its name.
    md5 : str
        Its MD5, torchvision's.
    folder : str
        Where torchvision looks for it under its root (``""``: the root itself).
    """

    urls: tuple[str, ...]
    filename: str
    md5: str
    folder: str = ""


def torchvision_source(name: str) -> TorchvisionSource:
    """Where the files of torchvision data set ``name`` are.

    Raises
    ------
    DatasetError
        Not a torchvision data set.
    """
    source = _SOURCES.get(name)
    if source is None:
        raise DatasetError(
            f"{name!r} is not a torchvision data set; those are {', '.join(_SOURCES)}"
        )
    return source


def torchvision_resources(name: str) -> list[TorchvisionResource]:
    """The files torchvision's ``download=True`` fetches for data set ``name`` (its URLs,
    mirrors and MD5s, read from its class), in the folders where it looks for them: with
    those files in place, ``download=True`` checks their MD5 and unpacks them without
    touching the network (:func:`unpack_torchvision`)."""
    import torchvision.datasets as tvd

    source = torchvision_source(name)
    cls = getattr(tvd, source.class_name)
    raw = f"{source.class_name}/raw"
    if hasattr(cls, "tgz_md5"):  # CIFAR-10, CIFAR-100: one archive in the root
        return [TorchvisionResource((cls.url,), cls.filename, cls.tgz_md5)]
    if hasattr(cls, "md5") and hasattr(cls, "url"):  # EMNIST: one zip in its raw folder
        return [TorchvisionResource((cls.url,), cls.url.rsplit("/", 1)[-1], cls.md5, raw)]
    return [  # MNIST, Fashion-MNIST: four files, each from the first mirror that answers
        TorchvisionResource(
            tuple(f"{mirror}{filename}" for mirror in cls.mirrors), filename, md5, raw
        )
        for filename, md5 in cls.resources
    ]


def unpack_torchvision(name: str, data_dir: str | Path) -> None:
    """Lay out data set ``name``'s downloaded files (:func:`torchvision_resources`, already
    under ``data_dir``) where :func:`load_torchvision_pool` reads them, through
    torchvision's own ``download=True``: it checks each file's MD5 and unpacks it, and
    downloads nothing when they are there.

    Raises
    ------
    DatasetError
        Not a torchvision data set, or torchvision failed (the message says why).
    """
    import torchvision.datasets as tvd

    source = torchvision_source(name)
    dataset_class = getattr(tvd, source.class_name)
    for train in (True, False):
        try:
            dataset_class(str(data_dir), train=train, download=True, **source.extra)
        except (RuntimeError, OSError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            raise DatasetError(
                f"torchvision could not lay out {name} in {data_dir}: {first}"
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
    folder = data_dir / source.layout
    missing = [file for file in source.files if not (folder / file).is_file()]
    if folder.is_dir() and not missing:
        return
    if source.offline is not None and (data_dir / source.offline).is_file():
        return
    lacks = f": lacks {', '.join(missing)}" if folder.is_dir() else ""
    tried = [f"{folder} (torchvision layout{lacks})"]
    if source.offline is not None:
        tried.append(f"{data_dir / source.offline} ({source.offline_label})")
    raise DatasetError(
        f"dataset {name!r} not found; tried: {'; '.join(tried)}. Nothing is downloaded "
        f"here: {_fetch_hint(name, data_dir)}"
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


#: The unpacked files torchvision's MNIST and Fashion-MNIST read from their raw folder.
_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

_register(
    DatasetInfo("mnist", 10, (1, 28, 28), (0.1307,), (0.3081,)),
    TorchvisionSource(
        "MNIST",
        "MNIST/raw/",
        _MNIST_FILES,
        offline=MNIST_NPZ,
        offline_reader=read_mnist_npz,
        offline_label="offline npz",
    ),
)
_register(
    DatasetInfo("fashion-mnist", 10, (1, 28, 28), (0.2860,), (0.3530,)),
    TorchvisionSource("FashionMNIST", "FashionMNIST/raw/", _MNIST_FILES),
)
_register(
    DatasetInfo("cifar10", 10, (3, 32, 32), (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    TorchvisionSource(
        "CIFAR10",
        "cifar-10-batches-py/",
        (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"),
        offline=CIFAR10_TAR,
        offline_reader=read_cifar10_jpeg_tar,
        offline_label="offline JPEG tar",
    ),
)
_register(
    DatasetInfo("cifar100", 100, (3, 32, 32), (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    TorchvisionSource("CIFAR100", "cifar-100-python/", ("train", "test")),
)
# EMNIST "byclass" (62 classes, 814,255 images: the FEMNIST label set). The statistics
# are the commonly quoted ones for EMNIST and approximate.
_register(
    DatasetInfo("emnist", 62, (1, 28, 28), (0.1736,), (0.3317,)),
    TorchvisionSource(
        "EMNIST",
        "EMNIST/raw/",
        tuple(
            f"emnist-byclass-{split}-{kind}"
            for split in ("train", "test")
            for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")
        ),
        extra={"split": "byclass"},
    ),
)

TORCHVISION_DATASETS: tuple[str, ...] = tuple(_SOURCES)
