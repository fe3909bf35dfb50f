"""Every results file under ``benchmarks/results/`` says what made it: the commit, the command
and the date, near its top, so that a reader can run the same command on the same code (or
see that the file was made with an older version)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"

#: How many lines from the top the three must be found in.
HEAD_LINES = 12

COMMIT = re.compile(r"\bcommit:?\s*`?([0-9a-f]{7,40})\b", re.IGNORECASE)
DATE = re.compile(r"\b20\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])\b")
COMMAND = re.compile(r"\bcommands?\b[^`\n]*`[^`\n]+`", re.IGNORECASE)


def _files() -> list[Path]:
    return sorted(RESULTS.glob("*.md"))


def test_there_are_results_files() -> None:
    assert len(_files()) > 10


@pytest.mark.parametrize("path", _files(), ids=lambda path: path.name)
def test_a_results_file_names_its_commit_command_and_date(path: Path) -> None:
    head = "\n".join(path.read_text(encoding="utf-8").splitlines()[:HEAD_LINES])
    missing = [
        what
        for what, pattern in (
            ("a commit (commit `abc1234`)", COMMIT),
            ("a date (YYYY-MM-DD)", DATE),
            ("a command (command: `...`)", COMMAND),
        )
        if not pattern.search(head)
    ]
    assert not missing, (
        f"{path.name} does not name {', '.join(missing)} in its first {HEAD_LINES} lines; "
        "add a line under its title such as: > Commit `abc1234`, 2026-11-29; command: "
        "`python benchmarks/x.py ...`"
    )


def test_the_check_accepts_the_header_and_refuses_its_absence() -> None:
    header = "> Commit `f19e2e4`, 2026-11-23; command: `make run`."
    assert COMMIT.search(header) and DATE.search(header) and COMMAND.search(header)
    plain = "Command: `make run` on 2 cores."
    assert not COMMIT.search(plain) and not DATE.search(plain) and COMMAND.search(plain)
    assert not COMMIT.search("commit to nothing") and not DATE.search("2026-13-01")
