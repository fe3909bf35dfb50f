"""One process at a time in a run directory: an ``fcntl`` lock on ``<run dir>/.lock``.

The ServerApp holds the lock of its output directory for the whole run, so two resumes of
one directory (or a run started into a directory another run is writing) cannot both train:
the second stops at once, naming the process that holds it, and changes nothing. The lock is
the kernel's (``flock``): it goes with the process that holds it, however that process ends,
so a killed run never leaves a stale lock behind. Whoever took the lock removes the file as it
lets go (:func:`remove_lock`), so a finished run's directory holds no ``.lock``.

``pflarena run`` and ``pflarena sweep`` take the locks of their runs' directories themselves
before starting the simulation process (so a second command is refused before any start-up)
and hand them to it (the open file is inherited, and :data:`HELD_ENV` names it); a lock
handed down that way is the same lock, so the ServerApp's own ``flock`` on it succeeds.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path
from typing import IO

__all__ = [
    "HELD_ENV",
    "LOCK_NAME",
    "RunDirectoryInUse",
    "held_locks",
    "lock_run_dir",
    "remove_lock",
]

LOCK_NAME = ".lock"
#: Environment variable of a process started by a holder of run locks: a JSON object
#: ``{run directory: file descriptor}`` of the locks it inherited.
HELD_ENV = "PFLARENA_HELD_LOCKS"


class RunDirectoryInUse(RuntimeError):
    """Another process holds the run directory's lock."""


def _holder(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError:
        return "another process"
    return f"process {text}" if text else "another process"


def lock_run_dir(directory: Path, wait_s: float = 0.0) -> IO[str]:
    """Lock ``directory`` (created if need be) for this process; the open lock file, which
    holds the lock until it is closed or the process ends. Raises
    :class:`RunDirectoryInUse` naming the holder when another process still has it after
    ``wait_s`` seconds."""
    directory = Path(directory).resolve()
    inherited = held_locks().get(str(directory))
    if inherited is not None:
        handle = os.fdopen(inherited, "r+", closefd=False)
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # ours: succeeds
        return handle
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    handle = open(path, "a+")  # noqa: SIM115 - held for the run
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same_file(handle, path):
                break
            # its holder removed the file as it let go (remove_lock): lock the new one
            handle.close()
            handle = open(path, "a+")  # noqa: SIM115
            continue
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.5)
                continue
        handle.close()
        raise RunDirectoryInUse(
            f"run directory {directory} is in use by {_holder(path)}: one process at a time "
            "may run or resume a run there (wait for it to end, or stop it)"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def _same_file(handle: IO[str], path: Path) -> bool:
    """Whether ``path`` still names the file ``handle`` has open."""
    try:
        return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except OSError:
        return False


def remove_lock(handle: IO[str] | None) -> None:
    """Give the lock up and remove its file, so that a finished run's directory holds no
    ``.lock``. The file is removed while still locked: a process waiting for it finds,
    once it has the lock, that the file it locked is gone, and takes a new one
    (:func:`lock_run_dir`)."""
    if handle is None or handle.closed:
        return
    if isinstance(handle.name, str):
        with contextlib.suppress(OSError):
            if _same_file(handle, Path(handle.name)):
                os.unlink(handle.name)
    handle.close()


def held_locks() -> dict[str, int]:
    """The run locks this process inherited (:data:`HELD_ENV`)."""
    with contextlib.suppress(ValueError, TypeError):
        held = json.loads(os.environ.get(HELD_ENV, "{}"))
        if isinstance(held, dict):
            return {str(k): int(v) for k, v in held.items()}
    return {}


def release(handle: IO[str] | None) -> None:
    """Give the lock up (a no-op for one inherited from the launcher, which keeps it)."""
    if handle is not None and not handle.closed:
        inherited = handle.fileno() in held_locks().values()
        if not inherited:
            remove_lock(handle)
