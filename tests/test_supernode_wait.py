"""The SuperNode loop's bounded wait for a reply (``pflarena/deploy/supernode.py``:
:class:`~pflarena.deploy.supernode.ReplyWait`).

Flower 1.41's loop holds one message and waits for its reply without end. Here Flower's own
``_pull_and_store_message`` and ``_push_messages`` run on a real NodeState, with the ClientApp
side played through Flower's Runtime API handlers (acquire the task, pull its input, pull the
message, finish the task), on one fake clock that drives both the wait and the NodeState's
task heartbeats. Then end to end: a real SuperLink, ``pflarena supernode`` and Flower's
SuperExec, whose ClientApp command exits before it pulls its message: the node answers that
round with an error reply and the next one with its ClientApp's.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.app.message import make_message
from flwr.app.metadata import Metadata
from flwr.common.constant import (
    HEARTBEAT_DEFAULT_INTERVAL,
    HEARTBEAT_PATIENCE,
    ErrorCode,
    Status,
    SubStatus,
)
from flwr.proto.runtime_pb2 import (
    AcquireTaskRequest,
    PullAppMessagesRequest,
    PullTaskInputRequest,
    PushTaskOutputRequest,
)
from flwr.supercore.constant import TaskType
from flwr.supercore.corestate import in_memory_corestate
from flwr.supercore.date import now as wall_now
from flwr.supercore.fab import Fab
from flwr.supercore.inflatable.inflatable_object import (
    get_all_nested_objects,
    get_object_tree,
    iterate_object_tree,
)
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supernode import start_client_internal as loop
from flwr.supernode.nodestate import NodeStateFactory, in_memory_nodestate
from flwr.supernode.servicer.runtime import runtime_handlers as runtime

import pflarena.deploy.waits as waits
from pflarena.deploy.supernode import (
    DEFAULT_REPLY_WAIT_S,
    REPLY_CHECK_S,
    REPLY_WAIT_ENV,
    bound_reply_wait,
    check_fab_verification,
    check_reply_wait,
    patch_waits,
    reply_wait_limit,
)
from pflarena.runtime.launch import simulation_env
from pflarena.runtime.processes import Supervised, free_port, stop_all, wait_healthy

RUN_ID = 7
NODE_ID = 11
#: How long a ClientApp task that pulled its input lives without a heartbeat (flwr 1.41: 60 s).
RUNNING_LAPSE_S = HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL


class Clock:
    """One fake clock for the wait (``now``, ``sleep``) and the NodeState (its ``now``, the
    wall time plus the seconds slept): each ``sleep`` advances it ``step`` seconds and then
    runs the events due (``at``)."""

    def __init__(self, step: float = 0.5) -> None:
        self.t = 0.0
        self.step = step
        self.slept = 0
        self.events: list[tuple[float, Callable[[], None]]] = []
        self.start = wall_now()

    def now(self) -> float:
        return self.t

    def wall(self) -> Any:
        return self.start + timedelta(seconds=self.t)

    def at(self, t: float, event: Callable[[], None]) -> None:
        self.events.append((t, event))
        self.events.sort(key=lambda e: e[0])

    def sleep(self, seconds: float | None = None) -> None:
        self.t += self.step if seconds is None else seconds
        self.slept += 1
        while self.events and self.events[0][0] <= self.t:
            self.events.pop(0)[1]()


class Node:
    """Flower's SuperNode loop pieces on a real NodeState: :meth:`deliver` runs
    ``_pull_and_store_message`` for one message, :meth:`push` runs ``_push_messages`` and
    returns what it sent (each reply with the ClientApp runtime it reported) and the objects
    it pushed."""

    def __init__(self, clock: Clock) -> None:
        objects = ObjectStoreFactory()
        self.state = NodeStateFactory(objects).state()
        self.store = objects.store()
        self.state.set_node_id(NODE_ID)
        run = Run.create_empty(RUN_ID)
        run.primary_task_type = TaskType.CLIENT_APP
        run.fab_hash = hashlib.sha256(b"fab").hexdigest()
        self.state.store_run(run)
        self.state.store_fab(Fab(run.fab_hash, b"fab", {}))
        from flwr.app import Context

        self.state.set_run_series_context(
            run.series_id, Context(RUN_ID, NODE_ID, {}, RecordDict(), {})
        )
        self.clock = clock
        self.sent: list[tuple[Message, float]] = []
        self.pushed: list[str] = []

    def deliver(self, ttl: float = 600.0) -> Message:
        metadata = Metadata(RUN_ID, "", 0, NODE_ID, "", "1", time.time(), ttl, "query")
        message = make_message(metadata, RecordDict({"q": ConfigRecord({"round": 1})}))
        message.metadata.__dict__["_message_id"] = message.object_id
        contents = {i: o.deflate() for i, o in get_all_nested_objects(message).items()}
        queue = [(message, get_object_tree(message))]
        run_id = loop._pull_and_store_message(
            state=self.state,
            object_store=self.store,
            node_config={},
            receive=lambda: queue.pop() if queue else None,
            get_run=lambda run_id: pytest.fail("the run is stored"),
            get_fab=lambda fab_hash, run_id: pytest.fail("the run is stored"),
            pull_object=lambda run_id, object_id: contents[object_id],
            confirm_message_received=lambda run_id, message_id: None,
            trusted_entities=None,
        )
        assert run_id == RUN_ID
        return message

    def push(self) -> list[Message]:
        def send(message: Message, tree: Any, runtime_s: float) -> tuple[set[str], str]:
            self.sent.append((message, runtime_s))
            return {t.object_id for t in iterate_object_tree(tree)}, "session"

        loop._push_messages(
            state=self.state,
            object_store=self.store,
            send=send,
            push_object=lambda run_id, session, object_id, content: self.pushed.append(object_id),
        )
        return [m for m, _ in self.sent]

    def task(self) -> Any:
        (task,) = self.state.get_tasks()
        return task


class ClientApp:
    """The ClientApp side of a node, through Flower's Runtime API handlers."""

    def __init__(self, node: Node, task_type: str = TaskType.CLIENT_APP) -> None:
        self.node = node
        self.task_type = task_type
        self.task: Any = None
        self.token = ""
        self.message: Message | None = None

    def acquire(self) -> None:
        """The executor takes the task (``STARTING``)."""
        response = runtime.acquire_task(
            AcquireTaskRequest(supported_task_types=[self.task_type]), self.node.state
        )
        assert response.HasField("task"), "no task to acquire"
        self.task, self.token = response.task, response.token

    def start(self) -> None:
        """The ClientApp pulls its input (``RUNNING``)."""
        runtime.pull_task_input(PullTaskInputRequest(), self.node.state, self.task)

    def pull(self) -> None:
        """The ClientApp pulls its message."""
        answer = runtime.pull_messages(PullAppMessagesRequest(), self.node.state, self.task)
        assert len(answer.messages_list) == 1
        from flwr.common.serde import message_from_proto

        self.message = message_from_proto(answer.messages_list[0])

    def heartbeat(self) -> bool:
        return self.node.state.acknowledge_task_heartbeat(self.task.task_id)

    def reply(self) -> Message:
        """The ClientApp pushes its reply (stored as the Runtime API stores one)."""
        assert self.message is not None
        reply = Message(RecordDict({"a": MetricRecord({"round": 1})}), reply_to=self.message)
        self.node.state.record_message_processing_end(self.message.metadata.message_id)
        loop._insert_message(reply, self.node.state, self.node.store)
        return reply

    def finish(self, sub_status: str = SubStatus.COMPLETED, details: str = "") -> None:
        request = PushTaskOutputRequest(sub_status=sub_status, details=details)
        runtime.push_task_output(request, self.node.state, self.task)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The fake clock, also the NodeState's (task heartbeats lapse on it)."""
    fake = Clock()
    monkeypatch.setattr(in_memory_corestate, "now", fake.wall)
    monkeypatch.setattr(in_memory_nodestate, "now", fake.wall)
    return fake


@pytest.fixture
def flower_loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Flower's loop module, what pflarena patches in it restored after the test."""
    for name in ("time", "pull_objects", "_pull_and_store_message", "_push_messages"):
        monkeypatch.setattr(loop, name, getattr(loop, name))
    yield loop


def bounded(clock: Clock, limit_s: float = DEFAULT_REPLY_WAIT_S) -> Node:
    """A node whose loop waits within ``limit_s`` on ``clock``."""
    bound_reply_wait(limit_s, now=clock.now, sleep=clock.sleep)
    return Node(clock)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "pflarena supernode" in r.getMessage()]


# --------------------------------------------------------------------------- why
class _Stop(Exception):
    pass


def test_flower_alone_waits_forever_for_a_task_that_ended(flower_loop, clock) -> None:
    """Why the bound exists: a ClientApp that pulls its input and dies before it pulls its
    message ends its task a minute later (its heartbeat lapses), with no reply (Flower
    replies only for a message the ClientApp took); Flower's loop goes on waiting, here
    for 10,000 s before the test stops it."""

    class FakeTime:
        def sleep(self, seconds: float) -> None:
            if clock.t >= 10_000:
                raise _Stop
            clock.sleep(seconds)

    flower_loop.time = FakeTime()
    node = Node(clock)
    node.deliver()
    app = ClientApp(node)
    app.acquire()
    app.start()
    with pytest.raises(_Stop):
        node.push()
    task = node.task()
    assert task.status.status == Status.FINISHED and task.status.sub_status == SubStatus.FAILED
    assert node.sent == [] and node.state.get_messages_legacy(is_reply=True) == []


# --------------------------------------------------------------------------- a reply comes
def test_a_reply_that_comes_is_sent_and_nothing_is_added(flower_loop, clock, caplog) -> None:
    node = bounded(clock, limit_s=60.0)
    message = node.deliver(ttl=120.0)
    app = ClientApp(node)
    clock.at(1.0, app.acquire)
    clock.at(2.0, app.start)
    clock.at(3.0, app.pull)
    replies: list[Message] = []
    clock.at(59.0, lambda: replies.append(app.reply()))  # a second before the limit
    clock.at(59.0, app.finish)
    sent = node.push()
    assert [m.object_id for m in sent] == [replies[0].object_id]
    assert not sent[0].has_error() and sent[0].metadata.reply_to_message_id == message.object_id
    assert node.sent[0][1] == pytest.approx(56.0)  # the ClientApp's runtime: pulled at 3 s
    assert clock.t == 59.0
    assert node.task().status.sub_status == SubStatus.COMPLETED
    assert node.state.get_messages_legacy() == []  # the message and its reply: sent, deleted
    assert _warnings(caplog) == []


# --------------------------------------------------------------------------- (a) its task ended
@pytest.mark.parametrize("how", ["heartbeat-lapsed", "finished"])
def test_a_task_that_ended_without_pulling_its_message_gets_an_error_reply(
    flower_loop, clock, caplog, how: str
) -> None:
    """The ClientApp pulled its input and never its message: its task ended (its heartbeat
    lapsed, or it finished it), and the node sends an error reply saying so as soon as it
    sees that, long before its limit or the message's TTL."""
    node = bounded(clock)
    message = node.deliver()
    app = ClientApp(node)
    clock.at(1.0, app.acquire)
    clock.at(2.0, app.start)
    if how == "finished":
        clock.at(5.0, lambda: app.finish(SubStatus.FAILED, "the ClientApp could not load"))
    (reply,) = node.push()
    ended = 5.0 if how == "finished" else 2.0 + RUNNING_LAPSE_S
    assert ended <= clock.t <= ended + 1.0
    assert reply.has_error() and reply.error.code == ErrorCode.CLIENT_APP_CRASHED
    why = "the ClientApp could not load" if how == "finished" else "No heartbeat received"
    assert reply.error.reason.startswith(
        "pflarena supernode: its ClientApp task ended without replying (failed: "
    ), reply.error.reason
    assert why in reply.error.reason
    assert reply.metadata.reply_to_message_id == message.object_id
    assert reply.metadata.dst_node_id == message.metadata.src_node_id
    # Stored as Flower stores its own error replies: its objects in the store, pushed.
    assert node.pushed == [t.object_id for t in iterate_object_tree(get_object_tree(reply))]
    assert node.sent[0][1] == pytest.approx(0.0, abs=1.0)  # no ClientApp took the message
    # Nothing left behind: the message, the reply and their objects are gone.
    assert node.state.get_messages_legacy() == []
    assert node.store.get(message.object_id) is None and node.store.get(reply.object_id) is None
    (line,) = _warnings(caplog)
    assert f"message {message.object_id} of run {RUN_ID}: its ClientApp task ended" in line
    # Its processing time recorded as Flower's push asks for it (no "not found" errors).
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


def test_flowers_own_reply_for_a_clientapp_that_lapsed_holding_its_message_goes_alone(
    flower_loop, clock, caplog
) -> None:
    """A ClientApp that pulled its message and then stopped: Flower's NodeState replies for
    it (``CLIENT_APP_CRASHED``, "ClientApp stopped responding.") when its heartbeat lapses;
    that reply is sent, and no second one."""
    node = bounded(clock)
    node.deliver()
    app = ClientApp(node)
    clock.at(1.0, app.acquire)
    clock.at(2.0, app.start)
    clock.at(3.0, app.pull)
    (reply,) = node.push()
    assert reply.error.code == ErrorCode.CLIENT_APP_CRASHED
    assert reply.error.reason == "ClientApp stopped responding."
    assert _warnings(caplog) == []


# --------------------------------------------------------------------------- (b) its TTL
def test_the_messages_time_to_live_ends_the_wait(flower_loop, clock, caplog) -> None:
    """No executor takes the task: the wait ends when the message's TTL has passed, and the
    task is ended so that an executor that comes later does not take it."""
    node = bounded(clock)
    node.deliver(ttl=20.0)
    (reply,) = node.push()
    assert clock.t == 20.0
    assert reply.error.code == ErrorCode.CLIENT_APP_CRASHED
    assert reply.error.reason == (
        "pflarena supernode: no reply within the message's time to live (20 s); its ClientApp "
        "task was pending: no ClientApp executor took it"
    )
    task = node.task()
    assert (task.status.status, task.status.sub_status) == (Status.FINISHED, SubStatus.FAILED)
    assert task.status.details == reply.error.reason
    later = runtime.acquire_task(
        AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]), node.state
    )
    assert not later.HasField("task")
    assert len(_warnings(caplog)) == 1


# --------------------------------------------------------------------------- (c) the limit
@pytest.mark.parametrize("doing", ["starting", "running"])
def test_the_limit_ends_the_wait_and_revokes_the_task(
    flower_loop, clock, caplog, doing: str
) -> None:
    """A ClientApp that took the task and never pulled its input (``starting``), or one that
    pulled its message and works on, heartbeating, without a reply (``running``): the wait
    ends after the limit, and the task's token is revoked, so no late reply follows."""
    node = bounded(clock, limit_s=10.0)
    node.deliver(ttl=600.0)
    app = ClientApp(node)
    clock.at(1.0, app.acquire)
    if doing == "running":
        clock.at(2.0, app.start)
        clock.at(3.0, app.pull)
        for t in range(4, 10):
            clock.at(float(t), app.heartbeat)
    (reply,) = node.push()
    assert clock.t == 10.0
    assert reply.error.reason.startswith(
        f"pflarena supernode: no reply within 10 s (--reply-wait); its ClientApp task was {doing}"
    ), reply.error.reason
    assert node.state.get_task_by_token(app.token) is None
    assert not app.heartbeat()
    if doing == "running":  # the runtime reported is the ClientApp's: from its pull
        assert node.sent[0][1] == pytest.approx(7.0)
    assert len(_warnings(caplog)) == 1


def test_a_message_gets_one_reply_when_ending_the_task_makes_flowers(flower_loop, clock) -> None:
    """An AgentApp's task (a run whose primary task is one) that pulled its message and
    works on past the limit: ending it failed makes Flower's NodeState reply for it
    ("AgentApp failed before replying."); that reply goes, and no second one."""
    node = bounded(clock, limit_s=10.0)
    run = node.state.get_run(RUN_ID)
    run.primary_task_type = TaskType.AGENT_APP
    node.deliver()
    app = ClientApp(node, TaskType.AGENT_APP)
    clock.at(1.0, app.acquire)
    clock.at(2.0, app.start)
    clock.at(3.0, app.pull)
    (reply,) = node.push()
    assert clock.t == 10.0
    assert (reply.error.code, reply.error.reason) == (
        ErrorCode.UNKNOWN,
        "AgentApp failed before replying.",
    )
    assert "within 10 s (--reply-wait)" in node.task().status.details


def test_a_ttl_shorter_than_the_limit_goes_first_and_the_other_way_round(
    flower_loop, clock
) -> None:
    node = bounded(clock, limit_s=30.0)
    node.deliver(ttl=12.0)
    (reply,) = node.push()
    assert clock.t == 12.0 and "time to live (12 s)" in reply.error.reason
    node.deliver(ttl=600.0)
    started = clock.t
    (_, reply) = node.push()
    assert clock.t - started == 30.0 and "within 30 s (--reply-wait)" in reply.error.reason


# --------------------------------------------------------------------------- the waits
@pytest.mark.parametrize("patched", [False, True], ids=["flower-waits", "active-poll"])
def test_the_wait_checks_as_often_as_the_loop_would(
    flower_loop, clock, monkeypatch: pytest.MonkeyPatch, patched: bool
) -> None:
    """Between two checks for a reply the wait sleeps the loop's ``time.sleep(0.5)``: 0.5 s
    with Flower's waits, 0.02 s with ``--active-poll`` (:func:`patch_waits`)."""
    slept: list[float] = []

    class FakeTime:
        def sleep(self, seconds: float) -> None:
            slept.append(seconds)
            clock.sleep(seconds)

        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

    if patched:
        original = loop._pull_and_store_message
        patch_waits(3.0, 0.1)
        monkeypatch.setattr(waits, "time", FakeTime())  # what the PollClock sleeps on
    else:
        monkeypatch.setattr(loop, "time", FakeTime())
    bound_reply_wait(60.0, now=clock.now)
    node = Node(clock)
    node.deliver()
    app = ClientApp(node)
    app.acquire()
    app.start()
    app.pull()
    replies: list[Message] = []
    step = REPLY_CHECK_S if patched else 0.5
    clock.at(clock.t + 4.5 * step, lambda: replies.append(app.reply()))  # at the fifth check
    (sent,) = node.push()
    assert sent.object_id == replies[0].object_id
    assert slept == [REPLY_CHECK_S if patched else 0.5] * 5
    if patched:  # both wrappers, and the approval check still finds Flower's function
        assert inspect.unwrap(loop._pull_and_store_message) is inspect.unwrap(original)
        check_fab_verification()


# --------------------------------------------------------------------------- checks, flags
def test_a_flower_whose_loop_moved_is_named(flower_loop, monkeypatch: pytest.MonkeyPatch) -> None:
    check_reply_wait()

    def _push_messages(state: Any, object_store: Any, send: Any, push_object: Any) -> None:
        for message in state.get_messages_legacy(is_reply=True, limit=1):
            send(message, None, 0.0)

    monkeypatch.setattr(loop, "_push_messages", _push_messages)
    with pytest.raises(RuntimeError, match=r"lacks _push_messages's `while not \(reply_messages"):
        check_reply_wait()
    monkeypatch.undo()
    monkeypatch.delattr(loop, "_insert_message")
    with pytest.raises(RuntimeError, match=r"lacks _insert_message \(as in flwr 1\.41\)"):
        bound_reply_wait()
    monkeypatch.undo()

    def start_client_internal(**kwargs: Any) -> None:
        state = store = None
        loop._pull_and_store_message(state, store)
        loop._push_messages(state=state, object_store=store)

    monkeypatch.setattr(loop, "start_client_internal", start_client_internal)
    with pytest.raises(RuntimeError, match=r"start_client_internal's call _pull_and_store_messa"):
        check_reply_wait()


def test_the_limit_comes_from_the_flag_or_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(REPLY_WAIT_ENV, raising=False)
    assert reply_wait_limit() == DEFAULT_REPLY_WAIT_S == 3600.0
    monkeypatch.setenv(REPLY_WAIT_ENV, "45")
    assert reply_wait_limit() == 45.0
    assert reply_wait_limit("30") == 30.0  # the flag wins
    for source, value, says in [
        (REPLY_WAIT_ENV, "later", "is not a number of seconds"),
        (REPLY_WAIT_ENV, "0.5", "must be at least 1 second"),
        ("--reply-wait", "nan", "must be at least 1 second"),
        ("--reply-wait", "-3", "must be at least 1 second"),
    ]:
        if source == REPLY_WAIT_ENV:
            monkeypatch.setenv(REPLY_WAIT_ENV, value)
            with pytest.raises(ValueError, match=f"^{REPLY_WAIT_ENV} '{value}' {says}$"):
                reply_wait_limit()
        else:
            with pytest.raises(ValueError, match=f"^--reply-wait '{value}' {says}$"):
                reply_wait_limit(value)


def test_pflarena_supernode_refuses_a_bad_reply_wait_before_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import pflarena.deploy.private as private
    from pflarena.deploy.supernode import main

    monkeypatch.setattr(private, "private_umask", lambda: None)
    with pytest.raises(SystemExit, match=r"^pflarena supernode: --reply-wait '0' must be at "):
        main(["--reply-wait", "0", "--insecure"])


# --------------------------------------------------------------------------- end to end
_SERVER = """
import json
import time
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    out, die = Path(str(context.run_config["out"])), Path(str(context.run_config["die"]))
    ttl = float(context.run_config["ttl"])
    deadline = time.monotonic() + 120
    while not (nodes := sorted(grid.get_node_ids())):
        assert time.monotonic() < deadline, "no SuperNode connected"
        time.sleep(0.5)
    for server_round in (1, 2):
        started = time.monotonic()
        content = RecordDict({"q": ConfigRecord({"round": server_round})})
        message = Message(content, dst_node_id=nodes[0], message_type="query",
                          group_id=str(server_round), ttl=ttl)
        record = {"round": server_round}
        for reply in grid.send_and_receive([message], timeout=ttl):
            if reply.has_error():
                record["error"] = [reply.error.code, reply.error.reason]
            else:
                record["answer"] = reply.content["a"]["round"]
        record["seconds"] = round(time.monotonic() - started, 1)
        with out.open("a") as f:
            f.write(json.dumps(record) + "\\n")
        die.unlink(missing_ok=True)  # the node's ClientApps work from now on
"""
_CLIENT = """
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    answer = MetricRecord({"round": msg.content["q"]["round"]})
    return Message(RecordDict({"a": answer}), reply_to=msg)
"""
#: The ClientApp command Flower's SuperExec starts for a task: while ``die`` exists it exits
#: at once, before it pulls its input or its message; then it is Flower's own.
_CLIENTAPP_COMMAND = """#!/bin/sh
if [ -e '{die}' ]; then
    echo "flwr-clientapp (test): exiting before it pulls its message" >&2
    exit 1
fi
exec '{real}' "$@"
"""
#: The node's limit on the wait here (s), and the messages' TTL (the ServerApp's timeout).
E2E_REPLY_WAIT_S = 8
E2E_TTL_S = 90.0


def _probe_app(root: Path, out: Path, die: Path) -> Path:
    app = root / "probe-app"
    (app / "probe").mkdir(parents=True)
    (app / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "probe"\nversion = "1.0.0"\ndependencies = ["flwr>=1.41"]\n\n'
        '[tool.flwr.app]\npublisher = "pflarena-tests"\n\n[tool.flwr.app.components]\n'
        'serverapp = "probe.server_app:app"\nclientapp = "probe.client_app:app"\n\n'
        f'[tool.flwr.app.config]\nout = "{out}"\ndie = "{die}"\nttl = {E2E_TTL_S}\n'
    )
    (app / "probe" / "__init__.py").write_text("")
    (app / "probe" / "server_app.py").write_text(_SERVER)
    (app / "probe" / "client_app.py").write_text(_CLIENT)
    return app


@pytest.mark.slow
def test_a_node_whose_clientapp_dies_before_pulling_answers_the_next_round(
    tmp_path: Path,
) -> None:
    """A real SuperLink and ``pflarena supernode`` (``--reply-wait 8``), whose SuperExec
    (Flower's, started by the node) starts a ClientApp command that exits before it pulls
    its message, for round 1 only. Flower's node would hold that message until its TTL and
    beyond; this one sends round 1 an error reply saying why after 8 s, and answers round 2
    with its ClientApp's reply."""
    out, die = tmp_path / "rounds.jsonl", tmp_path / "die"
    die.write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    command = bin_dir / "flwr-clientapp"
    real = Path(sys.executable).parent / "flwr-clientapp"
    command.write_text(_CLIENTAPP_COMMAND.format(die=die, real=real))
    command.chmod(0o755)
    app = _probe_app(tmp_path, out, die)

    procs: dict[str, Supervised] = {}

    def spawn(name: str, cmd: list[str], env: dict[str, str]) -> Supervised:
        procs[name] = Supervised.spawn(name, cmd, tmp_path / f"{name}.log", env, cwd=tmp_path)
        return procs[name]

    def log(name: str) -> str:
        path = tmp_path / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def why() -> str:
        rounds = out.read_text() if out.exists() else "(no rounds)"
        return rounds + "\n".join(f"--- {n} ---\n{log(n)[-4000:]}" for n in [*procs, "flwr-run"])

    try:
        port, runtime_port = free_port(), free_port()
        link = spawn(
            "superlink",
            [
                "flower-superlink",
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--disable-runtime-dependency-installation",
            ],
            simulation_env(tmp_path / "home-superlink"),
        )
        assert link.popen is not None
        wait_healthy(port, link.popen)
        node_env = simulation_env(tmp_path / "home-node")
        node_env["PATH"] = str(bin_dir) + os.pathsep + node_env["PATH"]
        node = spawn(
            "supernode",
            [
                sys.executable,
                "-m",
                "pflarena.deploy.supernode",
                "--reply-wait",
                str(E2E_REPLY_WAIT_S),
                "--active-poll",
                "0.1",
                "--insecure",
                "--superlink",
                f"127.0.0.1:{port}",
                "--port",
                str(runtime_port),
            ],
            node_env,
        )
        cli_home = tmp_path / "home-cli"
        cli_home.mkdir()
        (cli_home / "config.toml").write_text(
            '[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
            f'address = "127.0.0.1:{port}"\ninsecure = true\n'
        )
        import subprocess

        with open(tmp_path / "flwr-run.log", "w") as run_log:
            result = subprocess.run(
                ["flwr", "run", str(app), "loopback", "--stream"],
                env=simulation_env(cli_home),
                cwd=cli_home,
                stdout=run_log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=300,
            )
        assert result.returncode == 0, why()
        rounds = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["round"] for r in rounds] == [1, 2], why()
        lost, answered = rounds
        code, reason = lost["error"]
        assert code == ErrorCode.CLIENT_APP_CRASHED, why()
        assert reason.startswith(
            f"pflarena supernode: no reply within {E2E_REPLY_WAIT_S} s (--reply-wait); its "
            "ClientApp task was "
        ), why()
        # After the limit (plus the polls, the node's and the ServerApp's), long before the
        # TTL, which Flower's node would have waited out and more.
        assert E2E_REPLY_WAIT_S <= lost["seconds"] < E2E_TTL_S / 2, why()
        assert answered.get("answer") == 2 and "error" not in answered, why()
        node_log = log("supernode")
        assert node_log.count("exiting before it pulls its message") == 1, why()
        assert node_log.count("it gets an error reply, and the node serves on") == 1, why()
        assert node.popen is not None and node.popen.poll() is None, why()
    finally:  # the node (its SuperExec follows it), then the SuperLink
        stop_all([p for name, p in procs.items() if name != "superlink"], grace=15.0)
        stop_all([p for name, p in procs.items() if name == "superlink"], grace=15.0)
