"""Several processes on one store (sqlite and ZooKeeper): crashes and CAS races, for real."""

from __future__ import annotations

import asyncio

from tally.metadata import WatchKind
from tests.metadata.conftest import Backend
from tests.metadata.support import Recorder, StoreProcess

WORKER_SESSION_TIMEOUT = 1.0
EXPIRY_SLACK = 1.0
"""Allowed beyond the session timeout: a ZooKeeper tick, a sweep, a watch poll, loaded CI."""


async def test_sigkilled_process_loses_its_ephemerals_within_the_session_timeout(
    shared_backend: Backend,
) -> None:
    async with shared_backend.open() as observer:
        worker = await StoreProcess.start(shared_backend.uri, WORKER_SESSION_TIMEOUT)
        try:
            assert await worker.ask("ephemeral", "/alive") == ["ok", "/alive"]
            stat = await observer.exists("/alive")
            assert stat is not None
            assert stat.ephemeral_owner == worker.session_id
            gone = Recorder()
            await observer.watch("/alive", WatchKind.EXISTS, gone)
            await asyncio.sleep(2 * WORKER_SESSION_TIMEOUT)
            assert await observer.exists("/alive") is not None, "a live session kept its key"

            loop = asyncio.get_running_loop()
            killed_at = loop.time()
            await worker.kill()
            await gone.wait_for(1, timeout=WORKER_SESSION_TIMEOUT + 10)
            elapsed = loop.time() - killed_at
        finally:
            await worker.stop()
        assert await observer.exists("/alive") is None
        assert elapsed < WORKER_SESSION_TIMEOUT + EXPIRY_SLACK, elapsed


async def test_two_processes_racing_a_cas_exactly_one_wins(shared_backend: Backend) -> None:
    rounds = 25
    async with shared_backend.open() as store:
        await store.create("/cas", b"start")
        workers = await asyncio.gather(
            *(StoreProcess.start(shared_backend.uri, shared_backend.session_timeout) for _ in "ab")
        )
        try:
            for version in range(rounds):
                seen = await asyncio.gather(*(w.ask("version", "/cas") for w in workers))
                assert seen == [["version", str(version)]] * 2
                outcomes = await asyncio.gather(*(w.ask("cas", "/cas", version) for w in workers))
                assert sorted(reply[0] for reply in outcomes) == ["lost", "won"], outcomes
        finally:
            for worker in workers:
                await worker.stop()
        final = await store.get("/cas")
        assert final.version == rounds
        assert final.data in {str(w.process.pid).encode() for w in workers}
