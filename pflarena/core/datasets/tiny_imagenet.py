"""``tiny-imagenet``: Tiny-ImageNet (200 classes of 64x64 RGB images) as one pool.

The folder ``tiny-imagenet-200`` of the official archive
(http://cs231n.stanford.edu/tiny-imagenet-200.zip) holds

* ``wnids.txt``: the 200 WordNet ids of the classes, one per line;
* ``train/<wnid>/images/*.JPEG``: 500 training images per class;
* ``val/images/*.JPEG`` and ``val/val_annotations.txt``: 10 000 validation images and
  one tab-separated line per image (file name, wnid, bounding box);
* ``test/images/*.JPEG``: unlabelled, so not used.

The pool is the training images (class by class, file names sorted) followed by the
validation images (file names sorted): 110 000 labelled images. A class's label is the
position of its wnid in sorted order (torchvision's ``ImageFolder`` convention). Grey-level
images are widened to RGB. The decoded ``uint8`` arrays are cached once under
:func:`~pflarena.core.datasets.io.cache_dir`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from pflarena.core.datasets.base import DatasetError, DatasetInfo
from pflarena.core.datasets.io import atomic_savez, cache_dir
from pflarena.core.datasets.registry import DatasetSpec, register_dataset

__all__ = [
    "TINY_IMAGENET_CLASSES",
    "TINY_IMAGENET_INFO",
    "TINY_IMAGENET_ROOT",
    "check_tiny_imagenet_files",
    "load_tiny_imagenet",
    "tiny_imagenet_files",
]

TINY_IMAGENET_ROOT = "tiny-imagenet-200"
TINY_IMAGENET_CLASSES = 200
_SIDE = 64
_URL = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"
_LAYOUT = (
    f"'{TINY_IMAGENET_ROOT}/' with wnids.txt, train/<wnid>/images/*.JPEG, val/images/*.JPEG "
    "and val/val_annotations.txt (file name and wnid, tab-separated)"
)

# Per-channel statistics commonly quoted for the Tiny-ImageNet training set; approximate.
TINY_IMAGENET_INFO = DatasetInfo(
    "tiny-imagenet",
    TINY_IMAGENET_CLASSES,
    (3, _SIDE, _SIDE),
    (0.4802, 0.4481, 0.3975),
    (0.2770, 0.2691, 0.2821),
)


def check_tiny_imagenet_files(data_dir: Path) -> None:
    """Raise :class:`DatasetError` naming the first missing path of the layout.

    Parameters
    ----------
    data_dir : pathlib.Path
        Folder that contains ``tiny-imagenet-200/``.
    """
    root = Path(data_dir) / TINY_IMAGENET_ROOT
    for path, kind in (
        (root, "folder"),
        (root / "wnids.txt", "file"),
        (root / "train", "folder"),
        (root / "val" / "images", "folder"),
        (root / "val" / "val_annotations.txt", "file"),
    ):
        present = path.is_dir() if kind == "folder" else path.is_file()
        if not present:
            raise DatasetError(
                f"Tiny-ImageNet {kind} not found: {path}; expected under {data_dir}: "
                f"{_LAYOUT}. Nothing is downloaded: unzip {_URL} into {data_dir}"
            )


def _read_wnids(root: Path) -> list[str]:
    path = root / "wnids.txt"
    wnids = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if len(wnids) != TINY_IMAGENET_CLASSES or len(set(wnids)) != len(wnids):
        raise DatasetError(
            f"{path}: expected {TINY_IMAGENET_CLASSES} distinct WordNet ids, one per line; "
            f"found {len(wnids)} lines ({len(set(wnids))} distinct)"
        )
    return sorted(wnids)


def tiny_imagenet_files(data_dir: str | Path) -> list[tuple[Path, int]]:
    """Every labelled image of the pool with its label, in pool order.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        Folder that contains ``tiny-imagenet-200/``.

    Returns
    -------
    list of (pathlib.Path, int)
        Training images class by class (file names sorted), then validation images
        (file names sorted).

    Raises
    ------
    DatasetError
        A path of the layout is missing, ``wnids.txt`` is not 200 distinct ids, a class
        has no training images, or an annotation line names an unknown class or a
        missing image; the message names the path.
    """
    check_tiny_imagenet_files(Path(data_dir))
    root = Path(data_dir) / TINY_IMAGENET_ROOT
    label = {wnid: index for index, wnid in enumerate(_read_wnids(root))}
    files: list[tuple[Path, int]] = []
    for wnid, index in label.items():
        images = sorted((root / "train" / wnid / "images").glob("*.JPEG"))
        if not images:
            raise DatasetError(
                f"no training images in {root / 'train' / wnid / 'images'} (*.JPEG); "
                f"expected {_LAYOUT}"
            )
        files.extend((path, index) for path in images)
    annotations = root / "val" / "val_annotations.txt"
    validation: list[tuple[Path, int]] = []
    for number, line in enumerate(annotations.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or fields[1] not in label:
            raise DatasetError(
                f"{annotations} line {number}: expected '<file name>\\t<wnid>\\t...' with a "
                f"wnid of wnids.txt, got {line!r}"
            )
        image = root / "val" / "images" / fields[0]
        if not image.is_file():
            raise DatasetError(f"{annotations} line {number}: image not found: {image}")
        validation.append((image, label[fields[1]]))
    if not validation:
        raise DatasetError(f"{annotations} lists no images; expected {_LAYOUT}")
    return files + sorted(validation, key=lambda entry: entry[0].name)


def _cache_key(root: Path, files: list[tuple[Path, int]]) -> str:
    """Hash of the folder's real path and every image's name, size, time and label.

    The folder is resolved once and the images named relative to it: resolving 110,000
    paths one by one would cost more than reading the cache.
    """
    digest = hashlib.sha256(f"tiny-imagenet-1|{root.resolve()}\n".encode())
    for path, label in files:
        stat = path.stat()
        name = path.relative_to(root).as_posix()
        digest.update(f"{name}|{stat.st_size}|{stat.st_mtime_ns}|{label}\n".encode())
    return digest.hexdigest()[:16]


def _decode(files: list[tuple[Path, int]]) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image, UnidentifiedImageError

    x = np.empty((len(files), 3, _SIDE, _SIDE), dtype=np.uint8)
    y = np.empty(len(files), dtype=np.int64)
    for row, (path, label) in enumerate(files):
        try:
            with Image.open(path) as image:
                pixels = np.asarray(image.convert("RGB"), dtype=np.uint8)
        except (OSError, UnidentifiedImageError) as error:
            raise DatasetError(f"cannot decode Tiny-ImageNet image {path}: {error}") from error
        if pixels.shape != (_SIDE, _SIDE, 3):
            raise DatasetError(
                f"Tiny-ImageNet image {path} is {pixels.shape[1]}x{pixels.shape[0]}, expected "
                f"{_SIDE}x{_SIDE}"
            )
        x[row] = pixels.transpose(2, 0, 1)
        y[row] = label
    return x, y


def load_tiny_imagenet(
    data_dir: str | Path, cache: str | Path | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Load Tiny-ImageNet's labelled images (train, then validation) as one pool.

    Parameters
    ----------
    data_dir : str or pathlib.Path
        Folder that contains ``tiny-imagenet-200/``.
    cache : str or pathlib.Path, optional
        Cache folder; default :func:`~pflarena.core.datasets.io.cache_dir`.

    Returns
    -------
    x : numpy.ndarray
        ``uint8`` images ``(N, 3, 64, 64)`` (110 000 for the real data).
    y : numpy.ndarray
        ``int64`` labels 0..199.

    Raises
    ------
    DatasetError
        No ``data_dir``, files missing or malformed (see :func:`tiny_imagenet_files`).
    """
    if not str(data_dir):
        raise DatasetError(
            f"dataset 'tiny-imagenet' needs data_dir: a folder holding {_LAYOUT} (unzip {_URL})"
        )
    files = tiny_imagenet_files(data_dir)
    cache_path = Path(cache) if cache is not None else cache_dir()
    cached = cache_path / f"tiny-imagenet-{_cache_key(Path(data_dir), files)}.npz"
    if cached.is_file():
        try:
            with np.load(cached, allow_pickle=False) as archive:
                return np.asarray(archive["x"]), np.asarray(archive["y"])
        except (KeyError, ValueError, OSError, EOFError):
            pass  # a damaged cache entry is rebuilt below
    x, y = _decode(files)
    cache_path.mkdir(parents=True, exist_ok=True)
    atomic_savez(cached, x=x, y=y)
    return x, y


register_dataset(
    DatasetSpec(
        name="tiny-imagenet",
        info=TINY_IMAGENET_INFO,
        kind="pooled",
        loader=load_tiny_imagenet,
        reads=("data_dir",),
        default_model="resnet18-64",
        check=check_tiny_imagenet_files,
        source=_URL,
        layout=_LAYOUT,
    )
)
