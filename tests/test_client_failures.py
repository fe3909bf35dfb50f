"""Nothing lost in silence: every client failure is part of a run's result.

A run whose client cannot read its shard used to say `completed` with the accuracy over the
other clients under a header counting them all, and exit 0; only the console and
`rounds.jsonl` mentioned it. Now `summary.json`'s `client_failures` names the clients, rounds,
exchanges and errors; the console, `results.md`, `compare` and the leaderboard say it; `pflarena
run` and `pflarena sweep` exit 3; a shard file that cannot be read is refused before start-up.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Error, Message, MessageType
from helpers import config, grid_for, run_local, run_resumable, stateful_grid

from pflarena.cli import main
from pflarena.cli.run import EXIT_CLIENTS_FAILED, console_table, exit_code
from pflarena.core import keys
from pflarena.core.federation import build_federation
from pflarena.core.shard_format import shard_set_problems, write_shards
from pflarena.reporting.compare import compare_table
from pflarena.reporting.leaderboard import leaderboard, leaderboard_csv, leaderboard_markdown
from pflarena.server.app import ended_summary
from pflarena.server.loop import ClientsFailed, TooManyFailures, summary_record
from pflarena.server.progress import Progress
from pflarena.server.progress_events import RunEnded, log_lines
from pflarena.server.results import (
    RunInterrupted,
    client_failures,
    failure_text,
    format_rounds,
    read_rounds,
)

SHARDS = {"dataset": "digits", "partition": "dirichlet", "alpha": 0.1, "num-clients": 4}


def _shards(tmp_path: Path) -> Path:
    """The issue's shard folder: digits, Dirichlet(0.1), four clients."""
    spec = config(**{k.replace("-", "_"): v for k, v in SHARDS.items()}).federation_spec()
    out = tmp_path / "shards"
    write_shards(build_federation(spec), out, spec)
    return out


def _poison(shard: Path) -> None:
    """A NaN in the file's training inputs: its archive and headers are sound (the pre-start
    check passes it), its client fails whenever it loads its data."""
    arrays = dict(np.load(shard))
    x = arrays["x_train"].astype(np.float32)
    x.reshape(-1)[0] = np.nan
    arrays["x_train"] = x
    np.savez(shard, **arrays)


def _truncate(shard: Path) -> None:
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


# ---------------------------------------------------------------------------- the summary
def test_rounds_are_written_as_runs_of_consecutive_rounds():
    assert format_rounds([5, 0, 1, 7, 8, 9]) == "0-1, 5, 7-9"
    assert format_rounds(range(0, 40, 2)).endswith(", ... (20 rounds in all)")


def _record(number, train=(), evaluation=(), per_client=("0", "1", "3")):
    record = {"round": number, "evaluation": {"per_client": {c: {} for c in per_client}}}
    if train:
        record["train"] = {"problems": [dict(p) for p in train]}
    if evaluation:
        record["evaluation"]["problems"] = [dict(p) for p in evaluation]
    return record


def test_the_summary_names_each_failed_client_its_rounds_exchanges_and_errors():
    broken = {"client": None, "node": 7, "problem": "error: ShardError: client_0002.npz"}
    late = {"client": 1, "exchange": "line-search", "problem": "no reply within the round timeout"}
    rounds = [
        _record(0, evaluation=[broken]),
        _record(1, train=[broken | {"exchange": "train"}], evaluation=[broken]),
        _record(2, train=[broken | {"exchange": "train"}, late], evaluation=[broken]),
    ]
    block = client_failures(rounds, num_clients=4)
    assert block["text"] == failure_text(block) == "2 of 4 clients failed in rounds 0-2"
    assert (block["clients"], block["of"], block["every_round"]) == (2, 4, False)
    assert block["by_client"] == [
        {"client": 1, "rounds": "2", "failed_rounds": 1, "exchanges": ["line-search"],
         "problem": "no reply within the round timeout"},
        {"client": None, "node": 7, "rounds": "0-2", "failed_rounds": 3,
         "exchanges": ["evaluate", "train"], "problem": "error: ShardError: client_0002.npz"},
    ]  # fmt: skip
    assert [(e["error"], e["clients"], e["rounds"]) for e in block["errors"]] == [
        ("error: ShardError: client_0002.npz", 1, "0-2"),
        ("no reply within the round timeout", 1, "2"),
    ]
    assert block["never_evaluated"] == [2]  # the node that never said it holds client 2


def test_a_client_failing_in_every_round_is_said_so_and_no_failure_is_nothing():
    broken = {"client": 2, "problem": "error: boom"}
    rounds = [_record(0, evaluation=[broken]), _record(1, evaluation=[broken])]
    assert client_failures(rounds, 4)["text"] == "1 of 4 clients failed in every round"
    clean = [_record(0), _record(1)]
    assert client_failures(clean, 4) == {"clients": 0, "of": 4}
    assert failure_text(client_failures(clean, 4)) is None


def test_many_distinct_errors_are_cut_and_counted():
    rounds = [
        _record(1, train=[{"client": c, "exchange": "train", "problem": f"e{c}"}])
        for c in range(30)
    ]
    block = client_failures(rounds, 30)
    assert len(block["errors"]) == 20 and block["other_errors"] == 10


# ------------------------------------------------------------- a run that loses a client
@pytest.fixture(scope="module")
def lossy_run(tmp_path_factory):
    """Four clients from shards, client 2's damaged so that it fails whenever it loads its
    data (every round); run through the real loop and ClientApp, in this process."""
    tmp_path = tmp_path_factory.mktemp("lossy")
    shards = _shards(tmp_path)
    _poison(shards / "client_0002.npz")
    cfg = config(num_clients=4, num_rounds=2, shards_dir=str(shards), fraction_train=1.0)
    outcome = run_local(cfg, tmp_path)
    run = tmp_path / "run-fedavg"
    summary = summary_record(cfg, outcome.rounds, status="completed", wall_time_s=1.0)
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "config.json").write_text(json.dumps({"run_config": cfg.to_run_config()}))
    return run, summary


def test_a_client_that_fails_every_round_is_in_the_summary(lossy_run):
    run, summary = lossy_run
    failures = summary["client_failures"]
    assert failures["text"] == "1 of 4 clients failed in every round"
    [client] = failures["by_client"]
    assert client["client"] is None and isinstance(client["node"], int)
    assert (client["rounds"], client["exchanges"]) == ("0-2", ["evaluate", "train"])
    assert "client_0002.npz: x_train holds NaN" in client["problem"]
    [error] = failures["errors"]
    assert (error["clients"], error["rounds"]) == (1, "0-2")
    assert failures["never_evaluated"] == [2]
    # the accuracy is over the three clients evaluated, and says so
    assert summary["personalized"]["last"]["clients"] == 3


def test_the_console_results_md_and_compare_show_a_run_that_lost_clients(lossy_run):
    run, _ = lossy_run
    table = console_table(run)
    assert "| client failures " in table and "1 of 4 clients failed in every round" in table
    assert "last round (3 of 4 clients evaluated)" in table.splitlines()[0]
    assert all(len(line) <= 100 for line in table.splitlines())
    row = compare_table([run]).splitlines()[2]
    assert "| completed, **1 of 4 clients failed in every round** |" in row
    assert "| 4 (3 evaluated) |" in row


def test_a_run_that_lost_clients_exits_3_naming_them(lossy_run, capsys):
    run, summary = lossy_run
    assert exit_code(summary, run) == EXIT_CLIENTS_FAILED == 3
    err = capsys.readouterr().err.splitlines()
    assert (
        err[0] == "pflarena run: completed, but 1 of 4 clients failed in every round (exit code 3):"
    )
    assert err[1].startswith("  1 of 4 clients (evaluate, train; rounds 0-2): error: ShardError")
    assert err[2] == "  never evaluated: clients 2"
    assert exit_code({"client_failures": {"clients": 0, "of": 4}}, run.parent) == 0


def test_the_leaderboard_names_runs_with_failed_clients_and_keeps_clean_ones_as_they_were(
    lossy_run, tmp_path
):
    run, _ = lossy_run

    class Planned:
        setting_name, method, seed, run_config = "all", "fedavg", 0, {}

        def __init__(self, directory):
            self.directory = directory

    clean = tmp_path / "clean"
    clean.mkdir()
    summary = json.loads((run / "summary.json").read_text())
    summary["client_failures"] = {"clients": 0, "of": 4}
    (clean / "summary.json").write_text(json.dumps(summary))
    before = leaderboard_markdown(leaderboard([Planned(clean)]))
    assert "failed clients" not in before
    leaderboard_csv(leaderboard([Planned(clean)]), tmp_path / "clean.csv")
    header = next(csv.reader((tmp_path / "clean.csv").open()))
    assert "runs with failed clients" not in header

    rows = leaderboard([Planned(run)])
    markdown = leaderboard_markdown(rows)
    assert "| fedavg | 1/1, 1 with failed clients |" in markdown
    assert "## Runs with failed clients" in markdown
    assert "- `all/fedavg/seed-0`: 1 of 4 clients failed in every round (error: ShardError" in (
        markdown
    )
    leaderboard_csv(rows, tmp_path / "lossy.csv")
    lines = list(csv.reader((tmp_path / "lossy.csv").open()))
    assert lines[0][-1] == "runs with failed clients" and lines[1][-1] == "1"


def test_a_summary_written_before_failures_were_recorded_gets_them_from_its_rounds(lossy_run):
    run, summary = lossy_run
    old = dict(summary)
    del old["client_failures"]
    (run / "summary.json").write_text(json.dumps(old))
    try:
        assert "**1 of 4 clients failed in every round**" in compare_table([run])
    finally:
        (run / "summary.json").write_text(json.dumps(summary))


def test_the_end_of_a_run_and_the_quiet_line_say_the_clients_lost(lossy_run):
    run, _ = lossy_run
    event = RunEnded(str(run), failures="1 of 4 clients failed in every round")
    assert log_lines(event, events=False) == [
        f"pflarena: results in {run} (completed, but 1 of 4 clients failed in every round)"
    ]
    assert RunEnded(str(run)).text() == f"pflarena: results in {run}"  # as before
    progress = Progress(1, verbosity=0, quiet=True, stream=(stream := _Stream()), tty=False)
    progress.run_name, progress.run_began = "fedavg on digits", 0.0
    assert progress._run_ended(run).endswith(f"; 1 of 4 clients failed in every round -> {run}")
    assert stream.text == ""


class _Stream:
    text = ""

    def write(self, text):
        self.text += text

    def flush(self):
        pass

    def isatty(self):
        return False


# ---------------------------------------------------------------- failures of every kind
def _error_in(grid, message_type: str, nodes: set[int], server_round: int | None = None):
    def fail(reply):
        sent = next(
            m for m in grid.sent if m.metadata.message_id == reply.metadata.reply_to_message_id
        )
        round_ = sent.content.config_records[keys.CONFIG][keys.SERVER_ROUND]
        if (
            sent.metadata.message_type == message_type
            and sent.metadata.dst_node_id in nodes
            and (server_round is None or round_ == server_round)
        ):
            return Message(Error(code=0, reason="the actor died"), reply_to=sent)
        return reply

    return fail


def test_a_node_that_never_replies_is_recorded_with_why(tmp_path):
    cfg = config(num_clients=4, num_rounds=1, fraction_train=1.0)
    grid = grid_for(cfg)
    grid.offline.add(grid.node_ids[3])  # connected, but it never answers (a hung node)
    grid.get_node_ids = lambda: list(grid.node_ids)
    outcome = run_local(cfg, tmp_path, grid)
    problems = outcome.rounds[1]["evaluation"]["problems"]
    assert problems == [
        {"client": None, "node": grid.node_ids[3], "problem": "no reply within the round timeout"}
    ]
    block = client_failures(outcome.rounds, 4)
    assert block["text"] == "1 of 4 clients failed in every round"


def test_an_error_reply_the_superlink_makes_is_its_nodes_failure(tmp_path):
    """A deployment's SuperLink answers for a node that went away with an error reply of its
    own (its source: the SuperLink): each is that node's client's failure, found through the
    message it answers, not one failure of "node 0"."""
    cfg = config(num_clients=4, num_rounds=1, fraction_train=1.0)
    grid = grid_for(cfg)
    gone = set(grid.node_ids[:2])
    node_failed = _error_in(grid, MessageType.EVALUATE, gone, 1)

    def from_the_superlink(reply):
        reply = node_failed(reply)
        if reply.has_error():
            reply.metadata.__dict__["_src_node_id"] = 0
        return reply

    grid.reply_filter = from_the_superlink
    outcome = run_local(cfg, tmp_path, grid)
    clients = [p["client"] for p in outcome.rounds[1]["evaluation"]["problems"]]
    assert sorted(clients) == [0, 1]
    assert client_failures(outcome.rounds, 4)["text"] == "2 of 4 clients failed in round 1"


def test_an_evaluation_no_client_passes_is_recorded_and_a_stopping_round_counted(tmp_path):
    lenient = config(num_clients=3, num_rounds=2, fraction_train=1.0, max_failure_fraction=1.0)
    grid = stateful_grid(lenient, tmp_path / "state", 1_000_003)
    grid.reply_filter = _error_in(grid, MessageType.EVALUATE, set(grid.node_ids), 2)
    outcome, _ = run_resumable(lenient, tmp_path / "lenient", grid)
    last = outcome.rounds[-1]
    assert last["evaluation"] is None
    assert last["evaluation_failures"]["failures"] == 3
    block = client_failures(outcome.rounds, 3)
    assert block["text"] == "3 of 3 clients failed in round 2"

    # a round that stops the run is not in rounds.jsonl, but its failures are in the summary
    strict = config(num_clients=4, num_rounds=3, fraction_train=1.0)
    grid = stateful_grid(strict, tmp_path / "state-strict", 1_000_003)
    grid.reply_filter = _error_in(grid, MessageType.TRAIN, set(grid.node_ids[:3]), 2)
    with pytest.raises(TooManyFailures) as stopped:
        run_resumable(strict, tmp_path / "strict", grid)
    rounds = read_rounds(tmp_path / "strict" / "rounds.jsonl")
    summary = ended_summary(strict, rounds, stopped.value)
    assert summary["status"] == "failed" and summary["rounds_completed"] == 1
    assert summary["client_failures"]["clients"] == 3
    assert summary["client_failures"]["rounds"] == "2"

    # an exchange every client failed stops the run at once: each of them is counted too
    grid = stateful_grid(strict, tmp_path / "state-all", 1_000_003)
    grid.reply_filter = _error_in(grid, MessageType.TRAIN, set(grid.node_ids), 2)
    with pytest.raises(ClientsFailed) as stopped:
        run_resumable(strict, tmp_path / "all", grid)
    rounds = read_rounds(tmp_path / "all" / "rounds.jsonl")
    summary = ended_summary(strict, rounds, stopped.value)
    assert "ClientsFailed: every client failed in train: 4 of 4 clients" in summary["error"]
    assert summary["client_failures"]["text"] == "4 of 4 clients failed in round 2"


def test_a_methods_own_exchange_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PFLARENA_PLUGINS", "pflarena_test_methods")
    cfg = config(
        strategy="line-search", num_clients=4, num_rounds=2, fraction_train=1.0, local_epochs=2
    )
    grid = grid_for(cfg)
    grid.reply_filter = _error_in(grid, MessageType.TRAIN, {grid.node_ids[1]}, 2)
    outcome = run_local(cfg, tmp_path, grid)
    names = [e["name"] for e in outcome.rounds[2]["exchanges"]]
    [client] = client_failures(outcome.rounds, 4)["by_client"]
    # the method's own exchange, by the name the round's line gives it
    assert client["client"] == 1 and client["exchanges"] == names[:1] == ["gradients"]


# ---------------------------------------------------------------------------- interrupts
def test_an_interrupt_is_recorded_with_its_signal_and_an_error_as_a_failure():
    cfg = config(num_clients=4, num_rounds=3)
    rounds = [_record(0, per_client=("0", "1", "2", "3"))]
    for signum, name in ((2, "SIGINT"), (15, "SIGTERM")):
        summary = ended_summary(cfg, rounds, RunInterrupted(signum))
        assert (summary["status"], summary["signal"]) == ("interrupted", name)
        assert "error" not in summary
    # raised as a class into another thread: the signal travels with the class
    assert ended_summary(cfg, rounds, RunInterrupted.for_signal(2)())["signal"] == "SIGINT"
    plain = ended_summary(cfg, rounds, KeyboardInterrupt())
    assert (plain["status"], plain["signal"]) == ("interrupted", None)
    crash = ended_summary(cfg, rounds, ValueError("boom"))
    assert (crash["status"], crash["error"]) == ("failed", "ValueError: boom")
    assert "signal" not in crash
    event = RunEnded("/runs/x", failed=True, interrupted="SIGINT")
    assert event.text().startswith("pflarena: run interrupted by SIGINT; partial results in")


def test_a_thread_waiting_for_replies_gets_the_interrupt(tmp_path):
    import threading
    import time

    from pflarena.runtime.simulation import interrupt_thread

    caught: list[BaseException] = []

    def wait():
        try:
            while True:
                time.sleep(0.05)
        except KeyboardInterrupt as exc:
            caught.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    assert interrupt_thread(thread, RunInterrupted(15))
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert [type(e).__mro__[1] for e in caught] == [RunInterrupted]
    assert caught[0].signal_name == "SIGTERM"
    assert not interrupt_thread(thread, RunInterrupted(15))  # gone: nothing to interrupt


# -------------------------------------------------------------- shards caught at start-up
def test_every_shard_file_is_checked_before_start_up(tmp_path, capsys):
    shards = _shards(tmp_path)
    assert shard_set_problems(shards) == []
    _truncate(shards / "client_0002.npz")
    [(client, problem)] = shard_set_problems(shards)
    assert client == 2 and "client_0002.npz is unreadable, corrupt or truncated" in problem
    run = ["run", "--strategy", "fedavg", "--shards-dir", str(shards), "--num-rounds", "1"]
    for extra in (["--check"], ["--output-dir", str(tmp_path / "run")]):
        assert main([*run, *extra]) == 2
        [line] = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
        assert line.startswith(f"pflarena run: error: shards-dir {shards}: 1 of 4 shard files")
        assert "client 2: shard file" in line and "BadZipFile" in line
    assert not (tmp_path / "run").exists()  # nothing started


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("swap", "holds client 3, but the manifest names it for client 2"),
        ("rows", "holds 5 train samples; the manifest says"),
        ("empty", "is unreadable, corrupt or truncated"),
        ("missing", "lacks array(s): y_test"),
    ],
)
def test_a_shard_that_is_not_the_manifests_is_named(tmp_path, damage, said):
    shards = _shards(tmp_path)
    target = shards / "client_0002.npz"
    if damage == "swap":
        target.write_bytes((shards / "client_0003.npz").read_bytes())
    elif damage == "empty":
        target.write_bytes(b"")
    else:
        arrays = dict(np.load(target))
        if damage == "rows":
            arrays["x_train"], arrays["y_train"] = arrays["x_train"][:5], arrays["y_train"][:5]
        else:
            del arrays["y_test"]
        np.savez(target, **arrays)
    [(client, problem)] = shard_set_problems(shards)
    assert client == 2 and said in problem, problem


# ------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_the_issues_run_and_a_sweep_say_which_client_they_lost(tmp_path):
    """The issue's first bullet, end to end: `pflarena run` on a shard folder whose client 2
    fails in every round (a truncated file is now refused before start-up, so its data is
    damaged where only loading it shows), and a sweep over it."""
    shards = _shards(tmp_path)
    _poison(shards / "client_0002.npz")
    cli = [sys.executable, "-m", "pflarena.cli"]
    common = ["--strategy", "fedavg", "--shards-dir", str(shards), "--num-rounds", "1",
              "--engine", "inprocess", "--workers", "1"]  # fmt: skip
    run = subprocess.run([*cli, "run", *common, "--output-dir", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    assert run.returncode == 3, run.stderr
    assert "| client failures " in run.stdout and "(3 of 4 clients evaluated)" in run.stdout
    closing = run.stderr.strip().splitlines()[-4:]
    assert closing[0] == (
        "pflarena run: completed, but 1 of 4 clients failed in every round (exit code 3):"
    )
    assert "client_0002.npz: x_train holds NaN or infinite values" in closing[1]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["client_failures"]["text"] == "1 of 4 clients failed in every round"
    results = (tmp_path / "run" / "results.md").read_text()
    assert "completed, **1 of 4 clients failed in every round**" in results

    sweep = subprocess.run(
        [*cli, "sweep", "--strategies", "fedavg", "--set", f"shards-dir={shards}",
         "--set", "num-rounds=1", "--engine", "inprocess", "--workers", "1",
         "--out", str(tmp_path / "sweep"), "--quiet"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert sweep.returncode == 3, sweep.stderr
    assert "1 run(s) completed, but some of their clients failed" in sweep.stderr
    assert "1 of 4 clients failed in every round" in sweep.stderr
    board = (tmp_path / "sweep" / "leaderboard.md").read_text()
    assert "## Runs with failed clients" in board and "`all/fedavg/seed-0`" in board
