"""An earlier commit's tree, for the benchmarks that time it beside the working tree."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def export_commit(commit: str, into: Path) -> Path:
    """``commit``'s files (``git archive``) in a new folder ``into``; returns it. The tree
    is run with ``PYTHONPATH`` pointing at it, so that its ``pflarena`` is imported."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into
