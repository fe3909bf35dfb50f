"""``pflarena local-deploy``'s bad input, its stop by PID and its GPUs (the environment each
process would start with, nothing started), and the ServerApp's prompt reply polling; fast:
the only process started is a ``sleep`` this test owns."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pflarena.cli import main
from pflarena.deploy import local as deploy
from pflarena.runtime.processes import Supervised, start_time
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


# --------------------------------------------------------------------------- --gpus
GPU_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass
class _Unstarted(Supervised):
    """What :meth:`LocalDeployment._spawn` would start, not started: ``up`` says whether it
    counts as running; a signal only marks it down (it has no process to signal)."""

    up: bool = False

    def alive(self) -> bool:
        return self.up

    def send(self, signum: int) -> None:
        self.up = False


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str], dict[str, str]]]:
    """Every (name, command, environment) a LocalDeployment spawns in this test, in order;
    nothing is started."""
    seen: list[tuple[str, list[str], dict[str, str]]] = []

    def spawn(cls, name, cmd, log, env, cwd, **_: object) -> Supervised:
        seen.append((name, list(cmd), dict(env)))
        return _Unstarted(name, list(cmd), log)

    monkeypatch.setattr(Supervised, "spawn", classmethod(spawn))
    monkeypatch.setattr(deploy.LocalDeployment, "wait_healthy", lambda self, timeout=60.0: None)
    return seen


def _shard_files(root: Path, count: int) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"client_{i:04d}.npz" for i in range(count)]
    for path in paths:
        path.write_bytes(b"")  # the deployment checks that they exist; nothing reads them
    return paths


def _gpu_of(spawned, name: str) -> str | None:
    """The CUDA_VISIBLE_DEVICES of the last process spawned as ``name``."""
    envs = [env for spawned_name, _, env in spawned if spawned_name == name]
    assert envs, f"{name} was never spawned: {[n for n, _, _ in spawned]}"
    return envs[-1].get(GPU_ENV)


def test_gpus_pin_each_executor_and_hide_them_from_the_rest(
    tmp_path: Path, spawned, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``gpus``, SuperNode i's ClientApp executor runs with CUDA_VISIBLE_DEVICES
    gpus[i % len(gpus)]; the SuperLink, its ServerApp executor and every SuperNode with an
    empty one, whatever this process's is. The record keeps the ids: a deployment read back
    from it gives a SuperNode it starts the same GPU, and supervise() restarts an executor on
    its GPU. Catches a pin on the SuperNode instead of its executor, a pin that follows the
    operator's variable, and a restart or later start that loses the GPU."""
    monkeypatch.setenv(GPU_ENV, "0,1,2,3")
    gpus = ["1", "GPU-5f0a"]  # fewer than the SuperNodes: shared round-robin
    dep = deploy.LocalDeployment(
        tmp_path / "dep", _shard_files(tmp_path / "shards", 3), gpus=[" 1", "GPU-5f0a"]
    )
    later = None
    try:
        dep.start_superlink()
        for index in range(3):
            dep.start_supernode(index)
        assert dep.gpus == gpus
        for index in range(3):
            assert _gpu_of(spawned, f"executor-supernode-{index}") == gpus[index % 2]
            assert _gpu_of(spawned, f"supernode-{index}") == ""
        assert _gpu_of(spawned, "superlink") == _gpu_of(spawned, "executor-superlink") == ""
        executor = next(cmd for name, cmd, _ in spawned if name == "executor-supernode-0")
        assert "executor" in executor and GPU_ENV not in " ".join(executor)

        state = json.loads((dep.root / "deployment.json").read_text())
        assert state["gpus"] == gpus
        assert state["executor_gpus"] == {f"executor-supernode-{i}": gpus[i % 2] for i in range(3)}
        later = deploy.LocalDeployment.from_record(dep.root)
        assert (later.gpus, later.executor_gpus) == (dep.gpus, dep.executor_gpus)
        later.start_supernode(1, name="replacement")  # another node on shard 1
        assert _gpu_of(spawned, "executor-replacement") == gpus[1]
        assert _gpu_of(spawned, "replacement") == ""
        assert json.loads((dep.root / "deployment.json").read_text())["executor_gpus"] == {
            **{f"executor-supernode-{i}": gpus[i % 2] for i in range(3)},
            "executor-replacement": gpus[1],
        }

        # supernode-1 exited long after its start: it and its executor are started again;
        # supernode-2 runs but its executor exited: the executor alone is.
        nodes = {p.name: p for p in [*dep.supernodes, *dep.executors]}
        dep._spawned_at["supernode-1"] = time.monotonic() - 1000
        nodes["supernode-2"].up = True  # type: ignore[attr-defined]
        before = len(spawned)
        restarted = dep.supervise(say=lambda _: None)
        assert sorted(restarted) == ["executor-supernode-2", "supernode-1"]
        again = {name: env.get(GPU_ENV) for name, _, env in spawned[before:]}
        assert again == {
            "supernode-1": "",
            "executor-supernode-1": gpus[1],
            "executor-supernode-2": gpus[0],
        }
    finally:
        dep.stop(grace=0)
        if later is not None:
            later.stop(grace=0)


def test_without_gpus_every_process_keeps_the_operators_variable(
    tmp_path: Path, spawned, monkeypatch
) -> None:
    """No ``gpus``: nothing about GPUs changes (each process inherits this one's
    CUDA_VISIBLE_DEVICES, or has none), and the record says so."""
    monkeypatch.setenv(GPU_ENV, "3")
    dep = deploy.LocalDeployment(tmp_path / "dep", _shard_files(tmp_path / "shards", 1))
    try:
        dep.start_superlink()
        dep.start_supernode(0)
        assert {name: env.get(GPU_ENV) for name, _, env in spawned} == dict.fromkeys(
            ["superlink", "executor-superlink", "supernode-0", "executor-supernode-0"], "3"
        )
        state = json.loads((dep.root / "deployment.json").read_text())
        assert state["gpus"] is None and state["executor_gpus"] == {}
        assert deploy.LocalDeployment.from_record(dep.root).gpus is None
    finally:
        dep.stop(grace=0)


@pytest.mark.parametrize("gpus", ["0,0", "", "0,,1", " , "])
def test_bad_gpus_are_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, capsys, gpus: str
) -> None:
    root = tmp_path / "dep"
    assert main(["local-deploy", "--num-supernodes", "2", "--gpus", gpus, "--dir", str(root)]) == 2
    err = capsys.readouterr().err
    assert "--gpus must be distinct, non-empty device ids" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not root.exists()
    with pytest.raises(deploy.DeploymentError, match="--gpus must be distinct"):
        deploy.LocalDeployment(root, _shard_files(tmp_path / "shards", 2), gpus=gpus.split(","))


def test_local_deploy_hands_its_gpus_to_the_deployment(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pflarena local-deploy --gpus`` builds the deployment with those ids and says which
    SuperNode's executor sees which GPU before it starts anything."""
    from pflarena.cli import deploy as cli_deploy

    shards = _shard_files(tmp_path / "shards", 3)
    monkeypatch.setattr(cli_deploy, "_shards_for", lambda args, root: shards)
    built: list[deploy.LocalDeployment] = []

    def start(self: deploy.LocalDeployment, **_: object) -> None:
        built.append(self)
        raise KeyboardInterrupt  # what Ctrl-C does: the command stops what it started

    monkeypatch.setattr(deploy.LocalDeployment, "start", start)
    root = tmp_path / "dep"
    assert main(["local-deploy", "--num-supernodes", "3", "--gpus", "2,3", "--dir", str(root)]) == 0
    (dep,) = built
    assert dep.gpus == ["2", "3"]
    out = capsys.readouterr().out
    assert "supernode-0 GPU 2, supernode-1 GPU 3, supernode-2 GPU 2" in out, out
