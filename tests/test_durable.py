"""Durable runs: damaged result files and checkpoints are repaired or refused with a message,
one process at a time in a run directory, and `--resume` does only what it says."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import comparable, config, run_resumable, stateful_grid

from pflarena.cli import main
from pflarena.cli import run as run_command
from pflarena.server.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointError,
    _digest,
    load_checkpoint,
)
from pflarena.server.results import ResultsWriter, RoundsFileError, read_rounds
from pflarena.server.runlock import RunDirectoryInUse, lock_run_dir


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A 3-round FedAvg run with checkpoints, as the ServerApp leaves it."""
    root = tmp_path_factory.mktemp("durable")
    cfg = config(strategy="fedavg", num_clients=3, num_rounds=3, fraction_train=1.0)
    run_resumable(cfg, root / "run", stateful_grid(cfg, root / "state", 1_000_003))
    return root / "run"


def _copy(run: Path, dest: Path) -> Path:
    dest.mkdir()
    for path in run.iterdir():
        if path.is_file():
            (dest / path.name).write_bytes(path.read_bytes())
    return dest


def _rewrite_checkpoint(path: Path, change, *, checksum: bool) -> None:
    """Edit a checkpoint's header; with ``checksum`` write a checksum that matches the edit
    (a consistent but wrong file), else keep the old one."""
    with np.load(path) as data:
        contents = {name: data[name] for name in data.files}
    header = json.loads(bytes(contents["header"]).decode())
    change(header)
    contents["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    if checksum:
        del contents["checksum"]
        contents["checksum"] = np.frombuffer(_digest(contents).encode(), dtype=np.uint8)
    with open(path, "wb") as handle:
        np.savez(handle, **contents)


def _resume_writer(run: Path) -> ResultsWriter:
    checkpoint = load_checkpoint(run, "fedavg")
    return ResultsWriter(run, resume_after=checkpoint.server_round, checkpoint=checkpoint)


def test_a_torn_last_line_is_dropped_and_said_so(finished_run, tmp_path):
    """A crash while round 4's line was written, after round 3's checkpoint."""
    run = _copy(finished_run, tmp_path / "run")
    rounds = run / "rounds.jsonl"
    whole = rounds.read_text()
    rounds.write_text(whole + whole.splitlines()[-1][:40].replace('"round": 3', '"round": 4'))
    writer = _resume_writer(run)
    writer.close()
    assert writer.repaired and "cut short" in writer.repaired
    assert rounds.read_text() == whole


def test_a_damaged_line_before_the_last_is_refused(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path / "run")
    lines = (run / "rounds.jsonl").read_text().splitlines(keepends=True)
    lines[1] = '{"round": 1, "trai\n'
    (run / "rounds.jsonl").write_text("".join(lines))
    before = (run / "rounds.jsonl").read_bytes()
    with pytest.raises(RoundsFileError, match=r"rounds.jsonl line 2 is not a round record"):
        _resume_writer(run)
    assert (run / "rounds.jsonl").read_bytes() == before  # nothing changed


def test_a_checkpoint_past_the_recorded_rounds_is_refused(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path / "run")
    _rewrite_checkpoint(
        run / CHECKPOINT_NAME, lambda h: h.update(round=999), checksum=True
    )  # a consistent file whose round is not this run's
    with pytest.raises(CheckpointError, match=r"after round 999, but .* records rounds 0 to 3"):
        _resume_writer(run)


def test_an_edited_checkpoint_fails_its_checksum(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path / "run")
    _rewrite_checkpoint(run / CHECKPOINT_NAME, lambda h: h.update(round=999), checksum=False)
    with pytest.raises(CheckpointError, match=r"checkpoint .*checkpoint.npz does not match"):
        load_checkpoint(run, "fedavg")


def test_a_truncated_checkpoint_names_its_path(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path / "run")
    path = run / CHECKPOINT_NAME
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=rf"checkpoint {path} is unreadable"):
        load_checkpoint(run, "fedavg")


def test_rounds_edited_after_the_checkpoint_are_refused(finished_run, tmp_path):
    run = _copy(finished_run, tmp_path / "run")
    rounds = read_rounds(run / "rounds.jsonl")
    rounds[1]["bytes_up"] += 1
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    with pytest.raises(CheckpointError, match=r"is not what it was when checkpoint"):
        _resume_writer(run)


def test_a_second_process_is_kept_out_of_a_run_directory(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from pflarena.server.runlock import lock_run_dir; "
            "lock = lock_run_dir(Path(sys.argv[1])); print('locked', flush=True); "
            "time.sleep(60)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirectoryInUse, match=rf"in use by process {holder.pid}"):
            lock_run_dir(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    while True:  # the kernel drops the lock with its holder
        try:
            lock_run_dir(tmp_path).close()
            break
        except RunDirectoryInUse:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def _completed(run: Path, tmp_path: Path) -> Path:
    run = _copy(run, tmp_path / "run")
    summary = {"strategy": "fedavg", "status": "completed", "wall_time_s": 12.5}
    summary |= {"dataset": "digits", "num_clients": 3, "num_rounds": 3, "seed": 0}
    (run / "summary.json").write_text(json.dumps(summary))
    return run


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--lr", "0.5"], "--lr"),
        (["--strategy", "ditto", "--set", "seed=3"], "--seed, --strategy"),
        (["--preset", "pfedgt-digits"], "--preset"),
    ],
)
def test_resume_refuses_the_flags_it_would_ignore(finished_run, tmp_path, capsys, flags, named):
    run = _copy(finished_run, tmp_path / "run")
    code = main(["run", "--resume", str(run), *flags])
    error = capsys.readouterr().err
    assert code == 2 and f"it would ignore {named}." in error


def test_resuming_a_completed_run_starts_nothing_and_rewrites_nothing(
    finished_run, tmp_path, capsys, monkeypatch
):
    run = _completed(finished_run, tmp_path)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    monkeypatch.setattr(run_command, "simulate", lambda *a, **k: pytest.fail("a run was started"))
    assert main(["run", "--resume", str(run)]) == 0
    # said on stderr, with the progress; the run's table on stdout
    captured = capsys.readouterr()
    assert "is complete (3 rounds); nothing to resume" in captured.err
    assert "completed, 3/3 rounds" in captured.out
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    # fewer rounds than recorded cannot be had
    assert main(["run", "--resume", str(run), "--num-rounds", "2"]) == 2
    assert "would shorten the run" in capsys.readouterr().err


def test_resume_with_more_rounds_asks_for_them(finished_run, tmp_path, monkeypatch):
    run = _completed(finished_run, tmp_path)
    started = []
    monkeypatch.setattr(
        run_command, "simulate", lambda cfg, **k: started.append(cfg) or {"wall_time_s": 0.0}
    )
    monkeypatch.setattr(run_command, "compare_table", lambda dirs: "")
    monkeypatch.setattr("pflarena.runtime.precheck.check_data", lambda cfg, **k: None)
    main(["run", "--resume", str(run), "--num-rounds", "5"])
    assert [(c.num_rounds, c.resume, c.output_dir) for c in started] == [
        (5, True, str(run.resolve()))
    ]


@pytest.mark.slow
def test_a_moved_run_resumes_with_its_clients_state(tmp_path):
    """The ServerApp's own path, in process: a Ditto run moved to another directory, then
    extended by a round, finds every client's personal model (its state key is in
    config.json, not derived from the output directory) and ends as a run of 3 rounds."""
    common = ["--strategy", "ditto", "--num-clients", "3", "--fraction-train", "1",
              "--engine", "inprocess", "--quiet"]  # fmt: skip

    def pflarena_run(*args: str) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "pflarena.cli", "run", *args],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr

    pflarena_run(*common, "--num-rounds", "3", "--output-dir", str(tmp_path / "whole"))
    pflarena_run(*common, "--num-rounds", "2", "--output-dir", str(tmp_path / "first"))
    moved = (tmp_path / "first").rename(tmp_path / "moved")
    pflarena_run("--resume", str(moved), "--num-rounds", "3", "--engine", "inprocess", "--quiet")
    rounds = read_rounds(moved / "rounds.jsonl")
    assert not any(r["train"].get("state_problems") for r in rounds[1:])
    assert comparable(rounds) == comparable(read_rounds(tmp_path / "whole" / "rounds.jsonl"))
    summary = json.loads((moved / "summary.json").read_text())
    assert summary["status"] == "completed" and "state_problems" not in summary
    resumes = json.loads((moved / "config.json").read_text())["resumes"]
    assert resumes[0]["num_rounds"] == {"from": 2, "to": 3}


def test_a_failed_resume_reports_its_own_error(finished_run, tmp_path):
    """Before, a resume that failed on a damaged checkpoint left the previous attempt's
    summary.json in place, and `pflarena run` reported that attempt's error."""
    run = _copy(finished_run, tmp_path / "run")
    summary = {"strategy": "fedavg", "status": "failed", "error": "the previous error"}
    (run / "summary.json").write_text(json.dumps(summary))
    path = run / CHECKPOINT_NAME
    path.write_bytes(path.read_bytes()[:100])
    result = subprocess.run(
        [sys.executable, "-m", "pflarena.cli", "run", "--resume", str(run)]
        + ["--engine", "inprocess", "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert f"checkpoint {path} is unreadable" in result.stderr
    assert "the previous error" not in result.stderr
