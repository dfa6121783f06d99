"""Fixtures for the metadata store tests: every backend, and a real ZooKeeper server.

Tests here may be `async def`: each runs in its own event loop (no plugin needed), under
a deadline so a hung store fails the test instead of the run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tally.core.errors import TallyError
from tally.metadata import MetadataStore, open_store
from tally.metadata.zk_ensemble import ZooKeeperEnsemble
from tally.metadata.zk_server import ZooKeeperServer, missing_prerequisite
from tally.ports import free_port as free_port
from tests.support.async_tests import run_if_async

ASYNC_TEST_DEADLINE = 60.0
ZK_SESSION_TIMEOUT = 2.0
SQLITE_SESSION_TIMEOUT = 1.5
CONNECT_TIMEOUT = 5.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    return run_if_async(pyfuncitem, ASYNC_TEST_DEADLINE)


ZooKeeper = TypeVar("ZooKeeper", bound=ZooKeeperServer | ZooKeeperEnsemble)


@contextmanager
def running(zookeeper: ZooKeeper) -> Iterator[ZooKeeper]:
    """`zookeeper` started, and stopped after. Missing Java or ZooKeeper fails, never skips."""
    why_not = missing_prerequisite()
    if why_not is not None:
        pytest.fail(why_not)
    try:
        zookeeper.start()
    except TallyError as e:
        pytest.fail(str(e))
    try:
        yield zookeeper
    finally:
        zookeeper.stop()


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One real ZooKeeper for the session."""
    with running(ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))) as server:
        yield server


@dataclass
class Backend:
    """A fresh, empty store location of one kind; `open()` gives a new session on it."""

    name: str
    uri: str
    session_timeout: float
    zookeeper: ZooKeeperServer | None = None

    def open(self, **kwargs: Any) -> MetadataStore:
        kwargs.setdefault("session_timeout", self.session_timeout)
        kwargs.setdefault("connect_timeout", CONNECT_TIMEOUT)
        return open_store(self.uri, **kwargs)


def make_backend(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    unique = uuid.uuid4().hex[:12]
    if name == "memory":
        return Backend(name, f"memory://t-{unique}", SQLITE_SESSION_TIMEOUT)
    if name == "sqlite":
        return Backend(name, f"sqlite://{tmp_path / 'meta.db'}", SQLITE_SESSION_TIMEOUT)
    server: ZooKeeperServer = request.getfixturevalue("zookeeper")
    return Backend(name, server.uri(f"/t-{unique}"), ZK_SESSION_TIMEOUT, server)


@pytest.fixture(params=["memory", "sqlite", "zk"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, request, tmp_path)


@pytest.fixture(params=["sqlite", "zk"])
def shared_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """A backend that several processes share (memory is one process only)."""
    return make_backend(request.param, request, tmp_path)
