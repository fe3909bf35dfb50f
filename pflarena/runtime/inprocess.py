"""The in-process engine (the default): the real ServerApp and ClientApp without Ray.

``pflarena run`` (``--engine inprocess``) runs a run with the same components as a Flower
simulation (the ServerApp and ClientApp that ``pyproject.toml`` names, the run config fused
by Flower from ``[tool.flwr.app.config]`` and the overrides, one ``Context`` per node with
``partition-id`` and ``num-partitions`` in its node config and its own ``state``, made when
the node gets its first message: :class:`NodeContexts`), but the Grid hands each message to
the ClientApp itself instead of a SuperLink.

**Workers.** With ``workers`` above 1 the clients of a round run side by side in that many
worker processes. On the CPU they are forked once the clients' calls have kept the run's
process busy for :data:`FORK_AFTER_S` in one push (clients that take less, a round of digits,
are not worth a fork), after the imports, the ServerApp's set-up and the first clients' data:
torch, Flower, the app and the federation's data are imported and built once and inherited,
as the warm executor does its imports (:mod:`pflarena.deploy.executor`). torch runs at one
thread in the parent until it has forked (a thread pool does not survive a fork), each worker
at ``threads // workers``. Clients on a GPU need workers started with ``spawn`` (CUDA cannot
cross a fork: "Cannot re-initialize CUDA in forked subprocess"): each is a fresh interpreter
that imports the ClientApp itself (``app_loader``) and is pinned to one GPU of ``gpus`` by
``CUDA_VISIBLE_DEVICES`` before it touches CUDA; they start at the first message, and no
client runs in the run's process, which never creates a CUDA context. Each worker gets a
message and its node's ``Context``, runs the ClientApp and sends back the reply and the
node's updated ``Context``.
With ``workers=1`` the clients run one after another in the process itself (a plain
debugger sees them). Results do not depend on the number of workers or how they start: a
ClientApp seeds torch per message and derives its data from the run config
(``tests/test_inprocess.py``).

Every message and every reply crosses the Grid as a :class:`~pflarena.runtime.parcel.Parcel`:
Flower's wire format, with the arrays' bytes carried beside it instead of copied into it, so
that the message a ClientApp gets (and the reply the server gets) is the one Flower's
protobuf round trip gives, as between a SuperLink and a SuperNode, sharing only immutable
bytes with the sender's: a ClientApp can never change the server's copy of a record in
place, and the run's ``rounds.jsonl`` is the one the Ray engine gives
(``tests/test_startup.py``). Large records cross to and from the worker processes in files
(a record the messages of one push share, the global model, once for the push), not through
the pool's pipe (:mod:`pflarena.runtime.parcel`).

A slow client costs only itself: each ClientApp call gets its message's time to live (the
run loop sets it to ``round-timeout``). A call still running then is abandoned: the message
gets no reply (the server records no reply within the round timeout), and the node gets no
further message until that call has ended (a SuperNode works one message at a time). Where
it was is not lost: the Python stacks of the call's thread (or, with workers, of every
worker process: each writes its own with :mod:`faulthandler` on :data:`STACKS_SIGNAL`,
which needs no lock and so works in a worker stuck in a deadlock) are appended to
``stuck-calls.txt`` in the run's output directory (:class:`StuckCalls`), and the warning
names that file. A worker that dies (a crash, the kernel's OOM killer) costs the replies it
owed: they become error replies, and a fresh set of workers is forked.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime, timezone
from logging import WARNING
from pathlib import Path
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from pflarena.core.phases import mark
from pflarena.runtime.engines import START_METHODS, has_gpu
from pflarena.runtime.parcel import (
    Parcel,
    ParcelFiles,
    ReplySlots,
    Spilled,
    copy_message,
    pack,
    unpack,
)
from pflarena.runtime.processes import die_with_parent

__all__ = ["InProcessGrid", "run_inprocess"]

#: Seconds one push of messages may keep the run's process busy before the workers are
#: forked: clients that take less (a round of digits: half a second) are not worth a fork.
FORK_AFTER_S = 1.0
#: Environment: another :data:`FORK_AFTER_S` (0: fork at the first message; tests).
FORK_AFTER_ENV = "PFLARENA_FORK_AFTER_S"
#: Calls submitted to the workers and not yet collected, per worker: enough that a worker
#: finds its next message waiting, few enough that a push of thousands of messages holds
#: only a few of their parcels (and replies) at a time.
IN_FLIGHT_PER_WORKER = 2
#: The ClientApp a forked worker calls (set in the parent before it forks).
_WORKER_APP: dict[str, ClientApp] = {}
#: A worker's file for its stacks (:func:`_worker_init`).
_WORKER_STACKS: list[Any] = []
#: The signal on which a worker writes the Python stacks of its threads (:class:`StuckCalls`).
STACKS_SIGNAL = signal.SIGUSR1
#: Seconds the run's process waits for the workers' stacks.
STACKS_WAIT_S = 2.0
#: The file of the run's output directory the stacks of calls past their time go to.
STUCK_CALLS_FILE = "stuck-calls.txt"


class StuckCalls:
    """Where a call that ran past its message's time to live was: the Python stacks of its
    thread, or of every worker process, appended to :data:`STUCK_CALLS_FILE` in ``output_dir``
    (None: no file; the warning then carries them).

    Each worker registers :mod:`faulthandler` on :data:`STACKS_SIGNAL` at its start, writing
    to a file of its own in :meth:`directory` (made with ``tempfile.mkdtemp``: this user's
    alone); faulthandler's handler takes no lock (it writes from the signal handler itself),
    so it answers from a worker whose threads are stuck on a lock. Which worker runs which
    call is not known to the run's process, so every worker is asked."""

    def __init__(self, output_dir: Path | None) -> None:
        self.output_dir = output_dir
        self._dir: Path | None = None

    def directory(self) -> str | None:
        """The directory the workers write their stacks in (made on first use); None where
        it cannot be made (no stacks are then asked for)."""
        if self._dir is None:
            try:
                self._dir = Path(tempfile.mkdtemp(prefix="pflarena-stacks-"))
            except OSError:
                return None
        return str(self._dir)

    def of_workers(self, pids: Iterable[int]) -> str:
        """Ask each worker ``pids`` for its stacks; what they wrote within
        :data:`STACKS_WAIT_S` (a worker that wrote nothing is said so)."""
        if self._dir is None:
            return "(the workers' stacks could not be asked for)"
        asked: dict[int, tuple[Path, int]] = {}
        for pid in pids:
            path = self._dir / f"{pid}.txt"
            start = _size(path)
            with contextlib.suppress(OSError):  # a worker gone meanwhile is not waited for
                os.kill(pid, STACKS_SIGNAL)
                asked[pid] = (path, start)
        deadline = time.monotonic() + STACKS_WAIT_S
        sizes: dict[int, int] = {}
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = {pid: _size(path) for pid, (path, _) in asked.items()}
            # written, and no longer growing: each worker's dump is done
            if now == sizes and all(now[p] > start for p, (_, start) in asked.items()):
                break
            sizes = now
        parts = []
        for pid, (path, start) in asked.items():
            try:
                with open(path, "rb") as handle:
                    handle.seek(start)
                    text = handle.read().decode(errors="replace").rstrip()
            except OSError:
                text = ""
            parts.append(f"worker process {pid}:\n{text or '(wrote nothing)'}")
        return "\n\n".join(parts)

    def record(self, node_id: int, msg: Message, stacks: str) -> Path | None:
        """Append the stacks of ``node_id``'s call on ``msg`` to the output directory's
        file; that file, or None where it could not be written."""
        if self.output_dir is None:
            return None
        path = self.output_dir / STUCK_CALLS_FILE
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        head = (
            f"{when}: node {node_id}'s ClientApp, on a {msg.metadata.message_type} message, "
            f"ran past its time to live ({msg.metadata.ttl:.0f} s). Where it was:"
        )
        try:
            with open(path, "a") as handle:
                handle.write(f"{head}\n\n{stacks}\n\n")
        except OSError:
            return None
        return path

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _thread_stack(thread: threading.Thread) -> str:
    """The Python stack of ``thread`` (a call running in this process) as a traceback."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None:
        return "(its thread has ended)"
    return f"thread {thread.name}:\n" + "".join(traceback.format_stack(frame)).rstrip()


def _worker_init(threads: int, stacks_dir: str | None = None) -> None:
    """A forked worker's start: a session of its own, Ctrl-C and SIGTERM its parent's to
    handle (the parent ends its workers), its own torch thread count, its stacks written to
    a file of its own in ``stacks_dir`` on :data:`STACKS_SIGNAL` (:class:`StuckCalls`), and
    it exits with its parent.

    A session of its own because Linux's autogroup scheduling (on by default on many
    distributions) shares one fair share of the CPUs among all the processes of a session:
    two workers in the run's session took 5.8 s for what one process does in 2.2 s twice
    over, on a machine other sessions kept busy; in sessions of their own, 3.5 s."""
    with contextlib.suppress(OSError):
        os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.unraisablehook = sys.__unraisablehook__  # the parent's raises interrupts again
    signal.signal(STACKS_SIGNAL, signal.SIG_IGN)  # asked for stacks it cannot write: nothing
    if stacks_dir is not None:
        with contextlib.suppress(OSError):
            # kept open for the process's life: faulthandler writes to its descriptor
            _WORKER_STACKS.append(open(os.path.join(stacks_dir, f"{os.getpid()}.txt"), "a"))  # noqa: SIM115
            faulthandler.register(STACKS_SIGNAL, file=_WORKER_STACKS[-1], all_threads=True)
    die_with_parent()
    import torch

    torch.set_num_threads(threads)


def _spawned_worker_init(
    threads: int, app_loader: Callable[[], ClientApp], gpus: Any, stacks_dir: str | None = None
) -> None:
    """A spawned worker's start: its GPU (the next of the parent's queue ``gpus``, if any)
    set in ``CUDA_VISIBLE_DEVICES`` before anything touches CUDA, then the forked worker's
    start (:func:`_worker_init`) and the ClientApp loaded here (``spawn`` gives the worker
    the parent's ``sys.path`` as it was at the worker's start)."""
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpus.get(timeout=60))
    _worker_init(threads, stacks_dir)
    _WORKER_APP["app"] = app_loader()
    from pflarena.core.training import warm_optimizers

    warm_optimizers()  # torch._dynamo's import (~1.5 s) here, not in the first round


def load_app_attr(module: str, attr: str) -> ClientApp:
    """``module.attr``: an ``app_loader`` for a ClientApp defined at a module's top level,
    picklable as ``functools.partial(load_app_attr, module, attr)``."""
    import importlib

    return getattr(importlib.import_module(module), attr)


def _worker_ready(_: int = 0) -> int:
    return os.getpid()


def _worker_call(
    parcel: Parcel, context: Context, spill_to: str | None, slot: str | None = None
) -> tuple[Parcel | None, str | None, Context]:
    """Run one message through the ClientApp in a worker: the reply (a parcel, its large
    records written to the reply slot ``slot``, else to files in ``spill_to``, where given)
    or the exception's text, and the node's context as the call left it."""
    try:
        reply = _WORKER_APP["app"](unpack(parcel), context)
        spill_dir = None if spill_to is None else Path(spill_to)
        return pack(reply, spill_to=spill_dir, slot=slot), None, context
    except Exception as exc:  # noqa: BLE001 - mirrors Flower's error replies
        return None, f"{type(exc).__name__}: {exc}", context


class NodeContexts(MutableMapping[int, Context]):
    """Node id -> the node's ``Context``, each made on its first use: a federation of
    100,000 simulated nodes holds the contexts of the nodes it sent a message to (about
    2 KB each: a copy of the run config, the node config, an empty state), not one per node
    from the start. Iterating gives every node, as a dict made whole would (its contexts
    made then)."""

    def __init__(
        self,
        node_ids: list[int],
        node_config: Callable[[int], dict],
        *,
        run_id: int,
        run_config: dict,
    ) -> None:
        self._index = {node_id: i for i, node_id in enumerate(node_ids)}
        self._node_config = node_config
        self._run_id = run_id
        self._run_config = dict(run_config)
        self._made: dict[int, Context] = {}

    def node_config(self, node_id: int) -> dict:
        """The node's config, without making its context."""
        if node_id in self._made:
            return self._made[node_id].node_config
        return self._node_config(self._index[node_id])

    def __getitem__(self, node_id: int) -> Context:
        context = self._made.get(node_id)
        if context is None:
            if node_id not in self._index:
                raise KeyError(node_id)
            context = Context(
                run_id=self._run_id,
                node_id=node_id,
                node_config=self._node_config(self._index[node_id]),
                state=RecordDict(),
                run_config=dict(self._run_config),
            )
            self._made[node_id] = context
        return context

    def __setitem__(self, node_id: int, context: Context) -> None:
        if node_id not in self._index:
            raise KeyError(f"no node {node_id} in this grid")
        self._made[node_id] = context

    def __delitem__(self, node_id: int) -> None:
        raise TypeError("a grid's nodes stay: a node that leaves is marked offline")

    def __iter__(self) -> Iterator[int]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    @property
    def made(self) -> int:
        """How many contexts have been made."""
        return len(self._made)


class InProcessGrid(Grid):
    """A Flower Grid whose nodes are ClientApp calls in this process.

    Each node has its own ``Context`` (node config, persistent state, run config), so client
    state persists across rounds exactly as on a SuperNode. A handler's exception becomes an
    error reply, as in Flower. ``offline`` node ids get messages but send no reply (a node
    that died); ``reply_filter`` may replace a reply before the server sees it; with
    ``keep_sent`` every message sent is kept in ``sent`` (for tests).
    """

    def __init__(
        self,
        client_app: ClientApp,
        run_config: dict,
        num_nodes: int,
        *,
        node_configs: list[dict] | None = None,
        node_id_base: int = 1_000_003,
        run_id: int = 1,
        keep_sent: bool = False,
        wire: bool = True,
        workers: int = 1,
        start_method: str = "fork",
        gpus: Iterable[str] = (),
        app_loader: Callable[[], ClientApp] | None = None,
        output_dir: Path | None = None,
    ) -> None:
        self.client_app = client_app
        #: ClientApp calls run at once, each in a worker process (1: in this process)
        self.workers = max(1, int(workers))
        if start_method not in START_METHODS:
            raise ValueError(f"start method {start_method!r}: one of {', '.join(START_METHODS)}")
        if start_method == "spawn" and self.workers > 1 and app_loader is None:
            raise ValueError("spawned workers load the ClientApp themselves: give app_loader")
        #: how the workers start: ``fork`` (the CPU's) or ``spawn`` (a GPU's: CUDA survives it)
        self.start_method = start_method
        #: the GPUs the workers are shared out over (worker i on gpus[i % len(gpus)])
        self.gpus = tuple(gpus)
        self.app_loader = app_loader
        self._pool: ProcessPoolExecutor | None = None
        self._pool_broken = False
        #: the files the large records cross to and from the workers in
        self._files = ParcelFiles()
        #: the memory files the workers write their replies' large records into
        self._slots = ReplySlots()
        #: where a call past its time was (``stuck-calls.txt`` in ``output_dir``)
        self._stuck = StuckCalls(output_dir)
        #: the workers' stacks, asked for once per push (its collections share them)
        self._push_stacks: str | None = None
        #: the workers are forked once one push has kept this process busy this long
        self.fork_after_s = float(os.environ.get(FORK_AFTER_ENV, FORK_AFTER_S))
        #: start the workers before any call runs in this process: spawned workers (clients
        #: on a GPU: none runs here, so this process never creates a CUDA context), and
        #: forked ones where a GPU is visible, since a client's backward pass here starts
        #: autograd's device threads (torch's CUDA build, with a GPU) and a worker forked
        #: after it fails every backward pass ("Unable to handle autograd's threading in
        #: combination with fork-based multiprocessing": FedAvg-FT with --device cpu on an
        #: H200).
        self.start_first = start_method == "spawn" or has_gpu()
        self._threads = 0  # torch's threads in this process before the workers were forked
        if self.workers > 1 and start_method == "fork":
            import torch

            # No torch thread pool in this process before it forks (one does not survive a
            # fork: a child using it can hang); each worker gets its share of these threads.
            self._threads = torch.get_num_threads()
            torch.set_num_threads(1)
        self.node_ids = [node_id_base * (i + 7) % 2**61 for i in range(num_nodes)]
        if node_configs is not None and len(node_configs) != num_nodes:
            raise ValueError(f"{len(node_configs)} node configs for {num_nodes} nodes")
        self.contexts = NodeContexts(
            self.node_ids,
            lambda i: (
                dict(node_configs[i])
                if node_configs is not None
                else {"partition-id": i, "num-partitions": num_nodes}
            ),
            run_id=run_id,
            run_config=run_config,
        )
        self.offline: set[int] = set()
        self.keep_sent = keep_sent
        self.wire = wire
        self.sent: list[Message] = []
        #: nodes whose last call ran past its message's time to live and still runs
        self.busy: dict[int, threading.Thread | Future] = {}
        self.reply_filter: Callable[[Message], Message] | None = None
        self._replies: dict[str, Message] = {}  # pushed, not yet pulled
        self._run = Run.create_empty(run_id=run_id)
        # Messages read the run and node identity of the process that creates them.
        TaskIdentity.run_id = run_id
        TaskIdentity.node_id = 0
        TaskIdentity.task_id = 0

    # -- Grid API -----------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(
            content=content,
            message_type=message_type,
            dst_node_id=dst_node_id,
            group_id=group_id,
            ttl=ttl,
        )

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.node_ids if n not in self.offline]

    def known_client_ids(self) -> dict[int, int] | None:
        """Each node's client id, known without a message: a simulated node's
        ``partition-id`` is the client whose data it builds (the federation's client, or the
        shard directory's file of that id). None where a node reads a file of its own
        (``data-path``): only the file says which client it holds."""
        ids = {}
        for node_id in self.node_ids:
            config = self.contexts.node_config(node_id)
            if "data-path" in config or "partition-id" not in config:
                return None
            ids[node_id] = int(config["partition-id"])
        return ids

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message to its node's ClientApp now (side by side in the worker
        processes, if any); the replies wait for :meth:`pull_messages`. Returns the
        messages' ids."""
        messages = list(messages)
        parallel = len(messages) > 1 or self.start_method == "spawn"
        if self.workers > 1 and not self._pool_broken and parallel:
            try:
                return self._push_parallel(messages)
            finally:
                self._files.end_push()
                self._slots.end_push()
        ids = []
        for msg in messages:
            reply = self._deliver(msg)
            ids.append(msg.metadata.message_id)
            if reply is not None:
                self._replies[msg.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies to those of ``message_ids`` that have one (once each, as Flower's)."""
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    def _receive(self, msg: Message) -> Message | None:
        """Stamp ``msg`` as sent; the message its node's ClientApp is to get, or None when
        the node is offline or still busy with an earlier message."""
        msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
        msg.metadata.__dict__["_src_node_id"] = 0
        msg.metadata.__dict__["_run_id"] = self._run.run_id
        if self.keep_sent:
            self.sent.append(msg)
        node_id = msg.metadata.dst_node_id
        if node_id in self.offline:
            return None  # no reply, as for a node that died
        if node_id in self.busy:
            running = self.busy[node_id]
            if isinstance(running, threading.Thread):
                alive = running.is_alive()
            else:
                alive = not running.done()
            if alive:
                return None  # still on a message it ran too long on
            del self.busy[node_id]
        return msg

    def _finish(self, reply: Message, node_id: int, *, fresh: bool = False) -> Message:
        """``reply`` as the server gets it: from ``node_id``, crossed over the wire unless it
        is ``fresh`` (unpacked from a worker's parcel, or made here: it shares nothing with the
        ClientApp's objects), filtered."""
        reply.metadata.__dict__["_src_node_id"] = node_id
        if self.wire and not fresh:
            reply = copy_message(reply)
        if self.reply_filter is not None:
            reply = self.reply_filter(reply)
        return reply

    def _deliver(self, msg: Message) -> Message | None:
        """Run ``msg`` through its node's ClientApp; its reply (None from an offline node)."""
        if self._receive(msg) is None:
            return None
        node_id = msg.metadata.dst_node_id
        received = copy_message(msg) if self.wire else msg
        reply = self._call(received, msg, node_id)
        if reply is None:
            return None
        return self._finish(reply, node_id)

    # -- worker processes -----------------------------------------------------------
    def start_workers(self) -> None:
        """Start the worker processes now (:meth:`push_messages` does when the clients are
        worth it). Forked, they inherit everything imported and built so far; torch runs at
        one thread in this process while it forks. Spawned, each imports the ClientApp
        itself and takes the next GPU of :attr:`gpus`. Each worker runs torch at this
        machine's threads shared among the workers."""
        if self.workers <= 1 or self._pool is not None or self._pool_broken:
            return
        import torch

        threads = self._threads or torch.get_num_threads()
        per_worker = max(1, threads // self.workers)
        if self.start_method == "spawn":
            pool = self._spawn_workers(per_worker)
        else:
            _WORKER_APP["app"] = self.client_app
            gc.freeze()  # what the workers inherit stays shared: no collection touches it
            try:
                pool = ProcessPoolExecutor(
                    self.workers,
                    mp_context=multiprocessing.get_context("fork"),
                    initializer=_worker_init,
                    initargs=(per_worker, self._stuck.directory()),
                )
                # With fork, every worker is started at the first submission, before the
                # executor's own thread: all of them are forked here.
                list(pool.map(_worker_ready, range(self.workers)))
            finally:
                torch.set_num_threads(threads)  # the forks are done: this process's own again
                self._threads = 0
        self._pool = pool

    def _spawn_workers(self, threads: int) -> ProcessPoolExecutor:
        """:attr:`workers` spawned workers, worker ``i`` on GPU ``gpus[i % len(gpus)]``,
        started and ready (their imports done) when this returns."""
        context = multiprocessing.get_context("spawn")
        slots = None
        if self.gpus:
            slots = context.Queue()
            for index in range(self.workers):
                slots.put(self.gpus[index % len(self.gpus)])
        pool = ProcessPoolExecutor(
            self.workers,
            mp_context=context,
            initializer=_spawned_worker_init,
            initargs=(threads, self.app_loader, slots, self._stuck.directory()),
        )
        # A spawned pool starts a worker for each submission no idle worker takes: as many
        # submissions as workers start them all here, and waiting for the answers waits for
        # their imports, which then fall in no round's time.
        list(pool.map(_worker_ready, range(self.workers)))
        return pool

    def close(self) -> None:
        """End the worker processes (calls still running are abandoned), and give this
        process its torch threads back."""
        if self._threads:
            import torch

            torch.set_num_threads(self._threads)
            self._threads = 0
        if self._pool is not None:
            pool, self._pool = self._pool, None
            processes = list(getattr(pool, "_processes", {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                with contextlib.suppress(Exception):
                    process.kill()
            for process in processes:  # gone before their reply slots' numbers are let go
                with contextlib.suppress(Exception):
                    process.join(timeout=5)
        self._files.close()
        self._slots.close()
        self._stuck.close()

    def _push_parallel(self, messages: list[Message]) -> list[str]:
        """:meth:`push_messages` with each node's call in a worker process; a node given two
        messages gets the second once the first has been answered (its context goes with
        each call). Until the workers are forked, the calls run in this process, one by one;
        once they have taken :attr:`fork_after_s` seconds the workers are forked (they
        inherit the data those calls built) and take the rest.

        At most :data:`IN_FLIGHT_PER_WORKER` calls per worker are submitted and not yet
        collected: each holds its message's parcel (the records of its own: a personalized
        model, 6.6 MB for MNIST's CNN; a shared one is a file written once) and then its
        reply until collected, so that submitting a round of thousands at once would hold
        thousands of them."""
        began = time.monotonic()
        stored: dict[int, Spilled] | None = None
        self._push_stacks = None  # asked for at the push's first call past its time
        ids: list[str] = []
        pending: list[tuple[Message, int, Future, float, str | None]] = []
        window = IN_FLIGHT_PER_WORKER * self.workers
        for msg in messages:
            node_id = msg.metadata.dst_node_id
            if any(call[1] == node_id for call in pending):
                self._collect(pending)
                pending = []
            elif len(pending) >= window:  # the oldest call's reply first
                self._collect(pending[:1])
                pending = pending[1:]
            received = self._receive(msg)
            ids.append(msg.metadata.message_id)
            if received is None:
                continue
            if self._pool is None and self.start_first:
                self.start_workers()
            if self._pool is None:  # not forked (yet), or the workers died: run it here
                reply = self._call(copy_message(msg), msg, node_id)
                if reply is not None:
                    self._replies[msg.metadata.message_id] = self._finish(reply, node_id)
                if time.monotonic() - began > self.fork_after_s:
                    self.start_workers()
                continue
            if stored is None:  # the records the messages share, written once for the workers
                stored = self._files.start_push(messages)
            once = self._files.once  # a message's own large records (and replies' no slot takes)
            parcel = pack(msg, stored, spill_to=once)
            spill_to = None if once is None else str(once)
            slot = self._slots.take()
            context = self.contexts[node_id]
            future = self._pool.submit(_worker_call, parcel, context, spill_to, slot)
            pending.append((msg, node_id, future, time.monotonic(), slot))
        self._collect(pending)
        return ids

    def _collect(self, pending: list[tuple[Message, int, Future, float, str | None]]) -> None:
        """Wait for the calls ``pending``, each for its message's time to live from its
        submission, and keep their replies and contexts."""
        from concurrent.futures.process import BrokenProcessPool

        for msg, node_id, future, submitted, slot in pending:
            ttl = msg.metadata.ttl
            deadline = None if not ttl else submitted + ttl
            try:
                payload, problem, context = _result(future, deadline)
            except FutureTimeout:
                if slot is not None:  # its worker may still write it
                    self._slots.abandon(slot)
                self.busy[node_id] = future
                if self._push_stacks is None:
                    processes = getattr(self._pool, "_processes", None) or {}
                    self._push_stacks = self._stuck.of_workers(list(processes))
                self._past_its_time(node_id, msg, self._push_stacks)
                continue
            except BrokenProcessPool as exc:
                if not self._pool_broken:
                    log(
                        WARNING,
                        "pflarena: a worker process died (%s); its clients' messages get "
                        "error replies, the next ones run in the run's process",
                        exc,
                    )
                self._pool_broken = True
                if slot is not None:
                    self._slots.abandon(slot)
                self.close()
                reason = f"WorkerDied: the worker process running this client died ({exc})"
                reply = Message(Error(code=0, reason=reason), reply_to=msg)
            else:
                self.contexts[node_id] = context
                if payload is None:
                    reply = Message(Error(code=0, reason=str(problem)), reply_to=msg)
                else:
                    try:
                        reply = unpack(payload, self._slots)
                    except OSError as exc:  # its file is gone (the workers were ended)
                        reason = f"ReplyLost: the reply's records could not be read ({exc})"
                        reply = Message(Error(code=0, reason=reason), reply_to=msg)
                if slot is not None:  # free now, or once the reply mapped from it is gone
                    self._slots.done(slot)
            self._replies[msg.metadata.message_id] = self._finish(reply, node_id, fresh=True)

    def _past_its_time(self, node_id: int, msg: Message, stacks: str) -> None:
        """Say that ``node_id``'s call on ``msg`` ran past its time to live, and record
        where it was (``stacks``) in the run's ``stuck-calls.txt``."""
        written = self._stuck.record(node_id, msg, stacks)
        log(
            WARNING,
            "pflarena: node %d's ClientApp ran past the round timeout (%.0fs); no reply, the "
            "next client runs; %s",
            node_id,
            msg.metadata.ttl,
            f"where it was: {written}" if written else f"where it was:\n{stacks}",
        )

    def _call(self, received: Message, msg: Message, node_id: int) -> Message | None:
        """The ClientApp's reply to ``received`` (an error reply if it raised), or None
        when it is still running once the message's time to live has passed."""
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["reply"] = self.client_app(received, self.contexts[node_id])
            except Exception as exc:  # noqa: BLE001 - mirrors Flower's error replies
                reason = f"{type(exc).__name__}: {exc}"
                outcome["reply"] = Message(Error(code=0, reason=reason), reply_to=msg)
            except BaseException as exc:  # an interrupt: raised again in the caller
                outcome["raise"] = exc

        thread = threading.Thread(target=call, name=f"pflarena-node-{node_id}", daemon=True)
        thread.start()
        ttl = msg.metadata.ttl
        _join(thread, None if not ttl else time.monotonic() + ttl)
        if thread.is_alive():
            self.busy[node_id] = thread
            self._past_its_time(node_id, msg, _thread_stack(thread))
            return None
        if "raise" in outcome:
            raise outcome["raise"]
        return outcome["reply"]


#: Seconds between the run's thread's looks at the signals that arrived while it waits for
#: a client: the kernel may give a Ctrl-C to another thread, and the Python handler runs on
#: the main one only once its wait returns.
WAKE_S = 0.2


def _join(thread: threading.Thread, deadline: float | None) -> None:
    """``thread.join`` until ``deadline`` (``time.monotonic``; None: no limit), in steps of
    :data:`WAKE_S`, so that a signal is handled within a step."""
    while thread.is_alive():
        left = WAKE_S if deadline is None else min(WAKE_S, deadline - time.monotonic())
        if left <= 0:
            return
        thread.join(left)


def _result(future: Future, deadline: float | None) -> Any:
    """``future.result`` by ``deadline`` (None: no limit; ``FutureTimeout`` past it), waiting
    in steps of :data:`WAKE_S` (:func:`_join`)."""
    while True:
        left = WAKE_S if deadline is None else min(WAKE_S, deadline - time.monotonic())
        try:
            return future.result(timeout=max(0.0, left))
        except FutureTimeout:
            if deadline is not None and time.monotonic() >= deadline:
                raise


def run_inprocess(
    app: Any,
    run_config: dict[str, Any],
    num_supernodes: int,
    scratch: Path,
    workers: int = 1,
    *,
    start_method: str = "fork",
    gpus: Iterable[str] = (),
) -> None:
    """One run of ``app`` (a :class:`~pflarena.runtime.simulation.FlowerApp`) in this process,
    its clients in ``workers`` worker processes (1: in this process, one by one) started with
    ``start_method``, shared out over ``gpus`` (:class:`InProcessGrid`).

    ``run_config`` holds the overrides, fused with the app's defaults by Flower's own
    parser as for a simulation. Raises the ServerApp's exception if it raised (the app
    writes its own results files, a failed run's included).
    """
    import functools

    from flwr.common.config import get_fused_config_from_dir
    from flwr.supercore.object_ref import load_app

    from pflarena.runtime.flowerapp import flower_overrides, load_client_app

    if str(app.root) not in sys.path:
        sys.path.insert(0, str(app.root))
    overrides = flower_overrides(run_config, scratch)
    fused = get_fused_config_from_dir(app.root, overrides)
    server_app = load_app(app.server_app_attr, ValueError, str(app.root))
    grid = InProcessGrid(
        load_client_app(app),
        fused,
        num_supernodes,
        workers=min(workers, num_supernodes),
        start_method=start_method,
        gpus=gpus,
        app_loader=functools.partial(load_client_app, app),
        output_dir=Path(str(fused["output-dir"])) if fused.get("output-dir") else None,
    )
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=fused)
    # Everything imported so far (torch, Flower, half a million objects) lives as long as
    # the process: out of the collector's sight, a full collection no longer walks it
    # (about 0.2 s each, which fell inside some rounds and doubled them).
    gc.freeze()
    _warm_torch()
    mark("torch.optim warmed (torch._dynamo imported)")
    # Forked workers start once the clients are worth it (InProcessGrid._push_parallel),
    # after the ServerApp has set up: they inherit what was built (the federation's data),
    # as the clients calling in this process would find it.
    try:
        server_app(grid, context)
    finally:
        grid.close()


def _warm_torch() -> None:
    """Import what a ClientApp's first ``torch.optim`` call imports lazily
    (``torch._dynamo``, ~1.5 s) once, before the workers are forked
    (:func:`pflarena.deploy.executor.warm_up` does the same)."""
    import torch
    import torch._dynamo  # noqa: F401

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        from pflarena.core.training import warm_optimizers

        warm_optimizers()
    finally:
        torch.set_num_threads(threads)
