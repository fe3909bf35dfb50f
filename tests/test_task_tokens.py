"""Task tokens reach Flower's app processes in a file descriptor, never on a command line
(:mod:`pflarena.deploy.task_tokens`)."""

from __future__ import annotations

import json
import secrets
import sys
import time
from pathlib import Path

import pytest
from flwr.supercore.constant import TASK_TYPE_TO_COMMAND, TaskType
from flwr.supercore.superexec.executor import ExecutionSpec, SubprocessExecutor

from pflarena.deploy import task_tokens
from pflarena.deploy.task_tokens import TokenFileExecutor, task_command, use_token_files


def _spec(task_type: TaskType = TaskType.CLIENT_APP, **changes) -> ExecutionSpec:
    fields = dict(
        task_type=task_type,
        runtime_api_address="127.0.0.1:9094",
        token=secrets.token_hex(128),
        insecure=False,
        root_certificates_path="/certs/ca.crt",
        runtime_dependency_install=False,
        parent_pid=4321,
        suppress_output=False,
        task_id=7,
    )
    return ExecutionSpec(**(fields | changes))


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"insecure": True, "root_certificates_path": None},
        {"parent_pid": None, "runtime_dependency_install": True},
        {"task_type": TaskType.SERVER_APP},
        {"task_type": TaskType.SIMULATION, "suppress_output": True},
    ],
)
def test_command_is_flowers_with_the_token_in_a_file(changes, monkeypatch) -> None:
    """The same command Flower's own executor runs, ``--token T`` replaced by
    ``--token-file PATH``: a flag Flower adds in an upgrade fails here."""
    spec = _spec(**changes)
    started = []
    monkeypatch.setattr(
        "flwr.supercore.superexec.executor.subprocess_executor.subprocess.Popen",
        lambda args, **kwargs: started.append(list(args)),
    )
    SubprocessExecutor().launch(spec)
    (flowers,) = started
    at = flowers.index("--token")
    expected = [*flowers[:at], "--token-file", "/dev/fd/9", *flowers[at + 2 :]]
    assert task_command(spec, "/dev/fd/9") == expected
    assert spec.token not in " ".join(task_command(spec, "/dev/fd/9"))


# A stand-in for flwr-clientapp: reads its token with Flower's own argument parser and token
# reader, and writes what it got and its own command line.
_APP = """
import argparse, json, pathlib, sys
from flwr.common.args import add_args_flwr_app_common, try_obtain_flwr_app_token
parser = argparse.ArgumentParser()
parser.add_argument("--runtime-api-address")
add_args_flwr_app_common(parser)
args = parser.parse_args()
pathlib.Path({out!r}).write_text(json.dumps({{
    "token": try_obtain_flwr_app_token(args),
    "cmdline": pathlib.Path("/proc/self/cmdline").read_bytes().decode().split("\\0"),
}}))
"""


def test_the_app_reads_its_token_from_the_inherited_descriptor(tmp_path, monkeypatch) -> None:
    """The process started reads the token with Flower's own reader, and its command line
    (what ``ps`` shows every user) does not hold it."""
    out = tmp_path / "app.json"
    app = tmp_path / "fake-clientapp"
    app.write_text(f"#!{sys.executable}\n" + _APP.format(out=str(out)))
    app.chmod(0o700)
    monkeypatch.setitem(TASK_TYPE_TO_COMMAND, TaskType.CLIENT_APP, str(app))
    spec = _spec(insecure=True, root_certificates_path=None, parent_pid=None)
    result = TokenFileExecutor().launch(spec)
    assert result.status == "accepted", result
    deadline = time.monotonic() + 60
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    got = json.loads(out.read_text())
    assert got["token"] == spec.token
    assert spec.token not in "".join(got["cmdline"])
    assert "--token-file" in got["cmdline"]


def test_the_descriptor_holds_the_token_privately() -> None:
    import os
    import stat

    fd = task_tokens.token_fd("ab" * 128)
    try:
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o600
        assert stat.S_ISREG(os.fstat(fd).st_mode)  # Flower reads a regular file only
        assert os.read(fd, 1000) == b"ab" * 128 + b"\n"
        assert not os.get_inheritable(fd)  # only the child it is passed to gets it
        assert not Path(os.readlink(f"/proc/self/fd/{fd}")).exists()  # on no file system
    finally:
        os.close(fd)


def test_flowers_superexec_uses_it(monkeypatch) -> None:
    """``pflarena executor --stock``: Flower's SuperExec loop gets :class:`TokenFileExecutor`
    for the subprocess executor it asks for."""
    from flwr.supercore.constant import ExecutorType
    from flwr.supercore.superexec import run_superexec

    monkeypatch.setattr(run_superexec, "get_executor", run_superexec.get_executor)
    use_token_files()
    assert isinstance(run_superexec.get_executor(ExecutorType.SUBPROCESS), TokenFileExecutor)


def test_the_warm_executor_falls_back_to_it() -> None:
    from pflarena.deploy.executor import ForkingExecutor

    assert isinstance(ForkingExecutor().fallback, TokenFileExecutor)
