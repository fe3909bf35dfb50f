"""Experiment presets: a paper's setting in one TOML file, usable as ``--preset NAME``.

A preset file (``pflarena/presets/<name>.toml``) has a ``description``, a ``source`` (where
the setting comes from), the ``strategies`` the experiment compares, and a ``[config]``
table of run-config keys, with method parameters in sub-tables (``[config.ditto]``), as in
``[tool.flwr.app.config]``. Applied to a run of one strategy, only that method's sub-table
is used; anything given on the command line overrides the preset.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from pflarena.core.config import ConfigError

__all__ = ["PRESETS_DIR", "Preset", "flatten_table", "load_preset", "preset_names"]

PRESETS_DIR = Path(__file__).resolve().parents[1] / "presets"


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    source: str
    strategies: tuple[str, ...]
    config: dict[str, Any]
    """Flat run-config keys, method parameters as ``<method>.<param>``."""

    def overrides(self, strategy: str | None = None) -> dict[str, Any]:
        """The preset's keys for a run of ``strategy`` (other methods' tables left out)."""
        chosen = strategy or self.config.get("strategy")
        return {
            key: value
            for key, value in self.config.items()
            if "." not in key or key.split(".", 1)[0] == chosen
        }


def preset_names() -> list[str]:
    return sorted(path.stem for path in PRESETS_DIR.glob("*.toml"))


def flatten_table(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested TOML tables as flat ``a.b`` keys, the way Flower flattens its run config."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat |= flatten_table(value, f"{prefix}{key}.")
        else:
            flat[prefix + key] = value
    return flat


def load_preset(name: str) -> Preset:
    """The preset ``name``; raise :class:`ConfigError` naming the problem."""
    path = PRESETS_DIR / f"{name}.toml"
    if not path.is_file():
        from pflarena.core.suggest import did_you_mean

        raise ConfigError(
            f"unknown preset {name!r}{did_you_mean(name, preset_names())}; available: "
            f"{', '.join(preset_names())}"
        )
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"preset {path} is not valid TOML: {exc}") from None
    unknown = set(data) - {"description", "source", "strategies", "config"}
    if unknown or not isinstance(data.get("config"), dict):
        raise ConfigError(
            f"preset {path}: expected description, source, strategies and a [config] table"
            + (f"; unknown entries {sorted(unknown)}" if unknown else "")
        )
    return Preset(
        name=name,
        description=str(data.get("description", "")),
        source=str(data.get("source", "")),
        strategies=tuple(data.get("strategies", ())),
        config=flatten_table(data["config"]),
    )
