"""How much client state a run leaves on disk, and how many versions each client holds.

A stateful method keeps a version of its state per accepted train message
(``pflarena/client/state.py``): the accepted one, the one the last message wrote, and, where
the run's last checkpoint is older, the checkpoint's. Each version of a method that stores a
whole model (Ditto's personal model: 6.6 MB for MNIST's CNN) is a file of that size, so the
number of versions a client keeps is the run's disk footprint over a long run.

Each run is a real ``pflarena run`` on the default engine (MNIST, IID, the CNN), long enough
that every client trains several times. After it: the bytes under ``client-state`` (each
file counted once, hard links included, as ``du`` does), the versions per client (mean and
most), and the rounds' mean time (rounds 2 on). With ``--before-commit`` the same run is
made from that commit's tree too, before and after alternating, side by side on one machine.

Usage::

    python benchmarks/state_retention.py --data-dir ../shared/data --before-commit <commit>
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from commit_tree import head_commit, sides, tree_env

from pflarena.server.results import read_rounds

ROOT = Path(__file__).resolve().parents[1]


def state_on_disk(folder: Path) -> tuple[int, list[int]]:
    """Bytes of the files under ``folder`` (an inode once), and each client's version count."""
    seen: set[int] = set()
    size = 0
    versions = []
    for client in sorted(folder.glob("*/client-*")):
        versions.append(sum(1 for v in client.iterdir() if v.name[:1] == "v"))
        for path in client.rglob("*"):
            info = path.lstat()
            if stat.S_ISREG(info.st_mode) and info.st_ino not in seen:
                seen.add(info.st_ino)
                size += info.st_size
    return size, versions


def run(tree: Path, args: argparse.Namespace, out: Path) -> dict:
    env = tree_env(tree)
    cmd = [
        sys.executable, "-m", "pflarena.cli", "run", "--strategy", args.strategy,
        "--dataset", "mnist", "--data-dir", args.data_dir, "--model", "cnn",
        "--partition", "iid", "--num-clients", str(args.clients),
        "--fraction-train", str(args.fraction), "--num-rounds", str(args.rounds),
        "--local-epochs", "1", "--batch-size", "32", "--lr", "0.05", "--seed", "0",
        "--set", f"checkpoint-every={args.checkpoint_every}",
        "--output-dir", str(out), "--quiet",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{tree}:\n{proc.stderr[-3000:]}")
    size, versions = state_on_disk(out / "client-state")
    records = read_rounds(out / "rounds.jsonl")
    rounds = [r for r in records if r["round"] >= 2]
    return {
        "bytes": size,
        "versions_mean": statistics.mean(versions),
        "versions_max": max(versions),
        "clients": len(versions),
        "round_s": statistics.mean(r["train_time_s"] for r in rounds),
        "accuracy": records[-1]["evaluation"]["personalized"]["mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--strategy", default="ditto")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--checkpoint-every", type=int, default=1)
    parser.add_argument("--before-commit", default="")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/state_retention.md"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pflarena-retention-"))
    trees = sides(args.before_commit, work)
    started = datetime.now(timezone.utc)
    found = {}
    for side, tree in trees.items():
        found[side] = run(tree, args, work / side)
        print(side, found[side], flush=True)
        shutil.rmtree(work / side)  # gigabytes of client state

    lines = [
        "# Client state left on disk",
        "",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`"
        + (f", before: `{args.before_commit}`" if args.before_commit else "")
        + ".",
        f"- Command: `python benchmarks/state_retention.py {shlex.join(sys.argv[1:])}`.",
        f"- Machine: {os.cpu_count()} cores, shared with other work. Compare sides only within "
        "this table.",
        "",
        f"{args.strategy}, MNIST's CNN, IID, {args.clients} clients, {args.fraction:.0%} a round, "
        f"{args.rounds} rounds, checkpoint every {args.checkpoint_every}, the default engine. "
        "State: the bytes under `client-state` at the end (a file once however many versions "
        "link it); versions: per client.",
        "",
        "| side | state on disk | per client | versions, mean | versions, most | round s "
        "| personalized accuracy |",
        "|---|---|---|---|---|---|---|",
    ]
    for side, r in found.items():
        lines.append(
            f"| {side} | {r['bytes'] / 1e6:.0f} MB | {r['bytes'] / r['clients'] / 1e6:.1f} MB "
            f"| {r['versions_mean']:.2f} | {r['versions_max']} | {r['round_s']:.1f} "
            f"| {100 * r['accuracy']:.2f} % |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
