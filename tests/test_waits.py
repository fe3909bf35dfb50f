"""Waits that follow the work (:mod:`pflarena.deploy.waits`): their schedule against a closed
form, and where they are installed in Flower's SuperNode loop, its SuperExec loop and the
ServerApp's Grid. The deployment tests (``test_deployment*.py``) run every fault scenario on
SuperNodes and executors with these waits."""

from __future__ import annotations

import importlib
import time

import pytest

from pflarena.deploy import executor, supernode
from pflarena.deploy.waits import ActivityPoll, PollClock


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_poll_is_fast_in_the_window_then_doubles_to_the_idle_wait() -> None:
    clock = Clock()
    poll = ActivityPoll(0.1, 3.0, window_s=30.0, now=clock)
    # Created: the first window is active.
    assert [poll.next_wait() for _ in range(3)] == [0.1, 0.1, 0.1]
    clock.t += 30.0
    waits = [poll.next_wait() for _ in range(8)]
    # 0.1 * 2^k, capped at 3: the closed form of the back-off.
    assert waits == [min(3.0, 0.1 * 2**k) for k in range(1, 9)]
    poll.touch()  # a message: fast again at once
    assert poll.next_wait() == 0.1
    clock.t += 29.9
    assert poll.next_wait() == 0.1
    clock.t += 0.2
    assert poll.next_wait() == 0.2


def test_a_fixed_poll_and_bad_settings() -> None:
    fixed = ActivityPoll(0.5, 0.5, window_s=0.0, now=Clock())
    assert {fixed.next_wait() for _ in range(5)} == {0.5}
    with pytest.raises(ValueError, match="active poll 5 s"):
        ActivityPoll(5.0, 3.0)
    with pytest.raises(ValueError, match="active poll 0.001 s"):
        ActivityPoll(0.001, 3.0)
    with pytest.raises(ValueError, match="negative"):
        ActivityPoll(0.1, 3.0, window_s=-1)


def test_the_clock_replaces_only_the_loops_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    poll = ActivityPoll(0.1, 3.0, window_s=30.0, now=Clock())
    clock = PollClock(poll, idle_sleep=3, reply_sleep=0.5, reply_s=0.02)
    for seconds in (3, 0.5, 10, 3.0):
        clock.sleep(seconds)
    assert slept == [0.1, 0.02, 10, 0.1]
    assert clock.monotonic is time.monotonic  # everything else passes through


@pytest.fixture
def loop(monkeypatch: pytest.MonkeyPatch):
    """Flower's SuperNode loop module, restored after the test."""
    module = supernode.check_loop_waits()
    for name in ("time", "pull_objects", "_pull_and_store_message"):
        monkeypatch.setattr(module, name, getattr(module, name))
    return module


def test_the_supernode_loop_gets_waits_that_follow_its_messages(loop) -> None:
    original_pull = loop.pull_objects
    results = iter([None, 7, None])
    loop._pull_and_store_message = lambda **kwargs: next(results)
    poll = supernode.patch_waits(3.0, 0.1, window_s=30.0)
    assert isinstance(loop.time, PollClock) and loop.time.poll is poll
    assert loop.pull_objects.func is original_pull
    assert loop.pull_objects.keywords == {
        "initial_backoff": supernode.FETCH_INITIAL_S,
        "backoff_cap": supernode.FETCH_CAP_S,
        "max_tries_per_object": None,
    }
    poll._last = -1e9  # long idle
    poll._wait = 3.0
    assert loop._pull_and_store_message() is None and poll.next_wait() == 3.0
    assert loop._pull_and_store_message() == 7  # a message came
    assert poll.next_wait() == 0.1


def test_the_supernode_loop_with_a_fixed_idle_poll(loop) -> None:
    poll = supernode.patch_waits(0.5)
    assert {poll.next_wait() for _ in range(4)} == {0.5}
    assert loop.pull_objects.keywords == {
        "initial_backoff": 0.5,
        "backoff_cap": 0.5,
        "max_tries_per_object": None,
    }
    assert loop.time.reply_sleep is None  # the reply checks stay Flower's
    with pytest.raises(ValueError, match="--active-poll 5"):
        supernode.patch_waits(3.0, 5.0)


def test_the_executors_task_poll_follows_its_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module("flwr.supercore.superexec.run_superexec")
    monkeypatch.setattr(module, "time", module.time)
    monkeypatch.setenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "1.0")
    poll = executor.patch_task_poll(0.05, 30.0)
    assert isinstance(module.time, PollClock) and module.time.idle_sleep is None
    assert (poll.active_s, poll.idle_s) == (0.05, 1.0)
    # An active poll above Flower's interval is that interval: a fixed poll.
    monkeypatch.setattr(module, "time", time)
    assert executor.patch_task_poll(2.0, 30.0).active_s == 1.0


@pytest.mark.parametrize("prompt", [False, True], ids=["flower", "pflarena"])
def test_the_serverapp_pulls_a_late_reply_promptly_and_past_flowers_500_tries(
    monkeypatch: pytest.MonkeyPatch, prompt: bool
) -> None:
    """A reply listed before its objects have arrived (a node pushing a large reply over a
    slow link: here 510 pulls of each object find it not yet there). Flower's pull waits
    1 s doubling to 10 s between tries and gives up after 500 (an error reply for a client
    that did reply); the ServerApp's waits 0.02 s doubling to 0.1 s, and gets the reply."""
    import threading
    from types import SimpleNamespace

    from fake_superlink import FakeSuperLink, serverapp_identity
    from flwr.app import Message, MetricRecord, RecordDict
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.superlink.grid import http_grid

    from pflarena.server import polling

    serverapp_identity(monkeypatch)
    # Flower's own pull (an earlier test's ServerApp set up may have made it prompt)
    flower_pull = getattr(http_grid.pull_objects, "func", http_grid.pull_objects)
    monkeypatch.setattr(http_grid, "pull_objects", flower_pull)
    waits: list[float] = []

    class Event(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:  # recorded, not waited
            waits.append(float(timeout or 0.0))
            return self.is_set()

    monkeypatch.setattr(
        inflatable_utils, "threading", SimpleNamespace(Event=Event, Lock=threading.Lock)
    )
    if prompt:
        polling._prompt_reply_objects()
        polling._prompt_reply_objects()  # twice in a process: the same waits
    link = FakeSuperLink(
        lambda node, m: Message(RecordDict({"m": MetricRecord({"n": node})}), reply_to=m)
    )
    link.delay_objects(510)
    grid = polling.PromptGrid(link.grid(), poll=0.001)
    (reply,) = grid.send_and_receive(
        [Message(RecordDict(), dst_node_id=1, message_type="train")], timeout=60
    )
    if prompt:
        assert not reply.has_error() and reply.content["m"]["n"] == 1
        assert min(waits) >= 0.02 * 0.8 and max(waits) <= 0.1 * 1.2  # Flower's ±20% jitter
    else:
        assert reply.has_error() and "unavailable" in reply.error.reason
        assert max(waits) > 8.0


def test_prompt_object_pulls_are_bounded_by_time_not_by_flowers_500_tries(
    loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 0.02-0.1 s between tries, Flower's 500 tries end after about 50 s: a message's
    objects still on their way over a dropped link were given up (the warm child then never
    replied, and its node waited for that reply forever). The prompt pulls keep Flower's time
    bound only: an object that turns up after 600 tries is pulled."""
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, ObjectUnavailableError
    from flwr.supernode.runtime import run_clientapp

    def arriving_after(tries: int):
        asked: list[int] = []

        def pull(object_id: str) -> bytes:
            asked.append(1)
            if len(asked) <= tries:
                raise ObjectUnavailableError(object_id)
            return b"content"

        return pull

    fast = {"initial_backoff": 1e-5, "backoff_cap": 1e-5}  # the test's own waits
    with pytest.raises(ObjectPullError):  # Flower's bound on the tries
        loop.pull_objects(["a"], arriving_after(600), **fast)
    supernode.patch_waits(3.0, 0.1, window_s=30.0)
    assert loop.pull_objects(["a"], arriving_after(600), **fast) == {"a": b"content"}

    # The warm child's pull of its message from its SuperNode: the same bound.
    for name in ("pull_and_inflate_object_from_tree", "install_from_fab", "get_load_client_app_fn"):
        monkeypatch.setattr(run_clientapp, name, getattr(run_clientapp, name))
    executor.patch_clientapp_runtime()
    assert run_clientapp.pull_and_inflate_object_from_tree.keywords["max_tries_per_object"] is None
