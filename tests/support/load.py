"""A write load for tests that kill the bookie under it: pipelined adds until it goes away."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from tally.client.bookie_connection import BookieConnection
from tally.core.errors import BookieUnavailable


async def add_until_gone(
    address: str, add: Callable[[BookieConnection], asyncio.Future[None]], window: int
) -> None:
    """Keep `window` adds in flight over one connection (`add(connection)` sends the next and
    returns its future) until the bookie goes away."""
    connection = await BookieConnection.connect(address, request_timeout=10)
    in_flight: deque[asyncio.Future[None]] = deque()
    try:
        while True:
            while len(in_flight) >= window:
                try:
                    await in_flight.popleft()
                except BookieUnavailable:
                    return
            in_flight.append(add(connection))
            if len(in_flight) % 16 == 0:
                await asyncio.sleep(0)  # let answers in while the window fills
    finally:
        await connection.close()  # fails whatever is still in flight
        for future in in_flight:
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: the loss is expected
