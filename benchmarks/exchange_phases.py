"""Where one deployed exchange's time goes, from the processes' own log lines.

Run a deployment with ``PFLARENA_TRACE=1`` (:mod:`pflarena.core.trace`): every pflarena
process then writes Flower's timestamps (local time, to the millisecond) in its log lines, the
ServerApp logs ``pflarena trace: pushed N messages in S s: <ids>`` when a push ends and
``pflarena trace: reply to <id> from node <n>`` when it sees a reply, and the warm executor
logs each fork. With those, one message of an exchange is followed through its phases:

``ServerApp push``
    the ServerApp pushing the exchange's messages and their objects into the SuperLink (the
    SuperLink stores them as they arrive: its share cannot be told apart from outside);
``SuperNode pull``
    from the push's start until the node pulled the message (its poll's wait; it may pull a
    message before the push of the exchange's last objects ended);
``object fetch``
    the node fetching the message's objects from the SuperLink;
``executor pull``
    from the objects' arrival until the ClientApp child had pulled its task input (the
    executor's task poll, the fork, the child's own pull);
``load``, ``call``, ``push``
    the child installing the FAB and loading the app, calling it, pushing its reply to its
    node (the child's own phase times);
``SuperNode push``
    from the child's reply until the node had sent it to the SuperLink;
``ServerApp reply poll``
    from the node's send until the ServerApp saw the reply.

Each message's phases come from its own node's lines, matched in order (a SuperNode serves one
message at a time) and by message id with the ServerApp's lines.
"""

from __future__ import annotations

import datetime as dt
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PHASES", "Timeline", "phase_table", "read_timeline"]

PHASES = (
    "ServerApp push",
    "SuperNode pull",
    "object fetch",
    "executor pull",
    "load",
    "call",
    "push",
    "SuperNode push",
    "ServerApp reply poll",
)
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _lines(path: Path) -> Iterable[tuple[float, str]]:
    """(wall time, text) of each timestamped line of a log."""
    for raw in path.read_text(errors="replace").splitlines():
        line = _ANSI.sub("", raw)
        match = _STAMP.search(line)
        if match:
            stamp = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
            yield stamp.timestamp(), line[match.end() :].lstrip(": ").strip()


@dataclass
class Message:
    """One message's events (wall times) on its node, and the ServerApp's."""

    message_id: str
    pushed_from: float = 0.0
    pushed: float = 0.0
    received: float = 0.0
    fetched: float = 0.0
    child: dict[str, float] = field(default_factory=dict)
    child_end: float = 0.0
    sent: float = 0.0
    replied: float = 0.0

    def phases(self) -> dict[str, float] | None:
        child_pull = self.child.get("pull")
        if not (self.pushed and self.received and self.sent and self.replied and child_pull):
            return None
        child_start = self.child_end - sum(self.child.values())
        return {
            "ServerApp push": self.pushed - self.pushed_from,
            "SuperNode pull": self.received - self.pushed_from,
            "object fetch": self.fetched - self.received,
            "executor pull": child_start + child_pull - self.fetched,
            "load": self.child.get("install", 0.0) + self.child.get("load", 0.0),
            "call": self.child.get("call", 0.0),
            "push": self.child.get("push", 0.0),
            "SuperNode push": self.sent - self.child_end,
            "ServerApp reply poll": self.replied - self.sent,
            "exchange": self.replied - self.pushed_from,
        }


@dataclass
class Timeline:
    messages: dict[str, Message] = field(default_factory=dict)

    def table(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for message in self.messages.values():
            phases = message.phases()
            for name, value in (phases or {}).items():
                out.setdefault(name, []).append(value)
        return out


def read_timeline(server_log: Path, nodes: Iterable[tuple[Path, Path]]) -> Timeline:
    """The messages of a run: ``server_log`` holds the ServerApp's trace lines (``flwr run
    --stream``'s output or its container's log), ``nodes`` each SuperNode's log and its
    executor's."""
    timeline = Timeline()
    for when, text in _lines(server_log):
        if "pflarena trace: pushed" in text:
            head, _, ids = text.partition(": pushed ")[2].partition(": ")
            took = float(re.search(r"in ([0-9.]+) s", head).group(1))
            for mid in ids.split():
                timeline.messages[mid] = Message(mid, when - took, when)
        elif "pflarena trace: reply to" in text:
            mid = text.split("reply to ", 1)[1].split()[0]
            if mid in timeline.messages:
                timeline.messages[mid].replied = when
    for node_log, executor_log in nodes:
        order: list[Message] = []
        current: Message | None = None
        for when, text in _lines(node_log):
            if text.startswith("Receiving:"):
                mid = text.rsplit("ID: ", 1)[-1].rstrip(")")
                current = timeline.messages.setdefault(mid, Message(mid))
                current.received = when
                order.append(current)
            elif text.startswith("Received successfully") and current is not None:
                current.fetched = when
            elif text.startswith("Sent successfully") and current is not None:
                current.sent = when
        children = [
            (when, dict((k, float(v)) for k, v in re.findall(r"(\w+) ([0-9.]+)s", text.split(" phases: ")[1])))
            for when, text in _lines(executor_log)
            if " phases: " in text
        ]  # fmt: skip
        for message, (end, phases) in zip(order, children, strict=False):
            message.child_end, message.child = end, phases
    return timeline


def phase_table(named: dict[str, Timeline]) -> list[str]:
    """Markdown rows: per run, each phase's median (and max) over its messages, in ms."""
    rows = [
        "| run | messages | " + " | ".join(PHASES) + " | whole exchange |",
        "|---|---|" + "---|" * (len(PHASES) + 1),
    ]
    for name, timeline in named.items():
        table = timeline.table()
        count = len(table.get("exchange", []))
        cells = [
            f"{1000 * statistics.median(v):.0f} ({1000 * max(v):.0f})"
            if (v := table.get(p))
            else "—"
            for p in (*PHASES, "exchange")
        ]
        rows.append(f"| {name} | {count} | " + " | ".join(cells) + " |")
    return rows
