"""A client's method state: on disk, versioned, and committed only once the server used it.

A solver reads and writes named ArrayRecords (``pfedgt/personal-model``, ...) through
:class:`ClientState`. What a message writes becomes a new *version*, named by the message's
``update-id``; it is a full snapshot (unchanged entries are hard links on disk, so a version
costs only what changed). Every message also says which of this client's versions the
server last accepted (``accepted``). On arrival the client therefore

1. makes the accepted version current (the newest one not after it, if that one is gone),
2. deletes versions after it: updates the server rejected, lost, or (after a resume from a
   checkpoint) never saw,
3. keeps, of the versions before it, only the one the run's last checkpoint accepted
   (``checkpointed``), which a server restarted from that checkpoint rolls the client back
   to, and deletes the others. A server that does not say (``checkpointed`` absent) leaves
   the last :data:`KEEP_VERSIONS`.

Between messages a client therefore holds its accepted version and the one its last train
message wrote (until the next message says whether the server accepted it), and a third
only where the last checkpoint is older than the accepted version (``checkpoint-every``
above 1). Keeping the last three before the accepted one instead held up to four copies of
a method's state, a whole model per copy for Ditto (6.6 MB for MNIST's CNN):
``docs/architecture.md``, client state.

So a client's state moves only with the server's: a rejected or lost reply leaves no trace
(pFedGT's tracked average c stays the mean of the stored messages, its Lemma 1), and a run
resumed from round r sees every client as it was at round r.

The server also says which version the client must hold (``holds``: the state version its
last accepted reply left, 0 for none). A client that no longer holds it (a deleted or
moved state directory, a SuperNode restarted without one), or whose stored entry cannot be
read, says so in its reply (``state-missing``: :data:`STATE_MISSING_CODE` or
:data:`STATE_UNREADABLE_CODE`) and the server does not use that reply.

Where versions live: ``<root>/<state-key>/client-<id>/v<update-id>/<entry>.npz``, ``root``
being the node's ``state-dir`` (deployment) or the run's output directory (simulation). The
state key is the run's own (``state-key`` in the sync record, chosen when the run starts and
kept in its ``config.json``), so two runs never share state, and a resumed, moved, copied or
extended run finds its own; a message without one (Flower's own ``Strategy.start``) uses a
hash of the run config. Without a root (a deployment with no ``state-dir``) the same versions are kept in
Flower's ``context.state`` (in memory, for the life of the SuperNode). Entries read from disk
are cached per process (a few, least recently used), so a simulation's memory does not grow
with its number of clients.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from flwr.app import ArrayRecord

from pflarena.core.versions import DiskVersions, MemoryVersions, VersionDraft, run_key

__all__ = [
    "ClientState",
    "DiskVersions",
    "MemoryVersions",
    "STATE_MISSING_CODE",
    "STATE_UNREADABLE_CODE",
    "run_key",
]

#: Versions kept up to the accepted one where the server does not say which one its last
#: checkpoint accepted (a server of an older version).
KEEP_VERSIONS = 3
#: ``state-missing`` values of a reply: the version the server says this client holds is
#: gone, or a stored entry could not be read.
STATE_MISSING_CODE = 1
STATE_UNREADABLE_CODE = 2

_writer: ThreadPoolExecutor | None = None
_writer_lock = threading.Lock()


def _state_writer() -> ThreadPoolExecutor:
    """This process's one thread that writes state entry files while the solver goes on
    (see :meth:`ClientState.__setitem__`); made on first use, and again in a forked child
    (a parent's thread does not run there)."""
    global _writer
    with _writer_lock:
        if _writer is None:
            _writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pflarena-state")
        return _writer


def _forget_writer() -> None:
    global _writer, _writer_lock
    _writer, _writer_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_writer)


class ClientState:
    """One client's method state for one message (see the module docstring).

    Parameters
    ----------
    store
        Where the versions are (:class:`DiskVersions` or :class:`MemoryVersions`).
    accepted
        The version the server last accepted from this client (``None``: the message
        carries no sync information, e.g. Flower's own ``Strategy.start``; then the newest
        version is current and every write is kept).
    update_id
        The version this message's writes become (``None``: writes are not kept, as for
        an evaluate message).
    prune
        Delete the versions after ``accepted`` and all but a few before it (``False`` to
        only look, as tests do).
    holds
        The version the server says this client holds (its last accepted reply's
        ``state-version``; 0: none; ``None``: not said, nothing is checked).
    checkpointed
        The version the run's last checkpoint accepted from this client (0: none), kept
        beside the accepted one; ``None``: not said, the last :data:`KEEP_VERSIONS` up to
        the accepted one are kept.
    """

    def __init__(
        self,
        store: DiskVersions | MemoryVersions,
        accepted: int | None,
        update_id: int | None,
        *,
        prune: bool = True,
        holds: int | None = None,
        checkpointed: int | None = None,
    ) -> None:
        self.store = store
        self.update_id = update_id
        self.changed: dict[str, ArrayRecord] = {}
        versions = store.versions()
        if accepted is None:
            self.current = versions[-1] if versions else None
        else:
            kept = [v for v in versions if v <= accepted]
            self.current = kept[-1] if kept else None
            if checkpointed is None:
                old = set(kept[:-KEEP_VERSIONS])
            else:  # the version a resume from the last checkpoint makes current stays
                restart = max((v for v in kept if v <= checkpointed), default=None)
                old = {v for v in kept if v not in (self.current, restart)}
            # Deleted before this message writes its own: the new version's pages reuse the
            # page cache the old ones free.
            for version in versions if prune else []:
                if version > accepted or version in old:
                    store.delete(version)
        #: the server accepted state from this client that is not stored here (a lost or
        #: moved state directory): the reply says so and the server does not use it
        self.missing = bool(holds) and (self.current is None or self.current < holds)
        #: why a stored entry could not be read (``None``: every read worked)
        self.unreadable: str | None = None
        self._current_entries = (
            set(store.entries(self.current)) if self.current is not None else set()
        )
        self._on_save: list[Callable[[], None]] = []
        #: this message's version being written, entry by entry as the solver sets them
        self._draft: VersionDraft | None = None
        self._pending: dict[str, Future] = {}

    # the mapping a solver uses -----------------------------------------------------
    def __contains__(self, entry: str) -> bool:
        return entry in self.changed or entry in self._current_entries

    def get(self, entry: str) -> ArrayRecord | None:
        if entry in self.changed:
            return self.changed[entry]
        if entry in self._current_entries:
            try:
                return self.store.read(self.current, entry)
            except Exception as exc:  # noqa: BLE001 - any damage: the reply says so
                self.unreadable = f"{entry} of version {self.current}: {exc}"
                self._current_entries.discard(entry)
        return None

    @property
    def problem_code(self) -> int:
        """The reply's ``state-missing`` value (0: the state is whole)."""
        if self.missing:
            return STATE_MISSING_CODE
        return STATE_UNREADABLE_CODE if self.unreadable is not None else 0

    @property
    def version(self) -> int:
        """The version this client holds after this message (its ``state-version``)."""
        if self.changed and self.update_id is not None:
            return self.update_id
        return self.current or 0

    def __getitem__(self, entry: str) -> ArrayRecord:
        record = self.get(entry)
        if record is None:
            raise KeyError(entry)
        return record

    def __setitem__(self, entry: str, record: ArrayRecord) -> None:
        """Set ``entry`` for this message's version.

        In a durable store (a SuperNode's ``state-dir``) its file is written and fsynced at
        once by the process's state thread while the solver goes on, and :meth:`save` waits
        for it: a Ditto client trains its global update while its personal model is
        written, instead of waiting for the disk after. A small Ditto client's message
        (MNIST's CNN, 6.6 MB) took 107 ms against 119 written at the save, side by side
        (medians of four processes, ``benchmarks/results/client_message.md``). Elsewhere
        (a simulation's state, not fsynced) the entry is written at the save: there the
        write is the CPU's work more than the disk's (serialising, CRC-32), and in a
        one-process profile of the same message on the same host, moving it to the thread
        made the message no faster (88 and 98 ms against 90 and 79). ``record`` must not
        change afterwards."""
        self.changed[entry] = record
        if (
            self.update_id is None
            or not isinstance(self.store, DiskVersions)
            or not self.store.durable
        ):
            return
        if self._draft is None:
            self._draft = self.store.begin(self.update_id, self.current)
        earlier = self._pending.pop(entry, None)
        if earlier is not None:  # set again: written again once the first write is done
            earlier.exception()
        self._pending[entry] = _state_writer().submit(self._draft.put, entry, record)

    def stamp(self, entry: str) -> tuple | None:
        """What identifies ``entry``'s stored value in the current version (see the stores'
        ``stamp``); None if it is not stored there or this message changed it."""
        if entry in self.changed or entry not in self._current_entries:
            return None
        return self.store.stamp(self.current, entry)

    def on_save(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once :meth:`save` has written this message's version (not if
        nothing is written): a solver that keeps an object in memory for the next message
        learns there that the version it belongs to exists, and its stamp."""
        self._on_save.append(callback)

    @property
    def saved_version(self) -> int | None:
        """The version :meth:`save` writes (None: this message's writes are not kept)."""
        return self.update_id if self.changed else None

    # ----------------------------------------------------------------------------------
    def save(self) -> None:
        """Write this message's changes as version ``update_id`` (if it has one): on disk,
        once every entry's file is written (the first error raised, nothing committed)."""
        if not self.changed or self.update_id is None:
            return
        if self._draft is None:
            self.store.write(self.update_id, self.current, self.changed)
        else:
            try:
                self._wait()
                self._draft.commit()
            finally:
                self.discard()
        for callback in self._on_save:
            callback()

    def discard(self) -> None:
        """Drop what this message wrote and did not save (a solver that failed): its pending
        writes are waited for and their files removed. Nothing after :meth:`save`."""
        pending, self._pending = self._pending, {}
        for future in pending.values():
            future.exception()
        if self._draft is not None:
            self._draft.discard()
            self._draft = None

    def _wait(self) -> None:
        errors = [f.exception() for f in self._pending.values()]
        self._pending = {}
        for error in errors:
            if error is not None:
                raise error
