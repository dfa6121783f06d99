"""Tests here may be `async def`: each runs in a fresh event loop under a deadline. They
drive the client against fake bookies (tests/support/fake_bookie.py), no processes."""

from __future__ import annotations

import pytest

from tests.support.async_tests import run_if_async

ASYNC_TEST_DEADLINE = 30.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests in a fresh event loop, under a deadline."""
    return run_if_async(pyfuncitem, ASYNC_TEST_DEADLINE)
