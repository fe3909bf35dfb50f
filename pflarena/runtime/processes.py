"""Processes this package starts: their environment, ports, readiness and stopping.

The one supervisor of the project's processes: the simulation launcher
(:mod:`pflarena.runtime.launch`), the local deployment (:mod:`pflarena.deploy.local`) and the
tests' deployment harness start, watch and stop their processes with :class:`Supervised` and
:func:`stop_all`. Everything here acts only on processes we started, by PID; a process known
only from a record (a deployment stopped by a later command) is identified by its PID and the
kernel's start time, so that a reused PID is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Supervised",
    "die_with_parent",
    "flower_env",
    "free_port",
    "listening_socket",
    "start_time",
    "stop",
    "stop_all",
    "stop_group",
    "wait_healthy",
]


#: ``prctl`` option: a signal for this process when its parent exits (Linux).
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Have the kernel kill this process (SIGKILL) when its parent exits (Linux; elsewhere
    nothing): a worker forked for a run, waiting on its parent's queue, would otherwise
    wait for ever once a SIGKILL or a crash took the parent."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def flower_env(flwr_home: Path) -> dict[str, str]:
    """The environment of a Flower process or CLI call of a deployment."""
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(flwr_home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
        PFLARENA_TORCH_THREADS=env.get("PFLARENA_TORCH_THREADS", "1"),
    )
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def free_port(taken: set[int] | None = None) -> int:
    """A free TCP port on 127.0.0.1 not in ``taken`` (which it is added to)."""
    taken = taken if taken is not None else set()
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port


def listening_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a port the kernel picks) and listening, for a
    server started later to inherit (``pass_fds``): the port is taken before anyone learns
    its number, so no other process can bind it first.

    Raises
    ------
    OSError
        ``port`` is in use (``EADDRINUSE``).
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        # Linux: binds over connections in TIME_WAIT, never over a listening socket.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the SuperLink exited at start (code {proc.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the SuperLink did not answer on 127.0.0.1:{port} within {timeout:.0f}s")


def start_time(pid: int) -> int | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclass
class Supervised:
    """One process we started (``popen`` set) or one a record names (``pid`` and its
    ``started`` time: :func:`start_time`)."""

    name: str
    cmd: list[str]
    log: Path | None = None
    popen: subprocess.Popen | None = None
    pid: int = 0
    started: int | None = None

    @classmethod
    def spawn(
        cls,
        name: str,
        cmd: list[str],
        log: Path,
        env: Mapping[str, str],
        cwd: Path,
        append: bool = True,
        pass_fds: Sequence[int] = (),
        umask: int = -1,
    ) -> Supervised:
        """Start ``cmd`` with its output (stdout and stderr) in ``log``, in a session of its
        own: a Ctrl-C in the terminal reaches the command that started it only, which then
        stops it by PID. ``pass_fds`` (a bound socket, say) are inherited under the same
        numbers; ``umask``, if given, is the child's."""
        log.parent.mkdir(parents=True, exist_ok=True)
        # The log names runs, tasks and paths: its owner's alone (0600), whatever the umask.
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        with os.fdopen(os.open(log, flags, 0o600), "ab" if append else "wb") as handle:
            popen = subprocess.Popen(
                cmd,
                env=dict(env),
                stdout=handle,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                start_new_session=True,
                pass_fds=tuple(pass_fds),
                umask=umask,
            )
        return cls(name, cmd, log, popen=popen, pid=popen.pid, started=start_time(popen.pid))

    @classmethod
    def of(cls, proc: Supervised | subprocess.Popen) -> Supervised:
        """``proc`` itself, or a plain ``Popen`` wrapped."""
        if isinstance(proc, Supervised):
            return proc
        return cls(str(proc.pid), list(map(str, proc.args)), popen=proc, pid=proc.pid)

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return self.pid > 0 and start_time(self.pid) == self.started

    def send(self, signum: int) -> None:
        """Send ``signum`` if this process is still alive (by PID)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def stop(self, signum: int = signal.SIGTERM, wait: float = 30.0) -> bool:
        """Send ``signum``; True once it has exited (within ``wait`` seconds)."""
        self.send(signum)
        deadline = time.monotonic() + wait
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        return not self.alive()

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pid": self.pid,
            "start_time": self.started,
            "log": str(self.log),
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Supervised:
        return cls(
            record["name"],
            [],
            Path(record["log"]),
            pid=int(record["pid"]),
            started=record["start_time"],
        )


def stop_all(procs: Sequence[Supervised | subprocess.Popen], grace: float = 15.0) -> None:
    """SIGTERM every live one at once, wait up to ``grace`` s for them all, SIGKILL the rest
    (by PID), and reap those we started."""
    supervised = [Supervised.of(p) for p in procs]
    for proc in supervised:
        proc.send(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(p.alive() for p in supervised) and time.monotonic() < deadline:
        time.sleep(0.1)
    for proc in supervised:
        proc.send(signal.SIGKILL)
        if proc.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=10)


def stop(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the process we started, then SIGKILL if it does not exit in time."""
    stop_all([proc], grace)


def stop_group(proc: subprocess.Popen, grace: float = 60.0) -> None:
    """Stop a process started as the leader of its own process group, and whatever of its
    group is left: SIGTERM (it shuts down what it started, Ray included), SIGKILL after
    ``grace`` seconds, then SIGKILL to the group's remaining members. The leader is reaped
    only after that, so its id cannot name another group meanwhile."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while not _exited(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the leader is a zombie or gone: the rest
    proc.wait(timeout=30)


def _exited(pid: int) -> bool:
    """Whether ``pid`` (our child) has exited, without reaping it."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True
