"""How a message crosses between the run's process and a ClientApp on the in-process engine.

A :class:`Parcel` is a message in Flower's wire format with its arrays' bytes beside it:
``head`` is the message's protobuf (``message_to_proto``) with every ArrayRecord in it left
empty, and ``arrays`` holds each ArrayRecord as the four fields Flower's protobuf keeps of an
``Array`` (dtype, shape, stype, data). :func:`unpack` gives the message that Flower's own
round trip, ``message_from_proto(message_to_proto(m))``, gives (``tests/test_parcel.py``
compares the two field by field).

Why not the protobuf whole: building it copies every array's bytes into the protobuf
message, serialising copies them again, and parsing copies them out once more. For a reply
carrying MNIST's CNN (6.6 MB) those copies were about a sixth of a worker's time at 355
clients a round. An array's ``data`` is ``bytes``, which nothing can change in place, so a
parcel made and unpacked in one process shares them: no array is copied, and each message
still gets its own ``ArrayRecord`` and ``Array`` objects, so nothing a ClientApp does to its
message reaches the server's copy or another client's.

Large arrays cross to and from the worker processes in files rather than through the
pool's pipe: a 6.6 MB reply took 22 ms to cross the pipe (pickled, written in 64 KB pieces,
read back into a buffer, unpickled) and 10 ms as a file written once and read once
(``os.pread``, one copy), side by side (``benchmarks/results/parcel_transport.md``). An
ArrayRecord of at least :data:`SPILL_MIN_BYTES` is :class:`Spilled`: its arrays' bytes one
after another in a file of :class:`ParcelFiles`' directory (``tempfile.mkdtemp``: this user
alone can read it, so no one else can plant a file there), the parcel holding its fields but
the bytes. A record that several messages of one push share (the global model) is written
once for the push, and a worker reads it once and keeps the push's records
(:func:`read_spilled`); any other (a message's own, a reply's) is read once by the process it
goes to, which removes it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.common.serde import (
    message_from_proto,
    message_to_proto,
    metadata_to_proto,
    recorddict_to_proto,
)

__all__ = ["Parcel", "ParcelFiles", "Spilled", "copy_message", "pack", "read_spilled", "unpack"]

#: An Array's fields as Flower's protobuf keeps them: dtype, shape, stype, data.
ArrayFields = tuple[str, tuple[int, ...], str, bytes]
#: An ArrayRecord's entries, in order: (name, fields).
RecordFields = tuple[tuple[str, ArrayFields], ...]

#: An ArrayRecord from this size on crosses to or from a worker in a file; a smaller one
#: costs less to carry in the parcel than a file costs to write and read.
SPILL_MIN_BYTES = 64 * 1024
#: ``os.writev``'s most buffers in one call on Linux (``IOV_MAX``).
_WRITEV_MAX = 1024


@dataclass(frozen=True)
class Spilled:
    """An ArrayRecord in a file: each entry's name, dtype, shape, stype and byte count, the
    bytes one after another in the file. ``shared``: one push's record that several messages
    name (read once per process and kept for the push); otherwise its reader removes it."""

    path: str
    entries: tuple[tuple[str, str, tuple[int, ...], str, int], ...]
    shared: bool = False


@dataclass(frozen=True)
class Parcel:
    """A message: its protobuf without the arrays (``head``), and each ArrayRecord's key
    with its entries' fields, or the file they were written to."""

    head: bytes
    arrays: tuple[tuple[str, RecordFields | Spilled], ...] = ()


def record_fields(record: ArrayRecord) -> RecordFields:
    """``record``'s entries as fields; each ``data`` is the Array's own ``bytes`` (not a
    copy) where it is ``bytes``, as Flower's ``Array`` makes it."""
    return tuple(
        (
            name,
            (
                str(array.dtype),
                tuple(int(size) for size in array.shape),
                str(array.stype),
                array.data if type(array.data) is bytes else bytes(array.data),
            ),
        )
        for name, array in record.items()
    )


def record_from(fields: RecordFields) -> ArrayRecord:
    """A new ArrayRecord of new Arrays holding ``fields`` (their bytes shared)."""
    record = ArrayRecord()
    for name, (dtype, shape, stype, data) in fields:
        record[name] = Array(dtype=dtype, shape=shape, stype=stype, data=data)
    return record


def record_bytes(record: ArrayRecord) -> int:
    return sum(len(array.data) for array in record.values())


def spill(record: ArrayRecord, path: Path, *, shared: bool = False) -> Spilled:
    """Write ``record``'s arrays' bytes to a new file at ``path`` (this user's alone). An
    ``OSError`` (a full disk) leaves no file behind."""
    fields = record_fields(record)
    datas = [data for _, (_, _, _, data) in fields]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for start in range(0, len(datas), _WRITEV_MAX):
            chunk = datas[start : start + _WRITEV_MAX]
            written, total = os.writev(fd, chunk), sum(len(d) for d in chunk)
            if written != total:  # a short write: the rest one by one
                _write_rest(fd, b"".join(chunk)[written:])
    except OSError:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    entries = tuple(
        (name, dtype, shape, stype, len(data)) for name, (dtype, shape, stype, data) in fields
    )
    return Spilled(str(path), entries, shared)


def _write_rest(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def load_spilled(spilled: Spilled) -> RecordFields:
    """The fields of the record in ``spilled``'s file (each array's bytes read once)."""
    fd = os.open(spilled.path, os.O_RDONLY)
    try:
        fields, offset = [], 0
        for name, dtype, shape, stype, size in spilled.entries:
            data = os.pread(fd, size, offset)
            if len(data) != size:
                raise OSError(f"{spilled.path}: {len(data)} of {size} bytes at {offset}")
            fields.append((name, (dtype, shape, stype, data)))
            offset += size
    finally:
        os.close(fd)
    return tuple(fields)


def pack(
    message: Message, stored: dict[int, Spilled] | None = None, spill_to: Path | None = None
) -> Parcel:
    """``message`` as a parcel: an ArrayRecord whose ``id`` is in ``stored`` is named by its
    file; with ``spill_to`` (a directory), any other of at least :data:`SPILL_MIN_BYTES` is
    written to a new file there, or carried where it cannot be (a full disk); the rest are
    carried."""
    if message.has_error() or not message.has_content():
        return Parcel(message_to_proto(message).SerializeToString())
    light = RecordDict()
    arrays: list[tuple[str, RecordFields | Spilled]] = []
    for key, record in message.content.items():
        if not isinstance(record, ArrayRecord):
            light[key] = record
            continue
        light[key] = ArrayRecord()  # its place in the content's order
        held = stored.get(id(record)) if stored else None
        if held is None and spill_to is not None and record_bytes(record) >= SPILL_MIN_BYTES:
            with contextlib.suppress(OSError):  # not written: carried instead
                held = spill(record, spill_to / f"{uuid.uuid4().hex}.record")
        arrays.append((key, held if held is not None else record_fields(record)))
    from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=no-name-in-module

    head = ProtoMessage(
        metadata=metadata_to_proto(message.metadata), content=recorddict_to_proto(light)
    )
    return Parcel(head.SerializeToString(), tuple(arrays))


def unpack(parcel: Parcel) -> Message:
    """The message ``parcel`` holds, its spilled records read (:func:`read_spilled`)."""
    from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=no-name-in-module

    message = message_from_proto(ProtoMessage.FromString(parcel.head))
    for key, fields in parcel.arrays:
        if isinstance(fields, Spilled):
            fields = read_spilled(fields)
        message.content[key] = record_from(fields)
    return message


def copy_message(message: Message) -> Message:
    """``message`` as a ClientApp (or the server) gets it across a wire: the same as Flower's
    protobuf round trip, sharing only the arrays' immutable bytes with the original."""
    return unpack(pack(message))


class ParcelFiles:
    """The directory the spilled records of the in-process engine's parcels go to.

    Made on first use with ``tempfile.mkdtemp`` (this user alone can read or write in it): a
    subdirectory per push for the records its messages share (:meth:`start_push`, removed by
    :meth:`end_push`), and one for the records read once (:attr:`once`: a message's own
    records, which the worker removes once read, and the replies', which the run's process
    removes). :meth:`close` removes it all, a reply never collected (its call was
    abandoned) included.
    """

    def __init__(self) -> None:
        self._root: Path | None = None
        self._pushes = 0
        self._current: Path | None = None

    def _made(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="pflarena-parcels-"))
            (self._root / "once").mkdir(mode=0o700)
        return self._root

    @property
    def once(self) -> Path | None:
        """Where the large records read once go: a message's own (a personalized model) and
        a reply's; None where the directory cannot be made (they are carried)."""
        try:
            return self._made() / "once"
        except OSError:
            return None

    def start_push(self, messages: Iterable[Message]) -> dict[int, Spilled]:
        """Write each record that two or more of ``messages`` carry (of at least
        :data:`SPILL_MIN_BYTES`) once; returns each written record's ``id`` and its file
        (none where they cannot be written: the messages carry them)."""
        self.end_push()
        counts: dict[int, int] = {}
        records: dict[int, ArrayRecord] = {}
        for message in messages:
            if message.has_error() or not message.has_content():
                continue
            for record in message.content.array_records.values():
                counts[id(record)] = counts.get(id(record), 0) + 1
                records[id(record)] = record
        shared = [
            records[key]
            for key, count in counts.items()
            if count > 1 and record_bytes(records[key]) >= SPILL_MIN_BYTES
        ]
        if not shared:
            return {}
        self._pushes += 1
        try:
            self._current = self._made() / f"push-{self._pushes}"
            self._current.mkdir(mode=0o700)
            return {
                id(record): spill(record, self._current / f"{index}.record", shared=True)
                for index, record in enumerate(shared)
            }
        except OSError:
            self.end_push()
            return {}

    def end_push(self) -> None:
        """Remove the current push's files (a worker still to read one answers with an
        error: its call was abandoned)."""
        if self._current is not None:
            shutil.rmtree(self._current, ignore_errors=True)
            self._current = None

    def close(self) -> None:
        self.end_push()
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None


#: This process's records of the push it last read a shared record of: (push, {path: fields}).
_READ: dict[str, tuple[str, dict[str, RecordFields]]] = {}


def read_spilled(spilled: Spilled) -> RecordFields:
    """The fields of ``spilled``'s record. A shared one is read once per process and kept
    until a record of another push is read; any other is read, and its file removed."""
    if not spilled.shared:
        try:
            return load_spilled(spilled)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(spilled.path)
    push = os.path.dirname(spilled.path)
    current, records = _READ.get("current", ("", {}))
    if current != push:
        records = {}
        _READ["current"] = (push, records)
    fields = records.get(spilled.path)
    if fields is None:
        fields = records[spilled.path] = load_spilled(spilled)
    return fields
