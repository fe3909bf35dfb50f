"""A run's progress as structured events: what the run loop, the ServerApp and the
simulation runtime say they are doing, with one producer (:func:`emit`) and readers that
read fields (:func:`read_event`).

The events: a start-up phase (:class:`StartupPhase`), a run's start (:class:`RunStarted`),
one per round (:class:`RoundDone`) and a run's end (:class:`RunEnded`, completed or
failed). :func:`emit` logs each as the line a person reads in the log
(``pflarena: start-up: ...``, ``pflarena: <strategy> on <data> ... -> <dir>``,
``[round r/N] <elapsed>s | ETA ... | ...``, ``pflarena: results in <dir>``,
``pflarena: run failed ...``: :meth:`text`), and, in a process started with
:data:`EVENTS_ENV` set (:mod:`pflarena.runtime.launch` sets it for the simulations it
streams), first as a JSON line of its fields behind :data:`EVENT_PREFIX`.
:class:`pflarena.server.progress.Progress` shows those events and leaves out the log line
that follows each; launch keeps the JSON lines out of the log file and of what it prints.
A deployment's ServerApp (no :data:`EVENTS_ENV`) logs the lines alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from logging import ERROR, INFO, WARNING
from typing import Any, ClassVar

from pflarena.core.text import count
from pflarena.server.metrics import label

__all__ = [
    "EVENTS_ENV",
    "PLOTS_ENV",
    "EVENT_PREFIX",
    "Event",
    "RoundDone",
    "RunEnded",
    "RunStarted",
    "StartupPhase",
    "emit",
    "event_line",
    "format_duration",
    "log_lines",
    "read_event",
]

#: Set (to anything but empty) in a process whose output pflarena reads: :func:`emit` then
#: writes each event's JSON line too.
EVENTS_ENV = "PFLARENA_PROGRESS_EVENTS"
#: Set (to anything but empty) where the command that started the run draws the run's own
#: plots once it has ended (``pflarena run``: it imports matplotlib while the run starts);
#: the ServerApp of a run with no tracker (which would log them) then leaves them out.
PLOTS_ENV = "PFLARENA_CALLER_PLOTS"
#: What starts an event's JSON line (after the log's level prefix).
EVENT_PREFIX = "pflarena-event: "


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``: a duration a person reads at a glance."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@dataclass(frozen=True)
class StartupPhase:
    """A phase of the start-up done (the runtime, Ray, the trackers, round 0)."""

    kind: ClassVar[str] = "startup"
    phase: str

    def text(self) -> str:
        return f"pflarena: start-up: {self.phase}"


@dataclass(frozen=True)
class RunStarted:
    """A run starts: its method, data, clients and rounds, and where it writes."""

    kind: ClassVar[str] = "start"
    strategy: str
    data: str
    clients: int
    rounds: int
    output_dir: str

    def text(self) -> str:
        return (
            f"pflarena: {self.strategy} on {self.data}, {count(self.clients, 'client')}, "
            f"{count(self.rounds, 'round')} -> {self.output_dir}"
        )


@dataclass(frozen=True)
class RoundDone:
    """A round recorded: its number, the run's time so far, the ETA and the round's
    figures (``fields``, each as the log line shows it)."""

    kind: ClassVar[str] = "round"
    round: int
    num_rounds: int
    elapsed_s: float
    eta: str | None
    fields: tuple[str, ...]

    def text(self) -> str:
        text = f"[round {self.round}/{self.num_rounds}] {self.elapsed_s:.1f}s"
        if self.eta is not None:
            text += f" | ETA {self.eta}"
        return text + "".join(f" | {field}" for field in self.fields)

    @classmethod
    def from_record(
        cls, record: dict[str, Any], num_rounds: int, eta_s: float | None = None
    ) -> RoundDone:
        """The event of a round's ``rounds.jsonl`` record (:mod:`pflarena.server.loop`)."""
        figures: list[str] = []
        evaluation = record.get("evaluation")
        if evaluation:
            figures.append(
                f"{label('personalized')} {100 * evaluation['personalized']['mean']:.2f}%"
            )
            if evaluation.get("global"):
                figures.append(f"{label('global')} {100 * evaluation['global']['weighted']:.2f}%")
            if evaluation.get("failures"):
                asked = len(evaluation.get("per_client") or {}) + evaluation["failures"]
                figures.append(f"evaluation failed on {evaluation['failures']} of {asked} clients")
        train = record.get("train")
        if train and train.get("loss") is not None:
            text = f"train loss {train['loss']:.4f} ({count(train['clients'], 'client')}"
            text += f", {train['failures']} failed)" if train["failures"] else ")"
            figures.append(text)
        epsilon = ((train or {}).get("server") or {}).get("dp-epsilon")
        if epsilon is not None:
            figures.append(f"DP ε so far {epsilon:.3g}")
        if record["round"] == 0 and record.get("data_s") is not None:
            figures.append(f"clients' data built in {record['data_s']:.1f}s")
        return cls(
            round=int(record["round"]),
            num_rounds=num_rounds,
            elapsed_s=float(record["elapsed_s"]),
            eta=None if eta_s is None else format_duration(eta_s),
            fields=tuple(figures),
        )


@dataclass(frozen=True)
class RunEnded:
    """A run's end: its results written (``failed`` false; ``failures``: the line saying
    which clients failed, if any did), or it did not complete, with its partial results in
    ``output_dir`` or, where the runtime failed it, ``reason``; ``interrupted``: the signal
    that stopped it (``SIGINT``, ``SIGTERM``)."""

    kind: ClassVar[str] = "end"
    output_dir: str | None = None
    failed: bool = False
    reason: str | None = None
    interrupted: str | None = None
    failures: str | None = None

    def text(self) -> str:
        if not self.failed:
            text = f"pflarena: results in {self.output_dir}"
            return text + (f" (completed, but {self.failures})" if self.failures else "")
        if self.interrupted:
            return (
                f"pflarena: run interrupted by {self.interrupted}; partial results in "
                f"{self.output_dir} (`pflarena run --resume` continues it)"
            )
        if self.output_dir is not None:
            return f"pflarena: run failed; partial results in {self.output_dir}"
        return f"pflarena: run failed: {self.reason}"


Event = StartupPhase | RunStarted | RoundDone | RunEnded
_KINDS: dict[str, type] = {cls.kind: cls for cls in (StartupPhase, RunStarted, RoundDone, RunEnded)}


def event_line(event: Event) -> str:
    """The event's JSON line (without the log's level prefix)."""
    return EVENT_PREFIX + json.dumps({"kind": event.kind, **asdict(event)})


def log_lines(event: Event, events: bool) -> list[str]:
    """What :func:`emit` logs for ``event``: its JSON line (with ``events``), then its text."""
    return [event_line(event), event.text()] if events else [event.text()]


def emit(event: Event) -> None:
    """Log ``event``: its JSON line where :data:`EVENTS_ENV` asks for it, then its text
    (failures at ``ERROR``, the rest at ``INFO``)."""
    from flwr.common.logger import log  # the producers' processes run Flower; readers need not

    level = INFO
    if isinstance(event, RunEnded) and (event.failed or event.failures):
        level = WARNING if event.interrupted or not event.failed else ERROR
    for line in log_lines(event, bool(os.environ.get(EVENTS_ENV))):
        log(level, "%s", line)


def read_event(line: str) -> Event | None:
    """The event a line of a process's output carries, None for any other line (a JSON
    line that does not decode to an event is none)."""
    _, found, payload = line.partition(EVENT_PREFIX)
    if not found:
        return None
    try:
        record = json.loads(payload)
        cls = _KINDS[record.pop("kind")]
        names = {field.name for field in fields(cls)}
        values = {name: value for name, value in record.items() if name in names}
        if "fields" in values:
            values["fields"] = tuple(values["fields"])
        return cls(**values)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
