"""A slow client costs only itself: one that runs past the round timeout is recorded as not
having replied, and the others, on either engine, as successes; the run completes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import config, grid_for, run_local

from pflarena.server.results import read_rounds

PLUGIN = "slow_client_methods"
TESTS = Path(__file__).parent


def _assert_only_the_slow_client_failed(rounds: list[dict], num_rounds: int) -> None:
    assert [r["round"] for r in rounds] == list(range(num_rounds + 1))
    for record in rounds[1:]:
        train = record["train"]
        assert (train["clients"], train["failures"]) == (3, 1), train
        assert train["problems"] == [
            {"client": 0, "exchange": "train", "problem": "no reply within the round timeout"}
        ]
        # the honest clients are evaluated (client 0 too where its node is free again)
        assert {"1", "2", "3"} <= set(record["evaluation"]["per_client"])


def test_in_process_a_client_past_the_round_timeout_costs_only_itself(tmp_path, monkeypatch):
    """Before, the in-process engine waited for every client however long it took: the slow
    client was recorded as a success, and each round took its whole sleep."""
    monkeypatch.setenv("PFLARENA_PLUGINS", PLUGIN)
    monkeypatch.setenv("PFLARENA_TEST_SLEEP_S", "20")
    cfg = config(
        strategy="slow-fedavg", num_clients=4, num_rounds=2, fraction_train=1.0, round_timeout=4
    )
    grid = grid_for(cfg)
    start = time.monotonic()
    outcome = run_local(cfg, tmp_path, grid)
    took = time.monotonic() - start
    _assert_only_the_slow_client_failed(outcome.rounds, 2)
    assert took < 2 * 20  # each round waited the timeout, not the sleep


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["ray", "inprocess"])
def test_on_ray_a_client_past_the_round_timeout_does_not_make_others_time_out(tmp_path, engine):
    """Two actors, four clients; client 0 sleeps 300 s a round with round-timeout=120 (more
    than round 0 takes on a loaded machine, where the actors load the ClientApp). Before,
    its actor stayed busy after the timeout, the next round's slow message took the other
    actor too, and the three honest clients timed out behind them: the run failed. The same
    holds for the in-process engine's worker processes (the default engine)."""
    env = {
        **__import__("os").environ,
        "PFLARENA_PLUGINS": PLUGIN,
        "PFLARENA_TEST_SLEEP_S": "300",
        "PYTHONPATH": f"{TESTS}:{Path(__file__).parents[1]}",
    }
    out = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pflarena.cli",
            "run",
            "--strategy",
            "slow-fedavg",
            "--num-clients",
            "4",
            "--num-rounds",
            "2",
            "--fraction-train",
            "1",
            "--round-timeout",
            "120",
            "--output-dir",
            str(out),
            "--quiet",
            "--engine",
            engine,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
        cwd=tmp_path,
    )
    # Completed, with a client that failed: exit code 3, and the summary names it.
    assert result.returncode == 3, result.stderr[-3000:] + result.stdout[-3000:]
    _assert_only_the_slow_client_failed(read_rounds(out / "rounds.jsonl"), 2)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["client_failures"]["text"] == "1 of 4 clients failed in rounds 1-2", summary
