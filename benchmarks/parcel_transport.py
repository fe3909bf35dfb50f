"""How long a model-sized reply takes to come back from a worker process: through the pool's
pipe, as the in-process engine's replies did, or in a file (``pflarena.runtime.parcel``).

Two forked workers (``ProcessPoolExecutor``, as the engine's) each make ``--calls`` replies of
``--megabytes`` and send them back, once as ``bytes`` through the pool's result pipe and
once as a :class:`~pflarena.runtime.parcel.Spilled` record read back with
:func:`~pflarena.runtime.parcel.read_spilled`; alternating, ``--repeats`` times. The figure
is the run's process's wall time per reply, so a slower parent shows.

Usage::

    python benchmarks/parcel_transport.py --out benchmarks/results/parcel_transport.md
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from commit_tree import head_commit
from flwr.app import ArrayRecord

from pflarena.runtime.parcel import ParcelFiles, read_spilled, record_fields, spill

ROOT = Path(__file__).resolve().parents[1]
_SIZE = {"bytes": 0}


def _record(call: int) -> ArrayRecord:
    values = np.full(_SIZE["bytes"] // 4, float(call), dtype=np.float32)
    return ArrayRecord([values])


def through_pipe(call: int):
    return record_fields(_record(call))


def through_file(call: int, directory: str):
    return spill(_record(call), Path(directory) / f"{os.getpid()}-{call}.record")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=6.6, help="MNIST's CNN: 6.6")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/parcel_transport.md")
    args = parser.parse_args()
    _SIZE["bytes"] = int(args.megabytes * 1e6)
    files = ParcelFiles()
    pool = ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork"))
    times: dict[str, list[float]] = {"pipe": [], "file": []}
    loads = []
    try:
        list(pool.map(through_pipe, range(4)))  # the workers started
        for _ in range(args.repeats):
            start = time.perf_counter()
            for fields in pool.map(through_pipe, range(args.calls)):
                assert len(fields[0][1][3]) >= _SIZE["bytes"]
            times["pipe"].append((time.perf_counter() - start) / args.calls)
            start = time.perf_counter()
            directory = [str(files.once)] * args.calls
            for spilled in pool.map(through_file, range(args.calls), directory):
                assert len(read_spilled(spilled)[0][1][3]) >= _SIZE["bytes"]
            times["file"].append((time.perf_counter() - start) / args.calls)
            loads.append(os.getloadavg()[0])
    finally:
        pool.shutdown()
        files.close()
    pipe, file = statistics.median(times["pipe"]), statistics.median(times["file"])
    lines = [
        "# A model-sized reply from a worker: the pool's pipe against a file",
        "",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`.",
        f"- Command: `python benchmarks/parcel_transport.py --megabytes {args.megabytes} "
        f"--calls {args.calls} --repeats {args.repeats}`.",
        f"- Machine: {os.cpu_count()} cores, shared: load average (1 min) "
        f"{min(loads):.1f} to {max(loads):.1f}. Compare the two rows only with each other.",
        "",
        f"Two forked workers each send back {args.calls // 2} replies of {args.megabytes} MB; "
        "the run's process's wall time per reply, median of "
        f"{args.repeats} alternating repeats (each repeat's figure in brackets).",
        "",
        "| way | ms per reply |",
        "|---|---|",
        f"| pipe (pickled bytes) | {1000 * pipe:.1f} "
        f"({', '.join(f'{1000 * t:.1f}' for t in times['pipe'])}) |",
        f"| file (`Spilled`, read with `os.pread`) | {1000 * file:.1f} "
        f"({', '.join(f'{1000 * t:.1f}' for t in times['file'])}) |",
        "",
        f"The file takes {file / pipe:.2f}x the pipe's time.",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
