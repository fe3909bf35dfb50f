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
from pflarena.strategies.base import ClientSizes, PflStrategy, StrategySetup

__all__ = ["build_strategy", "declaration_of", "known_client_sizes", "parse_config"]


def parse_config(run_config: Mapping[str, Any]) -> RunConfig:
    """:func:`~pflarena.core.config.parse_run_config` against every declared method."""
    return parse_run_config(run_config, declarations())


def declaration_of(cfg: RunConfig) -> MethodDeclaration:
    return declarations()[cfg.strategy]


def _trainable_names(cfg: RunConfig) -> tuple[str, ...]:
    info = cfg.data_info()
    model = build_model(cfg.model_name(), info.input_shape, info.num_classes)
    return tuple(trainable_names(model))


def known_client_sizes(cfg: RunConfig, data_from_spec: bool = True) -> ClientSizes | None:
    """What the server knows of each client's data: the shard manifest's counts with
    ``shards-dir``; otherwise, where the clients build their data from the run config
    (``data_from_spec``: a simulation, not a deployment whose nodes hold files of their
    own), the counts of that federation; ``None`` where it cannot know."""
    from pflarena.core.federation import DatasetError, client_sizes
    from pflarena.core.shard_format import read_shard_set

    if cfg.shards_dir:
        shard_set = read_shard_set(cfg.shards_dir)
        return ClientSizes(shard_set.num_train, shard_set.num_val, shard_set.num_test)
    if not data_from_spec:
        return None
    try:
        train, val, test = client_sizes(cfg.federation_spec())
    except (DatasetError, OSError):  # the data is not on the server's machine
        return None
    return ClientSizes(tuple(train), tuple(val), tuple(test))


def build_strategy(
    cfg: RunConfig,
    server_data: Any = None,
    state_dir: Path | None = None,
    data_from_spec: bool = True,
) -> PflStrategy:
    """The strategy ``cfg`` names, built with its method's parameters.

    ``state_dir`` is where its per-client pools go (the ServerApp passes
    ``<output-dir>/server-state``); None keeps them in memory. The strategy checks the
    counts clients report against :func:`known_client_sizes` (``data_from_spec``: whether
    the clients build their data from the run config, as in a simulation).
    """
    cls = strategy_classes()[cfg.strategy]
    setup = StrategySetup(
        cfg=cfg,
        params=cfg.params(cls.declaration),
        trainable=_trainable_names(cfg),
        server_data=server_data,
        state_dir=state_dir,
    )
    strategy = cls.from_setup(setup)
    strategy.client_sizes = known_client_sizes(cfg, data_from_spec)
    return strategy
