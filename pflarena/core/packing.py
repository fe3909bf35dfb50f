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

Only records whose arrays are all NumPy arrays (Flower's ``numpy.ndarray`` stype) of a plain
numeric or boolean dtype (:data:`PACKABLE_DTYPES`) are packed; any other record travels as
Flower's tree.

A packed reply comes from a client, maybe a broken or hostile one, so :func:`unpack_arrays`
reads it within bounds and checks everything against the bytes: the table's size
(:data:`MAX_TABLE_BYTES`), its JSON nesting (:data:`MAX_TABLE_DEPTH`, checked before it is
parsed), the number of arrays (:data:`MAX_ARRAYS`), the keys' length, each entry's fields
(integers that are not booleans for the shape and byte count, at most :data:`MAX_DIMS`
dimensions, a whitelisted dtype), and each array's bytes against its entry: an ``.npy``
header (read by NumPy's own ``numpy.lib.format``) that says the entry's dtype and shape, then
exactly the bytes that shape holds. Anything else is a :class:`PackingError` naming what is
wrong.

The deployment's Grid packs what the ServerApp sends and unpacks the replies
(:mod:`pflarena.server.polling`); the ClientApp unpacks a packed message and packs its reply
(:mod:`pflarena.client.app`). A simulation never packs: its messages never leave the process.
"""

from __future__ import annotations

import io
import json
import math
import re
import reprlib
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.common.constant import SType

__all__ = [
    "MAX_ARRAYS",
    "MAX_DIMS",
    "MAX_KEY_CHARS",
    "MAX_TABLE_BYTES",
    "MAX_TABLE_DEPTH",
    "PACKABLE_DTYPES",
    "PACKED_KEY",
    "PACKED_STYPE",
    "PackingError",
    "is_packed",
    "pack_arrays",
    "pack_content",
    "packable",
    "unpack_arrays",
    "unpack_content",
]

#: The one key of a packed ``ArrayRecord``, and its array's stype and dtype.
PACKED_KEY = "pflarena.packed"
PACKED_STYPE = "pflarena.packed/1"
PACKED_DTYPE = "bytes"
_MAGIC = b"PFLPACK1"
_LENGTH_BYTES = 4
#: The dtypes a packed record carries, as Flower's ``Array`` names them (``str`` of a NumPy
#: dtype in the machine's byte order): plain numbers and booleans, nothing that NumPy would
#: read as objects, strings, records or dates.
PACKABLE_DTYPES = frozenset(
    {"bool", "float16", "float32", "float64", "complex64", "complex128"}
    | {f"{kind}{bits}" for kind in ("int", "uint") for bits in (8, 16, 32, 64)}
)
#: Bounds of a packed record's table (a model of a few thousand tensors is far inside them).
MAX_TABLE_BYTES = 16 * 2**20
MAX_ARRAYS = 65_536
MAX_KEY_CHARS = 1_024
#: Dimensions of an array: NumPy's own limit in NumPy 1.x.
MAX_DIMS = 32
#: A table is a list of entries, each a list holding the shape's list.
MAX_TABLE_DEPTH = 3
_NPY_VERSIONS = {(1, 0), (2, 0)}
#: What the nesting scan looks at: quotes and backslashes (strings), brackets and braces.
_STRUCTURE = re.compile(rb'["\\\[\]{}]')


class PackingError(ValueError):
    """A packed record that cannot be read back (truncated, altered or not ours)."""


def _is_packed_record(record: ArrayRecord) -> bool:
    if len(record) != 1 or PACKED_KEY not in record:
        return False
    return record[PACKED_KEY].stype == PACKED_STYPE


def is_packed(content: RecordDict) -> bool:
    """Whether any ``ArrayRecord`` of ``content`` is packed."""
    return any(_is_packed_record(r) for r in content.array_records.values())


def packable(record: ArrayRecord) -> bool:
    """Whether :func:`pack_arrays` takes ``record``: every array a NumPy array (Flower's
    ``numpy.ndarray`` stype) of a dtype in :data:`PACKABLE_DTYPES`, and keys and dimensions
    within the format's bounds."""
    return len(record) <= MAX_ARRAYS and all(
        array.stype == SType.NUMPY
        and array.dtype in PACKABLE_DTYPES
        and len(array.shape) <= MAX_DIMS
        and len(key) <= MAX_KEY_CHARS
        for key, array in record.items()
    )


def pack_arrays(record: ArrayRecord) -> ArrayRecord:
    """``record`` as one array: a JSON table of its arrays, then their bytes.

    Raises
    ------
    PackingError
        ``record`` holds an array the format does not carry (:func:`packable`).
    """
    if not packable(record):
        raise PackingError(
            "only NumPy arrays of plain numeric or boolean dtypes are packed: "
            + ", ".join(f"{k!r} is {a.stype} {a.dtype}" for k, a in list(record.items())[:3])
        )
    table: list[list[Any]] = []
    parts: list[bytes] = []
    for key, array in record.items():
        table.append([key, array.dtype, list(array.shape), array.stype, len(array.data)])
        parts.append(array.data)
    head = json.dumps(table, separators=(",", ":")).encode()
    if len(head) > MAX_TABLE_BYTES:
        raise PackingError(f"the table of {len(table)} arrays exceeds {MAX_TABLE_BYTES} bytes")
    blob = b"".join([_MAGIC, len(head).to_bytes(_LENGTH_BYTES, "big"), head, *parts])
    packed = Array(dtype=PACKED_DTYPE, shape=(len(blob),), stype=PACKED_STYPE, data=blob)
    return ArrayRecord(array_dict={PACKED_KEY: packed})


def _nesting_depth(text: bytes, limit: int) -> int:
    """How deep ``text``'s JSON brackets and braces nest, outside strings; the scan stops
    as soon as it passes ``limit`` (so a hostile ``[[[[...`` costs a few steps)."""
    depth = deepest = 0
    in_string = False
    escaped = -1  # the position a backslash in a string escapes
    for match in _STRUCTURE.finditer(text):
        at = match.start()
        if at == escaped:
            continue
        char = text[at : at + 1]
        if in_string:
            if char == b"\\":
                escaped = at + 1
            elif char == b'"':
                in_string = False
        elif char == b'"':
            in_string = True
        elif char in b"[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif char in b"]}":
            depth -= 1
    return deepest


def _is_count(value: Any) -> bool:
    """A non-negative integer that is not a boolean (JSON's ``true`` reads as Python's
    ``True``, which ``isinstance(True, int)`` accepts)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_entry(entry: Any) -> tuple[str, str, tuple[int, ...], str, int]:
    ok = (
        isinstance(entry, list)
        and len(entry) == 5
        and isinstance(entry[0], str)
        and isinstance(entry[1], str)
        and isinstance(entry[2], list)
        and all(_is_count(d) for d in entry[2])
        and isinstance(entry[3], str)
        and _is_count(entry[4])
    )
    if not ok:
        raise PackingError(f"packed record: a malformed table entry {reprlib.repr(entry)}")
    key, dtype, shape, stype, size = entry
    if len(key) > MAX_KEY_CHARS:
        raise PackingError(
            f"packed record: a key of {len(key)} characters (at most {MAX_KEY_CHARS})"
        )
    if dtype not in PACKABLE_DTYPES:
        raise PackingError(f"packed record: array {key[:80]!r} has dtype {dtype[:40]!r}, not one of "
                           "the packed dtypes (plain numbers and booleans)")  # fmt: skip
    if len(shape) > MAX_DIMS:
        raise PackingError(f"packed record: array {key[:80]!r} has {len(shape)} dimensions "
                           f"(at most {MAX_DIMS})")  # fmt: skip
    if stype != SType.NUMPY:
        raise PackingError(f"packed record: array {key[:80]!r} has stype {stype[:40]!r}, "
                           f"not {SType.NUMPY!r}")  # fmt: skip
    return key, dtype, tuple(shape), stype, size


def _check_npy(key: str, data: bytes, dtype: str, shape: tuple[int, ...]) -> None:
    """``data`` is the ``.npy`` file of an array of ``dtype`` and ``shape``: its header (read
    by NumPy) says so, and the bytes after it are exactly what that shape holds."""
    what = f"packed record: array {key[:80]!r}"
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version not in _NPY_VERSIONS:
            raise ValueError(f"npy format version {version}")
        read_header = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        npy_shape, _, npy_dtype = read_header(stream)
    except Exception as exc:  # noqa: BLE001 - NumPy's reader raises ValueError, TokenError...
        raise PackingError(f"{what}: its bytes are not an .npy array ({exc})") from None
    if npy_dtype != np.dtype(dtype) or tuple(npy_shape) != shape:
        raise PackingError(f"{what}: its bytes hold {npy_dtype} {tuple(npy_shape)}, its entry "
                           f"says {dtype} {shape}")  # fmt: skip
    expected = math.prod(shape) * np.dtype(dtype).itemsize
    held = len(data) - stream.tell()
    if held != expected:
        raise PackingError(f"{what}: {dtype} {shape} takes {expected} bytes, its bytes hold {held}")


def unpack_arrays(record: ArrayRecord) -> ArrayRecord:
    """The ``ArrayRecord`` :func:`pack_arrays` packed, its arrays' bytes as they were.

    Raises
    ------
    PackingError
        The bytes are not a packed record, pass one of the format's bounds, or their table
        does not match them (the module docstring lists the checks).
    """
    blob = memoryview(record[PACKED_KEY].data)
    start = len(_MAGIC) + _LENGTH_BYTES
    if len(blob) < start or bytes(blob[: len(_MAGIC)]) != _MAGIC:
        raise PackingError("packed record: not pflarena's packed format (no header)")
    head_bytes = int.from_bytes(blob[len(_MAGIC) : start], "big")
    if head_bytes > MAX_TABLE_BYTES:
        raise PackingError(
            f"packed record: a table of {head_bytes} bytes (at most {MAX_TABLE_BYTES})"
        )
    head_end = start + head_bytes
    if head_end > len(blob):
        raise PackingError(
            f"packed record: truncated ({len(blob)} bytes, table ends at {head_end})"
        )
    head = bytes(blob[start:head_end])
    if (depth := _nesting_depth(head, MAX_TABLE_DEPTH)) > MAX_TABLE_DEPTH:
        raise PackingError(f"packed record: its table nests deeper than {MAX_TABLE_DEPTH} "
                           f"({depth} levels seen)")  # fmt: skip
    try:
        table = json.loads(head)
    except ValueError as exc:  # not UTF-8, not JSON, an integer of too many digits
        raise PackingError(f"packed record: its table is not JSON ({exc})") from None
    if not isinstance(table, list):
        raise PackingError("packed record: its table is not a list")
    if len(table) > MAX_ARRAYS:
        raise PackingError(f"packed record: {len(table)} arrays (at most {MAX_ARRAYS})")
    arrays: dict[str, Array] = {}
    at = head_end
    for entry in table:
        key, dtype, shape, stype, size = _check_entry(entry)
        if key in arrays:
            raise PackingError(f"packed record: the key {key[:80]!r} appears twice")
        if size > len(blob) - at:
            raise PackingError(
                f"packed record: array {key[:80]!r} runs past the end ({len(blob)} bytes)"
            )
        data = bytes(blob[at : at + size])
        _check_npy(key, data, dtype, shape)
        arrays[key] = Array(dtype=dtype, shape=shape, stype=stype, data=data)
        at += size
    if at != len(blob):
        raise PackingError(f"packed record: {len(blob) - at} bytes follow its last array")
    return ArrayRecord(array_dict=arrays)


def pack_content(content: RecordDict) -> RecordDict:
    """``content`` with every ``ArrayRecord`` of two or more arrays packed, where the
    format carries it (:func:`packable`; a new ``RecordDict``: ``content`` is left as it
    was; its other records are shared)."""
    return RecordDict(
        {
            name: pack_arrays(record)
            if isinstance(record, ArrayRecord) and len(record) > 1 and packable(record)
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
