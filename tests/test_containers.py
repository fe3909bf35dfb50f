"""The compose deployment in real containers: images built from docker/Dockerfile, the files
``pflarena compose`` writes, ``docker-compose up``, and ``flwr run`` from the host through the
published port.

Opt-in (``PFLARENA_CONTAINER_TESTS=1``; skipped without it). Once opted in, nothing is
skipped: no Docker Engine answering (``docker info`` within 300 s) or no Compose fails the
module at collection, and a scenario that needs root or a network tool (``nsenter``, ``tc``,
``iptables``; ``.ci/run`` installs them) fails, saying what it lacks. The images are built
once per test session and tagged with a digest of their inputs
(:func:`pflarena.deploy.images.inputs_digest`): an unchanged tree reuses them. Where Flower's
base image cannot be pulled they are built on the local base (``--local-base``: debootstrap,
which needs root; made once and kept).

Every compose project here is named ``pflarena-test-<pid>-<n>`` and is taken down with its
volumes and network (``down -v``) at the end of its test or module, also after a failure;
nothing else on the engine is touched. The images stay (the next session reuses them);
``docker image ls 'pflarena-*'`` lists them.

Scenarios: a federation of three SuperNodes to completion, its rounds equal to the same run
in-process on the same shards and its results owned by the user; a SuperNode container killed
and started again; a ClientApp executor container dying mid-message; the SuperLink container
restarted mid-run and the run resumed; the secure variant tried as a stranger (an
unregistered SuperNode, every Control API call, a Runtime API task on the SuperLink and on
each SuperNode, an unsigned app) while the operator's run completes; an edge node limited to one CPU and 1 GiB
behind a degraded link (tc netem in its network namespace); an arm64 edge node (its image built
for linux/arm64 and run under qemu-user emulation; opt-in, ``PFLARENA_ARM64_TESTS=1`` or
``make test-edge``; once opted in, failed, saying why, where binfmt_misc has no handler:
``make binfmt``) in the federation with the in-process evaluations; an edge node losing its
network, getting it back, and its container recreated on its state volume; several hosts
(the SuperLink's, SuperNodes', the operator's), each on a Docker network of its own with only
its ``pflarena bundle``, a host joining mid-run and one rebooting.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deployment_harness import evaluations, in_process_rounds, run_config, write_test_shards

from pflarena.core.config import toml_value
from pflarena.deploy.compose import SUPERLINK_PORT, compose_files
from pflarena.deploy.images import (
    FLOWER_BASE,
    TARGETS,
    build_images,
    emulation_problem,
    image_exists,
    image_name,
    inputs_digest,
    local_base_name,
)
from pflarena.runtime.appdir import flwr_run_dir
from pflarena.runtime.launch import resume_config, simulation_env
from pflarena.server.build import parse_config
from pflarena.server.results import read_rounds

RUN_TIMEOUT_S = 600.0
UP_TIMEOUT_S = 600.0
CONNECTION = "compose"
NUM_NODES = 3
_projects = itertools.count()


#: The switch that opts in (``make test-containers``). Without it every scenario is skipped
#: (a developer's ``make test``); with it, whatever the scenarios need and lack (the engine,
#: Compose, root, a network tool) fails them, saying what, instead of skipping them: a CI step
#: that asked for them never passes having run none.
SWITCH = "PFLARENA_CONTAINER_TESTS"
OPTED_IN = os.environ.get(SWITCH) == "1"
#: How long ``docker info`` and ``docker compose version`` may take to answer: generous (on a
#: loaded host the engine has taken over 60 s), but bounded, so that a hung engine fails the
#: step with what was slow instead of holding it until CI's limit.
ENGINE_WAIT_S = 300.0


def _cannot_run(problem: str) -> None:
    """Fail the scenario (opted in: it was asked for) with why it cannot run here."""
    pytest.fail(f"{SWITCH}=1, but {problem}", pytrace=False)


def _need_root(why: str, tools: tuple[str, ...] = ()) -> None:
    """Fail unless this runs as root with every command of ``tools`` on PATH (``.ci/run``
    installs them: iproute2, iptables, util-linux)."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        _cannot_run(f"{why} needs {', '.join(f'`{t}`' for t in missing)}, not on PATH")
    if os.geteuid() != 0:
        _cannot_run(f"{why} needs root (euid {os.geteuid()})")


def _engine_address() -> str:
    """The Docker Engine the ``docker`` command asks (for a failure's message)."""
    return os.environ.get("DOCKER_HOST") or (
        f"context {os.environ['DOCKER_CONTEXT']}"
        if os.environ.get("DOCKER_CONTEXT")
        else "unix:///var/run/docker.sock"
    )


def _asked(cmd: list[str], wait_s: float) -> tuple[subprocess.CompletedProcess | None, float]:
    """Run ``cmd`` with a bounded wait: its result (None past ``wait_s``) and its seconds."""
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=wait_s)
    except subprocess.TimeoutExpired:
        done = None
    except OSError as exc:  # found on PATH, but cannot be run
        done = subprocess.CompletedProcess(cmd, 126, "", str(exc))
    return done, time.monotonic() - t0


def _compose_command(wait_s: float = ENGINE_WAIT_S) -> tuple[list[str] | None, list[str]]:
    """The first Compose that answers (``docker compose``, ``docker-compose``), and why each
    one tried before it did not."""
    why_not = []
    for cmd in (["docker", "compose"], ["docker-compose"]):
        shown = f"`{' '.join(cmd)}`"
        if shutil.which(cmd[0]) is None:
            why_not.append(f"{shown}: not on PATH")
            continue
        done, took = _asked([*cmd, "version"], wait_s)
        if done is None:
            why_not.append(f"{shown} version: no answer within {wait_s:.0f} s")
        elif done.returncode != 0:
            said = " ".join((done.stderr or done.stdout).split())[:200]
            why_not.append(f"{shown} version: exit {done.returncode} after {took:.1f} s ({said})")
        else:
            return cmd, why_not
    return None, why_not


def _engine(wait_s: float = ENGINE_WAIT_S) -> tuple[list[str], str | None]:
    """The Compose command, and why the container scenarios cannot run here (the engine or
    Compose; None where they can)."""
    if shutil.which("docker") is None:
        return [], "no `docker` command on PATH: the container scenarios need a Docker Engine"
    info, _ = _asked(["docker", "info", "--format", "{{.ServerVersion}}"], wait_s)
    if info is None:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        return [], (
            f"`docker info` did not answer within {wait_s:.0f} s: the Docker Engine at "
            f"{_engine_address()} is hung or overloaded (host load average {load})"
        )
    if info.returncode != 0:
        said = " ".join(info.stderr.split())[:300]
        return [], f"no Docker Engine answers at {_engine_address()} (`docker info`: {said})"
    compose, why_not = _compose_command(wait_s)
    if compose is None:
        return [], "no Compose answers: " + "; ".join(why_not)
    return compose, None


COMPOSE, ENGINE_PROBLEM = _engine() if OPTED_IN else ([], None)
if ENGINE_PROBLEM is not None:
    _cannot_run(ENGINE_PROBLEM)  # at collection: the step fails, saying why
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not OPTED_IN,
        reason=(
            f"opt-in: {SWITCH}=1 runs them (a cold image build took 53 min on 2 loaded "
            "cores, so they are a CI step of their own, `make test-containers`, not part of "
            "`make test`)"
        ),
    ),
]


# --------------------------------------------------------------------------- the images
def _base_image() -> str | None:
    """Flower's base where it is here or can be pulled; else the local base (None: make
    it). ``PFLARENA_IMAGES_BASE`` names one."""
    if os.environ.get("PFLARENA_IMAGES_BASE"):
        return os.environ["PFLARENA_IMAGES_BASE"]
    if image_exists(local_base_name()):
        return local_base_name()
    if image_exists(FLOWER_BASE):
        return FLOWER_BASE
    pulled = subprocess.run(["docker", "pull", FLOWER_BASE], capture_output=True, timeout=900)
    return FLOWER_BASE if pulled.returncode == 0 else None


@pytest.fixture(scope="session")
def image_tag(request: pytest.FixtureRequest) -> str:
    """Build the images once (or reuse those of an unchanged tree); their tag. When a test
    of the session needs the arm64 edge image, its build starts first, in the background (its
    wheelhouse has a port of its own): the emulated build and this one overlap."""
    if any("arm64_edge" in item.fixturenames for item in request.session.items):
        _start_arm64_build()  # nothing where the arm64 scenarios skip (_arm64_problem)
    base = _base_image()
    if base is None:
        _need_root(f"{FLOWER_BASE} cannot be pulled: making a local base", ("debootstrap",))
    tag = "test-" + inputs_digest(base=base or local_base_name())
    if all(image_exists(image_name(t, tag)) for t in TARGETS):
        return tag
    t0 = time.monotonic()
    times = build_images(local_base=base is None, base=base, tags=[tag])
    print(f"images built in {time.monotonic() - t0:.0f} s: {times}")
    return tag


ARM64 = "linux/arm64"
_arm64_build: dict[str, Any] = {}


#: The arm64 scenarios are opt-in beyond the container tests' own switch: under emulation the
#: arm64 base and edge image take about 40 minutes to build cold on a loaded 2-core machine,
#: more than CI's budget leaves (`make test-edge` runs them; docs/deployment.md, "Edge devices").
ARM64_SWITCH = "PFLARENA_ARM64_TESTS"


def _arm64_problem() -> str | None:
    """Why the arm64 edge image cannot be had here, or None."""
    if os.environ.get(ARM64_SWITCH) != "1":
        return f"the emulated arm64 scenarios are opt-in: {ARM64_SWITCH}=1 (`make test-edge`)"
    if problem := emulation_problem(ARM64):
        return f"arm64 containers cannot run here: {problem}"
    base = local_base_name(ARM64)
    if not image_exists(base) and (os.geteuid() != 0 or shutil.which("debootstrap") is None):
        return f"{base} is not here, and making it needs root and debootstrap"
    return None


def _arm64_own_tag() -> str:
    return "test-" + inputs_digest(base=local_base_name(ARM64))


def _start_arm64_build() -> None:
    """Build the arm64 edge image in a thread (once), unless it exists or cannot be built."""
    if (
        _arm64_build
        or _arm64_problem()
        or image_exists(image_name("edge", _arm64_own_tag(), platform=ARM64))
    ):
        return

    # The tag is fixed now: the digest of the tree as the build reads it (a file changed
    # during the build must not send the fixture looking for another tag).
    _arm64_build["tag"] = tag = _arm64_own_tag()

    def build() -> None:
        t0 = time.monotonic()
        try:
            _arm64_build["times"] = build_images(
                local_base=True, tags=[tag], targets=["edge"], platform=ARM64
            )
        except BaseException as exc:  # reported by the fixture that waits for it
            _arm64_build["error"] = exc
        _arm64_build["seconds"] = time.monotonic() - t0

    thread = threading.Thread(target=build, name="arm64-edge-image", daemon=True)
    _arm64_build["thread"] = thread
    thread.start()


@pytest.fixture(scope="session")
def arm64_edge(image_tag: str) -> str:
    """The arm64 edge image (``pflarena images --platform linux/arm64 --target edge``: under
    qemu-user emulation on an x86-64 host, on the local arm64 base), built once (beside the
    x86-64 images: :func:`image_tag`) or reused by the digest of its inputs, and tagged
    ``<image_tag>-arm64`` too, the name ``pflarena compose --edge-platform linux/arm64``
    gives the edge nodes. Returns that name."""
    if problem := _arm64_problem():
        if os.environ.get(ARM64_SWITCH) != "1":
            pytest.skip(problem)  # an opt-in of its own, beyond the container scenarios'
        pytest.fail(f"{ARM64_SWITCH}=1, but {problem}", pytrace=False)
    own = _arm64_own_tag()
    name = image_name("edge", image_tag, platform=ARM64)
    _start_arm64_build()  # not yet started: this test alone selected
    if "thread" in _arm64_build:
        _arm64_build["thread"].join()
        if "error" in _arm64_build:
            raise _arm64_build["error"]
        print(f"arm64 edge image built in {_arm64_build['seconds']:.0f} s: {_arm64_build['times']}")
    built = image_name("edge", _arm64_build.get("tag", own), platform=ARM64)
    subprocess.run(["docker", "tag", built, name], check=True)
    arch = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Architecture}}", name],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert arch == "arm64", (name, arch)
    return name


# --------------------------------------------------------------------------- a compose project
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ComposeProject:
    """One compose project in ``root``: its files, shards, runs, certificates, the ``flwr``
    CLI's home; every ``docker-compose`` call goes through :meth:`compose`."""

    def __init__(
        self,
        root: Path,
        tag: str,
        num_nodes: int,
        edge_nodes: int = 0,
        tls: bool = False,
        edge_platform: str | None = None,
    ) -> None:
        self.root, self.tls = root, tls
        self.name = f"pflarena-test-{os.getpid()}-{next(_projects)}"
        self.file = "docker-compose.tls.yml" if tls else "docker-compose.yml"
        self.port = _free_port()
        self.shards = write_test_shards(root, num_nodes + edge_nodes)
        (root / "runs").mkdir()
        files = compose_files(
            num_nodes,
            edge_nodes=edge_nodes,
            shards_dir=str(root / "shards"),
            certs_dir=str(root / "certs"),
            runs_dir=str(root / "runs"),
            edge_platform=edge_platform,
        )
        for name, text in files.items():
            (root / name).write_text(text)
        self.env = os.environ | {
            "PFLARENA_TAG": tag,
            "PFLARENA_PORT": str(self.port),
            "PFLARENA_UID": str(os.getuid()),
            "PFLARENA_GID": str(os.getgid()),
            "COMPOSE_PROJECT_NAME": self.name,
        }
        self.home = root / "home-cli"
        self.home.mkdir()
        address = f'address = "127.0.0.1:{self.port}"\n'
        transport = (
            f'root-certificates = "{root / "certs" / "ca.crt"}"\n' if tls else "insecure = true\n"
        )
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n{address}{transport}'
        )
        self.app = flwr_run_dir(root / "app")
        self.t0 = time.monotonic()
        self.runs = 0

    def compose(self, *args: str, timeout: float = 300.0, check: bool = True) -> str:
        result = subprocess.run(
            [*COMPOSE, "-p", self.name, "-f", self.file, *args],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check:
            assert result.returncode == 0, (
                f"compose {' '.join(args)}: {result.returncode}\n{result.stdout}{result.stderr}"
            )
        return result.stdout + result.stderr

    def up(self, *services: str) -> float:
        """``up -d`` (waits for the healthchecks its order needs); the seconds it took."""
        t0 = time.monotonic()
        self.compose("up", "-d", *services, timeout=UP_TIMEOUT_S)
        return time.monotonic() - t0

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "-t", "10", check=False)

    def healthy(self, service: str, timeout: float = UP_TIMEOUT_S) -> None:
        """Wait until ``service``'s healthcheck passes (``up -d SERVICE`` returns once it is
        started; only its dependents wait for its health)."""
        container = self.container(service)
        deadline = time.monotonic() + timeout
        while (status := _inspect(container, "{{.State.Health.Status}}")) != "healthy":
            assert time.monotonic() < deadline, f"{service}: {status}\n{self.logs()}"
            time.sleep(1)

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).strip().splitlines()[-1]

    def logs(self, tail: int = 30) -> str:
        return self.compose("logs", "--no-color", "--tail", str(tail), check=False)

    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["flwr", *args],
            env=simulation_env(self.home),
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def submit(self, run_config: dict[str, Any]) -> subprocess.Popen:
        """``flwr run`` from the host through the published port, in the background."""
        self.runs += 1
        overrides = self.root / f"run-config{self.runs}.toml"
        overrides.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in run_config.items()))
        log = open(self.root / f"flwr-run{self.runs}.log", "w")  # noqa: SIM115
        return subprocess.Popen(
            ["flwr", "run", str(self.app), CONNECTION, "--run-config", str(overrides), "--stream"],
            env=simulation_env(self.home),
            cwd=self.home,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait(self, proc: subprocess.Popen, timeout: float = RUN_TIMEOUT_S) -> int:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(
                f"flwr run did not end in {timeout:.0f} s\n{self.logs()}"
            ) from None

    def wait_for_round(self, out: Path, server_round: int, proc: subprocess.Popen) -> None:
        path = out / "rounds.jsonl"
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (path.exists() and any(r["round"] >= server_round for r in read_rounds(path))):
            assert proc.poll() is None, f"flwr run ended before round {server_round}\n{self.logs()}"
            assert time.monotonic() < deadline, f"no round {server_round}\n{self.logs()}"
            time.sleep(0.5)

    def completed(self, out: Path, rc: int) -> list[dict[str, Any]]:
        """Check that the run completed (summary and SuperLink agree); its rounds."""
        assert rc == 0, f"flwr run exited {rc}\n{self.logs()}"
        assert (out / "summary.json").exists(), f"no summary.json\n{self.logs()}"
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "completed", f"{summary}\n{self.logs()}"
        config = json.loads((out / "config.json").read_text())
        run_id = int(config.get("resumes", [config])[-1]["run_id"])
        listed = self.flwr("list", CONNECTION, "--run-id", str(run_id), "--format", "json")
        assert listed.returncode == 0, listed.stdout + listed.stderr
        (run,) = [r for r in json.loads(listed.stdout)["runs"] if int(r["run-id"]) == run_id]
        assert run["status"] == "finished:completed", run
        return read_rounds(out / "rounds.jsonl")

    def run_status(self, run_id: int) -> str:
        """The SuperLink's status of run ``run_id`` ("" while it does not answer)."""
        listed = self.flwr("list", CONNECTION, "--run-id", str(run_id), "--format", "json")
        if listed.returncode != 0:
            return ""
        runs = json.loads(listed.stdout).get("runs", [])
        return next((r["status"] for r in runs if int(r["run-id"]) == run_id), "")

    def wait_finished(self, run_id: int, timeout: float = RUN_TIMEOUT_S) -> str:
        """Wait until the SuperLink reports run ``run_id`` finished; its status."""
        deadline = time.monotonic() + timeout
        while not (status := self.run_status(run_id)).startswith("finished"):
            assert time.monotonic() < deadline, f"run {run_id}: {status!r}\n{self.logs()}"
            time.sleep(2)
        return status

    def online_nodes(self) -> int:
        listed = self.flwr("supernode", "list", CONNECTION, "--format", "json")
        if listed.returncode != 0:
            return -1
        nodes = json.loads(listed.stdout).get("nodes", [])
        return sum(1 for n in nodes if n.get("status") == "online")


def _container_config(cfg_out: str, **overrides: Any) -> tuple[Any, dict[str, Any]]:
    """A run config whose output goes to ``/runs/<cfg_out>`` in the ServerApp's container."""
    cfg = run_config(Path("/runs") / cfg_out, num_clients=NUM_NODES, **overrides)
    return cfg, cfg.to_run_config()


@contextlib.contextmanager
def _project(root: Path, tag: str, **kwargs: Any) -> Iterator[ComposeProject]:
    project = ComposeProject(root, tag, **kwargs)
    try:
        yield project
    finally:
        print(project.logs(tail=15))
        project.down()


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, image_tag: str) -> Iterator[ComposeProject]:
    """The plain-HTTP federation of three SuperNodes, up, for the module's scenarios."""
    with _project(tmp_path_factory.mktemp("compose"), image_tag, num_nodes=NUM_NODES) as project:
        seconds = project.up()
        print(f"docker-compose up: {seconds:.1f} s")
        yield project


# --------------------------------------------------------------------------- scenarios
def test_federation_completes_with_the_in_process_rounds(
    plain: ComposeProject, tmp_path: Path
) -> None:
    """``docker-compose up`` then ``flwr run`` from the host with ``shards-dir='/shards'``
    (the ServerApp's mount): every round of the run, with each SuperNode's ClientApp on its
    own shard file, equals the same run in-process; the
    results land in the host's runs folder, owned by the user who ran compose."""
    # shards-dir as docs/deployment.md runs it: the manifest in the ServerApp's container
    cfg, run_cfg = _container_config(
        "federation", num_rounds=2, round_timeout=180.0, shards_dir="/shards"
    )
    rc = plain.wait(plain.submit(run_cfg))
    out = plain.root / "runs" / "federation"
    rounds = plain.completed(out, rc)
    assert [r["round"] for r in rounds] == [0, 1, 2], rounds
    for record in rounds[1:]:
        train = record["train"]
        assert (train["sampled"], train["clients"], train["failures"]) == ([0, 1, 2], 3, 0), train
    for path in (out / "rounds.jsonl", out / "summary.json", out):
        assert path.stat().st_uid == os.getuid(), (path, path.stat().st_uid)
    local = in_process_rounds(cfg, plain.shards, tmp_path)
    assert [r["train"]["sampled"] for r in rounds[1:]] == [r["train"]["sampled"] for r in local[1:]]
    assert evaluations(rounds) == pytest.approx(evaluations(local), abs=1e-9), (
        evaluations(rounds),
        evaluations(local),
    )


def test_published_port_answers_on_loopback_only(plain: ComposeProject) -> None:
    """The plain SuperLink's port is bound to 127.0.0.1 on the host."""
    port = plain.compose("port", "superlink", str(SUPERLINK_PORT)).strip()
    assert port == f"127.0.0.1:{plain.port}", port


def test_a_clientapp_container_dying_mid_message_costs_its_round_only(
    plain: ComposeProject,
) -> None:
    """The ClientApp executor container of SuperNode 1 dies (its main process killed from
    the host, as a crash) while a ClientApp of it runs: that round records the failure, the
    container comes back (its restart policy) and the run completes with every client."""
    # Long enough local training (100 epochs: seconds a message, three nodes sharing the
    # host's cores) that the ClientApp is still at work when the kill lands: at the default
    # two epochs a message took 0.3 s, and its reply left between seeing it and the kill.
    _, run_cfg = _container_config(
        "clientapp-dies", num_rounds=3, round_timeout=60.0, local_epochs=100
    )
    proc = plain.submit(run_cfg)
    out = plain.root / "runs" / "clientapp-dies"
    plain.wait_for_round(out, 1, proc)
    container = plain.container("clientapp-1")
    deadline = time.monotonic() + 120
    # A ClientApp is running: a child forked by the warm executor (a second `pflarena
    # executor` process in the container), or Flower's own `flwr-clientapp`.
    while not _clientapp_running(plain_top(container)):
        assert time.monotonic() < deadline, "no ClientApp of node 1 ran after round 1"
        time.sleep(0.2)
    pid = int(_inspect(container, "{{.State.Pid}}"))
    os.kill(pid, signal.SIGKILL)
    rounds = plain.completed(out, plain.wait(proc))
    print([r["train"] for r in rounds[1:]])
    assert [r["round"] for r in rounds] == [0, 1, 2, 3], rounds
    assert sum(r["train"]["failures"] for r in rounds[2:]) >= 1, [r["train"] for r in rounds[1:]]
    assert rounds[-1]["train"]["clients"] == 3, rounds[-1]["train"]
    assert int(_inspect(container, "{{.RestartCount}}")) >= 1


def test_a_killed_supernode_container_started_again(plain: ComposeProject) -> None:
    """``docker kill`` SuperNode 1 after round 1, then start it again: the run completes,
    the rounds record the lost replies, and the node (same shard, same state volume) is
    back in the last round."""
    _, run_cfg = _container_config("supernode-killed", num_rounds=3, round_timeout=120.0)
    proc = plain.submit(run_cfg)
    out = plain.root / "runs" / "supernode-killed"
    plain.wait_for_round(out, 1, proc)
    plain.compose("kill", "-s", "SIGKILL", "supernode-1")
    time.sleep(2)
    plain.compose("start", "supernode-1")
    rounds = plain.completed(out, plain.wait(proc))
    trains = [r["train"] for r in rounds[1:]]
    print(trains)
    assert [r["round"] for r in rounds] == [0, 1, 2, 3], rounds
    assert trains[0]["failures"] == 0, trains
    assert trains[-1]["clients"] == 3 and 1 in trains[-1]["sampled"], trains


def test_a_superlink_restart_resumes_to_the_uninterrupted_rounds(
    plain: ComposeProject, tmp_path: Path
) -> None:
    """Restart the SuperLink container while round 2's ClientApps train (mid-exchange, on
    purpose: the restart waits until an executor runs one); its database on the volume keeps
    the nodes and the run. The ServerApp, under its own executor container, reconnects and
    the deployment Grid sends again what got no reply (``server/polling.py``); should the run
    end short, ``resume=true`` with the same output-dir continues it. Either way the rounds
    equal an uninterrupted in-process run, and no client failed."""
    num_rounds = 6  # enough rounds left after round 1 that the restart lands mid-run
    _, run_cfg = _container_config(
        "superlink-restarted",
        strategy="ditto",
        num_rounds=num_rounds,
        round_timeout=180.0,
        local_epochs=30,  # a ClientApp runs long enough to be seen running
    )
    proc = plain.submit(run_cfg)
    out = plain.root / "runs" / "superlink-restarted"
    plain.wait_for_round(out, 1, proc)
    apps = [plain.container(f"clientapp-{i}") for i in range(3)]
    deadline = time.monotonic() + 120
    while not any(_clientapp_running(plain_top(c)) for c in apps):  # round 2 in flight
        assert time.monotonic() < deadline, "no ClientApp of round 2 ran"
        time.sleep(0.1)
    assert max(r["round"] for r in read_rounds(out / "rounds.jsonl")) == 1
    plain.compose("restart", "superlink")
    plain.wait(proc)  # the CLI's stream ends with the SuperLink it followed
    plain.up()  # whatever the restart took down comes back in order
    run_id = int(json.loads((out / "config.json").read_text())["run_id"])
    status = plain.wait_finished(run_id)
    done = max(r["round"] for r in read_rounds(out / "rounds.jsonl"))
    print(f"after the SuperLink's restart run {run_id} ended {status} at round {done}")
    if status == "finished:completed":
        rounds = plain.completed(out, 0)
    else:
        assert done < num_rounds, (status, done)
        resumed = resume_config(out) | {"output-dir": "/runs/superlink-restarted"}
        rounds = plain.completed(out, plain.wait(plain.submit(resumed)))
        assert json.loads((out / "config.json").read_text())["resumes"][0]["after_round"] >= 1
    assert [r["round"] for r in rounds] == list(range(num_rounds + 1)), rounds
    local = in_process_rounds(parse_config(run_cfg), plain.shards, tmp_path)
    assert not any(_failures(r) for r in rounds), {r["round"]: _failures(r) for r in rounds}
    assert evaluations(rounds) == pytest.approx(evaluations(local), abs=1e-9)


def _failures(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A round's recorded client failures (its train and evaluation problems)."""
    return [
        *((record.get("train") or {}).get("problems") or []),
        *((record.get("evaluation") or {}).get("problems") or []),
    ]


def _clientapp_running(top: str) -> bool:
    return "flwr-clientapp" in top or top.count("pflarena executor") > 1


def plain_top(container: str) -> str:
    result = subprocess.run(["docker", "top", container], capture_output=True, text=True)
    return result.stdout


def _inspect(container: str, fmt: str) -> str:
    return subprocess.run(
        ["docker", "inspect", "-f", fmt, container], capture_output=True, text=True, check=True
    ).stdout.strip()


#: What a task token looks like on a command line (flwr: 128 random bytes, hex).
TASK_TOKEN = re.compile(r"[0-9a-f]{256}")


def _command_lines(project: ComposeProject, services: list[str]) -> list[str]:
    """Every process's command line in ``services``' containers, as the Docker host's
    ``ps`` shows them to any user of the host (``docker top``)."""
    lines = []
    for service in services:
        top = subprocess.run(  # docker top needs the PID column; the rest is the command
            ["docker", "top", project.container(service), "-ww", "-eo", "pid,args"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert top.returncode == 0, f"docker top {service}: {top.stderr}"
        lines += [
            f"{service}: {line.split(None, 1)[1]}"
            for line in top.stdout.splitlines()[1:]
            if len(line.split(None, 1)) == 2
        ]
    return lines


def _chown_tree(path: Path, uid: int) -> None:
    for item in [path, *path.rglob("*")]:
        os.chown(item, uid, uid)


def test_tls_admits_the_operator_and_registered_nodes_only(tmp_path: Path, image_tag: str) -> None:
    """``docker-compose.tls.yml`` with ``pflarena certs --secure``, tried as a stranger would:

    * an extra SuperNode container with a key never registered exits with Flower's code 305
      (printed; its exit status is 1) and is never listed;
    * from the host, with the CA's certificate only: registering a key, listing runs and
      nodes and submitting an app are refused by the SuperLink; asking its Runtime API for
      a ServerApp task without the secret gets 401;
    * from a container on the compose network: asking each SuperNode's Runtime API for a
      ClientApp message without the secret gets 401;
    * with the operator's token, the stranger's unsigned app is refused by the ServerApp
      executor (``finished:failed``, not approved) and writes nothing under ``./runs``;

    while the operator's own run completes over TLS with the in-process evaluations."""
    _need_root("handing the keys to the containers' UID 49999 (chown)")
    from strangers import (
        acquire_task,
        control_api_refuses,
        markers,
        stranger_app,
        stranger_home,
    )

    from pflarena.cli import main
    from pflarena.deploy.approval import approve
    from pflarena.deploy.certs import make_node_key
    from pflarena.deploy.local import EXIT_NODE_NOT_REGISTERED
    from pflarena.deploy.operator import connect

    num_nodes = 2
    with _project(tmp_path, image_tag, num_nodes=num_nodes, tls=True) as project:
        certs = tmp_path / "certs"
        args = ["certs", "--out", str(certs), "--superlink-host", "superlink", "--secure"]
        assert main([*args, "--supernodes", str(num_nodes), "--node-keys", str(num_nodes)]) == 0
        make_node_key(certs / "keys" / "unregistered")
        address = f"127.0.0.1:{project.port}"
        connect(project.home, CONNECTION, address, root_certificates=certs / "ca.crt",
                operator_token=certs / "operator.token", default=True)  # fmt: skip
        approve(project.app, certs / "app-signing.key")
        _chown_tree(certs, 49999)  # the containers run as Flower's user
        project.up("superlink")
        project.healthy("superlink")
        for i in range(num_nodes):
            reg = project.flwr(
                "supernode", "register", str(certs / "keys" / f"supernode-{i}.pub"), CONNECTION
            )
            assert reg.returncode == 0, reg.stdout + reg.stderr
        project.up()
        network = f"{project.name}_default"
        intruder = subprocess.run(
            ["docker", "run", "--rm", "--network", network,
             "-v", f"{certs / 'ca.crt'}:/certs/ca.crt:ro",
             "-v", f"{certs / 'keys' / 'unregistered'}:/keys/unregistered:ro",
             image_name("supernode", image_tag),
             "--root-certificates", "/certs/ca.crt", "--superlink", f"superlink:{SUPERLINK_PORT}",
             "--auth-supernode-private-key", "/keys/unregistered", "--max-retries", "0",
             "--node-config", 'data-path="/data/none.npz"'],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        # Flower prints its exit code (305) and exits with status 1.
        refused = intruder.stdout + intruder.stderr
        assert intruder.returncode != 0, refused
        assert f"Exit Code: {EXIT_NODE_NOT_REGISTERED}" in refused, refused
        deadline = time.monotonic() + 180
        while project.online_nodes() != num_nodes:
            assert time.monotonic() < deadline, (
                f"nodes online: {project.online_nodes()}\n{project.logs()}"
            )
            time.sleep(2)

        cfg = run_config(
            Path("/runs/tls"), num_clients=num_nodes, num_rounds=2, round_timeout=180.0
        )
        operator_run = project.submit(cfg.to_run_config())
        # On the Docker host, while the run goes on: no task token or secret in any command
        # line of the project's containers (any user of the host reads them with ps).
        services = ["superlink", "serverapp"]
        services += [f"{kind}-{i}" for i in range(num_nodes) for kind in ("supernode", "clientapp")]
        secret_files = [certs / "operator.token", *sorted((certs / "secrets").iterdir())]
        values = {str(f): f.read_text().strip() for f in secret_files}
        seen: set[str] = set()
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not any("serverapp" in line and "--token-file" in line for line in seen):
            assert operator_run.poll() is None, f"the run ended unseen\n{project.logs()}"
            assert time.monotonic() < deadline, f"no ServerApp process seen\n{project.logs()}"
            seen |= set(_command_lines(project, services))
            time.sleep(0.2)
        print("the ServerApp's process on the host:",
              [line for line in seen if "token" in line])  # fmt: skip
        assert not [line for line in seen if TASK_TOKEN.search(line)], sorted(seen)
        for path, value in values.items():
            assert not [line for line in seen if value in line], f"{path} on a command line"
        marker = "/runs/stranger-was-here"
        app = stranger_app(tmp_path, marker)
        home = stranger_home(tmp_path, address, certs / "ca.crt")
        control_api_refuses(home, certs / "keys" / "unregistered.pub", app)
        answer = acquire_task(address, certs / "ca.crt")
        print(f"stranger asks the SuperLink for a task: {answer}")
        assert answer.startswith("refused 401"), answer
        probe = ["docker", "run", "--rm", "--network", network, "-v",
                 f"{certs / 'ca.crt'}:/certs/ca.crt:ro", "--entrypoint", "python",
                 image_name("supernode", image_tag)]  # fmt: skip
        for i in range(num_nodes):
            answer = acquire_task(f"supernode-{i}:9094", Path("/certs/ca.crt"), python=probe)
            print(f"stranger asks supernode-{i} for a message: {answer}")
            assert answer.startswith("refused 401"), answer

        started = project.flwr("run", str(app), CONNECTION, "--format", "json")
        assert started.returncode == 0, started.stdout + started.stderr
        run_id = int(json.loads(started.stdout)["run-id"])
        assert project.wait_finished(run_id) == "finished:failed"
        listed = json.loads(
            project.flwr("list", CONNECTION, "--run-id", str(run_id), "--format", "json").stdout
        )
        details = listed["runs"][0].get("status-details", "")
        print(f"the operator's token submits the stranger's unsigned app: {details}")
        assert "not approved" in details, listed

        rounds = project.completed(tmp_path / "runs" / "tls", project.wait(operator_run))
        assert [r["train"]["clients"] for r in rounds[1:]] == [num_nodes] * 2, rounds
        loose = {p.name: oct(p.stat().st_mode & 0o777)
                 for p in (tmp_path / "runs" / "tls").iterdir() if p.stat().st_mode & 0o077}  # fmt: skip
        assert not loose, f"results readable by others: {loose}"  # the executor's umask 077
        local = in_process_rounds(cfg, project.shards[:num_nodes], tmp_path)
        assert evaluations(rounds) == pytest.approx(evaluations(local), abs=1e-9)
        assert markers(str(tmp_path / "runs" / "stranger-was-here")) == []
        listed = json.loads(
            project.flwr("supernode", "list", CONNECTION, "--format", "json").stdout
        )
        assert len(listed["nodes"]) == num_nodes, listed


#: The commands :func:`_degrade_link` runs (Debian: util-linux, iproute2, iptables).
LINK_TOOLS = ("nsenter", "tc", "iptables")


def _degrade_link(pid: str) -> str:
    """Degrade the network of the container whose main process is ``pid``, from its own
    network namespace: ``tc netem`` (100 ms ± 20 ms of latency, 2 % loss) where the kernel has
    it; else, as on kernels built without ``sch_netem``, a 1 Mbit/s token bucket (``tbf``,
    whose queue delays what exceeds the rate) and 2 % of the packets dropped in each direction
    (iptables' ``statistic`` match). Returns what was applied."""
    netns = ["nsenter", "-t", pid, "-n"]
    netem = subprocess.run(
        [*netns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem",
         "delay", "100ms", "20ms", "loss", "2%"],
        capture_output=True, text=True,
    )  # fmt: skip
    if netem.returncode == 0:
        applied = "netem delay 100ms 20ms loss 2%"
    else:
        assert "qdisc kind is unknown" in netem.stderr, netem.stderr
        subprocess.run(
            [*netns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
             "rate", "1mbit", "burst", "32kbit", "latency", "400ms"],
            check=True,
        )  # fmt: skip
        for chain in ("INPUT", "OUTPUT"):
            subprocess.run(
                [*netns, "iptables", "-A", chain, "-m", "statistic", "--mode", "random",
                 "--probability", "0.02", "-j", "DROP"],
                check=True,
            )  # fmt: skip
        applied = "tbf rate 1mbit + iptables statistic drop 2% each way (no sch_netem)"
    shown = subprocess.run(
        [*netns, "tc", "qdisc", "show", "dev", "eth0"], capture_output=True, text=True
    ).stdout
    assert ("netem" in shown) or ("tbf" in shown and "rate 1Mbit" in shown), shown
    return applied


def test_edge_node_behind_a_degraded_link(tmp_path: Path, image_tag: str) -> None:
    """An edge node (one CPU, 1 GiB, its ClientApps in its own subprocesses) behind a
    degraded link (:func:`_degrade_link`, in its network namespace) joins two SuperNodes and
    completes its rounds with every client; the rounds' times are printed."""
    _need_root("degrading a container's link", LINK_TOOLS)
    with _project(tmp_path, image_tag, num_nodes=2, edge_nodes=1) as project:
        project.up()
        edge = project.container("edge-0")
        assert _inspect(edge, "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}}") == (
            f"{10**9} {2**30}"
        )
        print("edge link:", _degrade_link(_inspect(edge, "{{.State.Pid}}")))
        cfg = run_config(Path("/runs/edge"), num_clients=3, num_rounds=2, round_timeout=240.0)
        out = tmp_path / "runs" / "edge"
        rounds = project.completed(out, project.wait(project.submit(cfg.to_run_config())))
        for record in rounds:
            print(
                f"round {record['round']}: {record.get('train')} "
                f"round time {record.get('round_time_s', 0.0):.1f}s"
            )
        assert [r["round"] for r in rounds] == [0, 1, 2]
        for record in rounds[1:]:
            assert record["train"]["clients"] == 3 and record["train"]["failures"] == 0, record
        assert "2" in rounds[-1]["evaluation"]["per_client"]


# --------------------------------------------------------------------------- arm64 edge nodes
#: Rounds wait this long for an emulated arm64 node's replies (qemu-user runs its ClientApps
#: tens of times slower than the hardware would).
EMULATED_ROUND_TIMEOUT_S = 600.0


def _edge_client(rounds: list[dict[str, Any]], client: str) -> list[Any]:
    """Client ``client``'s personalized accuracy in each round's evaluation (None: absent)."""
    return [
        ((r.get("evaluation") or {}).get("per_client") or {}).get(client, {}).get("personalized")
        for r in rounds
    ]


def test_arm64_edge_node_in_the_federation_equals_its_in_process_client(
    tmp_path: Path, image_tag: str, arm64_edge: str
) -> None:
    """The compose federation of two x86-64 SuperNodes and one arm64 edge node (the
    ``pflarena-edge`` image built for linux/arm64, emulated here), one CPU, 1 GiB, behind a
    degraded link: FedAvg on digits completes with every client in every round, and every
    round's evaluations, the edge client's own included, equal the same run in-process on
    the same shards (x86-64, torch 2.14.1 against the edge's aarch64 torch 2.10.0)."""
    _need_root("degrading a container's link", LINK_TOOLS)
    with _project(tmp_path, image_tag, num_nodes=2, edge_nodes=1, edge_platform=ARM64) as project:
        project.up()
        edge = project.container("edge-0")
        assert _inspect(edge, "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}}") == (
            f"{10**9} {2**30}"
        )
        machine = subprocess.run(
            ["docker", "exec", edge, "uname", "-m"], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert machine == "aarch64", machine
        print("edge link:", _degrade_link(_inspect(edge, "{{.State.Pid}}")))
        cfg = run_config(
            Path("/runs/arm64"), num_clients=3, num_rounds=2,
            round_timeout=EMULATED_ROUND_TIMEOUT_S,
        )  # fmt: skip
        out = tmp_path / "runs" / "arm64"
        proc = project.submit(cfg.to_run_config())
        rounds = project.completed(out, project.wait(proc, timeout=4 * EMULATED_ROUND_TIMEOUT_S))
        for record in rounds:
            print(
                f"round {record['round']}: {record.get('train')} "
                f"round time {record.get('round_time_s', 0.0):.1f}s (emulated arm64 edge)"
            )
        assert [r["round"] for r in rounds] == [0, 1, 2]
        for record in rounds[1:]:
            assert record["train"]["clients"] == 3 and record["train"]["failures"] == 0, record
        local = in_process_rounds(cfg, project.shards, tmp_path)
        print("edge client:", _edge_client(rounds, "2"), "in-process:", _edge_client(local, "2"))
        assert None not in _edge_client(rounds, "2")
        assert _edge_client(rounds, "2") == pytest.approx(_edge_client(local, "2"), abs=1e-9)
        assert evaluations(rounds) == pytest.approx(evaluations(local), abs=1e-9)
        losses = [r["train"]["loss"] for r in rounds[1:]]
        assert losses == pytest.approx([r["train"]["loss"] for r in local[1:]], rel=1e-4)


def _tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root``: its path relative to ``root`` and a digest of its bytes."""
    import hashlib

    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _round_where(
    project: ComposeProject, out: Path, proc: subprocess.Popen, after: int, edge_trained: bool
) -> dict[str, Any]:
    """The first round after round ``after`` in which the edge client (``2``) trained and was
    evaluated (``edge_trained``), or was missing from the evaluation; waits for it."""

    def trained(record: dict[str, Any]) -> bool:
        train = record.get("train") or {}
        failed = {p.get("client") for p in train.get("problems", [])}
        per_client = (record.get("evaluation") or {}).get("per_client") or {}
        return 2 in train.get("sampled", []) and 2 not in failed and "2" in per_client

    def why() -> str:
        """The rounds so far, one line each, the other services' logs, then the edge node's
        own (a CI log may keep only the end of a failure's message: the edge node's part last)."""
        path = out / "rounds.jsonl"
        lines = [
            f"round {r['round']}: {r.get('round_time_s')} s, sampled "
            f"{(r.get('train') or {}).get('sampled')}, train problems "
            f"{(r.get('train') or {}).get('problems')}, evaluated "
            f"{sorted((r.get('evaluation') or {}).get('per_client') or {})}"
            for r in (read_rounds(path) if path.exists() else [])
        ]
        edge = project.compose("logs", "--no-color", "--tail", "80", "edge-0", check=False)
        others = project.logs(tail=15)
        return "\n".join([f"--- all ---\n{others}", *lines, f"--- edge-0 ---\n{edge}"])

    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        path = out / "rounds.jsonl"
        for record in read_rounds(path) if path.exists() else []:
            per_client = (record.get("evaluation") or {}).get("per_client") or {}
            wanted = trained(record) if edge_trained else "2" not in per_client
            if record["round"] > after and wanted:
                return record
        assert proc.poll() is None, f"the run ended first\n{why()}"
        assert time.monotonic() < deadline, f"no such round after {after}\n{why()}"
        time.sleep(1)


def test_an_edge_node_that_comes_and_goes_keeps_its_client_state(
    tmp_path: Path, image_tag: str
) -> None:
    """An edge node (the host's edge image, so that its rounds take seconds, not the
    emulator's minutes) in a Ditto run, its personal model in its state volume:

    * its network is taken away after round 1 (``docker network disconnect``): the rounds it
      misses record it (no evaluation of it; a failure, or, once the SuperLink holds it
      offline, not sampled), none waits past the round timeout,
      and every file of its state volume (its personal model's versions) is there, unchanged,
      while it is away; the network comes back (``docker
      network connect``) and the node takes part again, holding the version of its personal
      model the server accepted (no ``state_problems``);
    * then its container is killed and removed (``docker kill``, ``docker rm -f``: a power
      loss) and created again on the same volume: the files are those it left, and it takes
      part again;

    and the run completes with every round recorded."""
    _need_root("reading the edge node's state volume on the host")
    with _project(tmp_path, image_tag, num_nodes=2, edge_nodes=1) as project:
        project.up()
        network = f"{project.name}_default"
        volume = subprocess.run(
            ["docker", "volume", "inspect", "-f", "{{.Mountpoint}}", f"{project.name}_edge-0-state"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        state = Path(volume)
        timeout = 120.0
        # Enough rounds that the run cannot end before the node is back: without it a round
        # takes a few seconds, and a node whose network returns rejoins only when its next
        # retry reaches the SuperLink (Flower's back-off: about 25 s on loopback, where 8
        # rounds once ended first).
        num_rounds = 40
        cfg = run_config(
            Path("/runs/comes-and-goes"), strategy="ditto", num_clients=3, num_rounds=num_rounds,
            round_timeout=timeout,
        )  # fmt: skip
        out = tmp_path / "runs" / "comes-and-goes"
        proc = project.submit(cfg.to_run_config())
        project.wait_for_round(out, 1, proc)
        before = _tree_digest(state)
        personal = [k for k in before if "personal" in k]
        assert personal, f"no personal model in the edge node's state: {sorted(before)}"

        edge = project.container("edge-0")
        subprocess.run(["docker", "network", "disconnect", network, edge], check=True)
        t0 = time.monotonic()
        missed = _round_where(project, out, proc, after=1, edge_trained=False)
        print(f"round {missed['round']} without the edge node, {time.monotonic() - t0:.0f} s "
              f"after the disconnect: {missed['train']} {missed['evaluation'].get('problems')}")  # fmt: skip
        assert missed["round_time_s"] <= 2 * timeout + 60, missed
        assert missed["train"]["failures"] >= 1 or 2 not in missed["train"]["sampled"], missed
        # Every file the node held is there, unchanged (a message it was handed before the
        # disconnect may add a version its reply never delivered: the server never accepts it;
        # it deletes none, as after round 1 the node holds only the version the server accepted
        # and checkpointed).
        assert before.items() <= _tree_digest(state).items(), "state lost while away"
        subprocess.run(
            ["docker", "network", "connect", "--alias", "edge-0", network, edge], check=True
        )
        back = _round_where(project, out, proc, after=missed["round"], edge_trained=True)
        print(f"round {back['round']}: the edge node is back: {back['train']}")
        assert not back["train"].get("state_problems"), back["train"]
        assert not back["evaluation"].get("state_problems"), back["evaluation"]
        assert back["train"]["failures"] == 0, back["train"]

        # A power loss: the container is killed, removed and made again on the same volume.
        # The files are compared from the kill on: while the node runs, each message deletes
        # the versions the server no longer needs (the one the last checkpoint held, once a
        # newer checkpoint holds a newer one), so a snapshot of a running node can go stale.
        project.compose("kill", "edge-0")
        snapshot = _tree_digest(state)
        assert any("personal" in k for k in snapshot), f"no personal model left: {sorted(snapshot)}"
        project.compose("rm", "-s", "-f", "edge-0")
        assert snapshot.items() <= _tree_digest(state).items(), "state lost with the container"
        project.compose("up", "-d", "--no-deps", "edge-0")
        assert project.container("edge-0") != edge
        again = _round_where(project, out, proc, after=back["round"], edge_trained=True)
        print(f"round {again['round']}: the recreated edge node takes part: {again['train']}")
        assert not again["train"].get("state_problems"), again["train"]
        assert again["train"]["failures"] == 0, again["train"]

        # The rounds left take what the rounds so far took (a loaded host's rounds take 15-20 s
        # where an idle one's take 3-4 s), with room to spare.
        so_far = [r["round_time_s"] for r in read_rounds(out / "rounds.jsonl")[1:]]
        left = num_rounds - again["round"]
        finish = max(RUN_TIMEOUT_S, 2.0 * left * statistics.median(so_far) + 120.0)
        rounds = project.completed(out, project.wait(proc, timeout=finish))
        assert [r["round"] for r in rounds] == list(range(num_rounds + 1)), rounds
        print("edge client per round:", _edge_client(rounds, "2"))
        assert None in _edge_client(rounds, "2")[2:], "no round recorded the node's absence"


# --------------------------------------------------------------------------- several hosts
#: The user that owns each "host"'s files, as an operator's account would on its machine (not
#: root, not the images' Flower user): the bundles' containers run as it.
HOST_UID = 4242


def _host_address() -> str:
    """This Docker host's address on its default route (not loopback), else the Docker
    bridge's: the address every "host" below dials, as machines elsewhere would."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("198.51.100.1", 9))  # a route lookup: nothing is sent
        address = sock.getsockname()[0]
        if not address.startswith("127."):
            return address
    shown = subprocess.run(["ip", "-4", "-o", "addr", "show", "docker0"], capture_output=True,
                           text=True, check=True).stdout  # fmt: skip
    return shown.split("inet ", 1)[1].split("/", 1)[0]


def _free_port_on(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def _unpack(bundle: Path, hosts: Path) -> Path:
    """A bundle's archive unpacked on its "host" (a directory of its own), owned by the
    host's user: what `scp NAME.tar host:` and `tar -xf NAME.tar` there leave."""
    import tarfile

    with tarfile.open(bundle) as tar:
        tar.extractall(hosts, filter="data")
    root = hosts / bundle.name.removesuffix(".tar")
    _chown_tree(root, HOST_UID)
    return root


class BundleHost:
    """One machine of the federation: its unpacked bundle, started with its own `start.sh`
    (docker compose as the bundle's owner, a compose project and network of its own)."""

    def __init__(self, root: Path, tag: str, env: dict[str, str] | None = None) -> None:
        self.root, self.name = root, f"pflarena-test-{os.getpid()}-{next(_projects)}"
        self.env = os.environ | {"PFLARENA_TAG": tag, "PFLARENA_PROJECT": self.name} | (env or {})

    def start(self) -> None:
        done = subprocess.run([str(self.root / "start.sh")], env=self.env, capture_output=True,
                              text=True, timeout=UP_TIMEOUT_S)  # fmt: skip
        assert done.returncode == 0, f"{self.root.name}: start.sh: {done.stdout}{done.stderr}"

    def compose(self, *args: str, check: bool = True) -> str:
        owner = {"PFLARENA_UID": str(HOST_UID), "PFLARENA_GID": str(HOST_UID)}
        done = subprocess.run([*COMPOSE, "-p", self.name, *args], cwd=self.root,
                              env=self.env | owner, capture_output=True, text=True, timeout=300)  # fmt: skip
        if check:
            assert done.returncode == 0, f"compose {args}: {done.stdout}{done.stderr}"
        return done.stdout + done.stderr

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).strip().splitlines()[-1]

    def containers(self) -> list[str]:
        return self.compose("ps", "-q").split()

    def healthy(self, service: str) -> None:
        container = self.container(service)
        deadline = time.monotonic() + UP_TIMEOUT_S
        while (status := _inspect(container, "{{.State.Health.Status}}")) != "healthy":
            assert time.monotonic() < deadline, f"{service}: {status}\n{self.logs()}"
            time.sleep(1)

    def logs(self, tail: int = 30) -> str:
        return f"--- {self.root.name} ---\n" + self.compose(
            "logs", "--no-color", "--tail", str(tail), check=False
        )

    def down(self) -> None:
        self.compose("down", "--remove-orphans", "-t", "10", check=False)


def _firewall(container: str, allowed: tuple[str, int]) -> None:
    """The host's firewall, as a node host's operator would set it: out of the container's
    network namespace only to its own network and the SuperLink's one port, nothing else."""
    pid = _inspect(container, "{{.State.Pid}}")
    subnets = _inspect(container, "{{range .NetworkSettings.Networks}}{{.IPAddress}}/"
                       "{{.IPPrefixLen}} {{end}}").split()  # fmt: skip
    rules = [["-o", "lo", "-j", "ACCEPT"]]
    rules += [["-d", subnet, "-j", "ACCEPT"] for subnet in subnets]
    rules += [["-d", allowed[0], "-p", "tcp", "--dport", str(allowed[1]), "-j", "ACCEPT"]]
    rules += [["-j", "REJECT"]]
    for rule in rules:
        subprocess.run(["nsenter", "-t", pid, "-n", "iptables", "-A", "OUTPUT", *rule],
                       check=True, capture_output=True, timeout=30)  # fmt: skip


def _reaches(container: str, address: str, port: int) -> bool:
    """Whether a TCP connection from ``container``'s network namespace to ``address:port``
    is accepted within 5 s."""
    pid = _inspect(container, "{{.State.Pid}}")
    probe = (
        "import socket, sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), "
        "timeout=5).close()\nexcept OSError:\n sys.exit(1)"
    )
    done = subprocess.run(["nsenter", "-t", pid, "-n", sys.executable, "-c", probe, address,
                           str(port)], capture_output=True, timeout=60)  # fmt: skip
    return done.returncode == 0


class OperatorHost:
    """The operator's laptop: a network of its own, its bundle, the ``flwr`` CLI and
    ``pflarena`` (the app image's), reaching the SuperLink only at its published address."""

    def __init__(self, root: Path, tag: str) -> None:
        self.root, self.tag = root, tag
        self.network = f"pflarena-test-{os.getpid()}-{next(_projects)}-operator"
        subprocess.run(["docker", "network", "create", self.network], check=True,
                       capture_output=True)  # fmt: skip
        self.runs = 0
        self.app = Path("app")  # the laid-out app, relative to root

    def _cmd(self, script: str) -> list[str]:
        return ["docker", "run", "--rm", "--network", self.network,
                "--user", f"{HOST_UID}:{HOST_UID}", "-e", "HOME=/op/home",
                "-e", "FLWR_HOME=/op/home", "-v", f"{self.root}:/op", "-w", "/op",
                "--entrypoint", "bash", image_name("app", self.tag), "-c", script]  # fmt: skip

    def run(self, script: str, timeout: float = 300.0) -> str:
        done = subprocess.run(self._cmd(script), capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"operator: {script}: {done.stdout}{done.stderr}"
        return done.stdout

    def submit(self, run_config: dict[str, Any]) -> subprocess.Popen:
        self.runs += 1
        overrides = self.root / f"run{self.runs}.toml"
        overrides.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in run_config.items()))
        log = open(self.root / f"flwr-run{self.runs}.log", "w")  # noqa: SIM115
        script = f"flwr run {self.app} federation --run-config run{self.runs}.toml --stream"
        return subprocess.Popen(self._cmd(script), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip

    def online_nodes(self) -> int:
        out = self.run("flwr supernode list federation --format json")
        return sum(1 for n in json.loads(out).get("nodes", []) if n.get("status") == "online")

    def wait_online(self, count: int, why: Any) -> None:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while (online := self.online_nodes()) != count:
            assert time.monotonic() < deadline, f"{online} of {count} nodes online\n{why()}"
            time.sleep(3)

    def remove(self) -> None:
        subprocess.run(["docker", "network", "rm", self.network], capture_output=True)


def _bundle_files(root: Path) -> dict[str, str]:
    """Every file of an unpacked bundle and its mode."""
    return {str(p.relative_to(root)): oct(p.stat().st_mode & 0o777)
            for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


def _trained(record: dict[str, Any], client: int) -> bool:
    """Whether ``client`` trained in round ``record`` without a failure and was evaluated."""
    train = record.get("train") or {}
    failed = {p.get("client") for p in train.get("problems", [])}
    per_client = (record.get("evaluation") or {}).get("per_client") or {}
    return client in train.get("sampled", []) and client not in failed and str(client) in per_client


def _wait_round(out: Path, proc: subprocess.Popen, wanted: Any, why: Any) -> dict[str, Any]:
    """The first round of ``out``'s run for which ``wanted(record)`` holds; waits for it."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        path = out / "rounds.jsonl"
        for record in read_rounds(path) if path.exists() else []:
            if wanted(record):
                return record
        assert proc.poll() is None, f"the run ended first\n{why()}"
        assert time.monotonic() < deadline, f"no such round\n{why()}"
        time.sleep(1)


def test_several_hosts_from_their_bundles(tmp_path: Path, image_tag: str) -> None:
    """A federation over "hosts" that share nothing but the network: the SuperLink's host,
    SuperNode hosts and the operator each on a Docker network of their own, each holding only
    the bundle ``pflarena bundle`` made for it (and a SuperNode host only its own client's
    shard), reaching each other only through the SuperLink's port published on this machine's
    non-loopback address, the address its certificate names.

    * The SuperNode hosts' firewalls let out only the SuperLink's port: from them, the
      SuperLink's container and any other port of the SuperLink's address are unreachable,
      and the federation works all the same.
    * A run submitted from the operator's network completes with the in-process run's rounds.
    * A second run (Ditto: each client's personal model in its host's state): a third host,
      whose bundle is made after the run started, joins as a device without Docker
      (``run-node.sh``); then a host loses power and comes back at once (its containers
      killed and removed, made again by its ``start.sh`` from its bundle and state while the
      SuperLink still holds its node online) and takes part again holding its client state.
    """
    _need_root("the hosts' firewalls (iptables in their network namespaces)",
               ("nsenter", "iptables", "ip"))  # fmt: skip
    from pflarena.cli import main

    address = _host_address()
    port = _free_port_on(address)
    machine = tmp_path / "operator-machine"  # the operator's own files: where bundles are made
    shards = write_test_shards(machine, 3)
    fed = machine / "federation"
    bundle = ["bundle"]
    assert main([*bundle, "superlink", "--dir", str(fed), "--address", f"{address}:{port}"]) == 0
    for i, name in enumerate(["node-a", "node-b"]):
        assert main([*bundle, "supernode", name, "--dir", str(fed), "--shard", str(shards[i])]) == 0
    assert main([*bundle, "operator", "--dir", str(fed)]) == 0
    # A bundle that would dial a name the SuperLink's certificate lacks is refused when made.
    wrong = ["supernode", "node-x", "--dir", str(fed), "--shard", str(shards[0])]
    assert main([*bundle, *wrong, "--superlink", f"localhost.localdomain:{port}"]) != 0
    assert not (fed / "bundles" / "node-x").exists()

    hosts = tmp_path / "hosts"
    hosts.mkdir()
    unpacked = {n: _unpack(fed / "bundles" / f"{n}.tar", hosts) for n in
                ("superlink", "node-a", "node-b", "operator")}  # fmt: skip
    for name, root in unpacked.items():
        files = _bundle_files(root)
        print(f"{name}'s bundle: {sorted(files)}")
        assert all(mode in ("0o600", "0o700") for mode in files.values()), files
        assert not [f for f in files if f.endswith("ca.key")], f"the CA's key in {name}'s bundle"
    assert [f for f in _bundle_files(unpacked["node-a"]) if f.startswith("data/")] == [
        f"data/{shards[0].name}"
    ], "node-a holds data that is not its own"
    assert "credentials/operator.token" not in _bundle_files(unpacked["superlink"])

    link = BundleHost(unpacked["superlink"], image_tag, {"PFLARENA_BIND": address})
    nodes = {n: BundleHost(unpacked[n], image_tag) for n in ("node-a", "node-b")}
    operator = OperatorHost(unpacked["operator"], image_tag)
    plain_node: dict[str, str] = {}
    everyone = [link, *nodes.values()]

    def logs() -> str:
        extra = ""
        if plain_node.get("id"):
            extra = subprocess.run(["docker", "logs", "--tail", "40", plain_node["id"]],
                                   capture_output=True, text=True).stdout  # fmt: skip
        return "\n".join(h.logs() for h in everyone) + f"\n--- node-c ---\n{extra}"

    try:
        link.start()
        link.healthy("superlink")
        (operator.root / "keys").mkdir()
        for name in nodes:  # public keys: the operator has them from the federation directory
            shutil.copy(fed / "certs" / "nodes" / name / "node.key.pub",
                        operator.root / "keys" / f"{name}.pub")  # fmt: skip
        operator.app = flwr_run_dir(operator.root / "apps").relative_to(operator.root)
        (operator.root / "home").mkdir()
        _chown_tree(operator.root, HOST_UID)
        operator.run(
            "./connect.sh && for key in keys/*.pub; do flwr supernode register $key federation; "
            f"done && pflarena approve {operator.app} --signing-key credentials/app-signing.key"
        )
        for node in nodes.values():
            node.start()
        for node in nodes.values():
            node.healthy("supernode")
            for container in node.containers():
                _firewall(container, (address, port))
        operator.wait_online(2, logs)

        # Only the Fleet port: nothing else of the SuperLink's host is reachable from a node.
        probe = nodes["node-a"].container("supernode")
        superlink_ip = _inspect(link.container("superlink"),
                                "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")  # fmt: skip
        with socket.socket() as listener:  # another service on the SuperLink host's address
            listener.bind((address, 0))
            listener.listen()
            other = listener.getsockname()[1]
            reach = {
                f"{address}:{port}": _reaches(probe, address, port),
                f"{address}:{other}": _reaches(probe, address, other),
                f"{superlink_ip}:{SUPERLINK_PORT}": _reaches(probe, superlink_ip, SUPERLINK_PORT),
            }
        print(f"from node-a's host: {reach}")
        assert reach == {f"{address}:{port}": True, f"{address}:{other}": False,
                         f"{superlink_ip}:{SUPERLINK_PORT}": False}, reach  # fmt: skip

        # A run from the operator's network: the in-process run's rounds.
        cfg = run_config(Path("/runs/hosts"), num_clients=2, num_rounds=2, round_timeout=180.0)
        proc = operator.submit(cfg.to_run_config())
        rc = proc.wait(timeout=RUN_TIMEOUT_S)
        out = link.root / "runs" / "hosts"
        flwr_log = (operator.root / "flwr-run1.log").read_text(errors="replace")[-3000:]
        assert rc == 0, f"flwr run exited {rc}\n{flwr_log}\n{logs()}"
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "completed", summary
        rounds = read_rounds(out / "rounds.jsonl")
        assert [r["train"]["clients"] for r in rounds[1:]] == [2, 2], rounds
        local = in_process_rounds(cfg, shards[:2], tmp_path)
        assert evaluations(rounds) == pytest.approx(evaluations(local), abs=1e-9)
        print("several hosts, FedAvg:", evaluations(rounds))

        # A second run, started with the two hosts; a third joins it mid-run.
        num_rounds = 30
        cfg = run_config(Path("/runs/join"), strategy="ditto", num_clients=3,
                         min_available_clients=2, num_rounds=num_rounds, round_timeout=120.0)  # fmt: skip
        proc = operator.submit(cfg.to_run_config())
        out = link.root / "runs" / "join"
        _wait_round(out, proc, lambda r: r["round"] >= 1, logs)
        assert (
            main([*bundle, "supernode", "node-c", "--dir", str(fed), "--shard", str(shards[2])])
            == 0
        )
        public = fed / "certs" / "nodes" / "node-c" / "node.key.pub"
        shutil.copy(public, operator.root / "keys" / "node-c.pub")
        _chown_tree(operator.root / "keys", HOST_UID)
        operator.run("flwr supernode register keys/node-c.pub federation")
        device = _unpack(fed / "bundles" / "node-c.tar", hosts)
        network = f"{operator.network}-node-c"
        subprocess.run(["docker", "network", "create", network], check=True, capture_output=True)
        plain_node["network"] = network
        # A device without Docker: its bundle's run-node.sh, the SuperNode and its executor as
        # two processes (here in a container of its own, the image's Python for the device's).
        plain_node["id"] = subprocess.run(
            ["docker", "run", "-d", "--network", network, "--user", f"{HOST_UID}:{HOST_UID}",
             "-e", "HOME=/tmp", "-v", f"{device}:/opt/node-c", "--entrypoint",
             "/opt/node-c/run-node.sh", image_name("app", image_tag)],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        _firewall(plain_node["id"], (address, port))
        joined = _wait_round(out, proc, lambda r: _trained(r, 2), logs)
        print(f"node-c, made after the run started, trains in round {joined['round']}")
        assert joined["round"] >= 2, joined

        # node-a's host loses power and comes back at once: its containers killed (its
        # SuperNode cannot leave: the SuperLink holds its key's node online until its
        # heartbeats are missed, about a minute, and refuses to activate it meanwhile),
        # removed, made again by start.sh from its bundle and state. Its files are compared
        # from the kill on: while it runs, each message deletes the versions the server no
        # longer needs.
        state = nodes["node-a"].root / "state"
        old = nodes["node-a"].container("clientapp")
        nodes["node-a"].compose("kill")
        before = _tree_digest(state)
        assert [k for k in before if "personal" in k], f"no personal model: {sorted(before)}"
        nodes["node-a"].compose("down", "-t", "10")
        rebooted = max(r["round"] for r in read_rounds(out / "rounds.jsonl"))
        assert before.items() <= _tree_digest(state).items(), "state lost in the reboot"
        nodes["node-a"].start()
        assert nodes["node-a"].container("clientapp") != old
        nodes["node-a"].healthy("supernode")
        waited = nodes["node-a"].compose("logs", "--no-color", "supernode")
        assert "refused to activate this node (code 2004)" in waited, waited[-3000:]
        for container in nodes["node-a"].containers():
            _firewall(container, (address, port))
        back = _wait_round(out, proc, lambda r: r["round"] > rebooted + 1 and _trained(r, 0), logs)
        print(f"node-a rebooted after round {rebooted}, trains again in round {back['round']}")
        assert not back["train"].get("state_problems"), back["train"]
        assert not back["evaluation"].get("state_problems"), back["evaluation"]

        rc = proc.wait(timeout=RUN_TIMEOUT_S)
        flwr_log = (operator.root / "flwr-run2.log").read_text(errors="replace")[-3000:]
        assert rc == 0, f"flwr run exited {rc}\n{flwr_log}\n{logs()}"
        rounds = read_rounds(out / "rounds.jsonl")
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "completed", summary
        assert [r["round"] for r in rounds] == list(range(num_rounds + 1))
        assert sorted(rounds[0]["evaluation"]["per_client"]) == ["0", "1"], rounds[0]
        assert sorted(rounds[-1]["evaluation"]["per_client"]) == ["0", "1", "2"], rounds[-1]
        assert not [r for r in rounds[1 : joined["round"] - 1] if 2 in r["train"]["sampled"]]
    finally:
        print(logs())
        for host in everyone:
            host.down()
        if plain_node.get("id"):
            subprocess.run(["docker", "rm", "-f", plain_node["id"]], capture_output=True)
        if plain_node.get("network"):
            subprocess.run(["docker", "network", "rm", plain_node["network"]], capture_output=True)
        operator.remove()
