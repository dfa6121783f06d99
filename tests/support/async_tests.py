"""Running `async def` tests: each in a fresh event loop, under its directory's deadline.

Each test directory's conftest keeps its own `pytest_pyfunc_call` hook (pytest finds hooks
per directory) and calls `run_if_async` with its deadline; a plain test (a hypothesis one,
say) runs a coroutine with `run`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def run_if_async(pyfuncitem: pytest.Function, deadline: float) -> bool | None:
    """Run the test if it is a coroutine function (True); None lets pytest run it."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    run(pyfuncitem.obj(**kwargs), deadline)
    return True


def run(coroutine: Coroutine[Any, Any, T], deadline: float = 60.0) -> T:
    """Run `coroutine` in a fresh event loop; it fails (TimeoutError) past `deadline` s."""
    return asyncio.run(asyncio.wait_for(coroutine, deadline))
