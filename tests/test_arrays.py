"""Fast decoding of Flower Arrays: always numpy's own reading of the same bytes."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord
from flwr.common.constant import SType

from pflarena.core.array_decoding import decode, encode, state_record, torch_state

VALUES = [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.array(2.5),  # 0-d
    np.zeros((0, 5), dtype=np.float32),  # empty
    np.array([True, False]),
    np.arange(7, dtype=np.int64),
    np.arange(6, dtype=np.float16).reshape(2, 3),
    np.arange(4, dtype=">f4"),  # big-endian
    np.arange(3, dtype=np.complex64),
    np.random.default_rng(0).standard_normal((64, 150)).astype(np.float32),
]


def _name(value: np.ndarray) -> str:
    return f"{value.dtype}-{value.shape}"


@pytest.mark.parametrize("value", VALUES, ids=_name)
def test_decode_reads_what_numpy_reads(value):
    array = Array(value)
    got, want = decode(array), array.numpy()
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert got.flags.writeable and got.flags.owndata
    got[...] = 0  # its own memory: the Array's bytes are untouched
    np.testing.assert_array_equal(array.numpy(), want)


def test_a_fortran_ordered_array_is_read_by_numpy():
    buffer = io.BytesIO()
    value = np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3))
    np.save(buffer, value, allow_pickle=False)
    array = Array(dtype="float64", shape=(2, 3), stype=SType.NUMPY, data=buffer.getvalue())
    np.testing.assert_array_equal(decode(array), value)


def test_metadata_that_disagrees_with_the_bytes_is_read_as_numpy_reads_it():
    honest = Array(np.arange(6, dtype=np.float32).reshape(2, 3))
    lying_shape = Array(dtype="float32", shape=(3, 2), stype=honest.stype, data=honest.data)
    np.testing.assert_array_equal(decode(lying_shape), honest.numpy())
    assert decode(lying_shape).shape == (2, 3)
    lying_dtype = Array(dtype="int32", shape=(2, 3), stype=honest.stype, data=honest.data)
    assert decode(lying_dtype).dtype == np.float32
    short = Array(dtype="float32", shape=(2, 3), stype=honest.stype, data=honest.data[:-4])
    with pytest.raises(ValueError):
        decode(short)  # numpy's own error: the bytes end early


def test_torch_state_is_flowers_state_dict():
    record = ArrayRecord({"w": Array(np.ones((2, 2), np.float32)), "b": Array(np.zeros(2))})
    got, want = torch_state(record), record.to_torch_state_dict()
    assert list(got) == list(want)
    assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype for k in want)


def _fields(array: Array) -> tuple:
    return array.dtype, array.shape, array.stype, array.data


@pytest.mark.parametrize(
    "value",
    [
        *VALUES,
        np.arange(12, dtype=np.float32).reshape(3, 4).T,  # Fortran-ordered: Flower's own
        np.arange(24, dtype=np.int16).reshape(2, 3, 4)[:, ::2],  # neither order
        np.array([1, 2], dtype=np.uint8),
        np.zeros((1,) * 40, dtype=np.float32),  # rank 40
    ],
    ids=_name,
)
def test_encode_writes_flowers_bytes(value):
    assert _fields(encode(value)) == _fields(Array.from_numpy_ndarray(value))


def test_a_state_record_is_flowers_record_of_the_state_dict():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    state = model.state_dict()  # float32 weights, an int64 counter
    state["half"] = torch.ones(2, 2, dtype=torch.float16)
    state["transposed"] = torch.arange(6.0).reshape(2, 3).T
    ours, flowers = state_record(state), ArrayRecord(state)
    assert list(ours) == list(flowers)
    assert all(_fields(ours[k]) == _fields(flowers[k]) for k in flowers)


ODD = [
    np.arange(12, dtype=np.float32).reshape(3, 4).T,  # Fortran-ordered
    np.arange(24, dtype=np.int16).reshape(2, 3, 4)[:, ::2],  # neither order
    np.zeros((1,) * 40, dtype=np.float32),  # rank 40
]


def test_a_state_file_is_np_savez_s_file_and_reads_back_as_before(tmp_path):
    """Catches a client state file that differs by a byte from ``np.savez``'s (old and new
    runs would not read each other's states, or a resume's), and a read that differs from
    ``Array(np.load(path)[name])`` for any dtype, order, rank or kind of bytes."""
    from pflarena.core.versions import read_npz, write_npz

    values = {f"a{index}": value for index, value in enumerate([*VALUES, *ODD])}
    record = ArrayRecord({name: Array(value) for name, value in values.items()})
    # bytes that are an .npy file of another (Fortran) layout than the fields say
    buffer = io.BytesIO()
    np.save(buffer, np.asfortranarray(np.arange(6.0).reshape(2, 3)), allow_pickle=False)
    record["fortran_bytes"] = Array("float64", (2, 3), SType.NUMPY, buffer.getvalue())
    with open(tmp_path / "ours.npz", "wb") as handle:
        write_npz(handle, record)
    with open(tmp_path / "numpys.npz", "wb") as handle:
        np.savez(handle, **{name: array.numpy() for name, array in record.items()})
    assert (tmp_path / "ours.npz").read_bytes() == (tmp_path / "numpys.npz").read_bytes()

    got = read_npz(tmp_path / "ours.npz")
    with np.load(tmp_path / "ours.npz", allow_pickle=False) as data:
        want = ArrayRecord({name: Array(data[name]) for name in data.files})
    assert list(got) == list(want) == list(record)
    assert all(_fields(got[name]) == _fields(want[name]) for name in want)


def test_a_state_file_s_checksums_are_zlib_s_crc32_of_its_members(tmp_path):
    """The zip checksums come from ISA-L's CRC-32 once pflarena's store is imported; they
    must be what zlib computes (any other zip reader checks them so), here for a model's
    worth of bytes and for the buffer sizes around ISA-L's folding steps."""
    import struct
    import zipfile
    import zlib

    from pflarena.core import versions

    assert zipfile.crc32 is not zlib.crc32  # the faster one is in use: this test means it
    rng = np.random.default_rng(0)
    sizes = [0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 4095, 4096, 4097, 6_600_000]
    for size in sizes:
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        for start in (0, 1, 0xFFFFFFFF, 0x12345678):
            assert zipfile.crc32(data, start) == zlib.crc32(data, start), (size, start)
    record = ArrayRecord({f"w{i}": Array(rng.standard_normal(n).astype(np.float32))
                          for i, n in enumerate((1, 1000, 1_650_000))})  # fmt: skip
    with open(tmp_path / "s.npz", "wb") as handle:
        versions.write_npz(handle, record)
    raw = (tmp_path / "s.npz").read_bytes()
    with zipfile.ZipFile(tmp_path / "s.npz") as archive:
        for info in archive.infolist():
            # the member's bytes, located from its local header (30 bytes, then its name
            # and extra field), checked with zlib alone
            name_length, extra_length = struct.unpack(
                "<HH", raw[info.header_offset + 26 : info.header_offset + 30]
            )
            start = info.header_offset + 30 + name_length + extra_length
            member = raw[start : start + info.compress_size]
            assert zlib.crc32(member) == info.CRC, info.filename


def test_a_state_file_that_is_not_one_is_refused(tmp_path):
    """Catches a damaged state file read as arrays: a changed byte (the zip's checksum), a
    member that is not an array, a pickle."""
    import zipfile

    from pflarena.core.versions import read_npz

    path = tmp_path / "s.npz"
    np.savez(path, w=np.arange(1000, dtype=np.float32))
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    (tmp_path / "damaged.npz").write_bytes(bytes(damaged))
    with pytest.raises(zipfile.BadZipFile):
        read_npz(tmp_path / "damaged.npz")
    with zipfile.ZipFile(tmp_path / "other.npz", "w") as archive:
        archive.writestr("notes.txt", b"hello")
    with pytest.raises(ValueError, match="not an .npy member"):
        read_npz(tmp_path / "other.npz")
    np.savez(tmp_path / "pickle.npz", o=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="pickle"):
        read_npz(tmp_path / "pickle.npz")
