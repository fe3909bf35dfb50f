"""Processes this package starts: their environment, ports, readiness and stopping.

Shared by the simulation launcher (:mod:`pflarena.runtime.launch`) and the local deployment
(:mod:`pflarena.deploy.local`). Everything here acts only on processes we started, by PID.
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
from pathlib import Path

__all__ = ["flower_env", "free_port", "stop", "stop_group", "wait_healthy"]


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


def stop(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the process we started, then SIGKILL if it does not exit in time."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


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
