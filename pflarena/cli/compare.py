"""``pflarena compare``: a Markdown table and a plot of several runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pflarena.reporting.compare import (
    RunArgumentError,
    comparable_runs,
    compare_table,
    differences_markdown,
    expand_runs,
)
from pflarena.reporting.plots import compare_plot

__all__ = ["add_parser", "command"]


def command(args: argparse.Namespace) -> int:
    try:
        named = expand_runs(args.runs)
    except RunArgumentError as error:
        print(f"pflarena compare: error: {error}", file=sys.stderr)
        return 1
    dirs, skipped = comparable_runs(named)
    for reason in skipped:
        print(f"pflarena compare: skipping a run: {reason}", file=sys.stderr)
    if not dirs:
        print("pflarena compare: error: no run to compare", file=sys.stderr)
        return 1
    table = compare_table(dirs)
    differing = differences_markdown(dirs)
    if differing:  # each setting that differs once, with what it means
        table += "\n\n" + differing
    print(table)
    if args.output:
        Path(args.output).write_text(table + "\n")
    plot = compare_plot(dirs, Path(args.plot))
    print(f"\nplot: {plot}")
    return 0


def add_parser(sub: Any, full_help: bool = False) -> None:
    """``pflarena compare``."""
    compare = sub.add_parser("compare", help="a Markdown table and a plot of several runs")
    compare.add_argument(
        "runs",
        nargs="+",
        help="run output directories, sweep folders (every run below them) or globs",
    )
    compare.add_argument("--plot", default="compare.png", help="plot file (default compare.png)")
    compare.add_argument("--output", help="also write the table to this Markdown file")
    compare.set_defaults(func=command)
