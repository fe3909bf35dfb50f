"""Dataset loading: embedded data sets, offline copies and torchvision data sets.

Two kinds of data set come out of this module:

* **Pooled** data sets (:class:`PooledDataset`): one array of samples and one of labels.
  A partitioner (:mod:`pflarena.core.partition`) divides them over the clients.
  ``digits``, ``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar100`` and ``emnist``.
* **Natively federated** data sets (:class:`NaturalDataset`): one array pair per client,
  only the ``"natural"`` partition applies. ``synthetic`` (FedProx Synthetic(α, β)),
  ``synthetic-mixture`` (the FedEM / PPFL generator of Marfoq et al. 2021) and ``har``
  (UCI HAR, one client per subject).

Samples stay compact: images are ``uint8`` arrays of shape ``(N, C, H, W)`` until
:func:`to_tensors` turns them into normalised ``float32`` tensors; tabular and sequence
data are ``float32``. Nothing here touches the network: torchvision data sets are opened
with ``download=False``.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch is imported where tensors are made, so this module loads fast
    import torch

__all__ = [
    "CIFAR10_CLASSES",
    "DATASETS",
    "EMBEDDED_DATASETS",
    "HAR_SIGNALS",
    "NATURAL_DATASETS",
    "POOLED_DATASETS",
    "DatasetError",
    "DatasetInfo",
    "NaturalDataset",
    "PooledDataset",
    "TORCHVISION_DATASETS",
    "SyntheticMixture",
    "cache_dir",
    "check_dataset_name",
    "dataset_info",
    "generate_synthetic",
    "generate_synthetic_mixture",
    "har_paths",
    "load_digits_arrays",
    "load_har",
    "load_natural",
    "load_pooled",
    "mixture_labels",
    "mixture_sample_counts",
    "read_cifar10_jpeg_tar",
    "read_mnist_npz",
    "to_tensors",
]


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
        Data set name, one of :data:`DATASETS`.
    num_classes : int
        Number of label classes; labels are ``0 .. num_classes - 1``.
    input_shape : tuple of int
        Shape of one sample, channel-first for images.
    mean, std : tuple of float or None
        Per-channel normalisation that :func:`to_tensors` applies to ``uint8`` images
        after scaling them to ``[0, 1]``.
    """

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None


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


# --------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------

EMBEDDED_DATASETS: tuple[str, ...] = ("digits", "synthetic", "synthetic-mixture")
TORCHVISION_DATASETS: tuple[str, ...] = ("mnist", "fashion-mnist", "cifar10", "cifar100", "emnist")
NATURAL_DATASETS: tuple[str, ...] = ("synthetic", "synthetic-mixture", "har")
POOLED_DATASETS: tuple[str, ...] = ("digits", *TORCHVISION_DATASETS)
DATASETS: tuple[str, ...] = (*EMBEDDED_DATASETS, *TORCHVISION_DATASETS, "har")

CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

HAR_SIGNALS: tuple[str, ...] = (
    "body_acc_x",
    "body_acc_y",
    "body_acc_z",
    "body_gyro_x",
    "body_gyro_y",
    "body_gyro_z",
    "total_acc_x",
    "total_acc_y",
    "total_acc_z",
)

#: Synthetic(α, β) of PAGE (page.md §5.1): 30 features, 30 classes.
SYNTHETIC_DIMENSION = 30
SYNTHETIC_NUM_CLASSES = 30
SYNTHETIC_MEAN_SIZE = 300.0
SYNTHETIC_SIZE_SIGMA = 0.5
SYNTHETIC_MIN_SIZE = 20

#: Marfoq et al. (2021) mixture generator defaults (ppfl.md §5.1).
MIXTURE_COMPONENTS = 3
MIXTURE_DIMENSION = 150
MIXTURE_ALPHA = 0.4
MIXTURE_NOISE_LEVEL = 0.1
MIXTURE_BOX = (-1.0, 1.0)
MIXTURE_MIN_SIZE = 50
MIXTURE_MAX_SIZE = 1000
MIXTURE_LABEL_MODES: tuple[str, ...] = ("fixed", "faithful")

_INFOS: dict[str, DatasetInfo] = {
    "digits": DatasetInfo("digits", 10, (1, 8, 8)),
    "synthetic": DatasetInfo("synthetic", SYNTHETIC_NUM_CLASSES, (SYNTHETIC_DIMENSION,)),
    "synthetic-mixture": DatasetInfo("synthetic-mixture", 2, (MIXTURE_DIMENSION,)),
    "mnist": DatasetInfo("mnist", 10, (1, 28, 28), (0.1307,), (0.3081,)),
    "fashion-mnist": DatasetInfo("fashion-mnist", 10, (1, 28, 28), (0.2860,), (0.3530,)),
    "cifar10": DatasetInfo(
        "cifar10", 10, (3, 32, 32), (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    ),
    "cifar100": DatasetInfo(
        "cifar100", 100, (3, 32, 32), (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
    ),
    # EMNIST "byclass" (62 classes, 814,255 images: the FEMNIST label set). The
    # statistics are the commonly quoted ones for EMNIST and approximate.
    "emnist": DatasetInfo("emnist", 62, (1, 28, 28), (0.1736,), (0.3317,)),
    "har": DatasetInfo("har", 6, (9, 1, 128)),
}

# torchvision class name and extra constructor arguments.
_TORCHVISION_CLASSES: dict[str, tuple[str, dict[str, str]]] = {
    "mnist": ("MNIST", {}),
    "fashion-mnist": ("FashionMNIST", {}),
    "cifar10": ("CIFAR10", {}),
    "cifar100": ("CIFAR100", {}),
    "emnist": ("EMNIST", {"split": "byclass"}),
}

# Where torchvision looks under its root, for error messages.
_TORCHVISION_LAYOUT: dict[str, str] = {
    "mnist": "MNIST/raw/",
    "fashion-mnist": "FashionMNIST/raw/",
    "cifar10": "cifar-10-batches-py/",
    "cifar100": "cifar-100-python/",
    "emnist": "EMNIST/raw/",
}

_MNIST_NPZ = Path("mnist") / "mnist-70k.npz"
_CIFAR10_TAR = Path("cifar10") / "cifar10-jpeg.tar"
_HAR_ROOT = "UCI HAR Dataset"
_HAR_URL = "https://archive.ics.uci.edu/dataset/240/human+activity+recognition+using+smartphones"


def check_dataset_name(name: str) -> None:
    """Raise :class:`DatasetError` unless ``name`` is one of :data:`DATASETS`.

    Parameters
    ----------
    name : str
        Data set name to check.
    """
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}")


def dataset_info(name: str) -> DatasetInfo:
    """Return the :class:`DatasetInfo` of a data set without loading it.

    Parameters
    ----------
    name : str
        Data set name, one of :data:`DATASETS`.

    Returns
    -------
    DatasetInfo
        Static description of the data set.
    """
    check_dataset_name(name)
    return _INFOS[name]


# --------------------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------------------


def to_tensors(
    x: np.ndarray, y: np.ndarray, info: DatasetInfo
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn stored arrays into model-ready tensors.

    Parameters
    ----------
    x : numpy.ndarray
        Samples. ``uint8`` images ``(N, C, H, W)`` are scaled to ``[0, 1]`` and then,
        when ``info.mean`` and ``info.std`` are set, normalised per channel as
        ``(x - mean) / std``. Float inputs are returned unchanged (as ``float32``).
    y : numpy.ndarray
        Labels.
    info : DatasetInfo
        Normalisation statistics.

    Returns
    -------
    features : torch.Tensor
        ``float32`` tensor of the same shape as ``x``.
    labels : torch.Tensor
        ``int64`` tensor of shape ``(N,)``.
    """
    import torch

    if x.dtype == np.uint8:
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


# --------------------------------------------------------------------------------------
# Pooled data sets
# --------------------------------------------------------------------------------------


def load_pooled(name: str, data_dir: str | Path = "") -> PooledDataset:
    """Load a pooled data set (train and test concatenated, train first).

    Parameters
    ----------
    name : str
        One of :data:`POOLED_DATASETS`.
    data_dir : str or pathlib.Path
        Folder with the torchvision files or the offline copies; ``""`` means not given
        (only ``digits`` works without it).

    Returns
    -------
    PooledDataset
        All samples of the data set.

    Raises
    ------
    DatasetError
        Unknown or natively federated name, or the files are not found.
    """
    check_dataset_name(name)
    if name not in POOLED_DATASETS:
        raise DatasetError(
            f"dataset {name!r} is natively federated and has no pooled form; "
            f"pooled datasets: {', '.join(POOLED_DATASETS)}"
        )
    if name == "digits":
        x, y = load_digits_arrays()
    else:
        x, y = _load_image_pool(name, str(data_dir))
    return PooledDataset(x=x, y=y, info=_INFOS[name])


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


def _load_image_pool(name: str, data_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """Load a torchvision data set, falling back to the offline copies for MNIST/CIFAR-10."""
    if not data_dir:
        raise DatasetError(
            f"dataset {name!r} needs data_dir (data-dir): a folder with the torchvision "
            f"files ({_TORCHVISION_LAYOUT[name]}){_offline_hint(name)}. Nothing is "
            "downloaded; fetch the files on a machine with network, e.g. "
            f"torchvision.datasets.{_TORCHVISION_CLASSES[name][0]}(root, download=True)."
        )
    root = Path(data_dir)
    tried: list[str] = []
    arrays = _read_torchvision(name, root)
    if arrays is not None:
        return arrays
    tried.append(f"{root / _TORCHVISION_LAYOUT[name]} (torchvision layout)")
    if name == "mnist":
        path = root / _MNIST_NPZ
        if path.is_file():
            return read_mnist_npz(path)
        tried.append(f"{path} (offline npz)")
    if name == "cifar10":
        path = root / _CIFAR10_TAR
        if path.is_file():
            return read_cifar10_jpeg_tar(path)
        tried.append(f"{path} (offline JPEG tar)")
    raise DatasetError(
        f"dataset {name!r} not found; tried: {'; '.join(tried)}. Nothing is downloaded: "
        "fetch the files on a machine with network, e.g. "
        f"torchvision.datasets.{_TORCHVISION_CLASSES[name][0]}({str(root)!r}, "
        f"download=True){_offline_hint(name)}."
    )


def _offline_hint(name: str) -> str:
    if name == "mnist":
        return f", or the offline copy <data_dir>/{_MNIST_NPZ.as_posix()}"
    if name == "cifar10":
        return f", or the offline copy <data_dir>/{_CIFAR10_TAR.as_posix()}"
    return ""


def _read_torchvision(name: str, root: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """Read train+test of a torchvision data set, or ``None`` if its files are missing."""
    import torchvision.datasets as tvd

    class_name, extra = _TORCHVISION_CLASSES[name]
    dataset_class = getattr(tvd, class_name)
    try:
        parts = [
            dataset_class(str(root), train=train, download=False, **extra)
            for train in (True, False)
        ]
    except (RuntimeError, FileNotFoundError, OSError):
        return None
    xs = [_images_to_nchw(np.asarray(part.data)) for part in parts]
    ys = [np.asarray(part.targets, dtype=np.int64) for part in parts]
    return np.concatenate(xs), np.concatenate(ys)


def _images_to_nchw(images: np.ndarray) -> np.ndarray:
    """``(N, H, W)`` -> ``(N, 1, H, W)``; ``(N, H, W, C)`` -> ``(N, C, H, W)``; uint8."""
    images = np.asarray(images, dtype=np.uint8)
    if images.ndim == 3:
        return np.ascontiguousarray(images[:, None, :, :])
    if images.ndim == 4:
        return np.ascontiguousarray(images.transpose(0, 3, 1, 2))
    raise DatasetError(f"unexpected image array shape {images.shape}")


def read_mnist_npz(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read the offline MNIST copy (arrays ``x`` uint8 ``(N, 28, 28)`` and ``y``).

    Parameters
    ----------
    path : str or pathlib.Path
        Path of ``mnist-70k.npz``.

    Returns
    -------
    x : numpy.ndarray
        ``uint8`` images ``(N, 1, 28, 28)``.
    y : numpy.ndarray
        ``int64`` labels ``(N,)``.

    Raises
    ------
    DatasetError
        The file is missing, unreadable or has the wrong arrays.
    """
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            x = np.asarray(archive["x"])
            y = np.asarray(archive["y"])
    except FileNotFoundError as error:
        raise DatasetError(f"MNIST file not found: {path}") from error
    except (KeyError, ValueError, OSError, EOFError) as error:
        raise DatasetError(f"cannot read MNIST arrays 'x' and 'y' from {path}: {error}") from error
    if x.ndim != 3 or x.shape[1:] != (28, 28) or len(x) != len(y):
        raise DatasetError(
            f"{path}: expected x of shape (N, 28, 28) and y of shape (N,), got "
            f"{x.shape} and {y.shape}"
        )
    return _images_to_nchw(x), y.astype(np.int64)


def cache_dir() -> Path:
    """Folder for derived caches: ``$PFLARENA_CACHE``, default ``~/.cache/pflarena``.

    Returns
    -------
    pathlib.Path
        The cache folder (not created here).
    """
    configured = os.environ.get("PFLARENA_CACHE", "")
    return Path(configured) if configured else Path.home() / ".cache" / "pflarena"


def _file_cache_key(path: Path) -> str:
    """Key a cache entry on the file's resolved path, size and modification time."""
    stat = path.stat()
    text = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_cifar10_jpeg_tar(
    path: str | Path, cache: str | Path | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Read the offline CIFAR-10 JPEG tar, decoding it once and caching the arrays.

    The tar holds ``train/<class>/NNNN.jpg`` and ``test/<class>/NNNN.jpg`` (an optional
    leading folder is ignored). Samples are ordered train first, then test; within a
    split by class in :data:`CIFAR10_CLASSES` order, then by file name. The decoded
    ``uint8`` arrays are saved as an ``.npz`` under ``cache`` (never next to the tar).

    Parameters
    ----------
    path : str or pathlib.Path
        Path of ``cifar10-jpeg.tar``.
    cache : str or pathlib.Path, optional
        Cache folder; default :func:`cache_dir`.

    Returns
    -------
    x : numpy.ndarray
        ``uint8`` images ``(N, 3, 32, 32)``.
    y : numpy.ndarray
        ``int64`` labels ``(N,)``.

    Raises
    ------
    DatasetError
        The tar is missing, unreadable, or holds an unexpected entry.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"CIFAR-10 tar not found: {path}")
    cache_path = Path(cache) if cache is not None else cache_dir()
    cached = cache_path / f"cifar10-jpeg-{_file_cache_key(path)}.npz"
    if cached.is_file():
        try:
            with np.load(cached, allow_pickle=False) as archive:
                return np.asarray(archive["x"]), np.asarray(archive["y"])
        except (KeyError, ValueError, OSError, EOFError):
            pass  # a damaged cache entry is rebuilt below
    x, y = _decode_cifar10_tar(path)
    cache_path.mkdir(parents=True, exist_ok=True)
    _atomic_savez(cached, x=x, y=y)
    return x, y


def _decode_cifar10_tar(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Decode every JPEG of the CIFAR-10 tar with Pillow, in canonical order."""
    from PIL import Image

    split_rank = {"train": 0, "test": 1}
    class_index = {name: index for index, name in enumerate(CIFAR10_CLASSES)}
    keyed: list[tuple[int, int, str, np.ndarray]] = []
    try:
        with tarfile.open(path) as archive:
            for member in archive:
                if not member.isfile():
                    continue
                parts = Path(member.name).parts
                if len(parts) < 3 or parts[-3] not in split_rank:
                    raise DatasetError(
                        f"{path}: unexpected entry {member.name!r}; expected "
                        "train/<class>/NNNN.jpg or test/<class>/NNNN.jpg"
                    )
                split, label, file_name = parts[-3:]
                if label not in class_index:
                    raise DatasetError(
                        f"{path}: unknown class folder {label!r} in {member.name!r}; "
                        f"expected one of {', '.join(CIFAR10_CLASSES)}"
                    )
                handle = archive.extractfile(member)
                assert handle is not None
                with Image.open(io.BytesIO(handle.read())) as image:
                    pixels = np.asarray(image.convert("RGB"), dtype=np.uint8)
                if pixels.shape != (32, 32, 3):
                    raise DatasetError(
                        f"{path}: {member.name!r} is {pixels.shape}, expected 32x32 RGB"
                    )
                keyed.append((split_rank[split], class_index[label], file_name, pixels))
    except (tarfile.TarError, OSError) as error:
        raise DatasetError(f"cannot read CIFAR-10 tar {path}: {error}") from error
    if not keyed:
        raise DatasetError(f"{path}: no images found")
    keyed.sort(key=lambda entry: entry[:3])
    x = np.stack([entry[3] for entry in keyed]).transpose(0, 3, 1, 2)
    y = np.array([entry[1] for entry in keyed], dtype=np.int64)
    return np.ascontiguousarray(x), y


def atomic_write(path: Path, write: Any) -> None:
    """Call ``write(stream)`` on a temporary file next to ``path``, then rename it.

    A crash leaves either the old file or the complete new one, never a torn file.
    """
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _atomic_savez(path: Path, **arrays: np.ndarray) -> None:
    """Write an uncompressed ``.npz`` atomically."""
    atomic_write(path, lambda stream: np.savez(stream, **arrays))


# --------------------------------------------------------------------------------------
# UCI HAR
# --------------------------------------------------------------------------------------


def har_paths(data_dir: str | Path, split: str) -> list[Path]:
    """Files of one UCI HAR split: the 9 inertial signals, then labels and subjects.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        Folder that contains ``UCI HAR Dataset/``.
    split : {"train", "test"}
        Which split.

    Returns
    -------
    list of pathlib.Path
        11 paths.
    """
    base = Path(data_dir) / _HAR_ROOT / split
    signals = [base / "Inertial Signals" / f"{signal}_{split}.txt" for signal in HAR_SIGNALS]
    return [*signals, base / f"y_{split}.txt", base / f"subject_{split}.txt"]


def _read_har_split(data_dir: str | Path, split: str) -> tuple[np.ndarray, ...]:
    """Read one split: ``x`` ``(N, 9, 1, 128)`` float32, labels 0..5, subjects."""
    paths = har_paths(data_dir, split)
    signals = [np.loadtxt(path, dtype=np.float32, ndmin=2) for path in paths[:9]]
    labels = np.loadtxt(paths[9], dtype=np.int64, ndmin=1)
    subjects = np.loadtxt(paths[10], dtype=np.int64, ndmin=1)
    lengths = {len(signal) for signal in signals} | {len(labels), len(subjects)}
    widths = {signal.shape[1] for signal in signals}
    if len(lengths) != 1 or widths != {128}:
        raise DatasetError(
            f"UCI HAR {split} files under {Path(data_dir) / _HAR_ROOT} disagree: expected "
            "the same number of rows everywhere and 128 values per signal row"
        )
    if labels.min() < 1 or labels.max() > 6:
        raise DatasetError(f"{paths[9]}: labels must be 1..6")
    x = np.stack(signals, axis=1)[:, :, None, :]
    return np.ascontiguousarray(x), labels - 1, subjects


def load_har(data_dir: str | Path) -> NaturalDataset:
    """Load UCI HAR as one client per subject (30 subjects in the real data).

    Train and test are concatenated (train first) and grouped by subject; clients are in
    increasing subject order, so for the real data ``client_id == subject - 1``. Samples
    are the 9 raw inertial signals (body_acc xyz, body_gyro xyz, total_acc xyz) of 128
    steps, shaped ``(9, 1, 128)`` as in PFLlib.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        Folder that contains ``UCI HAR Dataset/``.

    Returns
    -------
    NaturalDataset
        One ``(x, y)`` per subject.

    Raises
    ------
    DatasetError
        Files are missing or inconsistent.
    """
    if not str(data_dir):
        raise DatasetError(
            f"dataset 'har' needs data_dir: a folder that contains '{_HAR_ROOT}/' "
            f"(download and unzip it from {_HAR_URL})"
        )
    expected = har_paths(data_dir, "train") + har_paths(data_dir, "test")
    missing = [str(path) for path in expected if not path.is_file()]
    if missing:
        raise DatasetError(
            f"UCI HAR files not found under {Path(data_dir) / _HAR_ROOT}; missing: "
            f"{'; '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} "
            f"({len(missing)} of {len(expected)}). Download 'UCI HAR Dataset.zip' from "
            f"{_HAR_URL} and unzip it into {data_dir}."
        )
    try:
        splits = [_read_har_split(data_dir, split) for split in ("train", "test")]
    except ValueError as error:
        if isinstance(error, DatasetError):
            raise
        raise DatasetError(f"cannot parse UCI HAR files under {data_dir}: {error}") from error
    x = np.concatenate([split[0] for split in splits])
    y = np.concatenate([split[1] for split in splits])
    subjects = np.concatenate([split[2] for split in splits])
    clients = [(x[subjects == subject], y[subjects == subject]) for subject in np.unique(subjects)]
    return NaturalDataset(clients=clients, info=_INFOS["har"])


# --------------------------------------------------------------------------------------
# FedProx Synthetic(alpha, beta)
# --------------------------------------------------------------------------------------


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
) -> NaturalDataset:
    """FedProx Synthetic(α, β) with PAGE's sizes (page.md §5.1).

    Per client k, following FedProx's ``generate_synthetic`` (``α`` and ``β`` are used as
    standard deviations there, as here):

    * ``u_k ~ N(0, α²)``, ``B_k ~ N(0, β²)``;
    * ``W_k ∈ R^{d×C}`` with entries ``~ N(u_k, 1)``, ``b_k ∈ R^C`` with entries
      ``~ N(u_k, 1)``;
    * ``v_k ∈ R^d`` with entries ``~ N(B_k, 1)``;
    * ``x ~ N(v_k, Σ)``, ``Σ = diag(j^{-1.2})``, and ``y = argmax(W_kᵀ x + b_k)``.

    Sizes are lognormal with mean 300 (σ = 0.5, at least 20), see :func:`synthetic_sizes`.

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

    Returns
    -------
    NaturalDataset
        ``float32`` features ``(n_k, dimension)`` and ``int64`` labels per client.
    """
    rng = np.random.default_rng(seed)
    sizes = synthetic_sizes(num_clients, rng)
    model_means = rng.normal(0.0, alpha, num_clients)
    feature_means = rng.normal(0.0, beta, num_clients)
    feature_scale = np.power(np.arange(1, dimension + 1, dtype=np.float64), -1.2 / 2.0)
    clients = []
    for client in range(num_clients):
        center = rng.normal(feature_means[client], 1.0, dimension)
        weights = rng.normal(model_means[client], 1.0, (dimension, num_classes))
        bias = rng.normal(model_means[client], 1.0, num_classes)
        x = center + rng.standard_normal((int(sizes[client]), dimension)) * feature_scale
        y = np.argmax(x @ weights + bias, axis=1).astype(np.int64)
        clients.append((x.astype(np.float32), y))
    info = DatasetInfo("synthetic", num_classes, (dimension,))
    return NaturalDataset(clients=clients, info=info)


# --------------------------------------------------------------------------------------
# FedEM / PPFL synthetic mixture (Marfoq et al. 2021)
# --------------------------------------------------------------------------------------


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


def load_natural(
    name: str,
    num_clients: int,
    seed: int = 0,
    data_dir: str | Path = "",
    synthetic_alpha: float = 0.5,
    synthetic_beta: float = 0.5,
    mixture_label_mode: str = "fixed",
) -> NaturalDataset:
    """Load or generate a natively federated data set.

    Parameters
    ----------
    name : str
        One of :data:`NATURAL_DATASETS`.
    num_clients : int
        Number of clients; for ``har`` it must equal the number of subjects (30).
    seed : int
        Generator seed (synthetic data sets).
    data_dir : str or pathlib.Path
        Folder for ``har``.
    synthetic_alpha, synthetic_beta : float
        Synthetic(α, β) parameters.
    mixture_label_mode : {"fixed", "faithful"}
        See :func:`mixture_labels`.

    Returns
    -------
    NaturalDataset
        One ``(x, y)`` per client.
    """
    check_dataset_name(name)
    if name not in NATURAL_DATASETS:
        raise DatasetError(
            f"dataset {name!r} is pooled; natively federated datasets: "
            f"{', '.join(NATURAL_DATASETS)}"
        )
    if name == "synthetic":
        return generate_synthetic(num_clients, synthetic_alpha, synthetic_beta, seed)
    if name == "synthetic-mixture":
        mixture = generate_synthetic_mixture(num_clients, seed, mixture_label_mode)
        return NaturalDataset(clients=mixture.clients, info=_INFOS["synthetic-mixture"])
    dataset = load_har(data_dir)
    if len(dataset.clients) != num_clients:
        raise DatasetError(
            f"dataset 'har' has one client per subject: {len(dataset.clients)} subjects "
            f"found, but num_clients={num_clients} (the real UCI HAR has 30)"
        )
    return dataset
