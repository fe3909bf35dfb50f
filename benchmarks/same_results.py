"""Whether a change left every method's results as they were: each method run from a commit's
tree and from this tree with the same settings, their results compared.

Each method (``--methods``, or every built-in one) runs as a real ``pflarena run`` on the
default engine with ``--workers 2`` (the clients in forked workers, their replies crossing as
parcels), MNIST's CNN (6.6 MB messages: the large-record paths), ``--clients`` clients for
``--rounds`` rounds, once from ``--before-commit``'s tree (``git archive``) and once from this
one. Compared: every ``rounds.jsonl`` record with its timings left out (keys ending in
``_s`` or ``-s``), the checkpoint's arrays (its header, which records times and paths, left
out) and each ``summary.json`` field that is not a time. A run that fails is compared as
well (what it wrote). The table says, per method, whether each is the same, the after run's
status and the accuracy it reached. ``--work`` gives an earlier invocation's folder: the
runs it holds are compared again, the missing ones run.

Usage::

    python benchmarks/same_results.py --before-commit <commit> [--methods ditto fedavg]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from commit_tree import export_commit, head_commit
from scale import method_flags

from pflarena.strategies import declarations

ROOT = Path(__file__).resolve().parents[1]
#: Checkpoint entries that record when and where, not what was learnt.
CHECKPOINT_META = {"header", "checksum"}


def run(tree: Path, method: str, args: argparse.Namespace, out: Path) -> None:
    """``method`` run from ``tree`` into ``out``, unless ``out`` holds a finished run (its
    ``summary.json``: a run that failed, as pFedHN's with these settings, is compared as
    well)."""
    if (out / "summary.json").exists():
        return
    cmd = [
        sys.executable, "-m", "pflarena.cli", "run", "--strategy", method,
        "--dataset", "mnist", "--data-dir", args.data_dir, "--model", "cnn",
        "--partition", "iid", "--num-clients", str(args.clients),
        "--fraction-train", str(args.fraction), "--num-rounds", str(args.rounds),
        "--batch-size", "32", "--seed", "0",
        "--workers", "2", "--output-dir", str(out), "--quiet", *method_flags(method),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if not (out / "summary.json").exists():
        raise RuntimeError(f"{method} from {tree}: exit {proc.returncode}, no summary\n"
                           f"{proc.stderr[-2000:]}")  # fmt: skip


def untimed(value):
    """``value`` without its timings: every key ending in ``_s`` or ``-s`` (seconds; PAGE's
    phase timings are ``client-sgd-time-s`` and the like), at any depth."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if not k.endswith(("_s", "-s"))}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def same_array(a: np.ndarray, b: np.ndarray) -> bool:
    """The same dtype, shape and values, a NaN where the other has one (FedAMP's attention
    matrix is NaN in the rows of clients never sampled)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def compare(before: Path, after: Path) -> dict[str, bool | str]:
    def records(out: Path) -> list:
        return [
            untimed(json.loads(line)) for line in (out / "rounds.jsonl").read_text().splitlines()
        ]

    def summary(out: Path) -> dict:
        return untimed(json.loads((out / "summary.json").read_text()))

    with np.load(before / "checkpoint.npz") as a, np.load(after / "checkpoint.npz") as b:
        names = set(a.files) - CHECKPOINT_META
        same_checkpoint = names == set(b.files) - CHECKPOINT_META and all(
            same_array(a[n], b[n]) for n in names
        )
    evaluated = [r["evaluation"] for r in records(after) if r.get("evaluation")]
    accuracy = (evaluated[-1].get("personalized") or {}).get("mean") if evaluated else None

    def same(a, b) -> bool:  # as JSON text: a NaN equals a NaN
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)

    return {
        "rounds": same(records(before), records(after)),
        "checkpoint": same_checkpoint,
        "summary": same(summary(before), summary(after)),
        "accuracy": "-" if accuracy is None else f"{100 * accuracy:.2f} %",
        "status": json.loads((after / "summary.json").read_text()).get("status", "-"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before-commit", required=True)
    parser.add_argument("--data-dir", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--methods", nargs="*", default=None)
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--fraction", type=float, default=0.1, help="of the clients a round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/same_results.md")
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="an earlier invocation's folder: its finished runs are compared again, not run",
    )
    args = parser.parse_args()
    methods = args.methods or sorted(declarations())
    work = args.work or Path(tempfile.mkdtemp(prefix="pflarena-same-"))
    before = work / "before"
    if not before.exists():
        export_commit(args.before_commit, before)
        (work / "before-commit").write_text(args.before_commit)
    elif (work / "before-commit").read_text().strip() != args.before_commit:
        raise SystemExit(f"{work} holds runs of {(work / 'before-commit').read_text()}")
    rows, started = [], time.monotonic()
    for method in methods:
        try:
            run(before, method, args, work / method / "before")
            run(ROOT, method, args, work / method / "after")
            found = compare(work / method / "before", work / method / "after")
            cells = [
                "same" if found[k] else "**differs**" for k in ("rounds", "checkpoint", "summary")
            ]
            rows.append(
                f"| {method} | {' | '.join(cells)} | {found['status']} | {found['accuracy']} |"
            )
        except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError) as exc:
            problem = str(exc).splitlines()[0][:120]
            rows.append(f"| {method} | **not compared**: {problem} | | | | |")
        print(rows[-1], flush=True)
    lines = [
        "# The same results before and after a change",
        "",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`, "
        f"before: `{args.before_commit}`.",
        f"- Command: `python benchmarks/same_results.py --before-commit {args.before_commit} "
        f"--clients {args.clients} --fraction {args.fraction} --rounds {args.rounds}"
        + (f" --methods {' '.join(args.methods)}" if args.methods else "")
        + (f" --work {args.work}" if args.work else "")
        + "`.",
        f"- {len(methods)} methods in {time.monotonic() - started:.0f} s (runs a `--work` "
        f"folder held already were compared, not run again); runs kept in `{work}`.",
        "",
        f"MNIST's CNN, IID over {args.clients} clients, {args.fraction:.0%} of them a round, "
        f"{args.rounds} rounds, seed 0, two forked "
        "workers. `rounds.jsonl` without timings, the checkpoint's arrays, `summary.json` "
        "without timings; the run's status and the personalized accuracy of its last "
        "evaluation (after).",
        "",
        "| method | rounds.jsonl | checkpoint | summary.json | status (after) | accuracy |",
        "|---|---|---|---|---|---|",
        *rows,
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
