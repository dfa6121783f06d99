"""The replication worker's steps: replication.copy (a RECOVERY_ADD of a copied entry),
replication.commit (the metadata update that puts the new bookies in) and
replication.unmark (the removal of the mark that ends a repair), and metadata.cas under
the last of them.

A bookie of a closed E3 WQ2 AQ2 ledger is lost and the ledger marked; one spare bookie is
left to replace it. Whatever step fails, the mark stays until a turn has done the whole
repair, the metadata never names a bookie that was not given every copy, the lock is given
back, and a later turn (or a later worker, after a worker process crashed) completes it:
the mark goes, and every copy of every entry is on the bookies of its write set.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import tally
from tally.autorecovery.config import AutoRecoveryConfig
from tally.core.ids import LedgerId
from tally.failpoints import CRASH_EXIT_CODE, enabled
from tally.metadata.ledger_manager import LedgerRecord
from tally.metadata.paths import LOCKS
from tests.autorecovery.test_replication_worker import CLIENT, running_worker
from tests.failpoints.conftest import (
    PASSWORD,
    InProcessCluster,
    failpoints_env,
    in_process_cluster,
    payload,
)
from tests.support.cluster import SESSION_TIMEOUT, replica_copies
from tests.support.polling import until
from tests.support.processes import AutoRecoveryProcess, init_cluster

FAST = AutoRecoveryConfig(
    under_replicated_poll_interval=0.2,
    replication_backoff_initial=0.1,
    replication_backoff_max=0.2,
)
ENTRIES = 20


async def lose_a_bookie(cluster: InProcessCluster) -> tuple[LedgerRecord, str]:
    """A closed ledger on 3 of the 4 bookies, one of them stopped and the ledger marked
    for it; its record, and the lost bookie."""
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
        )
        await asyncio.gather(
            *(writer.append_nowait(payload(writer.ledger_id, e, 100)) for e in range(ENTRIES))
        )
        await writer.close()
        victim = writer.metadata.metadata.segments[0].ensemble[0]
        await cluster.stop(victim)
        await client.context.under_replication.mark_under_replicated(writer.ledger_id, [victim])
        return writer.metadata, victim


async def state(uri: str, ledger_id: LedgerId) -> tuple[LedgerRecord, bool, list[str]]:
    """The ledger's record, whether it is marked, and the replication locks held."""
    async with tally.Client(uri, config=CLIENT) as client:
        record = await client.context.ledgers.read_ledger_metadata(ledger_id)
        mark = await client.context.under_replication.under_replicated(ledger_id)
        locks = await client.context.ledgers.store.children(LOCKS)
    return record, mark is not None, locks


async def assert_repaired(uri: str, ledger_id: LedgerId, victim: str) -> None:
    record, marked, locks = await state(uri, ledger_id)
    assert not marked
    assert locks == []
    assert victim not in record.metadata.bookies()
    copies = await replica_copies(ledger_id, record.metadata, PASSWORD, ENTRIES - 1)
    for entry_id, by_bookie in copies.items():
        assert set(by_bookie.values()) == {payload(ledger_id, entry_id, 100)}, by_bookie


async def repaired(uri: str, ledger_id: LedgerId) -> bool:
    _, marked, _ = await state(uri, ledger_id)
    return not marked


async def unlocked(uri: str) -> bool:
    async with tally.Client(uri, config=CLIENT) as client:
        return await client.context.ledgers.store.children(LOCKS) == []


async def test_failed_copies_commit_nothing_and_leave_the_mark(tmp_path: Path) -> None:
    async with in_process_cluster(tmp_path, 4) as cluster:
        before, victim = await lose_a_bookie(cluster)
        async with running_worker(cluster.uri, FAST, "failpoints", (PASSWORD,)) as worker:
            with enabled("replication.copy", "error") as point:
                await until(lambda: worker.status()["failed"] >= 2, "two failed turns")
                record, marked, _ = await state(cluster.uri, before.ledger_id)
                assert marked
                assert (record.metadata, record.version) == (before.metadata, before.version)
                assert point.hits >= 2
                assert worker.status()["entries_copied"] == 0
            await until(lambda: repaired(cluster.uri, before.ledger_id), "repaired after")
        await assert_repaired(cluster.uri, before.ledger_id, victim)


async def test_a_failed_unmark_leaves_the_mark_for_a_later_turn(tmp_path: Path) -> None:
    async with in_process_cluster(tmp_path, 4) as cluster:
        before, victim = await lose_a_bookie(cluster)
        async with running_worker(cluster.uri, FAST, "failpoints", (PASSWORD,)) as worker:
            with enabled("replication.unmark", "error"):
                await until(lambda: worker.status()["failed"] >= 2, "two failed turns")
                record, marked, _ = await state(cluster.uri, before.ledger_id)
                assert marked, "the mark stays until a turn removes it"
                assert victim not in record.metadata.bookies(), "the copies were committed"
            await until(lambda: repaired(cluster.uri, before.ledger_id), "repaired after")
        await assert_repaired(cluster.uri, before.ledger_id, victim)


async def test_a_store_error_at_the_unmark_gives_the_lock_back(tmp_path: Path) -> None:
    """The unmark's transaction (mark and lock deleted together) fails with a store error:
    the worker must give its lock back, or no worker could ever take the ledger again."""
    async with in_process_cluster(tmp_path, 4) as cluster:
        before, victim = await lose_a_bookie(cluster)
        # The repair's first compare-and-set is its commit, the second its unmark.
        with enabled("metadata.cas", "1*off->1*error") as point:
            async with running_worker(cluster.uri, FAST, "failpoints", (PASSWORD,)) as worker:
                await until(lambda: worker.status()["failed"] >= 1, "the unmark failed")
                await until(lambda: unlocked(cluster.uri), "the lock given back", timeout=5)
                await until(lambda: repaired(cluster.uri, before.ledger_id), "repaired after")
            assert point.hits >= 3
        await assert_repaired(cluster.uri, before.ledger_id, victim)


async def test_a_worker_crashing_before_its_commit_leaves_the_ledger_to_another(
    tmp_path: Path,
) -> None:
    uri = init_cluster(tmp_path)
    async with in_process_cluster(tmp_path, 4, uri=uri) as cluster:
        before, victim = await lose_a_bookie(cluster)
        process = AutoRecoveryProcess(
            uri,
            tmp_path / "autorecovery.log",
            "ar-crash",
            settings={
                "session_timeout": str(SESSION_TIMEOUT),
                "under_replicated_poll_interval": "0.2",
            },
            client_settings={"placement": "default"},
            env=failpoints_env("replication.commit=crash"),
        )
        try:
            await asyncio.to_thread(process.start)
            assert process.process is not None
            code = await asyncio.to_thread(process.process.wait, 60)
        finally:
            process.kill()
        assert code == CRASH_EXIT_CODE, process.log()
        assert "tally failpoint replication.commit: crash" in process.log()
        record, marked, _ = await state(uri, before.ledger_id)
        assert marked
        assert (record.metadata, record.version) == (before.metadata, before.version)
        async with running_worker(uri, FAST, "failpoints", (PASSWORD,)):
            await until(
                lambda: repaired(uri, before.ledger_id),
                "repaired by another worker",
                timeout=4 * SESSION_TIMEOUT + 10,
            )
        await assert_repaired(uri, before.ledger_id, victim)
