"""Waiting for an event in a test: poll a condition until it holds, or fail at a deadline.

Tests wait for what they expect instead of sleeping a fixed time; to show that something
does not happen, they wait for a later event that must come after it (a pass counted, a
clock advanced) and then look. `until` serves async tests, `wait_until` plain ones.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

Condition = Callable[[], object] | Callable[[], Awaitable[object]]

DEFAULT_TIMEOUT = 10.0
STEP = 0.005


async def until(
    condition: Condition, what: str = "", *, timeout: float = DEFAULT_TIMEOUT, step: float = STEP
) -> float:
    """Poll `condition()` (sync or async) until it is truthy; the seconds it took.
    Fails the test, naming `what`, after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        result = condition()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return loop.time() - started
        if loop.time() - started > timeout:
            raise AssertionError(f"not within {timeout:g}s: {what or condition}")
        await asyncio.sleep(step)


def wait_until(
    condition: Callable[[], object],
    what: str = "",
    *,
    timeout: float = DEFAULT_TIMEOUT,
    step: float = STEP,
) -> float:
    """`until` for plain tests: blocks the thread between polls."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"not within {timeout:g}s: {what or condition}")
        time.sleep(step)
    return time.monotonic() - started
