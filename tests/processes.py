"""Process-tree helpers for tests that start Flower's processes and must stop them by PID."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

__all__ = ["cmdline", "descendants", "kill_tree", "proc_state"]


def proc_state(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a live process, or ``None`` when it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else (fields[0], int(fields[1]))


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def descendants(roots: set[int]) -> set[int]:
    """Live descendants (children, grandchildren, ...) of ``roots``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (state := proc_state(int(entry.name))) is not None:
            children.setdefault(state[1], []).append(int(entry.name))
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_tree(root: int) -> None:
    """SIGKILL ``root`` and every descendant (no chance to clean up), then remove what a
    killed ``pflarena run`` or ``sweep`` leaves in the temporary directory: the simulation
    process's scratch folder (``pflarena-sim-*``, its working directory:
    ``pflarena/runtime/launch.py``) and the command's moments file (``pflarena-phases-*``,
    whose lines name the processes that wrote them: ``pflarena/cli/run.py``)."""
    pids = {root} | descendants({root})
    scratch = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
            if cwd.name.startswith("pflarena-sim-") and cwd.parent == Path(tempfile.gettempdir()):
                scratch.add(cwd)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for folder in scratch:
        shutil.rmtree(folder, ignore_errors=True)
    for phases in Path(tempfile.gettempdir()).glob("pflarena-phases-*"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            first = phases.read_text().split("\n", 1)[0]
            if int(first.split("\t")[1]) in pids:
                phases.unlink()
