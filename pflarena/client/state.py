"""A client's method state: on disk, versioned, and committed only once the server used it.

A solver reads and writes named ArrayRecords (``pfedgt/personal-model``, ...) through
:class:`ClientState`. What a message writes becomes a new *version*, named by the message's
``update-id``; it is a full snapshot (unchanged entries are hard links on disk, so a version
costs only what changed). Every message also says which of this client's versions the
server last accepted (``accepted``). On arrival the client therefore

1. makes the accepted version current (the newest one not after it, if that one is gone),
2. deletes versions after it: updates the server rejected, lost, or (after a resume from a
   checkpoint) never saw,
3. keeps the last few versions before it, so that a server restarted from an older
   checkpoint can roll the client back.

So a client's state moves only with the server's: a rejected or lost reply leaves no trace
(pFedGT's tracked average c stays the mean of the stored messages, its Lemma 1), and a run
resumed from round r sees every client as it was at round r.

Where versions live: ``<root>/<run-key>/client-<id>/v<update-id>/<entry>.npz``, ``root``
being the node's ``state-dir`` (deployment) or the run's output directory (simulation). The
run key is a hash of the run config, so two runs never share state and a resumed run finds
its own. Without a root (a deployment with no ``state-dir``) the same versions are kept in
Flower's ``context.state`` (in memory, for the life of the SuperNode). Entries read from disk
are cached per process (a few, least recently used), so a simulation's memory does not grow
with its number of clients.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from flwr.app import ArrayRecord

from pflarena.core.versions import DiskVersions, MemoryVersions

__all__ = ["ClientState", "DiskVersions", "MemoryVersions", "run_key"]

#: Versions kept before the accepted one (a server restarts at most a round behind).
KEEP_VERSIONS = 3


def run_key(run_config: Mapping[str, Any]) -> str:
    """A short stable name for a run: a hash of its config (``resume`` left out)."""
    items = sorted((k, v) for k, v in run_config.items() if k != "resume")
    return hashlib.sha256(json.dumps(items, default=str).encode()).hexdigest()[:16]


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
    """

    def __init__(
        self,
        store: DiskVersions | MemoryVersions,
        accepted: int | None,
        update_id: int | None,
        *,
        prune: bool = True,
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
            for version in versions if prune else []:
                if version > accepted or version in kept[:-KEEP_VERSIONS]:
                    store.delete(version)
        #: the server accepted updates from this client but none of them is stored here
        #: (a lost state directory): the solver starts afresh and the reply says so
        self.missing = bool(accepted) and self.current is None
        self._current_entries = (
            set(store.entries(self.current)) if self.current is not None else set()
        )

    # the mapping a solver uses -----------------------------------------------------
    def __contains__(self, entry: str) -> bool:
        return entry in self.changed or entry in self._current_entries

    def get(self, entry: str) -> ArrayRecord | None:
        if entry in self.changed:
            return self.changed[entry]
        if entry in self._current_entries:
            return self.store.read(self.current, entry)
        return None

    def __getitem__(self, entry: str) -> ArrayRecord:
        record = self.get(entry)
        if record is None:
            raise KeyError(entry)
        return record

    def __setitem__(self, entry: str, record: ArrayRecord) -> None:
        self.changed[entry] = record

    # ----------------------------------------------------------------------------------
    def save(self) -> None:
        """Write this message's changes as version ``update_id`` (if it has one)."""
        if self.changed and self.update_id is not None:
            self.store.write(self.update_id, self.current, self.changed)
