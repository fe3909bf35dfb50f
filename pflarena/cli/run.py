"""``pflarena run``: one strategy as a Flower simulation, its results printed; ``--resume``
continues a run, ``--check`` validates its config and runs nothing."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pflarena.cli.options import (
    HELP_ALL,
    RUN_EPILOG,
    HelpFormatter,
    add_config_flags,
    add_method_flags,
    add_runtime_flags,
    collect_overrides,
    default_output_dir,
    parse_run,
    run_overrides,
    with_tracking,
)
from pflarena.core.config import ConfigError, RunConfig, toml_value
from pflarena.core.phases import PHASES_ENV, mark, phase_table, process_start, read_marks
from pflarena.core.text import count
from pflarena.reporting.compare import compare_table
from pflarena.runtime.launch import resume_config, simulate
from pflarena.server.progress import Progress
from pflarena.server.progress_events import PLOTS_ENV
from pflarena.server.results import failure_text, recorded_failures

__all__ = ["add_parser", "command", "resume_run_config"]

#: What ``--resume`` takes besides the run directory: a larger ``num-rounds`` extends the run.
RESUME_KEYS = ("num-rounds",)


def resume_run_config(args: argparse.Namespace, keys: list[str]) -> RunConfig | None:
    """The config that continues ``args.resume``'s run, or ``None`` when the run is complete
    and nothing asks for more rounds (then nothing is started and nothing rewritten).

    A resumed run is its directory's run: flags it would ignore are refused, naming them;
    ``--num-rounds N`` past the recorded rounds extends it (each method's rounds do not
    depend on ``num-rounds``, so the rounds are those of a run started with N).
    """
    from pflarena.server.results import completed_summary

    run_dir = Path(args.resume)
    given = collect_overrides(args, keys)
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
    stopped = _clients_failed(run_dir)
    if stopped:
        raise ConfigError(
            f"the run in {run_dir} stopped because {stopped}; resuming it would fail the same "
            "way (start a new run with settings its clients can run)"
        )
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
            "resume (--num-rounds N with more rounds extends it)",
            file=sys.stderr,
        )
        return None
    return parse_run(run_config | {"num-rounds": rounds})


def early_plan(argv: list[str]) -> Any:
    """The engine ``pflarena run argv`` will use, from its runtime flags alone: decided
    before the imports that parsing the whole command line needs (torch, Flower: seconds),
    so that the command's first line can say it at once. None when nothing will run
    (``--help``, ``--check``) or nothing is to be shown (``--quiet``)."""
    import argparse as _argparse

    from pflarena.runtime.engines import ENGINES, plan_engine

    if {"-h", "--help", HELP_ALL, "--check", "--quiet"} & set(argv):
        return None
    parser = _argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--engine", choices=ENGINES)
    parser.add_argument("--workers", type=int)
    parser.add_argument("--clients-per-gpu", type=int)
    parser.add_argument("--cpus-per-client", type=float, default=1.0)
    parser.add_argument("--gpus-per-client", type=float, default=0.0)
    parser.add_argument("--ray-address")
    parser.add_argument("--device", default="auto")
    try:
        known, _ = parser.parse_known_args(argv)
        return plan_engine(
            known.engine,
            workers=known.workers,
            cpus_per_client=known.cpus_per_client,
            gpus_per_client=known.gpus_per_client,
            ray_address=known.ray_address,
            device=known.device,
            clients_per_gpu=known.clients_per_gpu,
        )
    except (SystemExit, ValueError):
        return None  # the whole parser says what is wrong


def _clients_failed(run_dir: Path) -> str | None:
    """The line a run stopped with when every client failed alike (``ClientsFailed``), if so."""
    import json

    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    error = str(summary.get("error") or "")
    marker = "every client failed in "
    if summary.get("status") == "completed" or marker not in error:
        return None
    return error[error.index(marker) :]


def load_run_file(path: str) -> dict[str, Any]:
    """The run-config keys of a ``--config`` TOML file (tables flattened to ``a.b`` keys, as
    a ``[ditto]`` table gives ``ditto.lambda``); a :class:`ConfigError` naming the file."""
    import tomllib

    from pflarena.core.presets import flatten_table

    file = Path(path)
    try:
        data = tomllib.loads(file.read_text())
    except OSError as error:
        raise ConfigError(f"--config {path}: cannot read it ({error.strerror or error})") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--config {path}: not valid TOML ({error})") from None
    values = flatten_table(data)
    if "resume" in values:
        raise ConfigError(f"--config {path}: resume is not a key of a new run (--resume DIR)")
    return values


def _with_strategy(values: dict[str, Any], preset_name: str | None) -> dict[str, Any]:
    """``values`` with the preset's strategy when none was given and the preset names one;
    a :class:`ConfigError` when the preset compares several and none was chosen."""
    if not preset_name or values.get("strategy"):
        return values
    from pflarena.core.presets import load_preset

    preset = load_preset(preset_name)
    if len(preset.strategies) == 1:
        return values | {"strategy": preset.strategies[0]}
    raise ConfigError(
        f"preset {preset_name} compares {len(preset.strategies)} strategies "
        f"({', '.join(preset.strategies)}); name one with --strategy (e.g. --strategy "
        f"{preset.strategies[-1]}), or run them all with `pflarena sweep --preset {preset_name}`"
    )


def command(args: argparse.Namespace) -> int:
    # The run's moments begin once its config is checked, "config checked" the first after
    # the command's start: the data the check builds here is the run's process's to note.
    given = os.environ.pop(PHASES_ENV, None)
    try:
        return _command(args, given)
    finally:
        if given is not None:
            os.environ[PHASES_ENV] = given


def _command(args: argparse.Namespace, phases_file: str | None) -> int:
    from pflarena.runtime.precheck import check_data_apart
    from pflarena.server.results import check_output_dir

    keys = [n.replace("_", "-") for n in RunConfig.model_fields if n != "resume"] + args.method_keys
    if args.resume:
        if args.config:
            raise ConfigError(
                "--resume continues the run in its directory with that run's own settings; "
                "leave out --config"
            )
        cfg = resume_run_config(args, keys)
        if cfg is None:  # complete: nothing to run, nothing rewritten
            print(console_table(Path(args.resume)))
            return exit_code(_read_summary(Path(args.resume)), Path(args.resume))
    else:
        file_values = load_run_file(args.config) if args.config else {}
        cfg = parse_run(_with_strategy(run_overrides(args, keys, base=file_values), args.preset))
        if not cfg.output_dir:
            cfg = cfg.model_copy(update={"output_dir": default_output_dir(cfg.to_run_config())})
        try:
            output_dir = Path(cfg.output_dir).resolve()
        except OSError as error:
            raise ConfigError(f"output-dir {cfg.output_dir!r} cannot be used: {error}") from None
        check_output_dir(output_dir)
    # Before the simulation's start-up: files that are not there, and settings the data
    # cannot satisfy (more clients than samples, a partition that leaves a client without
    # its minimum), a server that would not fit this machine's memory and state that would
    # not fit the output directory's disk fail the run now, in one line with the numbers.
    # A simulation's clients keep their state in the output directory; --superlink's nodes
    # keep theirs where their own state-dir is.
    (checked,) = check_data_apart(
        [cfg], files_required=not args.check, clients_here=not args.superlink
    )
    if args.check:
        disk = checked.disk
        if disk.terms:
            print(
                f"pflarena run: state on disk, up to about {disk} in {disk.directory}",
                file=sys.stderr,
            )
        if checked.unchecked:
            print(f"pflarena run: {' '.join(checked.unchecked.split())}", file=sys.stderr)
        elif not cfg.shards_dir:
            # Each client's samples and labels, as `pflarena shards --stats` prints them; on
            # stderr, so that stdout stays the resolved config.
            from pflarena.core.partition_stats import LISTED_CLIENTS, print_partition_summary

            print_partition_summary(
                cfg.federation_spec(), file=sys.stderr, max_clients=LISTED_CLIENTS
            )
        print("".join(f"{k} = {toml_value(v)}\n" for k, v in cfg.to_run_config().items()), end="")
        return 0
    args.run_dir = str(Path(cfg.output_dir).resolve())  # named if the run is interrupted
    with _phases(getattr(args, "started_at", None), phases_file) as phases:
        return _start(args, cfg, phases)


@contextlib.contextmanager
def _phases(started_at: float | None, given: str | None) -> Iterator[Path]:
    """The file the run's processes note their moments in (:mod:`pflarena.core.phases`):
    ``given`` (the caller's :data:`~pflarena.core.phases.PHASES_ENV`), else one of this
    command's own, removed at the end. The command's first moment is ``started_at`` (the
    command line's process start, :func:`pflarena.cli.command.main`), else this process's
    start."""
    import tempfile

    if given:
        os.environ[PHASES_ENV] = given
        path = Path(given)
    else:
        fd, name = tempfile.mkstemp(prefix="pflarena-phases-")
        os.close(fd)
        path = Path(name)
        os.environ[PHASES_ENV] = name
    mark("command started", at=process_start() if started_at is None else started_at)
    mark("config checked (no torch, no Flower)")
    try:
        yield path
    finally:
        os.environ.pop(PHASES_ENV, None)
        if not given:
            path.unlink(missing_ok=True)


@contextlib.contextmanager
def _plots_here(cfg: RunConfig, superlink: bool) -> Iterator[threading.Thread | None]:
    """Where this command draws the run's own plots once it has ended (no tracker to log
    them from the ServerApp, not ``--superlink``): a thread importing matplotlib meanwhile,
    on a core the run's start-up leaves idle, and :data:`PLOTS_ENV` telling the ServerApp
    to leave them out. None where the ServerApp draws them."""
    previous = os.environ.pop(PLOTS_ENV, None)  # this command's run only
    try:
        if cfg.tracker or superlink:
            yield None
            return
        warm = threading.Thread(target=_warm_plots, name="pflarena-plots", daemon=True)
        warm.start()
        os.environ[PLOTS_ENV] = "1"
        yield warm
    finally:
        os.environ.pop(PLOTS_ENV, None)
        if previous is not None:
            os.environ[PLOTS_ENV] = previous


def _warm_plots() -> None:
    """Import matplotlib and draw one small picture in memory (its fonts loaded)."""
    import io

    from pflarena.core.drawing import pyplot
    from pflarena.server.results import plot_run  # noqa: F401 - imported before it is needed

    plt = pyplot()
    figure, axes = plt.subplots(figsize=(1, 1))
    axes.set_title("x")
    figure.savefig(io.BytesIO(), format="png")
    plt.close(figure)


def _start(args: argparse.Namespace, cfg: RunConfig, phases: Path) -> int:
    """Run ``cfg`` (checked) and print its results."""
    with _plots_here(cfg, args.superlink) as plots:
        summary = _simulate(args, cfg)
        if plots is not None and summary.get("status") == "completed":
            from pflarena.server.results import plot_run

            plots.join()
            plot_run(Path(cfg.output_dir))
            mark("plots drawn")
    return _report(cfg, summary, phases, verbose=args.verbose and not args.quiet)


def _simulate(args: argparse.Namespace, cfg: RunConfig) -> dict[str, Any]:
    """Run ``cfg`` and return its summary (:func:`~pflarena.runtime.launch.simulate`)."""
    cfg = with_tracking(cfg)
    from pflarena.runtime.engines import plan_engine

    try:
        plan = plan_engine(
            args.engine,
            workers=args.workers,
            cpus_per_client=args.cpus_per_client,
            gpus_per_client=args.gpus_per_client,
            ray_address=args.ray_address,
            device=cfg.device,
            num_clients=cfg.num_clients,
            clients_per_gpu=args.clients_per_gpu,
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None
    verbosity = 0 if args.quiet else 2 if args.verbose else 1
    if not args.quiet:
        # the engine was said on the first line (early_plan); again only where the run's
        # settings (its device, its number of clients) changed it
        early = getattr(args, "early_plan", None)
        engine = "" if early == plan else f"; {plan.describe()}"
        print(
            f"pflarena run: {cfg.strategy} on {cfg.dataset}, {count(cfg.num_clients, 'client')}, "
            f"{count(cfg.num_rounds, 'round')}{'; --superlink' if args.superlink else ''}{engine}",
            file=sys.stderr,
            flush=True,
        )
    try:
        summary = simulate(
            cfg,
            cpus_per_client=args.cpus_per_client,
            gpus_per_client=args.gpus_per_client,
            verbosity=verbosity,
            superlink=args.superlink,
            engine=args.engine,
            ray_address=args.ray_address,
            progress=Progress(1, verbosity=verbosity, quiet=args.quiet),
            workers=args.workers,
            clients_per_gpu=args.clients_per_gpu,
        )
    finally:
        if args.config and Path(args.run_dir).is_dir():
            import shutil

            shutil.copyfile(args.config, Path(args.run_dir) / RUN_FILE_COPY)
    return summary


def _report(cfg: RunConfig, summary: dict[str, Any], phases: Path, verbose: bool) -> int:
    """Print the run's results and times (and with ``verbose`` where its time went)."""
    run_dir = Path(cfg.output_dir)
    (run_dir / TABLE_FILE).write_text(compare_table([run_dir]) + "\n")
    mark("results table written")
    marks = read_marks(phases)
    started = min((at for at, pid, _ in marks if pid == os.getpid()), default=None)
    round0 = next((at for at, _, name in marks if name == ROUND0_MOMENT), None)
    startup_s = round0 - started if started is not None and round0 is not None else None
    print(console_table(run_dir))
    print(f"\nresults: {cfg.output_dir}\n({_times(summary, startup_s)}; full table: {TABLE_FILE})")
    if verbose and started is not None:
        print(f"pflarena run: where the time went\n{phase_table(marks, started)}", file=sys.stderr)
    return exit_code(summary, run_dir)


#: The moment that ends a run's start-up (:mod:`pflarena.server.loop`).
ROUND0_MOMENT = "round 0 evaluated"


#: Exit code of a run that completed but some of whose clients failed (``summary.json``'s
#: ``client_failures``): its results are written, over fewer clients than the run has.
EXIT_CLIENTS_FAILED = 3
#: Distinct errors the closing lines show (``summary.json`` lists them all).
SHOWN_ERRORS = 5


def exit_code(summary: dict[str, Any], run_dir: Path) -> int:
    """0 for a run that completed with every client, :data:`EXIT_CLIENTS_FAILED` (after
    saying on stderr which clients failed, where and why) for one that lost some."""
    failures = recorded_failures(run_dir, summary)
    text = failure_text(failures)
    if not text:
        return 0
    lines = [f"pflarena run: completed, but {text} (exit code {EXIT_CLIENTS_FAILED}):"]
    total = failures.get("of")
    for error in (failures.get("errors") or [])[:SHOWN_ERRORS]:
        count = f"{error['clients']} of {total}" if isinstance(total, int) else error["clients"]
        where = ", ".join(error.get("exchanges") or [])
        lines.append(f"  {count} clients ({where}; rounds {error['rounds']}): {error['error']}")
    hidden = len(failures.get("errors") or []) - SHOWN_ERRORS + failures.get("other_errors", 0)
    if hidden > 0:
        lines.append(f"  ... and {hidden} other error(s)")
    if failures.get("never_evaluated"):
        never = ", ".join(map(str, failures["never_evaluated"]))
        lines.append(f"  never evaluated: clients {never}")
    lines.append(f"  (every failed client: client_failures in {run_dir / 'summary.json'})")
    print("\n".join(lines), file=sys.stderr)
    return EXIT_CLIENTS_FAILED


def _read_summary(run_dir: Path) -> dict[str, Any]:
    import json

    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _times(summary: dict[str, Any], startup_s: float | None = None) -> str:
    """``start-up 4.1s, rounds 3.4s``: a run's wall time, its start-up apart. ``startup_s``:
    from the command's start to the end of round 0, where the run's moments say it; else
    the ServerApp's own (from its start)."""
    if isinstance(summary.get("startup_s"), int | float):
        if startup_s is not None:
            began = "from the command's start: imports, data, clients' start, round 0"
        else:
            startup_s, began = summary["startup_s"], "clients' start and data, round 0"
        return f"start-up {startup_s:.1f}s ({began}), rounds {summary['rounds_time_s']:.1f}s"
    return f"wall time {summary['wall_time_s']:.1f}s"


def _count(number: Any, noun: str) -> str:
    """:func:`~pflarena.core.text.count` of a summary's number, ``? nouns`` where missing."""
    return count(number, noun) if isinstance(number, int) else f"? {noun}s"


#: The ``--config`` file's copy in the run directory.
RUN_FILE_COPY = "run.toml"
#: The run's full results table (every column of ``pflarena compare``).
TABLE_FILE = "results.md"
#: The console table's width limit.
CONSOLE_WIDTH = 100


def console_table(run_dir: Path) -> str:
    """A run's headline figures, one per line (so that it fits :data:`CONSOLE_WIDTH`
    columns), accuracies in percent as in every table of pflarena; the full table, with
    every column of ``pflarena compare``, is :data:`TABLE_FILE`'s."""
    import json

    from pflarena.server.metrics import label

    summary = json.loads((run_dir / "summary.json").read_text())

    def pct(block: Any, key: str) -> str:
        value = ((block or {}).get("last") or {}).get(key)
        return f"{100 * value:.2f}" if isinstance(value, int | float) else "—"

    done = summary.get("rounds_completed", summary.get("num_rounds"))
    status = str(summary.get("status", "?"))
    if summary.get("signal"):
        status += f" by {summary['signal']}"
    rows = [
        ("run", f"{summary.get('strategy', '?')} on {summary.get('dataset', '?')}, "
                f"{_count(summary.get('num_clients'), 'client')}, seed {summary.get('seed', '?')}"),
        ("status", f"{status}, {done}/{summary.get('num_rounds', '?')} rounds"),
    ]  # fmt: skip
    if lost := failure_text(recorded_failures(run_dir, summary)):
        rows.append(("client failures", lost))
    rows += [
        (f"{label('personalized', 'mean')}, %", pct(summary.get("personalized"), "mean")),
        (f"{label('personalized', 'worst10')}, %", pct(summary.get("personalized"), "worst10")),
        (f"{label('global', 'weighted')}, %", pct(summary.get("global"), "weighted")),
    ]
    # the accuracies' header: over how many clients they are, where fewer than the run's
    header = "last round"
    evaluated = ((summary.get("personalized") or {}).get("last") or {}).get("clients")
    if isinstance(evaluated, int) and evaluated != summary.get("num_clients"):
        header += f" ({evaluated} of {summary.get('num_clients')} clients evaluated)"
    left = max(len(name) for name, _ in rows)
    right = max(len(header), *(len(value) for _, value in rows))
    lines = [
        f"| {'':{left}} | {header:{right}} |",
        f"|{'-' * (left + 2)}|{'-' * (right + 2)}|",
    ]
    lines += [f"| {name:{left}} | {value:{right}} |" for name, value in rows]
    return "\n".join(line[:CONSOLE_WIDTH] for line in lines)


def add_parser(sub: Any, full_help: bool = False) -> None:
    """``pflarena run``."""
    run = sub.add_parser(
        "run",
        help="run one strategy as a Flower simulation",
        description="Run one strategy as a Flower simulation and print its results.",
        epilog=None if full_help else RUN_EPILOG,
        formatter_class=HelpFormatter,
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
    run.add_argument(
        "--config",
        metavar="FILE",
        help="run-config keys from a TOML file (examples/run.toml); flags override it",
    )
    add_config_flags(run, full_help=full_help)
    # the methods as the catalog lists them: their flags without importing the strategies
    from pflarena.cli.methods import listed_declarations

    run.set_defaults(method_keys=add_method_flags(run, listed_declarations(), full_help=full_help))
    run.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="any run-config key (repeatable)"
    )
    add_runtime_flags(
        run,
        check_help="validate the run config, print it resolved (as TOML) and run nothing",
        quiet_help="one line when the run ends, then the final table",
    )
    run.add_argument(
        "--superlink",
        action="store_true",
        help="submit the app with `flwr run` to a private simulation SuperLink, as `flwr run .` "
        "does (builds and installs the FAB; same results, a longer start-up)",
    )
    run.set_defaults(func=command)
