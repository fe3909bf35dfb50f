"""Whether one folder per client and version becomes the bottleneck at tens of thousands of
clients: pflarena's client-state store (``pflarena.core.versions.DiskVersions``: a folder
per version, one ``.npz`` file per entry, written into a staging folder and renamed) against
SQLite (Python's ``sqlite3``, a well-kept embedded store: one table of (client, version,
entry, bytes), WAL journal, ``synchronous=OFF`` as a simulated client's store is not synced
per write, one transaction per message) doing the same work with the same bytes (the
entry's ``.npz`` file, :func:`~pflarena.core.versions.write_npz`).

For each federation size N: every client writes its first version (one entry of
``--entry-kb``, FedPer's head on MNIST's CNN by default: 20 KB), as a run's first rounds do;
then ``--sampled`` clients drawn at random each take a message as a stateful client does:
read its newest version's entry, delete every older version but that one, write a new
version. Reported: milliseconds per first write and per message (the median of each
``--repeats``'s mean, the two stores alternating), the files and bytes on disk. The page
cache is warm (the entries were just written), as in a run; the per-process read cache of
``DiskVersions`` is emptied before the messages, so each read opens its file.

Usage::

    python benchmarks/state_store.py --clients 1000 10000 100000 --out benchmarks/results/state_store.md
"""

from __future__ import annotations

import argparse
import io
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import OrderedDict
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from commit_tree import head_commit
from flwr.app import Array, ArrayRecord

from pflarena.core.footprint import disk_used
from pflarena.core.versions import DiskVersions, read_npz, write_npz

ENTRY = "fedper/head"


def _record(kib: int, seed: int) -> ArrayRecord:
    values = np.random.default_rng(seed).standard_normal(kib * 256).astype(np.float32)
    return ArrayRecord({"weight": Array(values)})


class FolderStore:
    """pflarena's store: a ``DiskVersions`` per client under one root."""

    name = "files (DiskVersions)"

    def __init__(self, root: Path) -> None:
        self.root = root

    def _store(self, client: int) -> DiskVersions:
        return DiskVersions(self.root / f"client-{client}", durable=False)

    def first(self, client: int, record: ArrayRecord) -> None:
        self._store(client).write(1, None, {ENTRY: record})

    def message(self, client: int, version: int, record: ArrayRecord) -> None:
        store = self._store(client)
        versions = store.versions()
        newest = versions[-1]
        assert store.read(newest, ENTRY) is not None
        for old in versions[:-1]:
            store.delete(old)
        store.write(version, newest, {ENTRY: record})

    def close(self) -> None:
        pass


class SqliteStore:
    """The same versions as rows of one SQLite table; an entry's bytes are its ``.npz``
    file's."""

    name = "SQLite"

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True)
        self.path = root / "state.db"
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute(
            "CREATE TABLE state (client INTEGER, version INTEGER, entry TEXT, data BLOB, "
            "PRIMARY KEY (client, version, entry))"
        )

    @staticmethod
    def _bytes(record: ArrayRecord) -> bytes:
        buffer = io.BytesIO()
        write_npz(buffer, record)
        return buffer.getvalue()

    def first(self, client: int, record: ArrayRecord) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute(
                "INSERT INTO state VALUES (?, 1, ?, ?)", (client, ENTRY, self._bytes(record))
            )

    def message(self, client: int, version: int, record: ArrayRecord) -> None:
        with self.db:
            self.db.execute("BEGIN")
            (newest,) = self.db.execute(
                "SELECT MAX(version) FROM state WHERE client = ?", (client,)
            ).fetchone()
            (data,) = self.db.execute(
                "SELECT data FROM state WHERE client = ? AND version = ? AND entry = ?",
                (client, newest, ENTRY),
            ).fetchone()
            assert len(read_npz(io.BytesIO(data)))
            self.db.execute("DELETE FROM state WHERE client = ? AND version < ?", (client, newest))
            self.db.execute(
                "INSERT INTO state VALUES (?, ?, ?, ?)",
                (client, version, ENTRY, self._bytes(record)),
            )

    def close(self) -> None:
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.db.close()


def _files(root: Path) -> int:
    return sum(len(files) for _, _, files in __import__("os").walk(root))


def measure(kind: type, n: int, args: argparse.Namespace, work: Path, seed: int) -> dict:
    root = work / f"{kind.__name__}-{n}-{seed}"
    store = kind(root)
    records = [_record(args.entry_kb, seed * 7 + i) for i in range(4)]
    started = time.perf_counter()
    for client in range(n):
        store.first(client, records[client % 4])
    first_ms = (time.perf_counter() - started) * 1000 / n
    DiskVersions._cache = OrderedDict()  # each read opens its file
    DiskVersions._cache_bytes = 0
    rng = np.random.default_rng(seed)
    messages = 0
    started = time.perf_counter()
    for version in range(2, 2 + args.rounds):
        for client in rng.choice(n, size=min(args.sampled, n), replace=False):
            store.message(int(client), version, records[(version + int(client)) % 4])
            messages += 1
    message_ms = (time.perf_counter() - started) * 1000 / messages
    store.close()
    row = {
        "first_ms": first_ms,
        "message_ms": message_ms,
        "files": _files(root),
        "bytes": disk_used(root),
    }
    shutil.rmtree(root)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--entry-kb", type=int, default=20)
    parser.add_argument("--sampled", type=int, default=1000, help="clients a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None, help="where to write (default: /tmp)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/state_store.md"))
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="pflarena-store-", dir=args.work) as work:
        for n in args.clients:
            runs = {FolderStore: [], SqliteStore: []}
            for repeat in range(args.repeats):
                for kind in (
                    (FolderStore, SqliteStore) if repeat % 2 == 0 else (SqliteStore, FolderStore)
                ):
                    runs[kind].append(measure(kind, n, args, Path(work), repeat))
            for kind, measured in runs.items():
                row = {
                    "clients": n,
                    "store": kind.name,
                    "first_ms": statistics.median(r["first_ms"] for r in measured),
                    "message_ms": statistics.median(r["message_ms"] for r in measured),
                    "files": measured[0]["files"],
                    "bytes": measured[0]["bytes"],
                }
                rows.append(row)
                print(row, flush=True)

    command = "python benchmarks/state_store.py " + " ".join(sys.argv[1:])
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Client state: a folder per version, or an embedded store",
        "",
        f"Command: `{command}` at commit `{head_commit()}`, {when}, {platform.machine()}, "
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}.",
        "",
        f"Every client writes a first version of one {args.entry_kb} KB entry; then "
        f"{args.rounds} rounds of {args.sampled:,} clients drawn at random each read their "
        "newest entry, delete the older versions and write a new one (a stateful client's "
        "message). ms: per first write and per message, the median over "
        f"{args.repeats} repeats, the stores alternating. **on disk**: at the end, files "
        "and bytes (a hard-linked file once).",
        "",
        "| clients | store | first write (ms) | message (ms) | files on disk | MB on disk |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['clients']:,} | {row['store']} | {row['first_ms']:.3f} | "
            f"{row['message_ms']:.3f} | {row['files']:,} | {row['bytes'] / 2**20:,.1f} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
