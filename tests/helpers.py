"""Builders shared by the tests: a config, a strategy, a LocalGrid over the real ClientApp."""

from __future__ import annotations

from pathlib import Path

from flwr.app import MessageType
from local_grid import LocalGrid

from pflarena.client.app import app as client_app
from pflarena.client.state import ClientState, MemoryVersions
from pflarena.core import keys
from pflarena.core.config import RunConfig
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy, parse_config
from pflarena.server.checkpoint import load_checkpoint
from pflarena.server.loop import RunOutcome, run_rounds
from pflarena.server.results import ResultsWriter, comparable_rounds
from pflarena.strategies.base import PflStrategy

#: Wall-clock fields: the only ones two runs of one config may differ in.


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
    # Nodes given their own data files (deployment-like) hold data the run config does not
    # describe: the server then knows no client sizes, as in a deployment.
    own_files = any("data-path" in c.node_config for c in grid.contexts.values())
    strategy = strategy or build_strategy(cfg, data_from_spec=not own_files)
    writer = ResultsWriter(tmp_path / f"run-{cfg.strategy}")
    try:
        return run_rounds(grid, cfg, strategy, initial_arrays(cfg), writer)
    finally:
        writer.close()


def stored(context, key: str, accepted: int | None = None):
    """A client's stored state entry (its newest version, or the ``accepted`` one)."""
    state = ClientState(MemoryVersions(context.state), accepted, None, prune=False)
    return state.get(key)


def comparable(rounds: list[dict]) -> list[dict]:
    """The rounds without wall-clock times (the only fields two identical runs may differ in)."""
    return comparable_rounds(rounds)


def stateful_grid(cfg: RunConfig, state_dir: Path, node_id_base: int) -> LocalGrid:
    """A LocalGrid whose clients keep their state on disk under ``state_dir``; new node ids
    (another ``node_id_base``) over the same directory are a restarted simulation."""
    nodes = [
        {"partition-id": i, "num-partitions": cfg.num_clients, "state-dir": str(state_dir)}
        for i in range(cfg.num_clients)
    ]
    return LocalGrid(
        client_app,
        cfg.to_run_config(),
        cfg.num_clients,
        node_configs=nodes,
        node_id_base=node_id_base,
    )


def run_resumable(
    cfg: RunConfig, out: Path, grid: LocalGrid, resume: bool = False, state_key: str = "run"
) -> tuple[RunOutcome, PflStrategy]:
    """Run ``cfg`` into ``out`` as the ServerApp does (checkpoints, server pools on disk, the
    clients' state under ``state_key``), or continue it from its checkpoint with ``resume``."""
    checkpoint = load_checkpoint(out, cfg.strategy) if resume else None
    writer = ResultsWriter(
        out, resume_after=checkpoint.server_round if checkpoint else None, checkpoint=checkpoint
    )
    if not resume:
        writer.write_config({"run_config": cfg.to_run_config()})
    try:
        strategy = build_strategy(cfg, state_dir=out / "server-state")
        outcome = run_rounds(
            grid,
            cfg,
            strategy,
            initial_arrays(cfg),
            writer,
            resume=checkpoint,
            state_key=state_key,
        )
        return outcome, strategy
    finally:
        writer.close()


def die_in_round(grid: LocalGrid, server_round: int, phase: str | None = None) -> None:
    """Have ``grid`` interrupt its run (``KeyboardInterrupt``, as a Ctrl-C) at the reply to
    the first train message of ``server_round`` (of its ``phase``, where given): after that
    client trained and stored its new state, before the round's checkpoint."""

    def die(reply):
        sent = grid.sent[-1]
        config = sent.content[keys.CONFIG]
        if (
            sent.metadata.message_type == MessageType.TRAIN
            and config[keys.SERVER_ROUND] == server_round
            and (phase is None or config.get(keys.PHASE) == phase)
        ):
            raise KeyboardInterrupt(f"killed in round {server_round}")
        return reply

    grid.reply_filter = die
