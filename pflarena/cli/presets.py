"""``pflarena presets``: list the experiment presets (:mod:`pflarena.core.presets`), or show one."""

from __future__ import annotations

import argparse
from typing import Any

from pflarena.core.presets import load_preset, preset_names

__all__ = ["add_parser", "command"]


def command(args: argparse.Namespace) -> int:

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


def add_parser(sub: Any, full_help: bool = False) -> None:
    """``pflarena presets``."""
    presets = sub.add_parser("presets", help="list the experiment presets, or show one")
    presets.add_argument("name", nargs="?", help="a preset name")
    presets.set_defaults(func=command)
