"""Start runs on this machine: ``pflarena run`` and ``pflarena sweep`` call in here.

Runs run in a simulation process of their own (:mod:`pflarena.runtime.simulation`), started
with the runtime dependency installation off (:func:`run_simulations`). By default that
process runs the clients in worker processes it forks after its imports
(:mod:`pflarena.runtime.inprocess`); ``engine="ray"`` runs Flower's Ray engine there and keeps
its Ray instance from one run to the next (:mod:`pflarena.runtime.engines` decides). ``superlink=True``
takes ``flwr run``'s way instead: a private simulation SuperLink on a free loopback port, the
app submitted with ``flwr run`` and its log streamed, the SuperLink stopped (by PID) at the end
(``flwr run`` itself exits 0 when the ServerApp raises).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from pflarena.core.config import ConfigError, RunConfig, own_method_keys, toml_value
from pflarena.runtime.engines import ENGINES
from pflarena.runtime.processes import flower_env, free_port, stop, stop_group, wait_healthy
from pflarena.server.progress import Progress
from pflarena.server.progress_events import EVENTS_ENV, read_event

__all__ = [
    "ENGINES",
    "project_root",
    "resume_config",
    "run_simulations",
    "simulate",
    "simulate_resuming",
    "with_absolute_paths",
]


def project_root() -> Path:
    """The Flower App directory (``pyproject.toml`` and the code): the source tree when the
    package runs from one, else one laid out from the installed package
    (:func:`pflarena.runtime.appdir.installed_app_dir`)."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "pflarena").is_dir():
        return root
    from pflarena.runtime.appdir import installed_app_dir

    return installed_app_dir()


def _int_if_whole(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def simulation_env(flwr_home: Path) -> dict[str, str]:
    """Flower's environment (:func:`~pflarena.runtime.processes.flower_env`), with Ray
    leaving the GPUs visible to actors that reserve none."""
    env = flower_env(flwr_home)
    env["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = "0"
    return env


_PROGRESS_MARKERS = ("pflarena", "[round ", "ERROR", "Traceback", "Error", "failed", "rejected")


def _is_progress(line: str) -> bool:
    """Lines worth showing by default: our progress, and anything that went wrong."""
    return any(marker in line for marker in _PROGRESS_MARKERS) and "FutureWarning" not in line


def check_flower_keys(cfg: RunConfig) -> None:
    """Flower passes only keys declared in ``[tool.flwr.app.config]``: say so before it fails."""
    import tomllib

    from pflarena.core.presets import flatten_table

    pyproject = tomllib.loads((project_root() / "pyproject.toml").read_text())
    declared = flatten_table(pyproject["tool"]["flwr"]["app"].get("config", {}))
    missing = sorted(set(cfg.to_run_config()) - set(declared))
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} not in [tool.flwr.app.config] of {project_root()}/pyproject.toml; "
            "Flower passes only the keys declared there (a plug-in method's parameters keep "
            "their defaults unless its table is added, see `pflarena methods --flower-config`)"
        )


def simulate(
    cfg: RunConfig,
    *,
    cpus_per_client: float = 1.0,
    gpus_per_client: float = 0.0,
    log_file: Path | None = None,
    verbosity: int = 1,
    superlink: bool = False,
    engine: str | None = None,
    ray_address: str | None = None,
    progress: Progress | None = None,
    workers: int | None = None,
    clients_per_gpu: int | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` as a Flower simulation and return its ``summary.json``.

    ``cfg.output_dir`` must be set (absolute or relative to the current directory).
    ``verbosity`` 0 prints nothing, 1 the run's progress lines and problems, 2 the whole
    Flower log; ``progress`` shows the output instead (:mod:`pflarena.server.progress`).
    By default Flower's simulation runtime runs in a process of its own
    (:mod:`pflarena.runtime.simulation`); ``superlink=True`` submits the app with ``flwr run``
    to a private simulation SuperLink instead, as ``flwr run .`` does (same results, a
    longer start-up). The engine is :func:`pflarena.runtime.engines.plan_engine`'s: by
    default ``inprocess``, the ServerApp in that process and the ClientApps in ``workers``
    worker processes (:mod:`pflarena.runtime.inprocess`; on a GPU, ``clients_per_gpu`` per
    GPU unless ``workers`` is given); ``engine="ray"`` runs them
    on Flower's Ray engine, and ``ray_address`` joins that Ray cluster instead of starting a
    private Ray instance.
    Raises ``RuntimeError`` when the run did not complete. A run that completed with
    clients failing returns its summary, whose ``client_failures`` says which.
    """
    output_dir = Path(cfg.output_dir).resolve()
    cfg = with_absolute_paths(cfg.model_copy(update={"output_dir": str(output_dir)}))
    check_flower_keys(cfg)
    if superlink and engine not in (None, "ray"):
        raise ConfigError(f"--superlink runs on Flower's Ray engine; --engine {engine} cannot")
    if superlink and ray_address:
        raise ConfigError("--ray-address applies to pflarena's runtime, not to --superlink")
    if superlink:
        returncode, tail = _simulate_on_superlink(
            cfg, cpus_per_client, gpus_per_client, log_file, verbosity, progress
        )
        what = "flwr run"
    else:
        returncode, tail = _run_noting_interrupts(
            output_dir / "summary.json",
            [cfg],
            cpus_per_client=cpus_per_client,
            gpus_per_client=gpus_per_client,
            log_file=log_file,
            verbosity=verbosity,
            engine=engine,
            ray_address=ray_address,
            progress=progress,
            workers=workers,
            clients_per_gpu=clients_per_gpu,
        )
        what = "the simulation"
    summary_path = output_dir / "summary.json"
    if not summary_path.exists():
        raise RuntimeError(
            f"the run wrote no summary ({what} exited {returncode}); its last lines:\n"
            + "".join(tail)
        )
    summary = json.loads(summary_path.read_text())
    if summary.get("status") == "interrupted":  # a signal sent to the simulation itself
        raise RuntimeError(
            f"run interrupted by {summary.get('signal') or 'a signal'}; "
            f"`pflarena run --resume {output_dir}` continues it"
        )
    if summary.get("status") != "completed":
        raise RuntimeError(
            f"run failed: {summary.get('error', 'unknown error')} (see {output_dir})"
        )
    return summary


#: Lines of a process's output kept to say why it failed or stopped.
TAIL_LINES = 40


def _run_noting_interrupts(
    summary_path: Path, configs: list[RunConfig], **options: Any
) -> tuple[int, list[str]]:
    """:func:`run_simulations`, an interrupt that left no new ``summary_path`` (the run did
    not record how it ended) carrying the simulation process's last lines
    (:func:`unrecorded_output`)."""

    def written() -> tuple[int, int] | None:
        with contextlib.suppress(OSError):
            info = summary_path.stat()
            return (info.st_ino, info.st_mtime_ns)
        return None

    before = written()
    tail: list[str] = []
    try:
        return run_simulations(configs, output=tail, **options)
    except KeyboardInterrupt as interrupt:
        if written() in (None, before):
            setattr(interrupt, UNRECORDED, tail)
        raise


def _stream(
    proc: subprocess.Popen,
    log_handle: Any,
    verbosity: int,
    progress: Progress | None = None,
    tail: collections.deque[str] | None = None,
) -> list[str]:
    """Show a process's output as ``verbosity`` says (or through ``progress``), log all of
    it but the progress events' JSON lines (each event's log line follows it); its last
    :data:`TAIL_LINES` lines, kept in ``tail`` as they come (so that a caller interrupted
    meanwhile still has them)."""
    assert proc.stdout is not None
    if tail is None:
        tail = collections.deque(maxlen=TAIL_LINES)
    try:
        for line in proc.stdout:
            event = read_event(line) is not None
            if not event:
                tail.append(line)
                if log_handle:
                    log_handle.write(line)
            if progress is not None:
                progress.feed(line)
            elif not event and (verbosity >= 2 or (verbosity == 1 and _is_progress(line))):
                sys.stderr.write(line)
                sys.stderr.flush()
    finally:
        if progress is not None:
            progress.close()
    proc.wait()
    return list(tail)


def stop_reading(
    proc: subprocess.Popen,
    unread: tuple[Any, collections.deque[str]] | None,
    grace: float = 60.0,
) -> None:
    """:func:`~pflarena.runtime.processes.stop_group` for ``proc``, whose output is read
    meanwhile where nobody reads it any more (``unread``: the log file and the last lines
    to add it to). Unread, a process that writes more than a pipe holds (64 KB) on its way
    out blocks in that write until it is killed, before it records how its run ended."""
    if unread is None or proc.stdout is None:
        stop_group(proc, grace)
        return
    log_handle, tail = unread

    def read() -> None:
        with contextlib.suppress(OSError, ValueError):  # the pipe or the log closed under it
            for line in proc.stdout:  # type: ignore[union-attr]
                if read_event(line) is None:
                    tail.append(line)
                    if log_handle:
                        log_handle.write(line)

    reader = threading.Thread(target=read, name="pflarena-drain", daemon=True)
    reader.start()
    stop_group(proc, grace)
    reader.join(timeout=5)  # the group is gone; a process outside it (Ray's) may hold the pipe


#: Attribute of the ``KeyboardInterrupt`` that stopped :func:`simulate` where the run
#: recorded no summary of its end: the simulation process's last lines of output.
UNRECORDED = "pflarena_unrecorded_output"


def unrecorded_output(interrupt: BaseException) -> list[str] | None:
    """The simulation process's last lines where an interrupted :func:`simulate` left no
    new ``summary.json`` (the run did not record how it ended); None where it did."""
    return getattr(interrupt, UNRECORDED, None)


def with_absolute_paths(cfg: RunConfig) -> RunConfig:
    """``cfg`` with ``shards-dir`` and ``data-dir`` made absolute against the current
    directory: the runtime's process runs in a scratch directory of its own, where a relative
    path would name another place. Unset (empty) paths stay unset."""
    update = {
        name: str(Path(value).expanduser().resolve())
        for name in ("shards_dir", "data_dir")
        if (value := getattr(cfg, name))
    }
    return cfg.model_copy(update=update) if update else cfg


class _SigtermHandler:
    """SIGTERM as Ctrl-C while a simulation process runs, for callers that set no handler
    of their own (a script calling :func:`simulate`; the CLI sets one): the process is
    then stopped on the way out instead of left running, orphaned, in its own session."""

    def __init__(self) -> None:
        self.previous: Any = None
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self.previous = signal.signal(signal.SIGTERM, self._raise)

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None


class _SignalsNoted:
    """Notes which of SIGINT and SIGTERM this process gets while a simulation process runs
    (each still handled as before: the handler found is called), so that the one received
    is passed on to the simulation process (:meth:`forward`) and its run recorded as
    interrupted by that signal. Only on the main thread, and not for a signal ignored."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: list[int] = []
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.SIGNALS:
            handler = signal.getsignal(signum)
            if callable(handler):
                self.previous[signum] = handler
                signal.signal(signum, self._note)

    def _note(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        self.previous[signum](signum, frame)

    def restore(self, handlers: dict[int, Any]) -> None:
        """Put the handlers found in place of these in ``handlers`` (what is restored at
        the end)."""
        handlers.update(self.previous)
        self.previous = {}

    def forward(self, proc: subprocess.Popen) -> None:
        """Send ``proc`` the first signal received, if any (not reaping it: its process
        group is stopped after, :func:`~pflarena.runtime.processes.stop_group`)."""
        if self.received and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, self.received[0])


def run_simulations(
    configs: list[RunConfig],
    *,
    cpus_per_client: float = 1.0,
    gpus_per_client: float = 0.0,
    log_file: Path | None = None,
    verbosity: int = 1,
    engine: str | None = None,
    ray_address: str | None = None,
    progress: Progress | None = None,
    workers: int | None = None,
    clients_per_gpu: int | None = None,
    output: list[str] | None = None,
) -> tuple[int, list[str]]:
    """Run ``configs`` one after another in one simulation process, started once.

    The process (``python -m pflarena.runtime.simulation``) runs Flower's simulation runtime
    and keeps its Ray instance and actors from one run to the next. Each run writes its own
    results; returns the process's exit code (0 when every run completed) and its last
    lines of output. Interrupting this call stops the process and its children, reading
    its output meanwhile; its last lines are then in ``output`` (a list of the caller's).
    The engine is :func:`pflarena.runtime.engines.plan_engine`'s for ``engine``, ``workers``
    and the resources asked for (by default in-process, :mod:`pflarena.runtime.inprocess`).
    ``ray_address`` (``auto`` or ``HOST:PORT``) runs them on that Ray cluster, the app's
    code shipped to its workers (:func:`pflarena.runtime.simulation._start_ray`).
    """
    if engine is not None and engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if ray_address is not None:
        from pflarena.runtime.simulation import check_ray_address

        if engine not in (None, "ray"):
            raise ConfigError(f"--ray-address needs the Ray engine, not --engine {engine}")
        try:
            check_ray_address(ray_address)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    from pflarena.runtime.engines import plan_engine

    try:
        plan = plan_engine(
            engine,
            workers=workers,
            cpus_per_client=cpus_per_client,
            gpus_per_client=gpus_per_client,
            ray_address=ray_address,
            device=configs[0].device if configs else "auto",
            num_clients=max((cfg.num_clients for cfg in configs), default=None),
            clients_per_gpu=clients_per_gpu,
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    scratch = Path(tempfile.mkdtemp(prefix="pflarena-sim-"))
    spec = {
        "app_dir": str(project_root()),
        "cpus_per_client": cpus_per_client,
        "gpus_per_client": gpus_per_client,
        "engine": plan.engine,
        "workers": plan.workers,
        "start_method": plan.start_method,
        "gpus": list(plan.gpus),
        "ray_address": ray_address,
        "runs": [
            {
                "run_config": with_absolute_paths(cfg).to_run_config(),
                "num_supernodes": cfg.num_clients,
            }
            for cfg in configs
        ],
    }
    (scratch / "spec.json").write_text(json.dumps(spec))
    from pflarena.server.runlock import HELD_ENV, lock_run_dir

    # One process at a time in a run directory: taken here, before any start-up, and
    # handed to the simulation process (server/runlock.py).
    locks = []
    try:
        for cfg in configs:
            if cfg.output_dir:
                locks.append(lock_run_dir(Path(cfg.output_dir)))
    except BaseException:
        for lock in locks:
            lock.close()
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    env = simulation_env(scratch)
    env[EVENTS_ENV] = "1"  # progress as events too (pflarena.server.progress_events)
    env[HELD_ENV] = json.dumps(
        {
            str(Path(cfg.output_dir).resolve()): lock.fileno()
            for cfg, lock in zip([c for c in configs if c.output_dir], locks, strict=True)
        }
    )
    log_handle = open(log_file, "w") if log_file else None  # noqa: SIM115
    proc = None
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    streamed = False
    terminate = _SigtermHandler()
    received = _SignalsNoted()
    try:
        # Its own process group: a Ctrl-C at the terminal reaches this process only, which
        # stops the simulation in order (Ray shut down, its helpers ended) and then ends
        # whatever of that group is left.
        proc = subprocess.Popen(
            [sys.executable, "-m", "pflarena.runtime.simulation", str(scratch / "spec.json")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=scratch,
            start_new_session=True,
            pass_fds=[lock.fileno() for lock in locks],
        )
        _stream(proc, log_handle, verbosity, progress, tail)
        streamed = True
    finally:
        # a second Ctrl-C or SIGTERM must not cut the shutdown short and leave processes
        # behind
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        received.restore(previous)
        try:
            if proc is not None:
                # the signal this process got, passed on: the run is recorded as
                # interrupted by it (SIGINT, SIGTERM), not by the SIGTERM that stops it
                received.forward(proc)
                stop_reading(proc, None if streamed else (log_handle, tail))
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            terminate.restore()
        from pflarena.server.runlock import remove_lock

        for lock in locks:
            remove_lock(lock)  # no .lock left in the run directory
        if log_handle:
            log_handle.close()
        shutil.rmtree(scratch, ignore_errors=True)
        if output is not None:
            output[:] = tail
    return proc.returncode, list(tail)


def _simulate_on_superlink(
    cfg: RunConfig,
    cpus_per_client: float,
    gpus_per_client: float,
    log_file: Path | None,
    verbosity: int,
    progress: Progress | None = None,
) -> tuple[int, list[str]]:
    """``flwr run`` of this app on a private simulation SuperLink; exit code and last lines."""
    flwr_home = Path(tempfile.mkdtemp(prefix="pflarena-flwr-"))
    port = free_port()
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "pflarena"\n\n[superlink.pflarena]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    overrides = flwr_home / "run-config.toml"
    overrides.write_text(
        "".join(f"{k} = {toml_value(v)}\n" for k, v in cfg.to_run_config().items())
    )
    env = simulation_env(flwr_home)
    env[EVENTS_ENV] = "1"  # the ServerApp's progress as events too, through `flwr run --stream`
    superlink_log = open(flwr_home / "superlink.log", "wb")  # noqa: SIM115
    superlink = subprocess.Popen(
        [
            "flower-superlink",
            "--insecure",
            "--simulation",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--disable-runtime-dependency-installation",
        ],
        env=env,
        stdout=superlink_log,
        stderr=subprocess.STDOUT,
        cwd=flwr_home,
    )
    log_handle = open(log_file, "w") if log_file else None  # noqa: SIM115
    try:
        wait_healthy(port, superlink)
        federation = (
            f"num-supernodes={cfg.num_clients} "
            f"client-resources-num-cpus={toml_value(_int_if_whole(cpus_per_client))}"
        )
        if gpus_per_client:
            federation += f" client-resources-num-gpus={toml_value(_int_if_whole(gpus_per_client))}"
        from pflarena.runtime.appdir import flwr_run_dir

        cmd = [
            "flwr",
            "run",
            str(flwr_run_dir()),
            "pflarena",
            "--federation-config",
            federation,
            "--run-config",
            str(overrides),
            "--stream",
        ]
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=flwr_home,
        )
        tail = _stream(proc, log_handle, verbosity, progress)
    finally:
        stop(superlink)
        superlink_log.close()
        if log_handle:
            log_handle.close()
    shutil.rmtree(flwr_home, ignore_errors=True)
    return proc.returncode, tail


def resume_config(run_dir: Path) -> dict[str, Any]:
    """The run config of the run in ``run_dir``, set to continue it."""
    path = run_dir / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} holds no run to resume (no config.json)")
    run_config = own_method_keys(json.loads(path.read_text())["run_config"])
    return run_config | {"resume": True, "output-dir": str(run_dir.resolve())}


def simulate_resuming(
    run_config: dict[str, Any], *, retries: int = 2, **simulate_args: Any
) -> dict[str, Any]:
    """:func:`simulate` the run ``run_config`` describes, and when it fails after a
    checkpoint, resume it from there (``pflarena run --resume``) up to ``retries`` times; a run
    already begun in its ``output-dir`` is resumed rather than started again, and results
    there without a checkpoint are refused (``OutputDirError``), never overwritten. For long
    benchmark runs, where a round lost to a slow or overloaded machine should not cost the
    rounds before it. Raises the last ``RuntimeError`` when every attempt failed."""
    from pflarena.server.build import parse_config
    from pflarena.server.results import check_output_dir

    out = Path(run_config["output-dir"])
    for attempt in range(retries + 1):
        begun = (out / "checkpoint.npz").exists() and (out / "config.json").exists()
        if not begun:  # results but no checkpoint to resume from: an OutputDirError, no retry
            check_output_dir(out)
        try:
            return simulate(
                parse_config(resume_config(out) if begun else run_config), **simulate_args
            )
        except RuntimeError as exc:
            if attempt == retries:
                raise
            print(f"   attempt {attempt + 1} failed, resuming: {exc}", flush=True)
    raise AssertionError("unreachable")
