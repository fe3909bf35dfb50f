"""``pflarena local-deploy``'s bad input and its stop by PID, and the ServerApp's prompt reply
polling; fast: the only process started is a ``sleep`` this test owns."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from pflarena.cli import main
from pflarena.deploy import local as deploy
from pflarena.runtime.processes import start_time
from pflarena.server.polling import PromptGrid, prompt_grid


def test_auth_without_tls_is_refused_before_anything_is_written(tmp_path: Path, capsys) -> None:
    root = tmp_path / "dep"
    assert main(["local-deploy", "--num-supernodes", "2", "--auth", "--dir", str(root)]) == 2
    assert "--auth needs --tls" in capsys.readouterr().err
    assert not root.exists()


def test_stop_without_a_deployment_names_the_file(tmp_path: Path, capsys) -> None:
    assert main(["local-deploy", "--stop", "--dir", str(tmp_path)]) == 1
    assert "deployment.json" in capsys.readouterr().err


def test_existing_shards_of_another_size_are_kept(tmp_path: Path, capsys) -> None:
    """A second ``local-deploy`` in the same directory with another number of SuperNodes
    refuses instead of replacing the shards (and starts nothing)."""
    root = tmp_path / "dep"
    assert (
        main(["shards", "--num-clients", "3", "--partition", "iid", "--out", str(root / "shards")])
        == 0
    )
    before = {p.name: p.stat().st_mtime_ns for p in (root / "shards").iterdir()}
    assert main(["local-deploy", "--num-supernodes", "2", "--dir", str(root), "--port", "0"]) == 2
    assert "already holds 3 shards" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in (root / "shards").iterdir()} == before
    assert not (root / "deployment.json").exists()
    assert (
        main(["local-deploy", "--shards-dir", str(root / "shards"), "--num-supernodes", "4"]) == 2
    )
    assert "holds only 3 shards" in capsys.readouterr().err


def test_stop_signals_a_recorded_pid_only_while_it_is_the_same_process(tmp_path: Path) -> None:
    """``--stop`` stops what ``deployment.json`` records by PID, but leaves a PID alone whose
    start time differs from the record (the PID now belongs to another process). Catches a
    stop that signals by PID alone."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        record = {
            "shards": [],
            "tls": False,
            "auth": False,
            "address": "127.0.0.1:1",
            "launcher": None,
            "processes": [
                {"name": "supernode-0", "pid": sleeper.pid, "start_time": 1, "log": "x"},
            ],
        }
        (tmp_path / "deployment.json").write_text(json.dumps(record))
        assert deploy.stop_recorded(tmp_path, grace=1, say=lambda _: None) == 0
        time.sleep(0.3)
        assert sleeper.poll() is None, "a process that is not the recorded one was signalled"
        record["processes"][0]["start_time"] = start_time(sleeper.pid)
        (tmp_path / "deployment.json").write_text(json.dumps(record))
        assert deploy.stop_recorded(tmp_path, grace=5, say=lambda _: None) == 1
        assert sleeper.wait(timeout=10) is not None
        assert not (tmp_path / "deployment.json").exists()
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


class _SlowGrid:
    """A Grid stand-in whose replies become available ``delay`` s after the push."""

    def __init__(self, delay: float) -> None:
        self.delay, self.pushed_at, self.pulls = delay, 0.0, 0
        self.run = "the run"

    def push_messages(self, messages):
        self.pushed_at = time.monotonic()
        return [f"id-{i}" for i, _ in enumerate(messages)]

    def pull_messages(self, ids):
        self.pulls += 1
        if time.monotonic() - self.pushed_at < self.delay:
            return []

        class Reply:
            def __init__(self, mid: str) -> None:
                self.metadata = type("M", (), {"reply_to_message_id": mid})()

        return [Reply(mid) for mid in ids]


def test_prompt_grid_returns_soon_after_the_last_reply() -> None:
    """Replies available 0.3 s after the push are collected within a poll interval, not
    Flower's 3 s; everything else is the wrapped Grid's."""
    grid = _SlowGrid(delay=0.3)
    prompt = PromptGrid(grid, poll=0.05)  # type: ignore[arg-type]
    start = time.monotonic()
    replies = list(prompt.send_and_receive(["a", "b"], timeout=10))
    took = time.monotonic() - start
    assert len(replies) == 2 and took < 1.0, took
    assert prompt.run == "the run"
    slow = _SlowGrid(delay=100)
    start = time.monotonic()
    assert list(PromptGrid(slow, poll=0.05).send_and_receive(["a"], timeout=0.5)) == []  # type: ignore[arg-type]
    assert 0.5 <= time.monotonic() - start < 1.5


def test_prompt_grid_wraps_deployment_grids_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.superlink.grid.http_grid import HttpGrid

    other = object()
    assert prompt_grid(other) is other  # type: ignore[arg-type]
    http = HttpGrid.__new__(HttpGrid)
    wrapped = prompt_grid(http)
    assert isinstance(wrapped, PromptGrid) and wrapped.poll == 0.1
    monkeypatch.setenv("PFLARENA_REPLY_POLL_S", "3")
    assert prompt_grid(http).poll == 3.0
    monkeypatch.setenv("PFLARENA_REPLY_POLL_S", "fast")
    with pytest.raises(ValueError, match="PFLARENA_REPLY_POLL_S"):
        prompt_grid(http)
