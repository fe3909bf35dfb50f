"""The ``pflarena`` command line: one module per subcommand, each with its ``add_parser``
and its command; :mod:`pflarena.cli.command` builds the parser and dispatches."""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """The ``pflarena`` command (the console script's entry point)."""
    # Imported here, not at the package's import: a subcommand module importing
    # pflarena.cli.options must not start the whole command line's imports (an import cycle).
    from pflarena.cli.command import main as command_main

    return command_main(argv)
