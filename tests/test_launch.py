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


#: A simulation process's signal handling, and a Ctrl-C that arrives while a finalizer
#: runs (the in-process engine frees a reply's memory slot in a ``weakref.finalize``
#: callback, hundreds of times a round). Prints how the run's code saw it.
_CTRL_C_IN_A_FINALIZER = """
import os, signal, sys, time, weakref
from pflarena.runtime import simulation

simulation._take_signals()
if sys.argv[1] == "hooked":
    sys.unraisablehook = simulation._interrupts_not_swallowed

def free_the_slot():
    os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode: in here
    for _ in range(1000):
        pass

class Reply:
    pass

try:
    reply = Reply()
    weakref.finalize(reply, free_the_slot)
    del reply
    for _ in range(100_000):
        pass
    time.sleep(float(sys.argv[2]))  # a wait of the run's, in C: the handler runs as it ends
    print("the run went on")
except KeyboardInterrupt as interrupt:
    print("interrupted by", getattr(interrupt, "signal_name", None))
"""


@pytest.mark.parametrize("hooked", [True, False])
def test_a_ctrl_c_that_lands_in_a_finalizer_still_stops_the_run(hooked):
    """Python swallows an exception raised inside a finalizer (it reports it as "Exception
    ignored in"). The simulation process's handler had already let later signals go, so an
    interrupt lost there left the run going until the launcher killed it, with no summary.
    The control (``hooked`` False) shows the loss the hook repairs. Hooked, the run's
    long wait ends at once: the interrupt is raised again by its signal, sent to the main
    thread."""
    started = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _CTRL_C_IN_A_FINALIZER,
            "hooked" if hooked else "plain",
            "60" if hooked else "0.5",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=120,
    )
    if hooked:
        assert time.monotonic() - started < 30
        assert run.stdout.strip() == "interrupted by SIGINT", run.stdout + run.stderr
        assert "Exception ignored" not in run.stderr
    else:
        assert run.stdout.strip() == "the run went on", run.stdout + run.stderr
        assert "Exception ignored" in run.stderr and "RunInterrupted" in run.stderr
