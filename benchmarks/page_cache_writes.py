"""What writing and reading a model-sized file costs this machine's kernel: through the page
cache into new pages, into pages just freed, and past the page cache (``O_DIRECT``, as
``pflarena.core.directio`` writes client state).

A stateful client writes its state (Ditto: a 6.6 MB personal model) into a new file on every
train message. Where the kernel has no recently freed pages at hand it takes fresh ones; on
a virtual machine whose balloon device reports free pages to the host (virtio-balloon's
free page reporting), a page freed a few seconds ago is fresh again, and each costs the host
a fault and a zeroing. This writes ``--files`` files of ``--mb`` MB one after another (fresh
pages), deletes them, writes as many again (their pages recycled), and as many past the page
cache from one reused aligned buffer. Then it reads them back into one reused buffer:
the buffered files from the page cache, and the direct ones (not in the cache) both through
the page cache and past it. Each row gives the wall time per file and the process's system
CPU time per file.

Usage::

    python benchmarks/page_cache_writes.py
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from commit_tree import head_commit

ROOT = Path(__file__).resolve().parents[1]


def balloon_reports_free_pages() -> str:
    """Whether a virtio balloon offering free page reporting (feature bit 5) is present."""
    for device in Path("/sys/bus/virtio/devices").glob("*"):
        try:
            if (device / "device").read_text().strip() == "0x0005":
                features = (device / "features").read_text().strip()
                return "yes" if len(features) > 5 and features[5] == "1" else "no"
        except OSError:
            continue
    return "no balloon device"


def write_files(folder: Path, payload: bytes, count: int, tag: str) -> tuple[list[float], float]:
    walls = []
    before = os.times()
    for i in range(count):
        start = time.perf_counter()
        with open(folder / f"{tag}-{i}.bin", "wb") as handle:
            handle.write(payload)
        walls.append(time.perf_counter() - start)
    after = os.times()
    return walls, (after.system - before.system) / count


def write_direct(folder: Path, payload: bytes, count: int) -> tuple[list[float], float]:
    from pflarena.core import directio

    buffer = directio.AlignedBuffer(len(payload))
    buffer.write(payload)
    walls = []
    before = os.times()
    for i in range(count):
        start = time.perf_counter()
        if not directio.write(folder / f"direct-{i}.bin", buffer, durable=False):
            raise SystemExit(f"the file system of {folder} refuses O_DIRECT")
        walls.append(time.perf_counter() - start)
    after = os.times()
    return walls, (after.system - before.system) / count


def read_files(
    folder: Path, tag: str, count: int, size: int, direct: bool
) -> tuple[list[float], float]:
    from pflarena.core import directio

    into = bytearray(size)
    walls = []
    before = os.times()
    for i in range(count):
        path = folder / f"{tag}-{i}.bin"
        start = time.perf_counter()
        if direct:
            if directio.read(path, size) is None:
                raise SystemExit(f"the file system of {folder} refuses O_DIRECT")
        else:
            with open(path, "rb", buffering=0) as handle:
                handle.readinto(into)
        walls.append(time.perf_counter() - start)
    after = os.times()
    return walls, (after.system - before.system) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=150)
    parser.add_argument("--mb", type=float, default=6.6)
    parser.add_argument("--dir", default="", help="where to write (default: a temporary folder)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/page_cache_writes.md"))
    args = parser.parse_args()
    started = datetime.now(timezone.utc)
    folder = Path(tempfile.mkdtemp(prefix="pflarena-pagecache-", dir=args.dir or None))
    payload = os.urandom(int(args.mb * 1e6))
    try:
        fresh, fresh_sys = write_files(folder, payload, args.files, "fresh")
        for path in folder.iterdir():
            path.unlink()
        recycled, recycled_sys = write_files(folder, payload, args.files, "recycled")
        direct, direct_sys = write_direct(folder, payload, args.files)
        size = len(payload)
        cached = read_files(folder, "recycled", args.files, size, direct=False)
        uncached = read_files(folder, "direct", args.files, size, direct=False)
        for path in folder.glob("direct-*"):  # read into the cache just now: written again
            path.unlink()
        write_direct(folder, payload, args.files)
        read_direct = read_files(folder, "direct", args.files, size, direct=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def row(name: str, walls: list[float], system: float) -> str:
        ms = [1000 * w for w in walls]
        return (
            f"| {name} | {statistics.median(ms):.1f} | {statistics.mean(ms):.1f} "
            f"| {max(ms):.1f} | {1000 * system:.1f} |"
        )

    lines = [
        "# Writing and reading model-sized files: new page-cache pages, recycled ones, "
        "and past the page cache",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`.",
        f"- Command: `{shlex.join(['python', 'benchmarks/page_cache_writes.py', *sys.argv[1:]])}`.",
        f"- Machine: {os.cpu_count()} cores; virtio balloon with free page reporting: "
        f"{balloon_reports_free_pages()}; folder on the file system of `{folder.parent}`.",
        "",
        f"{args.files} files of {args.mb} MB written one after another (buffered, no fsync), "
        "then deleted, then as many written again, then as many past the page cache "
        "(`O_DIRECT`, from one reused aligned buffer, no fsync); then each set read back "
        "into one reused buffer. Times per file, ms; system CPU: the process's kernel time "
        "per file (10 ms clock ticks, averaged).",
        "",
        "| file | median | mean | most | system CPU |",
        "|---|---|---|---|---|",
        row("written into new pages", fresh, fresh_sys),
        row("written into the pages the deleted files freed", recycled, recycled_sys),
        row("written past the page cache", direct, direct_sys),
        row("read from the page cache", *cached),
        row("read through the page cache, not in it", *uncached),
        row("read past the page cache", *read_direct),
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
