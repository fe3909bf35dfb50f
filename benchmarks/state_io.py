"""What writing and reading one client's state file costs: ``np.savez`` of the decoded arrays
and ``Array(np.load(...))``, as client states were written and read, against
:func:`~pflarena.core.versions.write_npz` and :func:`~pflarena.core.versions.read_npz`,
which write and read the same file from and into the arrays' own ``.npy`` bytes.

The record is a model's ``state_record`` (``--model``, MNIST's CNN by default: 6.6 MB), the
entry a Ditto or FedRep client writes on every message. Each way writes ``--files`` new
files into a temporary directory and reads them back; the ways alternate, ``--repeats``
times; the figure is milliseconds per file, the median.

Usage::

    python benchmarks/state_io.py --out benchmarks/results/state_io.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from commit_tree import head_commit
from flwr.app import Array, ArrayRecord

from pflarena.core.array_decoding import state_record
from pflarena.core.models import build_model
from pflarena.core.versions import read_npz, write_npz

ROOT = Path(__file__).resolve().parents[1]


def numpy_write(path: Path, record: ArrayRecord) -> None:
    with open(path, "wb") as handle:
        np.savez(handle, **{name: array.numpy() for name, array in record.items()})


def numpy_read(path: Path) -> ArrayRecord:
    with np.load(path, allow_pickle=False) as data:
        return ArrayRecord({name: Array(data[name]) for name in data.files})


def ours_write(path: Path, record: ArrayRecord) -> None:
    with open(path, "wb") as handle:
        write_npz(handle, record)


WAYS = {
    "np.savez / np.load": (numpy_write, numpy_read),
    "write_npz / read_npz": (ours_write, read_npz),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--files", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/state_io.md")
    args = parser.parse_args()
    model = build_model(args.model, (1, 28, 28), 10)
    record = state_record(model.state_dict())
    size = sum(len(array.data) for array in record.values()) / 1e6
    times = {way: {"write": [], "read": []} for way in WAYS}
    loads = []
    work = Path(tempfile.mkdtemp(prefix="pflarena-state-io-"))
    try:
        for repeat in range(args.repeats):
            for index, (way, (write, read)) in enumerate(WAYS.items()):
                paths = [work / f"{repeat}-{index}-{n}.npz" for n in range(args.files)]
                start = time.perf_counter()
                for path in paths:
                    write(path, record)
                times[way]["write"].append((time.perf_counter() - start) / args.files)
                start = time.perf_counter()
                for path in paths:
                    got = read(path)
                times[way]["read"].append((time.perf_counter() - start) / args.files)
                assert list(got) == list(record)
                assert all(got[name].data == record[name].data for name in record)
                for path in paths:
                    path.unlink()
            loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for way, kinds in times.items():
        write, read = (statistics.median(kinds[kind]) for kind in ("write", "read"))
        rows.append(f"| {way} | {1000 * write:.1f} | {1000 * read:.1f} |")
    lines = [
        "# One client's state file: written and read",
        "",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`.",
        f"- Command: `python benchmarks/state_io.py --model {args.model} --files {args.files} "
        f"--repeats {args.repeats}`.",
        f"- Machine: {os.cpu_count()} cores, shared: load average (1 min) "
        f"{min(loads):.1f} to {max(loads):.1f}. Compare the rows only with each other.",
        "",
        f"The `{args.model}` model's state record ({size:.1f} MB, {len(record)} arrays); "
        f"{args.files} new files per way and repeat, the ways alternating; milliseconds per "
        f"file, the median of {args.repeats} repeats. Both ways write the same bytes "
        "(`tests/test_arrays.py`).",
        "",
        "| way | write, ms | read, ms |",
        "|---|---|---|",
        *rows,
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
