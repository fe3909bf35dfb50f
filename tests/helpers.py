"""Builders shared by the tests: a config, a strategy, a LocalGrid over the real ClientApp."""

from __future__ import annotations

from local_grid import LocalGrid

from pflarena.client.app import app as client_app
from pflarena.client.state import ClientState, MemoryVersions
from pflarena.core.config import RunConfig
from pflarena.server.app import initial_arrays
from pflarena.server.loop import RunOutcome, run_rounds
from pflarena.server.registry import build_strategy, parse_config
from pflarena.server.results import ResultsWriter


def config(**overrides) -> RunConfig:
    base = {
        "dataset": "digits",
        "num-clients": 5,
        "num-rounds": 3,
        "alpha": 0.5,
        "local-epochs": 1,
        "lr": 0.1,
    }
    base.update({k.replace("_", "-"): v for k, v in overrides.items()})
    return parse_config(base)


def grid_for(cfg: RunConfig, **kwargs) -> LocalGrid:
    return LocalGrid(client_app, cfg.to_run_config(), cfg.num_clients, **kwargs)


def run_local(cfg: RunConfig, tmp_path, grid: LocalGrid | None = None, strategy=None) -> RunOutcome:
    grid = grid or grid_for(cfg)
    strategy = strategy or build_strategy(cfg)
    writer = ResultsWriter(tmp_path / f"run-{cfg.strategy}")
    try:
        return run_rounds(grid, cfg, strategy, initial_arrays(cfg), writer)
    finally:
        writer.close()


def stored(context, key: str, accepted: int | None = None):
    """A client's stored state entry (its newest version, or the ``accepted`` one)."""
    state = ClientState(MemoryVersions(context.state), accepted, None, prune=False)
    return state.get(key)
