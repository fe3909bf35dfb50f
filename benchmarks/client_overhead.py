"""What a sampled client costs beyond its training: the same samples a round, over few or many
clients.

Two federations of MNIST (70,000 images, IID) train the same share of the data each round:
``--few`` clients at ``--fraction`` (100 at 10 %: 10 clients a round, 525 training images
each) and ``--many`` (3,550 at 10 %: 355 clients a round, 15 images each). The round's work
(images trained, one epoch at batch 32) is the same; what differs is the number of clients it
is split over, so the difference in round time over the difference in clients is what one
sampled client costs beyond its training: its messages, its data, its model and its state
loaded and saved. Each run is a real ``pflarena run`` on the default engine; rounds 2.. are
timed (``train_time_s``; round 1 may include the workers' start).

With ``--before-commit`` the same runs are made from that commit's tree too (``git archive``),
before and after alternating, so that the ratio is measured side by side on one machine.

``--set KEY=VALUE`` passes a run-config key to every run, and ``--before-set KEY=VALUE`` one
to the before side's runs after those: with ``--before-commit HEAD``, two settings of one
tree side by side (``--set state-precision=float16 --before-set state-precision=float32``).

Usage::

    python benchmarks/client_overhead.py --data-dir ../shared/data --before-commit <commit>
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

from commit_tree import head_commit, sides, tree_env

from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]


def run(tree: Path, num_clients: int, args: argparse.Namespace, out: Path, sets: list[str]) -> dict:
    env = tree_env(tree)
    cmd = [
        sys.executable, "-m", "pflarena.cli", "run", "--strategy", args.strategy,
        "--dataset", "mnist", "--data-dir", args.data_dir, "--model", "cnn",
        "--partition", "iid", "--num-clients", str(num_clients),
        "--fraction-train", str(args.fraction), "--num-rounds", str(args.rounds),
        "--eval-every", "100000", "--fraction-evaluate", "0.01", "--final-evaluation", "sample",
        "--local-epochs", "1", "--batch-size", "32", "--lr", "0.05", "--seed", "0",
        "--output-dir", str(out), "--quiet",
        *(flag for key_value in sets for flag in ("--set", key_value)),
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{num_clients} clients from {tree}:\n{proc.stderr[-3000:]}")
    rounds = [r for r in read_rounds(out / "rounds.jsonl") if r["round"] >= 2]
    return {
        "round_s": statistics.mean(r["train_time_s"] for r in rounds),
        "clients": statistics.mean(r["train"]["clients"] for r in rounds),
        "solver_s": statistics.mean(r["train"]["client_time_s"] for r in rounds),
        "round0_s": read_rounds(out / "rounds.jsonl")[0]["elapsed_s"],
        "wall_s": time.monotonic() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--strategy", default="ditto")
    parser.add_argument("--few", type=int, default=100)
    parser.add_argument("--many", type=int, default=3550)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before-commit", default="")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a run-config key for both sides' runs (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--before-set", action="append", default=[], metavar="KEY=VALUE",
        help="a run-config key for the before side's runs, after --set's (repeatable): "
        "with --before-commit HEAD, two settings of one tree side by side",
    )  # fmt: skip
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/client_overhead.md"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pflarena-overhead-"))
    trees = sides(args.before_commit, work)
    started = datetime.now(timezone.utc)
    loads = [os.getloadavg()[0]]
    found: dict[tuple[str, int], dict] = {}
    for n in (args.few, args.many):
        for side, tree in trees.items():
            sets = args.set + (args.before_set if side == "before" else [])
            found[side, n] = run(tree, n, args, work / f"{side}-{n}", sets)
            # a 3,550-client Ditto run leaves gigabytes of client state: gone before the next
            shutil.rmtree(work / f"{side}-{n}")
            loads.append(os.getloadavg()[0])
            print(side, n, found[side, n], flush=True)

    def per_client_ms(side: str) -> float:
        few, many = found[side, args.few], found[side, args.many]
        return 1000 * (many["round_s"] - few["round_s"]) / (many["clients"] - few["clients"])

    lines = [
        "# A sampled client's cost beyond its training",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`"
        + (f", before: `{args.before_commit}`" if args.before_commit else "")
        + ".",
        f"- Command: `python benchmarks/client_overhead.py {shlex.join(sys.argv[1:])}`.",
        f"- Machine: {os.cpu_count()} cores, shared with other work: load average (1 min) "
        f"{min(loads):.1f} to {max(loads):.1f} over the runs. Compare sides only within this "
        "table.",
        "",
        f"{args.strategy}, MNIST's CNN, IID, {args.fraction:.0%} of the clients a round (the "
        "same images trained every round at both sizes), 1 local epoch at batch 32, the "
        f"default engine; rounds 2 to {args.rounds} timed. Per client: (round time at "
        f"{args.many} clients - at {args.few}) / (clients a round at {args.many} - at "
        f"{args.few}).",
        "",
        "| side | clients | per round | round s | solvers' time summed, s | round 0 s | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for (side, n), r in found.items():
        lines.append(
            f"| {side} | {n} | {r['clients']:.0f} | {r['round_s']:.1f} | {r['solver_s']:.1f} "
            f"| {r['round0_s']:.1f} | {r['wall_s']:.0f} |"
        )
    lines += ["", "| side | per sampled client, beyond its training |", "|---|---|"]
    lines += [f"| {side} | {per_client_ms(side):.0f} ms |" for side in trees]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
