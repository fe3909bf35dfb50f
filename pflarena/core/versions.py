"""Versioned stores of named ArrayRecords, on disk or in memory.

A *version* is a numbered full snapshot of a set of named entries (ArrayRecords). Writing a
version copies the base version's unchanged entries forward (hard links on disk, so a
version costs only what changed) and is atomic (a staging folder, then a rename). Versions
let state move with the server's decisions and roll back with a restarted server:

* a client's method state (:mod:`pflarena.client.state`): one version per message, made
  current only once the server accepted the update;
* a strategy's per-client pools (:class:`ClientPool`: pFedSV's model pool, FedPG's stale
  gradients), one version per round, rolled back to the checkpoint on a resume.

Entries read from or written to disk go through a per-process cache bounded in bytes
(:data:`CACHE_BYTES`), so memory does not grow with the number of clients, while a
simulation whose clients' states are small reads them from memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import zipfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from flwr.app import ArrayRecord, RecordDict

from pflarena.core import directio
from pflarena.core.array_decoding import array_buffer, from_npy, npy_bytes

__all__ = ["ClientPool", "DiskVersions", "MemoryVersions", "VersionDraft", "run_key"]

# A state file is a zip (np.savez's), whose members carry a CRC-32 that zipfile computes on
# every write and checks on every read: for MNIST's CNN (6.7 MB), 2.9 ms each with zlib's on
# this project's host, 0.8 with ISA-L's (python-isal), the same values; a state file read
# back took 4.6 ms against 7.1 (benchmarks/results/crc32.md). zipfile has no parameter for
# it, only its module's ``crc32``, which is set here: every zip this process writes or reads
# gets the same checksums, sooner. An install without python-isal (the edge image's
# ClientApps) keeps zlib's.
try:
    from isal.isal_zlib import crc32 as _isal_crc32
except ImportError:  # pragma: no cover - python-isal is a dependency; the edge image lacks it
    _isal_crc32 = None
if _isal_crc32 is not None:
    zipfile.crc32 = _isal_crc32

#: The bytes of entries (arrays' data) a process keeps cached, least recently used first out:
#: the few large entries of a big model, or every client's entries of a small one (PPFL's
#: membership and momentum, a Ditto logistic model). The cache was 16 entries before, which
#: a 30-client simulation with two entries per client missed on every read.
CACHE_BYTES = 64 << 20

#: Entry files from this size on are written and read past the page cache where a store is
#: ``direct`` (:class:`DiskVersions`): a model's state, not a membership vector.
DIRECT_MIN_BYTES = 1 << 20


def run_key(run_config: Mapping[str, Any]) -> str:
    """A short stable name for a run: a hash of its config (``resume`` left out)."""
    items = sorted((k, v) for k, v in run_config.items() if k != "resume")
    return hashlib.sha256(json.dumps(items, default=str).encode()).hexdigest()[:16]


def write_npz(handle: BinaryIO, record: ArrayRecord) -> None:
    """``np.savez(handle, **{name: array.numpy() ...})`` for ``record``: the same file (an
    uncompressed zip of one ``.npy`` member per array, in order), each member written from
    the array's own bytes where they are already the ``.npy`` file (:func:`npy_bytes`).
    Decoding every array and encoding it again made a 6.6 MB model's write 3.8 ms against
    2.4 (and its read 3.1 against 1.8), side by side (``benchmarks/results/state_io.md``),
    paid by every stateful client on every message. Tested byte for byte against
    ``np.savez``."""
    with zipfile.ZipFile(handle, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in record.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:  # as np.savez
                member.write(npy_bytes(array))


def read_npz(path: Path | BinaryIO) -> ArrayRecord:
    """The record :func:`write_npz` (or ``np.savez``) wrote at ``path`` (or in a file
    object): what ``{name: Array(np.load(path)[name])}`` gives, each array's bytes taken from
    its member as they are where they are what ``np.save`` writes (:func:`from_npy`). The
    members' checksums are checked (``zipfile``); a member that is not ``.npy`` is refused."""
    record = ArrayRecord()
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                raise ValueError(f"{info.filename!r} is not an .npy member")
            record[info.filename[: -len(".npy")]] = from_npy(archive.read(info))
    return record


def _data_bytes(record: ArrayRecord) -> int:
    return sum(len(array_buffer(array)) for array in record.values())


def _file_name(entry: str) -> str:
    return entry.replace("/", "__") + ".npz"


def _entry_name(file_name: str) -> str:
    return file_name[: -len(".npz")].replace("__", "/")


class DiskVersions:
    """Versions as folders of ``.npz`` files (one per entry), written atomically.

    ``durable`` (the default) fsyncs every file it writes, so a version survives a machine
    crash on its own (a SuperNode's ``state-dir``). A simulated client's state lives under
    the run's output directory, on the server's disk, and is written ``durable=False``:
    the server syncs that file system once before each checkpoint
    (:func:`pflarena.server.checkpoint.save_checkpoint`), which makes every version the
    checkpoint can refer to durable at the cost of one sync a round instead of one fsync
    per client and entry (about 11 ms each here, more than a PAGE client's agent work).

    ``direct`` (the default) writes and reads entry files of :data:`DIRECT_MIN_BYTES` and
    more past the page cache (:mod:`pflarena.core.directio`; the page cache's way where the
    file system refuses it). The files are the same either way.
    """

    _cache: OrderedDict[tuple[str, int, int], tuple[ArrayRecord, int]] = OrderedDict()
    _cache_bytes = 0
    _cache_lock = threading.Lock()

    def __init__(self, folder: Path, *, durable: bool = True, direct: bool = True) -> None:
        self.folder = folder
        self.durable = durable
        self.direct = direct
        #: seconds the last :meth:`write` spent on each changed entry (serialise, write,
        #: fsync), and the thread's CPU seconds of the same
        self.write_seconds: dict[str, float] = {}
        self.write_cpu_seconds: dict[str, float] = {}

    @property
    def location(self) -> str:
        """Names this store among a process's stores (its folder)."""
        return str(self.folder)

    def stamp(self, version: int, entry: str) -> tuple | None:
        """What identifies the file of ``entry`` in ``version`` (inode, mtime, size; a hard
        link carried forward keeps it); None if there is none."""
        try:
            info = (self._path(version) / _file_name(entry)).stat()
        except OSError:
            return None
        return (info.st_ino, info.st_mtime_ns, info.st_size)

    def _path(self, version: int) -> Path:
        return self.folder / f"v{version}"

    def versions(self) -> list[int]:
        if not self.folder.is_dir():
            return []
        return sorted(
            int(p.name[1:])
            for p in self.folder.iterdir()
            if p.name[:1] == "v" and p.name[1:].isdigit()
        )

    def entries(self, version: int) -> list[str]:
        return sorted(_entry_name(p.name) for p in self._path(version).glob("*.npz"))

    def read(self, version: int, entry: str) -> ArrayRecord | None:
        path = self._path(version) / _file_name(entry)
        try:
            key = self._cache_key(path)
        except OSError:
            return None
        cached = self._cached(key)
        if cached is not None:
            return cached
        try:
            source: Path | directio.AlignedBuffer | None = None
            if self.direct and key[2] >= DIRECT_MIN_BYTES:
                source = directio.read(path, key[2])
            record = read_npz(source or path)
        except Exception as exc:  # noqa: BLE001 - a damaged file, whatever numpy says
            raise ValueError(f"cannot read {path}: {type(exc).__name__}: {exc}") from exc
        self._remember(key, record)
        return record

    @staticmethod
    def _cache_key(path: Path) -> tuple[str, int, int]:
        """A cached entry stands for its file as long as the file's mtime and size stay."""
        info = path.stat()
        return (str(path), info.st_mtime_ns, info.st_size)

    @classmethod
    def _cached(cls, key: tuple[str, int, int]) -> ArrayRecord | None:
        with cls._cache_lock:
            found = cls._cache.get(key)
            if found is None:
                return None
            cls._cache.move_to_end(key)
            return found[0]

    @classmethod
    def _remember(cls, key: tuple[str, int, int], record: ArrayRecord) -> None:
        size = _data_bytes(record)
        if size > CACHE_BYTES:
            return
        with cls._cache_lock:
            old = cls._cache.pop(key, None)
            cls._cache_bytes += size - (old[1] if old else 0)
            cls._cache[key] = (record, size)
            while cls._cache_bytes > CACHE_BYTES:
                _, (_, dropped) = cls._cache.popitem(last=False)
                cls._cache_bytes -= dropped

    def write(self, version: int, base: int | None, changed: Mapping[str, ArrayRecord]) -> None:
        """Version ``version``: ``base``'s entries (hard-linked) with ``changed`` on top."""
        draft = self.begin(version, base)
        try:
            for entry, record in changed.items():
                draft.put(entry, record)
            draft.commit()
        finally:
            draft.discard()

    def begin(self, version: int, base: int | None) -> VersionDraft:
        """Version ``version`` in the making: its entries written one by one
        (:meth:`VersionDraft.put`, from any one thread at a time), then made a version at
        once (:meth:`VersionDraft.commit`) or dropped (:meth:`VersionDraft.discard`)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.write_seconds, self.write_cpu_seconds = {}, {}
        staging = Path(tempfile.mkdtemp(prefix=f".v{version}-", dir=self.folder))
        return VersionDraft(self, version, base, staging)

    def _write_entry(self, path: Path, record: ArrayRecord) -> None:
        """One entry's file: past the page cache where ``direct`` and the file is large
        enough (serialised into the thread's aligned buffer first), else through it."""
        if self.direct and _data_bytes(record) >= DIRECT_MIN_BYTES:
            buffer = directio.thread_buffer()
            buffer.reset()
            write_npz(buffer, record)
            if directio.write(path, buffer, durable=self.durable):
                return
            content: Any = buffer.padded()[: buffer.size]  # refused: the same bytes, cached
        else:
            content = None
        with open(path, "wb") as handle:
            if content is None:
                write_npz(handle, record)
            else:
                handle.write(content)
            if self.durable:
                handle.flush()
                os.fsync(handle.fileno())

    def delete(self, version: int) -> None:
        """Remove ``version``'s folder. A version holds only entry files, so they are
        unlinked one by one (a third of ``shutil.rmtree``'s cost, which a client pays on
        nearly every message); anything else there falls back to ``rmtree``."""
        folder = self._path(version)
        try:
            with os.scandir(folder) as files:
                for file in files:
                    os.unlink(file.path)
            folder.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            shutil.rmtree(folder, ignore_errors=True)


class VersionDraft:
    """A version of a :class:`DiskVersions` being written (:meth:`DiskVersions.begin`): its
    changed entries' files in a staging folder, which :meth:`commit` renames to the
    version's with ``base``'s other entries linked in. The staging folder's name is not a
    version's (a leading dot), so a draft never committed (a solver that failed, a killed
    process) is never read as one."""

    def __init__(self, store: DiskVersions, version: int, base: int | None, staging: Path) -> None:
        self.store = store
        self.version = version
        self.base = base
        self.staging = staging
        self.written: dict[str, ArrayRecord] = {}

    def put(self, entry: str, record: ArrayRecord) -> None:
        """Write ``entry``'s file (again, if it was written before)."""
        path = self.staging / _file_name(entry)
        self.written.pop(entry, None)
        path.unlink(missing_ok=True)  # an earlier write of it, whole or failed
        started, started_cpu = time.perf_counter(), time.thread_time()
        self.store._write_entry(path, record)
        self.store.write_seconds[entry] = time.perf_counter() - started
        self.store.write_cpu_seconds[entry] = time.thread_time() - started_cpu
        self.written[entry] = record

    def commit(self) -> None:
        """Make the draft version ``version``: the written entries, and ``base``'s others
        (hard links), renamed into place at once."""
        store, staging = self.store, self.staging
        if self.base is not None:
            for source in store._path(self.base).glob("*.npz"):
                if _entry_name(source.name) not in self.written:
                    os.link(source, staging / source.name)
        target = store._path(self.version)
        if target.exists():
            store.delete(self.version)
        os.replace(staging, target)
        # what was just written is what the next message reads (write-through)
        for entry, record in self.written.items():
            path = target / _file_name(entry)
            store._remember(store._cache_key(path), record)

    def discard(self) -> None:
        """Remove what :meth:`commit` did not make a version (nothing after a commit)."""
        if self.staging.exists():
            shutil.rmtree(self.staging, ignore_errors=True)


class MemoryVersions:
    """The same versions in a RecordDict (Flower's ``context.state``): ``v<id>/<entry>``."""

    def __init__(self, records: RecordDict) -> None:
        self.records = records
        self.write_seconds: dict[str, float] = {}
        self.write_cpu_seconds: dict[str, float] = {}

    @property
    def location(self) -> str:
        """Names this store among a process's stores (its RecordDict's identity)."""
        return f"memory:{id(self.records)}"

    def stamp(self, version: int, entry: str) -> tuple | None:
        """What identifies the stored record of ``entry`` in ``version`` (the object's
        identity: a caller that keeps a stamp must keep the record alive with it)."""
        record = self.read(version, entry)
        return None if record is None else (id(record),)

    def _keys(self) -> list[tuple[int, str]]:
        found = []
        for key in self.records.array_records.keys():
            head, _, entry = key.partition("/")
            if head[:1] == "v" and head[1:].isdigit() and entry:
                found.append((int(head[1:]), entry))
        return found

    def versions(self) -> list[int]:
        return sorted({version for version, _ in self._keys()})

    def entries(self, version: int) -> list[str]:
        return sorted(entry for v, entry in self._keys() if v == version)

    def read(self, version: int, entry: str) -> ArrayRecord | None:
        return self.records.array_records.get(f"v{version}/{entry}")

    def write(self, version: int, base: int | None, changed: Mapping[str, ArrayRecord]) -> None:
        if base is not None:
            for entry in self.entries(base):
                if entry not in changed:
                    self.records[f"v{version}/{entry}"] = self.records[f"v{base}/{entry}"]
        for entry, record in changed.items():
            self.records[f"v{version}/{entry}"] = record

    def delete(self, version: int) -> None:
        for entry in self.entries(version):
            del self.records[f"v{version}/{entry}"]


class ClientPool:
    """Per-client arrays a strategy keeps on the server, one versioned store per client.

    What is put in round r becomes that client's version r; :meth:`get` reads the newest.
    :meth:`checkpoint` (after the server's checkpoint of round r) drops what a resume from
    r can no longer need, and :meth:`rollback` (on a resume from r) drops what came after.

    Parameters
    ----------
    root
        A folder (``<output-dir>/server-state/<name>``), or ``None`` to keep the versions in
        memory (a run without an output directory cannot be resumed anyway).
    direct
        Large entries past the page cache (:class:`DiskVersions`; the run's ``state-io``).
    """

    def __init__(self, root: Path | None, *, direct: bool = True) -> None:
        self.root = root
        self.direct = direct
        self._memory: dict[int, MemoryVersions] = {}

    def _store(self, client_id: int) -> DiskVersions | MemoryVersions:
        if self.root is None:
            return self._memory.setdefault(client_id, MemoryVersions(RecordDict()))
        return DiskVersions(self.root / f"client-{client_id}", direct=self.direct)

    def clients(self) -> list[int]:
        if self.root is None:
            return sorted(c for c, store in self._memory.items() if store.versions())
        if not self.root.is_dir():
            return []
        return sorted(int(p.name.split("-", 1)[1]) for p in self.root.glob("client-*"))

    def put(self, client_id: int, server_round: int, entries: Mapping[str, ArrayRecord]) -> None:
        """``entries`` become (part of) the client's version for ``server_round``."""
        store = self._store(client_id)
        older = [v for v in store.versions() if v <= server_round]
        store.write(server_round, older[-1] if older else None, entries)

    def get(self, client_id: int, entry: str) -> ArrayRecord | None:
        """The client's newest value of ``entry``, or None."""
        store = self._store(client_id)
        versions = store.versions()
        return store.read(versions[-1], entry) if versions else None

    def checkpoint(self, server_round: int) -> None:
        """Keep, per client, the newest version up to ``server_round`` and any later ones."""
        for client_id in self.clients():
            store = self._store(client_id)
            kept = [v for v in store.versions() if v <= server_round]
            for version in kept[:-1]:
                store.delete(version)

    def rollback(self, server_round: int) -> None:
        """Forget every version after ``server_round`` (a resume from that checkpoint)."""
        for client_id in self.clients():
            store = self._store(client_id)
            for version in store.versions():
                if version > server_round:
                    store.delete(version)
