"""``pflarena supernode``: Flower's SuperNode with waits that follow the work, running
approved apps only.

flwr 1.41's SuperNode loop (``flwr/supernode/start_client_internal.py``) waits in three places
no flag or environment variable sets:

* it sleeps a hard-coded 3 s whenever it asks the SuperLink for a message and finds none, so
  a message waits 1.5 s on average (3 s at worst) before its node sees it;
* when a message's objects are not yet on the SuperLink (the ServerApp pushes them after the
  message), it tries again after Flower's pull back-off: 1 s, doubling up to 10 s;
* while its ClientApp works, it checks for the reply every 0.5 s (and, sending it, for each
  of the reply's objects), so a reply waits 0.25 s on average before it leaves.

``pflarena supernode --active-poll A [--idle-poll I] [--active-window W] <flower-supernode
flags>`` runs ``flower-supernode`` with those waits following the work
(:class:`~pflarena.deploy.waits.ActivityPoll`): for ``W`` seconds after each message (default
30) it asks for the next one every ``A`` seconds, then doubles its wait per empty poll up to
``I`` (default Flower's 3 s), so an idle node costs what it costs today; a message's objects
are fetched after 0.02 s, doubling to 0.1 s (for as long as Flower's time bound, 2 h, allows;
not its 500 tries, which at these waits would end after 50 s); a reply is checked for every
0.02 s. ``--idle-poll
S`` alone makes the first two waits a fixed ``S`` seconds (the back-off starts at and is
capped at ``S``). Without these flags it is ``flower-supernode`` itself, kept alive: a 500
from the SuperLink is retried, and a node that can no longer serve (its loop or its heartbeat
ended) exits with status 1 instead of running on unseen, for its supervisor to start it again
(:mod:`pflarena.deploy.liveness`).

``--app-signing-public-key KEY.pub`` (repeatable) makes the node run only apps the operator
signed (:mod:`pflarena.deploy.approval`): the FAB of every new run is checked before the node
stores the run or creates a task for it, and an app that is not approved gets Flower's
``INVALID_FAB`` error reply (what ``--trusted-entities`` replies for a Hub app that fails its
check) and is never installed or imported; the node goes on serving approved runs. This
takes over Flower's FAB check (``_verify_fab`` in ``start_client_internal``), so it cannot
be combined with ``--trusted-entities``; :func:`check_fab_verification` fails, naming what
moved, if the installed flwr checks FABs differently.

Flower's loop holds one message at a time and waits for its reply without end, so a task that
ends without one (a ClientApp that dies before it pulls its message, no executor at all)
leaves the node heartbeating, listed online and sampled every round, answering nothing.
``pflarena supernode`` bounds that wait (:class:`ReplyWait`): it stops when the message's
ClientApp task has ended without a reply, when the message's time to live has passed, or after
``--reply-wait S`` (:data:`REPLY_WAIT_ENV`; default :data:`DEFAULT_REPLY_WAIT_S`, an hour),
then ends the task and sends Flower's ``CLIENT_APP_CRASHED`` error reply saying why, and asks
for the next message; :func:`check_reply_wait` fails, naming what moved, if the installed
flwr's loop holds its message differently.

Its Runtime API always serves within the request limits ``pflarena superlink`` has
(:mod:`pflarena.deploy.limits`, the same flags), and ``--listen-fd N`` serves it on a
listening socket the launcher bound (:mod:`pflarena.deploy.serving`).

The waits lean on Flower internals: :func:`check_loop_waits` fails, naming the file, when the
installed flwr's loop no longer has exactly one ``time.sleep(3)``, two ``time.sleep(0.5)`` and
its ``pull_objects``, so an upgrade cannot silently keep or drop the change
(``benchmarks/results/deployment.md`` measures what the waits cost and save).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pflarena.deploy.liveness import LOOP_ENDED, keep_node_alive, stopped_reason
from pflarena.deploy.waits import ActivityPoll, PollClock, enable_trace, tracing

__all__ = [
    "DEFAULT_REPLY_WAIT_S",
    "FLOWER_IDLE_SLEEP_S",
    "REPLY_WAIT_ENV",
    "ReplyWait",
    "bound_reply_wait",
    "check_fab_verification",
    "check_loop_waits",
    "check_reply_wait",
    "main",
    "patch_waits",
    "reply_wait_limit",
    "require_approved_apps",
]

#: The SuperNode's wait after an empty pull in flwr 1.41 (seconds).
FLOWER_IDLE_SLEEP_S = 3
#: Its wait between checks for a reply (and for a reply's object) in flwr 1.41 (seconds).
FLOWER_REPLY_SLEEP_S = 0.5
#: While active: the first and longest wait between tries for a message's objects, and the
#: wait between checks for a reply (seconds).
FETCH_INITIAL_S = 0.02
FETCH_CAP_S = 0.1
REPLY_CHECK_S = 0.02
_LOOP_MODULE = "flwr.supernode.start_client_internal"
_IDLE_LINE = f"time.sleep({FLOWER_IDLE_SLEEP_S})"
_REPLY_LINE = f"time.sleep({FLOWER_REPLY_SLEEP_S})"


def check_loop_waits() -> ModuleType:
    """The SuperNode loop's module, after checking its waits are flwr 1.41's: exactly one
    ``time.sleep(3)``, two ``time.sleep(0.5)``, ``pull_objects`` and
    ``_pull_and_store_message``.

    Raises
    ------
    RuntimeError
        The installed flwr's loop differs (an upgrade): the patch would do nothing or too much.
    """
    module = importlib.import_module(_LOOP_MODULE)
    source = inspect.getsource(module)
    idle, reply = source.count(_IDLE_LINE), source.count(_REPLY_LINE)
    names = ("time", "pull_objects", "_pull_and_store_message")
    if idle != 1 or reply != 2 or not all(hasattr(module, n) for n in names):
        import flwr

        raise RuntimeError(
            f"flwr {flwr.__version__}: {module.__file__} has {idle} `{_IDLE_LINE}` and {reply} "
            f"`{_REPLY_LINE}` (expected 1 and 2, as in flwr 1.41); pflarena supernode cannot set "
            "the SuperNode's waits. Run it without --active-poll/--idle-poll."
        )
    return module


def patch_waits(
    idle_s: float = FLOWER_IDLE_SLEEP_S,
    active_s: float | None = None,
    window_s: float = 30.0,
) -> ActivityPoll:
    """Set the waits of this process's SuperNode loop (the module docstring): adaptive with
    ``active_s``; a fixed ``idle_s`` without. Returns the poll the loop asks."""
    if not 0.01 <= idle_s <= 60:
        raise ValueError(f"--idle-poll {idle_s:g}: choose 0.01 to 60 seconds")
    module = check_loop_waits()
    if active_s is None:
        poll = ActivityPoll(idle_s, idle_s, 0.0, "supernode")
        module.time = PollClock(poll, FLOWER_IDLE_SLEEP_S)
        fetch = {"initial_backoff": idle_s, "backoff_cap": idle_s}
    else:
        if not 0.01 <= active_s <= idle_s:
            raise ValueError(f"--active-poll {active_s:g}: choose 0.01 to --idle-poll {idle_s:g}")
        poll = ActivityPoll(active_s, idle_s, window_s, "supernode")
        module.time = PollClock(poll, FLOWER_IDLE_SLEEP_S, FLOWER_REPLY_SLEEP_S, REPLY_CHECK_S)
        fetch = {"initial_backoff": FETCH_INITIAL_S, "backoff_cap": FETCH_CAP_S}
    # Bounded by Flower's time limit (PULL_MAX_TIME), not its 500 tries: at these waits they
    # would last 50 s, where Flower's last over an hour (a large model over a slow link).
    fetch["max_tries_per_object"] = None
    module.pull_objects = functools.partial(module.pull_objects, **fetch)
    pull_and_store = module._pull_and_store_message

    @functools.wraps(pull_and_store)
    def pull_and_store_noting_work(*args: Any, **kwargs: Any) -> Any:
        run_id = pull_and_store(*args, **kwargs)
        if run_id is not None:  # a message came: the next may follow soon
            poll.touch()
        return run_id

    module._pull_and_store_message = pull_and_store_noting_work
    return poll


#: The key Flower's FAB check looks up in its trusted entities; ours stands for the operator.
_APPROVAL_ENTITY = "pflarena-operator"


def check_fab_verification() -> ModuleType:
    """The SuperNode loop's module, after checking it verifies FABs as flwr 1.41 does.

    Raises
    ------
    RuntimeError
        ``_pull_and_store_message`` (with ``get_fab`` and ``trusted_entities`` arguments),
        ``_verify_fab`` or the ``valid_license`` check is gone: approvals could not be enforced.
    """
    module = importlib.import_module(_LOOP_MODULE)
    problems = []
    pull = getattr(module, "_pull_and_store_message", None)
    pull = inspect.unwrap(pull) if pull is not None else None  # Flower's, under our wrappers
    if pull is None:
        problems.append("_pull_and_store_message")
    else:
        params = inspect.signature(pull).parameters
        problems += [f"_pull_and_store_message({p}=...)" for p in ("get_fab", "trusted_entities")
                     if p not in params]  # fmt: skip
        source = inspect.getsource(pull)
        if "valid_license" not in source or "_verify_fab(" not in source:
            problems.append("_pull_and_store_message's FAB verification")
    if not callable(getattr(module, "_verify_fab", None)):
        problems.append("_verify_fab")
    if problems:
        import flwr

        raise RuntimeError(
            f"flwr {flwr.__version__}: {module.__file__} lacks {', '.join(problems)} (as in flwr "
            "1.41); pflarena supernode --app-signing-public-key cannot enforce approvals"
        )
    return module


def require_approved_apps(public_key_files: Sequence[str]) -> None:
    """Make this process's SuperNode run only apps approved with one of the keys in
    ``public_key_files`` (:func:`pflarena.deploy.approval.verify_fab`)."""
    from logging import ERROR, INFO

    from flwr.common.logger import log

    from pflarena.deploy.approval import load_public_keys, verify_fab

    keys = load_public_keys(public_key_files)
    module = check_fab_verification()
    pull_and_store = module._pull_and_store_message

    def verify(fab: Any, trusted_entities: Any) -> bool:
        ok, reason = verify_fab(fab.content, keys)
        log(INFO if ok else ERROR, "pflarena supernode: app %s %s", fab.hash_str[:12],
            reason if ok else f"refused: {reason}")  # fmt: skip
        return ok

    @functools.wraps(pull_and_store)
    def checked_pull_and_store(*args: Any, **kwargs: Any) -> Any:
        get_fab = kwargs["get_fab"]

        def get_fab_for_check(fab_hash: str, run_id: int) -> Any:
            fab = get_fab(fab_hash, run_id)
            # Flower checks a FAB's signatures only once it is marked as checkable.
            fab.verifications = {"valid_license": _APPROVAL_ENTITY}
            return fab

        kwargs["get_fab"] = get_fab_for_check
        kwargs["trusted_entities"] = {_APPROVAL_ENTITY: ""}
        return pull_and_store(*args, **kwargs)

    module._verify_fab = verify
    module._pull_and_store_message = checked_pull_and_store
    log(INFO, "pflarena supernode: running apps approved with key(s) %s only", ", ".join(keys))


# --------------------------------------------------------------------------- the reply wait
#: Environment variable: the longest the node waits for the reply to a message it holds (s).
REPLY_WAIT_ENV = "PFLARENA_SUPERNODE_REPLY_WAIT_S"
#: Its default (s): an hour. The TTL of pflarena's messages (the round timeout, 600 s by
#: default) ends the wait first; an hour is as long as ``pflarena executor`` lets a ClientApp
#: run (``--task-timeout``), and a twelfth of the 12 h TTL Flower gives a message by default,
#: so that another app's ServerApp that keeps it does not leave the node out for half a day.
DEFAULT_REPLY_WAIT_S = 3600.0
_REPLY_WAIT_LINE = "while not (reply_messages := state.get_messages_legacy(is_reply=True))"
_PULL_CALLS = ("state.create_task(", "state.store_message(message)")
_LOOP_CALLS = (
    r"_pull_and_store_message\(\s*state=state,\s*object_store=store,",
    r"_push_messages\(\s*state=state,\s*object_store=store,",
)
#: What the node's ClientApp task was doing when the wait ended without it (its status).
_TASK_DOING = {
    "pending": "no ClientApp executor took it",
    "starting": "a ClientApp took it and never began (it did not pull its input)",
    "running": "its ClientApp ran and did not reply",
}


def reply_wait_limit(value: str | None = None) -> float:
    """The node's limit on a wait for a reply (s): ``value`` (``--reply-wait``), else
    :data:`REPLY_WAIT_ENV`, else :data:`DEFAULT_REPLY_WAIT_S`.

    Raises
    ------
    ValueError
        Not a number of seconds, at least 1.
    """
    name, text = ("--reply-wait", value) if value is not None else (REPLY_WAIT_ENV, None)
    if text is None:
        text = os.environ.get(REPLY_WAIT_ENV, "").strip()
        if not text:
            return DEFAULT_REPLY_WAIT_S
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a number of seconds") from None
    if not seconds >= 1:
        raise ValueError(f"{name} {text!r} must be at least 1 second")
    return seconds


def check_reply_wait() -> ModuleType:
    """The SuperNode loop's module, after checking it holds one message at a time as flwr
    1.41's does: ``start_client_internal`` calls ``_pull_and_store_message`` and then
    ``_push_messages`` with ``state=state, object_store=store``; the first creates the task
    (``state.create_task``), then stores the message (``state.store_message``), the second
    waits on ``state.get_messages_legacy(is_reply=True)``; ``_insert_message`` stores a reply
    the node makes; a ``NodeState`` has the task calls the wait makes.

    Raises
    ------
    RuntimeError
        Any of these moved (an upgrade): the wait could not be bounded.
    """
    import re

    from flwr.supernode.nodestate import NodeState

    module = importlib.import_module(_LOOP_MODULE)
    problems = []
    loop = getattr(module, "start_client_internal", None)
    loop_source = inspect.getsource(loop) if loop is not None else ""
    for name, call in zip(("_pull_and_store_message", "_push_messages"), _LOOP_CALLS, strict=True):
        if not re.search(call, loop_source):
            problems.append(f"start_client_internal's call {name}(state=state, object_store=store)")
    pull = getattr(module, "_pull_and_store_message", None)
    pull_source = inspect.getsource(inspect.unwrap(pull)) if pull is not None else ""
    found = [pull_source.find(call) for call in _PULL_CALLS]
    if not 0 <= found[0] < found[1]:  # the task first: the message is noted with its task
        problems.append("_pull_and_store_message's state.create_task(...), then "
                        "state.store_message(message)")  # fmt: skip
    push = getattr(module, "_push_messages", None)
    if push is None or _REPLY_WAIT_LINE not in inspect.getsource(inspect.unwrap(push)):
        problems.append(f"_push_messages's `{_REPLY_WAIT_LINE}`")
    if not callable(getattr(module, "_insert_message", None)):
        problems.append("_insert_message")
    calls = ("get_tasks", "finish_task", "get_messages_legacy", "record_message_processing_start",
             "record_message_processing_end")  # fmt: skip
    problems += [f"NodeState.{c}" for c in calls if not callable(getattr(NodeState, c, None))]
    if problems:
        import flwr

        raise RuntimeError(
            f"flwr {flwr.__version__}: {module.__file__} lacks {'; '.join(problems)} (as in flwr "
            "1.41); pflarena supernode cannot bound its wait for a reply"
        )
    return module


@dataclass
class HeldMessage:
    """The message the node's loop stored for its ClientApp, the task it created for it, and
    when (``ReplyWait.now``) the message arrived."""

    message: Any
    task_id: int | None
    received: float


class _NotingState:
    """Flower's ``NodeState`` to one ``_pull_and_store_message``: notes the message it stores
    for the ClientApp and the task it creates (all else is the state's)."""

    def __init__(self, state: Any, now: Callable[[], float]) -> None:
        self._state = state
        self._now = now
        self.task_id: int | None = None
        self.held: HeldMessage | None = None

    def create_task(self, *args: Any, **kwargs: Any) -> Any:
        self.task_id = self._state.create_task(*args, **kwargs)
        return self.task_id

    def store_message(self, message: Any) -> Any:
        if not message.metadata.reply_to_message_id:  # not a reply the node makes itself
            self.held = HeldMessage(message, self.task_id, self._now())
        return self._state.store_message(message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


class _RepliesInHand:
    """Flower's ``NodeState`` to one ``_push_messages``: its ask for replies gets those the
    wait already took from the state (all else is the state's)."""

    def __init__(self, state: Any, replies: Sequence[Any]) -> None:
        self._state = state
        self._replies: Sequence[Any] | None = replies

    def get_messages_legacy(self, **kwargs: Any) -> Sequence[Any]:
        if self._replies is not None and kwargs == {"is_reply": True}:
            replies, self._replies = self._replies, None
            return replies
        return self._state.get_messages_legacy(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


@dataclass
class ReplyWait:
    """The node loop's wait for the reply to the message it holds (Flower's: without end).

    It checks for a reply as Flower does, sleeping ``sleep()`` between checks (Flower's 0.5 s,
    or the patched waits'), and stops when the message's ClientApp task has ended without a
    reply, or when the message's time to live has passed (counted from its arrival on this
    node's clock, so that a node whose clock is off does not give up early), or when
    ``limit_s`` has. It then ends the task (failed: its token revoked, so no late reply
    follows and no executor takes it again) and stores Flower's ``CLIENT_APP_CRASHED`` error
    reply, with a reason naming what happened, as Flower's node does for a ClientApp that
    stopped responding, for Flower's ``_push_messages`` to send; the loop then asks for the
    next message. A reply Flower itself stored meanwhile (a ClientApp that lapsed holding its
    message) goes instead.
    """

    limit_s: float
    sleep: Callable[[], None]
    insert_message: Callable[[Any, Any, Any], None]
    now: Callable[[], float] = time.monotonic
    held: HeldMessage | None = None

    def replies(self, state: Any, object_store: Any) -> Sequence[Any]:
        """The replies to send (taken from ``state``): once one is stored, or the error reply
        for the held message; none only when no message is held past the limit."""
        held, self.held = self.held, None
        started = self.now()
        while not (replies := state.get_messages_legacy(is_reply=True)):
            reason, task = self.stop_reason(state, held, started)
            if reason is not None:
                return self.give_up(state, object_store, held, task, reason)
            self.sleep()
        return replies

    def stop_reason(
        self, state: Any, held: HeldMessage | None, started: float
    ) -> tuple[str | None, Any]:
        """Why the wait ends now (``None``: it goes on), and the held message's task."""
        from flwr.common.constant import Status

        if held is None:  # no message held (cannot happen in flwr 1.41's loop)
            late = self.now() - started >= self.limit_s
            return (f"no reply within {self.limit_s:g} s" if late else None), None
        task = None
        if held.task_id is not None:
            found = state.get_tasks(task_ids=[held.task_id])
            task = found[0] if found else None
            if task is None or task.status.status == Status.FINISHED:
                how = f"{task.status.sub_status}: {task.status.details}" if task else "gone"
                return f"its ClientApp task ended without replying ({how.rstrip(': ')})", task
        waited = self.now() - held.received
        ttl = held.message.metadata.ttl
        if waited >= ttl:
            why = f"no reply within the message's time to live ({ttl:g} s)"
        elif waited >= self.limit_s:
            why = f"no reply within {self.limit_s:g} s (--reply-wait)"
        else:
            return None, task
        if task is not None:
            doing = _TASK_DOING.get(task.status.status, task.status.status)
            why += f"; its ClientApp task was {task.status.status}: {doing}"
        return why, task

    def give_up(
        self, state: Any, object_store: Any, held: HeldMessage | None, task: Any, reason: str
    ) -> Sequence[Any]:
        """End the held message's task and store the error reply for it (the docstring)."""
        from logging import WARNING

        from flwr.app import Error, Message
        from flwr.common.constant import ErrorCode, Status, SubStatus
        from flwr.common.logger import log

        if held is None:
            log(WARNING, "pflarena supernode: %s, and no message is held: the node asks for the "
                "next one", reason)  # fmt: skip
            return state.get_messages_legacy(is_reply=True)
        if task is not None and task.status.status != Status.FINISHED:
            state.finish_task(task.task_id, SubStatus.FAILED, f"pflarena supernode: {reason}")
        if replies := state.get_messages_legacy(is_reply=True):
            return replies  # Flower's own, stored as the task ended (or just before)
        message_id = held.message.metadata.message_id
        # Out of any ClientApp's reach; if none had taken it, its processing starts now.
        untaken = state.get_messages_legacy(run_ids=[held.message.metadata.run_id], is_reply=False)
        if any(m.metadata.message_id == message_id for m in untaken):
            state.record_message_processing_start(message_id)
        state.record_message_processing_end(message_id)
        error = Error(ErrorCode.CLIENT_APP_CRASHED, f"pflarena supernode: {reason}")
        reply = Message(error, reply_to=held.message)
        self.insert_message(reply, state, object_store)
        # Its objects: a ClientApp that pulled them deleted them (ConfirmMessageReceived).
        object_store.delete(message_id)
        log(WARNING, "pflarena supernode: message %s of run %s: %s; it gets an error reply, and "
            "the node serves on", message_id, held.message.metadata.run_id, reason)  # fmt: skip
        return state.get_messages_legacy(is_reply=True)


def bound_reply_wait(
    limit_s: float = DEFAULT_REPLY_WAIT_S,
    *,
    now: Callable[[], float] = time.monotonic,
    sleep: Callable[[], None] | None = None,
) -> ReplyWait:
    """Bound this process's SuperNode loop's wait for a reply (:class:`ReplyWait`): its
    ``_pull_and_store_message`` notes the message it holds, its ``_push_messages`` sends once
    the wait has a reply. ``sleep`` defaults to the loop's own ``time.sleep(0.5)`` (so the
    waits :func:`patch_waits` sets hold here too).

    Raises
    ------
    RuntimeError
        As :func:`check_reply_wait`.
    """
    module = check_reply_wait()
    if sleep is None:

        def sleep() -> None:
            module.time.sleep(FLOWER_REPLY_SLEEP_S)

    wait = ReplyWait(limit_s, sleep, module._insert_message, now)
    pull_and_store, push = module._pull_and_store_message, module._push_messages

    @functools.wraps(pull_and_store)
    def pull_and_store_noting(*args: Any, **kwargs: Any) -> Any:
        noting = _NotingState(kwargs["state"], wait.now)
        kwargs["state"] = noting
        run_id = pull_and_store(*args, **kwargs)
        wait.held = noting.held if run_id is not None else None
        return run_id

    @functools.wraps(push)
    def push_within_bound(*args: Any, **kwargs: Any) -> Any:
        replies = wait.replies(kwargs["state"], kwargs["object_store"])
        if not replies:
            return None
        kwargs["state"] = _RepliesInHand(kwargs["state"], replies)
        return push(*args, **kwargs)

    module._pull_and_store_message = pull_and_store_noting
    module._push_messages = push_within_bound
    return wait


def main(argv: Sequence[str] | None = None) -> None:
    """``pflarena supernode [--active-poll A] [--idle-poll I] [--active-window W]
    [--app-signing-public-key KEY.pub ...] [--reply-wait S] [--max-request-mb MB]
    [--max-unauthenticated-kb KB] [--request-timeout S] [--header-timeout S] [--listen-fd N]
    <flower-supernode flags>``.

    The loop's wait for a reply is bounded (:func:`bound_reply_wait`): ``--reply-wait S``
    (else :data:`REPLY_WAIT_ENV`, else :data:`DEFAULT_REPLY_WAIT_S`) is its limit.

    The Runtime API's server always keeps the request limits (:mod:`pflarena.deploy.limits`;
    the flags and defaults are ``pflarena superlink``'s); ``--listen-fd N`` serves it on the
    listening TCP socket inherited as descriptor ``N`` instead of binding
    ``--host``/``--port`` (:mod:`pflarena.deploy.serving`)."""
    from pflarena.deploy.private import private_umask
    from pflarena.deploy.serving import add_flags, install_supernode, serving_from_flags

    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--idle-poll", type=float, default=None)
    parser.add_argument("--active-poll", type=float, default=None)
    parser.add_argument("--active-window", type=float, default=30.0)
    parser.add_argument("--app-signing-public-key", action="append", default=[])
    parser.add_argument("--reply-wait", default=None)
    add_flags(parser)
    own, rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    try:
        serving, rest = serving_from_flags(own, rest)
        reply_wait_s = reply_wait_limit(own.reply_wait)
    except ValueError as exc:
        raise SystemExit(f"pflarena supernode: {exc}") from None
    # Flags refused before anything of Flower is patched in this process.
    if own.app_signing_public_key and any(
        a == "--trusted-entities" or a.startswith("--trusted-entities=") for a in rest
    ):
        raise SystemExit(
            "pflarena supernode: --app-signing-public-key replaces Flower's --trusted-entities "
            "check; give one of them"
        )
    enable_trace()
    try:
        keep_node_alive()
        if own.idle_poll is not None or own.active_poll is not None:
            idle = FLOWER_IDLE_SLEEP_S if own.idle_poll is None else own.idle_poll
            patch_waits(idle, own.active_poll, own.active_window)
        elif tracing():  # Flower's waits, counted for the trace
            check_loop_waits().time = PollClock(
                ActivityPoll(FLOWER_IDLE_SLEEP_S, FLOWER_IDLE_SLEEP_S, 0.0, "supernode"),
                FLOWER_IDLE_SLEEP_S,
            )
    except (RuntimeError, ValueError) as exc:
        raise SystemExit(f"pflarena supernode: {exc}") from None
    if own.app_signing_public_key:
        try:
            require_approved_apps(own.app_signing_public_key)
        except (RuntimeError, OSError) as exc:
            raise SystemExit(f"pflarena supernode: {exc}") from None
    try:
        bound_reply_wait(reply_wait_s)
        install_supernode(serving)
    except RuntimeError as exc:
        raise SystemExit(f"pflarena supernode: {exc}") from None
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["pflarena supernode", *rest]
    try:
        private_umask()  # its state and logs: the operator's alone (containers too)
        flower_supernode()
    except SystemExit:
        # Flower's graceful shutdown exits with 0; a node stopped for its heartbeat failed.
        if (reason := stopped_reason()) is not None:
            raise SystemExit(f"pflarena supernode: the heartbeat failed: {reason}") from None
        raise
    # Flower's loop returns only on an error, which its connection logs and swallows; with
    # --isolation process the Runtime API's server thread would keep this process alive,
    # serving nothing and unseen by the SuperLink. Exit now, whatever threads remain.
    print(f"pflarena supernode: {LOOP_ENDED}; exiting", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


if __name__ == "__main__":
    main()
