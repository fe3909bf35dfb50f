"""Replies collected promptly on a deployment: a Grid whose ``send_and_receive`` polls often.

Flower 1.41's deployment Grid (``HttpGrid``) sleeps a fixed 3 s between two checks for
replies, so every exchange of a round ends up to 3 s after its last reply; the simulation's
``InMemoryGrid`` checks every 0.1 s. :class:`PromptGrid` wraps the deployment's Grid and runs
the same loop over Flower's public ``push_messages``/``pull_messages`` with a shorter
interval (:data:`REPLY_POLL_ENV`, default :data:`DEFAULT_REPLY_POLL_S`); everything else is
the wrapped Grid's. Each check is one small HTTP request to the SuperLink. A reply's objects
are retried on a short back-off too (:func:`_prompt_reply_objects`).

It also packs each outgoing message's arrays into one object per record and unpacks the
replies (:mod:`pflarena.core.packing`): a model of K tensors then crosses each hop in a few
requests instead of 2K + 3 (:data:`PACK_ENV` ``=0`` sends Flower's per-array tree). A reply
whose packed arrays cannot be read back becomes an error reply from its node: that client's
reply is lost, nobody else's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid

from pflarena.core.packing import PackingError, is_packed, pack_content, unpack_content
from pflarena.core.trace import enable_trace, tracing

__all__ = ["DEFAULT_REPLY_POLL_S", "PACK_ENV", "PromptGrid", "REPLY_POLL_ENV", "prompt_grid"]

#: Environment variable of the ServerApp process: seconds between checks for replies.
REPLY_POLL_ENV = "PFLARENA_REPLY_POLL_S"
DEFAULT_REPLY_POLL_S = 0.1
#: Environment variable of the ServerApp process: ``0`` sends messages' arrays as Flower's
#: per-array objects instead of packed (:mod:`pflarena.core.packing`).
PACK_ENV = "PFLARENA_PACK_ARRAYS"


class PromptGrid:
    """``grid`` with a ``send_and_receive`` that checks for replies every ``poll`` seconds,
    and (``pack``) messages whose arrays travel packed."""

    def __init__(self, grid: Grid, poll: float, *, pack: bool = False) -> None:
        self._grid = grid
        self.poll = poll
        self.pack = pack

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Flower's ``push_messages``, the arrays packed on the wire: each message's content
        is packed for the push and given back afterwards (its id is the packed one's, which
        the replies name)."""
        messages = list(messages)
        if not self.pack:
            return self._grid.push_messages(messages)
        originals = [m.content if m.has_content() else None for m in messages]
        try:
            for message, content in zip(messages, originals, strict=True):
                if content is not None:
                    message.content = pack_content(content)
            return list(self._grid.push_messages(messages))
        finally:
            for message, content in zip(messages, originals, strict=True):
                if content is not None:
                    message.content = content

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Flower's ``pull_messages``, packed replies unpacked; one that cannot be is
        turned into an error reply from its node."""
        replies = list(self._grid.pull_messages(message_ids))
        return [_unpacked(reply) for reply in replies] if self.pack else replies

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push ``messages`` and pull their replies until all came or ``timeout`` passed
        (Flower's ``HttpGrid.send_and_receive`` with ``poll`` instead of 3 s)."""
        trace = tracing()
        pushed = time.time()
        pending = {mid for mid in self.push_messages(messages) if mid}
        if trace:
            from logging import INFO

            from flwr.common.logger import log

            log(INFO, "pflarena trace: pushed %d messages in %.3f s: %s", len(pending),
                time.time() - pushed, " ".join(sorted(pending)))  # fmt: skip
        end = time.time() + (timeout if timeout is not None else 0.0)
        replies: list[Message] = []
        while timeout is None or time.time() < end:
            pulled = list(self.pull_messages(pending))
            replies.extend(pulled)
            if trace:
                for reply in pulled:
                    log(INFO, "pflarena trace: reply to %s from node %d",
                        reply.metadata.reply_to_message_id, reply.metadata.src_node_id)  # fmt: skip
            pending.difference_update(m.metadata.reply_to_message_id for m in pulled)
            if not pending:
                break
            time.sleep(self.poll)
        return replies


def _unpacked(reply: Message) -> Message:
    """``reply`` with its packed arrays unpacked; an error reply in its place when they
    cannot be (a broken or hostile client: its reply is lost, nobody else's)."""
    if not reply.has_content() or not is_packed(reply.content):
        return reply
    try:
        reply.content = unpack_content(reply.content)
    except PackingError as exc:
        from logging import WARNING

        from flwr.app import Error
        from flwr.app.message.message import make_message
        from flwr.common.constant import ErrorCode
        from flwr.common.logger import log

        log(WARNING, "pflarena: the reply of node %d is unreadable: %s",
            reply.metadata.src_node_id, exc)  # fmt: skip
        return make_message(
            reply.metadata, error=Error(ErrorCode.UNKNOWN, f"unreadable reply: {exc}")
        )
    return reply


#: First and longest wait (s) between the ServerApp's tries for a reply's objects.
REPLY_OBJECTS_INITIAL_S = 0.02
REPLY_OBJECTS_CAP_S = 0.1


def _prompt_reply_objects() -> None:
    """Make ``HttpGrid.pull_messages`` retry a reply's objects after 0.02 s, doubling to
    0.1 s, instead of Flower's 1 s doubling to 10 s.

    A node's reply is listed as soon as the node has pushed the message, before its objects
    have arrived; ``pull_messages`` then finds an object missing and waits Flower's pull
    back-off, which made the ServerApp see a reply 0.6 s (median) after the node had sent it.
    A flwr 1.41 internal (``http_grid.pull_objects``), checked: a release without it keeps
    Flower's back-off and says so."""
    import functools
    import inspect
    from logging import WARNING

    from flwr.common.logger import log
    from flwr.superlink.grid import http_grid

    pull = getattr(http_grid, "pull_objects", None)
    if isinstance(pull, functools.partial):
        return  # done in this process already
    params = inspect.signature(pull).parameters if callable(pull) else {}
    if not {"initial_backoff", "backoff_cap", "max_tries_per_object"} <= set(params):
        log(WARNING, "pflarena: this flwr's HttpGrid has no pull_objects back-off to set; "
            "replies' objects are retried on Flower's back-off")  # fmt: skip
        return
    # Bounded by Flower's time limit (PULL_MAX_TIME), not its 500 tries: at these waits they
    # would last 50 s, at Flower's over an hour (a node pushing a large reply over a slow link).
    http_grid.pull_objects = functools.partial(
        pull,
        initial_backoff=REPLY_OBJECTS_INITIAL_S,
        backoff_cap=REPLY_OBJECTS_CAP_S,
        max_tries_per_object=None,
    )


def prompt_grid(grid: Grid) -> Grid:
    """``grid`` wrapped in :class:`PromptGrid` when it is a deployment's Grid (Flower's
    ``HttpGrid``); other Grids (simulation) already poll every 0.1 s and are returned as
    they are. ``PFLARENA_REPLY_POLL_S=3`` restores Flower's interval, ``PFLARENA_PACK_ARRAYS=0``
    Flower's per-array objects."""
    from flwr.superlink.grid.http_grid import HttpGrid

    if not isinstance(grid, HttpGrid):
        return grid
    enable_trace()
    _prompt_reply_objects()
    value = os.environ.get(REPLY_POLL_ENV, "")
    try:
        poll = float(value) if value else DEFAULT_REPLY_POLL_S
    except ValueError:
        raise ValueError(f"{REPLY_POLL_ENV}={value!r} is not a number of seconds") from None
    if not 0.01 <= poll <= 60:
        raise ValueError(f"{REPLY_POLL_ENV}={value!r} must be between 0.01 and 60 seconds")
    pack = os.environ.get(PACK_ENV, "1").strip()
    if pack not in ("0", "1"):
        raise ValueError(f"{PACK_ENV}={pack!r} must be 0 or 1")
    return PromptGrid(grid, poll, pack=pack == "1")  # type: ignore[return-value]
