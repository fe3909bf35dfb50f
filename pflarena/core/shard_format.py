"""The shard file format: one ``.npz`` per client and a ``manifest.json`` per directory.

:func:`write_shards` (``pflarena shards``; ``pflarena shards import`` through
:mod:`pflarena.core.importers`) writes one ``client_NNNN.npz`` per client plus a
``manifest.json`` naming each client's file and describing the data (its
:class:`~pflarena.core.datasets.DatasetInfo`); :func:`load_shard` reads one client's file
back and raises :class:`ShardError` for anything missing or damaged. Shards hold client
data only, never the server's share.

A directory of shard files is a federation: client ``i`` holds its own file
(:func:`read_shard_set`, :func:`load_shard_client`). A deployment gives each SuperNode one
file (``--node-config data-path=...``); a simulation with ``shards-dir=DIR`` gives
simulated client ``i`` the file the manifest names for client ``i``, so the same data runs
both ways and the number of clients is the directory's.
"""

from __future__ import annotations

import contextlib
import json
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from pflarena.core.datasets import DatasetInfo, atomic_write
from pflarena.core.datasets.base import counted
from pflarena.core.federation import ClientData, Federation, FederationSpec

__all__ = [
    "MANIFEST_NAME",
    "SHARD_ARRAYS",
    "SHARD_FORMAT",
    "SHARD_FORMAT_VERSION",
    "SHARD_FORMAT_VERSIONS",
    "ShardError",
    "ShardSet",
    "check_shard_file",
    "load_shard",
    "load_shard_client",
    "read_shard_set",
    "shard_file_name",
    "shard_set_problems",
    "write_shards",
]

SHARD_FORMAT = "pflarena-shard"
#: Version written by :func:`write_shards`; 2 added the validation split, 3 the vocabulary
#: size of token data in the metadata.
SHARD_FORMAT_VERSION = 3
#: Versions :func:`load_shard` reads (a version-1 shard has no validation split; shards
#: before version 3 hold no token data).
SHARD_FORMAT_VERSIONS: tuple[int, ...] = (1, 2, 3)
SHARD_ARRAYS: tuple[str, ...] = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")
#: Arrays every shard version holds.
_V1_ARRAYS: tuple[str, ...] = ("x_train", "y_train", "x_test", "y_test")
MANIFEST_NAME = "manifest.json"
_METADATA_KEY = "metadata"
_METADATA_FIELDS: tuple[str, ...] = (
    "format",
    "version",
    "dataset",
    "num_classes",
    "input_shape",
    "mean",
    "std",
    "client_id",
)
#: Metadata fields added by a format version, absent from the versions before it.
_METADATA_FIELDS_SINCE: dict[int, tuple[str, ...]] = {3: ("vocabulary_size",)}


class ShardError(ValueError):
    """A shard file is missing, unreadable, corrupt, truncated or incomplete.

    The message names the path and what is wrong.
    """


def shard_file_name(client_id: int) -> str:
    """File name of a client's shard, e.g. ``client_0007.npz``.

    Parameters
    ----------
    client_id : int
        Client id.

    Returns
    -------
    str
        The file name.
    """
    return f"client_{client_id:04d}.npz"


def _shard_metadata(info: DatasetInfo, client_id: int) -> dict[str, Any]:
    return {
        "format": SHARD_FORMAT,
        "version": SHARD_FORMAT_VERSION,
        "dataset": info.name,
        "num_classes": info.num_classes,
        "input_shape": list(info.input_shape),
        "mean": None if info.mean is None else list(info.mean),
        "std": None if info.std is None else list(info.std),
        "vocabulary_size": info.vocabulary_size,
        "client_id": client_id,
    }


def write_shards(
    federation: Federation,
    out_dir: str | Path,
    spec: FederationSpec | None = None,
    source: str = "pflarena",
    details: dict[str, Any] | None = None,
) -> list[Path]:
    """Write one shard file per client and a ``manifest.json``.

    Each ``client_NNNN.npz`` holds the :data:`SHARD_ARRAYS` (``x_train``, ``y_train``,
    ``x_val``, ``y_val``, ``x_test``, ``y_test``) and a ``metadata`` array with one JSON
    string (data set name, classes, input shape, normalisation, client id, format
    version :data:`SHARD_FORMAT_VERSION`). Files are written to a temporary name and
    renamed, so a crash never leaves a half-written shard. The server's share is never
    written.

    Parameters
    ----------
    federation : Federation
        What to write.
    out_dir : str or pathlib.Path
        Output folder (created if needed).
    spec : FederationSpec, optional
        Recorded in the manifest when given.
    source : str
        Where the data comes from, recorded in the manifest (``pflarena``, or the toolkit
        an import read, :mod:`pflarena.core.importers`).
    details : dict, optional
        What an import decided (JSON values), recorded as the manifest's ``import`` entry.

    Returns
    -------
    list of pathlib.Path
        The shard files, in client order (the manifest is ``out_dir / "manifest.json"``).
    """
    out_path = Path(out_dir)
    out_path.mkdir(parents=True, exist_ok=True)
    paths = []
    for client in federation.clients:
        path = out_path / shard_file_name(client.client_id)
        metadata = json.dumps(_shard_metadata(federation.info, client.client_id))
        arrays = {name: np.asarray(getattr(client, name)) for name in SHARD_ARRAYS}
        arrays[_METADATA_KEY] = np.array([metadata])
        atomic_write(path, lambda stream, arrays=arrays: np.savez(stream, **arrays))
        paths.append(path)
    manifest = {
        "format": SHARD_FORMAT,
        "version": SHARD_FORMAT_VERSION,
        "dataset": federation.info.name,
        "num_clients": len(federation.clients),
        "info": asdict(federation.info),
        "spec": None if spec is None else spec.model_dump(),
        "source": source,
        **({"import": details} if details is not None else {}),
        "shards": [
            {
                "client_id": client.client_id,
                "file": path.name,
                "num_train": len(client.y_train),
                "num_val": len(client.y_val),
                "num_test": len(client.y_test),
            }
            for client, path in zip(federation.clients, paths, strict=True)
        ],
    }
    text = json.dumps(manifest, indent=2).encode()
    atomic_write(out_path / MANIFEST_NAME, lambda stream: stream.write(text))
    return paths


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Read shard file ``path`` in this block: any sign of damage (a zip, deflate, NumPy or
    file system error) becomes a :class:`ShardError` naming the file."""
    try:
        yield
    except ShardError:
        raise
    except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError, KeyError) as error:
        raise ShardError(
            f"shard file {path} is unreadable, corrupt or truncated: "
            f"{type(error).__name__}: {error}"
        ) from error


def _read_shard_arrays(path: Path) -> dict[str, np.ndarray]:
    """Read every array of a shard file, raising :class:`ShardError` on any damage.

    The arrays of every version and the metadata must be there; the validation arrays
    are read when present (their presence per version is checked by :func:`load_shard`).
    """
    if not path.exists():
        raise ShardError(f"shard file not found: {path}")
    if not path.is_file():
        raise ShardError(f"shard path is not a file: {path}")
    with _reading(path):
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ShardError(f"shard file {path} is a single .npy array, not an .npz archive")
        with archive:
            missing = [name for name in (*_V1_ARRAYS, _METADATA_KEY) if name not in archive]
            if missing:
                raise ShardError(f"shard file {path} lacks array(s): {', '.join(missing)}")
            names = [name for name in (*SHARD_ARRAYS, _METADATA_KEY) if name in archive]
            return {name: np.asarray(archive[name]) for name in names}


def _parse_metadata(path: Path, raw: np.ndarray) -> dict[str, Any]:
    """Decode and check the JSON metadata of a shard."""
    try:
        metadata = json.loads(str(raw.reshape(-1)[0]))
    except (IndexError, ValueError) as error:
        raise ShardError(f"shard file {path} has unreadable metadata: {error}") from error
    if not isinstance(metadata, dict):
        raise ShardError(f"shard file {path} has metadata that is not a JSON object")
    missing = [field for field in _METADATA_FIELDS if field not in metadata]
    if missing:
        raise ShardError(f"shard file {path} metadata lacks: {', '.join(missing)}")
    if metadata["format"] != SHARD_FORMAT or metadata["version"] not in SHARD_FORMAT_VERSIONS:
        raise ShardError(
            f"shard file {path} has format {metadata['format']!r} version "
            f"{metadata['version']!r}; this version reads {SHARD_FORMAT!r} versions "
            f"{', '.join(map(str, SHARD_FORMAT_VERSIONS))}"
        )
    for version, fields in _METADATA_FIELDS_SINCE.items():
        missing = [
            field for field in fields if metadata["version"] >= version and field not in metadata
        ]
        if missing:
            raise ShardError(f"shard file {path} metadata lacks: {', '.join(missing)}")
    if not isinstance(metadata["dataset"], str) or not metadata["dataset"]:
        # any name: the metadata describes the data (imported shards name data sets of their own)
        raise ShardError(f"shard file {path} names no dataset")
    return metadata


def _check_shard_shapes(path: Path, arrays: dict[str, np.ndarray], info: DatasetInfo) -> None:
    for split in ("train", "val", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if y.ndim != 1 or len(x) != len(y):
            raise ShardError(
                f"shard file {path}: x_{split} has {len(x)} rows but y_{split} has shape {y.shape}"
            )
        if tuple(x.shape[1:]) != info.input_shape:
            raise ShardError(
                f"shard file {path}: x_{split} samples have shape {tuple(x.shape[1:])}, "
                f"metadata says {info.input_shape}"
            )


def _check_shard_values(path: Path, arrays: dict[str, np.ndarray], info: DatasetInfo) -> None:
    """Labels whole numbers in ``0 .. num_classes - 1``; inputs finite, and token ids in
    ``0 .. vocabulary_size - 1`` for token data. A shard that breaks these would fail every
    round it trains in (or train on truncated labels) instead of failing here."""
    for split in ("train", "val", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if y.size:
            if y.dtype.kind not in "iuf" or (
                y.dtype.kind == "f" and not (np.isfinite(y).all() and (y == np.round(y)).all())
            ):
                raise ShardError(
                    f"shard file {path}: y_{split} holds labels that are not whole numbers "
                    f"(dtype {y.dtype})"
                )
            if y.min() < 0 or y.max() >= info.num_classes:
                raise ShardError(
                    f"shard file {path}: y_{split} holds labels {y.min():g}..{y.max():g}, "
                    f"outside 0..{info.num_classes - 1} ({info.num_classes} classes)"
                )
        if not x.size:
            continue
        if x.dtype.kind not in "biuf":
            raise ShardError(f"shard file {path}: x_{split} has dtype {x.dtype}, not numbers")
        if x.dtype.kind == "f" and not np.isfinite(x).all():
            raise ShardError(f"shard file {path}: x_{split} holds NaN or infinite values")
        if info.vocabulary_size and (x.min() < 0 or x.max() >= info.vocabulary_size):
            raise ShardError(
                f"shard file {path}: x_{split} holds token ids {x.min():g}..{x.max():g}, "
                f"outside 0..{info.vocabulary_size - 1}"
            )


def load_shard(path: str | Path) -> tuple[ClientData, DatasetInfo]:
    """Read one client's shard file written by :func:`write_shards`.

    Reads every version in :data:`SHARD_FORMAT_VERSIONS`; a version-1 shard has no
    validation split and loads with empty validation arrays.

    Parameters
    ----------
    path : str or pathlib.Path
        Path of a ``client_NNNN.npz`` file.

    Returns
    -------
    client : ClientData
        The client's arrays.
    info : DatasetInfo
        Description of the data set.

    Raises
    ------
    ShardError
        The file is missing, not a shard, corrupt or truncated, lacks arrays or metadata,
        or holds labels that are not whole numbers of its classes or inputs that are not
        finite; the message names the path.
    """
    shard_path = Path(path)
    arrays = _read_shard_arrays(shard_path)
    metadata = _parse_metadata(shard_path, arrays[_METADATA_KEY])
    try:
        info = DatasetInfo(
            name=str(metadata["dataset"]),
            num_classes=int(metadata["num_classes"]),
            input_shape=tuple(int(size) for size in metadata["input_shape"]),
            mean=None if metadata["mean"] is None else tuple(map(float, metadata["mean"])),
            std=None if metadata["std"] is None else tuple(map(float, metadata["std"])),
            vocabulary_size=int(metadata.get("vocabulary_size", 0)),
        )
        client_id = int(metadata["client_id"])
    except (TypeError, ValueError) as error:
        raise ShardError(f"shard file {shard_path} has malformed metadata: {error}") from error
    if metadata["version"] == 1:
        arrays["x_val"] = arrays["x_train"][:0]
        arrays["y_val"] = np.zeros(0, dtype=np.int64)
    else:
        missing = [name for name in SHARD_ARRAYS if name not in arrays]
        if missing:
            raise ShardError(f"shard file {shard_path} lacks array(s): {', '.join(missing)}")
    _check_shard_shapes(shard_path, arrays, info)
    _check_shard_values(shard_path, arrays, info)
    client = ClientData(
        client_id=client_id,
        x_train=arrays["x_train"],
        y_train=arrays["y_train"].astype(np.int64, copy=False),
        x_test=arrays["x_test"],
        y_test=arrays["y_test"].astype(np.int64, copy=False),
        x_val=arrays["x_val"],
        y_val=arrays["y_val"].astype(np.int64, copy=False),
    )
    return client, info


@dataclass(frozen=True)
class ShardSet:
    """What a shard directory's manifest says.

    Parameters
    ----------
    directory : pathlib.Path
        The directory (absolute).
    info : DatasetInfo
        The data every shard holds.
    files : tuple of str
        ``files[i]``: the file name of client ``i``'s shard.
    num_train, num_val, num_test : tuple of int
        Samples per client and split.
    source : str
        Where the shards come from (``pflarena``, ``pfllib``, ``leaf``).
    """

    directory: Path
    info: DatasetInfo
    files: tuple[str, ...]
    num_train: tuple[int, ...]
    num_val: tuple[int, ...]
    num_test: tuple[int, ...]
    source: str

    @property
    def num_clients(self) -> int:
        """Number of clients (one shard each)."""
        return len(self.files)

    def path(self, client_id: int) -> Path:
        """Client ``client_id``'s shard file."""
        if not 0 <= client_id < self.num_clients:
            raise ShardError(
                f"client {client_id} out of range: {self.directory} holds "
                f"{counted(self.num_clients, 'shard')}"
            )
        return self.directory / self.files[client_id]


def read_shard_set(directory: str | Path) -> ShardSet:
    """Read and check a shard directory's ``manifest.json``.

    Raises
    ------
    ShardError
        No such directory (said so), no manifest, one that is not JSON or not a shard
        manifest, or one whose clients are not numbered ``0 .. n-1`` or whose files are
        missing; the message names the path.
    """
    if "\x00" in str(directory):
        raise ShardError(f"{str(directory)!r} is not a path: it contains a NUL byte")
    try:
        path = Path(directory).expanduser().resolve() / MANIFEST_NAME
    except (OSError, RuntimeError) as error:  # RuntimeError: ~user of no known user
        raise ShardError(
            f"cannot resolve the shard directory {str(directory)!r}: {error}"
        ) from None
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        write = "write one with `pflarena shards --out DIR` or `pflarena shards import`"
        if not path.parent.exists():
            raise ShardError(
                f"the shard directory {path.parent} does not exist ({write})"
            ) from None
        if not path.parent.is_dir():
            raise ShardError(f"{path.parent} is a file, not a shard directory ({write})") from None
        raise ShardError(
            f"no {MANIFEST_NAME} in {path.parent}: not a shard directory ({write})"
        ) from None
    return _read_manifest(path, stamp)


def _inside(name: str) -> bool:
    """Whether a manifest's file name stays within its directory: relative, no ``..``."""
    pure = PurePosixPath(name.replace("\\", "/"))
    return bool(name) and not pure.is_absolute() and ".." not in pure.parts and ":" not in name


@lru_cache(maxsize=16)
def _read_manifest(path: Path, stamp: int) -> ShardSet:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ShardError(f"{path} is not readable JSON: {error}") from error
    if not isinstance(manifest, dict) or manifest.get("format") != SHARD_FORMAT:
        raise ShardError(f"{path} is not a {SHARD_FORMAT!r} manifest")
    if manifest.get("version") not in SHARD_FORMAT_VERSIONS:
        raise ShardError(
            f"{path} has version {manifest.get('version')!r}; this version reads "
            f"{', '.join(map(str, SHARD_FORMAT_VERSIONS))}"
        )
    try:
        raw = manifest["info"]
        info = DatasetInfo(
            name=str(raw["name"]),
            num_classes=int(raw["num_classes"]),
            input_shape=tuple(int(size) for size in raw["input_shape"]),
            mean=None if raw.get("mean") is None else tuple(map(float, raw["mean"])),
            std=None if raw.get("std") is None else tuple(map(float, raw["std"])),
            vocabulary_size=int(raw.get("vocabulary_size", 0)),
        )
        shards = sorted(manifest["shards"], key=lambda entry: int(entry["client_id"]))
        ids = [int(entry["client_id"]) for entry in shards]
        files = tuple(str(entry["file"]) for entry in shards)
        counts = {
            split: tuple(int(entry[f"num_{split}"]) for entry in shards)
            for split in ("train", "val", "test")
        }
    except (KeyError, TypeError, ValueError) as error:
        raise ShardError(f"{path} lacks or garbles an entry: {error!r}") from error
    if ids != list(range(len(ids))) or not ids:
        raise ShardError(f"{path}: clients must be numbered 0..n-1, found {ids}")
    if any(count < 0 for split in counts.values() for count in split):
        raise ShardError(f"{path} gives a client a negative number of samples")
    outside = [name for name in files if not _inside(name)]
    if outside:
        raise ShardError(
            f"{path} names shard files outside its directory: {outside} (a manifest names "
            "files relative to its directory, without '..')"
        )
    missing = [name for name in files if not (path.parent / name).is_file()]
    if missing:
        raise ShardError(f"{path.parent} lacks the shard file(s) its manifest names: {missing}")
    return ShardSet(
        directory=path.parent,
        info=info,
        files=files,
        num_train=counts["train"],
        num_val=counts["val"],
        num_test=counts["test"],
        source=str(manifest.get("source", "pflarena")),
    )


def load_shard_client(directory: str | Path, client_id: int) -> tuple[ClientData, DatasetInfo]:
    """Client ``client_id``'s data from a shard directory, checked against the manifest."""
    shard_set = read_shard_set(directory)
    path = shard_set.path(client_id)
    client, info = load_shard(path)
    if client.client_id != client_id:
        raise ShardError(
            f"{path} holds client {client.client_id}, but the manifest names it for client "
            f"{client_id}"
        )
    if (info.num_classes, info.input_shape) != (
        shard_set.info.num_classes,
        shard_set.info.input_shape,
    ):
        raise ShardError(
            f"{path} holds {info.num_classes} classes of shape {info.input_shape}; the "
            f"manifest says {shard_set.info.num_classes} of {shard_set.info.input_shape}"
        )
    counts = (len(client.y_train), len(client.y_val), len(client.y_test))
    expected = (
        shard_set.num_train[client_id],
        shard_set.num_val[client_id],
        shard_set.num_test[client_id],
    )
    if counts != expected:
        raise ShardError(
            f"{path} holds {counts[0]} train / {counts[1]} validation / {counts[2]} test "
            f"samples; the manifest says {expected[0]} / {expected[1]} / {expected[2]}"
        )
    return client, info


def _npy_header(archive: zipfile.ZipFile, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype an ``.npz`` member's ``.npy`` header gives, read without its data."""
    with archive.open(f"{name}.npy") as member:
        version = np.lib.format.read_magic(member)
        read = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        shape, _fortran_order, dtype = read(member)
    return tuple(shape), dtype


def check_shard_file(shard_set: ShardSet, client_id: int) -> None:
    """Check client ``client_id``'s shard file as far as that is cheap: the archive's
    directory and every member within the file's size, the arrays and metadata there, the
    metadata naming this client and the manifest's data, and each array's ``.npy`` header
    (its shape and dtype, not its data) agreeing with the manifest's sample counts. What
    only reading the data shows (its values: labels in range, finite inputs) is
    :func:`load_shard`'s.

    Raises
    ------
    ShardError
        Naming the path and what is wrong (a truncated file: ``BadZipFile``).
    """
    path = shard_set.path(client_id)
    with _reading(path):
        size = path.stat().st_size
        with zipfile.ZipFile(path) as archive:
            members = {info.filename: info for info in archive.infolist()}
            beyond = [
                name
                for name, info in members.items()
                if info.header_offset + info.compress_size > size
            ]
            if beyond:
                raise ShardError(
                    f"shard file {path} is truncated: {', '.join(beyond)} ends past its "
                    f"{size} bytes"
                )
            names = {name.removesuffix(".npy") for name in members}
            missing = [name for name in (*_V1_ARRAYS, _METADATA_KEY) if name not in names]
            if missing:
                raise ShardError(f"shard file {path} lacks array(s): {', '.join(missing)}")
            with archive.open(f"{_METADATA_KEY}.npy") as member:
                raw = np.lib.format.read_array(member, allow_pickle=False)
            metadata = _parse_metadata(path, raw)
            if metadata["version"] > 1:
                missing = [name for name in SHARD_ARRAYS if name not in names]
                if missing:
                    raise ShardError(f"shard file {path} lacks array(s): {', '.join(missing)}")
            headers = {name: _npy_header(archive, name) for name in SHARD_ARRAYS if name in names}
    if metadata.get("client_id") != client_id:
        raise ShardError(
            f"{path} holds client {metadata.get('client_id')!r}, but the manifest names it for "
            f"client {client_id}"
        )
    info = shard_set.info
    if (metadata.get("num_classes"), tuple(metadata.get("input_shape") or ())) != (
        info.num_classes,
        info.input_shape,
    ):
        raise ShardError(
            f"{path} holds {metadata.get('num_classes')} classes of shape "
            f"{tuple(metadata.get('input_shape') or ())}; the manifest says {info.num_classes} "
            f"of {info.input_shape}"
        )
    expected = {
        "train": shard_set.num_train[client_id],
        "val": shard_set.num_val[client_id],
        "test": shard_set.num_test[client_id],
    }
    for split, count in expected.items():
        if f"x_{split}" not in headers:  # a version-1 shard: no validation split
            if count:
                raise ShardError(
                    f"{path} holds no {split} split; the manifest says {counted(count, 'sample')}"
                )
            continue
        (x_shape, x_dtype), (y_shape, y_dtype) = headers[f"x_{split}"], headers[f"y_{split}"]
        if len(y_shape) != 1 or not x_shape or x_shape[0] != y_shape[0]:
            raise ShardError(
                f"shard file {path}: x_{split} has shape {x_shape} but y_{split} has shape "
                f"{y_shape}"
            )
        if x_shape[0] != count:
            raise ShardError(
                f"{path} holds {counted(x_shape[0], split + ' sample')}; the manifest says {count}"
            )
        if tuple(x_shape[1:]) != info.input_shape:
            raise ShardError(
                f"shard file {path}: x_{split} samples have shape {tuple(x_shape[1:])}, the "
                f"manifest says {info.input_shape}"
            )
        if y_dtype.kind not in "iuf" or x_dtype.kind not in "biuf":
            raise ShardError(
                f"shard file {path}: x_{split} has dtype {x_dtype} and y_{split} {y_dtype}, "
                "not numbers"
            )


def shard_set_problems(directory: str | Path) -> list[tuple[int, str]]:
    """Every client of a shard directory whose file :func:`check_shard_file` refuses, with
    why (client id, problem); each file is checked once while its size and time stay the
    same. Raises :class:`ShardError` for the manifest itself (:func:`read_shard_set`)."""
    shard_set = read_shard_set(directory)
    problems = []
    for client_id in range(shard_set.num_clients):
        path = shard_set.path(client_id)
        try:
            stat = path.stat()
        except OSError as error:
            problems.append((client_id, f"shard file {path} cannot be read: {error}"))
            continue
        problem = _checked(shard_set, client_id, stat.st_size, stat.st_mtime_ns)
        if problem is not None:
            problems.append((client_id, problem))
    return problems


@lru_cache(maxsize=65536)
def _checked(shard_set: ShardSet, client_id: int, size: int, mtime_ns: int) -> str | None:
    """:func:`check_shard_file`'s problem, or None, for a file of this size and time."""
    try:
        check_shard_file(shard_set, client_id)
    except ShardError as error:
        return " ".join(str(error).split())
    return None
