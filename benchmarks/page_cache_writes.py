"""What writing a model-sized file costs this machine's kernel: into new page-cache pages,
and into pages just freed by deleting files of the same size.

A stateful client writes its state (Ditto: a 6.6 MB personal model) into a new file on every
train message. Where the kernel has no recently freed pages at hand it takes fresh ones; on
a virtual machine whose balloon device reports free pages to the host (virtio-balloon's
free page reporting), a page freed a few seconds ago is fresh again, and each costs the host
a fault and a zeroing. This writes ``--files`` files of ``--mb`` MB one after another (fresh
pages), deletes them, and writes as many again (their pages recycled), reporting each
write's wall time and the process's system CPU time per write.

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
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def row(name: str, walls: list[float], system: float) -> str:
        ms = [1000 * w for w in walls]
        return (
            f"| {name} | {statistics.median(ms):.1f} | {statistics.mean(ms):.1f} "
            f"| {max(ms):.1f} | {1000 * system:.1f} |"
        )

    lines = [
        "# Writing model-sized files: new page-cache pages against recycled ones",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`.",
        f"- Command: `{shlex.join(['python', 'benchmarks/page_cache_writes.py', *sys.argv[1:]])}`.",
        f"- Machine: {os.cpu_count()} cores; virtio balloon with free page reporting: "
        f"{balloon_reports_free_pages()}; folder on the file system of `{folder.parent}`.",
        "",
        f"{args.files} files of {args.mb} MB written one after another (buffered, no fsync), "
        "then deleted, then as many written again. Times per write, ms; system CPU: the "
        "process's kernel time over the writes, per write (10 ms clock ticks, averaged).",
        "",
        "| writes | median | mean | most | system CPU |",
        "|---|---|---|---|---|",
        row("into new pages", fresh, fresh_sys),
        row("into the pages the deleted files freed", recycled, recycled_sys),
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
