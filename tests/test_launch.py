"""The launcher's way out of an interrupted run: the simulation process's output is read
while it stops, and a run that did not record its end says so with that output."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pflarena.cli import main
from pflarena.runtime import launch

#: A process that, on SIGTERM, writes 200 KB (three times what a pipe holds), then a marker
#: file, and exits 0.
_LOUD_ON_THE_WAY_OUT = """
import signal, sys, time
from pathlib import Path
def stop(signum, frame):
    for i in range(2000):
        print(f"line {i} " + "x" * 100, flush=True)
    Path(sys.argv[1]).write_text("recorded")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def _start_loud(marker: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", _LOUD_ON_THE_WAY_OUT, str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_a_process_that_writes_much_on_its_way_out_is_read_while_it_stops(tmp_path):
    marker, log = tmp_path / "marker", tmp_path / "log.txt"
    tail: collections.deque[str] = collections.deque(maxlen=launch.TAIL_LINES)
    proc = _start_loud(marker)
    with open(log, "w") as handle:
        launch.stop_reading(proc, (handle, tail), grace=20)
    assert proc.returncode == 0 and marker.read_text() == "recorded"
    assert tail[-1].startswith("line 1999 ") and len(tail) == launch.TAIL_LINES
    assert len(log.read_text().splitlines()) == 2000


def test_unread_the_same_process_blocks_until_it_is_killed(tmp_path):
    """The control: without the reader the same process never records (what a run's
    ``summary.json`` is here), and is killed at the end of its grace."""
    marker = tmp_path / "marker"
    proc = _start_loud(marker)
    started = time.monotonic()
    launch.stop_reading(proc, None, grace=3)
    assert time.monotonic() - started >= 3
    assert proc.returncode == -9 and not marker.exists()
    proc.stdout.close()


def _interrupting(lines: list[str], summary: dict | None):
    """A ``run_simulations`` that prints ``lines``, writes ``summary`` (if any) into the
    run directory, and is interrupted."""

    def run_simulations(configs, output=None, **options):
        if summary is not None:
            out = Path(configs[0].output_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / "summary.json").write_text(json.dumps(summary))
        if output is not None:
            output[:] = lines
        raise KeyboardInterrupt

    return run_simulations


@pytest.mark.parametrize("recorded", [False, True])
def test_an_interrupted_run_that_recorded_no_summary_says_so_with_its_last_lines(
    tmp_path, monkeypatch, capsys, recorded
):
    """Before, an interrupted run's one line said `--resume` continues it whether or not
    the run had recorded its end, and what the simulation printed on its way out was lost."""
    summary = {"status": "interrupted", "signal": "SIGINT"} if recorded else None
    lines = ["INFO: round 3\n", "Traceback (most recent call last):\n", "OSError: disk full\n"]
    monkeypatch.setattr(launch, "run_simulations", _interrupting(lines, summary))
    out = tmp_path / "run"
    code = main(["run", "--num-clients", "3", "--num-rounds", "2", "--output-dir", str(out),
                 "--quiet"])  # fmt: skip
    assert code == 130
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    said = f"pflarena run: interrupted; `pflarena run --resume {out}` continues it"
    if recorded:
        assert err == [said]
    else:
        assert err == [
            said,
            f"pflarena run: the run recorded no summary of its end in {out}; the "
            "simulation's last lines:",
            *[line.rstrip("\n") for line in lines],
        ]


def test_a_summary_left_by_an_earlier_interruption_is_not_this_runs(tmp_path, monkeypatch):
    """A resumed run interrupted again that records nothing: the summary.json there is the
    earlier interruption's, so this one is unrecorded."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    monkeypatch.setattr(launch, "run_simulations", _interrupting(["the last line\n"], None))
    from pflarena.server.build import parse_config

    cfg = parse_config({"num-clients": 3, "output-dir": str(out)})
    with pytest.raises(KeyboardInterrupt) as interrupt:
        launch.simulate(cfg, verbosity=0)
    assert launch.unrecorded_output(interrupt.value) == ["the last line\n"]
