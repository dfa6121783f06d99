"""A 3-member ZooKeeper ensemble under a tally store: the chaos suite's leader kill and
pause of the metadata store, which the store rides out within its session timeout."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest

from tally.core.errors import Timeout
from tally.metadata import MetadataStore, open_store
from tally.metadata.zk_ensemble import ZooKeeperEnsemble
from tally.metadata.zk_server import START_DEADLINE, srvr
from tests.metadata.conftest import running
from tests.support.polling import until

SESSION_TIMEOUT = 6.0
CONNECT_TIMEOUT = 5.0


@pytest.fixture(scope="module")
def running_ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperEnsemble]:
    """One ensemble for the module: its JVMs are the slow part."""
    with running(ZooKeeperEnsemble(tmp_path_factory.mktemp("zk-ensemble"))) as ensemble:
        yield ensemble


@pytest.fixture
def ensemble(running_ensemble: ZooKeeperEnsemble) -> Iterator[ZooKeeperEnsemble]:
    """The module's ensemble, every member back and serving whatever the test did."""
    yield running_ensemble
    for n, member in enumerate(running_ensemble.members):
        if member.process is None:
            running_ensemble.restart(n)
        else:
            member.resume()
            member.wait_serving(time.monotonic() + START_DEADLINE)


def open_on(uri: str) -> MetadataStore:
    return open_store(uri, session_timeout=SESSION_TIMEOUT, connect_timeout=CONNECT_TIMEOUT)


def fresh_chroot() -> str:
    return f"/ensemble-{uuid.uuid4().hex[:12]}"


async def write_soon(store: MetadataStore, path: str, data: bytes) -> float:
    """Set `path` to `data`, again while no member takes it (its outcome is then unknown,
    and setting it twice is harmless); the seconds it took, within the session timeout."""

    async def written() -> bool:
        try:
            await store.set(path, data)
        except Timeout:
            return False
        return True

    return await until(written, f"set {path} to {data!r}", timeout=SESSION_TIMEOUT, step=0.05)


async def leader(ensemble: ZooKeeperEnsemble) -> int | None:
    return await asyncio.to_thread(ensemble.leader)


async def has_leader(ensemble: ZooKeeperEnsemble) -> bool:
    return await leader(ensemble) is not None


async def test_a_store_on_the_ensemble_writes_and_reads(ensemble: ZooKeeperEnsemble) -> None:
    modes = sorted(str(member.mode()) for member in ensemble.members)
    assert modes == ["follower", "follower", "leader"]
    assert ensemble.hosts == ",".join(f"127.0.0.1:{m.port}" for m in ensemble.members)
    chroot = fresh_chroot()
    async with open_on(ensemble.uri(chroot)) as store:
        await store.create("/key", b"value")
        assert (await store.get("/key")).data == b"value"
    # Written through one member, the key is on each: a new session is a write through
    # the leader, which a member answers only once it has applied the writes before it.
    for member in ensemble.members:
        async with open_on(member.uri(chroot)) as one:
            assert (await one.get("/key")).data == b"value"


async def test_a_killed_leader_is_replaced_and_the_store_keeps_its_session(
    ensemble: ZooKeeperEnsemble,
) -> None:
    chroot = fresh_chroot()
    async with open_on(ensemble.uri(chroot)) as store:
        await store.create("/eph", ephemeral=True)
        await store.create("/data", b"0")
        old = await leader(ensemble)
        assert old is not None

        killed_at = time.monotonic()
        await asyncio.to_thread(ensemble.kill, old)
        await until(lambda: has_leader(ensemble), "a new leader", timeout=SESSION_TIMEOUT)
        assert await leader(ensemble) != old
        await write_soon(store, "/data", b"1")
        assert time.monotonic() - killed_at < SESSION_TIMEOUT
        assert not store.session_lost.is_set()
        stat = await store.exists("/eph")
        assert stat is not None
        assert stat.ephemeral_owner == store.session_id

        await asyncio.to_thread(ensemble.restart, old)
        assert ensemble.members[old].mode() == "follower"
        async with open_on(ensemble.members[old].uri(chroot)) as rejoined:
            assert (await rejoined.get("/data")).data == b"1"


async def test_writes_go_on_while_a_follower_is_paused(ensemble: ZooKeeperEnsemble) -> None:
    chroot = fresh_chroot()
    async with open_on(ensemble.uri(chroot)) as store:
        await store.create("/data", b"0")
        leading = await leader(ensemble)
        assert leading is not None
        # The follower the store is on, when it is on one: the slow case, where the client
        # waits for its pings to time out before it moves to another member.
        follower = max(
            (n for n in range(ensemble.size) if n != leading),
            key=lambda n: int(srvr(ensemble.members[n].port).get("Connections", 0)),
        )

        await asyncio.to_thread(ensemble.pause, follower)
        for i in range(1, 4):
            await write_soon(store, "/data", b"%d" % i)
        assert (await store.get("/data")).data == b"3"
        assert await leader(ensemble) == leading

        await asyncio.to_thread(ensemble.resume, follower)
        member = ensemble.members[follower]
        await until(
            lambda: asyncio.to_thread(lambda: member.mode() == "follower"),
            "the resumed member follows",
        )
        await write_soon(store, "/data", b"4")
        assert not store.session_lost.is_set()
