"""Work over many items with a bound on what is in flight, so that a check of a big cluster
never floods its metadata store or its bookies."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sized
from typing import TypeVar

T = TypeVar("T")


async def for_each(items: Iterable[T], limit: int, action: Callable[[T], Awaitable[None]]) -> None:
    """`action` on every item, at most `limit` at a time (items are drawn lazily). The first
    error stops the rest and is raised as it is (not in an ExceptionGroup)."""
    iterator = iter(items)

    async def worker() -> None:
        for item in iterator:
            await action(item)

    workers = min(limit, len(items)) if isinstance(items, Sized) else limit
    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
