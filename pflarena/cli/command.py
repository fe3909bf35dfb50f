"""The ``pflarena`` command: ``run`` a simulation, ``sweep`` a grid of runs, ``compare`` runs,
write or import ``shards``, list ``methods``, ``presets`` and ``data`` sets (and check a
local copy of one), and start deployments (``local-deploy``, ``certs``, ``compose``,
``images``).

One module of :mod:`pflarena.cli` per subcommand, each with ``add_parser`` and its command;
runs are started by :mod:`pflarena.runtime.launch`. ``pflarena executor`` and ``pflarena
supernode`` pass their flags to Flower's own parsers untouched
(:mod:`pflarena.deploy.executor`, :mod:`pflarena.deploy.supernode`).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from pflarena.cli import compare, data, deploy, methods, presets, run, sweep
from pflarena.cli.options import HELP_ALL
from pflarena.core.config import ConfigError

__all__ = ["build_parser", "main"]


def build_parser(full_help: bool = False) -> argparse.ArgumentParser:
    """The ``pflarena`` parser; ``full_help`` lists every run-config and method flag in
    ``run --help`` and ``sweep --help`` (``--help-all``), else the common ones only."""
    parser = argparse.ArgumentParser(prog="pflarena", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run.add_parser(sub, full_help)
    sweep.add_parser(sub, full_help)
    compare.add_parser(sub)
    methods.add_parser(sub)
    presets.add_parser(sub)
    data.add_parser(sub)
    data.add_shards_parser(sub)
    deploy.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["run"], ["sweep"]) and HELP_ALL in argv:
        build_parser(full_help=True).parse_args([argv[0], "--help"])  # prints, exits 0
    # Flower's SuperExec and SuperNode flags pass through untouched (argparse would claim them).
    if argv[:1] == ["executor"]:
        from pflarena.deploy.executor import main as executor_main

        executor_main(argv[1:])
        return 0
    if argv[:1] == ["supernode"]:
        from pflarena.deploy.supernode import main as supernode_main

        supernode_main(argv[1:])
        return 0
    if argv[:1] == ["superlink"]:
        from pflarena.deploy.superlink import main as superlink_main

        superlink_main(argv[1:])
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
