"""Flower ``Array`` contents as numpy arrays and torch tensors, decoded fast.

``Array.numpy()`` runs ``np.load`` on the array's bytes, whose header parsing
(``ast.literal_eval`` of a dict) costs about 45 µs an array here, several times the copy of a
small array's values. Messages of K-copy methods (PPFL, FedEM, IFCA) carry a few arrays per
copy, and the server decodes every reply's arrays to check and to average them, so that
parsing was a visible part of a round. :func:`decode` compares the bytes with the header
``np.save`` writes for the array's declared dtype and shape (built once per dtype and shape)
and reads the values behind it; anything else (another header, a Fortran-ordered array, a
dtype that is not plain numbers, bytes of the wrong length) goes to ``Array.numpy()``, so the
result is always what numpy itself reads from those bytes.
"""

from __future__ import annotations

import io
from functools import lru_cache
from math import prod

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from flwr.common.constant import SType

__all__ = [
    "BufferArray",
    "array_buffer",
    "decode",
    "encode",
    "from_npy",
    "npy_bytes",
    "state_record",
    "torch_state",
]


class BufferArray(Array):
    """An ``Array`` whose bytes lie in a read-only buffer (a mapped file) rather than in
    ``bytes`` of its own: :func:`decode` reads its values where they lie, and ``data``
    (Flower's field, ``bytes``) is made from the buffer the first time something asks for
    it. It equals, copies and pickles as the plain ``Array`` of the same fields.

    Why: a reply the server only reads (averages, flattens, checks) need not be copied into
    memory of the server's own; the in-process engine's replies arrive in memory the run's
    process maps (:class:`pflarena.runtime.parcel.ReplySlots`, which says what that
    saves)."""

    def __init__(self, dtype: str, shape: tuple[int, ...], stype: str, buffer: memoryview):
        # Array's __init__ accepts bytes only; its fields are set as its __setattr__ would.
        fields = self.__dict__
        fields["dtype"], fields["shape"], fields["stype"] = dtype, shape, stype
        fields["_buffer"] = buffer.toreadonly()

    def __getattr__(self, name: str):  # called only for what the instance does not hold
        if name == "data":
            buffer = self.__dict__.pop("_buffer", None)
            if buffer is not None:
                data = self.__dict__["data"] = bytes(buffer)
                return data
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Array):
            return NotImplemented
        return (self.dtype, tuple(self.shape), self.stype) == (
            other.dtype,
            tuple(other.shape),
            other.stype,
        ) and array_buffer(self) == array_buffer(other)

    __hash__ = None  # type: ignore[assignment]  # as Array's: mutable, compared by value

    def __reduce__(self):
        return Array, (self.dtype, tuple(self.shape), self.stype, self.data)


def array_buffer(array: Array) -> bytes | memoryview:
    """``array``'s bytes without a copy: its ``data``, or a :class:`BufferArray`'s buffer."""
    buffer = array.__dict__.get("_buffer")
    return array.data if buffer is None else buffer


@lru_cache(maxsize=512)
def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """The header ``np.save`` writes for a C-ordered array of ``descr`` and ``shape``."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": descr, "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue()


def _plain(array: Array) -> tuple[np.dtype, tuple[int, ...], int, bytes | memoryview] | None:
    """``array``'s dtype, shape, header length and bytes where its bytes are what ``np.save``
    writes for a C-ordered array of plain numbers of its declared dtype and shape (a version
    1.0 header, then the values); None for anything else."""
    if array.stype != SType.NUMPY:
        return None
    try:
        dtype = np.dtype(array.dtype)
        shape = tuple(int(size) for size in array.shape)
    except (TypeError, ValueError):
        return None
    if dtype.kind not in "biufc" or dtype.hasobject or any(size < 0 for size in shape):
        return None
    header = _npy_header(np.lib.format.dtype_to_descr(dtype), shape)
    data = array_buffer(array)
    if len(data) != len(header) + dtype.itemsize * prod(shape) or data[: len(header)] != header:
        return None
    return dtype, shape, len(header), data


def decode(array: Array, *, copy: bool = True) -> np.ndarray:
    """``array.numpy()``: the same values, dtype and shape, writable, in its own memory.

    With ``copy=False``, a read-only view of the array's bytes where they hold plain numbers
    (no copy of a reply the server only reads: averaging, flattening)."""
    plain = _plain(array)
    if plain is None:
        return array.numpy()
    dtype, shape, offset, data = plain
    values = np.frombuffer(data, dtype=dtype, offset=offset).reshape(shape)
    return values.copy() if copy else values


def npy_bytes(array: Array) -> bytes | memoryview:
    """The ``.npy`` file of ``array.numpy()`` (what ``np.save`` writes): the array's own
    bytes where they are exactly that, without a copy; else written from its values."""
    plain = _plain(array)
    if plain is not None:
        return plain[3]
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array.numpy(), allow_pickle=False)
    return buffer.getbuffer()


def from_npy(data: bytes) -> Array:
    """``Array(np.load(BytesIO(data)))`` for the ``.npy`` file ``data`` (no pickles): the
    same fields and bytes, taken as they are where they are what ``np.save`` writes for a
    C-ordered array of plain numbers, without parsing the values and writing them again."""
    stream = io.BytesIO(data)
    try:
        if np.lib.format.read_magic(stream) == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
            array = Array(dtype=str(dtype), shape=tuple(shape), stype=SType.NUMPY, data=data)
            if _plain(array) is not None:  # the header np.save writes, the values' length
                return array
    except ValueError:
        pass  # numpy's own reader says what is wrong
    return Array(np.load(io.BytesIO(data), allow_pickle=False))


def torch_state(record: ArrayRecord, device: torch.device | str | None = None) -> dict:
    """``record.to_torch_state_dict()`` through :func:`decode` (on ``device`` if given)."""
    state = {name: torch.from_numpy(decode(array)) for name, array in record.items()}
    if device is not None:
        state = {name: value.to(device) for name, value in state.items()}
    return state


def encode(values: np.ndarray) -> Array:
    """``Array.from_numpy_ndarray(values)``: the same fields and bytes, made with one copy.

    Flower's writes the array with ``np.save`` into a buffer, copying the values three times
    (12 ms for MNIST's CNN, 6.6 MB, against under 1 ms here). For a C-ordered array of plain
    numbers the bytes ``np.save`` writes are its version 1.0 header followed by the values,
    which this joins in one copy; anything else goes to Flower's own."""
    dtype = values.dtype
    if not values.flags.c_contiguous or dtype.kind not in "biufc" or dtype.hasobject:
        return Array.from_numpy_ndarray(values)
    try:
        header = _npy_header(np.lib.format.dtype_to_descr(dtype), tuple(values.shape))
    except ValueError:  # a header too long for version 1.0: np.save writes another
        return Array.from_numpy_ndarray(values)
    data = b"".join((header, memoryview(values.reshape(-1)).cast("B")))
    return Array(dtype=str(dtype), shape=tuple(values.shape), stype=SType.NUMPY, data=data)


def state_record(state: dict[str, torch.Tensor]) -> ArrayRecord:
    """``ArrayRecord(state)`` for a torch ``state_dict``: the same record, each entry
    through :func:`encode`."""
    record = ArrayRecord()
    for name, value in state.items():
        record[name] = encode(value.detach().cpu().numpy())
    return record
