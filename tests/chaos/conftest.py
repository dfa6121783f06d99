"""Tests of the chaos harness: `async def` tests each run in a fresh event loop, under a
deadline."""

from __future__ import annotations

import pytest

from tests.support.async_tests import run_if_async

ASYNC_TEST_DEADLINE = 60.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests in a fresh event loop, under a deadline."""
    return run_if_async(pyfuncitem, ASYNC_TEST_DEADLINE)
