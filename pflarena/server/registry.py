"""The declared methods on the server: validate a run config against them, build a strategy."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pflarena.core.config import RunConfig, parse_run_config
from pflarena.core.methods import MethodDeclaration
from pflarena.core.models import build_model
from pflarena.core.training import trainable_names
from pflarena.strategies import declarations, strategy_classes
from pflarena.strategies.base import PflStrategy, StrategySetup

__all__ = ["build_strategy", "declaration_of", "parse_config"]


def parse_config(run_config: Mapping[str, Any]) -> RunConfig:
    """:func:`~pflarena.core.config.parse_run_config` against every declared method."""
    return parse_run_config(run_config, declarations())


def declaration_of(cfg: RunConfig) -> MethodDeclaration:
    return declarations()[cfg.strategy]


def _trainable_names(cfg: RunConfig) -> tuple[str, ...]:
    info = cfg.data_info()
    model = build_model(cfg.model_name(), info.input_shape, info.num_classes)
    return tuple(trainable_names(model))


def build_strategy(
    cfg: RunConfig, server_data: Any = None, state_dir: Path | None = None
) -> PflStrategy:
    """The strategy ``cfg`` names, built with its method's parameters.

    ``state_dir`` is where its per-client pools go (the ServerApp passes
    ``<output-dir>/server-state``); None keeps them in memory.
    """
    cls = strategy_classes()[cfg.strategy]
    setup = StrategySetup(
        cfg=cfg,
        params=cfg.params(cls.declaration),
        trainable=_trainable_names(cfg),
        server_data=server_data,
        state_dir=state_dir,
    )
    return cls.from_setup(setup)
