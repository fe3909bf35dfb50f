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

Large arrays cross to and from the worker processes outside the pool's pipe, which pickles
them, writes them in 64 KB pieces, reads them back into a buffer and unpickles them
(``benchmarks/results/parcel_transport.md`` times the ways side by side). An ArrayRecord of at least
:data:`SPILL_MIN_BYTES` is :class:`Spilled`: its arrays' bytes one after another in a file,
the parcel holding its fields but the bytes.

* A record that several messages of one push share (the global model) is written once for
  the push to a file of :class:`ParcelFiles`' directory (``tempfile.mkdtemp``: this user alone
  can read it, so no one else can plant a file there), and a worker reads it once and keeps
  the push's records (:func:`read_spilled`).
* A message's own record (a personalized model) goes to a file of its own there, which the
  worker reads once and removes.
* A reply's records go into a reply slot (:class:`ReplySlots`): a memory file of the run's
  process, reused from one reply to the next, that the run's process maps rather than reads
  (:class:`~pflarena.core.array_decoding.BufferArray`). Where there is no slot (no memory
  files on this system, too many held) they go to a file of their own, as a message's.
"""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
import shutil
import tempfile
import threading
import uuid
import weakref
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

from pflarena.core.array_decoding import BufferArray, array_buffer

__all__ = [
    "Parcel",
    "ParcelFiles",
    "ReplySlots",
    "Spilled",
    "copy_message",
    "pack",
    "read_spilled",
    "unpack",
]

#: An Array's fields as Flower's protobuf keeps them: dtype, shape, stype, data.
ArrayFields = tuple[str, tuple[int, ...], str, bytes]
#: An ArrayRecord's entries, in order: (name, fields).
RecordFields = tuple[tuple[str, ArrayFields], ...]
#: The same with each array's bytes a read-only view of a reply slot (:class:`ReplySlots`).
MappedFields = tuple[tuple[str, tuple[str, tuple[int, ...], str, bytes | memoryview]], ...]

#: An ArrayRecord from this size on crosses to or from a worker in a file; a smaller one
#: costs less to carry in the parcel than a file costs to write and read.
SPILL_MIN_BYTES = 64 * 1024
#: ``os.writev``'s most buffers in one call on Linux (``IOV_MAX``).
_WRITEV_MAX = 1024


@dataclass(frozen=True)
class Spilled:
    """An ArrayRecord in a file: each entry's name, dtype, shape, stype and byte count, the
    bytes one after another in the file from ``offset``. ``shared``: one push's record that
    several messages name (read once per process and kept for the push); otherwise its
    reader removes it, or, in a reply slot, hands the slot back once the reply is gone."""

    path: str
    entries: tuple[tuple[str, str, tuple[int, ...], str, int], ...]
    shared: bool = False
    #: Where the record's bytes start in the file.
    offset: int = 0
    #: In a reply slot (:class:`ReplySlots`) rather than a file of its own.
    slot: bool = False

    @property
    def end(self) -> int:
        return self.offset + sum(entry[4] for entry in self.entries)


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


def record_from(fields: RecordFields | MappedFields) -> ArrayRecord:
    """A new ArrayRecord of new Arrays holding ``fields`` (their bytes shared; a mapped
    file's as :class:`~pflarena.core.array_decoding.BufferArray`)."""
    record = ArrayRecord()
    for name, (dtype, shape, stype, data) in fields:
        if type(data) is bytes:
            record[name] = Array(dtype=dtype, shape=shape, stype=stype, data=data)
        else:
            record[name] = BufferArray(dtype, shape, stype, data)
    return record


def record_bytes(record: ArrayRecord) -> int:
    return sum(len(array_buffer(array)) for array in record.values())


def spill(record: ArrayRecord, path: Path, *, shared: bool = False) -> Spilled:
    """Write ``record``'s arrays' bytes to a new file at ``path`` (this user's alone). An
    ``OSError`` (a full disk) leaves no file behind."""
    datas = [array_buffer(array) for array in record.values()]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _write_all(fd, datas)
    except OSError:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return Spilled(str(path), _entries(record, datas), shared)


def _entries(
    record: ArrayRecord, datas: list[bytes | memoryview]
) -> tuple[tuple[str, str, tuple[int, ...], str, int], ...]:
    return tuple(
        (
            name,
            str(array.dtype),
            tuple(int(size) for size in array.shape),
            str(array.stype),
            len(data),
        )
        for (name, array), data in zip(record.items(), datas, strict=True)
    )


def _write_all(fd: int, datas: list[bytes | memoryview]) -> None:
    """Write ``datas`` one after another at ``fd``'s offset."""
    for start in range(0, len(datas), _WRITEV_MAX):
        chunk = datas[start : start + _WRITEV_MAX]
        written, total = os.writev(fd, chunk), sum(len(d) for d in chunk)
        if written != total:  # a short write: the rest one by one
            _write_rest(fd, memoryview(b"".join(chunk))[written:])


def _write_rest(fd: int, data: bytes | memoryview) -> None:
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
    message: Message,
    stored: dict[int, Spilled] | None = None,
    spill_to: Path | None = None,
    slot: str | None = None,
) -> Parcel:
    """``message`` as a parcel: an ArrayRecord whose ``id`` is in ``stored`` is named by its
    file; any other of at least :data:`SPILL_MIN_BYTES` is written to ``slot`` (a reply
    slot's path, :class:`ReplySlots`), else to a new file in ``spill_to`` (a directory), or
    carried where it cannot be written (a full disk); the rest are carried."""
    if message.has_error() or not message.has_content():
        return Parcel(message_to_proto(message).SerializeToString())
    light = RecordDict()
    arrays: list[tuple[str, RecordFields | Spilled]] = []
    writer = _SlotWriter(slot) if slot is not None else None
    try:
        for key, record in message.content.items():
            if not isinstance(record, ArrayRecord):
                light[key] = record
                continue
            light[key] = ArrayRecord()  # its place in the content's order
            held = stored.get(id(record)) if stored else None
            if held is None and record_bytes(record) >= SPILL_MIN_BYTES:
                if writer is not None:
                    held = writer.write(record)
                if held is None and spill_to is not None:
                    with contextlib.suppress(OSError):  # not written: carried instead
                        held = spill(record, spill_to / f"{uuid.uuid4().hex}.record")
            arrays.append((key, held if held is not None else record_fields(record)))
    finally:
        if writer is not None:
            writer.close()
    from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=no-name-in-module

    head = ProtoMessage(
        metadata=metadata_to_proto(message.metadata), content=recorddict_to_proto(light)
    )
    return Parcel(head.SerializeToString(), tuple(arrays))


def unpack(parcel: Parcel, slots: ReplySlots | None = None) -> Message:
    """The message ``parcel`` holds, its spilled records read (:func:`read_spilled`), its
    records in a reply slot mapped from ``slots`` (one mapping for all of them)."""
    from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=no-name-in-module

    message = message_from_proto(ProtoMessage.FromString(parcel.head))
    in_slot = [fields for _, fields in parcel.arrays if isinstance(fields, Spilled) and fields.slot]
    whole = None
    if in_slot:
        if slots is None:
            raise OSError(f"{in_slot[0].path}: a reply slot, and no slots to map it from")
        whole = slots.map(in_slot[0].path, max(spilled.end for spilled in in_slot))
    for key, fields in parcel.arrays:
        if isinstance(fields, Spilled):
            fields = _slot_fields(fields, whole) if fields.slot else read_spilled(fields)
        message.content[key] = record_from(fields)
    return message


def _slot_fields(spilled: Spilled, whole: memoryview) -> MappedFields:
    fields, offset = [], spilled.offset
    for name, dtype, shape, stype, size in spilled.entries:
        fields.append((name, (dtype, shape, stype, whole[offset : offset + size])))
        offset += size
    return tuple(fields)


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


#: At most this many reply slots are held at once (each an open file of the run's process);
#: a reply beyond them goes to a file of its own. A quarter of the process's open files at
#: most, where that is lower.
MAX_REPLY_SLOTS = 1024


class _SlotWriter:
    """Writes a reply's records one after another into a reply slot (opened on first use)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._offset = 0
        self._failed = False

    def write(self, record: ArrayRecord) -> Spilled | None:
        """``record`` written after the ones before it, or None where the slot cannot be
        written (its process is gone, no memory): the caller writes it elsewhere."""
        if self._failed:
            return None
        datas = [array_buffer(array) for array in record.values()]
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
            _write_all(self._fd, datas)  # after the records before it: a failed one ends here
        except OSError:
            self._failed = True
            return None
        spilled = Spilled(self.path, _entries(record, datas), offset=self._offset, slot=True)
        self._offset = spilled.end
        return spilled

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class ReplySlots:
    """Memory files (``memfd_create``) of the run's process that the workers write their
    replies' large records into, each reused for a later reply once the one it holds is gone.

    Why: a reply written to a new file and read into new memory costs both processes the
    first use of new pages, which a profile of a 3,550-client run showed as the largest
    costs beyond training. A slot keeps its pages from one reply to the next: per 6.6 MB
    reply, 4.9 ms against 8.0 for a file of its own and 9.6 through the pool's pipe, side
    by side (``benchmarks/results/parcel_transport.md``). The run's process maps a reply's
    slot read-only (:class:`~pflarena.core.array_decoding.BufferArray`: the server reads the
    values where the worker wrote them) and the slot is free again when the last array of
    the reply is gone (``weakref.finalize`` on the mapping), not before.

    A worker opens a slot by its path, ``/proc/<pid>/fd/<fd>``: only this user's processes
    can. The files are anonymous: nothing is left behind, whatever ends the run. A slot whose
    call was abandoned (its worker may still write) is never handed out again, and its file
    stays open until :meth:`close`, so that its number cannot name another file meanwhile.
    The slots' memory stays with the run while it is used: :meth:`end_push` closes the free
    slots beyond the most that any of the last :attr:`KEEP_PUSHES` pushes held at once (a
    training round's 355 replies are not written into new pages again after an evaluation
    round that held a few). Where the system has no memory files, :meth:`take` gives None
    and the replies go to files of their own."""

    #: The pushes whose most slots held at once :meth:`end_push` keeps.
    KEEP_PUSHES = 4

    def __init__(self, limit: int = MAX_REPLY_SLOTS) -> None:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY:
            limit = min(limit, soft // 4)
        self.limit = limit
        # Reentrant: a mapping's finalizer may run in a garbage collection that starts
        # while this thread holds the lock.
        self._lock = threading.RLock()
        self._free: list[int] = []
        self._busy: set[int] = set()
        self._mapped: set[int] = set()
        self._retired: set[int] = set()
        self._closed = False
        self._peak = 0
        self._peaks: collections.deque[int] = collections.deque(maxlen=self.KEEP_PUSHES)
        self._usable = hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")

    @property
    def usable(self) -> bool:
        """Whether this system has the memory files the slots are (Linux)."""
        return self._usable

    def take(self) -> str | None:
        """A free slot for one call's reply: its path, or None (no memory files here, or
        :attr:`limit` held)."""
        with self._lock:
            if not self._usable or self._closed:
                return None
            if self._free:
                fd = self._free.pop()
            elif len(self._busy) + len(self._retired) >= self.limit:
                return None
            else:
                try:
                    fd = os.memfd_create("pflarena-reply", os.MFD_CLOEXEC)
                except OSError:
                    return None
            self._busy.add(fd)
            self._peak = max(self._peak, len(self._busy))
        return self._path(fd)

    def map(self, path: str, size: int) -> memoryview:
        """The first ``size`` bytes of the slot at ``path``, mapped read-only; the slot is
        free again once the mapping is gone."""
        fd = self._fd(path)
        held = os.fstat(fd).st_size
        if held < size:
            raise OSError(f"{path}: a reply slot of {held} bytes, its reply says {size}")
        if size == 0:  # nothing to map (mmap would map the whole file)
            return memoryview(b"")
        mapping = mmap.mmap(fd, size, prot=mmap.PROT_READ)
        with self._lock:
            self._mapped.add(fd)
        weakref.finalize(mapping, self._unmapped, fd)
        return memoryview(mapping)

    def done(self, path: str) -> None:
        """The call given the slot at ``path`` has been answered: free the slot unless its
        reply is mapped (then it is free once the reply is gone)."""
        fd = self._fd(path, check=False)
        with self._lock:
            if fd in self._busy and fd not in self._mapped:
                self._busy.discard(fd)
                self._give_back(fd)

    def abandon(self, path: str) -> None:
        """The call given the slot at ``path`` was abandoned: never hand the slot out again."""
        fd = self._fd(path, check=False)
        with self._lock:
            if fd in self._busy:
                self._busy.discard(fd)
                self._retired.add(fd)

    def end_push(self) -> None:
        """One push's calls are done: close the free slots that none of the last
        :attr:`KEEP_PUSHES` pushes needed."""
        with self._lock:
            self._peaks.append(self._peak)
            self._peak = len(self._busy)
            extra = len(self._free) + len(self._busy) - max(self._peaks)
            closing = self._free[: max(0, extra)]
            del self._free[: len(closing)]
        for fd in closing:
            os.close(fd)

    def held(self) -> int:
        """How many slots this process holds open."""
        with self._lock:
            return len(self._free) + len(self._busy) + len(self._retired)

    def close(self) -> None:
        """Close every slot (a mapped reply keeps its pages until it is gone)."""
        with self._lock:
            self._closed = True
            fds = [*self._free, *self._busy, *self._retired]
            self._free, self._busy, self._retired = [], set(), set()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _unmapped(self, fd: int) -> None:
        with self._lock:
            self._mapped.discard(fd)
            if fd in self._busy:
                self._busy.discard(fd)
                self._give_back(fd)

    def _give_back(self, fd: int) -> None:  # with the lock held
        if self._closed:
            return  # closed with the rest
        self._free.append(fd)

    def _path(self, fd: int) -> str:
        return f"/proc/{os.getpid()}/fd/{fd}"

    def _fd(self, path: str, *, check: bool = True) -> int:
        prefix = f"/proc/{os.getpid()}/fd/"
        fd = int(path[len(prefix) :]) if path.startswith(prefix) else -1
        if check:
            with self._lock:
                if fd not in self._busy:
                    raise OSError(f"{path}: not a reply slot handed out by this process")
        return fd
