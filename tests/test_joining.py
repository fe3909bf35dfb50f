"""Clients that connect after the run started (``min-available-clients``): the run starts
with the clients connected, and a client that connects later takes part from the round after."""

from __future__ import annotations

import pytest
from helpers import config, grid_for
from pydantic import ValidationError

from pflarena.core.config import RunConfig
from pflarena.server.app import initial_arrays
from pflarena.server.build import build_strategy
from pflarena.server.loop import run_rounds, summary_record
from pflarena.server.results import ResultsWriter


def test_a_client_that_connects_mid_run_takes_part_from_the_next_round(tmp_path) -> None:
    cfg = config(num_clients=3, num_rounds=3, fraction_train=1.0, min_available_clients=2)
    grid = grid_for(cfg)
    late = sorted(grid.node_ids)[2]
    grid.offline.add(late)  # not connected when the run starts

    def on_round(record: dict) -> None:
        if record["round"] == 1:
            grid.offline.discard(late)  # connects during round 2's configuration

    writer = ResultsWriter(tmp_path / "run")
    try:
        outcome = run_rounds(
            grid, cfg, build_strategy(cfg), initial_arrays(cfg), writer, on_round=on_round
        )
    finally:
        writer.close()
    rounds = outcome.rounds
    assert sorted(rounds[0]["evaluation"]["per_client"]) == ["0", "1"]
    assert rounds[1]["train"]["sampled"] == [0, 1]
    assert [r["train"]["sampled"] for r in rounds[2:]] == [[0, 1, 2], [0, 1, 2]]
    assert all(r["train"]["failures"] == 0 for r in rounds[1:])
    assert sorted(rounds[-1]["evaluation"]["per_client"]) == ["0", "1", "2"]
    summary = summary_record(cfg, rounds, status="completed", wall_time_s=1.0)
    assert summary["clients_never_connected"] == []


def test_a_client_that_never_connects_is_named_in_the_summary(tmp_path) -> None:
    cfg = config(num_clients=3, num_rounds=1, fraction_train=1.0, min_available_clients=2)
    grid = grid_for(cfg)
    grid.offline.add(sorted(grid.node_ids)[2])
    writer = ResultsWriter(tmp_path / "run")
    try:
        outcome = run_rounds(grid, cfg, build_strategy(cfg), initial_arrays(cfg), writer)
    finally:
        writer.close()
    summary = summary_record(cfg, outcome.rounds, status="completed", wall_time_s=1.0)
    assert summary["clients_never_connected"] == [2]


def test_without_it_the_run_waits_for_every_client(tmp_path) -> None:
    cfg = config(num_clients=3, num_rounds=1, round_timeout=1.0)
    grid = grid_for(cfg)
    grid.offline.add(sorted(grid.node_ids)[2])
    writer = ResultsWriter(tmp_path / "run")
    with pytest.raises(TimeoutError, match="only 2 of num-clients=3"):
        run_rounds(grid, cfg, build_strategy(cfg), initial_arrays(cfg), writer)
    writer.close()


def test_more_than_the_federation_is_refused() -> None:
    with pytest.raises(ValidationError, match="min-available-clients=4 exceeds num-clients=3"):
        RunConfig(num_clients=3, min_available_clients=4)
