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
import contextlib
import difflib
import importlib
import os
import signal
import sys
import threading
import time
from typing import Any

from pflarena import __version__
from pflarena.cli.options import HELP_ALL
from pflarena.core.config import ConfigError
from pflarena.core.phases import process_start

__all__ = ["COMMANDS", "PflArgumentParser", "build_parser", "main"]

#: Each subcommand: its module in :mod:`pflarena.cli`, the function adding its parser, and
#: the line ``pflarena --help`` shows (``tests/test_cli.py`` keeps these equal to the
#: modules' own). Only the module of the command given is imported: ``pflarena --help``
#: imports neither torch nor Flower.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("run", "add_parser", "run one strategy as a Flower simulation"),
    "sweep": (
        "sweep",
        "add_parser",
        "run a grid of runs (strategies x seeds x config values) on one start-up, skipping "
        "completed runs; write a leaderboard",
    ),
    "compare": ("compare", "add_parser", "a Markdown table and a plot of several runs"),
    "methods": ("methods", "add_parser", "list the methods, or one method's parameters"),
    "presets": ("presets", "add_parser", "list the experiment presets, or show one"),
    "data": (
        "data",
        "add_parser",
        "list the data sets, show where to get one, fetch one (data fetch NAME --data-dir DIR), "
        "or check a local copy",
    ),
    "shards": (
        "data",
        "add_shards_parser",
        "write one data file per client (deployments, --shards-dir), or import a partition "
        "made by another toolkit",
    ),
    "local-deploy": (
        "deploy",
        "add_parsers",
        "start a SuperLink and N SuperNodes (one shard each) on 127.0.0.1",
    ),
    "certs": (
        "deploy",
        "add_parsers",
        "make a CA, server certificates (openssl) and SuperNode keys for a TLS deployment",
    ),
    "connect": (
        "deploy",
        "add_parsers",
        "write a flwr CLI connection, with the operator's token for a secure SuperLink",
    ),
    "approve": (
        "deploy",
        "add_parsers",
        "sign an app directory for SuperNodes that run approved apps only",
    ),
    "compose": (
        "deploy",
        "add_parsers",
        "write docker-compose.yml (N SuperNodes) and its TLS, GPU and edge files",
    ),
    "bundle": (
        "deploy",
        "add_parsers",
        "make what another host of a federation needs: the SuperLink's, a SuperNode's, the "
        "operator's",
    ),
    "images": (
        "deploy",
        "add_parsers",
        "build the container images (superlink, supernode, edge, app)",
    ),
    "executor": (
        "deploy",
        "add_parsers",
        "a warm ClientApp executor: flower-superexec's flags, one forked child per message",
    ),
    "supernode": (
        "deploy",
        "add_parsers",
        "flower-supernode kept alive (a 500 retried; exits when it cannot serve), with --idle-poll S "
        "and --app-signing-public-key (approved apps only)",
    ),
    "superlink": (
        "deploy",
        "add_parsers",
        "flower-superlink whose Control API answers only the operator's token",
    ),
}


class PflArgumentParser(argparse.ArgumentParser):
    """argparse without abbreviations (``--num-round`` is not ``--num-rounds``), whose
    errors suggest the closest flag or command (``did you mean``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def option_names(self) -> list[str]:
        return [name for action in self._actions for name in action.option_strings]

    def error(self, message: str) -> Any:
        if message.startswith("unrecognized arguments:"):
            hints = []
            for word in message.split(":", 1)[1].split():
                if word.startswith("--"):
                    flag = word.split("=", 1)[0]
                    # What an abbreviation abbreviates first (`--out` is `--output-dir`, not
                    # the spelling closest to it), then the closest spelling.
                    names = self.option_names()
                    close = [n for n in names if n.startswith(flag)][:3] or (
                        difflib.get_close_matches(flag, names, n=1)
                    )
                    if close:
                        hints.append(f"{flag}: did you mean {' or '.join(close)}?")
            if hints:
                message += " (" + "; ".join(hints) + ")"
        elif "invalid choice:" in message:
            choice = message.split("invalid choice:", 1)[1].split("(", 1)[0].strip(" '")
            choices = [
                c for a in self._actions if a.choices for c in a.choices if isinstance(c, str)
            ]
            close = difflib.get_close_matches(choice, choices, n=1)
            if close:
                message += f" (did you mean {close[0]!r}?)"
            # one line: it names the values allowed (the usage would only repeat them)
            self.exit(2, f"{self.prog}: error: {message}\n")
        super().error(message)


class _Only:
    """A subparsers action that really adds only the parser named ``wanted``; the others a
    module adds go to a parser that is thrown away (their stubs are already there)."""

    def __init__(self, sub: Any, wanted: str) -> None:
        self.sub, self.wanted = sub, wanted
        self.added: argparse.ArgumentParser | None = None

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if name == self.wanted:
            self.added = self.sub.add_parser(name, **kwargs)
            return self.added
        kwargs.pop("help", None)
        kwargs.pop("aliases", None)
        return PflArgumentParser(prog=name, **kwargs)


def build_parser(full_help: bool = False, command: str | None = None) -> argparse.ArgumentParser:
    """The ``pflarena`` parser; ``full_help`` lists every run-config and method flag in
    ``run --help`` and ``sweep --help`` (``--help-all``), else the common ones only.

    With ``command`` only that subcommand's module is imported and its parser built (the
    others are listed by name and help line); without, every one is built."""
    parser = PflArgumentParser(prog="pflarena", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"pflarena {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    built: set[str] = set()
    for name, (module_name, adder, help_line) in COMMANDS.items():
        if command is not None and name != command:
            sub.add_parser(name, help=help_line)
            continue
        if (module_name, adder) in built:
            continue
        built.add((module_name, adder))
        module = importlib.import_module(f"pflarena.cli.{module_name}")
        target = sub if command is None else _Only(sub, command)
        if module_name in ("run", "sweep"):
            getattr(module, adder)(target, full_help)
        else:
            getattr(module, adder)(target)
    parser.subparsers = sub  # type: ignore[attr-defined]
    return parser


def _unrecorded_output(interrupt: BaseException) -> list[str] | None:
    """The simulation's last lines where an interrupted run did not record its end
    (:func:`pflarena.runtime.launch.unrecorded_output`; None where no run was started)."""
    launch = sys.modules.get("pflarena.runtime.launch")
    return launch.unrecorded_output(interrupt) if launch is not None else None


def _command_of(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (its first word that is not a flag), if known."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
        if word in ("-h", "--help", "--version"):
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    """The ``pflarena`` command: ``argv`` (else the process's own command line) run, its
    exit code returned. A ``run`` that is its process's command line ends the process
    itself once its output is flushed, as the simulation process does: the interpreter's
    teardown of what it imported (matplotlib for the plots: a fifth of a second) is
    skipped."""
    own = argv is None
    code = _main(argv)
    if own and _command_of(sys.argv[1:]) == "run":
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    return code


def _main(argv: list[str] | None) -> int:
    # When the command started: its process's start when it is the process's own command
    # line (the console script, `python -m pflarena.cli`), else now (a call from Python).
    started_at = process_start() if argv is None else time.time()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["run"], ["sweep"]) and HELP_ALL in argv:
        build_parser(full_help=True, command=argv[0]).parse_args([argv[0], "--help"])
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
    early = None
    if argv[:1] == ["run"]:
        # The first line at once, before the imports the whole parser needs (seconds).
        from pflarena.cli.run import early_plan

        early = early_plan(argv[1:])
        if early is not None:
            print(f"pflarena run: {early.describe()}", file=sys.stderr, flush=True)
    parser = build_parser(command=_command_of(argv) or "")
    args, extras = parser.parse_known_args(argv)
    if extras:
        # said by the subcommand's parser: its usage, its flags to suggest from
        subparser = parser.subparsers.choices.get(args.command, parser)  # type: ignore[attr-defined]
        subparser.error(f"unrecognized arguments: {' '.join(extras)}")
    args.early_plan = early
    args.started_at = started_at
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
    except KeyboardInterrupt as interrupt:
        # Everything started was stopped on the way out (run_simulations); one line, and
        # where the run did not record how it ended, the simulation's last lines.
        run_dir = getattr(args, "run_dir", None)
        hint = f"; `pflarena run --resume {run_dir}` continues it" if run_dir else ""
        how = "terminated" if terminated else "interrupted"
        print(f"\npflarena {args.command}: {how}{hint}", file=sys.stderr)
        if run_dir and (lines := _unrecorded_output(interrupt)) is not None:
            print(
                f"pflarena {args.command}: the run recorded no summary of its end in "
                f"{run_dir}; the simulation's last lines:\n" + "".join(lines).rstrip(),
                file=sys.stderr,
            )
        return 128 + signal.SIGTERM if terminated else 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
