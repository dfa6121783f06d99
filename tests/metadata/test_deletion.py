"""The delete path on every backend: soft delete, undelete, archival, tombstones, the sweep."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tally.core.deletion import ClusterSettings, DeletePlan
from tally.core.errors import DeleteRefused, LedgerDeleted, MalformedData, NoSuchLedger
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerState
from tally.metadata import deletion
from tally.metadata.cluster import init_cluster
from tally.metadata.cluster_settings import read_settings, write_settings
from tally.metadata.ledger_manager import LedgerManager, LedgerRecord
from tally.metadata.paths import SETTINGS, TOMBSTONE_RECORDS
from tally.metadata.store import MetadataStore
from tally.metadata.tombstones import acknowledge_tombstone, read_tombstone
from tally.metadata.underreplication import UnderReplicationManager
from tests.metadata.conftest import Backend
from tests.metadata.service_support import sample_metadata

HOUR_MS = 3_600_000


async def closed_ledger(store: MetadataStore, ledger: int = 1) -> LedgerRecord:
    manager = LedgerManager(store)
    ledger_id = LedgerId.classic(ledger)
    await manager.create_ledger_metadata(ledger_id, sample_metadata())
    return await manager.update(ledger_id, lambda metadata: metadata.close(9, 90))


async def delete(
    store: MetadataStore,
    ledger_id: LedgerId,
    now_ms: int = 1_000,
    *,
    force: bool = False,
    recover: deletion.Recover | None = None,
    check: deletion.Check | None = None,
) -> deletion.DeleteOutcome:
    return await deletion.delete_ledger(
        LedgerManager(store),
        ledger_id,
        reason="a test",
        now_ms=now_ms,
        force=force,
        recover=recover,
        check=check,
    )


async def test_a_soft_delete_keeps_the_metadata_and_undelete_restores_it(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        record = await closed_ledger(store)
        manager = LedgerManager(store)

        async def check(found: LedgerRecord) -> tuple[int, str]:
            assert found == record
            return 0, "every entry on its bookies"

        outcome = await delete(store, record.ledger_id, check=check)
        assert outcome.plan is DeletePlan.DELETE
        assert outcome.tombstone is None
        assert outcome.deletion.detail == "every entry on its bookies"
        stored = await manager.read_ledger_metadata(record.ledger_id)
        assert stored.metadata.state is LedgerState.DELETED
        with pytest.raises(LedgerDeleted, match="undeleteledger"):
            await deletion.read_undeleted(manager, record.ledger_id)
        again = await delete(store, record.ledger_id, now_ms=5_000)
        assert again.plan is DeletePlan.ALREADY_DELETED
        assert again.deletion.time_ms == 1_000
        restored = await deletion.undelete_ledger(manager, record.ledger_id, now_ms=500)
        assert restored.metadata == dataclasses.replace(record.metadata, undeleted_ms=1_001)
        assert await deletion.read_undeleted(manager, record.ledger_id) == restored


async def test_retention_zero_writes_the_tombstone_at_once(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        await write_settings(store, ClusterSettings(ledger_delete_retention=0))
        record = await closed_ledger(store, 3)
        manager = LedgerManager(store)
        outcome = await delete(store, record.ledger_id)
        assert outcome.tombstone is not None
        assert dict(outcome.tombstone.tombstone.bookies) == dict.fromkeys(record.metadata.bookies())
        with pytest.raises(NoSuchLedger):
            await manager.read_ledger_metadata(record.ledger_id)
        with pytest.raises(LedgerDeleted, match="only its tombstone is left"):
            await deletion.read_existing(manager, record.ledger_id)
        with pytest.raises(LedgerDeleted, match="past its retention"):
            await deletion.undelete_ledger(manager, record.ledger_id, now_ms=2_000)
        with pytest.raises(LedgerDeleted):
            await delete(store, record.ledger_id)
        with pytest.raises(NoSuchLedger):
            await delete(store, LedgerId.classic(404))


async def test_open_ledgers_are_refused_unless_forced_and_then_recovered(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        manager = LedgerManager(store)
        ledger_id = LedgerId.classic(5)
        await manager.create_ledger_metadata(ledger_id, sample_metadata())
        with pytest.raises(DeleteRefused, match="is OPEN"):
            await delete(store, ledger_id)
        with pytest.raises(DeleteRefused, match="takes a client"):
            await delete(store, ledger_id, force=True)
        recovered: list[LedgerId] = []

        async def recover(found: LedgerRecord) -> LedgerRecord:
            recovered.append(found.ledger_id)
            return await manager.update(found.ledger_id, lambda m: m.close(-1, 0))

        outcome = await delete(store, ledger_id, force=True, recover=recover)
        assert recovered == [ledger_id]
        assert outcome.plan is DeletePlan.RECOVER_FIRST
        stored = await manager.read_ledger_metadata(ledger_id)
        assert stored.metadata.state is LedgerState.DELETED
        assert stored.metadata.deletion is not None
        assert stored.metadata.deletion.violations == -1  # no check was given


async def test_archival_required_refuses_until_the_bit_is_set(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        await write_settings(store, ClusterSettings(delete_requires_archival=True))
        record = await closed_ledger(store)
        manager = LedgerManager(store)
        with pytest.raises(DeleteRefused, match="not archived"):
            await delete(store, record.ledger_id)
        assert (await manager.read_ledger_metadata(record.ledger_id)).metadata.is_closed
        archived = await deletion.set_archived(manager, record.ledger_id)
        assert archived.metadata.archived
        assert (await delete(store, record.ledger_id)).plan is DeletePlan.DELETE


async def test_violations_found_at_deletion_are_kept_and_counted(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        await write_settings(store, ClusterSettings(ledger_delete_retention=0))
        record = await closed_ledger(store)
        before = deletion.LEDGERS_DELETED_WITH_VIOLATIONS._value.get()

        async def check(found: LedgerRecord) -> tuple[int, str]:
            return 4, "4 copies missing"

        outcome = await delete(store, record.ledger_id, check=check)
        assert outcome.tombstone is not None
        assert outcome.tombstone.tombstone.deletion.violations == 4
        found = await read_tombstone(store, record.ledger_id)
        assert found is not None
        assert found.tombstone.deletion.detail == "4 copies missing"
        assert deletion.LEDGERS_DELETED_WITH_VIOLATIONS._value.get() == before + 1


async def test_the_sweep_tombstones_removes_and_reports(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        await write_settings(
            store,
            ClusterSettings(
                ledger_delete_retention=3600, tombstone_retention=3600, deletion_stuck_after=60
            ),
        )
        manager = LedgerManager(store)
        records = [await closed_ledger(store, ledger) for ledger in (1, 2, 3)]
        for record in records[:2]:
            await delete(store, record.ledger_id, now_ms=0)
        first = await deletion.sweep_deletions(manager, now_ms=HOUR_MS - 1)
        assert (first.tombstoned, first.deleted_ledgers) == ([], 2)
        second = await deletion.sweep_deletions(manager, now_ms=HOUR_MS)
        assert second.tombstoned == [records[0].ledger_id, records[1].ledger_id]
        assert (second.tombstones, second.tombstones_pending) == (2, 2)
        # Every bookie of ledger 1 acknowledges; ledger 2's never do.
        for bookie in records[0].metadata.bookies():
            await acknowledge_tombstone(store, records[0].ledger_id, bookie, HOUR_MS + 10)
        third = await deletion.sweep_deletions(manager, now_ms=HOUR_MS + 61_000)
        assert third.stuck == [records[1].ledger_id]
        assert third.tombstones_removed == []
        fourth = await deletion.sweep_deletions(manager, now_ms=2 * HOUR_MS + 10)
        assert fourth.tombstones_removed == [records[0].ledger_id, records[1].ledger_id]
        assert await read_tombstone(store, records[0].ledger_id) is None
        assert (await manager.read_ledger_metadata(records[2].ledger_id)).metadata.is_closed
        assert await store.children(TOMBSTONE_RECORDS.classic.root) == []


async def test_every_bookie_acknowledging_at_once_is_recorded(backend: Backend) -> None:
    async with backend.open() as store, backend.open() as other:
        await init_cluster(store)
        await write_settings(store, ClusterSettings(ledger_delete_retention=0))
        record = await closed_ledger(store)
        await delete(store, record.ledger_id)
        bookies = [*sorted(record.metadata.bookies()), "extra:3181"]
        await asyncio.gather(
            *(
                acknowledge_tombstone(session, record.ledger_id, bookie, 7)
                for session, bookie in zip([store, other] * 2, bookies, strict=True)
            )
        )
        found = await read_tombstone(store, record.ledger_id)
        assert found is not None
        assert dict(found.tombstone.bookies) == dict.fromkeys(bookies, 7)
        assert await acknowledge_tombstone(store, LedgerId.classic(99), "a:1", 7) is None


async def test_settings_default_when_absent_and_a_bad_record_is_an_error(
    backend: Backend,
) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        assert await read_settings(store) == ClusterSettings()
        changed = ClusterSettings(tombstone_retention=5, delete_requires_archival=True)
        await write_settings(store, changed)
        assert await read_settings(store) == changed
        await store.set(SETTINGS, b'{"kind": "cluster-settings"}')
        with pytest.raises(MalformedData, match="cluster settings"):
            await read_settings(store)


async def test_a_tombstone_takes_the_ledger_s_mark_and_lost_entries_with_it(
    backend: Backend,
) -> None:
    """A ledger deleted while marked under-replicated (or listed lost) has nothing left to
    repair; a mark left behind would never be taken again and keep the cluster unsettled
    (a chaos run's settling waited for one for good)."""
    async with backend.open() as store:
        await init_cluster(store)
        await write_settings(store, ClusterSettings(ledger_delete_retention=0))
        record = await closed_ledger(store, 3)
        marks = UnderReplicationManager(store)
        mark = await marks.mark_under_replicated(record.ledger_id, ["bk1:3181"])
        await marks.record_lost_entries(
            record.ledger_id, [(4, 4)], "no copy", mark_version=mark.version
        )
        kept = await closed_ledger(store, 4)
        await marks.mark_under_replicated(kept.ledger_id, ["bk1:3181"])
        outcome = await delete(store, record.ledger_id)
        assert outcome.tombstone is not None
        assert await marks.under_replicated(record.ledger_id) is None
        assert await marks.lost_entries(record.ledger_id) is None
        assert await marks.under_replicated(kept.ledger_id) is not None
