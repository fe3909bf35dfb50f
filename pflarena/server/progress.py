"""What ``pflarena run`` and ``pflarena sweep`` show while the simulation runs.

The simulation process (and the ServerApp in it) says what it does as progress events
(:mod:`pflarena.server.progress_events`): the start-up phases (the runtime, then round 0,
where each client builds its data), each run's start, one event per round and each run's
end. Each comes as a JSON line of its fields followed by the log line a person reads.
:class:`Progress` reads the events' fields as they come (the log line after each is the
event's, left out) and shows them to a person:

- start-up phases with the time since the command started;
- on a terminal, one live line per run: a bar of its rounds, its ETA and accuracy,
  redrawn in place; elsewhere (CI, a log file), the round lines as they are;
- for a sweep, ``run k of N`` with the sweep's ETA (the mean time of its runs so far times
  the runs left) as each run starts;
- ``quiet``: one line per run as it ends, nothing else.

The start-up (the runtime and the first run's round 0, where the clients build their data)
is shown on its own, and each run's summary keeps it apart (``startup_s``) from its rounds'
time (``rounds_time_s``), which the leaderboard shows.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

from pflarena.core.text import count
from pflarena.server.metrics import HEADLINE, label
from pflarena.server.progress_events import (
    Event,
    RoundDone,
    RunStarted,
    StartupPhase,
    format_duration,
    read_event,
)

__all__ = ["Progress", "format_duration", "is_problem"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PROBLEM_MARKERS = ("ERROR", "Traceback", "Error", "failed", "rejected")
_PROGRESS_MARKERS = ("pflarena", "[round ")
_PID = re.compile(r"\((?:pid=|\w+ pid=)\d+[^)]*\)")
_DIGITS = re.compile(r"\d+")


def is_problem(text: str) -> bool:
    """A line that says something went wrong (always shown, but under ``quiet``)."""
    return any(marker in text for marker in _PROBLEM_MARKERS) and "FutureWarning" not in text


def _clean(line: str) -> str:
    """The message of a Flower log line, without colours and the level prefix."""
    text = _ANSI.sub("", line).rstrip("\n")
    head, sep, rest = text.partition(":")
    if sep and head.strip() in ("INFO", "DEBUG", "WARNING", "ERROR"):
        return rest.strip()
    return text.strip()


class Progress:
    """Shows a simulation's output lines as progress (see the module's docstring).

    Parameters
    ----------
    total_runs
        Runs the command will run (a sweep's runs still to do; 1 for ``pflarena run``).
    verbosity
        0 nothing, 1 progress and problems, 2 every line of the log as it is.
    quiet
        One line per run as it ends (with ``verbosity`` 0).
    tty
        Draw a live bar (default: whether ``stream`` is a terminal).
    """

    def __init__(
        self,
        total_runs: int = 1,
        *,
        verbosity: int = 1,
        quiet: bool = False,
        stream: IO[str] | None = None,
        tty: bool | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.total = max(1, total_runs)
        self.verbosity = verbosity
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.clock = clock
        self.begin = clock()
        self.run_index = 0
        self.run_began: float | None = None
        self.run_dir: Path | None = None
        self.run_name = ""
        self.durations: list[float] = []
        self.startup_done = False
        self._live = ""  # the bar drawn in place, to clear before another line
        self._seen: set[str] = set()  # problem lines shown, as compared (_write_once)
        #: the log lines of the events read, still to come (each follows its event's line)
        self._event_texts: deque[str] = deque(maxlen=16)
        self.repeated = 0  # problem lines like one shown, not shown

    # ------------------------------------------------------------------ output
    def _write(self, text: str) -> None:
        if self._live:
            self.stream.write("\r\x1b[K")
        self.stream.write(text + "\n")
        self._live = ""
        self.stream.flush()

    def _draw(self, text: str) -> None:
        self.stream.write("\r\x1b[K" + text)
        self._live = text
        self.stream.flush()

    def _elapsed(self) -> str:
        return f"[{format_duration(self.clock() - self.begin):>6}]"

    # ------------------------------------------------------------------ input
    def feed(self, line: str) -> None:
        """One line of the simulation's output: an event's JSON line, an event's log line
        (left out: the event was shown), or any other line."""
        event = read_event(line)
        if event is not None:
            text = event.text()
            self._event_texts.append(text)
            shown = self._track(event)
            if self.verbosity >= 2:  # its log line, which follows, is shown as it is
                return
        else:
            text = _clean(line)
            if self.verbosity >= 2:
                self._write(line.rstrip("\n"))
                self._is_event_text(text)
                return
            if self._is_event_text(text):  # an event's log line: the event was shown
                return
            shown = None
        if self.verbosity == 0:
            if self.quiet and shown is not None and shown[0] == "end":
                self._write(shown[1])
            return
        if shown is not None:
            kind, message = shown
            if kind in ("bar", "last bar"):
                self._draw(message)
                if kind == "last bar":  # the run's rounds are done: the bar stays
                    self.stream.write("\n")
                    self._live = ""
            elif kind != "end" or self.total > 1:
                self._write(message)
        elif is_problem(text) or (
            any(marker in text for marker in _PROGRESS_MARKERS) and "FutureWarning" not in text
        ):
            self._write_once(text)

    def _is_event_text(self, text: str) -> bool:
        """Whether ``text`` is the log line of an event read (that line no longer to come)."""
        for expected in self._event_texts:
            if text.endswith(expected):
                self._event_texts.remove(expected)
                return True
        return False

    def _write_once(self, text: str) -> None:
        """A problem line, unless one like it (the same but for process ids and numbers:
        each of many clients' tracebacks) was shown already; those are counted."""
        key = _DIGITS.sub("#", _PID.sub("", text))
        if key in self._seen:
            self.repeated += 1
            return
        self._seen.add(key)
        self._write(text)

    def close(self) -> None:
        if self.repeated and self.verbosity == 1:
            self._write(
                f"pflarena {self._elapsed()} {self.repeated} more line(s) like those above "
                "not shown (--verbose shows every line)"
            )
            self.repeated = 0
        if self._live:
            self.stream.write("\n")
            self._live = ""
            self.stream.flush()

    # ------------------------------------------------------------------ parsing
    def _track(self, event: Event) -> tuple[str, str] | None:
        """Follow the runs; what to show for this event (kind, text), None: its log line."""
        if isinstance(event, StartupPhase):
            return "startup", f"pflarena {self._elapsed()} start-up: {event.phase}"
        if isinstance(event, RunStarted):
            return "start", self._run_started(event)
        if isinstance(event, RoundDone):
            return self._round(event)
        if not event.failed:
            return "end", self._run_ended(Path(str(event.output_dir).strip()))
        if self.run_began is not None:
            return "end", self._run_ended(self.run_dir, failed=event.text())
        return None

    def _run_started(self, event: RunStarted) -> str:
        self.run_index += 1
        self.run_began = self.clock()
        where = event.output_dir.strip()
        self.run_dir = Path(where)
        self.run_name = f"{event.strategy} on {event.data}"
        text = f"pflarena {self._elapsed()} "
        if self.total > 1:
            text += f"run {self.run_index} of {self.total}: "
        text += f"{event.strategy} on {event.data}, {count(event.clients, 'client')}, "
        text += f"{count(event.rounds, 'round')} -> {where}"
        if self.total > 1 and self.durations:
            left = self.total - self.run_index + 1
            eta = sum(self.durations) / len(self.durations) * left
            text += f" (sweep ETA {format_duration(eta)})"
        return text

    def _round(self, event: RoundDone) -> tuple[str, str]:
        number, total, eta = event.round, event.num_rounds, event.eta
        rest = "".join(f" | {field}" for field in event.fields)
        if number == 0 and not self.startup_done:
            self.startup_done = True
        if not self.tty:
            line = f"pflarena {self._elapsed()} round {number}/{total}"
            if eta:
                line += f" | ETA {eta}"
            return "line", line + rest
        width = 20
        filled = round(width * number / max(total, 1))
        bar = "#" * filled + "." * (width - filled)
        head = f"run {self.run_index}/{self.total} " if self.total > 1 else ""
        accuracy = ""
        for field in event.fields:
            field = field.strip()
            if field.startswith(label("personalized", HEADLINE["personalized"])):
                accuracy = " " + field
        text = f"pflarena {self._elapsed()} {head}[{bar}] round {number}/{total}"
        if eta:
            text += f" ETA {eta}"
        return ("last bar" if number == total else "bar"), text + accuracy

    def _run_ended(self, run_dir: Path | None, failed: str | None = None) -> str:
        # here, not at the top: the results module imports numpy, which showing progress
        # needs only once a run ends
        from pflarena.server.results import COMPLETED, INTERRUPTED, failure_text

        took = self.clock() - (self.run_began or self.begin)
        self.durations.append(took)
        self.run_began = None
        prefix = f"run {self.run_index} of {self.total}" if self.total > 1 else "run"
        summary = _read_summary(run_dir)
        if summary.get("status") == INTERRUPTED:
            by = summary.get("signal") or "a signal"
            return f"pflarena {self._elapsed()} {prefix} {self.run_name}: INTERRUPTED by {by}"
        if failed or summary.get("status") not in (None, COMPLETED):
            why = summary.get("error") or failed or "failed"
            return f"pflarena {self._elapsed()} {prefix} {self.run_name}: FAILED ({why})"
        pers = ((summary.get("personalized") or {}).get("last") or {}).get("mean")
        glob = ((summary.get("global") or {}).get("last") or {}).get("weighted")
        text = f"pflarena {self._elapsed()} {prefix} {self.run_name}: completed in "
        text += format_duration(took)
        if isinstance(summary.get("startup_s"), int | float):
            text += f" (start-up {summary['startup_s']:.0f}s)"
        if isinstance(pers, int | float):
            text += f", {label('personalized')} {100 * pers:.2f}%"
        if isinstance(glob, int | float):
            text += f", {label('global')} {100 * glob:.2f}%"
        epsilon = (((summary.get("method") or {}).get("dp")) or {}).get("epsilon")
        if isinstance(epsilon, int | float):
            text += f", DP ε {epsilon:.3g}"
        if lost := failure_text(summary.get("client_failures")):
            text += f"; {lost}"
        if run_dir is not None:
            text += f" -> {run_dir}"
        return text


def _read_summary(run_dir: Path | None) -> dict[str, Any]:
    if run_dir is None:
        return {}
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
