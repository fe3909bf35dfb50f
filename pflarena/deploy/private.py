"""Directories and files that are the operator's alone, on a host shared with others.

A federation's SuperLink usually runs on a lab server or a cloud VM other people log into.
Everything a deployment keeps on disk is the operator's: credentials, every client's shard,
the clients' state (personal models), checkpoints, results, logs (which name runs and tasks).
The rules, applied by ``pflarena local-deploy``, ``pflarena certs`` and ``pflarena compose``
(``docs/threat-model.md``, "A host shared with others"):

* **Made private** (:func:`private_dir`): a directory pflarena creates is mode 0700, and its
  processes run with umask 077 (:func:`private_umask`), so that every file and directory
  they make below it is the operator's alone (0600 / 0700): shards, state, checkpoints,
  results and logs alike.
* **Refused if another user could have changed it**: an existing directory must belong to
  this user and be writable by nobody else (one that others may only read is tightened to
  0700, and the command says so); every directory above it must belong to this user or root
  and be writable by others only with the sticky bit (``/tmp`` is fine; a group-writable
  project folder is not: another member could rename the deployment away and put theirs in
  its place), and no symbolic link on the way may belong to another user. The error names
  the path, the owner or mode at fault and how to fix it.

Credentials are checked one by one where they are made (:mod:`pflarena.deploy.certs`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

from pflarena.deploy.errors import DeploymentError

__all__ = [
    "PRIVATE_UMASK",
    "check_ancestors",
    "check_owned",
    "describe_owner",
    "private_dir",
    "private_files",
    "private_umask",
    "readable_by_others",
]

#: The umask of every process of a deployment: files 0600, directories 0700.
PRIVATE_UMASK = 0o077


def private_umask() -> int:
    """Make what this process (and every child it starts) creates the user's alone; returns
    the previous umask. For a process's main, just before it serves; a command that may run
    inside another program uses :func:`private_files`."""
    return os.umask(PRIVATE_UMASK)


@contextlib.contextmanager
def private_files() -> Iterator[None]:
    """Within the block, what this process creates is the user's alone (umask 077); the
    umask it had is restored after it (a command called in-process leaves it as it was)."""
    previous = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def describe_owner(uid: int) -> str:
    """``name (uid N)``, or ``uid N`` for a uid with no account."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _trusted_owner(uid: int) -> bool:
    return uid in (0, os.geteuid())


def check_ancestors(path: str | Path) -> None:
    """Refuse ``path`` if a directory above it could be changed by another user (the module
    docstring): owned by someone other than this user or root, or writable by group or
    others without the sticky bit; or if a symbolic link on the way belongs to another user.

    Raises
    ------
    DeploymentError
        Naming the directory or link, what is wrong with it, and how to fix it.
    """
    absolute = Path(os.path.abspath(path))
    # Links on the path as given: one that another user owns could be pointed elsewhere.
    for prefix in [*reversed(absolute.parents), absolute]:
        try:
            info = prefix.lstat()
        except FileNotFoundError:
            break
        if stat.S_ISLNK(info.st_mode) and not _trusted_owner(info.st_uid):
            raise DeploymentError(
                f"{prefix} is a symbolic link owned by {describe_owner(info.st_uid)}, who can "
                f"point it elsewhere: give the real path of {path} instead"
            )
    resolved = absolute.resolve()
    for parent in reversed(resolved.parents):
        try:
            info = parent.stat()
        except FileNotFoundError:
            break  # made later, by us
        if not _trusted_owner(info.st_uid):
            raise DeploymentError(
                f"{parent}, above {path}, belongs to {describe_owner(info.st_uid)}, who could "
                "replace what is inside it: choose a directory outside it"
            )
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            who = "others" if info.st_mode & 0o002 else "its group"
            raise DeploymentError(
                f"{parent}, above {path}, is writable by {who} (mode "
                f"{stat.S_IMODE(info.st_mode):04o}) without the sticky bit, so another user "
                f"could rename {path} away and put theirs in its place: choose a directory "
                f"outside it, or `chmod go-w {parent}`"
            )


def check_owned(path: str | Path, what: str, *, private: bool = False) -> os.stat_result:
    """``path``'s status after checking it is this user's and writable by no one else (and,
    with ``private``, readable by no one else): not a symbolic link.

    Raises
    ------
    DeploymentError
        Naming ``what`` and the path, what is wrong, and how to fix it.
    """
    info = Path(path).lstat()
    if stat.S_ISLNK(info.st_mode):
        raise DeploymentError(
            f"{what} {path} is a symbolic link: pflarena uses only files it can check; "
            "put the file itself there"
        )
    if info.st_uid != os.geteuid():
        raise DeploymentError(
            f"{what} {path} belongs to {describe_owner(info.st_uid)}, not to you "
            f"({describe_owner(os.geteuid())}): pflarena does not use what another user could "
            "have planted; remove it (or choose another directory) and run again"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        raise DeploymentError(
            f"{what} {path} is writable by others (mode {mode:04o}), so anyone could have "
            "changed it: remove it to have a new one made"
        )
    if private and mode & 0o077:
        raise DeploymentError(
            f"{what} {path} is readable by others (mode {mode:04o}), so it may no longer be "
            "secret: remove it to have a new one made"
        )
    return info


def readable_by_others(directory: str | Path) -> Path | None:
    """``directory`` if other users (its group or anyone) can open a file in it (it lets
    them in, and a file lets them read), else None."""
    directory = Path(directory)
    try:
        if not stat.S_IMODE(directory.stat().st_mode) & 0o011:
            return None
        for child in directory.iterdir():
            if child.is_file() and stat.S_IMODE(child.stat().st_mode) & 0o044:
                return directory
    except OSError:
        return None
    return None


def private_dir(path: str | Path, what: str = "deployment directory", say=None) -> Path:
    """The absolute, resolved ``path``, a directory that is this user's alone: created with
    mode 0700 (and any missing parents likewise), or checked if it exists (this user's,
    writable by no one else; readable by others: tightened to 0700, saying so through
    ``say``). Its ancestors are checked first (:func:`check_ancestors`).

    Raises
    ------
    DeploymentError
        ``path`` or a directory above it could be changed by another user, or ``path`` is
        not a directory.
    """
    check_ancestors(path)
    resolved = Path(os.path.abspath(path)).resolve()
    missing = []
    for candidate in [resolved, *resolved.parents]:
        if candidate.exists():
            break
        missing.append(candidate)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
            os.mkdir(directory, 0o700)
    if not resolved.is_dir():
        raise DeploymentError(f"{what} {resolved} exists and is not a directory")
    info = check_owned(resolved, what)
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        os.chmod(resolved, 0o700)
        if say is not None:
            say(f"{what} {resolved} was readable by others (mode {mode:04o}): made it 0700")
    return resolved
