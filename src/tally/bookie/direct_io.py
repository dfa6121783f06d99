"""Appending to a file with O_DIRECT: the bookie's writes skip the page cache.

A bookie writes every byte twice (journal, then entry log) and reads it back rarely. Through
the page cache each 64 KiB write costs the kernel a copy into freshly allocated pages, their
buffer heads and accounting, their writeback and, once synced, their eviction: a large part
of the bookie's CPU under a load of large entries (docs/benchmarks.md). With O_DIRECT the
device reads the bytes straight from one reused, aligned buffer; the only copy left is the
one into that buffer. BookKeeper's DirectEntryLogger writes entry logs the same way.

O_DIRECT wants the buffer, the file offset and the length aligned to the device's block. An
append rarely ends on a block boundary, so `DirectAppender` writes its last block padded with
zeros and keeps that block's bytes: the next append writes the block again, the same bytes
followed by new ones. A crash that tears that rewrite leaves each sector with either its old
or its new bytes, and the old bytes before the append point are the same in both, so nothing
written before is lost. The padding reads as zeros, which the journal and the entry logs
both take as the end of their records.

File systems that refuse O_DIRECT are written through the page cache as before
(`enable_direct` says which), as are bookies configured with `direct_io = False`.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from collections.abc import Sequence

ALIGNMENT = 4096
"""Block size that offsets and lengths are aligned to: a page, which every device's logical
block size here divides (512 or 4096)."""
DEFAULT_BUFFER_SIZE = 4 << 20
"""Bytes copied before each write: bigger appends go out in writes of this size."""
_ZEROS = bytes(ALIGNMENT)


def aligned_down(offset: int) -> int:
    return offset - offset % ALIGNMENT


def aligned_up(offset: int) -> int:
    return aligned_down(offset + ALIGNMENT - 1)


def pad_block(buffer: mmap.mmap | memoryview, filled: int) -> int:
    """Zero `buffer` from `filled` to the end of its block; returns the padded length."""
    padded = aligned_up(filled)
    buffer[filled:padded] = _ZEROS[: padded - filled]
    return padded


class DirectAppender:
    """Appends to an O_DIRECT file descriptor from one aligned buffer (see the module doc).

    `head` is what the file holds from the block that `position` falls in up to `position`:
    the appender writes it again with the first append. One thread at a time. After an
    OSError the file's tail is unknown and the appender must not be used again.
    """

    def __init__(
        self, fd: int, position: int, head: bytes = b"", *, buffer_size: int = DEFAULT_BUFFER_SIZE
    ) -> None:
        if len(head) != position % ALIGNMENT:
            raise ValueError(
                f"head of {len(head)} bytes, but position {position} is "
                f"{position % ALIGNMENT} bytes into its block"
            )
        if buffer_size <= 0 or buffer_size % ALIGNMENT:
            raise ValueError(f"buffer size {buffer_size} is not a positive multiple of {ALIGNMENT}")
        self.fd = fd
        self._buffer = mmap.mmap(-1, buffer_size)
        self._view = memoryview(self._buffer)
        self._view[: len(head)] = head
        self._start = aligned_down(position)
        """The file offset of the buffer's first byte."""
        self._filled = len(head)
        """The buffer's bytes in use: the last block's as written, then the append's."""

    @property
    def position(self) -> int:
        """Where the next append goes."""
        return self._start + self._filled

    def append(self, parts: Sequence[bytes | memoryview]) -> None:
        """Write `parts` back to back at `position`; durable only after an fdatasync.

        The parts are joined into runs that fill the buffer's room before they are copied
        in: a checkpoint appends two parts per entry (its header, its bytes), and copying
        each alone cost more than the copy itself."""
        size = len(self._view)
        run: list[bytes | memoryview] = []
        held = 0
        for part in parts:
            run.append(part)
            held += len(part)
            if held >= size - self._filled:
                self._copy(b"".join(run))
                run, held = [], 0
        if run:
            self._copy(b"".join(run))
        view, filled = self._view, self._filled
        if filled:
            self._write(pad_block(view, filled))
            kept = aligned_down(filled)
            view[: filled - kept] = view[kept:filled]
            self._start += kept
            filled -= kept
        self._filled = filled

    def _copy(self, data: bytes) -> None:
        """Copy `data` in after what the buffer holds, writing each buffer that fills."""
        view, size, filled = self._view, len(self._view), self._filled
        rest = memoryview(data)
        while rest:
            taken = min(len(rest), size - filled)
            view[filled : filled + taken] = rest[:taken]
            filled += taken
            rest = rest[taken:]
            if filled == size:
                self._write(size)
                self._start += size
                filled = 0
        self._filled = filled

    def _write(self, length: int) -> None:
        with self._view[:length] as chunk:  # released even when the write raises
            written = os.pwrite(self.fd, chunk, self._start)
        if written != length:
            raise OSError(errno.ENOSPC, f"a direct write of {length} bytes wrote {written}")

    def close(self) -> None:
        """Free the buffer (the file descriptor stays the caller's)."""
        self._view.release()
        self._buffer.close()


def enable_direct(fd: int) -> bool:
    """Turn O_DIRECT on for `fd`; False where the file system refuses it (EINVAL)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        return False
    return True
