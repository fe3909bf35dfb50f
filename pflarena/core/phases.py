"""Where a run's time goes, from the command's start: named moments that every process of a
run appends to one file, and the table they make.

``pflarena run`` names a file in :data:`PHASES_ENV` (or uses the one the caller named) and
the processes it starts inherit it; each moment (``torch imported``, ``round 0 evaluated``)
is one line, ``<epoch seconds>\\t<pid>\\t<name>``, appended by :func:`mark`, a few
microseconds each, and nothing where the variable is unset. :func:`process_start` says when
a process started (Linux's ``/proc``), so that the command's first moment is its process's
start, before Python and the imports, not the first line of pflarena that runs.

Standard library only: the command line imports it before anything else.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["PHASES_ENV", "mark", "phase_rows", "phase_table", "process_start", "read_marks"]

#: The file the processes of a run append their moments to.
PHASES_ENV = "PFLARENA_PHASES"

#: When this module was imported: a process's start where ``/proc`` cannot tell.
_IMPORTED_AT = time.time()


def process_start(pid: int | str = "self") -> float:
    """When process ``pid`` started, in seconds since the epoch: its start in clock ticks
    since boot (``/proc/PID/stat``) against the seconds since boot (``/proc/uptime``), both
    to a hundredth of a second. Where ``/proc`` is not there, when this module was
    imported."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        started = int(stat[stat.rindex(")") + 2 :].split()[19]) / os.sysconf("SC_CLK_TCK")
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT
    return time.time() - max(0.0, uptime - started)


def mark(name: str, at: float | None = None) -> None:
    """Note that ``name`` happened now (or at ``at``, seconds since the epoch), if the
    processes' moments are being recorded (:data:`PHASES_ENV`)."""
    path = os.environ.get(PHASES_ENV)
    if not path:
        return
    line = f"{time.time() if at is None else at:.6f}\t{os.getpid()}\t{name}\n"
    try:
        # one write in append mode: the lines of several processes do not interleave
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # a measurement only: never a reason for a run to fail


def read_marks(path: str | Path) -> list[tuple[float, int, str]]:
    """The moments in ``path``, in time order; of each name the first (a forked worker
    building data the run's process built too notes nothing new)."""
    marks = []
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    for line in text.splitlines():
        parts = line.split("\t", 2)
        if len(parts) != 3:
            continue
        try:
            marks.append((float(parts[0]), int(parts[1]), parts[2]))
        except ValueError:
            continue
    seen: set[str] = set()
    first = []
    for at, pid, name in sorted(marks):
        if name not in seen:
            seen.add(name)
            first.append((at, pid, name))
    return first


def phase_rows(marks: list[tuple[float, int, str]], start: float) -> list[tuple[str, float, float]]:
    """``(moment, seconds since the one before, seconds since start)`` for each moment at or
    after ``start``."""
    rows = []
    previous = start
    for at, _, name in marks:
        if at < start:
            continue
        rows.append((name, at - previous, at - start))
        previous = at
    return rows


def phase_table(marks: list[tuple[float, int, str]], start: float) -> str:
    """The moments as a table: each one's phase (the time since the one before) and its
    time since the command started."""
    rows = phase_rows(marks, start)
    if not rows:
        return ""
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{'phase ends with':{width}}  phase s   at s"]
    lines += [f"{name:{width}}  {phase:7.2f}  {at:5.2f}" for name, phase, at in rows]
    return "\n".join(lines)
