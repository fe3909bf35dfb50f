"""A message's arrays in one Flower object per record, for the deployment's transport.

Flower sends a message as a tree of objects, one HTTP request each way per object: the
message, each record, and for every array an ``Array`` plus at least one ``ArrayChunk``. A
model of K tensors therefore costs 2K + 3 requests to push and as many to pull, at every hop
(ServerApp → SuperLink → SuperNode → ClientApp and back). On a loopback deployment those
requests, not the work, set a round's time: the SuperLink serves them one at a time under its
interpreter lock. The digits MLP's 6 tensors make a 15-object message, 5 packed, and a
loopback round 1.45 s with Flower's tree against 1.05 s packed
(``benchmarks/results/deployment.md``).

:func:`pack_content` replaces each ``ArrayRecord`` of two or more arrays by an ``ArrayRecord``
holding one ``Array`` (:data:`PACKED_KEY`, stype :data:`PACKED_STYPE`) whose bytes are a small
JSON table of the original arrays (key, dtype, shape, stype, byte count) followed by their
bytes, in order; Flower still cuts it into chunks of its own size. :func:`unpack_content`
restores the original arrays byte for byte (no numbers are decoded or re-encoded), so the
receiver sees exactly what the sender built. Records are packed one by one, so a record that
several messages share (the global model) still packs to the same object and Flower sends it
once. No library does this: Flower's own format is the per-array tree, and the table is a
few lines.

The deployment's Grid packs what the ServerApp sends and unpacks the replies
(:mod:`pflarena.server.polling`); the ClientApp unpacks a packed message and packs its reply
(:mod:`pflarena.client.app`). A simulation never packs: its messages never leave the process.
"""

from __future__ import annotations

import json
from typing import Any

from flwr.app import Array, ArrayRecord, RecordDict

__all__ = [
    "PACKED_KEY",
    "PACKED_STYPE",
    "PackingError",
    "is_packed",
    "pack_arrays",
    "pack_content",
    "unpack_arrays",
    "unpack_content",
]

#: The one key of a packed ``ArrayRecord``, and its array's stype and dtype.
PACKED_KEY = "pflarena.packed"
PACKED_STYPE = "pflarena.packed/1"
PACKED_DTYPE = "bytes"
_MAGIC = b"PFLPACK1"
_LENGTH_BYTES = 4


class PackingError(ValueError):
    """A packed record that cannot be read back (truncated, altered or not ours)."""


def _is_packed_record(record: ArrayRecord) -> bool:
    if len(record) != 1 or PACKED_KEY not in record:
        return False
    return record[PACKED_KEY].stype == PACKED_STYPE


def is_packed(content: RecordDict) -> bool:
    """Whether any ``ArrayRecord`` of ``content`` is packed."""
    return any(_is_packed_record(r) for r in content.array_records.values())


def pack_arrays(record: ArrayRecord) -> ArrayRecord:
    """``record`` as one array: a JSON table of its arrays, then their bytes."""
    table: list[list[Any]] = []
    parts: list[bytes] = []
    for key, array in record.items():
        table.append([key, array.dtype, list(array.shape), array.stype, len(array.data)])
        parts.append(array.data)
    head = json.dumps(table, separators=(",", ":")).encode()
    blob = b"".join([_MAGIC, len(head).to_bytes(_LENGTH_BYTES, "big"), head, *parts])
    packed = Array(dtype=PACKED_DTYPE, shape=(len(blob),), stype=PACKED_STYPE, data=blob)
    return ArrayRecord(array_dict={PACKED_KEY: packed})


def _check_entry(entry: Any) -> tuple[str, str, tuple[int, ...], str, int]:
    ok = (
        isinstance(entry, list)
        and len(entry) == 5
        and isinstance(entry[0], str)
        and isinstance(entry[1], str)
        and isinstance(entry[2], list)
        and all(isinstance(d, int) and d >= 0 for d in entry[2])
        and isinstance(entry[3], str)
        and isinstance(entry[4], int)
        and entry[4] >= 0
    )
    if not ok:
        raise PackingError(f"packed record: a malformed table entry {str(entry)[:80]}")
    return entry[0], entry[1], tuple(entry[2]), entry[3], entry[4]


def unpack_arrays(record: ArrayRecord) -> ArrayRecord:
    """The ``ArrayRecord`` :func:`pack_arrays` packed, its arrays' bytes as they were.

    Raises
    ------
    PackingError
        The bytes are not a packed record, or their table does not match them.
    """
    blob = memoryview(record[PACKED_KEY].data)
    start = len(_MAGIC) + _LENGTH_BYTES
    if len(blob) < start or bytes(blob[: len(_MAGIC)]) != _MAGIC:
        raise PackingError("packed record: not pflarena's packed format (no header)")
    head_end = start + int.from_bytes(blob[len(_MAGIC) : start], "big")
    if head_end > len(blob):
        raise PackingError(
            f"packed record: truncated ({len(blob)} bytes, table ends at {head_end})"
        )
    try:
        table = json.loads(bytes(blob[start:head_end]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PackingError(f"packed record: its table is not JSON ({exc})") from None
    if not isinstance(table, list):
        raise PackingError("packed record: its table is not a list")
    arrays: dict[str, Array] = {}
    at = head_end
    for entry in table:
        key, dtype, shape, stype, size = _check_entry(entry)
        if key in arrays:
            raise PackingError(f"packed record: the key {key!r} appears twice")
        if at + size > len(blob):
            raise PackingError(
                f"packed record: array {key!r} runs past the end ({len(blob)} bytes)"
            )
        arrays[key] = Array(dtype=dtype, shape=shape, stype=stype, data=bytes(blob[at : at + size]))
        at += size
    if at != len(blob):
        raise PackingError(f"packed record: {len(blob) - at} bytes follow its last array")
    return ArrayRecord(array_dict=arrays)


def pack_content(content: RecordDict) -> RecordDict:
    """``content`` with every ``ArrayRecord`` of two or more arrays packed (a new
    ``RecordDict``: ``content`` is left as it was; its other records are shared)."""
    return RecordDict(
        {
            name: pack_arrays(record)
            if isinstance(record, ArrayRecord) and len(record) > 1
            else record
            for name, record in content.items()
        }
    )


def unpack_content(content: RecordDict) -> RecordDict:
    """``content`` with every packed ``ArrayRecord`` unpacked (a new ``RecordDict``).

    Raises
    ------
    PackingError
        A packed record cannot be read back.
    """
    return RecordDict(
        {
            name: unpack_arrays(record)
            if isinstance(record, ArrayRecord) and _is_packed_record(record)
            else record
            for name, record in content.items()
        }
    )
