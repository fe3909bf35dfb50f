"""A directory of shard files as a federation: client ``i`` holds its own file.

``pflarena shards`` (:func:`~pflarena.core.federation.write_shards`) and ``pflarena shards
import`` (:mod:`pflarena.core.importers`) write one ``.npz`` per client plus a
``manifest.json`` naming each client's file and describing the data (its
:class:`~pflarena.core.datasets.DatasetInfo`). A deployment gives each SuperNode one file
(``--node-config data-path=...``); a simulation with ``shards-dir=DIR`` gives simulated
client ``i`` the file the manifest names for client ``i``, so the same data runs both ways
and the number of clients is the directory's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath

from pflarena.core.datasets import DatasetInfo
from pflarena.core.federation import (
    MANIFEST_NAME,
    SHARD_FORMAT,
    SHARD_FORMAT_VERSIONS,
    ClientData,
    ShardError,
    load_shard,
)

__all__ = ["ShardSet", "load_shard_client", "read_shard_set"]


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
                f"client {client_id} out of range: {self.directory} holds {self.num_clients} shards"
            )
        return self.directory / self.files[client_id]


def read_shard_set(directory: str | Path) -> ShardSet:
    """Read and check a shard directory's ``manifest.json``.

    Raises
    ------
    ShardError
        No manifest, one that is not JSON or not a shard manifest, or one whose clients
        are not numbered ``0 .. n-1`` or whose files are missing; the message names the path.
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
        raise ShardError(
            f"no {MANIFEST_NAME} in {path.parent}: not a shard directory (write one with "
            "`pflarena shards` or `pflarena shards import`)"
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
