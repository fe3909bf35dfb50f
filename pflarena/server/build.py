"""The declared methods on the server: validate a run config against them, build a strategy."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pflarena.core.config import ConfigError, RunConfig, parse_run_config
from pflarena.core.footprint import Federation, footprint_problem
from pflarena.core.methods import MethodDeclaration
from pflarena.core.models import build_model
from pflarena.core.training import trainable_names
from pflarena.strategies import declarations, strategy_classes
from pflarena.strategies.base import ClientSizes, PflStrategy, StrategySetup, sample_size

__all__ = [
    "build_strategy",
    "check_footprint",
    "declaration_of",
    "federation_of",
    "known_client_sizes",
    "parse_config",
]


def parse_config(run_config: Mapping[str, Any]) -> RunConfig:
    """:func:`~pflarena.core.config.parse_run_config` against every declared method."""
    return parse_run_config(run_config, declarations())


def declaration_of(cfg: RunConfig) -> MethodDeclaration:
    return declarations()[cfg.strategy]


def _trainable_names(cfg: RunConfig) -> tuple[str, ...]:
    info = cfg.data_info()
    model = build_model(cfg.model_name(), info.input_shape, info.num_classes)
    return tuple(trainable_names(model))


def federation_of(cfg: RunConfig) -> Federation:
    """The numbers ``cfg``'s server memory depends on (:mod:`pflarena.core.footprint`):
    the clients, how many a round samples (as the strategy will), the rounds and the size
    of the model the run builds."""
    info = cfg.data_info()
    state = build_model(cfg.model_name(), info.input_shape, info.num_classes).state_dict()
    strategy = strategy_classes()[cfg.strategy]
    fraction = cfg.fraction_train or strategy.declaration.default_fraction_train
    n = cfg.num_clients
    return Federation(
        num_clients=n,
        sampled=sample_size(n, fraction, cfg.min_train_clients),
        num_rounds=cfg.num_rounds,
        model_bytes=sum(t.numel() * t.element_size() for t in state.values()),
        model_params=sum(t.numel() for t in state.values()),
    )


def check_footprint(cfg: RunConfig, limit: int | None = None) -> None:
    """Raise :class:`ConfigError` (one line, with the numbers) when ``cfg``'s method would
    hold more in the server's memory than this machine gives the run
    (:func:`~pflarena.core.footprint.footprint_problem`; ``limit``: the machine's memory
    in bytes, default :func:`~pflarena.core.footprint.memory_limit`)."""
    cls = strategy_classes()[cfg.strategy]
    federation = federation_of(cfg)
    terms = cls.server_footprint(cfg.params(cls.declaration), federation)
    problem = footprint_problem(cfg.strategy, federation, terms, limit)
    if problem:
        raise ConfigError(problem)


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
