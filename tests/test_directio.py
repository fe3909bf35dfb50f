"""State files written and read past the page cache (``O_DIRECT``): the same files, not in
the page cache, and the page cache's way where a file system refuses. The tests that look
at the page cache need ``O_DIRECT`` where pytest's temporary folders are (ext4 here and in
CI); on a file system that refuses it they fail, saying the file was cached."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from pflarena.core import directio
from pflarena.core.versions import DIRECT_MIN_BYTES, DiskVersions

_libc = ctypes.CDLL(None, use_errno=True)


def _cached_pages(path: Path) -> tuple[int, int]:
    """(pages of ``path`` in the page cache, its pages), by ``mincore`` on an untouched
    private mapping of it."""
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        vector = (ctypes.c_ubyte * pages)()
        if _libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vector) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(v & 1 for v in vector), pages
    finally:
        del address
        mapped.close()


def _model(seed: int, floats: int = 700_001) -> ArrayRecord:
    """Two arrays, 2.8 MB with an odd size (the file is not a whole number of pages)."""
    rng = np.random.default_rng(seed)
    return ArrayRecord(
        {
            "conv.weight": Array(rng.standard_normal(floats).astype(np.float32)),
            "fc.bias": Array(rng.standard_normal(10).astype(np.float32)),
        }
    )


def _savez_bytes(tmp_path: Path, record: ArrayRecord) -> bytes:
    path = tmp_path / "numpys.npz"
    np.savez(path, **{name: array.numpy() for name, array in record.items()})
    return path.read_bytes()


def _forget_cached_entries(monkeypatch) -> None:
    monkeypatch.setattr(DiskVersions, "_cache", type(DiskVersions._cache)())
    monkeypatch.setattr(DiskVersions, "_cache_bytes", 0)


def test_a_large_entry_is_written_and_read_past_the_page_cache_as_the_same_file(
    tmp_path, monkeypatch
):
    """Catches a direct write whose file differs from ``np.savez``'s by a byte (the
    padding left in, a header rewritten at the wrong place), and an entry that went through
    the page cache after all."""
    record = _model(0)
    store = DiskVersions(tmp_path / "c", durable=False)
    store.write(101, None, {"ditto/personal-model": record})
    path = tmp_path / "c" / "v101" / "ditto__personal-model.npz"
    assert path.read_bytes() == _savez_bytes(tmp_path, record)
    os.posix_fadvise(os.open(path, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
    assert _cached_pages(path)[0] == 0  # read_bytes above read it; the advice dropped it
    _forget_cached_entries(monkeypatch)
    got = DiskVersions(tmp_path / "c", durable=False).read(101, "ditto/personal-model")
    assert _cached_pages(path)[0] == 0  # read past the cache too
    for name in record:
        np.testing.assert_array_equal(got[name].numpy(), record[name].numpy())

    # written again through the page cache (direct off), the file is in it
    buffered = DiskVersions(tmp_path / "b", durable=False, direct=False)
    buffered.write(101, None, {"ditto/personal-model": record})
    other = tmp_path / "b" / "v101" / "ditto__personal-model.npz"
    assert other.read_bytes() == path.read_bytes()
    cached, pages = _cached_pages(other)
    assert cached == pages


def test_a_fresh_direct_write_leaves_nothing_in_the_page_cache(tmp_path):
    DiskVersions(tmp_path / "c", durable=False).write(7, None, {"m": _model(1)})
    assert _cached_pages(tmp_path / "c" / "v7" / "m.npz")[0] == 0


def test_small_entries_stay_in_the_page_cache(tmp_path):
    small = ArrayRecord({"w": Array(np.ones(1000, dtype=np.float32))})
    assert len(small["w"].data) < DIRECT_MIN_BYTES
    DiskVersions(tmp_path / "c", durable=False).write(1, None, {"membership": small})
    cached, pages = _cached_pages(tmp_path / "c" / "v1" / "membership.npz")
    assert cached == pages


def test_a_file_system_that_refuses_o_direct_gets_the_same_file_through_the_cache(
    tmp_path, monkeypatch
):
    """tmpfs and some FUSE file systems answer O_DIRECT with EINVAL at the open; others
    EINVAL or EOPNOTSUPP at the first transfer. Either way the entry is written, the same bytes, and the refusal is
    remembered for the device."""
    real_open, real_write = os.open, os.write
    opens, direct_fds = [], set()

    def refusing_open(path, flags, *args):
        opens.append(bool(flags & os.O_DIRECT))
        if flags & os.O_DIRECT and refuse == "open":
            raise OSError(errno.EINVAL, "Invalid argument")  # tmpfs
        fd = real_open(path, flags, *args)
        if flags & os.O_DIRECT:
            direct_fds.add(fd)
        return fd

    def refusing_write(fd, data):
        if refuse == "write" and fd in direct_fds:
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", refusing_open)
    monkeypatch.setattr(os, "write", refusing_write)
    record = _model(2)
    for refuse in ("open", "write"):
        monkeypatch.setattr(directio, "_refused", set())
        opens.clear()
        store = DiskVersions(tmp_path / refuse, durable=False)
        store.write(1, None, {"m": record})
        store.write(2, 1, {"m": _model(3)})
        assert opens == [True]  # tried once; the device is then known
        assert directio._refused == {os.stat(tmp_path).st_dev}
        path = tmp_path / refuse / "v1" / "m.npz"
        assert path.read_bytes() == _savez_bytes(tmp_path, record)
        assert sorted(p.name for p in path.parent.iterdir()) == ["m.npz"]  # nothing half-made
        _forget_cached_entries(monkeypatch)
        got = store.read(1, "m")
        np.testing.assert_array_equal(got["conv.weight"].numpy(), record["conv.weight"].numpy())


def test_a_durable_direct_write_is_fsynced(tmp_path, monkeypatch):
    """O_DIRECT puts the data on the device but not its metadata, nor past a disk's cache."""
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    DiskVersions(tmp_path / "c").write(1, None, {"m": _model(4)})
    assert len(synced) == 1


def test_the_buffer_grows_and_shrinks_its_content_not_its_memory():
    """One thread's buffer carries a large file, then a small one: the small one's bytes are
    its own (no tail of the large one), the memory kept."""
    buffer = directio.AlignedBuffer(capacity=4096)
    big = np.arange(3_000_000, dtype=np.uint8).tobytes()
    buffer.write(big[:10])
    buffer.write(big[10:])
    assert buffer.size == len(big) and bytes(buffer.padded()[: len(big)]) == big
    assert len(buffer.padded()) % directio.ALIGN == 0
    capacity = len(buffer._map)
    buffer.reset()
    buffer.write(b"abc")
    buffer.seek(1)
    buffer.write(b"X")
    assert bytes(buffer.padded()) == b"aXc" + bytes(directio.ALIGN - 3)
    assert len(buffer._map) == capacity
    buffer.seek(0)
    assert buffer.read(2) == b"aX" and buffer.read() == b"c" and buffer.read() == b""


def test_a_direct_read_of_a_file_shorter_than_said_is_an_error(tmp_path):
    path = tmp_path / "short"
    path.write_bytes(b"x" * 5000)
    with pytest.raises(OSError, match="ended after 5000 of 9000 bytes"):
        directio.read(path, 9000)


def test_the_runs_state_io_reaches_the_clients_and_the_servers_stores(tmp_path):
    from types import SimpleNamespace

    from flwr.app import ConfigRecord, Context, RecordDict

    from pflarena.client.app import open_state
    from pflarena.server.build import build_strategy, parse_config

    msg = SimpleNamespace(content=RecordDict({"config": ConfigRecord({})}))
    for state_io, direct in (("direct", True), ("buffered", False)):
        cfg = parse_config(
            {
                "strategy": "fedfomo",
                "num-clients": 3,
                "validation-fraction": 0.2,
                "state-io": state_io,
                "output-dir": str(tmp_path / state_io),
            }  # fmt: skip
        )
        context = Context(1, 1, {"partition-id": 0}, RecordDict(), cfg.to_run_config())
        assert open_state(cfg, context, msg, 0, train=True).store.direct is direct
        strategy = build_strategy(cfg, None, state_dir=tmp_path / state_io / "server-state")
        assert strategy.pool("models")._store(0).direct is direct
