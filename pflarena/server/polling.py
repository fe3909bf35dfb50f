"""The deployment's Grid: replies collected promptly, the SuperLink's passing errors retried,
no exchange lost to a SuperLink restart, and any reply costing only its sender.

Flower 1.41's deployment Grid (``HttpGrid``) sleeps a fixed 3 s between two checks for
replies, so every exchange of a round ends up to 3 s after its last reply; the simulation's
``InMemoryGrid`` checks every 0.1 s. :class:`PromptGrid` wraps the deployment's Grid and runs
the same loop over Flower's ``push_messages`` and its own pull with a shorter interval
(:data:`REPLY_POLL_ENV`, default :data:`DEFAULT_REPLY_POLL_S`); everything else is the
wrapped Grid's. Each check is one small HTTP request to the SuperLink. A reply's objects are
retried on a short back-off too (:func:`_prompt_reply_objects`).

It also packs each outgoing message's arrays into one object per record and unpacks the
replies (:mod:`pflarena.core.packing`): a model of K tensors then crosses each hop in a few
requests instead of 2K + 3 (:data:`PACK_ENV` ``=0`` sends Flower's per-array tree).

**The SuperLink's passing errors** (:class:`SuperLinkRetries`). Flower retries a request that
fails by transport (the SuperLink restarting, a dropped link) or with 502-504, with a back-off
(1 s doubling to 20 s, jittered), without limit; a 500 it gives up at once, which ends the
run. A SuperLink whose SQLite state is locked by its own load answers 500 ("database is
locked"; its answer carries no detail to tell it from another 500), and a pushed object it
could not store with ``stored: false`` (on which Flower's push raises). The ServerApp retries a
500 as a 502, pushes the messages again when an object was not kept, and gives every request
(and the pushes) up after :data:`RETRY_ENV` seconds (default :data:`DEFAULT_RETRY_S`): the run
then fails with the SuperLink's error, and resumes.

**A SuperLink restart mid-exchange loses nothing.** The SuperLink hands a reply over once:
answering a pull, it deletes the message and its reply from its state before the answer
leaves, so a pull whose answer was lost (the SuperLink stopped, the connection dropped) has
taken those replies with it; and while it is down, a node may be marked unavailable or lose
the message it held. So when a request of the ServerApp has failed by transport or with
502-504 while an exchange is in flight, the exchange sends, once the SuperLink answers again,
a new copy of every message still without a reply (or whose reply is an error the SuperLink
made for it: the message or node unavailable), and takes the first reply to any copy. A
client's state makes the copy safe: it starts from the version the server accepted, as the
first did, and writes the same version (``client/state.py``), so the rounds are those of an
uninterrupted run; the price is one more message per client that had not replied. A 500 is
not such an interruption (the SuperLink answered, and a failed request changes nothing in its
state).

**Any reply costs only its sender.** Each reply is pulled, inflated, unpacked and checked on
its own; whatever exception that raises (Flower's inflation of the node's objects, a packed
record that is broken or hostile, a reply whose metadata names another message or node)
becomes an error reply from that node, with the reason, recorded as any failed client. Only
the SuperLink's own failures (beyond the retries) end the run.
"""

from __future__ import annotations

import os
import reprlib
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from typing import Any

import httpx
from flwr.app import Error, Message, Metadata
from flwr.app.message import make_message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid

from pflarena.core.packing import is_packed, pack_content, unpack_content
from pflarena.core.trace import enable_trace, tracing

__all__ = [
    "DEFAULT_REPLY_POLL_S",
    "DEFAULT_RETRY_S",
    "PACK_ENV",
    "REPLY_POLL_ENV",
    "RETRY_ENV",
    "PromptGrid",
    "SuperLinkRetries",
    "prompt_grid",
]

#: Environment variable of the ServerApp process: seconds between checks for replies.
REPLY_POLL_ENV = "PFLARENA_REPLY_POLL_S"
DEFAULT_REPLY_POLL_S = 0.1
#: Environment variable of the ServerApp process: ``0`` sends messages' arrays as Flower's
#: per-array objects instead of packed (:mod:`pflarena.core.packing`).
PACK_ENV = "PFLARENA_PACK_ARRAYS"
#: Environment variable of the ServerApp process: seconds a request to the SuperLink is
#: retried (a 500, 502-504, no connection) before the run fails with its error.
RETRY_ENV = "PFLARENA_SUPERLINK_RETRY_S"
DEFAULT_RETRY_S = 300.0
#: The first and longest waits between two pushes of an exchange's messages whose objects
#: the SuperLink did not keep (Flower's back-off for its own retries: 1 s doubling to 20 s).
RETRY_FIRST_WAIT_S = 1.0
RETRY_LONGEST_WAIT_S = 20.0
#: A SuperLink that answers 500 is retried as Flower retries 502-504 (flwr 1.41's
#: ``http_retry._RETRYABLE_STATUS_CODES``).
SERVER_ERROR = 500
#: The answers that mean the SuperLink could not be reached (a gateway's): an interruption.
GATEWAY_ERRORS = frozenset({502, 503, 504})
#: The errors the SuperLink makes for a message it could not deliver or whose reply it
#: could not hand over (``src_node_id`` is the SuperLink's): not the client's answer.
UNDELIVERED = frozenset(
    {ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE, ErrorCode.NODE_UNAVAILABLE}
)
#: The longest reason an error reply carries from an exception (a hostile reply's may be long).
REASON_CHARS = 300
_reasons = reprlib.Repr()
_reasons.maxstring = REASON_CHARS


# --------------------------------------------------------------------------- retries
class SuperLinkRetries:
    """The retries of the ServerApp's requests to the SuperLink, on the Grid's own
    ``RetryInvoker`` (every request of the Grid, its task heartbeat included, goes through
    it): a 500 retried as Flower retries 502-504 and transport errors, every request given
    up after ``limit_s`` seconds, and each interruption (a transport error or a 502-504,
    from any thread) counted, so that an exchange knows the SuperLink may have lost some of
    its messages or replies.
    """

    def __init__(self, invoker: Any, limit_s: float) -> None:
        self.limit_s = limit_s
        self._lock = threading.Lock()
        self._interruptions = 0
        self._failing_since: float | None = None
        flower_giveup = invoker.should_giveup
        flower_backoff = invoker.on_backoff
        flower_success = invoker.on_success
        flower_on_giveup = invoker.on_giveup

        def should_giveup(exc: Exception) -> bool:
            if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == SERVER_ERROR:
                return False
            return bool(flower_giveup(exc)) if flower_giveup is not None else False

        def on_backoff(state: Any) -> None:
            self._failed(state.exception)
            if flower_backoff is not None:
                flower_backoff(state)

        def on_success(state: Any) -> None:
            with self._lock:
                self._failing_since = None
            if flower_success is not None:
                flower_success(state)

        def on_giveup(state: Any) -> None:
            if state.tries > 1 and _transient(state.exception):
                log(ERROR, "pflarena: the SuperLink failed for %.0f s (%s); giving up after "
                    "%s=%g s", state.elapsed_time, _describe(state.exception), RETRY_ENV,
                    limit_s)  # fmt: skip
            if flower_on_giveup is not None:
                flower_on_giveup(state)

        invoker.should_giveup = should_giveup
        invoker.on_backoff = on_backoff
        invoker.on_success = on_success
        invoker.on_giveup = on_giveup
        invoker.max_time = limit_s
        invoker._pflarena_retries = self

    @classmethod
    def install(cls, grid: Any, limit_s: float) -> SuperLinkRetries:
        """These retries on ``grid``'s invoker (Flower's ``HttpGrid._retry_invoker``); once
        per invoker."""
        invoker = grid._retry_invoker
        existing = getattr(invoker, "_pflarena_retries", None)
        if isinstance(existing, cls):
            return existing
        return cls(invoker, limit_s)

    @property
    def interruptions(self) -> int:
        """How many times a request has failed by transport or with 502-504 so far."""
        with self._lock:
            return self._interruptions

    def _failed(self, exc: BaseException | None) -> None:
        interruption = exc is not None and _interrupts(exc)
        with self._lock:
            first = self._failing_since is None
            if first:
                self._failing_since = time.monotonic()
            if interruption:
                self._interruptions += 1
        if first:
            log(WARNING, "pflarena: the SuperLink failed (%s); retrying for up to %g s (%s)",
                _describe(exc), self.limit_s, RETRY_ENV)  # fmt: skip


def _interrupts(exc: BaseException) -> bool:
    """Whether ``exc`` means the SuperLink was not reached (or its answer was lost)."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code in GATEWAY_ERRORS
    return isinstance(exc, httpx.TransportError)


def _transient(exc: BaseException | None) -> bool:
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code in GATEWAY_ERRORS | {SERVER_ERROR}
    return isinstance(exc, httpx.TransportError)


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return _reasons.repr(f"{type(exc).__name__}: {exc}").strip("'\"")


# --------------------------------------------------------------------------- the Grid
class PromptGrid:
    """``grid`` (Flower's ``HttpGrid``) with a ``send_and_receive`` that checks for replies
    every ``poll`` seconds and sends again what a SuperLink interruption may have lost, a
    pull that turns any unreadable reply into its sender's error reply, (``pack``) messages
    whose arrays travel packed, and (``retry_s``) the SuperLink's passing errors retried for
    that long (the module docstring)."""

    def __init__(
        self, grid: Grid, poll: float, *, pack: bool = False, retry_s: float = DEFAULT_RETRY_S
    ) -> None:
        from flwr.superlink.grid.http_grid import HttpGrid

        _check_flower_internals()
        self._grid = grid
        self.poll = poll
        self.pack = pack
        #: Flower's HttpGrid (set up): each reply pulled on its own; another Grid (a test's
        #: stand-in) is pulled through its own ``pull_messages``, each reply then checked
        self._http = isinstance(grid, HttpGrid) and hasattr(grid, "_retry_invoker")
        self.retries = SuperLinkRetries.install(grid, retry_s) if self._http else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Flower's ``push_messages``, the arrays packed on the wire: each message's content
        is packed for the push and given back afterwards (its id is the packed one's, which
        the replies name)."""
        messages = list(messages)
        if not self.pack:
            return self._push(messages)
        originals = [m.content if m.has_content() else None for m in messages]
        try:
            for message, content in zip(messages, originals, strict=True):
                if content is not None:
                    message.content = pack_content(content)
            return self._push(messages)
        finally:
            for message, content in zip(messages, originals, strict=True):
                if content is not None:
                    message.content = content

    def _push(self, messages: list[Message]) -> list[str]:
        """Flower's ``push_messages``, done again while the SuperLink answers that it did
        not keep an object (``stored: false``, what a SuperLink whose SQLite state is locked
        answers a pushed object): within the retry time limit, on Flower's back-off. The
        messages are the same (their ids too), so the SuperLink takes them as the same and
        asks only for the objects it lacks."""
        from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

        start = time.monotonic()
        wait = RETRY_FIRST_WAIT_S
        while True:
            try:
                return list(self._grid.push_messages(messages))
            except ObjectPushError as exc:
                limit_s = self.retries.limit_s if self.retries is not None else 0.0
                left = limit_s - (time.monotonic() - start)
                if left <= 0:
                    log(ERROR, "pflarena: the SuperLink did not keep the objects pushed for "
                        "%g s (%s); giving up", limit_s, RETRY_ENV)  # fmt: skip
                    raise
                log(WARNING, "pflarena: the SuperLink did not keep an object pushed (%s); "
                    "pushing the messages again in %.1f s", exc, min(wait, left))  # fmt: skip
                time.sleep(min(wait, left))
                wait = min(2 * wait, RETRY_LONGEST_WAIT_S)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Flower's ``HttpGrid.pull_messages``, each reply on its own: pulled, inflated,
        unpacked and checked; one that fails any of these becomes an error reply from its
        node. The SuperLink's own failures (after :class:`SuperLinkRetries`) are raised."""
        from flwr.proto.runtime_pb2 import PullAppMessagesRequest

        ids = list(message_ids)
        if not self._http:
            return [_checked_reply(reply) for reply in self._grid.pull_messages(ids)]
        try:
            res = self._grid._runtime_client.PullMessages(PullAppMessagesRequest(message_ids=ids))
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == httpx.codes.REQUEST_ENTITY_TOO_LARGE:
                log(ERROR, "pflarena: the SuperLink refused a pull of %d replies as too large",
                    len(ids))  # fmt: skip
                return []
            raise
        if len(res.messages_list) != len(res.message_object_trees):
            raise RuntimeError(
                f"the SuperLink answered a pull with {len(res.messages_list)} replies and "
                f"{len(res.message_object_trees)} object trees"
            )
        return [
            self._received(proto, tree)
            for proto, tree in zip(res.messages_list, res.message_object_trees, strict=True)
        ]

    def _received(self, proto: Any, tree: Any) -> Message:
        """One reply: its objects pulled and confirmed, then inflated and checked."""
        from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest
        from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
        from flwr.supercore.inflatable.inflatable_protobuf_utils import (
            make_pull_object_fn_protobuf,
        )
        from flwr.supercore.inflatable.inflatable_utils import (
            ObjectPullError,
            inflate_object_from_contents,
        )
        from flwr.superlink.grid import http_grid

        grid = self._grid
        run_id = grid._run.run_id
        client = grid._runtime_client
        reply_to = proto.metadata.reply_to_message_id
        node = proto.metadata.src_node_id
        failure: Exception | None = None
        try:
            object_ids = [t.object_id for t in iterate_object_tree(tree)]
            contents = http_grid.pull_objects(
                object_ids=object_ids,
                pull_object_fn=make_pull_object_fn_protobuf(
                    pull_object_protobuf=client.PullObject, node=grid.node, run_id=run_id
                ),
            )
        except ObjectPullError as exc:  # as Flower: the objects never (all) arrived
            return _error_reply(
                run_id, reply_to, SUPERLINK_NODE_ID, ErrorCode.MESSAGE_UNAVAILABLE,
                f"Reply message objects are unavailable: {exc}",
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a reply's objects cost only its sender
            if _superlinks_own(exc):
                raise
            failure = exc
        client.ConfirmMessageReceived(
            ConfirmMessageReceivedRequest(
                node=grid.node, run_id=run_id, message_object_id=proto.metadata.message_id
            )
        )
        if failure is not None:
            return self._unreadable(run_id, reply_to, node, failure)
        try:
            return _checked(inflate_object_from_contents(proto.metadata.message_id, contents),
                            proto.metadata.message_id, reply_to, node)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - whatever a reply's bytes do, only its sender pays
            return self._unreadable(run_id, reply_to, node, exc)

    def _unreadable(self, run_id: int, reply_to: str, node: int, exc: BaseException) -> Message:
        reason = f"unreadable reply: {type(exc).__name__}: {_reasons.repr(str(exc))[1:-1]}"
        log(WARNING, "pflarena: the reply of node %d is unreadable: %s", node, reason)
        return _error_reply(run_id, reply_to, node, ErrorCode.UNKNOWN, reason)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push ``messages`` and pull their replies until all came or ``timeout`` passed
        (Flower's ``HttpGrid.send_and_receive`` with ``poll`` instead of 3 s), sending again,
        after each interruption of the SuperLink, what had no reply (the module docstring).
        The replies answer the messages given (``reply_to_message_id``), in their order."""
        exchange = _Exchange(list(messages))
        trace = tracing()
        pushed = time.time()
        exchange.sent(exchange.messages, list(self.push_messages(exchange.messages)))
        seen = self._interruptions()
        if trace:
            log(INFO, "pflarena trace: pushed %d messages in %.3f s: %s", len(exchange.waiting),
                time.time() - pushed, " ".join(sorted(exchange.waiting)))  # fmt: skip
        end = time.time() + (timeout if timeout is not None else 0.0)
        while exchange.waiting and (timeout is None or time.time() < end):
            pulled = list(self.pull_messages(list(exchange.waiting)))
            for reply in pulled:
                if trace:
                    log(INFO, "pflarena trace: reply to %s from node %d",
                        reply.metadata.reply_to_message_id, reply.metadata.src_node_id)  # fmt: skip
                exchange.receive(reply)
            if (now := self._interruptions()) != seen:
                seen = now
                self._send_again(exchange)
            if exchange.waiting:
                time.sleep(self.poll)
        return exchange.replies()

    def _interruptions(self) -> int:
        return self.retries.interruptions if self.retries is not None else 0

    def _send_again(self, exchange: _Exchange) -> None:
        """A copy of every message of ``exchange`` without a reply from its client."""
        originals = exchange.unanswered()
        if not originals:
            return
        copies = [
            Message(
                content=m.content,
                dst_node_id=m.metadata.dst_node_id,
                message_type=m.metadata.message_type,
                ttl=m.metadata.ttl,
                group_id=m.metadata.group_id,
            )
            for m in originals
        ]
        log(WARNING, "pflarena: the SuperLink was interrupted during an exchange; sending "
            "%d of its %d messages again (those without a reply)", len(copies),
            len(exchange.messages))  # fmt: skip
        exchange.sent(originals, list(self.push_messages(copies)))


def _checked(reply: Any, message_id: str, reply_to: str, node: int) -> Message:
    """The inflated ``reply``, checked against what the SuperLink says it is (the message it
    answers, its node), its packed arrays unpacked.

    Raises
    ------
    Exception
        Anything the checks or the unpacking raise (:class:`~pflarena.core.packing.PackingError`
        and whatever a hostile object makes Flower's classes raise).
    """
    if not isinstance(reply, Message):
        raise TypeError(f"its root object is a {type(reply).__name__}, not a Message")
    reply.metadata.__dict__["_message_id"] = message_id
    if (reply.metadata.reply_to_message_id, reply.metadata.src_node_id) != (reply_to, node):
        raise ValueError("its metadata names another message or node than the SuperLink's")
    if reply.has_content() and is_packed(reply.content):
        reply.content = unpack_content(reply.content)
    return reply


def _checked_reply(reply: Any) -> Any:
    """A reply a Grid other than Flower's HttpGrid pulled, its packed arrays unpacked; an
    error reply from its node when they cannot be."""
    if not isinstance(reply, Message) or not reply.has_content() or not is_packed(reply.content):
        return reply
    try:
        reply.content = unpack_content(reply.content)
    except Exception as exc:  # noqa: BLE001 - whatever a reply's bytes do, only its sender pays
        reason = f"unreadable reply: {type(exc).__name__}: {_reasons.repr(str(exc))[1:-1]}"
        log(WARNING, "pflarena: the reply of node %d is unreadable: %s",
            reply.metadata.src_node_id, reason)  # fmt: skip
        return make_message(reply.metadata, error=Error(ErrorCode.UNKNOWN, reason))
    return reply


def _superlinks_own(exc: BaseException) -> bool:
    """Whether ``exc`` is the SuperLink's failure (left after the retries), not a reply's."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500 or exc.response.status_code in (401, 403)
    return isinstance(exc, httpx.TransportError)


def _error_reply(run_id: int, reply_to: str, src: int, code: int, reason: str) -> Message:
    metadata = Metadata(
        run_id=run_id,
        message_id="",
        src_node_id=src,
        dst_node_id=SUPERLINK_NODE_ID,
        reply_to_message_id=reply_to,
        group_id="",
        created_at=time.time(),
        ttl=0,
        message_type="system",
    )
    return make_message(metadata, error=Error(code=code, reason=reason))


def _undelivered(reply: Message) -> bool:
    """An error the SuperLink made because the message or reply could not be handed over."""
    return isinstance(reply, Message) and reply.has_error() and reply.error.code in UNDELIVERED


@dataclass
class _Exchange:
    """The messages of one ``send_and_receive`` and the copies sent of them: which message
    each pushed id stands for, and the answer each message has so far."""

    messages: list[Message]
    #: pushed id -> index of the message it is (or copies); index -> the message's own id
    slot_of: dict[str, int] = field(default_factory=dict)
    first_id: dict[int, str] = field(default_factory=dict)
    #: the ids still waited for (in the order they were pushed)
    waiting: dict[str, None] = field(default_factory=dict)
    #: index -> the client's reply; index -> the SuperLink's error for it (until a reply)
    answers: dict[int, Message] = field(default_factory=dict)
    errors: dict[int, Message] = field(default_factory=dict)

    def sent(self, originals: list[Message], ids: list[str]) -> None:
        index = {id(m): i for i, m in enumerate(self.messages)}
        for message, mid in zip(originals, ids, strict=False):
            if mid:
                self.slot_of[mid] = index[id(message)]
                self.first_id.setdefault(index[id(message)], mid)
                self.waiting[mid] = None

    def receive(self, reply: Message) -> None:
        mid = reply.metadata.reply_to_message_id
        slot = self.slot_of.get(mid)
        if slot is None or mid not in self.waiting:
            return  # not asked for (a SuperLink's slip), or already answered
        del self.waiting[mid]
        if slot in self.answers:
            return  # a copy's late reply: the first one counts
        if mid != self.first_id[slot]:  # a copy's: it answers the message given
            reply.metadata.__dict__["_reply_to_message_id"] = self.first_id[slot]
        if _undelivered(reply):
            self.errors[slot] = reply
            return
        self.answers[slot] = reply
        for other in [m for m, s in self.slot_of.items() if s == slot and m in self.waiting]:
            del self.waiting[other]

    def unanswered(self) -> list[Message]:
        """The messages (once each) with no reply from their client yet."""
        sent = set(self.slot_of.values())
        return [m for i, m in enumerate(self.messages) if i in sent and i not in self.answers]

    def replies(self) -> list[Message]:
        """The clients' replies, and the SuperLink's errors where a message has none, in the
        messages' order."""
        return [
            self.answers.get(i) or self.errors[i]
            for i in range(len(self.messages))
            if i in self.answers or i in self.errors
        ]


# --------------------------------------------------------------------------- set-up
#: What :class:`PromptGrid` uses of flwr 1.41 beside its public API (checked at start).
_FLOWER_INTERNALS = {
    "flwr.superlink.grid.http_grid": ("HttpGrid", "pull_objects"),
    "flwr.supercore.inflatable.inflatable_object": ("iterate_object_tree",),
    "flwr.supercore.inflatable.inflatable_protobuf_utils": ("make_pull_object_fn_protobuf",),
    "flwr.supercore.inflatable.inflatable_utils": (
        "ObjectPullError",
        "inflate_object_from_contents",
    ),
    "flwr.proto.runtime_pb2": ("PullAppMessagesRequest",),
    "flwr.proto.message_pb2": ("ConfirmMessageReceivedRequest",),
}
_GRID_INTERNALS = ("_retry_invoker", "_runtime_client", "_run", "node")


def _check_flower_internals() -> None:
    """Fail, naming what moved, when the installed flwr lacks what the Grid leans on."""
    import flwr

    from pflarena.core.internals import missing_internals

    if missing := missing_internals(_FLOWER_INTERNALS):
        raise RuntimeError(
            f"flwr {flwr.__version__} lacks {', '.join(missing)} (as in flwr 1.41): "
            "pflarena's deployment Grid cannot pull replies one by one"
        )


#: First and longest wait (s) between the ServerApp's tries for a reply's objects.
REPLY_OBJECTS_INITIAL_S = 0.02
REPLY_OBJECTS_CAP_S = 0.1


def _prompt_reply_objects() -> None:
    """Make the reply pulls retry a reply's objects after 0.02 s, doubling to 0.1 s, instead
    of Flower's 1 s doubling to 10 s.

    A node's reply is listed as soon as the node has pushed the message, before its objects
    have arrived; ``pull_messages`` then finds an object missing and waits Flower's pull
    back-off, which made the ServerApp see a reply 0.6 s (median) after the node had sent it.
    A flwr 1.41 internal (``http_grid.pull_objects``), checked: a release without it keeps
    Flower's back-off and says so."""
    import functools
    import inspect

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


def _seconds(name: str, default: float, low: float, high: float) -> float:
    value = os.environ.get(name, "").strip()
    try:
        seconds = float(value) if value else default
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number of seconds") from None
    if not low <= seconds <= high:
        raise ValueError(f"{name}={value!r} must be between {low:g} and {high:g} seconds")
    return seconds


def prompt_grid(grid: Grid) -> Grid:
    """``grid`` wrapped in :class:`PromptGrid` when it is a deployment's Grid (Flower's
    ``HttpGrid``); other Grids (simulation) already poll every 0.1 s and are returned as
    they are. ``PFLARENA_REPLY_POLL_S=3`` restores Flower's interval, ``PFLARENA_PACK_ARRAYS=0``
    Flower's per-array objects, ``PFLARENA_SUPERLINK_RETRY_S`` bounds the retries."""
    # A Grid of a module not imported is not one: the simulation's Grids spare the import of
    # Flower's HTTP Grid (its LinkState and object store: about half a second).
    http_grid = sys.modules.get("flwr.superlink.grid.http_grid")
    if http_grid is None or not isinstance(grid, http_grid.HttpGrid):
        return grid
    enable_trace()
    _prompt_reply_objects()
    poll = _seconds(REPLY_POLL_ENV, DEFAULT_REPLY_POLL_S, 0.01, 60)
    retry_s = _seconds(RETRY_ENV, DEFAULT_RETRY_S, 1, 7 * 24 * 3600)
    pack = os.environ.get(PACK_ENV, "1").strip()
    if pack not in ("0", "1"):
        raise ValueError(f"{PACK_ENV}={pack!r} must be 0 or 1")
    return PromptGrid(grid, poll, pack=pack == "1", retry_s=retry_s)  # type: ignore[return-value]
