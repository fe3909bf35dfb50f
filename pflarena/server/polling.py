"""Replies collected promptly on a deployment: a Grid whose ``send_and_receive`` polls often.

Flower 1.41's deployment Grid (``HttpGrid``) sleeps a fixed 3 s between two checks for
replies, so every exchange of a round ends up to 3 s after its last reply; the simulation's
``InMemoryGrid`` checks every 0.1 s. :class:`PromptGrid` wraps the deployment's Grid and runs
the same loop over Flower's public ``push_messages``/``pull_messages`` with a shorter
interval (:data:`REPLY_POLL_ENV`, default :data:`DEFAULT_REPLY_POLL_S`); everything else is
the wrapped Grid's. Each check is one small HTTP request to the SuperLink.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid

__all__ = ["DEFAULT_REPLY_POLL_S", "PromptGrid", "REPLY_POLL_ENV", "prompt_grid"]

#: Environment variable of the ServerApp process: seconds between checks for replies.
REPLY_POLL_ENV = "PFLARENA_REPLY_POLL_S"
DEFAULT_REPLY_POLL_S = 0.1


class PromptGrid:
    """``grid`` with a ``send_and_receive`` that checks for replies every ``poll`` seconds."""

    def __init__(self, grid: Grid, poll: float) -> None:
        self._grid = grid
        self.poll = poll

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push ``messages`` and pull their replies until all came or ``timeout`` passed
        (Flower's ``HttpGrid.send_and_receive`` with ``poll`` instead of 3 s)."""
        pending = {mid for mid in self._grid.push_messages(messages) if mid}
        end = time.time() + (timeout if timeout is not None else 0.0)
        replies: list[Message] = []
        while timeout is None or time.time() < end:
            pulled = list(self._grid.pull_messages(pending))
            replies.extend(pulled)
            pending.difference_update(m.metadata.reply_to_message_id for m in pulled)
            if not pending:
                break
            time.sleep(self.poll)
        return replies


def prompt_grid(grid: Grid) -> Grid:
    """``grid`` wrapped in :class:`PromptGrid` when it is a deployment's Grid (Flower's
    ``HttpGrid``); other Grids (simulation) already poll every 0.1 s and are returned as
    they are. ``PFLARENA_REPLY_POLL_S=3`` restores Flower's interval."""
    from flwr.superlink.grid.http_grid import HttpGrid

    if not isinstance(grid, HttpGrid):
        return grid
    value = os.environ.get(REPLY_POLL_ENV, "")
    try:
        poll = float(value) if value else DEFAULT_REPLY_POLL_S
    except ValueError:
        raise ValueError(f"{REPLY_POLL_ENV}={value!r} is not a number of seconds") from None
    if not 0.01 <= poll <= 60:
        raise ValueError(f"{REPLY_POLL_ENV}={value!r} must be between 0.01 and 60 seconds")
    return PromptGrid(grid, poll)  # type: ignore[return-value]
