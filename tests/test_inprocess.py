"""The in-process Grid's message API: push, pull, send-and-receive, offline nodes, errors."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from pflarena.core.array_decoding import decode
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


def test_a_push_of_many_messages_keeps_only_a_few_calls_in_flight(monkeypatch) -> None:
    """Catches a push that submits every message at once (each submitted call holds its
    message's serialised copy until collected: a round of thousands would hold thousands)."""
    from pflarena.runtime.inprocess import IN_FLIGHT_PER_WORKER

    grid = InProcessGrid(app, {}, 12, workers=2)
    try:
        grid.start_workers()
        in_flight, most = 0, 0
        submit, collect = grid._pool.submit, grid._collect

        def counted_submit(*args, **kwargs):
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            return submit(*args, **kwargs)

        def counted_collect(pending):
            nonlocal in_flight
            collect(pending)
            in_flight -= len(pending)

        monkeypatch.setattr(grid._pool, "submit", counted_submit)
        monkeypatch.setattr(grid, "_collect", counted_collect)
        replies = list(grid.send_and_receive([_query(grid, n) for n in grid.node_ids]))
        assert [r.content["a"]["pid"] for r in replies] == list(range(12))
        assert most == IN_FLIGHT_PER_WORKER * 2 and in_flight == 0
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


#: Lets the thread of a call that waits for it (in this process) go at a test's end.
_RELEASE = __import__("threading").Event()


@app.query("stuck")
def _stuck(msg: Message, context) -> Message:
    if context.node_config["partition-id"] == 0:
        _waits_on_a_lock_it_holds()
    return Message(RecordDict({"a": MetricRecord({"n": 1})}), reply_to=msg)


def _waits_on_a_lock_it_holds() -> None:
    import threading

    if _RELEASE.is_set():
        return
    if threading.current_thread() is not threading.main_thread():
        _RELEASE.wait(60)  # a call in the test's own process: let go at the test's end
        return
    lock = threading.Lock()  # a worker process: deadlocked until it is ended
    lock.acquire()
    lock.acquire()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_call_past_its_time_leaves_where_it_was_in_the_run_directory(
    tmp_path: Path, workers: int
) -> None:
    """A call that runs past its message's time to live (here node 0's, stuck on a lock it
    holds) gets no reply while the other node's does; the run's ``stuck-calls.txt`` holds
    where it was: its thread's stack in the run's process, or with workers every worker's
    (faulthandler answers from a worker whose main thread is deadlocked). Catches a hang
    recorded only as "no reply", with nothing to say where."""
    from pflarena.runtime.inprocess import STUCK_CALLS_FILE

    grid = InProcessGrid(app, {}, 2, workers=workers, output_dir=tmp_path)
    try:
        grid.start_workers()
        stuck = [
            grid.create_message(RecordDict(), "query.stuck", n, "1", ttl=2.0) for n in grid.node_ids
        ]
        replies = list(grid.send_and_receive(stuck))
        assert [r.metadata.src_node_id for r in replies] == [grid.node_ids[1]]
        said = (tmp_path / STUCK_CALLS_FILE).read_text()
        assert f"node {grid.node_ids[0]}'s ClientApp, on a query.stuck message, ran past" in said
        assert "_waits_on_a_lock_it_holds" in said, said
        if workers > 1:
            pids = {p.pid for p in grid._pool._processes.values()}
            assert {f"worker process {pid}:" in said for pid in pids} == {True}, said
    finally:
        _RELEASE.set()
        grid.close()
        _RELEASE.clear()


@app.query("whoami")
def _whoami(msg: Message, context) -> Message:
    import os

    return Message(RecordDict({"a": MetricRecord({"pid": os.getpid()})}), reply_to=msg)


def test_the_workers_are_forked_once_the_clients_are_worth_it() -> None:
    """Catches a fork for clients too quick to gain from one (a round of digits), and
    workers never forked for clients that keep the process busy."""
    import os

    grid = InProcessGrid(app, {}, 4, workers=2)
    grid.start_first = False  # as on a machine with no GPU
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
        assert grid.start_first
        whoami = [grid.create_message(RecordDict(), "query.whoami", n, "1") for n in grid.node_ids]
        pids = [r.content["a"]["pid"] for r in grid.send_and_receive(whoami)]
        assert len(pids) == 4 and os.getpid() not in pids
    finally:
        grid.close()
    monkeypatch.setattr(inprocess, "has_gpu", lambda: False)
    assert not InProcessGrid(app, {}, 2, workers=2).start_first


def test_spawned_workers_load_the_app_take_one_gpu_each_and_keep_each_nodes_state() -> None:
    """Catches spawned workers (clients on a GPU) that run a client in the run's process
    (whose CUDA context they could not share), lose a node's state between calls, or are
    not pinned to their GPU; the workers' GPUs are given in turn (here names only: no
    CUDA is touched)."""
    import functools
    import os

    from pflarena.runtime.inprocess import load_app_attr

    with pytest.raises(ValueError, match="app_loader"):
        InProcessGrid(app, {}, 2, workers=2, start_method="spawn")
    loader = functools.partial(load_app_attr, __name__, "app")
    grid = InProcessGrid(app, {}, 3, workers=2, start_method="spawn", gpus=("7", "5"),
                         app_loader=loader)  # fmt: skip
    try:
        (reply,) = grid.send_and_receive([_query(grid, grid.node_ids[0])])  # one message
        assert reply.content["a"]["n"] == 1 and grid._pool is not None
        for expected in (2, 3):
            replies = list(grid.send_and_receive([_query(grid, grid.node_ids[0])] + [
                _query(grid, n) for n in grid.node_ids[1:]]))  # fmt: skip
            assert [r.content["a"]["n"] for r in replies] == [expected, expected - 1,
                                                              expected - 1]  # fmt: skip
        gpus = [grid.create_message(RecordDict(), "query.gpu", n, "1") for n in grid.node_ids]
        seen = {(r.content["a"]["pid"], r.content["a"]["gpu"]) for r in
                grid.send_and_receive(gpus)}  # fmt: skip
        assert os.getpid() not in {pid for pid, _ in seen}
        assert {gpu for _, gpu in seen} <= {7, 5} and len(dict(seen)) == len(seen)
    finally:
        grid.close()


@app.query("gpu")
def _gpu(msg: Message, context) -> Message:
    import os

    gpu = int(os.environ.get("CUDA_VISIBLE_DEVICES", "-1"))
    return Message(RecordDict({"a": MetricRecord({"pid": os.getpid(), "gpu": gpu})}), reply_to=msg)


def test_the_plan_spawns_workers_shared_over_the_gpus_and_forks_them_on_the_cpu(
    monkeypatch,
) -> None:
    """Catches in-process clients on a GPU in forked workers (every one would fail at its
    first CUDA call), a default that leaves all but one GPU idle, and a run asking for
    a GPU where none is visible that fails inside every client instead of at once."""
    from pflarena.runtime import engines

    monkeypatch.delenv(engines.WORKER_START_ENV, raising=False)
    monkeypatch.setattr(engines, "available_cores", lambda: 16)
    monkeypatch.setattr(engines, "visible_gpus", lambda: ())
    with pytest.raises(ValueError, match="--device cuda: no GPU is visible"):
        engines.plan_engine("inprocess", device="cuda")
    with pytest.raises(ValueError, match="no GPU is visible"):
        engines.plan_engine(gpus_per_client=0.5)  # Ray would wait for ever
    cpu = engines.plan_engine("inprocess", device="auto")
    assert (cpu.workers, cpu.start_method, cpu.gpus) == (16, "fork", ())
    monkeypatch.setattr(engines, "visible_gpus", lambda: ("0", "1"))
    gpu = engines.plan_engine("inprocess", device="auto")
    assert (gpu.workers, gpu.start_method, gpu.gpus) == (4, "spawn", ("0", "1"))
    assert "on GPUs 0,1" in gpu.describe() and "spawn" in gpu.describe()
    assert engines.plan_engine("inprocess", device="cuda", clients_per_gpu=3).workers == 6
    assert engines.plan_engine("inprocess", device="cuda", workers=5).workers == 5
    few = engines.plan_engine("inprocess", device="cuda", num_clients=1)
    assert (few.workers, few.gpus) == (1, ("0",))
    assert engines.plan_engine("inprocess", device="cpu", workers=4).start_method == "fork"
    assert engines.plan_engine(gpus_per_client=0.5).engine == "ray"
    with pytest.raises(ValueError, match="needs --gpus-per-client"):
        engines.plan_engine("ray", device="cuda")
    monkeypatch.setattr(engines, "available_cores", lambda: 3)
    assert engines.plan_engine("inprocess", device="cuda").workers == 3  # a core each
    monkeypatch.setenv(engines.WORKER_START_ENV, "spawn")
    assert engines.plan_engine("inprocess", device="cpu", workers=2).start_method == "spawn"
    monkeypatch.setenv(engines.WORKER_START_ENV, "fork")
    with pytest.raises(ValueError, match="cannot use CUDA"):
        engines.plan_engine("inprocess", device="cuda")
    monkeypatch.setenv(engines.WORKER_START_ENV, "vfork")
    with pytest.raises(ValueError, match="choose one of fork, spawn"):
        engines.plan_engine("inprocess", device="cpu")


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ("0,1", ("0", "1")),
        ("", ()),
        ("-1", ()),
        ("2,-1,3", ("2",)),
        ("GPU-ab12, 1", ("GPU-ab12", "1")),
    ],
)
def test_visible_gpus_reads_cuda_visible_devices_as_cuda_does(monkeypatch, listed, expected):
    from pflarena.runtime import engines

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", listed)
    assert engines.visible_gpus() == expected
    assert engines.has_gpu() == bool(expected)


@app.query("total")
def _total(msg: Message, context) -> Message:
    total = sum(
        float(np.sum(a.numpy())) for r in msg.content.array_records.values() for a in r.values()
    )
    # a reply as large as a model: it crosses back in a file
    echo = ArrayRecord([np.full(40_000, total, dtype=np.float64)])
    return Message(RecordDict({"a": MetricRecord({"total": total}), "echo": echo}), reply_to=msg)


def _reply_slots_open() -> int:
    """How many of this process's open files are reply slots (or a mapping's copy of one)."""
    fds = Path(f"/proc/{os.getpid()}/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("/memfd:pflarena-reply")
    return count


def test_workers_get_a_shared_record_once_per_push_and_its_files_go_with_the_push() -> None:
    """Catches a worker that reads another push's (or a removed) copy of the global model, a
    message that loses its own records beside the shared one, a large reply that does not
    come back whole (or changes once its reply slot is written again), and files or reply
    slots left behind."""
    from pflarena.core.array_decoding import BufferArray
    from pflarena.runtime import parcel

    slots_before = _reply_slots_open()

    grid = InProcessGrid(app, {}, 4, workers=2)
    written: list[int] = []
    start_push = grid._files.start_push

    def counted(messages):
        stored = start_push(messages)
        written.append(len(stored))
        return stored

    grid._files.start_push = counted
    slots_usable = grid._slots.usable  # memory files for the replies (Linux)
    kept: dict[int, tuple[list[Message], list[float]]] = {}
    try:
        grid.start_workers()
        for push in (1, 2):  # the second push's model differs: no stale copy may be used
            model = ArrayRecord([np.full(40_000, float(push), dtype=np.float32)])
            messages = [
                grid.create_message(
                    RecordDict(
                        {"model": model, "own": ArrayRecord([np.full(20_000, i, np.float64)])}
                    ),
                    "query.total",
                    node,
                    group_id=str(push),
                )
                for i, node in enumerate(grid.node_ids)
            ]
            replies = list(grid.send_and_receive(messages))
            totals = [40_000 * push + 20_000 * i for i in range(4)]
            assert [r.content["a"]["total"] for r in replies] == totals
            kept[push] = (replies, totals)
            for held, (earlier, sums) in kept.items():  # push 1's replies, after push 2 too
                for reply, total in zip(earlier, sums, strict=True):
                    echo = reply.content["echo"]["0"]
                    assert np.array_equal(decode(echo, copy=False), np.full(40_000, total))
                    assert held < push or isinstance(echo, BufferArray) == slots_usable
            root = grid._files._root
            assert root is not None and root.stat().st_mode & 0o777 == 0o700
            # the push's files are gone with it, and each message's own and each reply's
            # once read
            assert [p.name for p in root.iterdir()] == ["once"]
            assert list((root / "once").iterdir()) == []
        assert written == [1, 1]  # the model, once a push; each message's own alone
        assert parcel.SPILL_MIN_BYTES <= 160_000
        if slots_usable:  # push 1's replies still hold theirs: push 2 took others
            assert grid._slots.held() >= 8
    finally:
        grid.close()
    assert not root.exists()
    del replies, reply, echo, earlier  # the replies (a mapping holds its slot's file open)
    kept.clear()
    assert _reply_slots_open() == slots_before


def test_a_nodes_context_is_made_by_its_first_message_and_then_kept() -> None:
    """A grid of 100,000 nodes makes no context up front; a message makes its node's, which
    keeps its state; the client ids are known from the node configs without making any; and
    iterating the contexts still gives every node, as a whole dict would."""
    grid = InProcessGrid(app, {"k": 1}, 100_000)
    assert grid.contexts.made == 0
    ids = grid.known_client_ids()
    assert ids is not None and len(ids) == 100_000 and grid.contexts.made == 0
    node = grid.node_ids[12_345]
    assert ids[node] == 12_345
    for expected in (1, 2):
        (reply,) = grid.send_and_receive([_query(grid, node)])
        assert reply.content["a"]["n"] == expected  # the state persisted between messages
    assert grid.contexts.made == 1
    context = grid.contexts[node]
    assert context.node_config == {"partition-id": 12_345, "num-partitions": 100_000}
    assert context.run_config == {"k": 1}
    assert len(grid.contexts) == 100_000 and node in grid.contexts
    with pytest.raises(KeyError):
        grid.contexts[7]
    small = InProcessGrid(app, {}, 3, node_configs=[{"data-path": f"/d/{i}"} for i in range(3)])
    assert [c.node_config["data-path"] for c in small.contexts.values()] == ["/d/0", "/d/1", "/d/2"]
    assert small.known_client_ids() is None
