"""A warm ClientApp executor: ``pflarena executor``, a drop-in for ``flower-superexec``.

Flower 1.41 starts a fresh ``flwr-clientapp`` process for every message a SuperNode receives
(``SubprocessExecutor.launch`` is a ``Popen``; ``run_clientapp`` serves one task and exits),
in both isolation modes, and no setting keeps one alive. That process spends ~1.2 CPU-s
importing Flower's entry point, ~2 s importing torch and the app, and in a train message
~1.5 s more on the first ``torch.optim`` call, which imports ``torch._dynamo`` lazily: 3.8-5.2
CPU-s per message, of which training is 0.1-0.2 s on the main job
(``benchmarks/results/deployment.md``).

This executor pays those imports once. Its parent process imports Flower's ClientApp runtime,
torch (with ``torch._dynamo``, and the lazily built optimizer wrappers warmed) and the app's
ClientApp module, then serves Flower's own task loop (:func:`run_superexec`, with its
arguments: this command takes ``flower-superexec``'s flags) with an executor whose ``launch``
forks a child for each ClientApp task. The child runs Flower's own ``run_clientapp`` (pull
the message, install the FAB, load the app, call it, push the reply) and exits; its task
token stays in memory. Tasks of other types start Flower's app command as Flower's
``SubprocessExecutor`` does, with the token in an inherited in-memory file instead of on the
command line (:mod:`pflarena.deploy.task_tokens`); so does ``--stock``.

Guarantees, each tested (``tests/test_executor.py``):

* **The run's code.** The child runs the app of the run's FAB: if the FAB's copy of the app's
  package differs from the one the parent imported (any ``.py`` file), the child drops the
  parent's modules of that package and imports the FAB's (torch stays imported).
* **Faults cost one message.** A child that raises replies with Flower's error message, as a
  fresh process does; one that crashes (a signal, ``os._exit``) or is killed by the kernel's
  OOM killer (children are its first choice: ``oom_score_adj`` 1000) leaves the parent
  serving the next message; one that runs past ``--task-timeout`` is killed; with
  ``--task-memory-mb`` a child gets that much address space beyond the parent's, and an
  allocation past it fails in the child (``MemoryError``, an error reply).
* **A clean parent.** The parent never initialises CUDA (checked after the imports: a forked
  CUDA context is unusable) and keeps torch at one thread while it forks, so that each child
  sets its own thread count (the parent's original one, or ``PFLARENA_TORCH_THREADS``) and
  starts its own OpenMP pool. The parent's exit handlers (its HTTP client, its executor) are
  cleared in the child; the child watches the parent and exits with it.
* **Killing the parent is a node failure**: its children follow it, and whoever supervises
  the node restarts it (``pflarena local-deploy`` does, compose's ``restart:`` does).
* **A task poll that follows the work**: Flower's SuperExec asks its SuperNode for a task every
  ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (1 s by default). This one asks every
  ``--active-poll`` seconds (default :data:`ACTIVE_POLL_S`) for ``--active-window`` seconds
  after each task it forked, then doubles its wait up to Flower's interval
  (:class:`~pflarena.deploy.waits.ActivityPoll`), so an idle node polls as it did.

These are Flower internals, not a public API (``run_superexec``'s executor factory,
``run_clientapp``'s app loader, the exit-handler registry): the pin on flwr 1.41.x stays, and
:func:`check_flower_internals` fails loudly, naming what moved, when an upgrade changes them
(the executor calls it at start; a test does too).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import os
import pickle
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

from pflarena.deploy.waits import ActivityPoll, PollClock, enable_trace, tracing

__all__ = [
    "DEFAULT_PRELOAD",
    "ForkingExecutor",
    "Preloaded",
    "check_flower_internals",
    "main",
]

#: The module the parent imports for the children (the ClientApp of pflarena's FAB).
DEFAULT_PRELOAD = "pflarena.client.app"
#: Log line prefix of the per-task records the parent writes (benchmarks parse them).
TASK_LOG_PREFIX = "warm-executor task"
#: First and longest wait (s) between a child's tries for its message's objects while its
#: SuperNode is still fetching them from the SuperLink (Flower's: 1 s, doubling up to 10 s;
#: see :func:`patch_clientapp_runtime`).
PULL_INITIAL_BACKOFF_S = 0.02
PULL_BACKOFF_CAP_S = 0.1
#: The executor's task poll while tasks come (s), and for how long after the last one;
#: ``PFLARENA_EXECUTOR_ACTIVE_POLL_S`` sets the first (Flower's interval or more: a fixed poll).
ACTIVE_POLL_S = 0.1
ACTIVE_WINDOW_S = 30.0
ACTIVE_POLL_ENV = "PFLARENA_EXECUTOR_ACTIVE_POLL_S"
#: Environment: seconds a child may run before it is killed (``--task-timeout``).
TASK_TIMEOUT_ENV = "PFLARENA_EXECUTOR_TASK_TIMEOUT_S"
#: Environment: address space a child may add beyond the parent's, in MiB.
TASK_MEMORY_ENV = "PFLARENA_EXECUTOR_TASK_MEMORY_MB"

# The flwr 1.41 internals this module relies on: (module, attribute).
_INTERNALS: tuple[tuple[str, str], ...] = (
    ("flwr.supercore.superexec.run_superexec", "run_superexec"),
    ("flwr.supercore.superexec.run_superexec", "get_executor"),
    ("flwr.supercore.superexec.run_superexec", "_get_task_poll_interval"),
    ("flwr.supercore.superexec.run_superexec", "time"),
    ("flwr.supercore.superexec.executor", "SubprocessExecutor"),
    ("flwr.supercore.superexec.executor", "LaunchResult"),
    ("flwr.supercore.superexec.executor", "ExecutionSpec"),
    ("flwr.supercore.cli.flower_superexec", "_parse_args"),
    ("flwr.supercore.cli.flower_superexec", "flower_superexec"),
    ("flwr.supercore.constant", "TaskType"),
    ("flwr.supercore.constant", "ExecutorType"),
    ("flwr.supernode.runtime.run_clientapp", "run_clientapp"),
    ("flwr.supernode.runtime.run_clientapp", "get_load_client_app_fn"),
    ("flwr.supernode.runtime.run_clientapp", "pull_and_inflate_object_from_tree"),
    ("flwr.supernode.runtime.run_clientapp", "install_from_fab"),
    ("flwr.supercore.exit.exit_handler", "registered_exit_handlers"),
    ("flwr.supercore.exit.exit_handler", "_lock_handlers"),
    ("flwr.common.config", "get_project_dir"),
    ("flwr.common.config", "get_project_config"),
    ("flwr.supercore.tls", "validate_and_resolve_root_certificates"),
)
_SPEC_FIELDS = ("task_type", "runtime_api_address", "token", "insecure", "root_certificates_path")
_RUN_CLIENTAPP_ARGS = (
    "runtime_api_address",
    "token",
    "insecure",
    "certificates",
    "parent_pid",
    "runtime_dependency_install",
)


class FlowerInternalsChanged(RuntimeError):
    """The installed flwr lacks a piece the warm executor builds on (an upgrade moved it)."""


def check_flower_internals() -> None:
    """Fail, naming every missing piece, unless flwr has what this executor relies on.

    Raises
    ------
    FlowerInternalsChanged
        A module, attribute, ``ExecutionSpec`` field or ``run_clientapp`` parameter is gone.
    """
    import inspect

    import flwr

    from pflarena.core.internals import missing_internals

    wanted: dict[str, list[str]] = {}
    for module_name, attribute in _INTERNALS:
        wanted.setdefault(module_name, []).append(attribute)
    missing = missing_internals(wanted)
    if not missing:
        from flwr.supercore.superexec.executor import ExecutionSpec
        from flwr.supernode.runtime.run_clientapp import run_clientapp

        fields = set(ExecutionSpec.__dataclass_fields__)
        missing += [f"ExecutionSpec.{f}" for f in _SPEC_FIELDS if f not in fields]
        params = set(inspect.signature(run_clientapp).parameters)
        missing += [f"run_clientapp({p}=...)" for p in _RUN_CLIENTAPP_ARGS if p not in params]
        superexec = importlib.import_module("flwr.supercore.superexec.run_superexec")
        sleeps = inspect.getsource(superexec).count("time.sleep(")
        if sleeps != 1 or "time.sleep(task_poll_interval)" not in inspect.getsource(superexec):
            missing.append("run_superexec's one time.sleep(task_poll_interval)")
    if missing:
        raise FlowerInternalsChanged(
            f"flwr {flwr.__version__} lacks what pflarena's warm executor relies on "
            f"(written against flwr 1.41): {', '.join(missing)}. Use Flower's own executor "
            "(flower-superexec) until pflarena supports this release."
        )


def _log(level: int, text: str, *args: Any) -> None:
    from flwr.supercore import log

    log(level, text, *args)


# --------------------------------------------------------------------------- the app's code
def package_digest(package_dir: Path) -> dict[str, str]:
    """SHA-256 of every ``.py`` file under ``package_dir``, by path relative to it."""
    return {
        str(path.relative_to(package_dir)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(package_dir.rglob("*.py"))
        if "__pycache__" not in path.parts
    }


@dataclass
class Preloaded:
    """What the parent imported: the module and the digest of its top-level package's code.

    Parameters
    ----------
    module : str
        The imported module (``pflarena.client.app``).
    package : str
        Its top-level package (``pflarena``).
    digest : dict
        :func:`package_digest` of the package the parent imported.
    """

    module: str
    package: str
    digest: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, module: str) -> Preloaded:
        """Import ``module`` and record its package's code."""
        importlib.import_module(module)
        package = module.split(".")[0]
        package_file = sys.modules[package].__file__
        if package_file is None:  # a namespace package: nothing to compare
            return cls(module, package)
        return cls(module, package, package_digest(Path(package_file).resolve().parent))

    def serves(self, project_dir: Path, module: str) -> bool:
        """Whether the app in ``project_dir`` (an installed FAB) runs the parent's code:
        ``module`` is in the preloaded package and every ``.py`` file of the FAB's copy of
        that package equals the parent's."""
        if module.split(".")[0] != self.package or not self.digest:
            return False
        fab_package = project_dir / self.package
        if not fab_package.is_dir():
            return False
        fab = package_digest(fab_package)
        return all(self.digest.get(path) == sha for path, sha in fab.items())

    def forget(self) -> None:
        """Drop the package's modules so the next import reads them from ``sys.path``."""
        for name in [
            m for m in sys.modules if m == self.package or m.startswith(self.package + ".")
        ]:
            del sys.modules[name]
        importlib.invalidate_caches()


# --------------------------------------------------------------------------- the parent
_warm_state: dict[str, Any] = {"preloaded": None, "threads": 1}


def warm_up(preload: Sequence[str] = (DEFAULT_PRELOAD,)) -> list[Preloaded]:
    """Import what every ClientApp process would import, once, in this (the parent) process.

    torch is imported with ``torch._dynamo``, and the optimizer methods that import it lazily
    on first use (``torch._disable_dynamo``) are called once on a dummy parameter, so that a
    child's first ``torch.optim`` call costs nothing extra. torch is left at one thread, with
    no parallel region run, and CUDA untouched.

    Raises
    ------
    RuntimeError
        An import initialised CUDA (a forked child could not use it).
    """
    # torch.cuda.is_available() (a plugin's, an import's) asks NVML instead of initialising
    # the CUDA driver, which torch.cuda.is_initialized() below would not see and a forked
    # child could not undo.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    import flwr.supernode.runtime.run_clientapp  # noqa: F401 - the child's entry point
    import torch
    import torch._dynamo  # noqa: F401 - imported lazily by the first torch.optim call

    _warm_state["threads"] = torch.get_num_threads()
    torch.set_num_threads(1)
    from pflarena.core.training import warm_optimizers

    warm_optimizers()
    loaded = [Preloaded.load(module) for module in preload]
    if torch.cuda.is_initialized():
        raise RuntimeError(
            f"importing {', '.join(preload)} initialised CUDA in the executor's parent process; "
            "a forked child cannot use that context"
        )
    _warm_state["preloaded"] = loaded[0] if loaded else None
    return loaded


def _warm_load_fn(original: Callable[..., Callable[[str, str, str], Any]]) -> Callable:
    """Wrap Flower's ``get_load_client_app_fn``: before loading a FAB's ClientApp, decide
    whether the parent's imported code serves it, else make the child import the FAB's."""
    from flwr.common.config import get_project_config, get_project_dir

    def get_load_client_app_fn(default_app_ref: str, app_path: str | None, multi_app: bool):
        load = original(default_app_ref, app_path, multi_app)

        def _load(fab_id: str, fab_version: str, fab_hash: str) -> Any:
            preloaded: Preloaded | None = _warm_state["preloaded"]
            if preloaded is not None and multi_app and app_path is None:
                project = Path(get_project_dir(fab_id, fab_version, fab_hash))
                ref = get_project_config(project)["tool"]["flwr"]["app"]["components"]["clientapp"]
                module = ref.partition(":")[0]
                warm = preloaded.serves(project, module)
                if not warm and module.split(".")[0] == preloaded.package:
                    preloaded.forget()
                _log(INFO, "%s: app %s from the %s", TASK_LOG_PREFIX, ref,
                     "parent's imports" if warm else f"FAB {fab_hash[:8]} (re-imported)")  # fmt: skip
            return load(fab_id, fab_version, fab_hash)

        return _load

    return get_load_client_app_fn


def _reuse_installed_fab(install_from_fab: Callable[..., Path]) -> Callable[..., Path]:
    """Wrap Flower's ``install_from_fab``: a FAB (content-addressed by its SHA-256) already
    installed by an earlier message of this node is used as it is, not unzipped, hash-checked
    and moved into place again (0.4-0.7 s of every message on 2 loaded cores)."""
    from flwr.common.config import get_flwr_home

    def install(fab_file: Path | bytes, install_dir: Path | None = None, skip_prompt: bool = False):
        if not isinstance(fab_file, bytes) or install_dir is not None:
            return install_from_fab(fab_file, install_dir, skip_prompt)
        marker = (
            Path(get_flwr_home())
            / "apps"
            / ".pflarena-installed"
            / hashlib.sha256(fab_file).hexdigest()
        )
        with contextlib.suppress(OSError):
            installed = Path(marker.read_text())
            if (installed / "pyproject.toml").is_file():
                return installed
        installed = Path(install_from_fab(fab_file, install_dir, skip_prompt))
        marker.parent.mkdir(parents=True, exist_ok=True)
        partial = marker.with_suffix(f".{os.getpid()}")
        partial.write_text(str(installed))
        partial.replace(marker)
        return installed

    return install


def patch_clientapp_runtime() -> None:
    """Adapt Flower's ClientApp runtime (``run_clientapp``'s module) to warm children.

    * The SuperNode creates a task before it has fetched the message's objects from the
      SuperLink. A fresh process spends seconds importing before it asks for them; a warm
      child asks at once, finds them missing and waits Flower's first back-off, 1 s (then 2,
      4, ...): 1.4-3.8 s of a child's 2-5 s were that wait. The child tries again after
      :data:`PULL_INITIAL_BACKOFF_S`, doubling up to :data:`PULL_BACKOFF_CAP_S`, for as long
      as Flower's own bound on the time (``PULL_MAX_TIME``, 2 h), with no bound on the tries:
      Flower's 500 tries last over an hour at its back-off and 50 s at this one, and a child
      that gave up while its SuperNode was still fetching the objects over a dropped link
      left that node waiting for a reply forever (it never asked for another message).
    * FABs already installed are reused (:func:`_reuse_installed_fab`).
    * The ClientApp is loaded from the parent's imports when they are the FAB's code
      (:func:`_warm_load_fn`).
    """
    import functools

    from flwr.supernode.runtime import run_clientapp as module

    module.pull_and_inflate_object_from_tree = functools.partial(
        module.pull_and_inflate_object_from_tree,
        initial_backoff=PULL_INITIAL_BACKOFF_S,
        backoff_cap=PULL_BACKOFF_CAP_S,
        max_tries_per_object=None,
    )
    module.install_from_fab = _reuse_installed_fab(module.install_from_fab)
    module.get_load_client_app_fn = _warm_load_fn(module.get_load_client_app_fn)


@dataclass
class _Child:
    spec: Any
    started: float
    report: int  # read end of the pipe the child reports its message on (:class:`_Report`)
    killed: str = ""

    @property
    def task_id(self) -> int:
        return self.spec.task_id


class ForkingExecutor:
    """Flower ``Executor`` that forks a warm child for each ClientApp task.

    Parameters
    ----------
    task_timeout : float or None
        Seconds a child may run; it is killed (SIGKILL) past that. ``None``: no limit.
    task_memory_mb : int or None
        Address space (MiB) a child may add beyond the parent's (``RLIMIT_AS``). ``None``:
        no limit beyond the machine's.
    poll : ActivityPoll or None
        The task poll (:func:`patch_task_poll`), told of every task forked.
    """

    def __init__(
        self,
        task_timeout: float | None = 3600.0,
        task_memory_mb: int | None = None,
        poll: ActivityPoll | None = None,
    ):
        from pflarena.deploy.task_tokens import TokenFileExecutor

        self.task_timeout = task_timeout
        self.task_memory_mb = task_memory_mb
        self.poll = poll
        self.fallback = TokenFileExecutor()
        self.children: dict[int, _Child] = {}

    # Flower's Executor protocol ------------------------------------------------------
    def get_eligible_capacity(self, supported_task_types: set, **_: Any) -> tuple[set, set[str]]:
        return supported_task_types, set()

    def wait_for_capacity(self, *_: Any, **__: Any) -> None:
        return None

    def launch(self, spec: Any) -> Any:
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor import LaunchResult

        if spec.task_type != TaskType.CLIENT_APP:
            return self.fallback.launch(spec)
        sys.stdout.flush()
        sys.stderr.flush()
        read_end, write_end = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(read_end)
            os.close(write_end)
            return LaunchResult.failed(f"fork failed: {exc}")
        if pid == 0:  # the child: never returns
            os.close(read_end)
            _child_main(spec, self.task_memory_mb, write_end)
        os.close(write_end)
        self.children[pid] = _Child(spec, time.monotonic(), read_end)
        if tracing():
            _log(INFO, "%s %d: forked pid %d", TASK_LOG_PREFIX, spec.task_id, pid)
        if self.poll is not None:  # a task came: its node's next one may follow soon
            self.poll.touch()
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap finished children (logging each one's outcome and CPU) and kill the overdue."""
        now = time.monotonic()
        for pid, child in list(self.children.items()):
            try:
                done, status, usage = os.wait4(pid, os.WNOHANG)
            except ChildProcessError:
                done, status, usage = pid, 0, None
            if done == 0:
                if self.task_timeout is not None and now - child.started > self.task_timeout:
                    child.killed = f"past --task-timeout {self.task_timeout:g}s"
                    _kill(pid)
                continue
            del self.children[pid]
            report = _Report.read(child.report)
            outcome = self._record(pid, child, status, usage, now)
            if report.message is not None and not report.replied:
                # It died holding its message: reply for it now, as it would have on an
                # exception, rather than let its node wait for the task's heartbeat to lapse.
                _reply_error(child.spec, report, f"ClientApp process {pid} {outcome}")

    def close(self) -> None:
        """Stop the children (SIGTERM: each pushes its task's failure), then reap them."""
        for pid in list(self.children):
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        while self.children and time.monotonic() < deadline:
            self.reconcile()
            time.sleep(0.05)
        for pid in list(self.children):
            _kill(pid)
        self.fallback.close()

    # ---------------------------------------------------------------------------------
    def _record(self, pid: int, child: _Child, status: int, usage: Any, now: float) -> str:
        if os.WIFSIGNALED(status):
            outcome = f"killed by signal {os.WTERMSIG(status)}"
        else:
            outcome = f"exit {os.waitstatus_to_exitcode(status)}"
        if child.killed:
            outcome += f" ({child.killed})"
        cpu = (usage.ru_utime + usage.ru_stime) if usage is not None else float("nan")
        failed = outcome != "exit 0"
        _log(WARNING if failed else INFO, "%s %d pid %d: %s, wall %.2fs, cpu %.2fs",
             TASK_LOG_PREFIX, child.task_id, pid, outcome, now - child.started, cpu)  # fmt: skip
        return outcome


def _kill(pid: int, signum: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


@dataclass
class _Report:
    """What a child told its parent: the message it pulled (Flower's protobuf, content
    stripped; its run and node) and whether it pushed a reply.

    On the pipe: one frame ``b"M" <4-byte length> <pickled (message bytes, run id, node id)>``
    once the message is pulled, one byte ``b"R"`` once a reply is pushed.
    """

    message: bytes | None = None
    run_id: int = 0
    node_id: int = 0
    replied: bool = False

    @classmethod
    def read(cls, fd: int) -> _Report:
        data = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(fd, 65536):
                data += chunk
        with contextlib.suppress(OSError):
            os.close(fd)
        report, at = cls(), 0
        while at < len(data):
            kind, at = data[at : at + 1], at + 1
            if kind == b"R":
                report.replied = True
            elif kind == b"M" and at + 4 <= len(data):
                size = int.from_bytes(data[at : at + 4], "big")
                with contextlib.suppress(Exception):
                    report.message, report.run_id, report.node_id = pickle.loads(
                        data[at + 4 : at + 4 + size]
                    )
                at += 4 + size
            else:
                break
        return report


def _reply_error(spec: Any, report: _Report, reason: str) -> None:
    """Push Flower's ``CLIENT_APP_CRASHED`` error reply to the message ``report`` names, with
    the task's own token, and mark the task failed (what a child does on an exception)."""
    from flwr.app import Context, Message, RecordDict
    from flwr.app.error import Error
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.common.serde import message_from_proto
    from flwr.proto.message_pb2 import Message as ProtoMessage
    from flwr.supercore.interceptors import (
        RuntimeTokenHttpInterceptor,
        RuntimeVersionHttpInterceptor,
    )
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

    try:
        proto = ProtoMessage()
        proto.ParseFromString(report.message)
        message = message_from_proto(proto)
        client = RuntimeHttpClient.from_server_address(
            server_address=spec.runtime_api_address,
            insecure=spec.insecure,
            root_certificates=validate_and_resolve_root_certificates(
                spec.root_certificates_path, spec.insecure
            ),
            interceptors=[
                RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                RuntimeTokenHttpInterceptor(spec.token),
            ],
            # One try, no retry invoker: Flower's answers a 401 (the task's token revoked:
            # its node has ended the task and replied itself) with SIGINT to its own
            # process, which here is this executor, not a ClientApp.
            retry_invoker=None,
        )
        try:
            reply = Message(
                Error(code=ErrorCode.CLIENT_APP_CRASHED, reason=reason), reply_to=message
            )
            context = Context(report.run_id, report.node_id, {}, RecordDict(), {})
            push_message(client, reply, context)
            push_task_output(client, None, SubStatus.FAILED, reason)
        finally:
            client.close()
        _log(WARNING, "%s %d: replied for it: %s", TASK_LOG_PREFIX, spec.task_id, reason)
    except Exception as exc:  # noqa: BLE001 - the node's heartbeat expiry still replies
        _log(ERROR, "%s %d: could not reply for it (%r); its node replies for it once the "
             "task has ended (pflarena supernode's bounded reply wait)", TASK_LOG_PREFIX,
             spec.task_id, exc)  # fmt: skip


# --------------------------------------------------------------------------- the child
def _child_main(spec: Any, task_memory_mb: int | None, report_fd: int) -> None:
    """Serve one ClientApp task in this forked child with Flower's ``run_clientapp``."""
    code, phases = 1, {}
    try:
        from flwr.supercore.exit import exit_handler
        from flwr.supercore.tls import validate_and_resolve_root_certificates
        from flwr.supernode.runtime.run_clientapp import run_clientapp

        # The parent's signal handlers and exit handlers (its HTTP client, its executor)
        # are not this process's; run_clientapp registers its own.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        exit_handler.registered_exit_handlers.clear()
        exit_handler._lock_handlers = threading.Lock()
        _become_expendable(task_memory_mb)
        import torch

        threads = os.environ.get("PFLARENA_TORCH_THREADS")
        torch.set_num_threads(int(threads) if threads else _warm_state["threads"])
        phases = _instrument(report_fd)
        run_clientapp(
            runtime_api_address=spec.runtime_api_address,
            token=spec.token,
            insecure=spec.insecure,
            certificates=validate_and_resolve_root_certificates(
                spec.root_certificates_path, spec.insecure
            ),
            parent_pid=os.getppid(),
            runtime_dependency_install=spec.runtime_dependency_install,
        )
        code = 0
    except SystemExit as exc:  # flwr_exit ends every task with sys.exit
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if phases:
            _log(INFO, "%s %d phases: %s", TASK_LOG_PREFIX, spec.task_id,
                 ", ".join(f"{k} {v:.2f}s" for k, v in phases.items()))  # fmt: skip
    except BaseException:  # noqa: BLE001 - report, then leave without the parent's atexit
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


#: The steps of Flower's ``run_clientapp`` a child times (names in its module).
_PHASES = {
    "pull": "pull_task_input",
    "install": "install_from_fab",
    "load": "get_load_client_app_fn",
    "push": "push_message",
}


def _instrument(report_fd: int) -> dict[str, float]:
    """Time the steps of ``run_clientapp`` in this child (wall seconds, filled as they run:
    pulling the message, installing the FAB, loading the app, calling it, pushing the reply),
    and report the pulled message and the pushed reply to the parent (:class:`_Report`)."""
    from flwr.app.message import remove_content_from_message
    from flwr.clientapp.client_app import ClientApp
    from flwr.common.serde import message_to_proto
    from flwr.supernode.runtime import run_clientapp as module

    phases: dict[str, float] = {}

    def report(frame: bytes) -> None:
        with contextlib.suppress(OSError):
            os.write(report_fd, frame)

    def timed(name: str, fn: Callable) -> Callable:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - start
            if name == "pull":
                message, context = result[0], result[1]
                proto = message_to_proto(remove_content_from_message(message)).SerializeToString()
                payload = pickle.dumps((proto, context.run_id, context.node_id))
                report(b"M" + len(payload).to_bytes(4, "big") + payload)
            elif name == "push":
                report(b"R")
            return result

        return wrapper

    for name, attribute in _PHASES.items():
        setattr(module, attribute, timed(name, getattr(module, attribute)))
    ClientApp.__call__ = timed("call", ClientApp.__call__)
    return phases


def _become_expendable(task_memory_mb: int | None) -> None:
    """Make this child the kernel's first choice when memory runs out, and bound its address
    space to ``task_memory_mb`` MiB beyond what it inherited."""
    with contextlib.suppress(OSError):
        Path("/proc/self/oom_score_adj").write_text("1000")
    if task_memory_mb is None:
        return
    inherited = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                inherited = int(line.split()[1]) * 1024
    except OSError:
        pass
    limit = inherited + task_memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


# --------------------------------------------------------------------------- the command
def _own_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--preload", action="append", metavar="MODULE")
    parser.add_argument("--task-timeout", type=float, default=None)
    parser.add_argument("--task-memory-mb", type=int, default=None)
    parser.add_argument("--stock", action="store_true")
    parser.add_argument("--app-signing-public-key", action="append", default=[])
    parser.add_argument(
        "--active-poll", type=float, default=float(os.environ.get(ACTIVE_POLL_ENV, ACTIVE_POLL_S))
    )
    parser.add_argument("--active-window", type=float, default=ACTIVE_WINDOW_S)
    return parser.parse_known_args(list(argv))


def patch_task_poll(active_s: float, window_s: float) -> ActivityPoll:
    """Make this process's SuperExec loop wait ``active_s`` between task polls for
    ``window_s`` after each task, then double up to Flower's interval
    (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``): its one ``time.sleep`` asks the poll."""
    from flwr.supercore.superexec import run_superexec as module

    idle = module._get_task_poll_interval()
    poll = ActivityPoll(min(active_s, idle), idle, window_s, "executor")
    module.time = PollClock(poll, idle_sleep=None)  # that module sleeps only between polls
    return poll


def main(argv: Sequence[str] | None = None) -> None:
    """``pflarena executor [--preload MODULE] [--task-timeout S] [--task-memory-mb M]
    [--stock] [--app-signing-public-key KEY.pub ...] [--active-poll S] [--active-window S]
    <flower-superexec flags>``.

    Runs Flower's SuperExec with :class:`ForkingExecutor`; ``--stock`` runs Flower's own
    ``flower-superexec`` (the fallback, same flags: a fresh process per task), its task tokens
    handed over in a file descriptor instead of the command line. Every other flag is
    ``flower-superexec``'s (``--runtime-api-address``, ``--insecure``,
    ``--root-certificates``, ``--parent-pid``, ...). ``--app-signing-public-key`` starts
    ServerApp tasks with ``pflarena-serverapp``, which runs approved apps only
    (:mod:`pflarena.deploy.serverapp`).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "executor":
        argv = argv[1:]
    from pflarena.deploy.private import private_umask

    own, rest = _own_args(argv)
    cli = importlib.import_module("flwr.supercore.cli.flower_superexec")
    sys.argv = ["pflarena executor", *rest]
    if any(a in ("-h", "--help") for a in rest):
        print(main.__doc__)
        print("Flower's flags:")
        cli._parse_args().print_help()
        return
    if own.app_signing_public_key:
        # ServerApp tasks start pflarena-serverapp: the run's app must be signed.
        from pflarena.deploy.serverapp import require_approved_serverapps

        try:
            require_approved_serverapps(own.app_signing_public_key)
        except (RuntimeError, OSError) as exc:
            raise SystemExit(f"pflarena executor: {exc}") from None
    # A SuperLink (or SuperNode) answering 500 ("database is locked") is retried, not the
    # end of this executor (pflarena.deploy.liveness).
    from pflarena.deploy.liveness import keep_superexec_alive

    try:
        keep_superexec_alive()
    except (RuntimeError, ValueError) as exc:
        raise SystemExit(f"pflarena executor: {exc}") from None
    if own.stock:
        # Flower's executor, its task tokens kept off the command line.
        from pflarena.deploy.task_tokens import use_token_files

        use_token_files()
        private_umask()  # what the apps write (checkpoints, results): the operator's alone
        cli.flower_superexec()
        return
    check_flower_internals()
    timeout = own.task_timeout or float(os.environ.get(TASK_TIMEOUT_ENV, 3600.0))
    memory_env = os.environ.get(TASK_MEMORY_ENV)
    memory = own.task_memory_mb or (int(memory_env) if memory_env else None)
    if timeout <= 0 or (memory is not None and memory <= 0):
        raise SystemExit("pflarena executor: --task-timeout and --task-memory-mb must be positive")
    if own.active_poll < 0.01 or own.active_window < 0:
        raise SystemExit(
            "pflarena executor: --active-poll is 0.01 s or more, --active-window 0 or more"
        )
    enable_trace()
    started = time.monotonic()
    preloaded = warm_up(own.preload or [DEFAULT_PRELOAD])
    _log(INFO, "pflarena warm executor: %s imported in %.1fs; forking one child per ClientApp task",
         ", ".join(p.module for p in preloaded), time.monotonic() - started)  # fmt: skip

    from flwr.supercore.constant import ExecutorType
    from flwr.supercore.superexec import run_superexec as superexec_module

    flower_get_executor = superexec_module.get_executor

    def get_executor(executor_type: Any, executor_config: Any = None, **kwargs: Any) -> Any:
        if executor_type != ExecutorType.SUBPROCESS:
            _log(
                WARNING,
                "--executor %s: not forking; Flower's executor serves every task",
                executor_type,
            )
            return flower_get_executor(executor_type, executor_config, **kwargs)
        return ForkingExecutor(task_timeout=timeout, task_memory_mb=memory, poll=poll)

    poll = patch_task_poll(own.active_poll, own.active_window)
    superexec_module.get_executor = get_executor
    patch_clientapp_runtime()
    try:
        private_umask()  # what the apps write (client state): the operator's alone
        cli.flower_superexec()
    except Exception as exc:
        _log(ERROR, "pflarena warm executor stopped: %r", exc)
        raise


if __name__ == "__main__":
    main()
