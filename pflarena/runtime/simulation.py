"""Flower's simulation runtime, started by pflarena: one start-up for one run or a sweep.

``flwr run`` on a simulation SuperLink reaches a run's first round in steps: the SuperLink
starts; the CLI builds the app into a FAB and uploads it; the SuperLink's SuperExec starts a
``flwr-simulation`` process; that process installs the FAB and calls Flower's simulation
runtime (``flwr.simulation.run_simulation._run_simulation``), which starts the ServerApp in
a thread, starts Ray (``RayBackend``), creates the ``ClientAppActor`` pool and routes the
ServerApp's messages to the ClientApps in the actors (``vce_api.run_api``); at the end it
terminates the actors and shuts Ray down. ``benchmarks/results/startup.md`` times each step.

A :class:`SimulationRuntime` does the last step only, in a process of its own
(``python -m pflarena.runtime.simulation SPEC``, which
:func:`pflarena.runtime.launch.run_simulations` starts), on the project directory itself: the
same ServerApp and ClientApp (the components ``pyproject.toml`` names), the run config fused
by Flower from ``[tool.flwr.app.config]`` and the overrides as ``flwr run --run-config FILE``
parses them, Flower's in-memory LinkState and Grid, its message workers (``run_api``) and its
``RayBackend`` with its ``ClientAppActor`` pool. What differs is when things happen:

* Ray starts (and creates the actors) while a thread imports the ServerApp and ClientApp
  modules, instead of after them;
* the backend outlives a run (:class:`ReusableRayBackend`): the runs of a sweep share one
  Ray instance and one actor pool, each run with its own LinkState, nodes and node contexts
  (``context.state``), as separate ``flwr run`` calls have. Actors are recreated when one
  was lost.

With a ``ray_address`` the runtime joins an existing Ray cluster instead of starting a private
instance, and the app's package is shipped to the cluster's workers (:func:`_start_ray`).

Results do not depend on any of this: ClientApps seed torch per message and derive their
data from the run config, so a run gives the ``rounds.jsonl`` that ``flwr run`` on a
SuperLink gives (``tests/test_startup.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from logging import DEBUG, INFO
from pathlib import Path
from queue import Queue
from typing import Any

from pflarena.core.phases import mark, process_start
from pflarena.runtime.flowerapp import FlowerApp, flower_overrides, load_client_app, module_of
from pflarena.server.results import RunInterrupted

__all__ = [
    "SimulationRuntime",
    "WORKER_ENV",
    "app_packages",
    "check_ray_address",
    "main",
]

#: Environment of a simulation process (set before Flower and Ray are imported).
WORKER_ENV: dict[str, str] = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
    # flwr-simulation sets this too: no uv runtime-env hook in Ray's workers
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
}


def check_ray_address(address: str) -> str:
    """``address`` if it names a Ray cluster to join: ``auto`` (``RAY_ADDRESS``, else the
    cluster ``ray start`` last started on this machine) or the head's ``HOST:PORT``."""
    host, sep, port = address.rpartition(":")
    if "://" not in address and (
        address == "auto" or (sep and host and port.isdigit() and 0 < int(port) < 65536)
    ):
        return address
    raise ValueError(
        f"--ray-address {address!r}: expected auto or the head node's HOST:PORT (the address "
        "`ray start --head` prints; Ray Client's ray:// addresses are not supported: run "
        "pflarena on a node of the cluster)"
    )


def app_packages(app: FlowerApp) -> list[str]:
    """The directories of the top-level packages holding the app's components: the code a
    Ray cluster's workers are given (``runtime_env["py_modules"]``)."""
    import importlib.util

    packages = []
    for attr in (app.client_app_attr, app.server_app_attr):
        spec = importlib.util.find_spec(module_of(attr).split(".", 1)[0])
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"{attr}: its top-level module is not a package Ray can ship")
        directory = str(Path(next(iter(spec.submodule_search_locations))).resolve())
        if directory not in packages:
            packages.append(directory)
    return packages


def _start_ray(app: FlowerApp, backend_config: dict[str, Any], address: str | None = None) -> None:
    """``ray.init`` with the arguments Flower's ``RayBackend.init_ray`` uses.

    Done before Flower is imported, so that Flower's and the apps' imports (in another
    thread) overlap Ray's start; Flower's backend then finds Ray running and uses it.

    Without ``address`` a private Ray instance starts (``address="local"``: neither
    ``RAY_ADDRESS`` nor a cluster started with ``ray start`` on this machine is joined, as a
    plain ``ray.init()`` would), and its workers get the driver's ``sys.path`` (the app
    directory first) as ``PYTHONPATH``, as Flower does. With ``address`` the driver joins
    that cluster; a path of this machine means nothing on another node, so the workers get
    the app's packages as ``py_modules`` (uploaded once, unpacked on each node ahead of
    their ``PYTHONPATH``) and this process's :data:`WORKER_ENV`; the other packages (flwr,
    torch, ...) come from the Python environment the cluster's nodes run.
    """
    import ray

    app_dir = app.root
    if str(app_dir) not in sys.path:  # where Flower's app loader puts it
        sys.path.insert(0, str(app_dir))
    if ray.is_initialized():
        return
    arguments = dict(backend_config.get("init_args", {}))
    arguments.setdefault("include_dashboard", False)
    if address is not None:
        runtime_env = {
            "py_modules": app_packages(app),
            "excludes": ["__pycache__", "*.pyc"],
            "env_vars": {key: os.environ.get(key, value) for key, value in WORKER_ENV.items()},
        }
        ray.init(address=check_ray_address(address), runtime_env=runtime_env, **arguments)
        return
    pythonpath = os.pathsep.join(sys.path)
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    os.environ["PYTHONPATH"] = pythonpath
    ray_init(address="local", runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **arguments)


#: Ray's message when its raylet did not register within Ray's fixed 30 s
#: (``ray/_private/node.py``, not configurable): seen on a machine whose cores are busy.
RAY_START_TIMEOUT = "timed out during startup"


def ray_init(attempts: int = 3, **arguments: Any) -> None:
    """``ray.init(**arguments)``, tried again (up to ``attempts`` times in all) when Ray's
    node does not come up in time on a busy machine. The processes a failed attempt
    started (its GCS server, raylet and helpers, children of this process) are stopped by
    PID before the next; any other error is raised at once."""
    import ray

    # Ray's vendored copy of psutil, importable once ray is imported.
    psutil = importlib.import_module("psutil")

    me = psutil.Process()
    for attempt in range(1, attempts + 1):
        before = {child.pid for child in me.children(recursive=True)}
        try:
            ray.init(**arguments)
            return
        except Exception as exc:
            if RAY_START_TIMEOUT not in str(exc) or attempt == attempts:
                raise
            started = [c for c in me.children(recursive=True) if c.pid not in before]
            for child in started:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
            psutil.wait_procs(started, timeout=10)
            ray.shutdown()
            print(
                f"Ray's node did not start in time (attempt {attempt} of {attempts}); "
                f"stopped the {len(started)} process(es) it started, starting again",
                file=sys.stderr,
                flush=True,
            )


class SimulationRuntime:
    """Flower's simulation runtime for one run after another, started once.

    Parameters
    ----------
    app_dir
        The Flower App (this project's root).
    cpus_per_client, gpus_per_client
        Flower's ``client-resources-num-cpus`` / ``-num-gpus``: resources Ray reserves per
        ``ClientAppActor`` (so ``cpus / cpus_per_client`` actors, over every node).
    ray_address
        Join this Ray cluster (``auto`` or ``HOST:PORT``) instead of starting a private
        Ray instance (:func:`_start_ray`).
    """

    def __init__(
        self,
        app_dir: Path,
        *,
        cpus_per_client: float = 1.0,
        gpus_per_client: float = 0.0,
        ray_address: str | None = None,
    ) -> None:
        self.app = FlowerApp.from_dir(app_dir)
        self.ray_address = ray_address
        self.backend_config: dict[str, Any] = {
            "client_resources": {"num_cpus": cpus_per_client, "num_gpus": gpus_per_client},
            # what flwr-simulation passes when the federation is not `verbose`
            "init_args": {"logging_level": "WARNING", "log_to_driver": True},
            "actor": {"tensorflow": 0},
        }
        self._backend: Any = None

    # ------------------------------------------------------------------ backend
    def start(self) -> None:
        """Start Ray, then Flower's backend on it with its actor pool.

        Call it from the main thread: a Ray driver started from another thread exits the
        process once messages flow.
        """
        if self._backend is not None:
            return
        begin = time.monotonic()
        _start_ray(self.app, self.backend_config, self.ray_address)
        from pflarena.server.progress_events import StartupPhase, emit

        if self.ray_address is None:
            emit(StartupPhase(f"Ray started in {time.monotonic() - begin:.1f}s"))
        else:
            import ray

            nodes = sum(1 for node in ray.nodes() if node["Alive"])
            cpus = ray.cluster_resources().get("CPU", 0)
            emit(
                StartupPhase(
                    f"joined the Ray cluster at {self.ray_address} ({nodes} nodes, {cpus} CPUs) "
                    f"in {time.monotonic() - begin:.1f}s"
                )
            )
        from pflarena.runtime.ray_backend import ReusableRayBackend

        backend = ReusableRayBackend(self.backend_config)  # Ray is up: Flower uses it
        backend.build(lambda: None)  # each run brings its own ClientApp loader
        emit(
            StartupPhase(
                f"{backend.num_workers} client actors created, {time.monotonic() - begin:.1f}s"
            )
        )
        self._backend = backend

    def close(self) -> None:
        """Terminate the actors and shut Ray down."""
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    # ------------------------------------------------------------------ runs
    def run(self, run_config: dict[str, Any], num_supernodes: int, scratch: Path) -> None:
        """One Flower simulation run of the app with ``run_config`` overrides.

        Raises the ServerApp's exception if it raised (the app writes its own results
        files, a failed run's included).
        """
        from flwr.app import Context, RecordDict
        from flwr.common.config import get_fused_config_from_dir
        from flwr.common.constant import RUN_ID_NUM_BYTES, SUPERLINK_NODE_ID, TASK_ID_NUM_BYTES
        from flwr.proto.task_pb2 import Task  # pylint: disable=no-name-in-module
        from flwr.server.superlink.fleet.vce.metrics import VceMetrics
        from flwr.server.superlink.fleet.vce.vce_api import (
            _register_node_info_stores,
            _register_nodes,
            run_api,
        )
        from flwr.server.superlink.linkstate import LinkStateFactory
        from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
        from flwr.server.superlink.linkstate.utils import generate_rand_int_from_bytes
        from flwr.simulation.run_simulation import run_serverapp_th
        from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
        from flwr.supercore.object_store import ObjectStoreFactory
        from flwr.supercore.run import Run
        from flwr.supercore.task_identity import TaskIdentity
        from flwr.superlink.federation import NoOpFederationManager
        from flwr.superlink.grid import InMemoryGrid

        overrides = flower_overrides(run_config, scratch)
        app_dir = str(self.app.root)
        run = Run.create_empty(run_id=generate_rand_int_from_bytes(RUN_ID_NUM_BYTES))
        run.fab_id, run.fab_version = self.app.fab_id, self.app.fab_version
        run.override_config = overrides
        run.primary_task_id = generate_rand_int_from_bytes(TASK_ID_NUM_BYTES)
        run.federation_id = NOOP_FEDERATION_ID
        # what flwr-simulation takes from the SuperLink's task
        TaskIdentity.task_id = run.primary_task_id
        TaskIdentity.run_id = run.run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        context = Context(
            run_id=run.run_id,
            node_id=SUPERLINK_NODE_ID,
            node_config={},
            state=RecordDict(),
            run_config=get_fused_config_from_dir(self.app.root, overrides),
        )
        client_app = load_client_app(self.app)
        self.start()
        backend = self._backend

        # Flower's _main_loop and start_vce, with this runtime's backend
        state_factory = LinkStateFactory(
            FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
        )
        state = state_factory.state()
        state.run_ids[run.run_id] = RunRecord(run=run)
        state.task_store[run.primary_task_id] = Task(task_id=run.primary_task_id, run_id=run.run_id)
        grid = InMemoryGrid(state_factory=state_factory)
        grid.set_run(run)
        f_stop = threading.Event()
        errors: Queue[BaseException] = Queue()
        contexts: Queue[Context] = Queue()
        server_thread = run_serverapp_th(
            server_app_attr=self.app.server_app_attr,
            server_app=None,
            server_app_context=context,
            grid=grid,
            app_dir=app_dir,
            f_stop=f_stop,
            exception_queue=errors,
            enable_tf_gpu_growth=False,
            ctx_queue=contexts,
        )
        nodes = _register_nodes(num_nodes=num_supernodes, state_factory=state_factory)
        stores = _register_node_info_stores(nodes_mapping=nodes, run=run, app_dir=app_dir)
        # Flower's message workers in a thread of their own, this thread waiting in short
        # steps: a signal is handled here whichever thread it lands on (Ray's threads take
        # some), not only once a wait of Flower's ends
        crashed: list[BaseException] = []

        def serve() -> None:
            try:
                run_api(
                    lambda: client_app,
                    lambda: backend,
                    nodes,
                    state_factory,
                    stores,
                    f_stop,
                    VceMetrics(),
                )
            except BaseException as exc:  # raised here, in the runtime's thread
                crashed.append(exc)

        api_thread = threading.Thread(target=serve, name="pflarena-run-api", daemon=True)
        api_thread.start()
        try:
            wait_for(api_thread)
        except KeyboardInterrupt as interrupt:
            # Interrupted: the ServerApp thread does not watch f_stop and would finish the
            # run. It gets the interrupt too, so that it records the run as interrupted, by
            # its signal, and is waited for that long only (the process ends once Ray is
            # shut down).
            f_stop.set()
            interrupt_thread(server_thread, interrupt)
            server_thread.join(timeout=SERVER_STOP_S)
            api_thread.join(timeout=SERVER_STOP_S)
            raise
        if crashed:
            raise crashed[0]
        f_stop.set()
        wait_for(server_thread)
        if not errors.empty():
            raise errors.get_nowait()


#: Seconds between a waiting thread's looks at the signals that arrived (:func:`wait_for`).
WAKE_S = 0.2


def wait_for(thread: threading.Thread) -> None:
    """Wait until ``thread`` ends, in steps of :data:`WAKE_S`: a signal that the kernel
    gave another thread (the Python handler always runs on the main one) interrupts the
    wait within a step, where one long join would only see it once it ended."""
    while thread.is_alive():
        thread.join(WAKE_S)


#: Seconds an interrupted run's ServerApp thread is given to record the interruption.
SERVER_STOP_S = 20.0


def interrupt_thread(thread: threading.Thread, interrupt: BaseException) -> bool:
    """Raise ``interrupt``'s kind in ``thread`` (as :class:`RunInterrupted` for its signal)
    at its next Python instruction: a ServerApp thread waiting for replies that will not
    come then ends as the main thread's Ctrl-C would end it. False if the thread is gone."""
    import ctypes

    if thread.ident is None or not thread.is_alive():
        return False
    signum = getattr(interrupt, "signum", None)
    kind = RunInterrupted.for_signal(signum) if signum is not None else KeyboardInterrupt
    return bool(
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(kind)
        )
    )


# --------------------------------------------------------------------------- worker
#: What the import thread imports first, each one's end a moment of the start-up
#: (:mod:`pflarena.core.phases`): the app modules import them anyway.
TIMED_IMPORTS: tuple[tuple[str, str], ...] = (
    ("torch", "torch imported"),
    ("flwr.serverapp", "Flower imported"),
)


def _import_in_background(modules: list[str]) -> threading.Thread:
    """Import ``modules`` in a thread (while Ray starts in the main one), after
    :data:`TIMED_IMPORTS`, noting when each ends."""

    def load() -> None:
        for module, moment in TIMED_IMPORTS:
            importlib.import_module(module)
            mark(moment)
        for module in modules:
            importlib.import_module(module)
        mark("pflarena's ServerApp and ClientApp imported")

    thread = threading.Thread(target=load, name="pflarena-imports", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    """Run the runs of a spec file one after another on one runtime.

    The spec (JSON) holds ``app_dir``, ``cpus_per_client``, ``gpus_per_client``, ``engine``
    (``ray``, the default, or ``inprocess``: :mod:`pflarena.runtime.inprocess`, no Ray, with
    its ``workers``, their ``start_method`` and the ``gpus`` they share),
    ``ray_address`` (optional: a Ray cluster to join, :class:`SimulationRuntime`) and
    ``runs``: each ``{"run_config": {...}, "num_supernodes": N}``. Prints Flower's log;
    exits 0 when every run completed, 1 otherwise (each run's ``summary.json`` says how
    it ended).
    """
    parser = argparse.ArgumentParser(
        prog="python -m pflarena.runtime.simulation", allow_abbrev=False
    )
    parser.add_argument("spec", help="JSON file describing the runs")
    args = parser.parse_args(argv)
    mark("simulation process started", at=process_start())
    spec = json.loads(Path(args.spec).read_text())
    for key, value in WORKER_ENV.items():
        os.environ.setdefault(key, value)
    _take_signals()
    threading.excepthook = _quiet_interrupts
    sys.unraisablehook = _interrupts_not_swallowed
    _become_subreaper()

    runtime = SimulationRuntime(
        Path(spec["app_dir"]),
        cpus_per_client=float(spec.get("cpus_per_client", 1.0)),
        gpus_per_client=float(spec.get("gpus_per_client", 0.0)),
        ray_address=spec.get("ray_address"),
    )
    app = runtime.app
    in_process = spec.get("engine", "inprocess") == "inprocess"
    modules = [module_of(app.server_app_attr), module_of(app.client_app_attr)]
    if not in_process:
        modules = ["flwr.supercore", "pflarena.runtime.ray_backend", *modules]
    imports = _import_in_background(modules)
    failed = 0
    scratch = Path(args.spec).parent
    begin = time.monotonic()
    try:
        if not in_process:
            runtime.start()  # Ray starts while the thread imports Flower and the apps
            _take_signals()  # back from Ray's driver, whose SIGTERM handler exits at once
        imports.join()
        from flwr.supercore import log

        from pflarena.server.progress_events import RunEnded, StartupPhase, emit

        engine = (
            f"in-process engine, {int(spec.get('workers', 1))} worker(s), no Ray"
            if in_process
            else "Ray engine"
        )
        emit(StartupPhase(f"runtime ready in {time.monotonic() - begin:.1f}s ({engine})"))
        mark("engine ready" if in_process else "Ray engine ready")

        from pflarena.runtime.inprocess import run_inprocess

        for index, item in enumerate(spec["runs"]):
            try:
                if in_process:
                    run_inprocess(
                        app,
                        item["run_config"],
                        int(item["num_supernodes"]),
                        scratch / f"{index}",
                        workers=int(spec.get("workers", 1)),
                        start_method=spec.get("start_method", "fork"),
                        gpus=spec.get("gpus", ()),
                    )
                    continue
                runtime.run(item["run_config"], int(item["num_supernodes"]), scratch / f"{index}")
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # the next run still runs; this one's summary says why
                failed += 1
                emit(RunEnded(failed=True, reason=str(exc)))
                log(DEBUG, traceback.format_exc())
    except KeyboardInterrupt as interrupt:
        # One stop, done in order: no second signal interrupts the shutdown.
        _ignore_signals()
        by = getattr(interrupt, "signal_name", None)
        print(f"pflarena: interrupted{f' by {by}' if by else ''}", file=sys.stderr, flush=True)
        return 130
    finally:
        _ignore_signals()
        runtime.close()
        stop_descendants()
    log(INFO, "pflarena: %d of %d runs completed", len(spec["runs"]) - failed, len(spec["runs"]))
    return 1 if failed else 0


def _take_signals() -> None:
    """SIGINT and SIGTERM stop the runs (:func:`_raise_keyboard_interrupt`), unless a stop
    has begun. Called again once Ray has started: its driver sets a SIGTERM handler of its
    own (``sys.exit``), which would end the process without recording the interruption."""
    if signal.getsignal(signal.SIGTERM) is _let_go:
        return
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    signal.signal(signal.SIGINT, _raise_keyboard_interrupt)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    """The first SIGINT or SIGTERM: the runs stop, the one running recorded as interrupted
    by that signal (:class:`RunInterrupted`); any later one is let go (the launcher follows
    the Ctrl-C it passes on with a SIGTERM), so that it cannot cut the stop short."""
    _ignore_signals()
    raise RunInterrupted(signum)


def _let_go(signum: int, frame: Any) -> None:
    """A signal that comes while the runs stop: nothing to do."""


def _ignore_signals() -> None:
    """Let SIGINT and SIGTERM go from now on, with a handler that does nothing: with
    ``SIG_IGN`` one already arrived but not yet handled would be reported by Python as
    "ignored due to race condition"."""
    signal.signal(signal.SIGTERM, _let_go)
    signal.signal(signal.SIGINT, _let_go)


#: Seconds after which an interrupt Python swallowed is raised again
#: (:func:`_interrupts_not_swallowed`).
REDELIVER_S = 0.1


def _interrupts_not_swallowed(args: Any) -> None:
    """``sys.unraisablehook``: an interrupt that Python swallowed, raised again.

    Python runs a signal's handler, and raises a thread's pending exception, at its next
    bytecode, which may be inside a finalizer: a ``weakref.finalize`` callback (the
    in-process engine frees a reply's memory slot in one, hundreds of times a round) or a
    ``__del__``. An exception raised there cannot propagate; Python reports it to this hook
    and goes on. The run's interrupt was then lost: its handler had already let later
    signals go (:func:`_raise_keyboard_interrupt`), the run went on, and the launcher killed
    it when its grace ended, before it recorded how it ended. So the same interrupt is
    raised again in the same thread :data:`REDELIVER_S` later, from a timer: raised from
    here, it would land in this hook, where it would be lost for good (and if it lands in
    a finalizer again, it comes back here). Anything else is reported as before."""
    interrupt = args.exc_value
    if not isinstance(interrupt, KeyboardInterrupt):
        sys.__unraisablehook__(args)
        return
    while True:
        try:
            _interrupt_again(threading.current_thread(), interrupt)
            return
        except KeyboardInterrupt:  # a signal's handler ran in here: it is this interrupt
            continue


def _interrupt_again(thread: threading.Thread, interrupt: KeyboardInterrupt) -> None:
    """Raise ``interrupt`` in ``thread`` :data:`REDELIVER_S` from now: on the main thread
    by its signal, sent to that thread (a wait there returns to run the handler, set again
    with the first signal's number), on another as :func:`interrupt_thread` does."""
    if thread is threading.main_thread():
        signum = getattr(interrupt, "signum", None) or signal.SIGINT

        def again(received: int, frame: Any) -> None:
            _raise_keyboard_interrupt(signum, frame)

        signal.signal(signal.SIGINT, again)
        signal.signal(signal.SIGTERM, again)
        timer = threading.Timer(REDELIVER_S, signal.pthread_kill, args=(thread.ident, signum))
    else:
        timer = threading.Timer(REDELIVER_S, interrupt_thread, args=(thread, interrupt))
    timer.daemon = True
    timer.start()


def _quiet_interrupts(args: threading.ExceptHookArgs) -> None:
    """A thread ended by the run's interrupt (:func:`interrupt_thread`) ends quietly: its
    run was recorded as interrupted; any other exception is reported as Python does."""
    if issubclass(args.exc_type, KeyboardInterrupt):
        return
    threading.__excepthook__(args)


#: ``prctl`` option making orphaned descendants this process's children (Linux).
_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    """Make this process the parent of its orphaned descendants (Linux; elsewhere nothing).

    Ray's raylet starts helper processes of its own (its dashboard and runtime-env agents);
    when the raylet ends first they would be left to init. As their subreaper this process
    still sees them, and :func:`stop_descendants` ends them.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def stop_descendants(grace: float = 5.0) -> int:
    """Terminate every process still below this one (Ray's leftovers), killing those that
    do not exit within ``grace`` seconds; returns how many there were."""
    try:
        psutil = importlib.import_module("psutil")  # Ray's vendored copy, or the package
    except ImportError:
        return 0
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=grace)
    return len(children)


if __name__ == "__main__":
    code = main()
    mark("simulation process done")
    sys.stdout.flush()
    sys.stderr.flush()
    # Every result is written and Ray is shut down: skip the interpreter's slow teardown of
    # torch, Ray and Flower (seconds on a loaded machine).
    os._exit(code)
