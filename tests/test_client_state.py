"""Client state versions: on disk and in memory, committed only when the server accepted them."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, RecordDict

from pflarena.client.state import ClientState, DiskVersions, MemoryVersions, run_key


def _record(value: float) -> ArrayRecord:
    return ArrayRecord({"w": Array(np.full(3, value, dtype=np.float32))})


def _value(state: ClientState, entry: str) -> float | None:
    record = state.get(entry)
    return None if record is None else float(record["w"].numpy()[0])


@pytest.fixture(params=["disk", "memory"])
def store(request, tmp_path):
    return (
        DiskVersions(tmp_path / "client-0")
        if request.param == "disk"
        else MemoryVersions(RecordDict())
    )


def _write(store, accepted, update_id, **entries):
    state = ClientState(store, accepted, update_id)
    for entry, value in entries.items():
        state[entry.replace("_", "/")] = _record(value)
    state.save()
    return state


def test_a_write_becomes_current_only_once_accepted(store):
    _write(store, 0, 101, model=1.0)
    assert _value(ClientState(store, 101, None, prune=False), "model") == 1.0
    # the server did not accept 101 (rejected or lost): the next message rolls it back
    state = ClientState(store, 0, 201)
    assert _value(state, "model") is None and store.versions() == []


def test_unchanged_entries_carry_forward(store):
    _write(store, 0, 101, model=1.0, message=5.0)
    _write(store, 101, 201, message=6.0)
    state = ClientState(store, 201, None)
    assert (_value(state, "model"), _value(state, "message")) == (1.0, 6.0)


def test_a_server_restarted_one_round_back_rolls_the_client_back(store):
    for round_ in range(1, 5):
        _write(store, (round_ - 1) * 100 + 1 if round_ > 1 else 0, round_ * 100 + 1, model=round_)
    assert store.versions()[-1] == 401
    state = ClientState(store, 301, None)  # the checkpoint knew round 3 only
    assert _value(state, "model") == 3.0
    assert store.versions()[-1] == 301 and len(store.versions()) <= 3


def _versions_after(store, messages):
    """Train messages ``(accepted, update_id, checkpointed)``, each writing one entry."""
    for accepted, update_id, checkpointed in messages:
        state = ClientState(store, accepted, update_id, checkpointed=checkpointed)
        state["model"] = _record(float(update_id))
        state.save()
    return store.versions()


def test_a_client_keeps_the_accepted_version_and_the_checkpoints_only(store):
    # checkpoint every round: the accepted version, and the one being written
    every_round = [(0, 101, 0), (101, 201, 101), (201, 301, 201), (301, 401, 301)]
    assert _versions_after(store, every_round) == [301, 401]
    # an evaluation that knows 401 was accepted (and checkpointed) leaves it alone
    ClientState(store, 401, None, checkpointed=401)
    assert store.versions() == [401]


def test_the_checkpointed_version_stays_however_old(store):
    """A checkpoint every 4 rounds: the version of round 1's checkpoint is kept through the
    rounds after it, and a server restarted from that checkpoint finds it (keeping the last
    three before the accepted one had deleted it by round 5)."""
    messages = [(0, 101, 0), (101, 201, 101), (201, 301, 101), (301, 401, 101), (401, 501, 101)]
    assert _versions_after(store, messages) == [101, 401, 501]
    state = ClientState(store, 101, None, checkpointed=101, holds=101)
    assert _value(state, "model") == 101.0 and not state.missing
    assert store.versions() == [101]


def test_a_server_that_does_not_say_what_it_checkpointed_keeps_the_last_three(store):
    messages = [(0, 101, None), (101, 201, None), (201, 301, None), (301, 401, None)]
    messages.append((401, 501, None))
    assert _versions_after(store, messages) == [201, 301, 401, 501]


def test_missing_state_is_reported(store):
    state = ClientState(store, 301, 401, holds=301)
    assert state.missing and state.problem_code == 1 and _value(state, "model") is None
    assert not ClientState(store, 0, 101, holds=0).missing
    # a stateless client (FedAvg) holds version 0 however many updates were accepted
    assert not ClientState(store, 301, 401, holds=0).missing


def test_a_client_holding_what_the_server_says_is_not_missing(store):
    _write(store, 0, 101, model=1.0)
    state = ClientState(store, 301, 401, holds=101)  # 201 and 301 wrote nothing
    assert not state.missing and _value(state, "model") == 1.0 and state.problem_code == 0


def test_an_unreadable_entry_is_reported(tmp_path):
    store = DiskVersions(tmp_path / "client-0")
    _write(store, 0, 101, model=1.0)
    (tmp_path / "client-0" / "v101" / "model.npz").write_bytes(b"garbage")
    state = ClientState(store, 101, 201, holds=101)
    assert _value(state, "model") is None and state.problem_code == 2
    assert "model.npz" in state.unreadable


def test_without_sync_the_newest_version_is_current(store):
    _write(store, None, 1, model=1.0)
    _write(store, None, 2, model=2.0)
    assert _value(ClientState(store, None, None), "model") == 2.0


def test_disk_versions_share_unchanged_files(tmp_path):
    store = DiskVersions(tmp_path / "c")
    _write(store, 0, 101, model=1.0, message=5.0)
    _write(store, 101, 201, message=6.0)
    first = (tmp_path / "c" / "v101" / "model.npz").stat()
    second = (tmp_path / "c" / "v201" / "model.npz").stat()
    assert first.st_ino == second.st_ino  # a hard link, not a copy
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".")]  # no staging left


def test_run_key_ignores_resume_only():
    config = {"strategy": "ditto", "seed": 0, "output-dir": "/r"}
    assert run_key(config) == run_key(config | {"resume": True})
    assert run_key(config) != run_key(config | {"seed": 1})


@pytest.mark.parametrize("on_disk", [True, False])
def test_a_pool_keeps_per_client_versions_in_step_with_checkpoints(on_disk, tmp_path):
    from pflarena.core.versions import ClientPool

    pool = ClientPool(tmp_path / "pool" if on_disk else None)
    for round_ in (1, 2, 3, 4):
        pool.put(7, round_, {"g": _record(round_)})
    pool.put(8, 2, {"g": _record(20.0)})
    assert pool.clients() == [7, 8]
    assert float(pool.get(7, "g")["w"].numpy()[0]) == 4.0

    pool.checkpoint(3)  # a resume from round 3 needs version 3 (and the later 4)
    assert pool._store(7).versions() == [3, 4] and pool._store(8).versions() == [2]
    pool.rollback(3)  # the run resumed from round 3: round 4's write never happened
    assert float(pool.get(7, "g")["w"].numpy()[0]) == 3.0
    assert float(pool.get(8, "g")["w"].numpy()[0]) == 20.0
    assert pool.get(9, "g") is None


def test_a_stamp_names_the_stored_file_and_follows_hard_links(tmp_path):
    """The stamp of an entry is the same in a later version that carried it forward, and
    differs once the entry is written again (a version rewritten after a resume)."""
    store = DiskVersions(tmp_path / "c")
    store.write(1, None, {"a": ArrayRecord({"x": Array(np.zeros(3))}), "b": _record(1.0)})
    store.write(2, 1, {"b": _record(2.0)})
    assert store.stamp(1, "a") == store.stamp(2, "a") is not None
    assert store.stamp(1, "b") != store.stamp(2, "b")
    assert store.stamp(2, "missing") is None
    store.delete(2)
    store.write(2, 1, {"b": _record(2.0)})  # the same bytes, written again: a new file
    state = ClientState(store, accepted=2, update_id=3)
    assert state.stamp("b") == store.stamp(2, "b")
    state["b"] = _record(3.0)
    assert state.stamp("b") is None  # changed by this message: not the stored value


def test_simulated_clients_write_without_fsync_and_the_checkpoint_syncs_first(
    tmp_path, monkeypatch
):
    """A simulated client's store skips the per-file fsync; a SuperNode's state-dir keeps
    it; the checkpoint syncs the output directory's file system before it is written."""
    import os
    from types import SimpleNamespace

    from flwr.app import ConfigRecord, Context

    from pflarena.client.app import open_state
    from pflarena.core.config import RunConfig
    from pflarena.server import checkpoint

    cfg = RunConfig(output_dir=str(tmp_path / "run"))
    msg = SimpleNamespace(content=RecordDict({"config": ConfigRecord({})}))  # no sync record
    simulated = Context(1, 1, {"partition-id": 0}, RecordDict(), cfg.to_run_config())
    node = Context(1, 1, {"state-dir": str(tmp_path / "node")}, RecordDict(), cfg.to_run_config())
    assert open_state(cfg, simulated, msg, 0, train=True).store.durable is False
    assert open_state(cfg, node, msg, 0, train=True).store.durable is True

    fsyncs = []
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append(fd))
    DiskVersions(tmp_path / "fast", durable=False).write(1, None, {"b": _record(1.0)})
    assert fsyncs == []
    DiskVersions(tmp_path / "safe").write(1, None, {"b": _record(1.0)})
    assert len(fsyncs) == 1

    order = []
    monkeypatch.setattr(checkpoint, "sync_filesystem", lambda path: order.append("sync"))
    monkeypatch.setattr(os, "fsync", lambda fd: order.append("checkpoint"))

    class Stub:
        method = "fedavg"

        def checkpoint_state(self):
            return {}, {}

    (tmp_path / "run").mkdir()
    checkpoint.save_checkpoint(tmp_path / "run", 1, ArrayRecord(), Stub())
    assert order == ["sync", "checkpoint"]


def test_a_written_entry_is_read_back_from_memory_until_its_file_changes(tmp_path):
    store = DiskVersions(tmp_path / "c", durable=False)
    written = _record(1.0)
    state = ClientState(store, 0, 101)
    state["model"] = written
    state.save()
    assert store.read(101, "model") is written  # write-through: no file read
    (tmp_path / "c" / "v101" / "model.npz").unlink()
    np.savez(tmp_path / "c" / "v101" / "model.npz", w=np.full(5, 2.0, dtype=np.float32))
    again = store.read(101, "model")
    assert again is not written and again["w"].numpy().tolist() == [2.0] * 5


def test_the_read_cache_is_bounded_in_bytes(tmp_path, monkeypatch):
    size = len(_record(0.0)["w"].data)  # an entry's bytes as held (its serialized array)
    monkeypatch.setattr("pflarena.core.versions.CACHE_BYTES", 3 * size)  # three entries
    monkeypatch.setattr(DiskVersions, "_cache", type(DiskVersions._cache)())
    monkeypatch.setattr(DiskVersions, "_cache_bytes", 0)
    stores = [DiskVersions(tmp_path / f"c{i}", durable=False) for i in range(5)]
    for i, store in enumerate(stores):
        _write(store, 0, 101, model=float(i))
    assert len(DiskVersions._cache) == 3 and DiskVersions._cache_bytes == 3 * size
    # the oldest were dropped, and are read from their files again
    assert [float(s.read(101, "model")["w"].numpy()[0]) for s in stores] == [0, 1, 2, 3, 4]


def test_deleting_a_version_removes_its_folder_and_leaves_the_others(tmp_path):
    store = DiskVersions(tmp_path / "c", durable=False)
    _write(store, 0, 101, model=1.0, message=2.0)
    _write(store, 101, 201, message=3.0)
    (tmp_path / "c" / "v201" / "odd").mkdir()  # not an entry file: the fallback removes it
    store.delete(101)
    store.delete(201)
    store.delete(301)  # none: nothing happens
    assert store.versions() == [] and not list((tmp_path / "c").iterdir())


def _drafts(folder):
    return [p.name for p in folder.iterdir() if p.name.startswith(".v")]


def test_a_durable_entry_is_written_while_the_solver_goes_on_and_kept_only_at_the_save(tmp_path):
    """In a durable store an entry's file is written (and fsynced) by the state thread as
    soon as it is set; the version exists only once save() commits it, with the base's
    other entries carried forward."""
    from pflarena.client import state as state_module

    store = DiskVersions(tmp_path / "c")
    _write(store, 0, 101, model=1.0, message=5.0)
    state = ClientState(store, 101, 201)
    state["model"] = _record(2.0)
    state_module._state_writer().submit(lambda: None).result()  # the thread's queue drained
    (draft,) = _drafts(tmp_path / "c")
    assert [p.name for p in (tmp_path / "c" / draft).iterdir()] == ["model.npz"]
    assert store.versions() == [101]
    state.save()
    assert store.versions() == [101, 201] and _drafts(tmp_path / "c") == []
    again = ClientState(DiskVersions(tmp_path / "c"), 201, None, prune=False)
    DiskVersions._cache.clear()
    assert (_value(again, "model"), _value(again, "message")) == (2.0, 5.0)


def test_an_entry_set_twice_is_saved_with_its_last_value(tmp_path):
    store = DiskVersions(tmp_path / "c")
    state = ClientState(store, 0, 101)
    for value in (1.0, 2.0, 3.0):
        state["model"] = _record(value)
    state.save()
    DiskVersions._cache.clear()
    assert _value(ClientState(store, 101, None, prune=False), "model") == 3.0


def test_a_write_that_fails_in_the_state_thread_fails_the_save_and_keeps_nothing(
    tmp_path, monkeypatch
):
    import errno

    store = DiskVersions(tmp_path / "c")
    _write(store, 0, 101, model=1.0)

    def full(path, record):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(store, "_write_entry", full)
    state = ClientState(store, 101, 201)
    state["model"] = _record(2.0)
    with pytest.raises(OSError, match="No space left"):
        state.save()
    assert store.versions() == [101] and _drafts(tmp_path / "c") == []


def test_a_message_whose_solver_fails_leaves_no_draft(tmp_path):
    """The train handler discards what a failed solver set: its written files are removed
    and no version is made."""
    from pflarena.client import app as client_app

    store = DiskVersions(tmp_path / "c")
    state = ClientState(store, 0, 101)

    class Failing:
        @staticmethod
        def train(job):
            job.state["model"] = _record(1.0)
            raise RuntimeError("the solver failed")

    from types import SimpleNamespace

    job = SimpleNamespace(state=state)
    with pytest.raises(RuntimeError, match="solver failed"):
        client_app._train_and_save(job, Failing)
    assert store.versions() == [] and _drafts(tmp_path / "c") == []


def test_a_forked_child_writes_through_a_state_thread_of_its_own(tmp_path):
    """The parent's state thread does not exist in a forked worker: the child makes its
    own, and its durable writes are saved."""
    import multiprocessing

    from pflarena.client import state as state_module

    state_module._state_writer().submit(lambda: None).result()  # the parent's thread runs

    def child(folder):
        state = ClientState(DiskVersions(folder), 0, 101)
        state["model"] = _record(7.0)
        state.save()

    process = multiprocessing.get_context("fork").Process(target=child, args=(tmp_path / "c",))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    DiskVersions._cache.clear()
    assert _value(ClientState(DiskVersions(tmp_path / "c"), 101, None, prune=False), "model") == 7.0
