"""Letting go of the page cache that the bookie's appends (and its scrubber's reads) fill.

Journal and entry logs are written once and read back rarely (a journal only at replay,
an entry log when an entry is read after its checkpoint). Left in the page cache, every
byte the bookie writes takes a new page of memory, and a page-cache write grows costlier
as they pile up, while appends whose pages are dropped once durable stay cheap: the kernel
reuses the pages it got back (docs/benchmarks.md). BookKeeper drops its journal's pages
the same way (journalRemovePagesFromCache).
"""

from __future__ import annotations

import contextlib
import mmap
import os

PAGE_SIZE = mmap.PAGESIZE


def drop_written(fd: int, start: int, end: int) -> None:
    """Drop the cached pages of `fd` that [start, end) completed; call once they are synced.

    The page holding `start` is complete now (what came before it in the page was synced
    earlier); the page holding `end`, unless `end` is on a page boundary, is where the next
    append goes, and is kept, or that append would first read it back from the disk.
    Best effort: where the file system ignores or refuses the advice, only memory differs.
    """
    first = start // PAGE_SIZE * PAGE_SIZE
    last = end // PAGE_SIZE * PAGE_SIZE
    if last > first:
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, first, last - first, os.POSIX_FADV_DONTNEED)


def drop_range(fd: int, start: int, end: int) -> None:
    """Drop the cached pages of `fd` that hold any of [start, end): bytes read once, by a
    scan, that would otherwise push out pages the bookie reads again. Best effort."""
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
