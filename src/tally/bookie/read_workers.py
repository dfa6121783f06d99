"""The threads a bookie reads entries on (BookKeeper's read worker threads): a read that
waits on a slow disk holds one of them, not the event loop that takes every add.

A disk seldom fails all at once; it slows first, retrying a sector for seconds. Read on the
event loop, one such read would stall every add and every answer of the bookie, on every
ledger and every disk, until it returned. Reads that need no disk (memory, the page
cache) are answered on the loop without coming here (requests.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from tally.core.errors import BookieUnavailable

T = TypeVar("T")

Then = Callable[[T | Exception], None]
"""Hears how a read ended, on the event loop: its result, or the error it raised."""


class ReadWorkers(Generic[T]):
    """Runs reads on `threads` threads and hands each outcome back to the event loop; with
    no threads (`read_threads = 0`), runs each at once where it is asked, on the loop.

    The reads asked in one turn of the loop go to the threads together, split among them: a
    hand-off to a thread and back costs tens of microseconds of CPU, as much as a read from
    the page cache (docs/benchmarks.md, bench_reads), so many reads share a few."""

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._pool = (
            ThreadPoolExecutor(threads, thread_name_prefix="bookie-read") if threads else None
        )
        self._asked: list[tuple[Callable[[], T], Then[T]]] = []
        """The reads asked this turn, handed to the threads at its end."""

    def run(self, read: Callable[[], T], then: Then[T]) -> None:
        """Call `read` on a worker, then `then` on the event loop (this one, running)."""
        if self._pool is None:
            then(_outcome(read))
            return
        self._asked.append((read, then))
        if len(self._asked) == 1:
            asyncio.get_running_loop().call_soon(self._hand_over)

    def _hand_over(self) -> None:
        asked, self._asked = self._asked, []
        shares = min(self._threads, len(asked))
        for share in (asked[i::shares] for i in range(shares)):
            self._submit(share)

    def _submit(self, share: list[tuple[Callable[[], T], Then[T]]]) -> None:
        assert self._pool is not None
        loop = asyncio.get_running_loop()

        def read_ended(done: Future[list[T | Exception]]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody to answer
                loop.call_soon_threadsafe(_settle, done, share)

        try:
            future = self._pool.submit(_read_all, [read for read, _ in share])
        except RuntimeError:  # closed: a fencing read's fence became durable as it stopped
            for _, then in share:
                then(BookieUnavailable("the bookie is stopping"))
            return
        future.add_done_callback(read_ended)

    def close(self) -> None:
        """Drop the reads not begun and wait for those under way (blocking: a thread's)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _outcome(read: Callable[[], T]) -> T | Exception:
    try:
        return read()
    except Exception as error:
        return error


def _read_all(reads: list[Callable[[], T]]) -> list[T | Exception]:
    return [_outcome(read) for read in reads]


def _settle(
    done: Future[list[T | Exception]], share: list[tuple[Callable[[], T], Then[T]]]
) -> None:
    if done.cancelled():
        return  # the bookie is stopping: its connections are closed
    for (_, then), outcome in zip(share, done.result(), strict=True):
        then(outcome)
