"""What a person sees while runs run: start-up phases, round lines or a live bar, ETAs,
``run k of N`` in a sweep, one line per run under ``--quiet`` (pflarena/server/progress.py),
read from the progress events the ServerApp emits (pflarena/server/progress_events.py), and
the round line it logs."""

from __future__ import annotations

import io
import json

import pytest

from pflarena.server.loop import round_eta
from pflarena.server.metrics import label
from pflarena.server.progress import Progress, format_duration
from pflarena.server.progress_events import (
    RoundDone,
    RunEnded,
    RunStarted,
    StartupPhase,
    event_line,
    log_lines,
    read_event,
)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _summary(path, mean=0.9, status="completed", **extra):
    path.mkdir(parents=True, exist_ok=True)
    summary = {
        "status": status,
        "personalized": {"last": {"mean": mean}},
        "global": {"last": {"weighted": 0.5, "mean": 0.4}},
        "startup_s": 7.0,
        "rounds_time_s": 3.0,
    } | extra
    (path / "summary.json").write_text(json.dumps(summary))


def _flower(text):
    """A line as Flower's console handler writes it into the pipe (colours included)."""
    return f"\x1b[92mINFO \x1b[0m:      {text}\n"


def _emitted(event):
    """The lines an event's :func:`~pflarena.server.progress_events.emit` writes into the
    pipe of a process started by pflarena (its JSON line, then its log line)."""
    return [_flower(line) for line in log_lines(event, events=True)]


def _record(number, elapsed, mean=0.5, pooled=0.6, **extra):
    return {
        "round": number,
        "elapsed_s": elapsed,
        "evaluation": {"personalized": {"mean": mean}, "global": {"weighted": pooled}},
        **extra,
    }


def _run_lines(run_dir, rounds=3, strategy="fedavg"):
    """A run's lines: two per event (its start, each round, its end)."""
    lines = _emitted(RunStarted(strategy, "digits", 10, rounds, str(run_dir)))
    for number in range(rounds + 1):
        eta = round_eta([2.0] * number, rounds - number) if number else None
        lines += _emitted(RoundDone.from_record(_record(number, 1.0 + 2 * number), rounds, eta))
    lines += _emitted(RunEnded(str(run_dir)))
    return lines


def test_format_duration():
    assert [format_duration(s) for s in (4.2, 59.4, 185, 3725)] == ["4s", "59s", "3m05s", "1h02m"]


def test_round_eta_is_the_mean_round_time_times_the_rounds_left():
    assert round_eta([], 5) is None
    assert round_eta([2.0, 4.0], 10) == pytest.approx(30.0)


def test_the_round_line_names_each_figure_and_its_eta():
    record = _record(3, 12.5, train={"loss": 1.5, "clients": 10, "failures": 0, "server": {}})
    line = RoundDone.from_record(record, 20, 68.0).text()
    assert line.startswith("[round 3/20] 12.5s | ETA 1m08s | ")
    # the console shows the figures with the names every other output uses
    # in percent, as every table shows accuracies
    assert f"{label('personalized')} 50.00%" in line and f"{label('global')} 60.00%" in line
    assert label("personalized") == "personalized accuracy (mean over clients)"
    assert label("global") == "global accuracy (pooled)"


def test_the_round_line_shows_the_privacy_spent():
    record = _record(2, 5.0, train={"loss": 1.0, "clients": 3, "failures": 0})
    record["train"]["server"] = {"dp-epsilon": 12.3456}
    assert "DP ε so far 12.3" in RoundDone.from_record(record, 5, 1.0).text()


def test_plain_lines_when_not_a_terminal(tmp_path):
    _summary(tmp_path / "r")
    out, clock = io.StringIO(), Clock()
    progress = Progress(1, stream=out, tty=False, clock=clock)
    clock.now = 12.0
    for line in _emitted(StartupPhase("runtime ready in 11.9s (Ray engine)")):
        progress.feed(line)
    for line in _run_lines(tmp_path / "r"):
        progress.feed(line)
    progress.feed(_flower("some Flower chatter"))
    progress.close()
    text = out.getvalue()
    assert "\r" not in text and "\x1b" not in text  # no terminal control in a log
    assert "pflarena [   12s] start-up: runtime ready in 11.9s" in text
    # one clock: the command's, not the run's elapsed time as well
    assert (
        "pflarena [   12s] round 0/3 | " in text and "pflarena [   12s] round 3/3 | ETA 0s" in text
    )
    assert "pflarena [   12s] round 2/3 | ETA 2s" in text
    assert "[round" not in text and "5.0s" not in text
    assert "chatter" not in text


def test_a_live_bar_on_a_terminal(tmp_path):
    _summary(tmp_path / "r")
    out = io.StringIO()
    progress = Progress(1, stream=out, tty=True, clock=Clock())
    lines = _run_lines(tmp_path / "r")
    for line in lines[:6]:  # the start, rounds 0 and 1
        progress.feed(line)
    progress.feed(_flower("ERROR: something broke"))
    for line in lines[6:]:
        progress.feed(line)
    progress.close()
    text = out.getvalue()
    assert "\r\x1b[Kpflarena [    0s] [#############.......] round 2/3 ETA 2s" in text
    assert f"{label('personalized')} 50.00%" in text
    assert "[round 2/3]" not in text  # drawn in place, not printed line by line
    # the last round's bar stays on the screen
    assert "round 3/3 ETA 0s " + f"{label('personalized')} 50.00%\n" in text
    # a problem is printed on a line of its own, the bar cleared first
    assert "\r\x1b[KERROR: something broke\n" in text


def test_a_sweep_says_run_k_of_n_with_an_eta(tmp_path):
    out, clock = io.StringIO(), Clock()
    progress = Progress(3, stream=out, tty=False, clock=clock)
    for index in range(3):
        run_dir = tmp_path / f"r{index}"
        _summary(run_dir, mean=0.8 + index / 100)
        lines = _run_lines(run_dir)
        for line in lines[:2]:  # the start
            progress.feed(line)
        clock.now += 10.0 * (index + 1)  # runs of 10 s, then 20 s
        for line in lines[2:]:
            progress.feed(line)
    text = out.getvalue()
    assert "run 1 of 3: fedavg on digits" in text
    assert "sweep ETA" not in text.splitlines()[0]  # nothing to go by yet
    assert "run 2 of 3: fedavg on digits, 10 clients, 3 rounds" in text
    assert "(sweep ETA 20s)" in text  # 10 s per run so far, two runs left
    assert "(sweep ETA 15s)" in text  # (10 + 20) / 2 for the last one
    assert (
        f"run 3 of 3 fedavg on digits: completed in 30s (start-up 7s), {label('personalized')} 82.00%"
        in text
    )


def test_quiet_keeps_one_line_per_run(tmp_path):
    out = io.StringIO()
    progress = Progress(2, verbosity=0, quiet=True, stream=out, tty=False, clock=Clock())
    _summary(tmp_path / "a")
    _summary(tmp_path / "b", status="failed", error="RuntimeError: boom")
    for line in _run_lines(tmp_path / "a") + _run_lines(tmp_path / "b")[:-2]:
        progress.feed(line)
    for line in _emitted(RunEnded(str(tmp_path / "b"), failed=True)):
        progress.feed(line)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("pflarena [    0s] run 1 of 2 fedavg on digits: completed")
    assert "run 2 of 2 fedavg on digits: FAILED (RuntimeError: boom)" in lines[1]


def test_verbose_passes_every_line(tmp_path):
    out = io.StringIO()
    progress = Progress(1, verbosity=2, stream=out, tty=False, clock=Clock())
    progress.feed(_flower("some Flower chatter"))
    assert "some Flower chatter" in out.getvalue()


def test_many_clients_failing_alike_show_one_line_and_a_count(tmp_path):
    """Catches a run of 2,000 clients printing 2,000 tracebacks: a problem line like one
    already shown (other pids and numbers) is counted, not shown again."""
    out = io.StringIO()
    progress = Progress(1, stream=out, tty=False, clock=Clock())
    for pid in range(2000):
        progress.feed(f"(ClientAppActor pid={1000 + pid}) ERROR: client {pid} failed: boom\n")
        progress.feed(f"(ClientAppActor pid={1000 + pid}) Traceback (most recent call last):\n")
    progress.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert "3998 more line(s) like those above not shown" in lines[-1]


def test_progress_goes_to_stderr_by_default(capsys):
    progress = Progress(1, tty=False, clock=Clock())
    for line in _emitted(StartupPhase("runtime ready in 1.0s (in-process engine)")):
        progress.feed(line)
    captured = capsys.readouterr()
    assert captured.out == "" and "runtime ready" in captured.err


def test_the_log_lines_of_the_events_are_those_of_before():
    """The log a person (or a deployment's `flwr log`) reads keeps its lines."""
    assert StartupPhase("Ray started in 1.2s").text() == "pflarena: start-up: Ray started in 1.2s"
    assert (
        RunStarted("fedavg", "digits", 10, 3, "/r").text()
        == "pflarena: fedavg on digits, 10 clients, 3 rounds -> /r"
    )
    assert RunEnded("/r").text() == "pflarena: results in /r"
    assert RunEnded("/r", failed=True).text() == "pflarena: run failed; partial results in /r"
    assert RunEnded(failed=True, reason="boom").text() == "pflarena: run failed: boom"
    assert log_lines(RunEnded("/r"), events=False) == ["pflarena: results in /r"]


def test_an_event_is_read_back_by_its_fields():
    events = [
        StartupPhase("runtime ready in 1.0s (Ray engine)"),
        RunStarted("ditto", "cifar10", 20, 5, "/runs/a b"),
        RoundDone.from_record(
            _record(2, 5.0, train={"loss": 1.0, "clients": 3, "failures": 1}), 5, 9.0
        ),
        RunEnded("/runs/a b"),
        RunEnded(failed=True, reason="RuntimeError: boom"),
    ]
    for event in events:
        assert read_event(_flower(event_line(event))) == event
    assert read_event(_flower(events[1].text())) is None  # a log line is no event
    assert read_event(_flower("pflarena-event: {not json")) is None


def test_verbose_shows_each_log_line_once_and_no_event_line(tmp_path):
    _summary(tmp_path / "r")
    out = io.StringIO()
    progress = Progress(1, verbosity=2, stream=out, tty=False, clock=Clock())
    for line in _run_lines(tmp_path / "r"):
        progress.feed(line)
    text = out.getvalue()
    assert "pflarena-event" not in text
    assert text.count("[round 2/3]") == 1 and text.count("pflarena: results in") == 1
