"""Sweeps: a grid of runs (strategies × seeds × run-config values), run on one simulation
start-up, completed runs skipped, and a leaderboard of the results.

A sweep is described by a TOML file, flags, or both (flags win)::

    preset = "digits-main"            # optional: a preset's [config] as the base
    strategies = ["fedavg", "ditto"]  # default: the preset's
    seeds = [0, 1, 2]                 # default: the config's seed
    out = "runs/alpha-sweep"

    [config]                          # every run (method parameters in sub-tables)
    num-rounds = 20

    [grid]                            # every combination of these values
    alpha = [0.1, 1.0]
    ditto.lambda = [0.1, 1.0]         # a method's key multiplies that method's runs only

Each run lives in ``<out>/<setting>/<method>/seed-<seed>``, where ``<setting>`` names the
grid values of the common keys (``alpha=0.1``) and ``<method>`` the strategy and its swept
parameters (``ditto,lambda=0.1``). A run whose ``summary.json`` says ``completed`` is not run
again; a run that started but did not complete (a killed sweep) is resumed from its
checkpoint (``pflarena run --resume``); a directory holding a run of another config is an
error. The runs to do go to one simulation process (:func:`pflarena.runtime.launch.run_simulations`)
that starts Flower's runtime once. The leaderboard (``leaderboard.md``, ``leaderboard.csv``,
``leaderboard.png`` in ``<out>``, :mod:`pflarena.reporting.leaderboard`) gives, per setting
and method, the mean and standard deviation over seeds of each run's ``summary.json`` values.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomllib

from pflarena.cli.options import (
    HELP_ALL,
    RUN_EPILOG,
    add_config_flags,
    add_method_flags,
    add_runtime_flags,
    collect_overrides,
    run_declarations,
    validate_run,
    with_tracking,
)
from pflarena.cli.run import EXIT_CLIENTS_FAILED
from pflarena.core.config import ConfigError, RunConfig
from pflarena.core.footprint import DiskEstimate, human_bytes
from pflarena.core.presets import flatten_table, load_preset
from pflarena.reporting.leaderboard import (
    leaderboard,
    leaderboard_csv,
    leaderboard_markdown,
    sweep_title,
)
from pflarena.reporting.plots import leaderboard_plot
from pflarena.runtime.launch import check_flower_keys, run_simulations
from pflarena.server.progress import Progress
from pflarena.server.results import failure_text, recorded_failures

__all__ = [
    "add_parser",
    "command",
    "PlannedRun",
    "Sweep",
    "load_sweep_file",
    "parse_value",
    "plan_runs",
]

#: Sweep-file entries besides the run config.
SWEEP_FILE_KEYS = ("preset", "strategies", "seeds", "out", "config", "grid")

Status = Literal["completed", "resume", "new"]

#: Run-config keys that do not make a run what it is: where it is written, whether it
#: resumed, and how it is tracked (a completed run is not run again for another tracker).
NOT_SETTINGS = frozenset(
    {
        "resume",
        "output-dir",
        "tracker",
        "tracking-uri",
        "tracking-experiment",
        "tracking-parent",
        "tracking-group",
    }
)


@dataclass
class Sweep:
    """What to run: strategies × seeds × the grid's combinations, on a common config.

    ``config`` and ``grid`` hold flat run-config keys (method keys as ``<method>.<param>``);
    ``grid`` maps each swept key to its values.
    """

    strategies: list[str]
    seeds: list[int]
    out: Path
    config: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class PlannedRun:
    """One run of a sweep: where it lives, its config, and what is to be done with it."""

    setting: tuple[tuple[str, Any], ...]
    """The grid values of the common keys, sorted by key."""
    method: str
    """The strategy and its swept parameters, e.g. ``ditto,lambda=0.1``."""
    strategy: str
    seed: int
    directory: Path
    run_config: dict[str, Any]
    status: Status

    @property
    def setting_name(self) -> str:
        return _label(self.setting) or "all"


def parse_value(text: str) -> Any:
    """A flag's value as TOML reads it (``0.1`` a float, ``true`` a bool), else the string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _values_list(text: str) -> list[Any]:
    return [parse_value(part.strip()) for part in text.split(",") if part.strip()]


def load_sweep_file(path: Path) -> dict[str, Any]:
    """A sweep file's entries, checked; raise :class:`ConfigError` naming the problem."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"sweep file {path} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"sweep file {path} is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(SWEEP_FILE_KEYS))
    if unknown:
        raise ConfigError(
            f"sweep file {path}: unknown entries {unknown}; expected {', '.join(SWEEP_FILE_KEYS)}"
        )
    for table in ("config", "grid"):
        if not isinstance(data.get(table, {}), dict):
            raise ConfigError(f"sweep file {path}: [{table}] must be a table")
    grid = flatten_table(data.get("grid", {}))
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep file {path}: grid key {key!r} needs a non-empty list")
    return data | {"config": flatten_table(data.get("config", {})), "grid": grid}


def build_sweep(
    file: Mapping[str, Any] | None = None,
    *,
    preset: str | None = None,
    strategies: list[str] | None = None,
    seeds: list[int] | None = None,
    settings: Mapping[str, Any] | None = None,
    grid: Mapping[str, list[Any]] | None = None,
    out: str | Path | None = None,
) -> Sweep:
    """Combine a sweep file's entries with flags (which win) into a :class:`Sweep`."""
    file = dict(file or {})
    preset_name = preset or file.get("preset")
    base: dict[str, Any] = {}
    preset_strategies: list[str] = []
    if preset_name:
        loaded = load_preset(str(preset_name))
        base, preset_strategies = dict(loaded.config), list(loaded.strategies)
    config = base | dict(file.get("config", {})) | dict(settings or {})
    swept = dict(file.get("grid", {})) | {k: list(v) for k, v in (grid or {}).items()}
    chosen = list(strategies or file.get("strategies") or preset_strategies)
    if not chosen:
        raise ConfigError(
            "no strategies to sweep: give --strategies, `strategies` in the sweep file, "
            "or a --preset that lists them"
        )
    for key in ("strategy", "seed", "output-dir", "resume"):
        if key in swept:
            what = {"strategy": "strategies", "seed": "seeds"}.get(key)
            raise ConfigError(
                f"{key!r} cannot be a grid key" + (f"; list them in {what}" if what else "")
            )
    for key in ("strategy", "output-dir", "resume"):
        config.pop(key, None)
    seed_list = list(seeds or file.get("seeds") or [int(config.pop("seed", 0))])
    config.pop("seed", None)
    if len(set(seed_list)) != len(seed_list):
        raise ConfigError(f"seeds repeat: {seed_list}")
    if len(set(chosen)) != len(chosen):
        raise ConfigError(f"strategies repeat: {chosen}")
    for key, values in swept.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid key {key!r} needs a non-empty list of values, got {values!r}")
        # two values that name one run directory (1 and "1", or a value given twice) would
        # make the second run find the first one's results
        labels = [_format(value) for value in values]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise ConfigError(f"grid key {key!r} repeats value(s) {repeated}: {values}")
    # A preset's or file's [config] may hold other methods' tables; a swept key or a flag
    # naming a method that is not swept is a mistake.
    for key in list(swept) + list(settings or {}):
        method = key.split(".", 1)[0] if "." in key else None
        if method and method not in chosen:
            raise ConfigError(f"{key} is given but {method} is not among the strategies {chosen}")
    target = out or file.get("out")
    if not target:
        raise ConfigError("the sweep needs an output directory: --out DIR or `out` in the file")
    return Sweep(strategies=chosen, seeds=seed_list, out=Path(target), config=config, grid=swept)


def _format(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, bool) else str(value)
    return text.replace("/", "_").replace(" ", "_")


def _label(pairs: Iterable[tuple[str, Any]]) -> str:
    return ",".join(f"{key}={_format(value)}" for key, value in pairs)


def _combinations(grid: Mapping[str, list[Any]]) -> list[tuple[tuple[str, Any], ...]]:
    keys = sorted(grid)
    return [
        tuple(zip(keys, values, strict=True))
        for values in itertools.product(*(grid[k] for k in keys))
    ]


def _comparable_config(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings that make a run what it is: the common keys (but where it is written
    and whether it resumed) and its own method's parameters, defaults filled in."""
    cfg = validate_run(run_config)
    common = {
        k: v for k, v in cfg.to_run_config().items() if "." not in k and k not in NOT_SETTINGS
    }
    params = cfg.params(run_declarations()[cfg.strategy]).model_dump(by_alias=True)
    return common | {f"{cfg.strategy}.{k}": v for k, v in params.items()}


def _status(directory: Path, run_config: Mapping[str, Any]) -> Status:
    """What a planned run needs: nothing, a resume, or a start; refuse another run's folder."""
    config_path = directory / "config.json"
    if not config_path.exists():
        if (directory / "rounds.jsonl").exists() or (directory / "summary.json").exists():
            raise ConfigError(f"{directory} holds results but no config.json; remove it")
        return "new"
    recorded = json.loads(config_path.read_text()).get("run_config", {})
    mine, theirs = _comparable_config(run_config), _comparable_config(recorded)
    if mine != theirs:
        changed = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        raise ConfigError(
            f"{directory} holds a run of another config (differs in "
            f"{', '.join(f'{k}: {theirs.get(k)!r} there, {mine.get(k)!r} here' for k in changed)});"
            " remove it or sweep into another --out"
        )
    summary_path = directory / "summary.json"
    if summary_path.exists() and json.loads(summary_path.read_text()).get("status") == "completed":
        return "completed"
    return "resume"


def plan_runs(sweep: Sweep) -> list[PlannedRun]:
    """Every run of ``sweep``, validated, with its directory and status.

    Raises :class:`ConfigError` naming the first run whose config is invalid, or a
    directory that holds a run of another config. The configs are validated as ``pflarena
    run`` validates one (:func:`~pflarena.cli.options.validate_run`: without torch or
    Flower).
    """
    from pflarena.core.shard_format import read_shard_set

    common_grid = {k: v for k, v in sweep.grid.items() if "." not in k}
    runs: list[PlannedRun] = []
    out = sweep.out.resolve()
    for setting in _combinations(common_grid):
        for strategy in sweep.strategies:
            own = {k: v for k, v in sweep.grid.items() if k.startswith(f"{strategy}.")}
            for variant in _combinations(own):
                short = tuple((k.split(".", 1)[1], v) for k, v in variant)
                method = ",".join([strategy, _label(short)]) if short else strategy
                for seed in sweep.seeds:
                    directory = out / (_label(setting) or "all") / method / f"seed-{seed}"
                    config = {
                        k: v
                        for k, v in sweep.config.items()
                        if "." not in k or k.startswith(f"{strategy}.")
                    }
                    config |= dict(setting) | dict(variant)
                    if config.get("shards-dir") and "num-clients" not in sweep.grid:
                        # the directory's clients, whatever the preset or config says
                        shards = read_shard_set(str(config["shards-dir"]))
                        config["num-clients"] = shards.num_clients
                    config |= {"strategy": strategy, "seed": seed, "output-dir": str(directory)}
                    try:
                        run_config = validate_run(config).to_run_config()
                    except ConfigError as exc:
                        raise ConfigError(f"run {directory.relative_to(out)}: {exc}") from None
                    runs.append(
                        PlannedRun(
                            setting=setting,
                            method=method,
                            strategy=strategy,
                            seed=seed,
                            directory=directory,
                            run_config=run_config,
                            status=_status(directory, run_config),
                        )
                    )
    return runs


def configs_to_run(runs: list[PlannedRun]) -> list[RunConfig]:
    """The configs of the runs still to do: new ones, and unfinished ones set to resume."""
    todo = []
    for run in runs:
        if run.status == "new":
            todo.append(validate_run(run.run_config))
        elif run.status == "resume":
            todo.append(validate_run(run.run_config | {"resume": True}))
    return todo


def _check_plan(plan: list[PlannedRun], out: Path) -> int:
    """``sweep --check``: each run with its status and, for those still to do, the state it
    is expected to keep on disk (``pflarena run --check``'s estimate), and their sum. The
    runs' data and resources are checked as ``sweep`` checks them before it starts
    (:func:`~pflarena.runtime.precheck.check_data_apart`, the data files not required);
    what would refuse the sweep is raised after the listing."""
    from pflarena.runtime.precheck import check_data_apart

    todo = [run for run in plan if run.status in ("new", "resume")]
    estimates: dict[Path, DiskEstimate] = {}
    refused = None
    if todo:
        try:
            checked = check_data_apart(configs_to_run(todo), files_required=False)
            estimates = {run.directory: c.disk for run, c in zip(todo, checked, strict=True)}
        except ConfigError as error:
            refused = error
    names = {run.directory: str(run.directory.relative_to(out)) for run in plan}
    width = max(map(len, names.values()), default=0)
    for run in plan:
        disk = estimates.get(run.directory)
        name = names[run.directory]
        if disk is None:
            print(f"  {run.status:9s} {name}")
        else:
            about = human_bytes(disk.needed)
            print(f"  {run.status:9s} {name:{width}s}  state on disk up to about {about}")
    if refused is not None:
        raise refused
    if estimates:
        total = sum(e.needed for e in estimates.values())
        print(
            f"state on disk, up to about {human_bytes(total)} for the {len(estimates)} "
            "run(s) to do (summed: a sweep's runs keep their state when they end)"
        )
    return 0


def write_leaderboard(runs: list[PlannedRun], out: Path) -> tuple[str, list[Path]]:
    """Write ``leaderboard.md``, ``.csv`` and ``.png`` into ``out``; return the Markdown."""
    rows = leaderboard(runs)
    markdown = leaderboard_markdown(rows, title=f"Leaderboard of {out.name}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "leaderboard.md").write_text(markdown)
    written = [out / "leaderboard.md", leaderboard_csv(rows, out / "leaderboard.csv")]
    if any(r["completed"] for r in rows):
        title = sweep_title(runs, out.name)
        written.append(leaderboard_plot(rows, out / "leaderboard.png", title))
    return markdown, written


#: Run-config keys a sweep sets itself (--strategies, --seeds, --out), never a run flag.
SWEEP_OWN_KEYS = ("strategy", "seed", "output-dir")


def command(args: argparse.Namespace) -> int:
    """``pflarena sweep``: plan the runs, run those not completed on one start-up, write the
    leaderboard; 1 when a run did not complete, else 3 (``EXIT_CLIENTS_FAILED``) when a
    run lost clients (each named on stderr and in the leaderboard)."""
    grid: dict[str, list[Any]] = {}
    for item in args.grid or []:
        key, sep, values = item.partition("=")
        if not sep or not values.strip():
            raise ConfigError(f"--grid expects key=value,value,..., got {item!r}")
        grid[key.strip()] = [parse_value(v.strip()) for v in values.split(",") if v.strip()]
    run_keys = [
        n.replace("_", "-")
        for n in RunConfig.model_fields
        if n.replace("_", "-") not in ("resume", *SWEEP_OWN_KEYS)
    ]
    given = collect_overrides(args, run_keys + args.method_keys)
    settings = {k: parse_value(v) for k, v in given.items()}
    plan_of = build_sweep(
        load_sweep_file(Path(args.file)) if args.file else None,
        preset=args.preset,
        strategies=[s.strip() for s in args.strategies.split(",")] if args.strategies else None,
        seeds=[int(s) for s in args.seeds.split(",")] if args.seeds else None,
        settings=settings,
        grid=grid,
        out=args.out,
    )
    plan = plan_runs(plan_of)
    counts = Counter(run.status for run in plan)
    print(
        f"sweep {plan_of.out}: {len(plan)} runs, {counts['completed']} completed, "
        f"{counts['resume']} to resume, {counts['new']} to start"
    )
    if args.check:
        return _check_plan(plan, plan_of.out.resolve())
    todo = configs_to_run(plan)
    group = None
    if todo and todo[0].tracker:
        from pflarena.server.trackers import SweepGroup

        todo = [with_tracking(cfg) for cfg in todo]
        group = SweepGroup.open(todo[0], plan_of.out.resolve(), len(plan))
        todo = [group.member(cfg) for cfg in todo]
    if todo:
        from pflarena.runtime.precheck import check_data_apart

        for cfg in todo:
            check_flower_keys(cfg)
        check_data_apart(todo)  # before any start-up: settings the data cannot satisfy
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
                workers=args.workers,
                clients_per_gpu=args.clients_per_gpu,
            )
        except KeyboardInterrupt:
            print(
                "\npflarena sweep: interrupted; the same command continues it (completed runs "
                "are kept, the interrupted one resumes from its checkpoint)",
                file=sys.stderr,
            )
            return 130
    plan = plan_runs(plan_of)
    markdown, written = write_leaderboard(plan, plan_of.out.resolve())
    print()
    print(markdown, end="")
    print(f"\nleaderboard: {', '.join(str(path) for path in written)}")
    unfinished = [run for run in plan if run.status != "completed"]
    if group is not None:
        group.finish(written, complete=not unfinished)
    lost = runs_with_failed_clients(plan)
    if lost:
        print(
            f"pflarena sweep: {len(lost)} run(s) completed, but some of their clients failed "
            "(their summary.json's client_failures says which, where and why):\n  "
            + "\n  ".join(f"{run.directory}: {text}" for run, text in lost),
            file=sys.stderr,
        )
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
    return EXIT_CLIENTS_FAILED if lost else 0


def runs_with_failed_clients(plan: list[PlannedRun]) -> list[tuple[PlannedRun, str]]:
    """The completed runs some of whose clients failed, each with the line that says so."""
    found = []
    for run in plan:
        if run.status != "completed":
            continue
        summary = json.loads((run.directory / "summary.json").read_text())
        if text := failure_text(recorded_failures(run.directory, summary)):
            found.append((run, text))
    return found


def add_parser(sub: Any, full_help: bool = False) -> None:
    """``pflarena sweep``."""
    sweep = sub.add_parser(
        "sweep",
        help="run a grid of runs (strategies x seeds x config values) on one start-up, "
        "skipping completed runs; write a leaderboard",
        description="Run every combination of strategies, seeds and swept run-config values "
        "in one simulation process, skip runs that already completed (a run that was "
        "interrupted is resumed), and write leaderboard.{md,csv,png} into the output "
        "directory. The grid comes from a TOML file (see pflarena/cli/sweep.py), flags, "
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
    add_runtime_flags(
        sweep,
        check_help="print the runs and what each needs; run nothing",
        quiet_help="one line per run as it ends, then the leaderboard",
    )
    # The run flags a sweep passes on to every run (strategy, seed and output-dir are the
    # sweep's own: --strategies, --seeds, --out).
    add_config_flags(sweep, full_help=full_help, skip=SWEEP_OWN_KEYS)
    # the methods as the catalog lists them: their flags without importing the strategies
    from pflarena.cli.methods import listed_declarations

    sweep.set_defaults(
        func=command,
        method_keys=add_method_flags(sweep, listed_declarations(), full_help=full_help),
    )
