"""Waits that follow the work: poll fast while messages flow, back off while nothing happens.

A deployed exchange passes through three pollers besides the ServerApp's (which polls only
while it waits for replies, :mod:`pflarena.server.polling`): the SuperNode asks the SuperLink
for a message and, finding none, sleeps a fixed 3 s in flwr 1.41; it then fetches the
message's objects on Flower's back-off (1 s, doubling); and the ClientApp executor asks its
SuperNode for a task every ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (1 s by default). Shortening
those waits for good makes an idle federation pay for polling it does not need (ten idle
SuperNodes polling every 0.1 s kept 0.7 of 2 cores busy), so :class:`ActivityPoll` shortens
them only while work goes on: after each message (or task) it answers ``active_s`` for
``window_s`` seconds, then doubles its wait, one poll at a time, up to ``idle_s`` (Flower's
own interval), where an idle federation costs what it cost before.

:class:`PollClock` stands in for the ``time`` module of one of Flower's loops, so that the
loop's one idle ``sleep`` asks the :class:`ActivityPoll` instead (and its short waits for a
reply become ``reply_s``); everything else passes through to :mod:`time`. Which Flower
function calls ``sleep`` with what is checked where the clock is installed
(:mod:`pflarena.deploy.supernode`, :mod:`pflarena.deploy.executor`).

With ``PFLARENA_TRACE=1`` (:data:`TRACE_ENV`) pflarena's deployment processes write the wall
time, to the millisecond, at the head of every log line, and each poller reports how often it
polled, so that one exchange can be followed across processes
(``benchmarks/deployment.py`` builds its per-phase table from those lines).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pflarena.core.trace import TRACE_ENV, enable_trace, tracing

__all__ = ["TRACE_ENV", "ActivityPoll", "PollClock", "check_wait", "enable_trace", "tracing"]

#: How often (s) a tracing poller reports its polls.
TRACE_REPORT_S = 10.0


def check_wait(low: float, high: float, name: str) -> float:
    """``low`` seconds, checked to lie in 0.01..``high``."""
    if not 0.01 <= low <= high:
        raise ValueError(f"{name} {low:g} s: choose 0.01 to {high:g} seconds")
    return low


@dataclass
class ActivityPoll:
    """The wait before the next poll: ``active_s`` within ``window_s`` of the last
    :meth:`touch` (or of its creation), then twice the previous wait after each poll, at most
    ``idle_s``.

    Parameters
    ----------
    active_s : float
        Seconds between polls while work goes on.
    idle_s : float
        The longest wait, once nothing has happened for a while (Flower's own interval).
    window_s : float
        How long after the last message or task the polls stay at ``active_s``.
    name : str
        What polls, for the trace (``supernode``, ``executor``).
    """

    active_s: float
    idle_s: float
    window_s: float = 30.0
    name: str = "poll"
    now: Callable[[], float] = time.monotonic
    _last: float = field(default=float("-inf"), init=False)
    _wait: float = field(default=0.0, init=False)
    _polls: int = field(default=0, init=False)
    _reported: float = field(default=0.0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        check_wait(self.active_s, self.idle_s, f"{self.name}: the active poll")
        if self.window_s < 0:
            raise ValueError(f"{self.name}: the active window {self.window_s:g} s is negative")
        # Started: a run is likely to follow, so the first window is an active one.
        self._last = self._reported = self.now()
        self._wait = self.active_s

    def touch(self) -> None:
        """Work happened (a message, a task): poll at ``active_s`` for ``window_s``."""
        with self._lock:
            self._last = self.now()
            self._wait = self.active_s

    def next_wait(self) -> float:
        """Seconds to wait before the next poll (call once per poll that found nothing)."""
        with self._lock:
            now = self.now()
            if now - self._last >= self.window_s:
                self._wait = min(self.idle_s, max(self.active_s, self._wait * 2))
            wait = self._wait
            self._polls += 1
            if tracing() and now - self._reported >= TRACE_REPORT_S:
                from logging import INFO

                from flwr.common.logger import log

                log(INFO, "pflarena %s: %d empty polls in %.1f s, waiting %.2f s", self.name,
                    self._polls, now - self._reported, wait)  # fmt: skip
                self._polls, self._reported = 0, now
            return wait


class PollClock:
    """A stand-in for the ``time`` module of a Flower loop: ``sleep(idle_sleep)`` waits
    ``poll.next_wait()``, ``sleep(reply_sleep)`` waits ``reply_s``; all else is :mod:`time`."""

    def __init__(
        self,
        poll: ActivityPoll,
        idle_sleep: float | None,
        reply_sleep: float | None = None,
        reply_s: float = 0.02,
    ) -> None:
        self.poll = poll
        self.idle_sleep = idle_sleep
        self.reply_sleep = reply_sleep
        self.reply_s = reply_s

    def sleep(self, seconds: float) -> None:
        if self.idle_sleep is None or seconds == self.idle_sleep:
            time.sleep(self.poll.next_wait())
        elif seconds == self.reply_sleep:
            time.sleep(self.reply_s)
        else:
            time.sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)
