"""Ctrl-C on `pflarena run` and `pflarena sweep`: one line, no traceback, nothing left running.

The command is started in a process group of its own, as a shell starts a foreground job,
and the whole group gets SIGINT, as a terminal's Ctrl-C sends it. Every process below the
command (the simulation process, Ray's GCS, raylet, workers and its dashboard and runtime-env
agents) is listed just before, and none may be alive afterwards, nor anything in the group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import cmdline, descendants

from pflarena.reporting.compare import compare_table
from pflarena.server.results import comparable_rounds, read_rounds

pytestmark = pytest.mark.slow


def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


def _alive(processes: dict[int, str | None]) -> list[str]:
    """Those of ``processes`` (pid -> start time) still running (not zombies)."""
    left = []
    for pid, started in processes.items():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X") and _start_time(pid) == started:
            left.append(f"{pid} {cmdline(pid)[:120]}")
    return left


def _in_group(pgid: int) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            found.append(f"{entry.name} {cmdline(int(entry.name))[:120]}")
    return found


def _last_round(path: Path) -> int:
    return max((r["round"] for r in read_rounds(path)), default=-1) if path.exists() else -1


def _as_a_shell_starts_it() -> None:
    """A foreground job's signal state, as a shell gives it: SIGINT and SIGTERM at their
    defaults and nothing blocked, whatever this test process holds. (An ignored signal
    survives exec: when an earlier test in the same pytest worker left SIGINT ignored, the
    command ignored Ctrl-C too and ran its 200 rounds to the end.)"""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _interrupt(command: list[str], rounds_file: Path, cwd: Path, how: str = "ctrl-c"):
    """Start ``command`` in its own group, stop it once a round is recorded (``ctrl-c``:
    SIGINT to the group, as a terminal sends it; ``sigterm``: SIGTERM to the command alone,
    as ``kill`` or a process manager sends it); its result and the processes that were
    below it."""
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=_as_a_shell_starts_it,
    )
    deadline = time.monotonic() + 400
    while _last_round(rounds_file) < 1:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no round recorded"
        time.sleep(0.2)
    below = {pid: _start_time(pid) for pid in descendants({proc.pid})}
    names = " ".join(cmdline(pid) for pid in below)
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    time.sleep(1.0)
    return proc, out, err, below, names


@pytest.mark.parametrize(("how", "code", "said"), [("ctrl-c", 130, "interrupted"),
                                                   ("sigterm", 143, "terminated")])  # fmt: skip
@pytest.mark.parametrize("engine", ["ray", "inprocess"])
def test_ctrl_c_stops_a_run_with_one_line_and_leaves_no_process(
    tmp_path, monkeypatch, how, code, said, engine
):
    """SIGTERM to the command alone takes the same way out (before, the simulation process
    was left running, orphaned). On the in-process engine the workers, forked at the first
    message here and each in a session of its own, are ended too."""
    out = tmp_path / "run"
    monkeypatch.setenv("PFLARENA_FORK_AFTER_S", "0")
    cli = [sys.executable, "-m", "pflarena.cli", "run"]
    workers = ["--workers", "2"] if engine == "inprocess" else []
    command = [*cli, "--strategy", "fedavg", "--num-clients", "4", "--num-rounds", "200",
               "--engine", engine, *workers, "--output-dir", str(out), "--quiet"]  # fmt: skip
    proc, stdout, stderr, below, names = _interrupt(command, out / "rounds.jsonl", tmp_path, how)
    if engine == "ray":
        assert "raylet" in names and "gcs_server" in names  # Ray was running below it
    else:  # the simulation process and its two workers
        assert names.count("pflarena.runtime.simulation") >= 3, names
    assert proc.returncode == code, stderr
    assert stderr.strip().splitlines() == [
        f"pflarena run: {said}; `pflarena run --resume {out}` continues it"
    ], stderr
    assert "Traceback" not in stdout
    assert _alive(below) == [] and _in_group(proc.pid) == []
    recorded = _last_round(out / "rounds.jsonl")
    time.sleep(3)
    assert _last_round(out / "rounds.jsonl") == recorded  # nothing goes on in the background
    # recorded as what it was: interrupted, by its own signal (before: failed, with
    # "KeyboardInterrupt: signal 15" for a Ctrl-C)
    summary = json.loads((out / "summary.json").read_text())
    signal_name = {"ctrl-c": "SIGINT", "sigterm": "SIGTERM"}[how]
    assert (summary["status"], summary["signal"]) == ("interrupted", signal_name), summary
    assert "error" not in summary
    assert summary["rounds_completed"] == recorded


def test_a_run_interrupted_by_ctrl_c_resumes_to_completion(tmp_path):
    """`pflarena run --resume` continues a run Ctrl-C interrupted, to the rounds of a run
    never interrupted; compare shows the interruption with its signal until then."""
    out, whole = tmp_path / "run", tmp_path / "whole"
    common = ["--strategy", "fedavg", "--num-clients", "3", "--num-rounds", "60",
              "--engine", "inprocess", "--workers", "1", "--quiet"]  # fmt: skip
    cli = [sys.executable, "-m", "pflarena.cli", "run"]
    proc, _, stderr, _, _ = _interrupt([*cli, *common, "--output-dir", str(out)],
                                       out / "rounds.jsonl", tmp_path)  # fmt: skip
    assert proc.returncode == 130, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["signal"]) == ("interrupted", "SIGINT")
    assert "**interrupted** by SIGINT at round" in compare_table([out])
    resumed = subprocess.run([*cli, "--resume", str(out), "--engine", "inprocess", "--quiet"],
                             capture_output=True, text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    done = subprocess.run([*cli, *common, "--output-dir", str(whole)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and "signal" not in summary
    assert comparable_rounds(read_rounds(out / "rounds.jsonl")) == comparable_rounds(
        read_rounds(whole / "rounds.jsonl")
    )


def test_ctrl_c_stops_a_sweep_and_leaves_no_process(tmp_path):
    sweep = tmp_path / "sweep"
    command = [sys.executable, "-m", "pflarena.cli", "sweep", "--strategies", "fedavg",
               "--seeds", "0,1", "--set", "num-clients=4", "--set", "num-rounds=200",
               "--out", str(sweep), "--quiet"]  # fmt: skip
    proc, stdout, stderr, below = _interrupt_sweep(command, sweep, tmp_path)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr + stdout
    assert [line for line in stderr.splitlines() if line.strip()] == [
        "pflarena sweep: interrupted; the same command continues it (completed runs are kept, "
        "the interrupted one resumes from its checkpoint)"
    ], stderr
    assert _alive(below) == [] and _in_group(proc.pid) == []
    runs = sorted(sweep.rglob("rounds.jsonl"))
    recorded = {path: _last_round(path) for path in runs}
    time.sleep(3)
    assert {path: _last_round(path) for path in sorted(sweep.rglob("rounds.jsonl"))} == recorded


def _interrupt_sweep(command: list[str], sweep: Path, cwd: Path):
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=_as_a_shell_starts_it,
    )
    deadline = time.monotonic() + 400
    while max((_last_round(p) for p in sweep.rglob("rounds.jsonl")), default=-1) < 1:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no round recorded"
        time.sleep(0.2)
    below = {pid: _start_time(pid) for pid in descendants({proc.pid})}
    os.killpg(proc.pid, signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    time.sleep(1.0)
    return proc, stdout, stderr, below


def test_sigterm_to_a_script_calling_simulate_leaves_no_process(tmp_path):
    """A script that calls the library's ``simulate`` (a benchmark) and is ended by SIGTERM
    stops its simulation process on the way out; before, that process ran on, orphaned in
    its own session, until the run ended."""
    out = tmp_path / "run"
    script = (
        "from pflarena.runtime.launch import simulate\n"
        "from pflarena.server.build import parse_config\n"
        f"cfg = parse_config({{'strategy': 'fedavg', 'num-clients': 4, 'num-rounds': 200, "
        f"'output-dir': {str(out)!r}}})\n"
        "simulate(cfg, engine='inprocess', verbosity=0)\n"
    )
    command = [sys.executable, "-c", script]
    proc, _, stderr, below, names = _interrupt(command, out / "rounds.jsonl", tmp_path, "sigterm")
    assert "pflarena.runtime.simulation" in names  # the simulation process was below it
    assert proc.returncode != 0 and "KeyboardInterrupt" in stderr
    assert _alive(below) == []
    recorded = _last_round(out / "rounds.jsonl")
    time.sleep(3)
    assert _last_round(out / "rounds.jsonl") == recorded  # nothing goes on in the background
