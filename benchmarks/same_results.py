"""Whether a change left every method's results as they were: each method run from a commit's
tree and from this tree with the same settings, their results compared.

Each method (``--methods``, or every built-in one) runs as a real ``pflarena run`` on the
default engine with ``--workers 2`` (the clients in forked workers, their replies crossing as
parcels), on ``--dataset`` (MNIST's CNN by default: 6.6 MB messages, the large-record paths;
``digits``: the main job's data and model), ``--clients`` clients for ``--rounds`` rounds,
once from ``--before-commit``'s tree (``git archive``) and once from this one. Compared:
every ``rounds.jsonl`` record with its timings left out (keys ending in ``_s`` or ``-s``),
the checkpoint's arrays (its header, which records times and paths, left out), each
``summary.json`` field that is not a time, and every other CSV and picture the run wrote,
byte for byte (but ``timings.csv`` and ``timings.png``, which are times). A run that fails
is compared as well (what it wrote).

With ``--resume-check``, the before run's directory (a checkpoint the old tree wrote) is
continued by this tree for one more round (``pflarena run --resume DIR --num-rounds R+1``)
and compared, the same way, with this tree's uninterrupted run of R+1 rounds: an old
checkpoint restores to the numbers a run that never stopped reaches.

The table says, per method, whether each is the same, the after run's status and the
accuracy it reached. ``--work`` gives an earlier invocation's folder: the runs it holds are
compared again, the missing ones run.

Usage::

    python benchmarks/same_results.py --before-commit <commit> [--methods ditto fedavg]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from commit_tree import export_commit, head_commit, tree_env
from scale import method_flags

from pflarena.strategies import declarations

ROOT = Path(__file__).resolve().parents[1]
#: Checkpoint entries that record when and where, not what was learnt.
CHECKPOINT_META = {"header", "checksum"}
#: Files of a run directory that record times: not compared.
TIMED_FILES = {"timings.csv", "timings.png"}
#: Metrics of what a process remembered, not of what was learnt: how many of PAGE's client
#: agents were found in the worker's memory (none after a resume, which starts new workers).
PROCESS_KEYS = {"client-agents-in-memory"}


def data_flags(dataset: str, data_dir: str) -> list[str]:
    if dataset == "mnist":
        return ["--dataset", "mnist", "--data-dir", data_dir, "--model", "cnn"]
    return ["--dataset", dataset]


def run(
    tree: Path, method: str, args: argparse.Namespace, out: Path, rounds: int | None = None
) -> None:
    """``method`` run from ``tree`` into ``out``, unless ``out`` holds a finished run (its
    ``summary.json``: a run that failed, as pFedHN's with these settings, is compared as
    well)."""
    if (out / "summary.json").exists():
        return
    cmd = [
        sys.executable, "-m", "pflarena.cli", "run", "--strategy", method,
        *data_flags(args.dataset, args.data_dir),
        "--partition", "iid", "--num-clients", str(args.clients),
        "--fraction-train", str(args.fraction), "--num-rounds", str(rounds or args.rounds),
        "--batch-size", "32", "--seed", "0",
        "--workers", "2", "--output-dir", str(out), "--quiet", *method_flags(method),
    ]  # fmt: skip
    _run(cmd, tree, args, out, method)


def resume(method: str, args: argparse.Namespace, before: Path, out: Path) -> None:
    """The before run's directory, copied to ``out``, continued by this tree for one more
    round."""
    if (out / "summary.json").exists() and (out / "resumed").exists():
        return
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(before, out)
    (out / "summary.json").unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "pflarena.cli", "run", "--resume", str(out),
        "--num-rounds", str(args.rounds + 1), "--workers", "2", "--quiet",
    ]  # fmt: skip
    _run(cmd, ROOT, args, out, method)
    (out / "resumed").write_text("")


def _run(cmd: list[str], tree: Path, args: argparse.Namespace, out: Path, method: str) -> None:
    env = tree_env(tree)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if not (out / "summary.json").exists():
        raise RuntimeError(f"{method} from {tree}: exit {proc.returncode}, no summary\n"
                           f"{proc.stderr[-2000:]}")  # fmt: skip


def untimed(value):
    """``value`` without its timings: every key ending in ``_s`` or ``-s`` (seconds; PAGE's
    phase timings are ``client-sgd-time-s`` and the like), at any depth, and without
    :data:`PROCESS_KEYS`."""
    if isinstance(value, dict):
        return {
            k: untimed(v)
            for k, v in value.items()
            if not k.endswith(("_s", "-s")) and k not in PROCESS_KEYS
        }
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

    def files(out: Path) -> dict[str, bytes]:
        return {
            str(path.relative_to(out)): path.read_bytes()
            for path in sorted(out.rglob("*"))
            if path.suffix in (".csv", ".png") and path.name not in TIMED_FILES
        }

    files_before, files_after = files(before), files(after)
    differing = sorted(
        name
        for name in set(files_before) | set(files_after)
        if files_before.get(name) != files_after.get(name)
    )
    evaluated = [r["evaluation"] for r in records(after) if r.get("evaluation")]
    accuracy = (evaluated[-1].get("personalized") or {}).get("mean") if evaluated else None

    def same(a, b) -> bool:  # as JSON text: a NaN equals a NaN
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)

    return {
        "rounds": same(records(before), records(after)),
        "checkpoint": same_checkpoint,
        "summary": same(summary(before), summary(after)),
        "files": not differing,
        "files-differing": differing,
        "files-count": len(files_after),
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
    parser.add_argument("--dataset", default="mnist", choices=["mnist", "digits"])
    parser.add_argument(
        "--resume-check",
        action="store_true",
        help="continue each before run with this tree for one round, compare with an "
        "uninterrupted run",
    )
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
    keys = ("rounds", "checkpoint", "summary", "files")

    def cells(found: dict) -> str:
        marks = ["same" if found[k] else "**differs**" for k in keys]
        if found["files-differing"]:
            marks[-1] += " (" + ", ".join(found["files-differing"][:4]) + ")"
        else:
            marks[-1] = f"same ({found['files-count']})"
        return " | ".join(marks)

    for method in methods:
        try:
            run(before, method, args, work / method / "before")
            run(ROOT, method, args, work / method / "after")
            found = compare(work / method / "before", work / method / "after")
            row = f"| {method} | {cells(found)} | {found['status']} | {found['accuracy']} |"
            if args.resume_check:
                run(ROOT, method, args, work / method / "longer", rounds=args.rounds + 1)
                resume(method, args, work / method / "before", work / method / "resumed")
                again = compare(work / method / "longer", work / method / "resumed")
                row += f" {cells(again)} |"
            rows.append(row)
        except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError) as exc:
            problem = str(exc).splitlines()[0][:120]
            rows.append(f"| {method} | **not compared**: {problem} | | | | | |")
        print(rows[-1], flush=True)
    header = "| method | rounds.jsonl | checkpoint | summary.json | CSVs, pictures | status (after) | accuracy |"
    rule = "|---|---|---|---|---|---|---|"
    if args.resume_check:
        header += " resumed: rounds.jsonl | checkpoint | summary.json | CSVs, pictures |"
        rule += "---|---|---|---|"
    data = "MNIST's CNN" if args.dataset == "mnist" else f"{args.dataset} (its default model)"
    lines = [
        "# The same results before and after a change",
        "",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`, "
        f"before: `{args.before_commit}`.",
        f"- Command: `python benchmarks/same_results.py --before-commit {args.before_commit} "
        f"--dataset {args.dataset} --clients {args.clients} --fraction {args.fraction} "
        f"--rounds {args.rounds}"
        + (" --resume-check" if args.resume_check else "")
        + (f" --methods {' '.join(args.methods)}" if args.methods else "")
        + (f" --work {args.work}" if args.work else "")
        + "`.",
        f"- {len(methods)} methods in {time.monotonic() - started:.0f} s (runs a `--work` "
        f"folder held already were compared, not run again); runs kept in `{work}`.",
        "",
        f"{data}, IID over {args.clients} clients, {args.fraction:.0%} of them a round, "
        f"{args.rounds} rounds, seed 0, two forked "
        "workers. `rounds.jsonl` without timings, the checkpoint's arrays, `summary.json` "
        "without timings, every other CSV and picture byte for byte (how many were "
        "compared); the run's status and the personalized accuracy of its last "
        "evaluation (after)."
        + (
            f" Resumed: the before run continued by this tree to round {args.rounds + 1}, "
            f"against this tree's uninterrupted run of {args.rounds + 1} rounds."
            if args.resume_check
            else ""
        ),
        "",
        header,
        rule,
        *rows,
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
