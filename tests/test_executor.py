"""The warm ClientApp executor (``pflarena executor``) and ``pflarena supernode --idle-poll``.

Fast tests check the pieces against the pinned flwr and against independent computations: the
Flower internals both rely on are present (and a missing one is named), the FAB-versus-parent
code comparison, the FAB install reuse, the SuperNode's idle clock. The slow ones run a real
loopback deployment (a SuperLink, two SuperNodes with ``--isolation process``, one warm
executor each) with the ``fault-avg`` plug-in (``tests/pflarena_fault_methods.py``), whose
clients crash, are killed, hang and run out of memory on purpose.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pflarena.core.config import parse_run_config, toml_value
from pflarena.core.federation import build_federation
from pflarena.core.shard_format import write_shards
from pflarena.deploy import executor as warm
from pflarena.deploy import local, supernode
from pflarena.deploy.local import CONNECTION, LocalDeployment
from pflarena.runtime.appdir import flwr_run_dir
from pflarena.server.results import read_rounds

TESTS_DIR = Path(__file__).resolve().parent


# --------------------------------------------------------------------------- Flower internals
def test_the_pinned_flower_has_what_the_executor_and_supernode_patch() -> None:
    warm.check_flower_internals()
    module = supernode.check_loop_waits()
    assert inspect.getsource(module).count("time.sleep(3)") == 1


def test_a_moved_internal_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.supernode.runtime import run_clientapp

    monkeypatch.delattr(run_clientapp, "install_from_fab")
    with pytest.raises(warm.FlowerInternalsChanged, match=r"run_clientapp\.install_from_fab"):
        warm.check_flower_internals()


def test_a_changed_supernode_loop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    source = inspect.getsource(supernode.check_loop_waits())
    monkeypatch.setattr(
        inspect, "getsource", lambda _: source.replace("time.sleep(3)", "time.sleep(2)")
    )
    with pytest.raises(RuntimeError, match=r"0 `time.sleep\(3\)`"):
        supernode.check_loop_waits()


# --------------------------------------------------------------------------- the app's code
def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_parent_serves_a_fab_only_with_identical_code(tmp_path: Path) -> None:
    files = {"pkg/__init__.py": "", "pkg/client/app.py": "app = 1\n", "pkg/core/x.py": "y = 2\n"}
    parent = _package(tmp_path / "parent", files)
    preloaded = warm.Preloaded("pkg.client.app", "pkg", warm.package_digest(parent / "pkg"))
    same = _package(tmp_path / "fab-same", files | {"pyproject.toml": "", "README.md": "x"})
    assert preloaded.serves(same, "pkg.client.app")
    changed = _package(tmp_path / "fab-changed", files | {"pkg/core/x.py": "y = 3\n"})
    assert not preloaded.serves(changed, "pkg.client.app")
    added = _package(tmp_path / "fab-added", files | {"pkg/core/z.py": ""})
    assert not preloaded.serves(added, "pkg.client.app")
    assert not preloaded.serves(same, "other.client:app")  # another package
    assert not preloaded.serves(tmp_path / "empty", "pkg.client.app")


def test_forget_makes_the_next_import_read_the_files_again(tmp_path: Path, monkeypatch) -> None:
    _package(tmp_path, {"warmpkg/__init__.py": "", "warmpkg/mod.py": "VALUE = 1\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    import warmpkg.mod

    assert warmpkg.mod.VALUE == 1
    (tmp_path / "warmpkg" / "mod.py").write_text("VALUE = 2\n")
    preloaded = warm.Preloaded("warmpkg.mod", "warmpkg")
    preloaded.forget()
    assert "warmpkg" not in sys.modules and "warmpkg.mod" not in sys.modules
    import warmpkg.mod as again

    assert again.VALUE == 2


def test_an_installed_fab_is_reused_by_content(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    installs: list[bytes] = []

    def install(fab: bytes, install_dir=None, skip_prompt=False) -> Path:
        installs.append(fab)
        target = tmp_path / "home" / "apps" / f"app-{len(installs)}"
        target.mkdir(parents=True)
        (target / "pyproject.toml").write_text("")
        return target

    reuse = warm._reuse_installed_fab(install)
    first = reuse(b"fab one")
    assert reuse(b"fab one") == first and installs == [b"fab one"]
    second = reuse(b"fab two")
    assert second != first and installs == [b"fab one", b"fab two"]
    shutil.rmtree(first)  # gone from disk: installed again
    assert reuse(b"fab one") != first and len(installs) == 3


# --------------------------------------------------------------------------- a deployment
@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("warm")
    cfg = parse_run_config({"num-clients": "2"})
    spec = cfg.federation_spec()
    shards = write_shards(build_federation(spec), root / "shards", spec)
    env = {
        "PFLARENA_PLUGINS": "pflarena_fault_methods",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")])),
        warm.TASK_TIMEOUT_ENV: "40",
        warm.TASK_MEMORY_ENV: "1024",
        "PFLARENA_REPLY_POLL_S": "0.5",
        "PFLARENA_FAB_MARKER": str(root / "fab-imports.txt"),
        "PFLARENA_FAULT_PLAN": str(root / "fault-plan.txt"),
    }
    dep = LocalDeployment(root / "dep", shards, env=env, task_poll=0.2, idle_poll=0.5)
    dep.start(wait_s=240)
    try:
        yield dep
    finally:
        dep.stop()


def _executors(dep: LocalDeployment) -> dict[str, int]:
    """The SuperNodes' ClientApp executors (the SuperLink's ServerApp executor aside)."""
    executors = {p.name: p.pid for p in dep.executors if p.name != "executor-superlink"}
    assert sorted(executors) == ["executor-supernode-0", "executor-supernode-1"]
    return executors


def _run(dep: LocalDeployment, out: Path, app: Path, plan: str = "", **config) -> list[dict]:
    """``flwr run`` of ``fault-avg`` on the deployment with the fault ``plan``; its rounds."""
    Path(dep.env["PFLARENA_FAULT_PLAN"]).write_text(plan)
    run_config = {
        "strategy": "fault-avg",
        "shards-dir": str(dep.shards[0].parent),
        "num-clients": 2,
        "eval-every": 100,
        "round-timeout": 200.0,
        "output-dir": str(out),
    } | config
    overrides = out.parent / f"{out.name}.toml"
    overrides.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in run_config.items()))
    done = subprocess.run(
        ["flwr", "run", str(app), CONNECTION, "--run-config", str(overrides), "--stream"],
        env=dep.cli_env(), cwd=dep.cli_home, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert (out / "summary.json").exists(), done.stdout[-3000:] + done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed", (summary, done.stdout[-3000:])
    return read_rounds(out / "rounds.jsonl")


def _log_path(dep: LocalDeployment, name: str) -> Path:
    return dep.root / "logs" / f"{name}.log"


def _log_size(dep: LocalDeployment, name: str) -> int:
    """How many bytes the process ``name`` has logged so far (where its log resumes)."""
    return _log_path(dep, name).stat().st_size


def _log(dep: LocalDeployment, name: str, start: int = 0) -> str:
    """The log of the process ``name``, from byte ``start`` on."""
    with _log_path(dep, name).open("rb") as log:
        log.seek(start)
        return log.read().decode(errors="replace")


@pytest.mark.slow
def test_faulty_children_cost_their_message_only(
    deployment: LocalDeployment, tmp_path: Path
) -> None:
    """Client 0 crashes in round 1, client 1 hangs past the task timeout in round 2, client 0
    runs out of memory in round 3, client 1 is SIGKILLed in round 4: each round records that
    one failure, every other client and round succeeds, and the executors are the same
    processes at the end (nothing restarted them)."""
    before = _executors(deployment)
    names = sorted(before)
    start = {name: _log_size(deployment, name) for name in names}
    plan = "crash@0:1,hang@1:2,memory@0:3,kill@1:4"
    rounds = _run(
        deployment, tmp_path / "faults", flwr_run_dir(tmp_path / "app"), plan, **{"num-rounds": 5}
    )
    failed = {r["round"]: r["train"]["failures"] for r in rounds if "train" in r}
    assert failed == {1: 1, 2: 1, 3: 1, 4: 1, 5: 0}, rounds
    for record, client in zip(rounds[1:5], (0, 1, 0, 1), strict=True):
        assert [p["client"] for p in record["train"]["problems"]] == [client], record
    assert _executors(deployment) == before
    assert all(p.alive() for p in [*deployment.supernodes, *deployment.executors])
    assert deployment.supervise() == []
    # Only what this run caused: the logs written since it started (an earlier test's hung
    # child may still be replied for in them), and the children its own rounds name.
    logs = "".join(_log(deployment, name, start[name]) for name in names)
    problems = {r["round"]: r["train"]["problems"][0]["problem"] for r in rounds[1:5]}
    replied = dict(re.findall(r"replied for it: ClientApp process (\d+) (.*)", logs))
    # The crashed, hung and killed children were replied for by their parent (not left to
    # the task heartbeat's expiry), each reply naming its child; the out-of-memory one
    # raised and replied itself.
    children = {}
    for server_round in (1, 2, 4):
        named = re.search(r"ClientApp process (\d+)", problems[server_round])
        assert named and named[1] in replied, (problems[server_round], replied)
        children[server_round] = replied[named[1]]
    assert children[1] == "exit 70", children  # crash: os._exit(70)
    assert children[2].endswith("(past --task-timeout 40s)"), children  # hang
    assert children[4].startswith(f"killed by signal {signal.SIGKILL.value}"), children
    assert "ClientApp process" not in problems[3] and "MemoryError" in logs, problems


@pytest.mark.slow
def test_a_client_past_the_round_timeout_costs_only_itself(
    deployment: LocalDeployment, tmp_path: Path
) -> None:
    """Deployment: client 0 hangs in round 1 (its child is ended only by the 40 s task
    timeout), the round timeout is 10 s. Round 1 ends at its timeout with client 0 recorded
    as not having replied and client 1 as a success; client 1 succeeds in round 2 too, while
    client 0's node may still be busy with the hung child (then client 0 alone fails again).
    The round ends at its own timeout, not the child's. Once the hung child is killed (its
    node ended its task at the round timeout, revoking its token), its executor is still the
    same process: replying for the child with a revoked token must not stop the executor
    (Flower's retry invoker answers a 401 with SIGINT to its own process)."""
    before = _executors(deployment)
    start = _log_size(deployment, "executor-supernode-0")
    rounds = _run(
        deployment,
        tmp_path / "slow",
        flwr_run_dir(tmp_path / "app"),
        "hang@0:1",
        **{"num-rounds": 2, "round-timeout": 10.0},
    )
    first, second = rounds[1]["train"], rounds[2]["train"]
    assert first["failures"] == 1, first
    assert first["problems"] == [
        {"client": 0, "exchange": "train", "problem": "no reply within the round timeout"}
    ], first
    for train in (first, second):  # client 1 replied in both rounds
        assert train["clients"] >= 1, train
        assert 1 not in [p["client"] for p in train.get("problems", [])], train
    # The round ended at its own timeout, well before the hung child's task timeout.
    assert rounds[1]["round_time_s"] < 40, rounds[1]
    # The hung child ends once its token is revoked, or at its task timeout: either way its
    # parent records it (the one task of that node to last 10 s or more), then replies for it.
    hung = re.compile(r"pid \d+: .*, wall (\d+\.\d+)s")
    deadline = time.monotonic() + 120
    while not any(
        float(w) >= 10 for w in hung.findall(_log(deployment, "executor-supernode-0", start))
    ):
        assert time.monotonic() < deadline, _log(deployment, "executor-supernode-0", start)
        time.sleep(1.0)
    time.sleep(2.0)  # what the executor does after it reaped the child
    assert _executors(deployment) == before
    assert all(p.alive() for p in deployment.executors), _log(deployment, "executor-supernode-0")


@pytest.mark.slow
def test_a_fab_with_other_code_is_imported_from_the_fab(
    deployment: LocalDeployment, tmp_path: Path
) -> None:
    """The executors imported this checkout's pflarena; a run whose FAB's client code differs
    (one line added) runs the FAB's code in the children, re-imported, and a run of the
    unchanged app runs the parent's imports."""
    marker = Path(deployment.env["PFLARENA_FAB_MARKER"])
    app = flwr_run_dir(tmp_path / "app")
    _run(deployment, tmp_path / "same", app, **{"num-rounds": 1})
    assert not marker.exists()
    changed = tmp_path / "changed-app"
    shutil.copytree(app, changed)
    client = changed / "pflarena" / "client" / "app.py"
    client.write_text(
        client.read_text()
        + '\nwith open(os.environ["PFLARENA_FAB_MARKER"], "a") as _marker:\n'
        + '    _marker.write(f"{os.getpid()}\\n")\n'
    )
    rounds = _run(deployment, tmp_path / "changed", changed, **{"num-rounds": 1})
    assert rounds[-1]["train"]["failures"] == 0
    importers = {int(line) for line in marker.read_text().split()}
    logs = _log(deployment, "executor-supernode-0") + _log(deployment, "executor-supernode-1")
    assert "(re-imported)" in logs and "from the parent's imports" in logs
    children = {
        int(pid) for pid in __import__("re").findall(r"warm-executor task \d+ pid (\d+)", logs)
    }
    assert importers & children, (importers, children)  # the children imported the FAB's code


@pytest.mark.slow
def test_a_killed_executor_is_a_node_failure_that_supervise_restarts(
    deployment: LocalDeployment, tmp_path: Path
) -> None:
    name = "executor-supernode-0"
    victim = next(p for p in deployment.executors if p.name == name)
    os.kill(victim.pid, signal.SIGKILL)
    victim.popen.wait(timeout=30)
    assert deployment.supervise(say=lambda _: None) == [name]
    restarted = next(p for p in deployment.executors if p.name == name)
    assert restarted.pid != victim.pid and restarted.alive()
    rounds = _run(
        deployment, tmp_path / "after", flwr_run_dir(tmp_path / "app"), **{"num-rounds": 1}
    )
    assert rounds[-1]["train"]["failures"] == 0


@pytest.mark.slow
def test_a_supernode_that_exits_is_started_again_with_its_executor(
    deployment: LocalDeployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pflarena supernode`` exits when it can no longer serve; ``local-deploy``'s supervisor
    starts it again with a warm executor of its own, unless it exited right after its start
    or was refused activation."""
    name = "supernode-1"
    node = next(p for p in deployment.supernodes if p.name == name)
    executor = next(p for p in deployment.executors if p.name == f"executor-{name}")
    os.kill(node.pid, signal.SIGTERM)  # Flower's graceful stop: it deactivates itself
    node.popen.wait(timeout=60)

    # Had it exited right after its start (it cannot start), it is reported once, left down.
    monkeypatch.setattr(local, "RESTART_MIN_UPTIME_S", 1e9)
    said: list[str] = []
    assert deployment.supervise(say=said.append) == []
    assert deployment.supervise(say=said.append) == []
    assert len(said) == 1 and "not restarted" in said[0], said
    monkeypatch.undo()
    deployment._left_down.clear()
    # Had the SuperLink refused to activate it (Flower's exit code for an unregistered key,
    # given after pflarena supernode's wait), it is left down too, whatever its uptime.
    monkeypatch.setattr(local, "EXIT_NODE_NOT_REGISTERED", node.popen.returncode)
    assert deployment.supervise(say=said.append) == []
    assert len(said) == 2 and "not restarted" in said[1], said
    monkeypatch.undo()
    deployment._left_down.clear()

    assert deployment.supervise(say=said.append) == [name]
    again = next(p for p in deployment.supernodes if p.name == name)
    beside = next(p for p in deployment.executors if p.name == f"executor-{name}")
    assert again.pid != node.pid and again.alive()
    assert beside.pid != executor.pid and beside.alive() and not executor.alive()
    assert beside.cmd[beside.cmd.index("--parent-pid") + 1] == str(again.pid)
    deployment.wait_online(2, timeout=120)
    rounds = _run(
        deployment, tmp_path / "restarted", flwr_run_dir(tmp_path / "app"), **{"num-rounds": 1}
    )
    assert rounds[-1]["train"]["failures"] == 0, rounds[-1]
    assert sorted(rounds[-1]["train"]["sampled"]) == [0, 1], rounds[-1]
