"""Process-tree helpers for tests that start Flower's processes and must stop them by PID."""

from __future__ import annotations

from pathlib import Path

__all__ = ["cmdline", "descendants", "proc_state"]


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
