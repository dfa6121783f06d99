"""The journal's staging area: records copied into aligned buffers as they are appended, so
that the journal thread has nothing left to do but write them.

Why: under a load of 64 KiB entries the journal thread bounded the bookie, and most of its
time per 1 MiB batch went not to the write but to copying the records into the aligned buffer
that O_DIRECT wants and to checksumming them, holding the GIL against the event loop on a
machine with two cores. The event loop's thread, which has just received an entry, copies
it while its bytes are still in the CPU's caches; the journal thread only writes (measured in
docs/benchmarks.md, bookie section).

The staged bytes are a contiguous stretch of journal files. Each buffer holds the file range
[start, start + filled) of one file, `start` aligned to a disk block. A buffer is sealed, and
becomes the next batch to write, when the records staged in it reach `batch_bytes`, when it is
full (a record longer than the room left goes on in the next buffer), when the journal rolls
to a new file, or when the journal thread takes it because it would otherwise stand idle.
A sealed buffer that ends inside a block starts the next buffer with that block's bytes: the
journal thread writes the block padded with zeros, and the next write writes it again with
what follows (the scheme of direct_io.py). Not thread-safe: the journal calls it under its
queue lock.
"""

from __future__ import annotations

import mmap
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tally.bookie.direct_io import aligned_down, aligned_up, pad_block

W = TypeVar("W")

SPARE_BUFFERS = 4
"""Written buffers kept for reuse: a fresh mmap costs a page fault per 4 KiB on first use."""

NewFileHeader = Callable[[int, int, int], bytes]
"""The header of journal file `file_id` that follows file `previous_id`, whose records end at
`previous_end`: (file_id, previous_id, previous_end) -> bytes."""


@dataclass(eq=False)
class StagedBuffer(Generic[W]):
    """Bytes for one write: the range [start, start + filled) of journal file `file_id`."""

    memory: mmap.mmap
    file_id: int
    start: int
    filled: int = 0
    staged: int = 0
    """Bytes appended to this buffer (not counting the block carried over from the last)."""
    waiters: list[W] = field(default_factory=list)
    """Whoever waits for a record that ends in this buffer, in order."""
    ends: list[int] = field(default_factory=list)
    """The file offset where each of those records ends."""
    previous: tuple[int, int] | None = None
    """On the first buffer of a new file: (id, end of records) of the file before it. The
    journal thread creates the file (its header begins the buffer) before writing."""

    def padded(self) -> memoryview:
        """The bytes to write, zero-padded to a whole block (release the view after use)."""
        return memoryview(self.memory)[: pad_block(self.memory, self.filled)]


class JournalStage(Generic[W]):
    """Records staged for the journal thread, by file offset. See the module docstring."""

    def __init__(
        self,
        file_id: int,
        header: bytes,
        *,
        file_size: int,
        batch_bytes: int,
        new_file_header: NewFileHeader,
    ) -> None:
        self.file_size = file_size
        self.batch_bytes = batch_bytes
        self.buffer_size = max(aligned_up(2 * batch_bytes), 64 * 1024)
        """Room for a batch that ends with a long record, and the block carried over."""
        self._header_size = len(header)
        self._new_file_header = new_file_header
        self._spare: list[mmap.mmap] = []
        self._sealed: deque[StagedBuffer[W]] = deque()
        self._current = self._buffer(file_id, 0)
        self._current.memory[: len(header)] = header
        self._current.filled = len(header)
        self.queued_bytes = 0
        """Bytes of records staged and not yet taken."""

    @property
    def position(self) -> tuple[int, int]:
        """(file id, offset) where the next record goes."""
        return self._current.file_id, self._current.start + self._current.filled

    def add(self, head: bytes, body: bytes | memoryview, waiter: W) -> None:
        """Stage the record `head + body`, rolling to a new file first if it would take the
        current one past `file_size` (a file holds at least one record, however long)."""
        self.add_all([(head, body)], waiter, waiter)

    def add_all(
        self, records: Sequence[tuple[bytes, bytes | memoryview]], waiter: W, others: W
    ) -> None:
        """`add` each (head, body) in order, `waiter` on the last and `others` (what stands
        for no waiter) on the rest: the records of one receive, staged in one call."""
        last = len(records) - 1
        for index, (head, body) in enumerate(records):
            size = len(head) + len(body)
            current = self._current
            offset = current.start + current.filled
            if offset + size > self.file_size and offset > self._header_size:
                self._roll(current.file_id, offset)
            current = self._copy_record(head, body, size)
            current.waiters.append(waiter if index == last else others)
            current.ends.append(current.start + current.filled)
            self.queued_bytes += size
            if current.staged >= self.batch_bytes:
                self._seal()

    def take(self) -> StagedBuffer[W] | None:
        """The next buffer to write (sealing the current one if none is), or None."""
        if not self._sealed:
            if not self._current.staged:
                return None
            self._seal()
        taken = self._sealed.popleft()
        self.queued_bytes -= taken.staged
        return taken

    def give_back(self, buffer: StagedBuffer[W]) -> None:
        """Return a written buffer's memory for reuse."""
        self._recycle(buffer.memory)

    def discard(self) -> list[W]:
        """Drop everything staged (the journal has failed); returns the waiters dropped."""
        waiters = [w for buffer in (*self._sealed, self._current) for w in buffer.waiters]
        self._sealed.clear()
        self._current.waiters, self._current.ends = [], []
        self._current.staged = 0
        self.queued_bytes = 0
        return waiters

    def close(self) -> None:
        """Free the memory (the journal has stopped)."""
        for buffer in (*self._sealed, self._current):
            buffer.memory.close()
        for memory in self._spare:
            memory.close()
        self._sealed.clear()
        self._spare.clear()

    def _copy_record(self, head: bytes, body: bytes | memoryview, size: int) -> StagedBuffer[W]:
        """Copy a record in (in place when the buffer has room, as it mostly has); returns
        the buffer it ends in."""
        current = self._current
        filled = current.filled
        if filled + size > self.buffer_size:
            self._copy(head)
            self._copy(body)
            return self._current
        middle = filled + len(head)
        current.memory[filled:middle] = head
        current.memory[middle : filled + size] = body
        current.filled = filled + size
        current.staged += size
        return current

    def _copy(self, part: bytes | memoryview) -> None:
        """Copy a part in across buffers, sealing each one it fills."""
        rest = memoryview(part)
        while rest:
            current = self._current
            taken = min(len(rest), self.buffer_size - current.filled)
            current.memory[current.filled : current.filled + taken] = rest[:taken]
            current.filled += taken
            current.staged += taken
            rest = rest[taken:]
            if current.filled == self.buffer_size:
                self._seal()

    def _seal(self) -> None:
        """Queue the current buffer for writing and go on in a new one from its last block."""
        current = self._current
        kept = aligned_down(current.filled)
        following = self._buffer(current.file_id, current.start + kept)
        tail = current.filled - kept
        following.memory[:tail] = current.memory[kept : current.filled]
        following.filled = tail
        self._sealed.append(current)
        self._current = following

    def _roll(self, file_id: int, end: int) -> None:
        current = self._current
        if current.staged:
            self._sealed.append(current)
        else:  # only the block carried over from a buffer already taken
            self._recycle(current.memory)
        header = self._new_file_header(file_id + 1, file_id, end)
        self._current = self._buffer(file_id + 1, 0)
        self._current.memory[: len(header)] = header
        self._current.filled = len(header)
        self._current.previous = (file_id, end)

    def _recycle(self, memory: mmap.mmap) -> None:
        if len(self._spare) < SPARE_BUFFERS:
            self._spare.append(memory)
        else:
            memory.close()

    def _buffer(self, file_id: int, start: int) -> StagedBuffer[W]:
        memory = self._spare.pop() if self._spare else mmap.mmap(-1, self.buffer_size)
        return StagedBuffer(memory, file_id, start)
