"""Whether a change left the main job's leaderboard (``make run``) as it was: the main job run
from a commit's tree and from this tree, their leaderboards and every run compared.

``make run`` is ``pflarena sweep --preset digits-main --strategies local,fedavg,fedavg-ft,
fedprox,ditto,pfedgt``. It runs here once from ``--before-commit``'s tree (``git archive``)
and once from this one; compared are the leaderboard CSVs, every column but the rounds'
seconds, value for value (full precision, not the table's two digits), and each method's
run as ``same_results.py`` compares two runs (``rounds.jsonl`` without timings, the
checkpoint's arrays, ``summary.json`` without timings, the other CSVs and pictures byte for
byte).

Usage::

    python benchmarks/same_leaderboard.py --before-commit <commit> [--work DIR]
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from commit_tree import export_commit, head_commit
from same_results import compare

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = "local,fedavg,fedavg-ft,fedprox,ditto,pfedgt"
#: leaderboard columns that are times
TIMED_COLUMNS = {"rounds s mean"}


def sweep(tree: Path, out: Path) -> None:
    if (out / "leaderboard.csv").exists():
        return
    cmd = [
        sys.executable, "-m", "pflarena.cli", "sweep", "--preset", "digits-main",
        "--strategies", STRATEGIES, "--out", str(out), "--quiet",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True, text=True
    )
    if not (out / "leaderboard.csv").exists():
        raise SystemExit(f"the sweep from {tree} wrote no leaderboard: {proc.stderr[-2000:]}")


def rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return [
            {k: v for k, v in row.items() if k not in TIMED_COLUMNS} for row in csv.DictReader(f)
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before-commit", required=True)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/same_leaderboard.md")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="pflarena-leaderboard-"))
    before_tree = work / "tree"
    if not before_tree.exists():
        export_commit(args.before_commit, before_tree)
    started = time.monotonic()
    sweep(before_tree, work / "before")
    sweep(ROOT, work / "after")
    before, after = (
        rows(work / "before" / "leaderboard.csv"),
        rows(work / "after" / "leaderboard.csv"),
    )
    table = []
    for old, new in zip(before, after, strict=True):
        method = new["method"]
        run = next((work / "after" / "all" / method).glob("seed-*"))
        found = compare(work / "before" / "all" / method / run.name, run)
        cells = ["same" if old == new else "**differs**"] + [
            "same" if found[k] else "**differs**"
            for k in ("rounds", "checkpoint", "summary", "files")
        ]
        table.append(
            f"| {method} | {float(new['pers. mean last mean']) * 100:.2f} | {' | '.join(cells)} |"
        )
    lines = [
        "# The main job's leaderboard before and after a change",
        "",
        f"- Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; commit `{head_commit()}`, "
        f"before: `{args.before_commit}`.",
        f"- Command: `python benchmarks/same_leaderboard.py --before-commit {args.before_commit}`"
        f" ({time.monotonic() - started:.0f} s; runs kept in `{work}`).",
        "",
        "`make run` (the digits-main preset, six methods, 20 rounds) from both trees. Leaderboard: "
        "the CSV row, every column but the rounds' seconds, at full precision; the run: "
        "`rounds.jsonl` and `summary.json` without timings, the checkpoint's arrays, the "
        "other CSVs and pictures byte for byte.",
        "",
        "| method | pers. mean last, % | leaderboard row | rounds.jsonl | checkpoint | "
        "summary.json | CSVs, pictures |",
        "|---|---|---|---|---|---|---|",
        *table,
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
