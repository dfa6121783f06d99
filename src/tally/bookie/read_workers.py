"""The threads a bookie reads entries on (BookKeeper's read worker threads): a read that
waits on a slow disk holds one of them, not the event loop that takes every add.

A disk seldom fails all at once; it slows first, retrying a sector for seconds. Read on the
event loop, one such read stalled every add and every answer of the bookie, on every
ledger and every disk, until it returned.
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
    no threads (`read_threads = 0`), runs each at once where it is asked, on the loop."""

    def __init__(self, threads: int) -> None:
        self._pool = (
            ThreadPoolExecutor(threads, thread_name_prefix="bookie-read") if threads else None
        )

    def run(self, read: Callable[[], T], then: Then[T]) -> None:
        """Call `read` on a worker, then `then` on the event loop (this one, running)."""
        if self._pool is None:
            try:
                result = read()
            except Exception as error:
                then(error)
            else:
                then(result)
            return
        loop = asyncio.get_running_loop()

        def read_ended(done: Future[T]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody to answer
                loop.call_soon_threadsafe(_settle, done, then)

        try:
            future = self._pool.submit(read)
        except RuntimeError:  # closed: a fencing read's fence became durable as it stopped
            then(BookieUnavailable("the bookie is stopping"))
            return
        future.add_done_callback(read_ended)

    def close(self) -> None:
        """Drop the reads not begun and wait for those under way (blocking: a thread's)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _settle(done: Future[T], then: Then[T]) -> None:
    if done.cancelled():
        return  # the bookie is stopping: its connections are closed
    error = done.exception()
    if error is None:
        then(done.result())
    elif isinstance(error, Exception):
        then(error)
    else:
        raise error  # SystemExit and the like are not a read's answer
