"""The run directory's lock file is removed when its holder lets go, without letting two
processes hold the lock at once (pflarena/server/runlock.py)."""

from __future__ import annotations

import threading

import pytest

from pflarena.server.runlock import LOCK_NAME, RunDirectoryInUse, lock_run_dir, remove_lock


def test_a_released_lock_leaves_no_file(tmp_path):
    handle = lock_run_dir(tmp_path)
    assert (tmp_path / LOCK_NAME).exists()
    remove_lock(handle)
    assert not (tmp_path / LOCK_NAME).exists()
    remove_lock(lock_run_dir(tmp_path))  # and it can be taken again


def test_a_waiter_on_a_removed_file_takes_the_live_one(tmp_path):
    """Catches the removal race: a process waiting on the file its holder removes would get
    the lock of a file no one else sees, and a third process could lock the new file."""
    holder = lock_run_dir(tmp_path)
    taken: list = []
    waiter = threading.Thread(target=lambda: taken.append(lock_run_dir(tmp_path, wait_s=20)))
    waiter.start()
    threading.Event().wait(1.0)  # the waiter has opened the file and waits for its lock
    remove_lock(holder)
    waiter.join(30)
    assert taken, "the waiter never got the lock"
    assert (tmp_path / LOCK_NAME).exists()
    with pytest.raises(RunDirectoryInUse):
        lock_run_dir(tmp_path)
    remove_lock(taken[0])
