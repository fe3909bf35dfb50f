"""``pflarena run``: one strategy as a Flower simulation, its results printed; ``--resume``
continues a run, ``--check`` validates its config and runs nothing."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pflarena.cli.options import (
    HELP_ALL,
    RUN_EPILOG,
    add_config_flags,
    add_method_flags,
    add_runtime_flags,
    collect_overrides,
    default_output_dir,
    run_overrides,
    with_tracking,
)
from pflarena.core.config import ConfigError, RunConfig, toml_value
from pflarena.core.datasets import check_files
from pflarena.runtime.launch import resume_config, simulate
from pflarena.server.compare import compare_table
from pflarena.server.progress import Progress

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
    from pflarena.server.registry import parse_config
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


def command(args: argparse.Namespace) -> int:
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
            cfg = cfg.model_copy(update={"output_dir": default_output_dir(cfg.to_run_config())})
        try:
            output_dir = Path(cfg.output_dir).resolve()
        except OSError as error:
            raise ConfigError(f"output-dir {cfg.output_dir!r} cannot be used: {error}") from None
        check_output_dir(output_dir)
    if args.check:
        print("".join(f"{k} = {toml_value(v)}\n" for k, v in cfg.to_run_config().items()), end="")
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


def add_parser(sub: Any, full_help: bool = False) -> None:
    """``pflarena run``."""
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
    add_config_flags(run, full_help=full_help)
    from pflarena.strategies import declarations

    run.set_defaults(method_keys=add_method_flags(run, declarations(), full_help=full_help))
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
