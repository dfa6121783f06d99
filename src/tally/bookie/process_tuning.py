"""Process-wide settings that fit the Python runtime to a bookie's load.

Process-wide, so `tally bookie` applies them once it serves, not the Bookie class, which
tests and tools also run inside processes of their own. Each was measured under the
benchmark loads (docs/benchmarks.md, bookie section).
"""

from __future__ import annotations

import ctypes
import gc
import logging

log = logging.getLogger(__name__)

GC_YOUNG_THRESHOLD = 10_000
"""Allocations between two collections of the youngest generation (Python's default: 700)."""

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameters (malloc.h)."""
MALLOC_TRIM_THRESHOLD = 64 << 20
"""Free memory at the top of the heap that malloc keeps instead of returning it."""
MALLOC_MMAP_THRESHOLD = 8 << 20
"""Blocks at least this large get mappings of their own; smaller ones come from the heap."""


def tune_process() -> None:
    """Apply every tuning below."""
    tune_garbage_collector()
    if not tune_memory_allocator():
        log.info("the C library has no glibc mallopt: its memory allocator is left as it is")


def tune_garbage_collector() -> None:
    """Fit the cyclic garbage collector to a bookie process, which allocates some ten objects
    per request and keeps a few of them until the journal has synced them.

    What start-up made (modules, classes, replayed state) lives as long as the process:
    frozen, it is left out of the full collections, which otherwise walked it every few
    tens of thousands of adds, pausing the event loop 50-130 ms each time. And collecting
    the youngest generation every 10,000 allocations rather than 700 cuts the collector's
    share of an add from about 1.1 us to 0.2.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def tune_memory_allocator() -> bool:
    """Keep malloc from handing a bookie's memory back to the kernel between requests.

    Every 64 KiB entry is a fresh bytes object and every socket read a fresh 256 KiB one,
    freed soon after. By default glibc maps blocks over 128 KiB one by one and trims the
    heap whenever its top holds 128 KiB free; both only move its thresholds up after the
    fact, so the same memory kept coming back from the kernel as fresh zeroed pages: five
    page faults per 64 KiB add (about a tenth of the event loop's time under that load).
    With these limits the heap keeps what it had. False where the C library is not glibc.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD)) and bool(
        mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
    )
