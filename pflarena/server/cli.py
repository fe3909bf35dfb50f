"""The ``pflarena`` command: ``run`` a simulation, ``sweep`` a grid of runs, ``compare`` runs,
write or import ``shards``, list ``methods``, ``presets`` and ``data`` sets (and check a
local copy of one).

``pflarena run`` runs the app as a Flower simulation and exits non-zero when the run failed.
By default Flower's simulation runtime runs in a process of its own
(:mod:`pflarena.server.simulation`), started with the runtime dependency installation off;
``--superlink`` takes ``flwr run``'s way instead: a private simulation SuperLink on a free
loopback port, the app submitted with ``flwr run`` and its log streamed, the SuperLink stopped
(by PID) at the end (``flwr run`` itself exits 0 when the ServerApp raises). ``pflarena sweep``
runs many runs on one start-up of the runtime (:mod:`pflarena.server.sweep`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pflarena.core.config import ConfigError, RunConfig, own_method_keys, parse_run_config
from pflarena.core.datasets import DatasetSpec, check_files
from pflarena.core.federation import FederationSpec
from pflarena.core.importers import IMPORT_FORMATS
from pflarena.core.methods import MethodDeclaration
from pflarena.server.compare import comparable_runs, compare_plot, compare_table
from pflarena.server.progress import Progress

__all__ = ["main", "simulate", "project_root", "compare_table"]

# Keys that describe data only (the data layer's FederationSpec): what `pflarena shards` takes.
DATA_KEYS: tuple[str, ...] = tuple(
    field.alias or name for name, field in FederationSpec.model_fields.items()
)
#: How a run's clients are executed: Flower's Ray simulation engine, or in this process.
ENGINES: tuple[str, ...] = ("ray", "inprocess")
ENGINE_HELP = (
    "ray: Flower's simulation engine, clients in parallel Ray actors (default); inprocess: "
    "the same ServerApp and ClientApp in one process without Ray, one client after another "
    "(machines without Ray, debugging)"
)
RAY_ADDRESS_HELP = (
    "run the clients on an existing Ray cluster (auto: RAY_ADDRESS or the cluster `ray start` "
    "started here; or the head's HOST:PORT) instead of a private Ray instance; the app's code "
    "is shipped to the workers, whose nodes need its dependencies and see its paths"
)


def project_root() -> Path:
    """The Flower App directory (``pyproject.toml`` and the code): the source tree when the
    package runs from one, else one laid out from the installed package
    (:func:`pflarena.server.appdir.installed_app_dir`)."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "pflarena").is_dir():
        return root
    from pflarena.server.appdir import installed_app_dir

    return installed_app_dir()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def _int_if_whole(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _flwr_env(flwr_home: Path) -> dict[str, str]:
    """A deployment's Flower environment (:func:`~pflarena.server.deploy.flower_env`), with
    Ray leaving the GPUs visible to actors that reserve none."""
    from pflarena.server.deploy import flower_env

    env = flower_env(flwr_home)
    env["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = "0"
    return env


_PROGRESS_MARKERS = ("pflarena", "[round ", "ERROR", "Traceback", "Error", "failed", "rejected")


def _is_progress(line: str) -> bool:
    """Lines worth showing by default: our progress, and anything that went wrong."""
    return any(marker in line for marker in _PROGRESS_MARKERS) and "FutureWarning" not in line


def _wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
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


def _stop(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the process we started, then SIGKILL if it does not exit in time."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _stop_group(proc: subprocess.Popen, grace: float = 60.0) -> None:
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


def _check_flower_keys(cfg: RunConfig) -> None:
    """Flower passes only keys declared in ``[tool.flwr.app.config]``: say so before it fails."""
    import tomllib

    from pflarena.server.presets import flatten_table

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
    engine: str = "ray",
    ray_address: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` as a Flower simulation and return its ``summary.json``.

    ``cfg.output_dir`` must be set (absolute or relative to the current directory).
    ``verbosity`` 0 prints nothing, 1 the run's progress lines and problems, 2 the whole
    Flower log; ``progress`` shows the output instead (:mod:`pflarena.server.progress`).
    By default Flower's simulation runtime runs in a process of its own
    (:mod:`pflarena.server.simulation`); ``superlink=True`` submits the app with ``flwr run``
    to a private simulation SuperLink instead, as ``flwr run .`` does (same results, a
    longer start-up). ``engine="inprocess"`` runs the ServerApp and the ClientApps in that
    process without Ray, one client after another (:mod:`pflarena.server.inprocess`).
    ``ray_address`` joins that Ray cluster instead of starting a private Ray instance.
    Raises ``RuntimeError`` when the run did not complete.
    """
    output_dir = Path(cfg.output_dir).resolve()
    cfg = with_absolute_paths(cfg.model_copy(update={"output_dir": str(output_dir)}))
    _check_flower_keys(cfg)
    if superlink and engine != "ray":
        raise ConfigError(f"--superlink runs on Flower's Ray engine; --engine {engine} cannot")
    if superlink and ray_address:
        raise ConfigError("--ray-address applies to pflarena's runtime, not to --superlink")
    if superlink:
        returncode, tail = _simulate_on_superlink(
            cfg, cpus_per_client, gpus_per_client, log_file, verbosity, progress
        )
        what = "flwr run"
    else:
        returncode, tail = run_simulations(
            [cfg],
            cpus_per_client=cpus_per_client,
            gpus_per_client=gpus_per_client,
            log_file=log_file,
            verbosity=verbosity,
            engine=engine,
            ray_address=ray_address,
            progress=progress,
        )
        what = "the simulation"
    summary_path = output_dir / "summary.json"
    if not summary_path.exists():
        raise RuntimeError(
            f"the run wrote no summary ({what} exited {returncode}); its last lines:\n"
            + "".join(tail)
        )
    summary = json.loads(summary_path.read_text())
    if summary.get("status") != "completed":
        raise RuntimeError(
            f"run failed: {summary.get('error', 'unknown error')} (see {output_dir})"
        )
    return summary


def _stream(
    proc: subprocess.Popen, log_handle: Any, verbosity: int, progress: Progress | None = None
) -> list[str]:
    """Show a process's output as ``verbosity`` says (or through ``progress``), log all of
    it; its last 40 lines."""
    assert proc.stdout is not None
    tail: list[str] = []
    try:
        for line in proc.stdout:
            tail = (tail + [line])[-40:]
            if log_handle:
                log_handle.write(line)
            if progress is not None:
                progress.feed(line)
            elif verbosity >= 2 or (verbosity == 1 and _is_progress(line)):
                sys.stdout.write(line)
                sys.stdout.flush()
    finally:
        if progress is not None:
            progress.close()
    proc.wait()
    return tail


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


def run_simulations(
    configs: list[RunConfig],
    *,
    cpus_per_client: float = 1.0,
    gpus_per_client: float = 0.0,
    log_file: Path | None = None,
    verbosity: int = 1,
    engine: str = "ray",
    ray_address: str | None = None,
    progress: Progress | None = None,
) -> tuple[int, list[str]]:
    """Run ``configs`` one after another in one simulation process, started once.

    The process (``python -m pflarena.server.simulation``) runs Flower's simulation runtime
    and keeps its Ray instance and actors from one run to the next. Each run writes its own
    results; returns the process's exit code (0 when every run completed) and its last
    lines of output. Interrupting this call stops the process and its children.
    ``engine="inprocess"`` runs them without Ray (:mod:`pflarena.server.inprocess`).
    ``ray_address`` (``auto`` or ``HOST:PORT``) runs them on that Ray cluster, the app's
    code shipped to its workers (:func:`pflarena.server.simulation._start_ray`).
    """
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if ray_address is not None:
        from pflarena.server.simulation import check_ray_address

        if engine != "ray":
            raise ConfigError(f"--ray-address needs the Ray engine, not --engine {engine}")
        try:
            check_ray_address(ray_address)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    scratch = Path(tempfile.mkdtemp(prefix="pflarena-sim-"))
    spec = {
        "app_dir": str(project_root()),
        "cpus_per_client": cpus_per_client,
        "gpus_per_client": gpus_per_client,
        "engine": engine,
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
    env = _flwr_env(scratch)
    env[HELD_ENV] = json.dumps(
        {
            str(Path(cfg.output_dir).resolve()): lock.fileno()
            for cfg, lock in zip([c for c in configs if c.output_dir], locks, strict=True)
        }
    )
    log_handle = open(log_file, "w") if log_file else None  # noqa: SIM115
    proc = None
    try:
        # Its own process group: a Ctrl-C at the terminal reaches this process only, which
        # stops the simulation in order (Ray shut down, its helpers ended) and then ends
        # whatever of that group is left.
        proc = subprocess.Popen(
            [sys.executable, "-m", "pflarena.server.simulation", str(scratch / "spec.json")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=scratch,
            start_new_session=True,
            pass_fds=[lock.fileno() for lock in locks],
        )
        tail = _stream(proc, log_handle, verbosity, progress)
    finally:
        # a second Ctrl-C or SIGTERM must not cut the shutdown short and leave processes
        # behind
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            if proc is not None:
                _stop_group(proc)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        for lock in locks:
            lock.close()
        if log_handle:
            log_handle.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return proc.returncode, tail


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
    port = _free_port()
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "pflarena"\n\n[superlink.pflarena]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    overrides = flwr_home / "run-config.toml"
    overrides.write_text(
        "".join(f"{k} = {_toml_value(v)}\n" for k, v in cfg.to_run_config().items())
    )
    env = _flwr_env(flwr_home)
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
        _wait_healthy(port, superlink)
        federation = (
            f"num-supernodes={cfg.num_clients} "
            f"client-resources-num-cpus={_toml_value(_int_if_whole(cpus_per_client))}"
        )
        if gpus_per_client:
            federation += (
                f" client-resources-num-gpus={_toml_value(_int_if_whole(gpus_per_client))}"
            )
        from pflarena.server.appdir import flwr_run_dir

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
        _stop(superlink)
        superlink_log.close()
        if log_handle:
            log_handle.close()
    shutil.rmtree(flwr_home, ignore_errors=True)
    return proc.returncode, tail


# --------------------------------------------------------------------------- argparse
#: The run-config flags ``pflarena run --help`` shows; ``--help-all`` shows every one.
COMMON_FLAGS: tuple[str, ...] = (
    "strategy",
    "dataset",
    "data-dir",
    "shards-dir",
    "num-clients",
    "partition",
    "alpha",
    "num-rounds",
    "fraction-train",
    "local-epochs",
    "batch-size",
    "lr",
    "model",
    "seed",
    "eval-every",
    "output-dir",
    "device",
    "tracker",
)
HELP_ALL = "--help-all"


def _add_config_flags(
    parser: argparse.ArgumentParser,
    only: tuple[str, ...] | None = None,
    *,
    full_help: bool = True,
    skip: tuple[str, ...] = (),
) -> None:
    title = "run config (see pyproject.toml [tool.flwr.app.config])"
    if not full_help:
        title = f"common run-config flags ({HELP_ALL} lists all)"
    group = parser.add_argument_group(title)
    for name, field in RunConfig.model_fields.items():
        alias = name.replace("_", "-")
        if (only is not None and alias not in only) or alias in ("resume", *skip):
            continue  # --resume DIR is a flag of its own
        shown = full_help or alias in COMMON_FLAGS
        group.add_argument(
            f"--{alias}",
            dest=alias,
            default=None,
            metavar="VALUE",
            help=f"{field.description or ''} (default: {field.default!r})".strip()
            if shown
            else argparse.SUPPRESS,
        )


def _add_method_flags(
    parser: argparse.ArgumentParser,
    methods: dict[str, MethodDeclaration],
    *,
    full_help: bool = True,
) -> list[str]:
    """One flag group per method with parameters (``--ditto.lambda``); returns the keys.
    Without ``full_help`` the flags work but are not listed (``--help-all`` and ``pflarena
    methods NAME`` show them)."""
    keys = []
    for declaration in methods.values():
        rows = declaration.param_docs()
        if not rows:
            continue
        group: Any = parser  # unlisted: no group heading either
        if full_help:
            group = parser.add_argument_group(
                f"{declaration.name} parameters",
                f"{declaration.summary} ({declaration.reference})",
            )
        for key, default, _type, description in rows:
            group.add_argument(
                f"--{key}",
                dest=key,
                default=None,
                metavar="VALUE",
                help=f"{description} (default: {default!r})".replace("%", "%%")
                if full_help
                else argparse.SUPPRESS,
            )
            keys.append(key)
    return keys


def _collect_overrides(args: argparse.Namespace, keys: list[str]) -> dict[str, str]:
    overrides = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    for item in getattr(args, "set", None) or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        overrides[key.strip()] = value.strip()
    return overrides


def _default_output_dir(values: dict[str, Any]) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    root = Path(os.environ.get("PFLARENA_RUNS_DIR", "runs"))
    name = f"{stamp}-{values.get('strategy', 'fedavg')}-{values.get('dataset', 'digits')}-s{values.get('seed', 0)}"
    return str((root / name).resolve())


def run_overrides(args: argparse.Namespace, keys: list[str]) -> dict[str, Any]:
    """The run's keys: the preset's (if any), then flags and ``--set`` on top."""
    from pflarena.server.presets import load_preset

    given = _collect_overrides(args, keys)
    values = given
    if getattr(args, "preset", None):
        values = load_preset(args.preset).overrides(given.get("strategy")) | given
    return with_shard_clients(values, given)


def with_shard_clients(values: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``num-clients`` taken from its ``shards-dir``'s manifest, unless
    ``num-clients`` was ``given`` explicitly (then the run is checked against it)."""
    from pflarena.core.federation import ShardError
    from pflarena.core.shards import read_shard_set

    if not values.get("shards-dir") or "num-clients" in given:
        return values
    try:
        shard_set = read_shard_set(str(values["shards-dir"]))
    except ShardError:
        return values  # the run config's validation names the problem (a usage error)
    return values | {"num-clients": shard_set.num_clients}


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
    from pflarena.server.registry import parse_config
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


#: What ``--resume`` takes besides the run directory: a larger ``num-rounds`` extends the run.
RESUME_KEYS = ("num-rounds",)


def resume_run_config(args: argparse.Namespace, keys: list[str]) -> RunConfig | None:
    """The config that continues ``args.resume``'s run, or ``None`` when the run is complete
    and nothing asks for more rounds (then nothing is started and nothing rewritten).

    A resumed run is its directory's run: flags it would ignore are refused, naming them;
    ``--num-rounds N`` past the recorded rounds extends it (each method's rounds do not
    depend on ``num-rounds``, so the rounds are those of a run started with N).
    """
    from pflarena.server.registry import parse_config
    from pflarena.server.results import completed_summary

    run_dir = Path(args.resume)
    given = _collect_overrides(args, keys)
    ignored = sorted(f"--{key}" for key in given if key not in RESUME_KEYS)
    if args.preset:
        ignored.insert(0, "--preset")
    if ignored:
        raise ConfigError(
            f"--resume continues the run in {run_dir} with that run's own settings; it would "
            f"ignore {', '.join(ignored)}. Leave them out (--num-rounds N extends the run), or "
            "start a new run in a new --output-dir"
        )
    run_config = resume_config(run_dir)
    recorded = int(run_config.get("num-rounds", 0))
    rounds = int(given.get("num-rounds", recorded))
    if rounds < recorded:
        raise ConfigError(
            f"--num-rounds {rounds} would shorten the run in {run_dir}, which has "
            f"num-rounds={recorded}; give more rounds to extend it"
        )
    if rounds == recorded and completed_summary(run_dir) is not None:
        print(
            f"pflarena run: the run in {run_dir} is complete ({recorded} rounds); nothing to "
            "resume (--num-rounds N with more rounds extends it)"
        )
        return None
    return parse_config(run_config | {"num-rounds": rounds})


def _cmd_run(args: argparse.Namespace) -> int:
    from pflarena.server.registry import parse_config
    from pflarena.server.results import check_output_dir

    keys = [n.replace("_", "-") for n in RunConfig.model_fields if n != "resume"] + args.method_keys
    if args.resume:
        cfg = resume_run_config(args, keys)
        if cfg is None:  # complete: nothing to run, nothing rewritten
            print(compare_table([Path(args.resume)]))
            return 0
    else:
        cfg = parse_config(run_overrides(args, keys))
        if not cfg.output_dir:
            cfg = cfg.model_copy(update={"output_dir": _default_output_dir(cfg.to_run_config())})
        try:
            output_dir = Path(cfg.output_dir).resolve()
        except OSError as error:
            raise ConfigError(f"output-dir {cfg.output_dir!r} cannot be used: {error}") from None
        check_output_dir(output_dir)
    if args.check:
        print("".join(f"{k} = {_toml_value(v)}\n" for k, v in cfg.to_run_config().items()), end="")
        return 0
    args.run_dir = str(Path(cfg.output_dir).resolve())  # named if the run is interrupted
    # Before the simulation's start-up: files that are not there fail the run now, with
    # the path looked at, the layout expected and where to get them.
    check_files(cfg.dataset, cfg.data_dir)
    cfg = with_tracking(cfg)
    verbosity = 0 if args.quiet else 2 if args.verbose else 1
    summary = simulate(
        cfg,
        cpus_per_client=args.cpus_per_client,
        gpus_per_client=args.gpus_per_client,
        verbosity=verbosity,
        superlink=args.superlink,
        engine=args.engine,
        ray_address=args.ray_address,
        progress=Progress(1, verbosity=verbosity, quiet=args.quiet),
    )
    print()
    print(compare_table([Path(cfg.output_dir)]))
    print(f"\nresults: {cfg.output_dir}  ({_times(summary)})")
    return 0


def _times(summary: dict[str, Any]) -> str:
    """``start-up 9.1s, rounds 3.4s``: a run's wall time, its start-up apart."""
    if isinstance(summary.get("startup_s"), int | float):
        return (
            f"start-up {summary['startup_s']:.1f}s (clients' start and data, round 0), "
            f"rounds {summary['rounds_time_s']:.1f}s"
        )
    return f"wall time {summary['wall_time_s']:.1f}s"


def with_tracking(cfg: RunConfig, cwd: Path | None = None) -> RunConfig:
    """``cfg`` with its trackers checked (their optional dependencies installed) and
    MLflow's default store made explicit: ``$MLFLOW_TRACKING_URI``, else ``mlruns/`` in the
    current directory (the simulation runs in a scratch directory of its own)."""
    if not cfg.tracker:
        return cfg
    from pflarena.core.trackers_spec import tracker_names
    from pflarena.server.trackers import check_available, default_tracking_uri

    names = tracker_names(cfg.tracker)
    check_available(names)
    if "mlflow" in names and not cfg.tracking_uri:
        cfg = cfg.model_copy(update={"tracking_uri": default_tracking_uri(cwd)})
    return cfg


def _cmd_sweep(args: argparse.Namespace) -> int:
    from collections import Counter

    from pflarena.server import sweep

    grid: dict[str, list[Any]] = {}
    for item in args.grid or []:
        key, sep, values = item.partition("=")
        if not sep or not values.strip():
            raise ConfigError(f"--grid expects key=value,value,..., got {item!r}")
        grid[key.strip()] = [sweep.parse_value(v.strip()) for v in values.split(",") if v.strip()]
    run_keys = [
        n.replace("_", "-")
        for n in RunConfig.model_fields
        if n.replace("_", "-") not in ("resume", *SWEEP_OWN_KEYS)
    ]
    given = _collect_overrides(args, run_keys + args.method_keys)
    settings = {k: sweep.parse_value(v) for k, v in given.items()}
    plan_of = sweep.build_sweep(
        sweep.load_sweep_file(Path(args.file)) if args.file else None,
        preset=args.preset,
        strategies=[s.strip() for s in args.strategies.split(",")] if args.strategies else None,
        seeds=[int(s) for s in args.seeds.split(",")] if args.seeds else None,
        settings=settings,
        grid=grid,
        out=args.out,
    )
    plan = sweep.plan_runs(plan_of)
    counts = Counter(run.status for run in plan)
    print(
        f"sweep {plan_of.out}: {len(plan)} runs, {counts['completed']} completed, "
        f"{counts['resume']} to resume, {counts['new']} to start"
    )
    if args.check:
        for run in plan:
            print(f"  {run.status:9s} {run.directory.relative_to(plan_of.out.resolve())}")
        return 0
    todo = sweep.configs_to_run(plan)
    group = None
    if todo and todo[0].tracker:
        from pflarena.server.trackers import SweepGroup

        todo = [with_tracking(cfg) for cfg in todo]
        group = SweepGroup.open(todo[0], plan_of.out.resolve(), len(plan))
        todo = [group.member(cfg) for cfg in todo]
    if todo:
        for cfg in todo:
            _check_flower_keys(cfg)
        verbosity = 0 if args.quiet else 2 if args.verbose else 1
        try:
            code, tail = run_simulations(
                todo,
                cpus_per_client=args.cpus_per_client,
                gpus_per_client=args.gpus_per_client,
                verbosity=verbosity,
                engine=args.engine,
                ray_address=args.ray_address,
                progress=Progress(len(todo), verbosity=verbosity, quiet=args.quiet),
            )
        except KeyboardInterrupt:
            print(
                "\npflarena sweep: interrupted; the same command continues it (completed runs "
                "are kept, the interrupted one resumes from its checkpoint)",
                file=sys.stderr,
            )
            return 130
    plan = sweep.plan_runs(plan_of)
    markdown, written = sweep.write_leaderboard(plan, plan_of.out.resolve())
    print()
    print(markdown, end="")
    print(f"\nleaderboard: {', '.join(str(path) for path in written)}")
    unfinished = [run for run in plan if run.status != "completed"]
    if group is not None:
        group.finish(written, complete=not unfinished)
    if unfinished:
        if todo and code != 0 and args.quiet:
            print("the simulation's last lines:\n" + "".join(tail), file=sys.stderr)
        print(
            f"pflarena sweep: {len(unfinished)} run(s) did not complete (see their "
            "summary.json); the same command runs them again:\n  "
            + "\n  ".join(str(run.directory) for run in unfinished),
            file=sys.stderr,
        )
        return 1
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    dirs, skipped = comparable_runs([Path(d) for d in args.runs])
    for reason in skipped:
        print(f"pflarena compare: skipping a run: {reason}", file=sys.stderr)
    if not dirs:
        print("pflarena compare: error: no run to compare", file=sys.stderr)
        return 1
    table = compare_table(dirs)
    print(table)
    if args.output:
        Path(args.output).write_text(table + "\n")
    plot = compare_plot(dirs, Path(args.plot))
    print(f"\nplot: {plot}")
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    from pflarena.server import catalog

    if args.flower_config:
        print(catalog.flower_config_toml(), end="")
    elif args.markdown:
        print(catalog.methods_markdown(), end="")
    elif args.name:
        print(catalog.method_details(args.name))
    else:
        print(catalog.methods_table())
        print("\n`pflarena methods NAME` shows a method's parameters.")
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    from pflarena.server.presets import load_preset, preset_names

    if args.name:
        preset = load_preset(args.name)
        print(f"{preset.name}: {preset.description}\nsource: {preset.source}")
        print(f"strategies: {', '.join(preset.strategies)}")
        for key, value in preset.config.items():
            print(f"  {key} = {value!r}")
        return 0
    for name in preset_names():
        print(f"{name:28s} {load_preset(name).description}")
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from pflarena.core.datasets import DATASETS, dataset_spec

    if args.name is None:
        print("| dataset | kind | classes | sample | default model | files |")
        print("|---|---|---|---|---|---|")
        for name in DATASETS:
            spec = dataset_spec(name)
            shape = "x".join(map(str, spec.info.input_shape))
            sample = f"{shape} ids < {spec.info.vocabulary_size}" if spec.info.tokens else shape
            files = "embedded" if spec.check is None else spec.layout
            print(
                f"| {name} | {spec.kind} | {spec.info.num_classes} | {sample} "
                f"| {spec.default_model} | {files} |"
            )
        print(
            "\n`pflarena data NAME` shows where to get a data set; "
            "`pflarena data NAME --check --data-dir DIR` reads a local copy."
        )
        return 0
    spec = dataset_spec(args.name)
    if not args.check:
        print(
            f"{spec.name}: {spec.kind}, {spec.info.num_classes} classes, samples "
            f"{spec.info.input_shape}, default partition {spec.default_partition}, "
            f"default model {spec.default_model}"
        )
        if spec.check is None:
            print("ships with pflarena: no files needed")
        else:
            print(f"layout under data-dir: {spec.layout}\nget it: {spec.source}")
        return 0
    return _check_data(spec, args)


def _check_data(spec: DatasetSpec, args: argparse.Namespace) -> int:
    """Read a local copy of a data set and print what the loader found."""
    import numpy as np

    from pflarena.core.datasets import load_natural, load_pooled

    check_files(spec.name, args.data_dir)
    if spec.kind == "pooled":
        pooled = load_pooled(spec.name, args.data_dir)
        shares = [pooled.y]
        x = pooled.x
        print(f"{spec.name}: {len(pooled.y)} samples in one pool")
    else:
        natural = load_natural(
            spec.name,
            args.num_clients if args.num_clients is not None else (10 if spec.embedded else 0),
            seed=args.seed,
            data_dir=args.data_dir,
            min_client_samples=args.min_client_samples,
        )
        shares = [y for _, y in natural.clients]
        x = np.concatenate([client_x[:1] for client_x, _ in natural.clients])
        sizes = np.array([len(y) for y in shares])
        print(
            f"{spec.name}: {len(shares)} clients, {sizes.sum()} samples "
            f"(per client min {sizes.min()}, median {int(np.median(sizes))}, max {sizes.max()})"
        )
    labels = np.concatenate(shares)
    present = np.unique(labels)
    print(f"samples: shape {tuple(x.shape[1:])}, dtype {x.dtype}")
    print(
        f"labels: {len(present)} of {spec.info.num_classes} classes present, "
        f"range {labels.min()}..{labels.max()}"
    )
    if labels.min() < 0 or labels.max() >= spec.info.num_classes:
        print(f"error: labels outside 0..{spec.info.num_classes - 1}", file=sys.stderr)
        return 1
    print("ok")
    return 0


def _cmd_shards_import(args: argparse.Namespace) -> int:
    from pflarena.core.importers import import_leaf, import_pfllib
    from pflarena.core.shards import read_shard_set

    if not 0 <= args.import_validation_fraction < 1:
        raise ConfigError("--validation-fraction must be in [0, 1)")
    options = {"validation_fraction": args.import_validation_fraction, "seed": args.import_seed}
    if args.format == "pfllib":
        paths = import_pfllib(
            args.folder, args.out, name=args.name, num_classes=args.num_classes, **options
        )
    else:
        if args.num_classes is not None:
            raise ConfigError(f"--num-classes applies to --format pfllib, not {args.format}")
        paths = import_leaf(args.folder, args.out, dataset=args.format.split("-", 1)[1], **options)
    shard_set = read_shard_set(args.out)
    record = json.loads((shard_set.directory / "manifest.json").read_text()).get("import", {})
    if record.get("num_classes_source") == "inferred":
        print(
            f"config.json has no num_classes: {shard_set.info.num_classes} classes inferred "
            f"from the labels (largest label {record['largest_label']}, "
            f"{record['labels_present']} distinct labels; --num-classes sets the count)"
        )
    print(
        f"wrote {len(paths)} shard files ({shard_set.info.name}: {shard_set.info.num_classes} "
        f"classes, samples {shard_set.info.input_shape}, {sum(shard_set.num_train)} train / "
        f"{sum(shard_set.num_val)} validation / {sum(shard_set.num_test)} test) to "
        f"{shard_set.directory}"
    )
    print(f"simulate on them: pflarena run --shards-dir {shard_set.directory} --strategy fedavg")
    return 0


def _cmd_shards(args: argparse.Namespace) -> int:
    from pflarena.core.federation import build_federation, write_shards

    if not args.out:
        raise ConfigError("pflarena shards needs --out DIR")

    overrides = _collect_overrides(args, list(DATA_KEYS))
    cfg = parse_run_config(overrides)
    spec = cfg.federation_spec()
    paths = write_shards(build_federation(spec), args.out, spec)
    print(f"wrote {len(paths)} shard files to {Path(args.out).resolve()}")
    example = paths[0].resolve()
    print(f"start each SuperNode with its own file, e.g. --node-config 'data-path=\"{example}\"'")
    return 0


RUN_EPILOG = (
    "Common flags only: `pflarena run --help-all` lists every run-config key and every "
    "method's parameters (--<method>.<param>, e.g. --ditto.lambda 0.5), `pflarena methods "
    "NAME` one method's parameters; any key also works as --set KEY=VALUE."
)


def build_parser(full_help: bool = False) -> argparse.ArgumentParser:
    """The ``pflarena`` parser; ``full_help`` lists every run-config and method flag in
    ``run --help`` and ``sweep --help`` (``--help-all``), else the common ones only."""
    parser = argparse.ArgumentParser(prog="pflarena", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser(
        "run",
        help="run one strategy as a Flower simulation",
        description="Run one strategy as a Flower simulation and print its results.",
        epilog=None if full_help else RUN_EPILOG,
    )
    run.add_argument(
        HELP_ALL, action="store_true", help="list every flag (run config, method parameters)"
    )
    run.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run in DIR from its last checkpoint (other settings are DIR's)",
    )
    run.add_argument(
        "--preset",
        metavar="NAME",
        help="start from an experiment preset (`pflarena presets`); flags override it",
    )
    _add_config_flags(run, full_help=full_help)
    from pflarena.strategies import declarations

    run.set_defaults(method_keys=_add_method_flags(run, declarations(), full_help=full_help))
    run.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="any run-config key (repeatable)"
    )
    run.add_argument(
        "--cpus-per-client",
        type=float,
        default=1.0,
        help="CPUs Flower reserves per simulated client (default 1)",
    )
    run.add_argument(
        "--gpus-per-client",
        type=float,
        default=0.0,
        help="GPU fraction per simulated client (default 0)",
    )
    run.add_argument(
        "--check",
        action="store_true",
        help="validate the run config, print it resolved (as TOML) and run nothing",
    )
    run.add_argument("--engine", choices=ENGINES, default="ray", help=ENGINE_HELP)
    run.add_argument("--ray-address", metavar="auto|HOST:PORT", help=RAY_ADDRESS_HELP)
    run.add_argument(
        "--superlink",
        action="store_true",
        help="submit the app with `flwr run` to a private simulation SuperLink, as `flwr run .` "
        "does (builds and installs the FAB; same results, a longer start-up)",
    )
    run.add_argument(
        "--quiet", action="store_true", help="one line when the run ends, then the final table"
    )
    run.add_argument("--verbose", action="store_true", help="stream the whole Flower log")
    run.set_defaults(func=_cmd_run)

    sweep = sub.add_parser(
        "sweep",
        help="run a grid of runs (strategies x seeds x config values) on one start-up, "
        "skipping completed runs; write a leaderboard",
        description="Run every combination of strategies, seeds and swept run-config values "
        "in one simulation process, skip runs that already completed (a run that was "
        "interrupted is resumed), and write leaderboard.{md,csv,png} into the output "
        "directory. The grid comes from a TOML file (see pflarena/server/sweep.py), flags, "
        "or both; flags win. The run flags (--num-rounds 2, --ditto.lambda 0.5, ...) set "
        "every run's value, as --set does.",
        epilog=None if full_help else RUN_EPILOG.replace("pflarena run", "pflarena sweep"),
    )
    sweep.add_argument(
        HELP_ALL, action="store_true", help="list every flag (run config, method parameters)"
    )
    sweep.add_argument("file", nargs="?", help="a sweep TOML file (optional)")
    sweep.add_argument("--preset", metavar="NAME", help="start from an experiment preset")
    sweep.add_argument("--strategies", metavar="A,B,...", help="strategies to run")
    sweep.add_argument("--seeds", metavar="S,S,...", help="seeds (default: the config's seed)")
    sweep.add_argument(
        "--grid",
        action="append",
        metavar="KEY=V1,V2,...",
        help="sweep a run-config key over values (repeatable; <method>.<param> keys "
        "multiply only that method's runs)",
    )
    sweep.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="a run-config key for every run"
    )
    sweep.add_argument("--out", metavar="DIR", help="the sweep's directory (required)")
    sweep.add_argument(
        "--cpus-per-client", type=float, default=1.0, help="CPUs per simulated client (default 1)"
    )
    sweep.add_argument(
        "--gpus-per-client", type=float, default=0.0, help="GPU fraction per client (default 0)"
    )
    sweep.add_argument("--engine", choices=ENGINES, default="ray", help=ENGINE_HELP)
    sweep.add_argument("--ray-address", metavar="auto|HOST:PORT", help=RAY_ADDRESS_HELP)
    sweep.add_argument(
        "--check", action="store_true", help="print the runs and what each needs; run nothing"
    )
    sweep.add_argument(
        "--quiet", action="store_true", help="one line per run as it ends, then the leaderboard"
    )
    sweep.add_argument("--verbose", action="store_true", help="stream the whole Flower log")
    # The run flags a sweep passes on to every run (strategy, seed and output-dir are the
    # sweep's own: --strategies, --seeds, --out).
    _add_config_flags(sweep, full_help=full_help, skip=SWEEP_OWN_KEYS)
    sweep.set_defaults(
        func=_cmd_sweep,
        method_keys=_add_method_flags(sweep, declarations(), full_help=full_help),
    )

    compare = sub.add_parser("compare", help="a Markdown table and a plot of several runs")
    compare.add_argument("runs", nargs="+", help="run output directories")
    compare.add_argument("--plot", default="compare.png", help="plot file (default compare.png)")
    compare.add_argument("--output", help="also write the table to this Markdown file")
    compare.set_defaults(func=_cmd_compare)

    methods = sub.add_parser("methods", help="list the methods, or one method's parameters")
    methods.add_argument("name", nargs="?", help="a method name")
    methods.add_argument(
        "--markdown", action="store_true", help="every method as Markdown (docs/methods.md)"
    )
    methods.add_argument(
        "--flower-config",
        action="store_true",
        help="the [tool.flwr.app.config] table the declarations imply (pyproject.toml)",
    )
    methods.set_defaults(func=_cmd_methods)

    presets = sub.add_parser("presets", help="list the experiment presets, or show one")
    presets.add_argument("name", nargs="?", help="a preset name")
    presets.set_defaults(func=_cmd_presets)

    data = sub.add_parser(
        "data", help="list the data sets, show where to get one, or check a local copy"
    )
    data.add_argument("name", nargs="?", help="a data set name")
    data.add_argument(
        "--check", action="store_true", help="read the local copy in --data-dir and summarise it"
    )
    data.add_argument("--data-dir", default="", help="folder holding the data set's files")
    data.add_argument(
        "--num-clients",
        type=int,
        default=None,
        help="natively federated data sets: clients to form (default: every eligible one)",
    )
    data.add_argument(
        "--min-client-samples", type=int, default=0, help="LEAF data sets: LEAF's -k filter"
    )
    data.add_argument("--seed", type=int, default=0, help="seed of the choice of clients")
    data.set_defaults(func=_cmd_data)

    shards = sub.add_parser(
        "shards",
        help="write one data file per client (deployments, --shards-dir), or import a "
        "partition made by another toolkit",
    )
    _add_config_flags(shards, DATA_KEYS)
    shards.add_argument("--out", help="directory for the shard files (required)")
    shards.set_defaults(func=_cmd_shards)
    shards_commands = shards.add_subparsers(dest="shards_command", metavar="{import}")
    imports = shards_commands.add_parser(
        "import",
        help="convert another toolkit's partitioned dataset folder into shard files",
        description="Convert a dataset folder partitioned by another toolkit into shard files, "
        "keeping its clients, their samples and its train/test split: pfllib (config.json, "
        "train/<i>.npz, test/<i>.npz), leaf-femnist and leaf-shakespeare (LEAF's train/*.json "
        "and test/*.json).",
    )
    imports.add_argument("folder", help="the toolkit's dataset folder")
    imports.add_argument(
        "--format", required=True, choices=IMPORT_FORMATS, help="the folder's layout"
    )
    imports.add_argument("--out", required=True, help="directory for the shard files")
    imports.add_argument("--name", help="the data's name (pfllib; default pfllib-<folder>)")
    imports.add_argument(
        "--num-classes",
        type=int,
        help="pfllib: the number of classes (default: config.json's num_classes, else the "
        "largest label plus one); must agree with config.json and exceed every label",
    )
    imports.add_argument(
        "--validation-fraction",
        dest="import_validation_fraction",
        type=float,
        default=0.0,
        help="carve a seeded validation split out of each client's training split (default 0)",
    )
    imports.add_argument(
        "--seed", dest="import_seed", type=int, default=0, help="seed of that split (default 0)"
    )
    imports.set_defaults(func=_cmd_shards_import)

    # Deployments: local-deploy, certs, compose (pflarena/server/deploy_cli.py).
    from pflarena.server import deploy_cli

    deploy_cli.add_parsers(sub)
    return parser


#: Run-config keys a sweep sets itself (--strategies, --seeds, --out), never a run flag.
SWEEP_OWN_KEYS = ("strategy", "seed", "output-dir")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["run"], ["sweep"]) and HELP_ALL in argv:
        build_parser(full_help=True).parse_args([argv[0], "--help"])  # prints, exits 0
    # Flower's SuperExec and SuperNode flags pass through untouched (argparse would claim them).
    if argv[:1] == ["executor"]:
        from pflarena.server.executor import main as executor_main

        executor_main(argv[1:])
        return 0
    if argv[:1] == ["supernode"]:
        from pflarena.server.supernode import main as supernode_main

        supernode_main(argv[1:])
        return 0
    args = build_parser().parse_args(argv)
    terminated: list[int] = []

    def _terminate(signum: int, frame: Any) -> None:
        # SIGTERM (a process manager, `kill`) takes Ctrl-C's way out: whatever the command
        # started is stopped on the way (run_simulations), instead of left orphaned.
        terminated.append(signum)
        raise KeyboardInterrupt

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        return args.func(args)
    except (ConfigError, ValueError, OSError, RuntimeError) as exc:
        print(f"pflarena {args.command}: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    except KeyboardInterrupt:
        # Everything started was stopped on the way out (run_simulations); one line.
        run_dir = getattr(args, "run_dir", None)
        hint = f"; `pflarena run --resume {run_dir}` continues it" if run_dir else ""
        how = "terminated" if terminated else "interrupted"
        print(f"\npflarena {args.command}: {how}{hint}", file=sys.stderr)
        return 128 + signal.SIGTERM if terminated else 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
