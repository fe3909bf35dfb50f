"""A parcel gives the message Flower's protobuf round trip gives, sharing only bytes."""

from __future__ import annotations

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
