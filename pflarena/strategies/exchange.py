"""One send-and-receive within a round: :class:`Exchange` (what went out, what came back,
what was used), :data:`Send` (how a strategy's round sends one) and :func:`direct_send`
(a ``Send`` straight over a Flower Grid), with the size and error readings they record.

The run loop (:mod:`pflarena.server.loop`) gives a strategy its ``send``; a strategy
(:class:`~pflarena.strategies.base.PflStrategy`, which re-exports these names) fills an
exchange's ``rejected`` and ``problems``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from flwr.app import Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from pflarena.core.array_decoding import array_buffer

__all__ = [
    "EXPIRED",
    "NO_REPLY",
    "Exchange",
    "Send",
    "direct_send",
    "record_nbytes",
    "reply_error",
]


def record_nbytes(content: RecordDict) -> int:
    """Serialized size of the arrays in a message (what dominates the traffic)."""
    return sum(
        len(array_buffer(array))
        for record in content.array_records.values()
        for array in record.values()
    )


NO_REPLY = "no reply within the round timeout"
#: Flower's error replies for a message whose time to live (the round timeout) ran out at the
#: SuperLink before its node answered: in a deployment the ServerApp receives one of these
#: where the in-process and simulation engines have no reply at all. The same problem.
EXPIRED = frozenset({ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE})


def reply_error(reply: Message) -> str:
    """The problem an error reply records: :data:`NO_REPLY` where its message expired."""
    return NO_REPLY if reply.error.code in EXPIRED else f"error: {reply.error.reason}"


@dataclass
class Exchange:
    """One send-and-receive within a round: what went out, what came back, what was used.

    ``rejected`` holds the nodes whose reply arrived but was unusable; the strategy fills
    it (:meth:`PflStrategy.valid_replies`). The run loop writes :meth:`stats` into the
    round's ``rounds.jsonl`` line.
    """

    name: str
    messages: list[Message]
    replies: list[Message]
    rejected: list[int] = field(default_factory=list)
    #: why each rejected reply was unusable, by node
    problems: dict[int, str] = field(default_factory=dict)
    #: the state version the clients' writes become (set by the run loop; see
    #: client/state.py); a usable reply makes it the client's accepted version
    update_id: int | None = None

    def node_of(self, reply: Message) -> int:
        """The node a reply answers for.

        An error reply Flower makes for a node that went away comes from the SuperLink,
        so the node is found through the message the reply answers.
        """
        return self._destinations.get(
            reply.metadata.reply_to_message_id, reply.metadata.src_node_id
        )

    @cached_property
    def _destinations(self) -> dict[str, int]:
        return {m.metadata.message_id: m.metadata.dst_node_id for m in self.messages}

    @property
    def errors(self) -> list[int]:
        """Nodes that answered with an error."""
        return [self.node_of(m) for m in self.replies if m.has_error()]

    @property
    def missing(self) -> list[int]:
        """Nodes that did not answer at all (within the timeout)."""
        answered = {self.node_of(m) for m in self.replies}
        return [
            m.metadata.dst_node_id for m in self.messages if m.metadata.dst_node_id not in answered
        ]

    @property
    def failed(self) -> list[int]:
        """Nodes whose answer was missing, an error, or rejected."""
        return self.missing + self.errors + self.rejected

    def problem_of(self, node_id: int) -> str:
        """Why ``node_id`` failed in this exchange (empty if it did not)."""
        for reply in self.replies:
            if reply.has_error() and self.node_of(reply) == node_id:
                return reply_error(reply)
        if node_id in self.problems:
            return f"unusable reply: {self.problems[node_id]}"
        if node_id in self.missing:
            return NO_REPLY
        return ""

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "sent": len(self.messages),
            "failures": len(self.failed),
            "bytes_down": sum(record_nbytes(m.content) for m in self.messages),
            "bytes_up": sum(record_nbytes(m.content) for m in self.replies if not m.has_error()),
        }


#: ``send(name, messages) -> Exchange``: one exchange, named for the results.
Send = Callable[[str, list[Message]], Exchange]


def direct_send(grid: Grid, timeout: float | None) -> Send:
    """A :data:`Send` straight over ``grid`` (what Flower's ``Strategy.start`` path uses)."""

    def send(name: str, messages: list[Message]) -> Exchange:
        replies = list(grid.send_and_receive(messages, timeout=timeout)) if messages else []
        return Exchange(name, messages, replies)

    return send
