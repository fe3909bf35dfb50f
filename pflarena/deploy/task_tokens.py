"""Task tokens handed to Flower's app processes without a command line.

A SuperLink or SuperNode hands each task (a run's ServerApp, a message's ClientApp) to its
executor with a token; whoever holds the token acts as that task on the Runtime API: pulls
its input (the message, with the server's model or a client's personal state), pushes its
output and status (ending a run as failed), writes into its log. flwr 1.41's executor
(``SubprocessExecutor.launch``) starts ``flwr-serverapp`` / ``flwr-clientapp --token
<256 hex digits>``, so on a host shared with others every local user reads the token in
``ps`` while the task runs, and with it steers or ends the operator's run
(``docs/threat-model.md``, "A host shared with others").

:class:`TokenFileExecutor` starts the same command with ``--token-file /dev/fd/N`` instead
(every Flower app command takes it: ``flwr.common.args.add_args_flwr_app_common``), where
``N`` is an anonymous in-memory file (``memfd_create``, mode 0600, on no file system)
holding the token, inherited by the child alone. Another user can read neither the file
(``/proc/PID/fd`` of a process that is not theirs is closed to them) nor the command line's
secret (there is none). A pipe would not do: Flower reads the token file only if it is a
regular file, which a memfd is. :func:`use_token_files` makes this process's SuperExec
(``flower-superexec``'s loop, run by ``pflarena executor`` in both its modes) use it.

The arguments are built here, not by Flower's ``launch`` with its ``Popen`` patched: a
test compares them with Flower's own, token aside (``tests/test_task_tokens.py``), so an
upgrade that adds a flag fails there.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import Any

__all__ = ["TOKEN_FILE_FLAG", "TokenFileExecutor", "task_command", "token_fd", "use_token_files"]

#: The flag every Flower app command reads its token file from.
TOKEN_FILE_FLAG = "--token-file"


def token_fd(token: str) -> int:
    """An anonymous in-memory file (mode 0600) holding ``token`` and a newline, read from its
    start; the caller passes the descriptor to one child and closes it."""
    fd = os.memfd_create("flwr-task-token", os.MFD_CLOEXEC)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode("ascii") + b"\n")
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def task_command(spec: Any, token_path: str) -> list[str]:
    """The command Flower's ``SubprocessExecutor`` runs for ``spec`` (an ``ExecutionSpec``),
    reading its token from ``token_path``."""
    from flwr.supercore.constant import TASK_TYPE_TO_APPIO_API_ADDRESS_ARG, TASK_TYPE_TO_COMMAND

    args = [
        TASK_TYPE_TO_COMMAND[spec.task_type],
        TASK_TYPE_TO_APPIO_API_ADDRESS_ARG[spec.task_type],
        spec.runtime_api_address,
        TOKEN_FILE_FLAG,
        token_path,
    ]
    if spec.insecure:
        args.append("--insecure")
    elif spec.root_certificates_path is not None:
        args += ["--root-certificates", spec.root_certificates_path]
    if spec.parent_pid is not None:
        args += ["--parent-pid", str(spec.parent_pid)]
    if spec.runtime_dependency_install:
        args.append("--allow-runtime-dependency-installation")
    return args


class TokenFileExecutor:
    """Flower's ``SubprocessExecutor`` (every task a fresh process of Flower's app command,
    no capacity gate, nothing to reconcile), the task's token handed over in an inherited
    in-memory file, never on the command line. Flower's ``Executor`` protocol."""

    def get_eligible_capacity(self, supported_task_types: set, **_: Any) -> tuple[set, set[str]]:
        return supported_task_types, set()

    def wait_for_capacity(self, *_: Any, **__: Any) -> None:
        return None

    def reconcile(self) -> None:
        return None

    def close(self) -> None:
        return None

    def launch(self, spec: Any) -> Any:
        from flwr.supercore.superexec.executor import LaunchResult

        fd = token_fd(spec.token)
        try:
            output = subprocess.DEVNULL if spec.suppress_output else None
            subprocess.Popen(  # noqa: S603 - Flower's own app command, as Flower starts it
                task_command(spec, f"/dev/fd/{fd}"),
                pass_fds=(fd,),
                stdout=output,
                stderr=output,
            )
        except OSError as exc:
            return LaunchResult.failed(f"could not start {spec.task_type}: {exc}")
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
        return LaunchResult.accepted()


def use_token_files() -> None:
    """Make this process's SuperExec loop start tasks with :class:`TokenFileExecutor`
    wherever Flower would use its ``SubprocessExecutor`` (the only executor pflarena runs);
    a wrapped ``get_executor`` (the warm executor's) keeps deciding first."""
    from flwr.supercore.constant import ExecutorType
    from flwr.supercore.superexec import run_superexec as module

    flower_get_executor = module.get_executor

    def get_executor(executor_type: Any, executor_config: Any = None, **kwargs: Any) -> Any:
        if executor_type == ExecutorType.SUBPROCESS:
            return TokenFileExecutor()
        return flower_get_executor(executor_type, executor_config, **kwargs)

    module.get_executor = get_executor
