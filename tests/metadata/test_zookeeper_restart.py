"""A real ZooKeeper restarting under open stores: reconnect, re-armed watches, lost sessions."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from tally.core.errors import SessionExpired
from tally.metadata import WatchKind, open_store
from tests.metadata.conftest import ZooKeeperServer, free_port
from tests.metadata.support import Recorder


@pytest.fixture
def server(zookeeper: ZooKeeperServer) -> Iterator[ZooKeeperServer]:
    """The session's ZooKeeper, put back on its usual port whatever the test did."""
    yield zookeeper
    if zookeeper.running_port != zookeeper.port:
        zookeeper.restart()


def fresh_uri(server: ZooKeeperServer) -> str:
    return server.uri(f"/restart-{uuid.uuid4().hex[:12]}")


async def test_clients_reconnect_after_a_restart_and_keep_their_session(
    server: ZooKeeperServer,
) -> None:
    uri = fresh_uri(server)
    # The session must outlive the server's restart plus the client's reconnect: on a
    # loaded machine a JVM start alone can take several seconds (4 s expired in CI). The
    # first read waits for the reconnect within the connect timeout, which is as long as
    # the session (a read after the restart once waited more than 10 s, in a fresh clone's
    # `make test` beside other tests): a session that lives is all this test asks.
    async with open_store(uri, session_timeout=15.0, connect_timeout=15.0) as store:
        await store.create("/eph", ephemeral=True)
        await store.create("/data", b"0")
        data = Recorder()
        children = Recorder()
        await store.watch("/data", WatchKind.DATA, data)
        await store.watch("/", WatchKind.CHILDREN, children)

        await asyncio.to_thread(server.restart)

        assert (await store.get("/data")).data == b"0"
        stat = await store.exists("/eph")
        assert stat is not None
        assert stat.ephemeral_owner == store.session_id
        assert not store.session_lost.is_set()
        async with open_store(uri, session_timeout=4.0, connect_timeout=10.0) as other:
            seen = len(data.events)
            await other.set("/data", b"1")
            await data.wait_for(seen + 1)
            seen = len(children.events)
            await other.create("/new")
            await children.wait_for(seen + 1)
        assert not store.session_lost.is_set()


async def test_a_session_that_expires_during_an_outage_is_reported_lost(
    server: ZooKeeperServer,
) -> None:
    uri = fresh_uri(server)
    session_timeout = 1.0
    async with open_store(uri, session_timeout=session_timeout, connect_timeout=10.0) as store:
        await store.create("/eph", ephemeral=True)
        await store.create("/data", b"0")
        data = Recorder()
        await store.watch("/data", WatchKind.DATA, data)
        lost = asyncio.Event()
        store.on_session_lost(lost.set)

        # The server comes back where this client cannot reach it, and expires the session
        # it restored from disk; then it returns to its usual port.
        await asyncio.to_thread(server.restart, free_port())
        await asyncio.sleep(session_timeout + 1.5)
        assert not lost.is_set(), "a client cannot learn of the expiry before it reconnects"
        await asyncio.to_thread(server.restart)

        await asyncio.wait_for(lost.wait(), 10)
        assert store.session_lost.is_set()
        assert await store.exists("/eph") is None
        with pytest.raises(SessionExpired):
            await store.create("/eph", ephemeral=True)
        seen = len(data.events)
        await store.set("/data", b"after")
        await data.wait_for(seen + 1)
        assert (await store.get("/data")).data == b"after"
