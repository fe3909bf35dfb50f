"""A parcel gives the message Flower's protobuf round trip gives, sharing only bytes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common.serde import message_from_proto, message_to_proto

from pflarena.runtime import parcel
from pflarena.runtime.parcel import ParcelFiles, copy_message, pack, unpack


def _message(content: RecordDict | None = None, *, error: Error | None = None) -> Message:
    from flwr.app import Metadata
    from flwr.app.message.message import make_message

    metadata = Metadata(
        run_id=7,
        message_id="m1",
        src_node_id=3,
        dst_node_id=11,
        reply_to_message_id="",
        group_id="g",
        created_at=1.5,
        ttl=30.0,
        message_type="train",
    )
    return make_message(metadata=metadata, content=content, error=error)


def _mixed() -> RecordDict:
    """Every kind of record and array, the ArrayRecords between the others."""
    return RecordDict(
        {
            "config": ConfigRecord({"lr": 0.1, "name": "x", "blob": b"\x00\x01", "ids": [1, 2]}),
            "model": ArrayRecord(
                {
                    "w": Array(np.arange(12, dtype=np.float32).reshape(3, 4)),
                    "b": Array(np.array(2.5, dtype=np.float64)),
                    "n": Array(np.array([1, 2, 3], dtype=np.int64)),
                    "h": Array(np.zeros((2, 0), dtype=np.float16)),
                    "raw": Array(dtype="opaque", shape=(5,), stype="custom", data=b"abcde"),
                }
            ),
            "metrics": MetricRecord({"loss": 0.5, "count": 3}),
            "empty": ArrayRecord(),
            "second": ArrayRecord([np.ones(4, dtype=np.float32)]),
        }
    )


@pytest.mark.parametrize(
    "message",
    [
        _message(_mixed()),
        _message(RecordDict()),  # an empty content stays a content
        _message(error=Error(code=3, reason="it broke")),
    ],
    ids=["records", "empty-content", "error"],
)
def test_unpacking_a_parcel_gives_what_flowers_round_trip_gives(message: Message) -> None:
    flower = message_from_proto(message_to_proto(message))
    ours = unpack(pack(message))
    assert message_to_proto(ours) == message_to_proto(flower)
    if message.has_content():
        assert list(ours.content) == list(message.content)  # the records' order kept


def test_a_copy_shares_only_the_arrays_bytes() -> None:
    """Catches a copy that hands the ClientApp the sender's own record or Array objects (a
    change to them would reach the server's), and one that copies the bytes."""
    message = _message(_mixed())
    copy = copy_message(message)
    original, copied = message.content["model"], copy.content["model"]
    assert copied is not original
    for name in original:
        assert copied[name] is not original[name]
        assert copied[name].data is original[name].data  # immutable: shared, not copied
    copied["w"] = Array(np.zeros(1, dtype=np.float32))
    del copied["b"]
    copy.content["config"]["lr"] = 9.0
    assert np.array_equal(original["w"].numpy(), np.arange(12, dtype=np.float32).reshape(3, 4))
    assert "b" in original and message.content["config"]["lr"] == 0.1


def test_a_push_writes_each_shared_record_once_to_a_private_file(monkeypatch) -> None:
    big = ArrayRecord([np.ones(parcel.SPILL_MIN_BYTES // 4, dtype=np.float32)])
    small = ArrayRecord([np.ones(4, dtype=np.float32)])
    messages = [
        _message(RecordDict({"model": big, "small": small, "own": ArrayRecord([np.ones(9)])}))
        for _ in range(3)
    ]
    alone = ArrayRecord([np.ones(parcel.SPILL_MIN_BYTES, dtype=np.float32)])
    messages.append(_message(RecordDict({"model": big, "alone": alone})))
    files = ParcelFiles()
    try:
        stored = files.start_push(messages)
        assert list(stored) == [id(big)]  # small, and in one message only: carried inline
        (where,) = stored.values()
        path = Path(where.path)
        assert path.stat().st_mode & 0o777 == 0o600
        assert path.parent.parent.stat().st_mode & 0o777 == 0o700
        parcels = [pack(m, stored) for m in messages]
        assert all(dict(p.arrays)["model"] == where for p in parcels)
        monkeypatch.setattr(parcel, "_READ", {})  # as a worker that has read nothing
        for message, packed in zip(messages, parcels, strict=True):
            assert message_to_proto(unpack(packed)) == message_to_proto(message)
        # read once: the file's removal does not reach a record already read this push
        files.end_push()
        assert not path.exists()
        assert message_to_proto(unpack(parcels[0])) == message_to_proto(messages[0])
        # a worker that has not read it gets an error, not another record
        monkeypatch.setattr(parcel, "_READ", {})
        with pytest.raises(FileNotFoundError):
            unpack(parcels[0])
    finally:
        files.close()


def test_a_large_reply_crosses_in_a_file_its_reader_removes() -> None:
    """Catches a spilled record read back with its arrays' bytes misplaced (every dtype,
    an empty array and a zero-dimensional one between the others) or left on disk."""
    message = _message(_mixed())
    big = ArrayRecord([np.arange(parcel.SPILL_MIN_BYTES // 8, dtype=np.float64)])
    message.content["big"] = big
    files = ParcelFiles()
    try:
        packed = pack(message, spill_to=files.once)
        spilled = dict(packed.arrays)
        assert isinstance(spilled["big"], parcel.Spilled)
        assert not isinstance(spilled["model"], parcel.Spilled)  # small: carried
        assert message_to_proto(unpack(packed)) == message_to_proto(message)
        assert list(files.once.iterdir()) == []  # read once, then removed
        # every record spilled (a threshold of 0): the same message again
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(parcel, "SPILL_MIN_BYTES", 0)
            packed = pack(message, spill_to=files.once)
        assert all(isinstance(r, parcel.Spilled) for _, r in packed.arrays)
        assert message_to_proto(unpack(packed)) == message_to_proto(message)
    finally:
        files.close()


def test_a_record_that_cannot_be_written_is_carried_and_leaves_no_file(monkeypatch) -> None:
    """Catches a full disk (or a directory that cannot be made) ending the run: the pipe
    still carries what no file could, and no partial file is left."""
    import errno

    def full(fd, buffers):
        raise OSError(errno.ENOSPC, "No space left on device")

    big = ArrayRecord([np.arange(parcel.SPILL_MIN_BYTES // 4, dtype=np.float32)])
    message = _message(RecordDict({"model": big}))
    files = ParcelFiles()
    try:
        once = files.once
        monkeypatch.setattr(parcel.os, "writev", full)
        packed = pack(message, spill_to=once)
        assert not isinstance(dict(packed.arrays)["model"], parcel.Spilled)
        assert list(once.iterdir()) == []
        assert message_to_proto(unpack(packed)) == message_to_proto(message)
        assert files.start_push([message, _message(RecordDict({"model": big}))]) == {}
        assert [p.name for p in once.parent.iterdir()] == ["once"]  # no push directory left
    finally:
        files.close()

    def no_directory(**kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(parcel.tempfile, "mkdtemp", no_directory)
    assert ParcelFiles().once is None


needs_slots = pytest.mark.skipif(
    not parcel.ReplySlots().usable, reason="reply slots are Linux memory files"
)


def _reply(value: float) -> Message:
    """A reply with a large record (a slot's), a small one and metrics."""
    content = _mixed()
    content["big"] = ArrayRecord(
        {
            "w": Array(np.full(parcel.SPILL_MIN_BYTES // 4, value, dtype=np.float32)),
            "n": Array(np.arange(3, dtype=np.int64)),
            "z": Array(np.array(value, dtype=np.float64)),
        }
    )
    content["big2"] = ArrayRecord([np.full(parcel.SPILL_MIN_BYTES // 8, -value)])
    return _message(content)


@needs_slots
def test_a_reply_in_a_slot_is_read_where_it_was_written() -> None:
    """Catches a reply from a slot that differs from Flower's round trip (two records in one
    slot, misplaced offsets), one copied into new memory, or one that changes when its
    array is decoded, copied or pickled."""
    import copy
    import pickle

    from pflarena.core.array_decoding import BufferArray, array_buffer, decode

    slots = parcel.ReplySlots()
    try:
        message = _reply(3.0)
        path = slots.take()
        packed = pack(message, slot=path)
        held = dict(packed.arrays)
        assert held["big"].slot and held["big2"].slot and held["big2"].offset == held["big"].end
        assert not isinstance(held["model"], parcel.Spilled)  # small: carried
        got = unpack(packed, slots)
        slots.done(path)
        array = got.content["big"]["w"]
        assert isinstance(array, BufferArray)
        assert isinstance(array_buffer(array), memoryview)  # the slot's pages, not a copy
        values = decode(array, copy=False)
        assert not values.flags.writeable and np.array_equal(values, np.full(values.shape, 3.0))
        assert array == message.content["big"]["w"] and message.content["big"]["w"] == array
        for other in (copy.deepcopy(array), pickle.loads(pickle.dumps(array))):
            assert type(other) is Array and other == array
        assert message_to_proto(got) == message_to_proto(message)  # every field, every record
        assert type(array.data) is bytes and array.data == message.content["big"]["w"].data
    finally:
        slots.close()


@needs_slots
def test_a_slot_is_written_again_only_once_its_reply_is_gone() -> None:
    """Catches a slot handed out while a reply mapped from it is alive (the reply would
    change under the server), one never handed out again once free, and an abandoned one
    (its worker may still write) handed out again."""
    import gc

    from pflarena.core.array_decoding import decode

    slots = parcel.ReplySlots()
    try:
        first = slots.take()
        kept = unpack(pack(_reply(1.0), slot=first), slots)
        slots.done(first)
        second = slots.take()
        assert second != first
        other = unpack(pack(_reply(2.0), slot=second), slots)
        slots.done(second)
        assert decode(kept.content["big"]["w"])[0] == 1.0  # intact beside the second
        assert decode(other.content["big"]["w"])[0] == 2.0
        del kept
        gc.collect()
        assert slots.take() == first  # free once its reply is gone
        slots.done(first)  # answered without a large record: free at once
        assert slots.take() == first
        slots.abandon(first)
        taken = [slots.take() for _ in range(3)]
        assert first not in taken and second not in taken
        assert slots.held() == 5  # first (abandoned), second (held by `other`), three new
    finally:
        slots.close()
    assert slots.take() is None  # closed


@needs_slots
def test_unused_slots_are_closed_after_pushes_that_did_not_need_them() -> None:
    """Catches a run that keeps a training round's slots for ever, and one that closes them
    after one push that needed few (the next round would write into new pages again)."""
    slots = parcel.ReplySlots()
    try:
        paths = [slots.take() for _ in range(5)]
        for path in paths:
            slots.done(path)
        slots.end_push()
        assert slots.held() == 5
        for _ in range(slots.KEEP_PUSHES - 1):  # pushes of one call each: the five kept
            slots.done(slots.take())
            slots.end_push()
            assert slots.held() == 5
        slots.done(slots.take())
        slots.end_push()
        assert slots.held() == 1
    finally:
        slots.close()


@needs_slots
def test_a_slot_that_cannot_be_written_or_read_costs_the_reply_only_its_speed() -> None:
    """Catches a worker whose slot cannot be opened failing the call (its records go to a
    file, or are carried), and a forged or short slot read silently."""
    slots = parcel.ReplySlots()
    files = ParcelFiles()
    try:
        message = _reply(4.0)
        gone = f"/proc/{os.getpid()}/fd/999999"
        packed = pack(message, spill_to=files.once, slot=gone)
        held = dict(packed.arrays)
        assert not held["big"].slot and not held["big2"].slot  # files of their own
        assert message_to_proto(unpack(packed)) == message_to_proto(message)
        packed = pack(message, slot=gone)  # no directory either: carried
        assert not any(isinstance(fields, parcel.Spilled) for _, fields in packed.arrays)
        assert message_to_proto(unpack(packed)) == message_to_proto(message)
        path = slots.take()
        packed = pack(message, slot=path)
        with pytest.raises(OSError, match="no slots"):
            unpack(packed)
        with pytest.raises(OSError, match="not a reply slot"):
            slots.map(gone, 10)
        with pytest.raises(OSError, match="its reply says"):
            slots.map(path, dict(packed.arrays)["big2"].end + 1)
    finally:
        slots.close()
        files.close()
