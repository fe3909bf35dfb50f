"""Which commit a benchmark ran, and an earlier commit's tree to time beside the working tree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def head_commit(tree: Path = ROOT) -> str:
    """``tree``'s checked-out commit, short; ``unknown`` outside a git checkout."""
    found = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return found.stdout.strip() or "unknown"


def export_commit(commit: str, into: Path) -> Path:
    """``commit``'s files (``git archive``) in a new folder ``into``; returns it. The tree
    is run with :func:`tree_env`, so that its ``pflarena`` is imported."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def sides(before_commit: str, work: Path) -> dict[str, Path]:
    """The trees a side-by-side benchmark runs: ``after`` (this working tree), and first
    ``before`` (``before_commit``'s files, exported under ``work``) where one is named."""
    if not before_commit:
        return {"after": ROOT}
    return {"before": export_commit(before_commit, work / "before"), "after": ROOT}


def tree_env(tree: Path) -> dict[str, str]:
    """This environment with ``tree``'s ``pflarena`` imported first by a ``python -m``
    started anywhere: ``PYTHONPATH`` names the tree, and ``PYTHONSAFEPATH`` keeps Python
    from putting the current directory before it. (Without it, a command started from the
    working tree ran the working tree's command-line code, and only the processes it
    started ran the earlier tree's.)"""
    return dict(os.environ, PYTHONPATH=str(tree), PYTHONSAFEPATH="1")
