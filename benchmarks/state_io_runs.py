"""The same stateful run with its state files written and read past the page cache
(``state-io = "direct"``) and through it (``"buffered"``), side by side.

``benchmarks/client_overhead.py`` measures a large federation, where most clients are
sampled once in a short run and their state is written and seldom read. This measures the
other end: a small federation whose every client trains every round, so that each round
reads back the state the round before wrote, which the page cache still holds when the
writes go through it. Each run is a real ``pflarena run`` (Ditto by default, MNIST's CNN, a
6.6 MB personal model a client) on the default engine; the two settings alternate, and
rounds 2 and later are timed (``train_time_s``).

Usage::

    python benchmarks/state_io_runs.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from commit_tree import head_commit

from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("direct", "buffered")


def run(args: argparse.Namespace, setting: str, out: Path) -> dict:
    cmd = [
        sys.executable, "-m", "pflarena.cli", "run", "--strategy", args.strategy,
        "--dataset", "mnist", "--data-dir", args.data_dir, "--model", "cnn",
        "--partition", "iid", "--num-clients", str(args.clients),
        "--max-client-samples", str(args.samples), "--fraction-train", str(args.fraction),
        "--num-rounds", str(args.rounds), "--eval-every", "100000",
        "--final-evaluation", "sample", "--fraction-evaluate", "0.1",
        "--local-epochs", "1", "--batch-size", "32", "--lr", "0.05", "--seed", "0",
        "--state-io", setting, "--output-dir", str(out), "--quiet",
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"state-io {setting}:\n{proc.stderr[-3000:]}")
    rounds = [r for r in read_rounds(out / "rounds.jsonl") if r["round"] >= 2]
    return {
        "round_s": statistics.mean(r["train_time_s"] for r in rounds),
        "solver_s": statistics.mean(r["train"]["client_time_s"] for r in rounds),
        "wall_s": time.monotonic() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--strategy", default="ditto")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--fraction", type=float, default=1.0)
    parser.add_argument("--samples", type=int, default=64, help="training images a client")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/state_io_runs.md"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pflarena-state-io-"))
    started = datetime.now(timezone.utc)
    loads = [os.getloadavg()[0]]
    found: dict[str, list[dict]] = {setting: [] for setting in SETTINGS}
    try:
        for repeat in range(args.repeats):
            order = SETTINGS if repeat % 2 == 0 else SETTINGS[::-1]
            for setting in order:
                out = work / f"{setting}-{repeat}"
                found[setting].append(run(args, setting, out))
                shutil.rmtree(out)
                loads.append(os.getloadavg()[0])
                print(setting, repeat, found[setting][-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def median(setting: str, key: str) -> float:
        return statistics.median(r[key] for r in found[setting])

    lines = [
        "# State files past the page cache or through it: a small federation, every client "
        "every round",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`.",
        f"- Command: `python benchmarks/state_io_runs.py {shlex.join(sys.argv[1:])}`.",
        f"- Machine: {os.cpu_count()} cores, shared with other work: load average (1 min) "
        f"{min(loads):.1f} to {max(loads):.1f} over the runs. Compare the rows only with "
        "each other.",
        "",
        f"{args.strategy}, MNIST's CNN, {args.clients} clients (IID, {args.samples} training "
        f"images each), {args.fraction:.0%} of them a round, {args.rounds} rounds, 1 local "
        "epoch at batch 32, the default engine; rounds 2 on timed. The settings alternate; "
        f"medians of {args.repeats} runs each.",
        "",
        "| state-io | round s | solvers' time summed, s | wall s | rounds, each run |",
        "|---|---|---|---|---|",
    ]
    for setting in SETTINGS:
        each = ", ".join(f"{r['round_s']:.2f}" for r in found[setting])
        lines.append(
            f"| {setting} | {median(setting, 'round_s'):.2f} | {median(setting, 'solver_s'):.2f} "
            f"| {median(setting, 'wall_s'):.0f} | {each} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
