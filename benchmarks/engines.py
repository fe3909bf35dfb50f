"""The engines side by side: the default (in-process, clients in forked worker processes),
Ray, and the in-process engine one client after another (``--workers 1``, the in-process
engine as it was), each on the same two jobs, one after the other under the same load:

* ``digits``: one round of FedAvg on the embedded digits (10 clients): start-up bound;
* ``cnn``: three rounds of FedAvg with the MNIST-shaped CNN on 20 clients: CPU bound. MNIST
  itself is not embedded: a synthetic data set of MNIST's shape (random 28x28 images,
  10 labels, written as the offline ``mnist/mnist-70k.npz`` in a scratch ``--data-dir``)
  stands in; what is timed is the training, not the accuracy.

Each run is ``pflarena run ... --quiet`` in a fresh process; the figures are the command's
wall time (start to exit, imports included) and the run's own (``summary.json``'s
``wall_time_s``: the ServerApp's start to its end, which the engine decides and the
imports do not weigh on), with the machine's load average before each run. The engines must give identical rounds
(:func:`pflarena.server.results.comparable_rounds`); the default must be within 1.25x of the
faster of the other two. Writes ``benchmarks/results/engines.md``.

Usage::

    python benchmarks/engines.py [--repeats 1] [--samples 12000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from pflarena.runtime.engines import available_cores
from pflarena.server.results import comparable_rounds, read_rounds

ROOT = Path(__file__).resolve().parents[1]
PFLARENA = [sys.executable, "-m", "pflarena"]
ENGINES = {
    "default (in-process, workers)": [],
    "ray": ["--engine", "ray"],
    "in-process, one by one": ["--engine", "inprocess", "--workers", "1"],
}
TARGET = 1.25


def jobs(data_dir: Path) -> dict[str, list[str]]:
    common = ["--strategy", "fedavg", "--seed", "0", "--device", "cpu"]
    return {
        "digits, 1 round, 10 clients": [
            *common, "--dataset", "digits", "--num-clients", "10", "--num-rounds", "1",
        ],
        "MNIST-shaped CNN, 3 rounds, 20 clients": [
            *common, "--dataset", "mnist", "--data-dir", str(data_dir), "--num-clients", "20",
            "--num-rounds", "3", "--local-epochs", "1", "--batch-size", "32",
        ],
    }  # fmt: skip


def write_mnist_shaped(data_dir: Path, samples: int) -> None:
    """Random images of MNIST's shape as the offline MNIST file (seeded)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, size=samples)
    # a little signal per label so that training is ordinary training
    images = rng.integers(0, 160, size=(samples, 28, 28), dtype=np.uint8)
    images[np.arange(samples), labels * 2 + 3, 4:24] = 255
    path = data_dir / "mnist" / "mnist-70k.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=images, y=labels.astype(np.int64))


def run(args: list[str], out: Path) -> tuple[float, float, float]:
    """The command's wall time, the run's own (``wall_time_s``) and the load before it."""
    load = os.getloadavg()[0]
    begin = time.monotonic()
    result = subprocess.run(
        [*PFLARENA, "run", *args, "--quiet", "--output-dir", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    took = time.monotonic() - begin
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{result.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return took, float(summary["wall_time_s"]), load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--samples", type=int, default=12000, help="MNIST-shaped samples")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "engines.md"))
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="pflarena-engines-"))
    write_mnist_shaped(scratch / "data", args.samples)
    rows, verdicts = [], []
    for job, job_args in jobs(scratch / "data").items():
        times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ENGINES}
        rounds: dict[str, list] = {}
        for repeat in range(args.repeats):
            for index, (name, engine_args) in enumerate(ENGINES.items()):
                out = scratch / f"{job.split(',')[0].replace(' ', '-')}-{index}-{repeat}"
                took = run([*job_args, *engine_args], out)
                times[name].append(took)
                rounds[name] = comparable_rounds(read_rounds(out / "rounds.jsonl"))
                print(f"{job} | {name}: {took[0]:.1f}s (run {took[1]:.1f}s, load {took[2]:.1f})")
        identical = all(r == rounds["ray"] for r in rounds.values())
        for which, label in ((0, "command"), (1, "run")):
            best = {name: min(v[which] for v in values) for name, values in times.items()}
            default = best["default (in-process, workers)"]
            before = min(best["ray"], best["in-process, one by one"])
            verdicts.append(
                f"* {job}, {label} wall time: default {default:.1f}s, the faster of Ray and "
                f"one-by-one {before:.1f}s: {default / before:.2f}x (target ≤ {TARGET}x: "
                f"{'met' if default / before <= TARGET else 'NOT met'})"
            )
        verdicts.append(
            f"* {job}: rounds identical across the engines: {'yes' if identical else 'NO'}"
        )
        for name, values in times.items():
            rows.append(
                f"| {job} | {name} | {' / '.join(f'{v[0]:.1f}' for v in values)} | "
                f"{' / '.join(f'{v[1]:.1f}' for v in values)} | "
                f"{' / '.join(f'{v[2]:.1f}' for v in values)} |"
            )
    cores = available_cores()
    text = "\n".join(
        [
            "# Engines side by side",
            "",
            f"`python benchmarks/engines.py --repeats {args.repeats} --samples {args.samples}`, "
            f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}: {cores} "
            f"core(s) available, Python {platform.python_version()}. Wall time of `pflarena "
            "run ... --quiet` (start to exit, imports included) and of the run itself "
            "(`summary.json` `wall_time_s`), seconds, each repeat, with the 1-minute load "
            "average before the run.",
            "",
            "| job | engine | command s | run s | load |",
            "|---|---|---|---|---|",
            *rows,
            "",
            *verdicts,
            "",
        ]
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
