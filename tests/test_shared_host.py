"""A host shared with others: another local user can neither read, steer nor end a run.

One secure deployment, ``pflarena local-deploy --tls --auth --num-supernodes 2 --executor
flower`` (Flower's executor: a fresh ``flwr-serverapp`` / ``flwr-clientapp`` process per task,
the processes whose command lines carried task tokens), in a directory under a parent every
user may enter. Another user is a real second uid (``setpriv --reuid``, no account needed;
the suite runs as root in CI, and these tests need root to make that user). As that user:

* every process's command line is read, over and over, while the operator's run goes on:
  no task token (256 hex digits), no SuperExec secret, no operator token appears, though the
  ServerApp's and the ClientApps' processes were seen; no deployment process's environment
  or file descriptors can be read;
* the deployment directory, its logs, shards, state, certificates and the run's results
  cannot be listed or opened, during the run and after it;
* no port of the deployment can be bound (they are bound before they are announced), and a
  256 MB request body is refused before it is read;
* a deployment directory prepared in advance (a planted operator token, signing key, a
  deployment record naming a process to kill) is refused by ``local-deploy``, ``certs``,
  ``compose`` and ``local-deploy --stop``, and nothing of it is used or changed.

The operator's run beside all this completes with the evaluations of the same run
in-process on the same shards. And each SuperNode's executor trusts its own node's Runtime API
certificate only: it cannot talk to another node (nor to whoever would take a node's port).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deployment_harness import evaluations, flwr_run_args, in_process_rounds, run_config
from processes import cmdline, descendants, proc_state
from strangers import acquire_task

from pflarena.core.config import toml_value
from pflarena.deploy.local import CONNECTION, STATE_FILE, LocalDeployment
from pflarena.server.results import read_rounds

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="making a second local user needs root"),
]

NUM_NODES = 2
RUN_TIMEOUT_S = 400.0
PFLARENA = [sys.executable, "-m", "pflarena.cli"]
#: A uid with no account: the other user of the host.
OTHER_UID = 64000 + secrets.randbelow(1000)
#: What a task token looks like (flwr: 128 random bytes, hex).
TOKEN = re.compile(r"[0-9a-f]{256}")


def _pflarena(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*PFLARENA, *args], capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _as_other(code: str, *args: str, timeout: float = 120.0, background: bool = False):
    """Python ``code`` run as the other user (``setpriv``), its JSON answer on stdout."""
    if shutil.which("setpriv") is None:
        raise AssertionError("setpriv (util-linux) is needed to act as another user")
    cmd = [
        "setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", "--",
        sys.executable, "-c", code, *args,
    ]  # fmt: skip
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    if background:
        return subprocess.Popen(
            cmd, env=env, cwd="/tmp", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    result = subprocess.run(cmd, env=env, cwd="/tmp", capture_output=True, text=True,
                            timeout=timeout)  # fmt: skip
    assert result.returncode == 0, f"as uid {OTHER_UID}: {result.stderr[-2000:]}"
    return json.loads(result.stdout)


# What the other user runs ---------------------------------------------------------------
_WATCH = r"""
import json, os, sys, time
stop = sys.argv[1]
seen, environ, fds = {}, {}, {}
while not os.path.exists(stop):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                line = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if line and line not in seen:
            seen[line] = pid
            for what, path in (("environ", f"/proc/{pid}/environ"), ("fd", f"/proc/{pid}/fd")):
                try:
                    os.listdir(path) if what == "fd" else open(path, "rb").read()
                    (environ if what == "environ" else fds)[line] = "read"
                except OSError as exc:
                    (environ if what == "environ" else fds)[line] = type(exc).__name__
    time.sleep(0.02)
print(json.dumps({"cmdlines": sorted(seen), "environ": environ, "fds": fds}))
"""

_TRY_READ = r"""
import json, os, sys
answers = {}
for path in sys.argv[1:]:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        answers[path] = "read"
    except OSError as exc:
        answers[path] = type(exc).__name__
print(json.dumps(answers))
"""

_TRY_BIND = r"""
import json, socket, sys
answers = {}
for port in sys.argv[1:]:
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", int(port)))
        answers[port] = "bound"
    except OSError as exc:
        answers[port] = exc.strerror
    finally:
        sock.close()
print(json.dumps(answers))
"""

_BIG_BODY = r"""
import json, socket, ssl, sys, time
port, path = int(sys.argv[1]), sys.argv[2]
context = ssl.create_default_context()
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # a stranger's client
start = time.monotonic()
with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
    with context.wrap_socket(raw) as conn:
        conn.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/protobuf\r\n"
            f"Content-Length: {256 * 1024 * 1024}\r\n\r\n".encode() + b"\0" * 65536
        )
        answer = conn.recv(4096).decode(errors="replace")
print(json.dumps({"status": answer.split("\r\n", 1)[0], "seconds": time.monotonic() - start}))
"""


# The deployment ---------------------------------------------------------------------------
class SharedHost:
    """The module's deployment, the directory others may enter above it, and the secrets
    to look for."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.root = base / "deploy"
        self.dep: LocalDeployment | None = None
        self.pids: set[int] = set()

    def note(self) -> None:
        assert self.dep is not None
        self.pids |= {p.pid for p in self.dep.processes()}
        self.pids |= descendants({p for p in self.pids if proc_state(p)})

    def secrets(self) -> dict[str, str]:
        """Every secret of the deployment, by file."""
        certs = self.root / "certs"
        files = [certs / "operator.token", *sorted((certs / "secrets").iterdir())]
        return {str(f): f.read_text().strip() for f in files}

    def logs(self, lines: int = 25) -> str:
        from pflarena.deploy.local import tail

        return "\n".join(
            f"----- {path.name} -----\n{tail(path, lines)}"
            for path in sorted((self.root / "logs").glob("*.log"))
        )


@pytest.fixture(scope="module")
def host() -> Iterator[SharedHost]:
    base = Path(tempfile.mkdtemp(prefix="pflarena-shared-", dir="/tmp"))
    base.chmod(0o755)  # every user may enter: only the deployment's own modes keep them out
    state = SharedHost(base)
    try:
        started = _pflarena(
            "local-deploy", "--tls", "--auth", "--num-supernodes", str(NUM_NODES),
            "--executor", "flower", "--port", "0", "--detach", "--dir", str(state.root),
            "--partition", "iid", "--seed", "0",
        )  # fmt: skip
        assert started.returncode == 0, f"{started.stdout}{started.stderr}"
        state.dep = LocalDeployment.from_record(state.root)
        state.note()
        yield state
    finally:
        if (state.root / STATE_FILE).exists():
            stopped = _pflarena("local-deploy", "--stop", "--dir", str(state.root), timeout=120)
            print(stopped.stdout, stopped.stderr)
        deadline = time.monotonic() + 20
        while (alive := {p for p in state.pids if proc_state(p)}) and time.monotonic() < deadline:
            time.sleep(0.5)
        leftovers = {pid: cmdline(pid)[:160] for pid in alive}
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)
        assert not alive, f"still running after --stop: {leftovers}"


def _submit(host: SharedHost, cfg: Any, scratch: Path) -> tuple[subprocess.Popen, Path]:
    """``flwr run`` of ``cfg`` as the operator; its overrides and output in ``scratch``."""
    assert host.dep is not None
    overrides = scratch / "operator.toml"
    overrides.write_text(
        "".join(f"{k} = {toml_value(v)}\n" for k, v in cfg.to_run_config().items())
    )
    log = scratch / "flwr-run-operator.log"
    with open(log, "wb") as handle:
        proc = subprocess.Popen(
            flwr_run_args(CONNECTION, overrides, host.dep.approved_app(host.root / "app")),
            env=host.dep.cli_env(),
            cwd=host.dep.cli_home,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return proc, log


def _ports(host: SharedHost) -> list[int]:
    assert host.dep is not None
    ports = [host.dep.port]
    for node in host.dep.supernodes:
        args = cmdline(node.pid).split()
        ports.append(int(args[args.index("--port") + 1]))
    return ports


def _everything_under(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*")) + [str(root)]


# The tests -------------------------------------------------------------------------------
def test_another_user_sees_no_secret_and_reads_nothing_while_the_run_completes(
    host: SharedHost, tmp_path: Path
) -> None:
    dep = host.dep
    assert dep is not None
    stop_watching = host.base / "stop-watching"  # where the other user can see it
    watcher = _as_other(_WATCH, str(stop_watching), background=True)
    out = host.root / "runs" / "operator"
    cfg = run_config(out, num_clients=NUM_NODES, num_rounds=2, round_timeout=180.0,
                     shards_dir=str(host.root / "shards"))  # fmt: skip
    proc, log = _submit(host, cfg, tmp_path)
    try:
        rounds_file = out / "rounds.jsonl"
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (rounds_file.exists() and read_rounds(rounds_file)):
            assert proc.poll() is None, f"flwr run ended early\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no round 0\n{host.logs()}"
            time.sleep(0.3)
        host.note()

        # During the run: nothing of it can be listed or read, no port taken, no big body read.
        during = _as_other(_TRY_READ, *_everything_under(host.root))
        assert during and all(v != "read" for v in during.values()), during
        bound = _as_other(_TRY_BIND, *map(str, _ports(host)))
        assert all(v != "bound" for v in bound.values()), bound
        big = _as_other(_BIG_BODY, str(dep.port), "/v1/fleet/push-object")
        print(f"a 256 MB body to the Fleet API: {big}")
        assert " 413 " in big["status"] + " ", big

        proc.wait(timeout=RUN_TIMEOUT_S)
        assert proc.returncode == 0, log.read_text()[-3000:]
    finally:
        stop_watching.touch()
        try:
            seen_out, seen_err = watcher.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            watcher.kill()  # ours: stopped by its PID
            seen_out, seen_err = watcher.communicate()
        if proc.poll() is None:
            proc.kill()
    assert watcher.returncode == 0, seen_err[-2000:]
    seen = json.loads(seen_out)

    # Every command line another user could read while the run went on (of this deployment's
    # processes: each names a file under its directory; other tests' may run beside them).
    lines = [line for line in seen["cmdlines"] if str(host.root) in line]
    apps = [
        line for line in lines if re.search(r"flwr-(server|client)app|pflarena-serverapp", line)
    ]
    print(f"the other user saw {len(lines)} command lines, {len(apps)} of task processes")
    assert any("serverapp" in line for line in apps), "the ServerApp's process was never seen"
    assert any("flwr-clientapp" in line for line in apps), "no ClientApp process was seen"
    assert all("--token-file" in line and "--token " not in line for line in apps), apps
    assert not [line for line in lines if TOKEN.search(line)], "a task token on a command line"
    for path, value in host.secrets().items():
        assert not [line for line in seen["cmdlines"] if value in line], f"{path} on a command line"
    for line in apps:  # their environment and file descriptors are closed to others
        assert seen["environ"].get(line) != "read" and seen["fds"].get(line) != "read", line

    # The run completed as it does in-process.
    rounds = read_rounds(out / "rounds.jsonl")
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    assert [r["round"] for r in rounds] == [0, 1, 2]
    local = in_process_rounds(cfg, dep.shards, tmp_path)
    assert evaluations(rounds) == pytest.approx(evaluations(local), abs=1e-9)

    # After it: still nothing readable; what the deployment's processes wrote is 0600/0700.
    after = _as_other(_TRY_READ, *_everything_under(host.root))
    assert all(v != "read" for v in after.values()), after
    written = [
        p for d in ("logs", "state", "runs", "certs", "shards") for p in (host.root / d).rglob("*")
    ]
    written += [p for home in host.root.glob("home-*") for p in home.rglob("*")]
    loose = {str(p): oct(p.stat().st_mode & 0o777) for p in written
             if not p.is_symlink() and p.stat().st_mode & 0o077}  # fmt: skip
    assert not loose, f"readable or writable by others: {loose}"


def test_each_executor_trusts_its_own_supernode_only(host: SharedHost) -> None:
    """Node 0's executor's trust anchor (its node's Runtime CA) does not verify node 1's
    Runtime API: an executor talks to its own SuperNode only, whoever answers on a port."""
    dep = host.dep
    assert dep is not None
    ports = _ports(host)[1:]
    own = [dep.runtime_certs(f"supernode-{i}").ca_cert for i in range(NUM_NODES)]
    for index, port in enumerate(ports):
        reached = acquire_task(f"127.0.0.1:{port}", own[index])
        assert reached.startswith("refused 401"), reached  # its own: TLS fine, no secret
        other = acquire_task(f"127.0.0.1:{port}", own[(index + 1) % NUM_NODES])
        print(f"node {index}'s Runtime API with the other node's CA: {other}")
        assert "CERTIFICATE_VERIFY_FAILED" in other, other


_PLANT = r"""
import json, os, sys
root = sys.argv[1]
os.makedirs(os.path.join(root, "certs"), mode=0o755)
with open(os.path.join(root, "certs", "operator.token"), "w") as handle:
    handle.write("the-other-users-token-0123456789")
with open(os.path.join(root, "certs", "app-signing.key"), "w") as handle:
    handle.write("not a key")
with open(os.path.join(root, "deployment.json"), "w") as handle:
    json.dump({"address": "127.0.0.1:1", "tls": True, "auth": True, "shards": [],
               "processes": [{"name": "superlink", "pid": int(sys.argv[2]),
                              "start_time": int(sys.argv[3]), "log": "/tmp/x"}]}, handle)
print(json.dumps(sorted(os.listdir(root))))
"""


def test_a_deployment_directory_another_user_prepared_is_refused(host: SharedHost) -> None:
    """The other user prepares a directory with an operator token and signing key of theirs,
    and a deployment record naming a process of the operator's: every pflarena command that
    would use it refuses, naming the owner, and nothing in it is used or changed."""
    from processes import proc_state as state_of

    from pflarena.runtime.processes import start_time

    victim = subprocess.Popen(["sleep", "300"])
    # Where the other user may create a directory: /tmp itself (sticky, like every /tmp).
    planted = Path("/tmp") / f"pflarena-planted-{secrets.token_hex(4)}"
    try:
        _as_other(_PLANT, str(planted), str(victim.pid), str(start_time(victim.pid)))
        before = {p: p.read_bytes() for p in planted.rglob("*") if p.is_file()}
        attempts = {
            "local-deploy": _pflarena("local-deploy", "--tls", "--auth", "--num-supernodes", "1",
                                      "--port", "0", "--detach", "--dir", str(planted)),
            "local-deploy --stop": _pflarena("local-deploy", "--stop", "--dir", str(planted)),
            "certs": _pflarena("certs", "--out", str(planted / "certs"), "--secure"),
            "compose": _pflarena("compose", "--num-supernodes", "1", "--out-dir", str(planted)),
        }  # fmt: skip
        for what, result in attempts.items():
            said = (result.stdout + result.stderr).strip()
            print(f"{what}: exit {result.returncode}: {said.splitlines()[-1] if said else ''}")
            assert result.returncode != 0, (what, said)
            assert f"uid {OTHER_UID}" in said and "belongs to" in said, (what, said)
            assert "Traceback" not in said, (what, said)
        assert state_of(victim.pid), "the process the planted record named was signalled"
        assert {p: p.read_bytes() for p in planted.rglob("*") if p.is_file()} == before
        assert not (planted / "shards").exists() and not (planted / "logs").exists()
    finally:
        victim.kill()
        victim.wait()
        shutil.rmtree(planted, ignore_errors=True)
