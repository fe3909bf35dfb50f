"""The training and evaluation loops on the CPU, this tree against an earlier one: speed and
results.

The loops keep a client's data on its device (batch indices copied once per pass, losses
summed on the device and read once per call); on the CPU that must cost nothing and change
nothing. Two measurements, each repetition running both trees one right after the other
under the same load (this Python environment, the tree first on ``PYTHONPATH``):

* the loops alone: ``train_epochs`` (2 epochs, batch 32) and ``evaluate`` of MNIST's CNN on
  2,000 random 28x28 images, in a fresh process per tree (median seconds, and whether the
  loss and the evaluation are the same to the bit);
* whole runs: ``pflarena run --dataset digits --num-clients 4 --num-rounds 3 --seed 0`` for
  methods whose solvers have loops of their own (APFL, PPFL, pFedGT) and FedAvg:
  ``rounds.jsonl`` must be identical (but for timings), and their rounds' seconds.

Usage::

    python benchmarks/device_loops.py --before-commit <commit> --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from commit_tree import export_commit, tree_env  # noqa: E402 - the same tree export
from startup import _commit, comparable  # noqa: E402 - the same comparison

LOOPS = r"""
import json, time, torch
from pflarena.core.models import build_model
from pflarena.core.training import evaluate, train_epochs
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
x = torch.randn(2000, 1, 28, 28, generator=g)
y = torch.randint(0, 10, (2000,), generator=g)
model = build_model("cnn", (1, 28, 28), 10, seed=0)
begin = time.perf_counter()
loss, steps = train_epochs(model, x, y, epochs=2, batch_size=32, lr=0.05,
                           generator=torch.Generator().manual_seed(1), momentum=0.9)
trained = time.perf_counter()
result = evaluate(model, x, y)
done = time.perf_counter()
print(json.dumps({"train_s": trained - begin, "eval_s": done - trained, "loss": loss.hex(),
                  "steps": steps, "eval_loss": result.loss_sum.hex(), "correct": result.correct}))
"""
METHODS = ("fedavg", "apfl", "ppfl", "pfedgt")


def loops(tree: Path) -> dict:
    env = tree_env(tree)
    out = subprocess.run(
        [sys.executable, "-c", LOOPS], capture_output=True, text=True, env=env, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def run(tree: Path, method: str, out: Path) -> float:
    env = tree_env(tree)
    command = [sys.executable, "-m", "pflarena.cli", "run", "--strategy", method, "--dataset",
               "digits", "--num-clients", "4", "--num-rounds", "3", "--seed", "0", "--quiet",
               "--output-dir", str(out)]  # fmt: skip
    subprocess.run(command, env=env, check=True, capture_output=True)
    return json.loads((out / "summary.json").read_text())["rounds_time_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before-commit", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", default=str(ROOT / "benchmarks/results/device_loops.md"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pflarena-loops-"))
    trees = {"before": export_commit(args.before_commit, work / "before"), "after": ROOT}
    started = datetime.now(timezone.utc)
    loads = [os.getloadavg()[0]]
    timings: dict[str, list[dict]] = {side: [] for side in trees}
    rounds: dict[tuple[str, str], list[float]] = {}
    for index in range(args.repeats):
        for side, tree in trees.items():
            timings[side].append(loops(tree))
        for method in METHODS:
            for side, tree in trees.items():
                seconds = run(tree, method, work / f"{side}-{method}-{index}")
                rounds.setdefault((side, method), []).append(seconds)
        loads.append(os.getloadavg()[0])
        print(f"repetition {index + 1} done", flush=True)
    same_loops = all(
        {k: t[k] for k in ("loss", "steps", "eval_loss", "correct")}
        == {k: timings["before"][0][k] for k in ("loss", "steps", "eval_loss", "correct")}
        for side in trees
        for t in timings[side]
    )
    same_runs = {
        method: all(
            comparable(work / f"{side}-{method}-{i}") == comparable(work / f"before-{method}-0")
            for side in trees
            for i in range(args.repeats)
        )
        for method in METHODS
    }
    median = statistics.median

    def m(side: str, key: str) -> float:
        return median(t[key] for t in timings[side])

    lines = [
        "# The training loops on the CPU: before and after keeping data on the device",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC.",
        f"- Command: `python benchmarks/device_loops.py {shlex.join(sys.argv[1:])}`, at commit "
        f"{_commit(ROOT, Path(args.output))}; before: commit {args.before_commit}.",
        f"- Machine: {os.cpu_count()} cores, shared: load average (1 min) "
        f"{min(loads):.2f} to {max(loads):.2f} during the runs. Before and after alternate; "
        "compare the ratios.",
        "",
        f"Loops alone (MNIST's CNN, 2,000 images, 2 epochs at batch 32, one thread; medians of "
        f"{args.repeats}):",
        "",
        "| | before s | after s | after / before |",
        "|---|---|---|---|",
    ]
    for key, name in (("train_s", "train_epochs"), ("eval_s", "evaluate")):
        lines.append(
            f"| {name} | {m('before', key):.3f} | {m('after', key):.3f} | "
            f"{m('after', key) / m('before', key):.2f} |"
        )
    lines += [
        "",
        f"Training loss, steps, evaluation loss and correct count the same to the bit in every "
        f"process of both trees: {'yes' if same_loops else 'NO'}.",
        "",
        "Whole runs (`pflarena run --dataset digits --num-clients 4 --num-rounds 3 --seed 0`), "
        f"seconds of the rounds, medians of {args.repeats}:",
        "",
        "| method | before s | after s | after / before | rounds.jsonl and summary identical |",
        "|---|---|---|---|---|",
    ]
    for method in METHODS:
        b, a = median(rounds[("before", method)]), median(rounds[("after", method)])
        lines.append(
            f"| {method} | {b:.2f} | {a:.2f} | {a / b:.2f} | "
            f"{'yes' if same_runs[method] else 'NO'} |"
        )
    Path(args.output).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
