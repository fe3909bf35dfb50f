"""The state files' zip checksums: zlib's CRC-32 against ISA-L's (python-isal).

A client's state entry is a zip of ``.npy`` members (np.savez's file), and zipfile computes
each member's CRC-32 when it writes it and again when it reads it back. pflarena sets
zipfile's ``crc32`` to ISA-L's (``pflarena.core.versions``); this times the two side by side,
alternating: the checksum of a model's bytes, and a state file of MNIST's CNN (6.6 MB)
written into memory and read back (``write_npz``, ``read_npz``) with each.

Usage::

    python benchmarks/crc32.py
"""

from __future__ import annotations

import argparse
import io
import os
import shlex
import statistics
import sys
import time
import zipfile
import zlib
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/crc32.md"))
    args = parser.parse_args()

    import torch
    from commit_tree import head_commit
    from isal.isal_zlib import crc32 as isal_crc32

    from pflarena.core import versions
    from pflarena.core.array_decoding import state_record
    from pflarena.core.models import build_model

    torch.set_num_threads(1)
    record = state_record(build_model("cnn", (1, 28, 28), 10, seed=0).state_dict())
    data = b"".join(bytes(array.data) for array in record.values())
    assert isal_crc32(data) == zlib.crc32(data)
    kinds = {"zlib": zlib.crc32, "ISA-L": isal_crc32}
    loads = [os.getloadavg()[0]]
    times: dict[tuple[str, str], list[float]] = {}

    def timed(what: str, kind: str, work) -> None:
        started = time.perf_counter()
        work()
        times.setdefault((what, kind), []).append(time.perf_counter() - started)

    buffer = io.BytesIO()
    for _ in range(args.repeats):
        for kind, crc32 in kinds.items():
            zipfile.crc32 = crc32
            timed("CRC-32 of the model's bytes", kind, lambda crc32=crc32: crc32(data))
            buffer.seek(0)
            buffer.truncate()
            timed(
                "state file written (write_npz)", kind, lambda: versions.write_npz(buffer, record)
            )
            buffer.seek(0)
            timed("state file read (read_npz)", kind, lambda: versions.read_npz(buffer))
    zipfile.crc32 = isal_crc32
    loads.append(os.getloadavg()[0])

    lines = [
        "# The state files' zip checksums: zlib's CRC-32 against ISA-L's",
        "",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`.",
        f"- Command: `python benchmarks/crc32.py {shlex.join(sys.argv[1:])}`.",
        f"- Machine: {os.cpu_count()} cores, shared with other work: load average (1 min) "
        f"{min(loads):.1f} to {max(loads):.1f}. Compare only within a row.",
        "",
        f"MNIST's CNN ({len(data) / 1e6:.1f} MB of values), in memory (no disk), zipfile using "
        f"each CRC-32 in turn, alternating; median ms of {args.repeats}.",
        "",
        "| | zlib | ISA-L | ISA-L / zlib |",
        "|---|---|---|---|",
    ]
    for what in dict.fromkeys(what for what, _ in times):
        z, i = (1000 * statistics.median(times[what, kind]) for kind in kinds)
        lines.append(f"| {what} | {z:.2f} | {i:.2f} | {i / z:.2f} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
