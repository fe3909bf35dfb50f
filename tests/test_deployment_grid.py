"""The deployment's Grid (``pflarena/server/polling.py``) against an in-memory SuperLink
(``fake_superlink.py``: Flower's own ``HttpGrid`` and its retry invoker, only the SuperLink's
side replaced): the SuperLink's passing errors retried within a time limit, an exchange that a
SuperLink interruption could have cost replies sent again, any reply costing only its sender,
and a whole run going on past a client whose replies are hostile.

What Flower's Grid alone does in each case is checked beside it: that is why each exists.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from fake_superlink import UNAVAILABLE, FakeSuperLink, serverapp_identity
from flwr.app import Array, ArrayRecord, Message, Metadata, MetricRecord, RecordDict
from flwr.app.message import make_message
from flwr.common.constant import ErrorCode

from pflarena.core.packing import PACKED_KEY, PACKED_STYPE
from pflarena.server import polling
from pflarena.server.polling import RETRY_ENV, PromptGrid, prompt_grid


@pytest.fixture(autouse=True)
def serverapp(monkeypatch: pytest.MonkeyPatch) -> None:
    serverapp_identity(monkeypatch)


def _message(node: int, value: float = 1.0) -> Message:
    arrays = ArrayRecord({"w": Array(np.full(3, value, np.float32)), "b": Array(np.zeros(2))})
    return Message(RecordDict({"arrays": arrays}), dst_node_id=node, message_type="train")


def _echo(node: int, message: Message) -> Message:
    """A node's reply: its id and the first weight it was sent (packed as the ClientApp does)."""
    from pflarena.core.packing import unpack_content

    first = float(unpack_content(message.content)["arrays"]["w"].numpy()[0])
    content = RecordDict({"metrics": MetricRecord({"node": node, "w": first})})
    return Message(content, reply_to=message)


def _seen(replies: list[Message]) -> list[tuple[int, object]]:
    return [
        (r.metadata.src_node_id, r.error.code if r.has_error() else dict(r.content["metrics"]))
        for r in replies
    ]


class Clock:
    """Time for Flower's retry invoker: it advances only by the invoker's waits."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.t

    def wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.t += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """Flower's retry invoker on a clock of its own (no real waiting)."""
    from flwr.supercore.retry import retry_invoker

    fake = Clock()
    monkeypatch.setattr(retry_invoker, "time", SimpleNamespace(monotonic=fake.monotonic))
    return fake


def _grid(link: FakeSuperLink, clock: Clock, retry_s: float = 300.0) -> PromptGrid:
    grid = PromptGrid(link.grid(), poll=0.001, pack=True, retry_s=retry_s)
    grid._grid._retry_invoker.wait_function = clock.wait
    return grid


# --------------------------------------------------------------------------- retries
def test_a_500_is_retried_and_costs_no_message(clock: Clock) -> None:
    """A SuperLink whose SQLite state is locked answers 500: Flower's Grid gives the run up
    at once; this one retries it with Flower's back-off, and sends nothing again (a 500 is an
    answer: the SuperLink's state is as it was)."""
    flower = FakeSuperLink(_echo)
    grid = flower.grid()
    ids = list(grid.push_messages([_message(1)]))
    flower.answer_with(500, 1, "pull-messages")
    with pytest.raises(httpx.HTTPStatusError, match="500"):
        grid.pull_messages(ids)

    link = FakeSuperLink(_echo)
    link.answer_with(500, 3, "pull-messages")
    replies = list(_grid(link, clock).send_and_receive([_message(n) for n in (1, 2)], timeout=30))
    assert _seen(replies) == [(1, {"node": 1, "w": 1.0}), (2, {"node": 2, "w": 1.0})]
    assert len(clock.waits) == 3
    assert link.paths.count("/v1/runtime/push-messages") == 1


def test_objects_the_superlink_did_not_keep_are_pushed_again(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SuperLink whose SQLite state is locked while it stores a pushed object answers
    ``stored: false``, on which Flower's push raises (it ended a deployed run in the locked
    database test): the messages are pushed again, the same ones."""
    from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

    flower = FakeSuperLink(_echo)
    flower.refuse_objects(1)
    with pytest.raises(ObjectPushError):
        flower.grid().push_messages([_message(1)])

    slept: list[float] = []
    monkeypatch.setattr(polling.time, "sleep", slept.append)
    link = FakeSuperLink(_echo)
    link.refuse_objects(1)
    messages = [_message(n) for n in (1, 2)]
    replies = list(_grid(link, clock).send_and_receive(messages, timeout=30))
    assert _seen(replies) == [(1, {"node": 1, "w": 1.0}), (2, {"node": 2, "w": 1.0})]
    assert slept[0] == 1.0  # Flower's first wait, before the push again
    assert link.paths.count("/v1/runtime/push-messages") == 2
    assert len(link.pushed) == 2  # the same two messages


def test_pushes_the_superlink_never_keeps_are_given_up_after_the_time_limit(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flwr.supercore.inflatable.inflatable_utils import ObjectPushError

    time_ = SimpleNamespace(monotonic=clock.monotonic, sleep=clock.wait, time=clock.monotonic)
    monkeypatch.setattr(polling, "time", time_)
    link = FakeSuperLink(_echo)
    link.refuse_objects(10**9)
    with pytest.raises(ObjectPushError):
        _grid(link, clock, retry_s=50.0).send_and_receive([_message(1)], timeout=600)
    assert clock.waits[:4] == [1.0, 2.0, 4.0, 8.0] and sum(clock.waits) == pytest.approx(50.0)


@pytest.mark.parametrize("code", [500, 503])
def test_a_superlink_that_keeps_failing_is_given_up_after_the_time_limit(
    clock: Clock, code: int, caplog: pytest.LogCaptureFixture
) -> None:
    link = FakeSuperLink(_echo)
    link.answer_with(code, 10**9, "pull-messages")
    grid = _grid(link, clock, retry_s=120.0)
    with pytest.raises(httpx.HTTPStatusError, match=str(code)):
        grid.send_and_receive([_message(1)], timeout=None)
    assert sum(clock.waits) == pytest.approx(120.0)
    assert max(clock.waits) <= 20.0  # Flower's back-off, capped at 20 s
    assert f"giving up after {RETRY_ENV}=120 s" in caplog.text


def test_the_time_limit_is_set_by_the_environment(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flwr.superlink.grid import http_grid

    monkeypatch.setattr(http_grid, "pull_objects", http_grid.pull_objects)  # prompt_grid sets it
    monkeypatch.setenv(RETRY_ENV, "45")
    link = FakeSuperLink(_echo)
    grid = prompt_grid(link.grid())
    grid._grid._retry_invoker.wait_function = clock.wait
    link.down(10**9)
    with pytest.raises(httpx.ConnectError):
        list(grid.get_node_ids())
    assert sum(clock.waits) == pytest.approx(45.0)
    for value, says in [("soon", "not a number"), ("0", "between 1 and")]:
        monkeypatch.setenv(RETRY_ENV, value)
        with pytest.raises(ValueError, match=f"{RETRY_ENV}='{value}' .*{says}"):
            prompt_grid(FakeSuperLink(_echo).grid())


# --------------------------------------------------------------------------- interruptions
def test_a_pull_whose_answer_was_lost_is_sent_again(clock: Clock) -> None:
    """The SuperLink deletes the replies it hands over before its answer leaves: a pull
    whose answer is lost (the SuperLink stopped, the connection dropped) takes them along.
    Flower's Grid then never sees them; this one sends the messages again."""
    flower = FakeSuperLink(_echo)
    grid = flower.grid()
    grid._retry_invoker.wait_function = clock.wait
    ids = list(grid.push_messages([_message(n) for n in (1, 2)]))
    flower.lose_next_pull_answer()
    assert list(grid.pull_messages(ids)) == []  # retried after the lost answer: gone
    assert list(grid.pull_messages(ids)) == []

    link = FakeSuperLink(_echo)
    link.lose_next_pull_answer()
    messages = [_message(n, value=n) for n in (1, 2)]
    replies = list(_grid(link, clock).send_and_receive(messages, timeout=30))
    assert _seen(replies) == [(1, {"node": 1, "w": 1.0}), (2, {"node": 2, "w": 2.0})]
    # Each reply answers the message the ServerApp sent, not the copy that fetched it.
    assert [r.metadata.reply_to_message_id for r in replies] == [
        m.metadata.message_id for m in messages
    ]
    assert link.paths.count("/v1/runtime/push-messages") == 2
    assert len(link.pushed) == 4  # each message, then its copy


def _unavailable_once(link: FakeSuperLink, node: int, outage: int) -> Callable:
    """Node ``node``'s first message gets the SuperLink's "node unavailable" error and (when
    ``outage``) the SuperLink goes away for that many requests right after; every other
    message is answered."""
    first: list[bool] = []

    def answer(n: int, message: Message) -> object:
        if n == node and not first:
            first.append(True)
            if outage:
                link.down(outage)
            return UNAVAILABLE
        return _echo(n, message)

    return answer


def test_a_node_marked_unavailable_during_an_interruption_is_sent_its_message_again(
    clock: Clock,
) -> None:
    link = FakeSuperLink(_echo)
    link.answer = _unavailable_once(link, 2, outage=2)
    replies = list(
        _grid(link, clock).send_and_receive([_message(n) for n in (1, 2, 3)], timeout=30)
    )
    assert _seen(replies) == [(n, {"node": n, "w": 1.0}) for n in (1, 2, 3)]
    assert [m.metadata.dst_node_id for m in link.pushed] == [1, 2, 3, 2]


def test_an_unavailable_node_without_an_interruption_is_its_failure(clock: Clock) -> None:
    link = FakeSuperLink(_echo)
    link.answer = _unavailable_once(link, 2, outage=0)
    messages = [_message(n) for n in (1, 2, 3)]
    replies = list(_grid(link, clock).send_and_receive(messages, timeout=30))
    assert _seen(replies)[1] == (1, ErrorCode.NODE_UNAVAILABLE)  # the SuperLink's error
    assert replies[1].metadata.reply_to_message_id == messages[1].metadata.message_id
    assert len(link.pushed) == 3


@pytest.mark.parametrize("fault", ["down", "503"])
def test_a_copy_and_its_original_both_answered_count_once(clock: Clock, fault: str) -> None:
    """Node 2 is still working on its message when the SuperLink is interrupted: the
    message is sent again, both get answered, and the first answer is the one returned."""
    link = FakeSuperLink(_echo)
    asked: list[str] = []

    def answer(n: int, message: Message) -> Message | None:
        if n != 2:
            return _echo(n, message)
        asked.append(message.metadata.message_id)
        if len(asked) == 1:  # busy; the SuperLink goes away meanwhile
            link.down(1) if fault == "down" else link.answer_with(503, 1)
            return None
        if len(asked) == 2:  # the copy, first seen: still busy with the original
            return None
        return _echo(n, message)

    link.answer = answer
    messages = [_message(n) for n in (1, 2)]
    replies = list(_grid(link, clock).send_and_receive(messages, timeout=30))
    assert _seen(replies) == [(1, {"node": 1, "w": 1.0}), (2, {"node": 2, "w": 1.0})]
    assert replies[1].metadata.reply_to_message_id == messages[1].metadata.message_id
    assert [m.metadata.dst_node_id for m in link.pushed] == [1, 2, 2]


# --------------------------------------------------------------------------- bad replies
def _forged_reply(message: Message, blob: bytes) -> Message:
    packed = Array(dtype="bytes", shape=(len(blob),), stype=PACKED_STYPE, data=blob)
    return Message(RecordDict({"arrays": ArrayRecord({PACKED_KEY: packed})}), reply_to=message)


def test_a_reply_with_a_table_nested_100000_deep_costs_only_its_sender(clock: Clock) -> None:
    """The issue's snippet: a packed table ``[[[[...`` 100,000 deep raised RecursionError in
    the parser, which escaped the Grid and ended the run."""
    head = b"[" * 100_000

    def answer(n: int, message: Message) -> Message:
        if n == 2:
            return _forged_reply(message, b"PFLPACK1" + len(head).to_bytes(4, "big") + head)
        return _echo(n, message)

    replies = list(
        _grid(FakeSuperLink(answer), clock).send_and_receive([_message(n) for n in (1, 2, 3)])
    )
    assert _seen(replies)[0::2] == [(1, {"node": 1, "w": 1.0}), (3, {"node": 3, "w": 1.0})]
    assert replies[1].has_error() and replies[1].metadata.src_node_id == 2
    assert "nests deeper than 3" in replies[1].error.reason


def test_a_reply_that_names_another_node_or_message_costs_only_its_sender(clock: Clock) -> None:
    def answer(n: int, message: Message) -> Message:
        reply = _echo(n, message)
        if n == 2:  # the reply object claims to come from node 3
            metadata = reply.metadata
            forged = Metadata(
                run_id=metadata.run_id, message_id="", src_node_id=3, dst_node_id=0,
                reply_to_message_id=metadata.reply_to_message_id, group_id="",
                created_at=metadata.created_at, ttl=metadata.ttl, message_type="train",
            )  # fmt: skip
            reply = make_message(forged, content=reply.content)
        return reply

    link = FakeSuperLink(answer)
    grid = _grid(link, clock)
    # Make the SuperLink's record of node 2's reply say node 2, as a real SuperLink checks.
    original_store = link.store_reply

    def store(mid: str, reply: Message) -> None:
        original_store(mid, reply)
        proto, tree = link.replies[mid]
        proto.metadata.src_node_id = (
            2 if reply.metadata.src_node_id == 3 else proto.metadata.src_node_id
        )
        link.replies[mid] = (proto, tree)

    link.store_reply = store  # type: ignore[method-assign]
    replies = list(grid.send_and_receive([_message(n) for n in (1, 2)], timeout=30))
    assert _seen(replies)[0] == (1, {"node": 1, "w": 1.0})
    assert replies[1].has_error() and replies[1].metadata.src_node_id == 2
    assert "names another message or node" in replies[1].error.reason


def test_an_unpacked_reply_flower_cannot_inflate_costs_only_its_sender(clock: Clock) -> None:
    """Not only packed replies: an object Flower's own classes cannot read (an Array whose
    chunk list points past its chunks) becomes its sender's error reply."""
    from test_packing_fuzz import forged_array_record

    def answer(n: int, message: Message) -> Message:
        if n == 1:
            bad = forged_array_record(b'{"dtype":"float32","shape":[2],"stype":"numpy.ndarray",'
                                      b'"arraychunk_ids":[7]}')  # fmt: skip
            return Message(RecordDict({"arrays": bad}), reply_to=message)
        return _echo(n, message)

    replies = list(
        _grid(FakeSuperLink(answer), clock).send_and_receive([_message(n) for n in (1, 2)])
    )
    assert replies[0].has_error() and "unreadable reply: IndexError" in replies[0].error.reason
    assert _seen(replies)[1] == (2, {"node": 2, "w": 1.0})


def test_reasons_are_kept_short(clock: Clock) -> None:
    head = b'[["' + b"k" * 100_000 + b'","float32",[2],"numpy.ndarray",0]]'

    def answer(n: int, message: Message) -> Message:
        return _forged_reply(message, b"PFLPACK1" + len(head).to_bytes(4, "big") + head)

    (reply,) = _grid(FakeSuperLink(answer), clock).send_and_receive([_message(1)])
    assert reply.has_error() and len(reply.error.reason) < polling.REASON_CHARS + 100


# --------------------------------------------------------------------------- a whole run
def test_a_run_goes_on_past_a_client_whose_replies_are_hostile(tmp_path, clock: Clock) -> None:
    """A real run (the loop, the strategy, the real ClientApp behind an in-memory SuperLink)
    in which client 1 answers every message with a hostile packed record, a different one
    each time: the run completes, every exchange records client 1's failure with its
    reason, and the others learn."""
    from helpers import config, grid_for

    from pflarena.server.app import initial_arrays
    from pflarena.server.build import build_strategy
    from pflarena.server.loop import run_rounds
    from pflarena.server.results import ResultsWriter

    cfg = config(strategy="fedavg", num_clients=3, num_rounds=3, local_epochs=2, lr=0.1)
    local = grid_for(cfg)
    hostile = local.node_ids[1]
    forged = iter(
        [
            b"[" * 50_000,
            b'[["w","float32",[true],"numpy.ndarray",0]]',
            b'[["w","float32",[4],"numpy.ndarray",0]]',
            b'[["w","object",[1],"numpy.ndarray",0]]',
            b'[["w","float32",[2],"numpy.ndarray",999999999]]',
        ]
        * 10
    )

    def answer(node: int, message: Message) -> Message:
        if node == hostile:
            head = next(forged)
            return _forged_reply(message, b"PFLPACK1" + len(head).to_bytes(4, "big") + head)
        mid = message.metadata.message_id
        (pushed,) = local.push_messages([message])
        (reply,) = local.pull_messages([pushed])
        message.metadata.__dict__["_message_id"] = mid
        if reply.has_error():
            return Message(reply.error, reply_to=message)
        return Message(reply.content, reply_to=message)

    link = FakeSuperLink(answer, nodes=tuple(local.node_ids))
    writer = ResultsWriter(tmp_path / "run")
    try:
        strategy = build_strategy(cfg, data_from_spec=True)
        rounds = run_rounds(_grid(link, clock), cfg, strategy, initial_arrays(cfg), writer).rounds
    finally:
        writer.close()
    assert [r["round"] for r in rounds] == [0, 1, 2, 3]
    for record in rounds[1:]:
        train = record["train"]
        assert train["clients"] == 2 and train["failures"] == 1, train
    assert set(rounds[-1]["evaluation"]["per_client"]) == {"0", "2"}
    assert (
        rounds[-1]["evaluation"]["personalized"]["mean"]
        > rounds[0]["evaluation"]["personalized"]["mean"]
    )
