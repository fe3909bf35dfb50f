"""Ray's start on a busy machine: ``simulation.ray_init`` tries again when Ray's node does not
come up within Ray's fixed 30 s, after stopping what the failed attempt started. Fast: Ray's
``init`` is replaced by a stand-in that starts a ``sleep`` (the attempt's processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import ray
from processes import proc_state

from pflarena.runtime import simulation


class FlakyInit:
    """``ray.init`` that fails ``failures`` times with Ray's start-up timeout (each failed
    attempt leaves a child process behind, as Ray's GCS server and raylet would) and then
    succeeds."""

    def __init__(self, failures: int, message: str = "") -> None:
        self.failures = failures
        self.message = message or (
            "The current node timed out during startup. This could happen because some of "
            "the raylet failed to startup or the GCS has become overloaded."
        )
        self.calls: list[dict] = []
        self.children: list[subprocess.Popen] = []

    def __call__(self, **arguments) -> None:
        self.calls.append(arguments)
        if len(self.calls) <= self.failures:
            self.children.append(subprocess.Popen(["sleep", "60"]))
            raise Exception(self.message)


@pytest.fixture
def flaky(monkeypatch):
    def install(failures: int, message: str = "") -> FlakyInit:
        init = FlakyInit(failures, message)
        monkeypatch.setattr(ray, "init", init)
        monkeypatch.setattr(ray, "shutdown", lambda: None)
        return init

    yield install


def _reaped(children: list[subprocess.Popen]) -> list[int]:
    """PIDs among ``children`` still running (each is polled, so a killed one is reaped)."""
    for child in children:
        child.poll()
    return [c.pid for c in children if proc_state(c.pid) is not None]


def test_a_start_up_timeout_is_tried_again_after_stopping_what_it_started(flaky, capsys):
    init = flaky(failures=2)
    try:
        simulation.ray_init(attempts=3, include_dashboard=False)
        assert len(init.calls) == 3 and all(c == {"include_dashboard": False} for c in init.calls)
        assert _reaped(init.children) == [], "a failed attempt's processes were left running"
        err = capsys.readouterr().err
        assert "attempt 1 of 3" in err and "attempt 2 of 3" in err
    finally:
        for child in init.children:
            child.kill()
            child.wait()


def test_the_last_attempts_error_and_any_other_error_are_raised(flaky):
    init = flaky(failures=3)
    try:
        with pytest.raises(Exception, match="timed out during startup"):
            simulation.ray_init(attempts=3)
        assert len(init.calls) == 3
    finally:
        for child in init.children:
            child.kill()
            child.wait()
    other = flaky(failures=1, message="Ray is not installed for this Python")
    try:
        with pytest.raises(Exception, match="not installed"):
            simulation.ray_init(attempts=3)
        assert len(other.calls) == 1, "an error other than the start-up timeout was retried"
    finally:
        for child in other.children:
            child.kill()
            child.wait()


def test_the_processes_of_this_python_are_not_touched(flaky):
    """Only processes the failed attempt started are stopped: one started before stays."""
    before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    init = flaky(failures=1)
    try:
        simulation.ray_init(attempts=2)
        assert proc_state(before.pid) is not None, "a process started before was stopped"
        assert _reaped(init.children) == []
    finally:
        for proc in (before, *init.children):
            proc.kill()
            proc.wait()
