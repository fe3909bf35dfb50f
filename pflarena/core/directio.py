"""Files written and read past the page cache (``O_DIRECT``), through a buffer each thread
keeps.

Why: a client's state (Ditto's personal model: 6.6 MB for MNIST's CNN) is written on every
train message and read the next time that client is sampled, rounds later in a large
federation. Through the page cache, every write takes that many bytes of new page-cache
pages. On a virtual machine whose balloon device reports free pages to its host, a page
freed seconds before is new again, and each costs the host a fault and a zeroing: 150
writes of 6.6 MB took 21.6 ms each there, against 1.5 ms into pages just freed
(``benchmarks/results/page_cache_writes.md``). Written with ``O_DIRECT`` from a buffer
the thread reuses, the bytes go from pages the process already holds to the disk, and a
state file written once and read rounds later does not fill memory as cache either.

Python's own file objects, ``zipfile`` and numpy all go through the page cache, and no
well-kept library writes arbitrary files with ``O_DIRECT``; hence this small module: an
aligned buffer that serves as a file object (:class:`AlignedBuffer`), and one direct write
(:func:`write`) and read (:func:`read`) of a whole file through it. Where a file system
refuses ``O_DIRECT`` (:data:`REFUSALS`), both say so
and their callers take the page cache's way; the refusal is remembered per device.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from pathlib import Path

__all__ = ["ALIGN", "AlignedBuffer", "read", "thread_buffer", "write"]

#: The alignment ``O_DIRECT`` asks of a transfer's memory, offset and length: a page, a
#: multiple of every logical block size Linux supports.
ALIGN = mmap.PAGESIZE

#: What a file system that does not do ``O_DIRECT`` answers (at the open, or at the first
#: transfer): ``EINVAL`` (tmpfs, some FUSE and network file systems), ``EOPNOTSUPP``.
REFUSALS = frozenset({errno.EINVAL, errno.EOPNOTSUPP})

#: Devices (``st_dev``) whose file system refused ``O_DIRECT``.
_refused: set[int] = set()
_local = threading.local()


def _round_up(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


class AlignedBuffer:
    """A growable in-memory file on page-aligned memory (an anonymous map): written by
    ``zipfile`` as a file is, read back the same way, and handed whole to :func:`write`.
    Its memory is kept from one use to the next (a thread's, :func:`thread_buffer`), so
    filling it again takes no new pages."""

    def __init__(self, capacity: int = 1 << 20) -> None:
        self._map = mmap.mmap(-1, _round_up(max(capacity, 1)))
        self._size = 0  # bytes it holds
        self._pos = 0

    # the file object zipfile writes and reads -------------------------------------
    def reset(self) -> None:
        """Empty it (its memory is kept)."""
        self._size = self._pos = 0

    def write(self, data: bytes | memoryview) -> int:
        data = memoryview(data).cast("B")
        end = self._pos + len(data)
        self._reserve(end)
        self._map[self._pos : end] = data
        self._pos = end
        self._size = max(self._size, end)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        data = self._map[self._pos : max(end, self._pos)]
        self._pos = max(end, self._pos)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(errno.EINVAL, "negative seek position")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def flush(self) -> None:
        pass

    # -------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """The bytes it holds. (Not ``len()``: ``zipfile`` takes an empty file object
        that has a length for a closed one.)"""
        return self._size

    def _reserve(self, size: int) -> None:
        """Room for ``size`` bytes and the padding up to :data:`ALIGN` after them."""
        needed = _round_up(size) or ALIGN
        if needed <= len(self._map):
            return
        grown = mmap.mmap(-1, max(needed, 2 * len(self._map)))
        grown[: self._size] = self._map[: self._size]
        with contextlib.suppress(BufferError):  # a view still held: freed with it instead
            self._map.close()
        self._map = grown

    def padded(self) -> memoryview:
        """Its bytes and the zeros up to the next multiple of :data:`ALIGN`: what one
        ``O_DIRECT`` write takes."""
        end = _round_up(self._size)
        self._reserve(self._size)
        self._map[self._size : end] = bytes(end - self._size)
        return memoryview(self._map)[:end]

    def fill_from(self, fd: int, size: int) -> None:
        """Hold the ``size`` bytes of the file open at ``fd`` (read from offset 0 in
        aligned steps, as ``O_DIRECT`` needs)."""
        self.reset()
        self._reserve(size)
        view = memoryview(self._map)
        done = 0
        while done < size:
            got = os.preadv(fd, [view[done : _round_up(size)]], done)
            if got == 0:
                raise OSError(errno.EIO, f"the file ended after {done} of {size} bytes")
            done += got
        self._size = size


def thread_buffer() -> AlignedBuffer:
    """This thread's :class:`AlignedBuffer` (made on first use, kept for the thread's life;
    it holds as much as the largest file it carried)."""
    buffer = getattr(_local, "buffer", None)
    if buffer is None:
        buffer = _local.buffer = AlignedBuffer()
    return buffer


def _device(path: Path) -> int | None:
    try:
        return path.parent.stat().st_dev
    except OSError:
        return None


def _open(path: Path, flags: int, device: int | None) -> int | None:
    """``path`` opened with ``flags`` and ``O_DIRECT``; None where ``device``'s file system
    refuses ``O_DIRECT`` (now, or before: remembered)."""
    if device in _refused:
        return None
    try:
        return os.open(path, flags | os.O_CLOEXEC | os.O_DIRECT, 0o666)
    except OSError as error:
        if error.errno not in REFUSALS:
            raise
        _refused.add(device)
        return None


def write(path: Path, buffer: AlignedBuffer, *, durable: bool) -> bool:
    """Write ``buffer``'s bytes to a new file at ``path`` past the page cache (fsynced where
    ``durable``). False where the file system refuses ``O_DIRECT``: nothing is left at
    ``path`` then, and the caller writes it another way."""
    device = _device(path)
    fd = _open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, device)
    if fd is None:
        return False
    try:
        data, done = buffer.padded(), 0
        while done < len(data):
            done += os.write(fd, data[done:])
        os.ftruncate(fd, buffer.size)
        if durable:
            os.fsync(fd)
    except OSError as error:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        if error.errno not in REFUSALS:
            raise
        _refused.add(device)
        return False
    os.close(fd)
    return True


def read(path: Path, size: int) -> AlignedBuffer | None:
    """The ``size`` bytes of the file at ``path``, read past the page cache into this
    thread's buffer (valid until the thread's next use of it), positioned at 0. None where
    the file system refuses ``O_DIRECT``."""
    device = _device(path)
    fd = _open(path, os.O_RDONLY, device)
    if fd is None:
        return None
    buffer = thread_buffer()
    try:
        buffer.fill_from(fd, size)
    except OSError as error:
        if error.errno not in REFUSALS:
            raise
        _refused.add(device)
        return None
    finally:
        os.close(fd)
    return buffer
