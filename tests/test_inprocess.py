"""The in-process Grid's message API: push, pull, send-and-receive, offline nodes, errors."""

from __future__ import annotations

import pytest
from flwr.app import Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from pflarena.runtime.inprocess import InProcessGrid

app = ClientApp()


@app.query()
def _answer(msg: Message, context) -> Message:
    if msg.content["q"]["fail"]:
        raise ValueError("asked to fail")
    # the node's partition and a counter kept in its persistent state
    calls = context.state.get("calls", MetricRecord({"n": 0}))["n"] + 1
    context.state["calls"] = MetricRecord({"n": calls})
    return Message(
        RecordDict({"a": MetricRecord({"pid": context.node_config["partition-id"], "n": calls})}),
        reply_to=msg,
    )


def _query(grid: InProcessGrid, node_id: int, fail: bool = False) -> Message:
    content = RecordDict({"q": MetricRecord({"fail": int(fail)})})
    return grid.create_message(content, "query", node_id, group_id="1")


def test_push_then_pull_returns_each_reply_once_and_none_from_an_offline_node() -> None:
    grid = InProcessGrid(app, {}, 3)
    a, b, c = grid.node_ids
    grid.offline.add(c)
    ids = list(grid.push_messages([_query(grid, a), _query(grid, b), _query(grid, c)]))
    assert len(set(ids)) == 3
    replies = list(grid.pull_messages(ids))
    assert [r.metadata.src_node_id for r in replies] == [a, b]
    assert [r.metadata.reply_to_message_id for r in replies] == ids[:2]
    assert [r.content["a"]["pid"] for r in replies] == [0, 1]
    assert list(grid.pull_messages(ids)) == []  # pulled once
    assert grid.get_node_ids() == [a, b]


def test_send_and_receive_keeps_node_state_and_turns_exceptions_into_error_replies() -> None:
    grid = InProcessGrid(app, {}, 2)
    a, b = grid.node_ids
    for expected in (1, 2):
        (reply,) = grid.send_and_receive([_query(grid, a)])
        assert reply.content["a"]["n"] == expected
    (error,) = grid.send_and_receive([_query(grid, b, fail=True)])
    assert error.has_error() and "ValueError: asked to fail" in error.error.reason


@app.query("crash")
def _crash(msg: Message, context) -> Message:
    import os

    os._exit(3)


def test_worker_processes_run_the_clients_elsewhere_and_keep_each_nodes_state() -> None:
    """Catches parallel workers that lose a node's state between calls (its context must
    travel with each call and back), answer from the parent itself, or mix up replies."""
    import os

    grid = InProcessGrid(app, {}, 4, workers=2)
    try:
        grid.start_workers()
        for expected in (1, 2):
            replies = list(grid.send_and_receive([_query(grid, n) for n in grid.node_ids]))
            assert [r.content["a"]["n"] for r in replies] == [expected] * 4
            assert [r.content["a"]["pid"] for r in replies] == [0, 1, 2, 3]
            assert [r.metadata.src_node_id for r in replies] == grid.node_ids
        workers = {p.pid for p in grid._pool._processes.values()}
        assert len(workers) == 2 and os.getpid() not in workers
        # a node given two messages in one push gets them one after the other
        a = grid.node_ids[0]
        replies = list(grid.send_and_receive([_query(grid, a), _query(grid, a)]))
        assert [r.content["a"]["n"] for r in replies] == [3, 4]
        (error, ok) = grid.send_and_receive(
            [_query(grid, grid.node_ids[1], fail=True), _query(grid, grid.node_ids[2])]
        )
        assert error.has_error() and "ValueError: asked to fail" in error.error.reason
        assert ok.content["a"]["n"] == 3
    finally:
        grid.close()


def test_a_worker_that_dies_costs_its_replies_and_the_rest_run_in_the_process() -> None:
    grid = InProcessGrid(app, {}, 3, workers=2)
    try:
        grid.start_workers()
        crash = [grid.create_message(RecordDict(), "query.crash", n, "1") for n in grid.node_ids]
        replies = list(grid.send_and_receive(crash[:2]))
        assert replies and all(r.has_error() for r in replies)
        assert "worker process" in replies[0].error.reason
        replies = list(grid.send_and_receive([_query(grid, n) for n in grid.node_ids]))
        assert [r.content["a"]["n"] for r in replies] == [1, 1, 1]
    finally:
        grid.close()


@app.query("whoami")
def _whoami(msg: Message, context) -> Message:
    import os

    return Message(RecordDict({"a": MetricRecord({"pid": os.getpid()})}), reply_to=msg)


def test_the_workers_are_forked_once_the_clients_are_worth_it() -> None:
    """Catches a fork for clients too quick to gain from one (a round of digits), and
    workers never forked for clients that keep the process busy."""
    import os

    grid = InProcessGrid(app, {}, 4, workers=2)
    grid.fork_first = False  # as on a machine with no GPU
    try:
        whoami = [grid.create_message(RecordDict(), "query.whoami", n, "1") for n in grid.node_ids]
        replies = list(grid.send_and_receive(whoami))
        assert {r.content["a"]["pid"] for r in replies} == {os.getpid()}  # quick: no fork
        assert grid._pool is None
        grid.fork_after_s = 0.0  # from now on, any call is worth it
        whoami = [grid.create_message(RecordDict(), "query.whoami", n, "1") for n in grid.node_ids]
        pids = [r.content["a"]["pid"] for r in grid.send_and_receive(whoami)]
        assert pids[0] == os.getpid() and os.getpid() not in pids[1:]
        assert grid._pool is not None
    finally:
        grid.close()


def test_where_a_gpu_is_visible_no_call_runs_before_the_fork(monkeypatch) -> None:
    """Catches a client called in the process that then forks the workers on a GPU machine:
    its CUDA context (or autograd's device threads) would make every worker fail."""
    import os

    from pflarena.runtime import inprocess

    monkeypatch.setattr(inprocess, "has_gpu", lambda: True)
    grid = InProcessGrid(app, {}, 4, workers=2)
    try:
        assert grid.fork_first
        whoami = [grid.create_message(RecordDict(), "query.whoami", n, "1") for n in grid.node_ids]
        pids = [r.content["a"]["pid"] for r in grid.send_and_receive(whoami)]
        assert len(pids) == 4 and os.getpid() not in pids
    finally:
        grid.close()
    monkeypatch.setattr(inprocess, "has_gpu", lambda: False)
    assert not InProcessGrid(app, {}, 2, workers=2).fork_first


def test_the_plan_refuses_forked_workers_for_clients_on_a_gpu(monkeypatch) -> None:
    from pflarena.runtime import engines

    with pytest.raises(ValueError, match="--engine ray --gpus-per-client"):
        engines.plan_engine("inprocess", workers=4, device="cuda")
    monkeypatch.setattr(engines, "has_gpu", lambda: True)
    with pytest.raises(ValueError, match="--workers 4"):
        engines.plan_engine("inprocess", workers=4, device="auto")
    assert engines.plan_engine("inprocess", workers=4, device="cpu").workers == 4
    assert engines.plan_engine("inprocess", device="auto").workers == 1  # one after another
    assert engines.plan_engine("inprocess", workers=1, device="cuda").workers == 1
    monkeypatch.setattr(engines, "has_gpu", lambda: False)
    assert engines.plan_engine("inprocess", workers=4, device="auto").workers == 4
