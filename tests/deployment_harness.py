"""A loopback deployment for the deployment tests: a real SuperLink and its SuperNodes on
127.0.0.1, driven by ``flwr run`` (``test_deployment.py``: three SuperNodes, the seed issues'
acceptance; ``test_deployment_faults.py``: two).

Each SuperNode is started with ``--node-config data-path="<shard>"`` and holds one shard file
only, so the client ids in the evaluation show which data every node used. Every process a
test starts is tracked by :class:`Deployment` and stopped by PID (``flwr run``, the
SuperNodes, then the SuperLink; SIGTERM, then SIGKILL after a grace period), also when an
assertion fails. A failing assertion shows the tail of every process's log.

A SuperNode polls for messages as ``pflarena local-deploy``'s do (every 0.1 s for 30 s after a
message, then backing off to Flower's 3 s: ``pflarena supernode --active-poll``; the ServerApp
checks for replies every 0.2 s here, ``pflarena/server/polling.py``), and every message runs in a child
forked by the node's warm executor (``pflarena executor``, :mod:`pflarena.deploy.executor`;
Flower's own executor starts a new process that imports Flower and torch, 3-5 s of CPU, per
message: ``PFLARENA_TEST_EXECUTOR=flower`` runs the tests on it). The runs of a module go one after another: seven runs submitted at once on this deployment
took longer than one after another on 2 cores (after 618 s one of them had completed; one
after another they take ~100 s each), as the SuperNodes serve one message at a time and the
ClientApp processes already keep both cores busy.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from processes import cmdline, descendants, proc_state

from pflarena.core.config import RunConfig, toml_value
from pflarena.core.federation import FederationSpec, build_federation
from pflarena.core.shard_format import write_shards
from pflarena.deploy.local import DEFAULT_ACTIVE_POLL_S, executor_cmd
from pflarena.runtime.appdir import flwr_run_dir
from pflarena.runtime.launch import simulation_env
from pflarena.runtime.processes import Supervised, free_port, stop, stop_all, wait_healthy
from pflarena.server.polling import REPLY_POLL_ENV
from pflarena.server.results import read_rounds

# Two SuperNodes unless a module asks for more: every message costs a new ClientApp process
# (3-5 s of CPU), and two are enough for what the fault tests check (who was sampled, a lost
# node, a restarted SuperLink). The seed methods' module runs on three, as their issues ask.
NUM_NODES = 2
CONNECTION = "loopback"
GRACE_S = 15.0  # SIGTERM grace before SIGKILL
RUN_TIMEOUT_S = 300.0  # a whole `flwr run`
#: `flwr list` and `flwr log`: seconds on a quiet machine, past a minute on a loaded one
CLI_TIMEOUT_S = 180.0
LOG_TAIL_LINES = 25
TESTS_DIR = Path(__file__).resolve().parent
PLUGINS = "pflarena_test_methods"
#: The SuperNode program: Flower's, through pflarena's wrapper (:mod:`pflarena.deploy.supernode`).
PFLARENA_SUPERNODE = [sys.executable, "-m", "pflarena.deploy.supernode"]
#: ``flower``: the deployments run Flower's own ClientApp executor instead of pflarena's warm one.
EXECUTOR_ENV = "PFLARENA_TEST_EXECUTOR"


def flwr_run_args(connection: str, overrides: Path, app: Path) -> list[str]:
    """``flwr run <app> <connection> --run-config <overrides> --stream``; ``app`` is this
    app laid out under a test's directory (:func:`~pflarena.runtime.appdir.flwr_run_dir`)."""
    return [
        "flwr",
        "run",
        str(app),
        connection,
        "--run-config",
        str(overrides),
        "--stream",
    ]


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# --------------------------------------------------------------------------- the deployment
class Deployment:
    """One SuperLink, its SuperNodes and ``flwr run`` on loopback; files under ``root``."""

    def __init__(
        self, root: Path, *, serverapp_executor: bool = False, plugins: str = PLUGINS
    ) -> None:
        self.root = root
        #: ``PFLARENA_PLUGINS`` of every process of the deployment
        self.plugins = plugins
        self.port = 0
        self.superlink: subprocess.Popen | None = None
        #: ``serverapp_executor``: the ServerApps run under a SuperExec of their own
        #: (``--isolation process``), as compose's ``serverapp`` service runs them, so that a
        #: SuperLink restart leaves the ServerApp running (Flower's own SuperExec, a child
        #: of the SuperLink, stops with it, and its ServerApp with it): Flower's SuperExec
        #: with its 500s retried (``python -m pflarena.deploy.liveness``).
        self.serverapp_executor = serverapp_executor
        self.superexec: subprocess.Popen | None = None
        self.supernodes: list[subprocess.Popen] = []
        #: each SuperNode's warm ClientApp executor (``pflarena executor``), by index
        self.executors: list[subprocess.Popen] = []
        self.cli: list[subprocess.Popen] = []  # `flwr run` processes
        self.logs: dict[str, Path] = {}
        self.cli_home = root / "home-cli"
        self.t0 = time.monotonic()
        #: processes Flower started below ours (superexec, serverapp, clientapp): not ours
        #: to kill, but they must go away with their parents.
        self.children: dict[int, str] = {}  # pid -> when and below whom it was first seen
        self._ports: set[int] = set()
        self._handles: list[Any] = []
        self.stopped: list[subprocess.Popen] = []  # SuperLinks stopped by a restart
        self._threads: dict[int, threading.Thread] = {}  # `flwr run` pid -> its log copier

    @property
    def started(self) -> list[subprocess.Popen]:
        """Every process this deployment started itself."""
        return [
            *self.cli,
            *self.supernodes,
            *self.executors,
            *self.stopped,
            *([self.superexec] if self.superexec else []),
            *([self.superlink] if self.superlink else []),
        ]

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    # ------------------------------------------------------------------ starting
    def _port(self) -> int:
        while (port := free_port()) in self._ports:
            pass
        self._ports.add(port)
        return port

    def _env(self, home: Path) -> dict[str, str]:
        home.mkdir(parents=True, exist_ok=True)
        env = simulation_env(home)
        # Flower's 1 s task poll, as `pflarena local-deploy` keeps it: at 0.1 s the idle
        # SuperExecs and the SuperLink answering them take CPU from the other test worker.
        env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = "1.0"
        # The ServerApp checks for replies every 0.2 s, not pflarena's 0.1 s: each check is a
        # request the SuperLink answers (seven ServerApps checking every 0.1 s kept the
        # SuperLink at 90 % of a core), CPU the other test worker needs.
        env[REPLY_POLL_ENV] = "0.2"
        env["PFLARENA_PLUGINS"] = self.plugins
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
        return env

    def _spawn(self, name: str, cmd: list[str], home: Path) -> subprocess.Popen:
        self.logs[name] = self.root / f"{name}.log"
        # The project's supervisor: a session of its own, so that a Ctrl-C in pytest's
        # terminal reaches pytest only, and the fixture's teardown stops the process by PID.
        proc = Supervised.spawn(name, cmd, self.logs[name], self._env(home), cwd=home, append=False)
        assert proc.popen is not None
        print(f"{self.elapsed():.0f}s: started {name} pid {proc.pid}")
        return proc.popen

    def start_superlink(self) -> None:
        """The SuperLink (deployment, not simulation), its state in a database file so that
        a restarted one knows the SuperNodes."""
        name = f"superlink{len([k for k in self.logs if k.startswith('superlink')])}"
        self.superlink = self._spawn(
            name,
            [
                "flower-superlink",
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--database",
                str(self.root / "superlink.db"),
                "--disable-runtime-dependency-installation",
                *(["--isolation", "process"] if self.serverapp_executor else []),
            ],
            self.root / "home-superlink",
        )
        try:
            wait_healthy(self.port, self.superlink)
        except RuntimeError as exc:
            raise AssertionError(f"{exc}\n{self.log_tails()}") from None

    def restart_superlink(self) -> None:
        """Stop the SuperLink (and with it the ServerApp) by PID, then start it again."""
        assert self.superlink is not None
        self.note_children()
        stop(self.superlink, grace=GRACE_S)
        self.stopped.append(self.superlink)
        self.start_superlink()

    def start(self, shards: list[Path]) -> None:
        """The SuperLink, then one SuperNode per shard file, each with its own state-dir and
        its warm ClientApp executor (``--isolation process``: ``pflarena executor``, as
        ``pflarena local-deploy`` starts it; ``PFLARENA_TEST_EXECUTOR=flower``: Flower's own,
        started by the SuperNode)."""
        self.shards = shards
        self.port = self._port()
        self.start_superlink()
        if self.serverapp_executor:
            # Flower's SuperExec, its 500s retried (pflarena/deploy/liveness.py): Flower's
            # own exits on the first one, and its ServerApp with it.
            self.superexec = self._spawn(
                "serverapp-executor",
                [
                    sys.executable,
                    "-m",
                    "pflarena.deploy.liveness",
                    "--insecure",
                    "--runtime-api-address",
                    f"127.0.0.1:{self.port}",
                ],
                self.root / "home-serverapp",
            )
        warm = os.environ.get(EXECUTOR_ENV, "warm") != "flower"
        for i, shard in enumerate(shards):
            runtime_port = self._port()
            isolation = ["--isolation", "process"] if warm else []
            node = self._spawn(
                f"supernode{i}",
                [
                    # `pflarena local-deploy`'s SuperNode: waits that follow the work
                    *PFLARENA_SUPERNODE,
                    "--active-poll",
                    str(DEFAULT_ACTIVE_POLL_S),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{self.port}",
                    "--port",
                    str(runtime_port),
                    *isolation,
                    # Node config values are parsed as TOML: a path must be quoted.
                    "--node-config",
                    f'data-path="{shard}" state-dir="{self.root / f"state-sn{i}"}"',
                ],
                self.root / f"home-sn{i}",
            )
            self.supernodes.append(node)
            if not warm:
                continue
            self.executors.append(
                self._spawn(
                    f"executor{i}",
                    executor_cmd(f"127.0.0.1:{runtime_port}", parent_pid=node.pid),
                    self.root / f"home-sn{i}",
                )
            )
        self.cli_home.mkdir(parents=True, exist_ok=True)
        (self.cli_home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )

    def submit(self, cfg: RunConfig) -> subprocess.Popen:
        """``flwr run <project> loopback --run-config <file> --stream``, in the background;
        several runs may be submitted at once (each SuperNode serves their messages one at
        a time).

        The N-th run's output goes to ``flwr-runN.log``, each line stamped with the seconds
        since the deployment was created, so the log shows when rounds and warnings happened.
        """
        overrides = self.root / f"run-config{len(self.cli) + 1}.toml"
        overrides.write_text(
            "".join(f"{k} = {toml_value(v)}\n" for k, v in cfg.to_run_config().items())
        )
        proc = subprocess.Popen(
            flwr_run_args(CONNECTION, overrides, flwr_run_dir(self.root / "app")),
            env=self._env(self.cli_home),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=self.cli_home,
            start_new_session=True,
        )
        self.cli.append(proc)
        name = f"flwr-run{len(self.cli)}"
        self.logs[name] = self.root / f"{name}.log"
        out = open(self.logs[name], "w", buffering=1)  # noqa: SIM115 - closed in close()
        self._handles.append(out)

        def copy() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                out.write(f"[{self.elapsed():6.1f}s] {raw.decode(errors='replace')}")

        thread = threading.Thread(target=copy, daemon=True)
        thread.start()
        self._threads[proc.pid] = thread
        return proc

    # ------------------------------------------------------------------ waiting
    def check_running(self, expected: list[subprocess.Popen]) -> None:
        """Fail at once (with the logs) if one of ``expected`` has exited."""
        dead = [
            f"{p.args[0]} pid {p.pid} (exit {p.returncode})"
            for p in expected
            if p.poll() is not None
        ]
        assert not dead, f"exited unexpectedly: {', '.join(dead)}\n{self.log_tails()}"

    def wait(
        self,
        proc: subprocess.Popen,
        expected: list[subprocess.Popen],
        timeout: float = RUN_TIMEOUT_S,
    ) -> int:
        """Wait for ``flwr run`` to end while ``expected`` processes keep running."""
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            self.check_running(expected)
            assert time.monotonic() < deadline, (
                f"flwr run did not end within {timeout:.0f}s\n{self.log_tails()}"
            )
            self.note_children()
            time.sleep(1.0)
        if proc.pid in self._threads:
            self._threads[proc.pid].join(timeout=5)
        return proc.returncode

    def wait_for_round(self, out: Path, server_round: int, proc: subprocess.Popen) -> None:
        """Block until ``rounds.jsonl`` holds round ``server_round``."""
        path = out / "rounds.jsonl"
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (path.exists() and any(r["round"] >= server_round for r in read_rounds(path))):
            self.check_running([proc, *self.supernodes, self.superlink])
            assert time.monotonic() < deadline, f"no round {server_round}\n{self.log_tails()}"
            time.sleep(0.3)

    def wait_for_clientapp(self, out: Path, proc: subprocess.Popen, after_round: int) -> None:
        """Block until a ClientApp runs (a child of a node's warm executor, or Flower's
        ``flwr-clientapp``) while ``rounds.jsonl`` holds round ``after_round`` and no later
        one: an exchange of round ``after_round + 1`` is in flight, its message with a node."""
        path = out / "rounds.jsonl"
        deadline = time.monotonic() + RUN_TIMEOUT_S
        earlier: set[int] | None = None  # ClientApps still running as the round ended
        while True:
            self.check_running([proc, *self.supernodes, self.superlink])
            assert time.monotonic() < deadline, f"no ClientApp ran\n{self.log_tails()}"
            running = descendants({p.pid for p in self.executors if p.poll() is None}) | {
                pid
                for pid in descendants({p.pid for p in self.supernodes})
                if "flwr-clientapp" in cmdline(pid)
            }
            done = max((r["round"] for r in read_rounds(path)), default=-1) if path.exists() else -1
            assert done <= after_round, f"round {done} ended before a ClientApp was seen running"
            if done == after_round:
                if earlier is None:
                    earlier = running
                elif running - earlier:
                    return
            time.sleep(0.05)

    def run_status(self, run_id: int) -> dict[str, Any]:
        """The run as ``flwr list <connection> --run-id <id> --format json`` shows it."""
        res = subprocess.run(
            ["flwr", "list", CONNECTION, "--run-id", str(run_id), "--format", "json"],
            env=self._env(self.cli_home),
            cwd=self.cli_home,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
        )
        assert res.returncode == 0, (
            f"flwr list failed ({res.returncode}):\n{res.stdout}{res.stderr}"
        )
        runs = [r for r in json.loads(res.stdout).get("runs", []) if int(r["run-id"]) == run_id]
        assert runs, f"run {run_id} is not in `flwr list`:\n{res.stdout}"
        return runs[0]

    def run_log(self, run_id: int) -> str:
        """The run's ServerApp log as the SuperLink keeps it (``flwr log <id> --show``): a
        ServerApp under a SuperExec of its own writes nowhere else."""
        res = subprocess.run(
            ["flwr", "log", str(run_id), CONNECTION, "--show"],
            env=self._env(self.cli_home),
            cwd=self.cli_home,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
        )
        assert res.returncode == 0, f"flwr log failed ({res.returncode}):\n{res.stdout}{res.stderr}"
        return res.stdout

    def finished_status(self, run_id: int, timeout: float = 120.0) -> dict[str, Any]:
        """The run's SuperLink record once it is ``finished:*``: a ServerApp writes its
        summary before its process exits and reports the end, so the two can be seconds
        apart (more after a SuperLink restart, when it has reconnected)."""
        deadline = time.monotonic() + timeout
        while not (status := self.run_status(run_id))["status"].startswith("finished"):
            if time.monotonic() > deadline:
                return status
            time.sleep(2.0)
        return status

    def note_children(self) -> None:
        """Remember the processes Flower has started below ours so far."""
        for pid in descendants({p.pid for p in self.started if p.poll() is None}):
            if pid not in self.children:
                state = proc_state(pid)
                parent = state[1] if state else "?"
                self.children[pid] = f"first seen at {self.elapsed():.0f}s below {parent}"

    # ------------------------------------------------------------------ diagnostics
    def log_tails(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(
            f"----- {name}.log (last {lines} lines) -----\n{_tail(path, lines)}"
            for name, path in self.logs.items()
        )

    # ------------------------------------------------------------------ stopping
    def close(self) -> None:
        """Stop what we started, by PID: ``flwr run``, the SuperNodes, then the SuperLink.

        SIGTERM first, SIGKILL after ``GRACE_S`` seconds. Safe to call twice.
        """
        self.note_children()
        stop_all(self.cli, GRACE_S)
        stop_all([*self.supernodes, *self.executors], GRACE_S)
        if self.superexec is not None:
            stop(self.superexec, grace=GRACE_S)
        if self.superlink is not None:
            stop(self.superlink, grace=GRACE_S)
        for thread in self._threads.values():
            thread.join(timeout=5)
        for handle in self._handles:
            handle.close()
        self._handles.clear()

    def still_running(self) -> list[str]:
        """Our own processes that have not exited."""
        return [f"{p.args[0]} pid {p.pid}" for p in self.started if p.poll() is None]

    def leftover_children(self, timeout: float = 20.0) -> list[str]:
        """Flower's helper processes still alive ``timeout`` s after their parents stopped.

        Each of them watches its parent's PID (``--parent-pid``) and exits by itself.
        """
        deadline = time.monotonic() + timeout
        while True:
            alive = [pid for pid in sorted(self.children) if proc_state(pid) is not None]
            if not alive or time.monotonic() > deadline:
                return [
                    f"{pid} ({self.children[pid]}; parent now {(proc_state(pid) or ('', '?'))[1]}) "
                    f"{cmdline(pid)[:160]}"
                    for pid in alive
                ]
            time.sleep(0.5)


def stop_pids(pids: set[int], grace: float = GRACE_S) -> None:
    """SIGTERM the processes that still run, SIGKILL those left after ``grace`` seconds."""
    for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        alive = {pid for pid in pids if proc_state(pid) is not None}
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:
            alive = {pid for pid in alive if proc_state(pid) is not None}
            time.sleep(0.2)
    assert not any(proc_state(pid) for pid in pids), f"could not stop {pids}"


def started_deployment(
    tmp_path_factory: pytest.TempPathFactory,
    num_nodes: int = NUM_NODES,
    *,
    serverapp_executor: bool = False,
    plugins: str = PLUGINS,
) -> Iterator[Deployment]:
    """A started deployment of ``num_nodes`` SuperNodes on shards of its own (one each),
    stopped (by PID) when the generator is closed, also after a failed test: the body of a
    test module's ``deployment`` fixture (``serverapp_executor``, ``plugins``:
    :class:`Deployment`'s)."""
    root = tmp_path_factory.mktemp("deployment")
    dep = Deployment(root, serverapp_executor=serverapp_executor, plugins=plugins)
    try:
        dep.start(write_test_shards(root, num_nodes))
        yield dep
    finally:
        dep.close()  # also when a test failed


# --------------------------------------------------------------------------- helpers
def write_test_shards(tmp_path: Path, num_nodes: int = NUM_NODES) -> list[Path]:
    # Each shard carries a validation split, for the methods that value on one (pFedSV),
    # and leaves out the server's share, for the methods whose server holds data (PAGE).
    spec = FederationSpec(
        dataset="digits",
        num_clients=num_nodes,
        partition="iid",
        validation_fraction=0.2,
        server_fraction=0.1,
        seed=0,
    )
    return write_shards(build_federation(spec), tmp_path / "shards", spec)


def run_config(out: Path, **overrides: Any) -> RunConfig:
    # lr 0.1 and 2 local epochs: accuracy rises clearly within 2 rounds (0.08 -> 0.56).
    values: dict[str, Any] = {
        "strategy": "fedavg",
        "dataset": "digits",
        "partition": "iid",
        "seed": 0,
        "num_clients": NUM_NODES,
        "lr": 0.1,
        "local_epochs": 2,
        "output_dir": str(out),
    }
    return RunConfig(**(values | overrides))


def in_process_rounds(cfg: RunConfig, shards: list[Path], tmp_path: Path) -> list[dict[str, Any]]:
    """The same run in-process (``pflarena run``'s loop, the real ClientApp) on the same shard
    files, each client on its own file as a deployed node is: its rounds."""
    from helpers import grid_for, run_local

    shards_dir = str(shards[0].parent) if cfg.shards_dir else ""  # the host's copy
    local_cfg = cfg.model_copy(update={"output_dir": "", "shards_dir": shards_dir})
    grid = grid_for(local_cfg, node_configs=[{"data-path": str(p)} for p in shards])
    return run_local(local_cfg, tmp_path / "in-process", grid=grid).rounds


def evaluations(rounds: list[dict[str, Any]]) -> list[float]:
    """Each round's personalized mean accuracy."""
    return [r["evaluation"]["personalized"]["mean"] for r in rounds]


def completed_rounds(
    deployment: Deployment, out: Path, rc: int, *, superlink_agrees: bool = True
) -> list[dict[str, Any]]:
    """Check that the run completed (summary and, with ``superlink_agrees``, the SuperLink's
    record of the latest run agree); return its rounds."""
    logs = deployment.log_tails
    assert rc == 0, f"flwr run exited {rc}\n{logs()}"
    assert (out / "summary.json").exists(), f"the run wrote no summary.json\n{logs()}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed", f"{summary}\n{logs()}"
    # `flwr run` exits 0 even when the ServerApp raises; the SuperLink knows better.
    config = json.loads((out / "config.json").read_text())
    run_id = int(config.get("resumes", [config])[-1]["run_id"])  # the latest (resumed) run
    if superlink_agrees:
        status = deployment.finished_status(run_id)
        assert status["status"] == "finished:completed", f"{status}\n{logs()}"
    return read_rounds(out / "rounds.jsonl")


def idle_clientapps(deployment: Deployment, grace: float = 15.0) -> set[int]:
    """The ClientApp processes of our SuperNodes still running ``grace`` s from now: the
    executors' forked children (or Flower's ``flwr-clientapp`` processes)."""
    deadline = time.monotonic() + grace
    while True:
        alive = descendants({p.pid for p in deployment.executors if p.poll() is None}) | {
            pid
            for pid in descendants({p.pid for p in deployment.supernodes})
            if "flwr-clientapp" in cmdline(pid)
        }
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def stop_and_check(deployment: Deployment) -> None:
    deployment.close()
    assert not deployment.still_running(), f"still running: {deployment.still_running()}"
    leftovers = deployment.leftover_children()
    assert not leftovers, "Flower processes outlived their parents:\n" + "\n".join(leftovers)
