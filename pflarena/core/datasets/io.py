"""Shared file I/O: the cache folder, atomic writes and the offline copies of MNIST and CIFAR-10.

The offline copies are what a machine without network is given instead of the torchvision
files: ``<data_dir>/mnist/mnist-70k.npz`` (arrays ``x`` and ``y``) and
``<data_dir>/cifar10/cifar10-jpeg.tar`` (one JPEG per image), decoded once and cached
under :func:`cache_dir`.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from pflarena.core.datasets.base import DatasetError

__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR10_TAR",
    "MNIST_NPZ",
    "atomic_savez",
    "atomic_write",
    "cache_dir",
    "images_to_nchw",
    "read_cifar10_jpeg_tar",
    "read_mnist_npz",
]

#: Offline copies, relative to ``data_dir``.
MNIST_NPZ = Path("mnist") / "mnist-70k.npz"
CIFAR10_TAR = Path("cifar10") / "cifar10-jpeg.tar"

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


def cache_dir() -> Path:
    """Folder for derived caches: ``$PFLARENA_CACHE``, default ``~/.cache/pflarena``.

    Returns
    -------
    pathlib.Path
        The cache folder (not created here).
    """
    configured = os.environ.get("PFLARENA_CACHE", "")
    return Path(configured) if configured else Path.home() / ".cache" / "pflarena"


def _umask() -> int:
    """This process's umask (read by setting it, as the C library offers no other way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(stream)`` on a temporary file next to ``path``, then rename it.

    A crash leaves either the old file or the complete new one, never a torn file. The file
    gets the permissions a plain ``open`` would give it (``0o666`` less the umask), not the
    temporary file's ``0o600``: shards are read by ClientApps that run as other users (the
    container images' ``app`` user), results by the user who started the run.

    Parameters
    ----------
    path : pathlib.Path
        Final path; its folder must exist.
    write : callable
        Writes the content to the binary stream it is given.
    """
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fchmod(stream.fileno(), 0o666 & ~_umask())
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def atomic_savez(path: Path, **arrays: np.ndarray) -> None:
    """Write an uncompressed ``.npz`` atomically (see :func:`atomic_write`).

    Parameters
    ----------
    path : pathlib.Path
        Final path.
    **arrays : numpy.ndarray
        The arrays, by name.
    """
    atomic_write(path, lambda stream: np.savez(stream, **arrays))


def images_to_nchw(images: np.ndarray) -> np.ndarray:
    """``(N, H, W)`` -> ``(N, 1, H, W)``; ``(N, H, W, C)`` -> ``(N, C, H, W)``; uint8.

    Parameters
    ----------
    images : numpy.ndarray
        Grey-level or channel-last images.

    Returns
    -------
    numpy.ndarray
        Contiguous ``uint8`` channel-first images.
    """
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
    return images_to_nchw(x), y.astype(np.int64)


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
    atomic_savez(cached, x=x, y=y)
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
