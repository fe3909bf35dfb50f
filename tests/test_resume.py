"""Checkpoint and resume: a run that dies mid-way continues to the same results."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flwr.app import Error, Message, MessageType
from helpers import comparable, config, die_in_round, run_resumable, stateful_grid
from local_grid import LocalGrid
from processes import kill_tree

from pflarena.core import keys
from pflarena.server.checkpoint import load_checkpoint
from pflarena.server.loop import TooManyFailures
from pflarena.server.results import read_rounds, summarize_rounds


@pytest.mark.parametrize(
    "strategy",
    [
        "ditto",
        "pfedgt",
        "line-search",
        "pfedme",
        "perfedavg",
        "apfl",
        "fedamp",
        "fedala",
        "pfedhn",
        # split models: personal heads (fedper, fedrep) and local layers (lgfedavg) in the
        # client state; fedbabu's server model is part body, part fixed head
        "fedper",
        "fedrep",
        "lgfedavg",
        "fedbabu",
        # fedrod's personal head and splitgp's client side in the client state, splitgp's
        # average auxiliary classifier in the checkpoint; fedrecon keeps nothing
        "fedrod",
        "fedrecon",
        "splitgp",
    ],
)
def test_a_run_killed_mid_round_resumes_to_the_uninterrupted_results(
    strategy, tmp_path, monkeypatch
):
    """ditto, pfedgt, pfedme, apfl, fedala keep client state; line-search a server-side pool
    of gradients, fedamp one of client models; pfedhn its hypernetwork and momentum in the
    checkpoint."""
    monkeypatch.setenv("PFLARENA_PLUGINS", "pflarena_test_methods")
    cfg = config(strategy=strategy, num_clients=5, num_rounds=6, fraction_train=0.4, local_epochs=2)
    whole, _ = run_resumable(
        cfg, tmp_path / "whole", stateful_grid(cfg, tmp_path / "state-whole", 1_000_003)
    )

    # The second run dies in round 4, after some clients trained and stored new state.
    grid = stateful_grid(cfg, tmp_path / "state-broken", 2_000_003)

    def die_in_round_four(reply):
        sent = grid.sent[-1]
        config = sent.content[keys.CONFIG]
        if (
            sent.metadata.message_type == MessageType.TRAIN
            and config[keys.SERVER_ROUND] == 4
            and config.get(keys.PHASE) != "gradients"  # line-search: after its pool was written
        ):
            raise KeyboardInterrupt("killed in round 4")
        return reply

    grid.reply_filter = die_in_round_four
    with pytest.raises(KeyboardInterrupt):
        run_resumable(cfg, tmp_path / "broken", grid)
    assert [r["round"] for r in read_rounds(tmp_path / "broken" / "rounds.jsonl")] == [0, 1, 2, 3]
    # ...and continues on new nodes (new node ids, as in a restarted simulation) that find
    # their clients' state in the same state-dir
    resumed, _ = run_resumable(
        cfg, tmp_path / "broken", stateful_grid(cfg, tmp_path / "state-broken", 3_000_017), True
    )
    assert comparable(resumed.rounds) == comparable(whole.rounds)
    assert comparable(read_rounds(tmp_path / "broken" / "rounds.jsonl")) == comparable(whole.rounds)


@pytest.mark.parametrize("strategy", ["ditto", "pfedgt"])
def test_a_run_resumes_from_a_checkpoint_four_rounds_back(strategy, tmp_path):
    """checkpoint-every = 4: every client trains in rounds 5 to 7 after the checkpoint of round
    4, and the run dies in round 8. The clients still hold the version that checkpoint
    accepted (keeping the last three before the accepted one did not), and the resumed run
    is the uninterrupted one. Each client ends holding two versions: round 8's, which the
    last evaluation's message names as checkpointed, and round 9's."""
    cfg = config(strategy=strategy, num_clients=3, num_rounds=9, fraction_train=1.0)
    cfg = cfg.model_copy(update={"checkpoint_every": 4})
    whole, _ = run_resumable(
        cfg, tmp_path / "whole", stateful_grid(cfg, tmp_path / "state-whole", 1_000_003)
    )
    clients = sorted((tmp_path / "state-whole" / "run").glob("client-*"))
    assert len(clients) == 3
    assert all(sorted(v.name for v in client.glob("v*")) == ["v801", "v901"] for client in clients)

    grid = stateful_grid(cfg, tmp_path / "state-broken", 2_000_003)
    die_in_round(grid, 8)
    with pytest.raises(KeyboardInterrupt):
        run_resumable(cfg, tmp_path / "broken", grid)
    assert load_checkpoint(tmp_path / "broken", strategy).server_round == 4
    resumed, _ = run_resumable(
        cfg, tmp_path / "broken", stateful_grid(cfg, tmp_path / "state-broken", 3_000_017), True
    )
    assert comparable(resumed.rounds) == comparable(whole.rounds)
    assert not any(r.get("train", {}).get("state_problems") for r in resumed.rounds)


def _lose_state(state_dir: Path, client: int, how: str) -> None:
    """Delete a client's stored versions, or replace each stored entry with garbage."""
    for version in (state_dir / "run" / f"client-{client}").glob("v*"):
        for file in version.iterdir():
            if how == "delete":
                file.unlink()
            else:
                file.write_bytes(b"not a numpy file")
        if how == "delete":
            version.rmdir()


def test_a_client_whose_state_is_lost_is_reported_and_its_replies_not_used(tmp_path):
    """Catches a server that ignores the clients' state-missing flag (a lost personal model
    silently restarted, a garbled one failing as an anonymous error) and a run that then
    ends `completed` without a word about it."""
    cfg = config(strategy="ditto", num_clients=5, num_rounds=2, fraction_train=1.0)
    state = tmp_path / "state"
    run_resumable(cfg, tmp_path / "run", stateful_grid(cfg, state, 1_000_003))
    _lose_state(state, 1, "delete")
    _lose_state(state, 3, "garble")
    cfg4 = cfg.model_copy(update={"num_rounds": 4})  # the same run, two more rounds
    outcome, _ = run_resumable(
        cfg4, tmp_path / "run", stateful_grid(cfg4, state, 2_000_003), resume=True
    )
    for record in outcome.rounds[3:]:
        lost = {
            (e["client"], e["problem"].split(":")[0]) for e in record["train"]["state_problems"]
        }
        assert lost == {(1, "client state missing"), (3, "client state unreadable")}
        assert record["train"]["clients"] == 3 and record["train"]["failures"] == 2
        assert {e["client"] for e in record["evaluation"]["state_problems"]} == {1, 3}
        assert set(record["evaluation"]["per_client"]) == {"0", "2", "4"}
    summary = summarize_rounds(outcome.rounds)
    assert [(e["client"], e["first_round"], e["rounds"]) for e in summary["state_problems"]] == [
        (1, 3, 2),
        (3, 3, 2),
    ]


def test_a_run_most_of_whose_clients_lost_their_state_stops_naming_them(tmp_path):
    cfg = config(strategy="ditto", num_clients=3, num_rounds=2, fraction_train=1.0)
    state = tmp_path / "state"
    run_resumable(cfg, tmp_path / "run", stateful_grid(cfg, state, 1_000_003))
    for client in (0, 2):
        _lose_state(state, client, "delete")
    cfg4 = cfg.model_copy(update={"num_rounds": 4})
    with pytest.raises(TooManyFailures, match=r"client state missing or unreadable: clients 0, 2"):
        run_resumable(cfg4, tmp_path / "run", stateful_grid(cfg4, state, 1_000_003), resume=True)


def test_a_run_extended_with_more_rounds_equals_one_started_with_them(tmp_path):
    """Ditto keeps a personal model per client: the extension must find it (the state key
    may not depend on num-rounds) and continue to the rounds of an uninterrupted run."""
    cfg = config(strategy="ditto", num_clients=3, num_rounds=2, fraction_train=1.0)
    cfg4 = cfg.model_copy(update={"num_rounds": 4})
    whole, _ = run_resumable(
        cfg4, tmp_path / "whole", stateful_grid(cfg4, tmp_path / "state-whole", 1_000_003)
    )
    run_resumable(cfg, tmp_path / "run", stateful_grid(cfg, tmp_path / "state", 1_000_003))
    extended, _ = run_resumable(
        cfg4, tmp_path / "run", stateful_grid(cfg4, tmp_path / "state", 2_000_003), resume=True
    )
    assert comparable(extended.rounds) == comparable(whole.rounds)


def test_resume_refuses_a_directory_without_a_run(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pflarena.cli", "run", "--resume", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "no run to resume" in result.stderr


def _last_round(out: Path) -> int:
    path = out / "rounds.jsonl"
    return max((r["round"] for r in read_rounds(path)), default=-1) if path.exists() else -1


@pytest.mark.slow
def test_flower_simulation_killed_after_round_3_resumes_identically(tmp_path):
    """SIGKILL the whole simulation (SuperLink, ServerApp, Ray) once round 3 is recorded.

    pFedGT keeps state on both sides (the server's messages c and c_i, each client's w_i);
    each method's own state is checked against a kill in the in-process test above, which
    runs every stateful method, pFedGT and Ditto among them."""
    common = [
        "--strategy", "pfedgt", "--num-clients", "4", "--num-rounds", "6",
        "--fraction-train", "0.5", "--quiet",
    ]  # fmt: skip
    cli = [sys.executable, "-m", "pflarena.cli", "run"]

    def pflarena_run(*args):
        return subprocess.run(
            [*cli, *args], capture_output=True, text=True, timeout=600, cwd=tmp_path
        )

    # The uninterrupted reference runs in-process: the same rounds as on Ray
    # (test_startup.py), without a second Ray start.
    whole = pflarena_run(*common, "--engine", "inprocess", "--output-dir", str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr

    out = tmp_path / "run"
    victim = subprocess.Popen(
        [*cli, *common, "--output-dir", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    deadline = time.monotonic() + 600
    while _last_round(out) < 3:
        assert victim.poll() is None and time.monotonic() < deadline, "the run ended early"
        time.sleep(0.2)
    kill_tree(victim.pid)  # all of it, no chance to clean up
    victim.wait(timeout=30)
    killed_at = _last_round(out)
    assert 3 <= killed_at < 6 and not (out / "summary.json").exists()

    resumed = pflarena_run("--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr
    assert comparable(read_rounds(out / "rounds.jsonl")) == comparable(
        read_rounds(tmp_path / "whole" / "rounds.jsonl")
    )
    resumes = json.loads((out / "config.json").read_text())["resumes"]
    assert len(resumes) == 1 and 2 <= resumes[0]["after_round"] <= killed_at
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


def _crash(grid: LocalGrid, server_round: int, victims: int, message_type: str):
    """A reply filter: the first ``victims`` nodes answer ``message_type`` messages of
    ``server_round`` with an error, as Flower does for a crashed simulation actor."""

    def crash(reply):
        sent = grid.sent[-1]
        config_ = sent.content[keys.CONFIG]
        if (
            sent.metadata.message_type == message_type
            and config_[keys.SERVER_ROUND] == server_round
            and grid.node_ids.index(sent.metadata.dst_node_id) < victims
        ):
            return Message(Error(code=0, reason="the actor died"), reply_to=sent)
        return reply

    return crash


def test_a_round_most_clients_fail_stops_before_its_checkpoint_and_resumes(tmp_path):
    """Catches a run that goes on aggregating the few clients left (silently another
    experiment), and a stop that leaves the failed round in the checkpoint."""
    cfg = config(strategy="ditto", num_clients=4, num_rounds=4, fraction_train=1.0)
    whole, _ = run_resumable(
        cfg, tmp_path / "whole", stateful_grid(cfg, tmp_path / "state-whole", 1_000_003)
    )
    grid = stateful_grid(cfg, tmp_path / "state", 2_000_003)
    grid.reply_filter = _crash(grid, 3, victims=3, message_type=MessageType.TRAIN)
    match = r"round 3: 3 of 4 clients failed in training .*first problem: error: the actor died"
    with pytest.raises(TooManyFailures, match=match):
        run_resumable(cfg, tmp_path / "run", grid)
    assert [r["round"] for r in read_rounds(tmp_path / "run" / "rounds.jsonl")] == [0, 1, 2]
    assert load_checkpoint(tmp_path / "run", "ditto").server_round == 2
    # a fresh set of actors repeats round 3 and ends where the unbroken run did
    resumed, _ = run_resumable(
        cfg, tmp_path / "run", stateful_grid(cfg, tmp_path / "state", 3_000_017), resume=True
    )
    assert comparable(resumed.rounds) == comparable(whole.rounds)


def test_failures_up_to_the_fraction_are_tolerated_and_one_allows_any(tmp_path):
    cfg = config(strategy="fedavg", num_clients=4, num_rounds=3, fraction_train=1.0)
    grid = stateful_grid(cfg, tmp_path / "state", 1_000_003)
    grid.reply_filter = _crash(grid, 2, victims=2, message_type=MessageType.TRAIN)
    outcome, _ = run_resumable(cfg, tmp_path / "half", grid)  # 2 of 4: not more than half
    assert [r["train"]["failures"] for r in outcome.rounds[1:]] == [0, 2, 0]

    lenient = cfg.model_copy(update={"max_failure_fraction": 1.0})
    grid = stateful_grid(lenient, tmp_path / "state-all", 1_000_003)
    grid.reply_filter = _crash(grid, 2, victims=4, message_type=MessageType.TRAIN)
    outcome, _ = run_resumable(lenient, tmp_path / "all", grid)
    assert [r["train"]["failures"] for r in outcome.rounds[1:]] == [0, 4, 0]


def test_an_evaluation_most_clients_fail_stops_the_run(tmp_path):
    cfg = config(strategy="fedavg", num_clients=4, num_rounds=3, fraction_train=1.0)
    grid = stateful_grid(cfg, tmp_path / "state", 1_000_003)
    grid.reply_filter = _crash(grid, 2, victims=3, message_type=MessageType.EVALUATE)
    with pytest.raises(TooManyFailures, match="round 2: 3 of 4 clients failed in the evaluation"):
        run_resumable(cfg, tmp_path / "run", grid)
    assert load_checkpoint(tmp_path / "run", "fedavg").server_round == 1
