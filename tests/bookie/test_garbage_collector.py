"""A bookie's garbage collection on real ledger storage and a real (in-memory) store:
tombstones drop data and are acknowledged, absence of metadata never does, a store
that cannot be read deletes nothing, and extra copies of closed ledgers go under a lock."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tally.bookie.garbage_collector import GarbageCollector, GcMetrics
from tally.bookie.index import DeletedLedger
from tally.bookie.ledger_storage import LedgerStorage
from tally.core.deletion import ClusterSettings
from tally.core.digest import crc32c
from tally.core.errors import NoSuchLedger
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import Deletion
from tally.metadata import deletion
from tally.metadata.cluster import init_cluster
from tally.metadata.cluster_settings import write_settings
from tally.metadata.ledger_manager import LedgerManager, LedgerRecord
from tally.metadata.paths import LEDGER_METADATA
from tally.metadata.store import MetadataStore
from tally.metadata.stores import open_store
from tally.metadata.tombstones import read_tombstone
from tally.metadata.underreplication import UnderReplicationManager
from tests.support.ledgers import open_ledger

ME = "me:3181"
OTHERS = ("b:3181", "c:3181")
RETENTION = 3600.0
_names = itertools.count()


@dataclass
class Setup:
    storage: LedgerStorage
    store: MetadataStore
    collector: GarbageCollector
    checkpoints: list[int] = field(default_factory=list)
    clock: list[float] = field(default_factory=lambda: [1_000.0])

    @property
    def ledgers(self) -> LedgerManager:
        return LedgerManager(self.store)


@asynccontextmanager
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    storage = LedgerStorage(tmp_path / "ledgers")
    store = open_store(f"memory://gc-{next(_names)}")
    await store.start()
    await init_cluster(store)
    await write_settings(store, ClusterSettings(ledger_delete_retention=0))
    checkpoints: list[int] = []
    clock = [1_000.0]

    async def checkpoint() -> None:
        checkpoints.append(len(checkpoints))
        storage.checkpoint(b"mark")

    collector = GarbageCollector(
        storage,
        store,
        ME,
        wait_time=600,
        overreplicated_wait_time=86400,
        tombstone_retention=RETENTION,
        checkpoint=checkpoint,
        metrics=GcMetrics(CollectorRegistry()),
        clock=lambda: clock[0],
    )
    try:
        yield Setup(storage, store, collector, checkpoints, clock)
    finally:
        storage.close()
        await store.close()


def write(storage: LedgerStorage, ledger_id: LedgerId, entries: range) -> None:
    for entry_id in entries:
        data = f"{ledger_id}/{entry_id}".encode()
        storage.add_entry(ledger_id, entry_id, crc32c(data), data, -1)
    storage.checkpoint(b"mark")


async def closed_ledger(
    setup: Setup, ledger: int, ensemble: tuple[str, ...] = (ME, *OTHERS), last: int = 9
) -> LedgerRecord:
    ledger_id = LedgerId.classic(ledger)
    metadata = open_ledger(ensemble, len(ensemble), 2)
    await setup.ledgers.create_ledger_metadata(ledger_id, metadata)
    write(setup.storage, ledger_id, range(last + 1))
    return await setup.ledgers.update(ledger_id, lambda m: m.close(last, 10 * (last + 1)))


async def tombstone(setup: Setup, record: LedgerRecord) -> None:
    outcome = await deletion.delete_ledger(
        setup.ledgers, record.ledger_id, reason="test", now_ms=1_000
    )
    assert outcome.tombstone is not None


def held(storage: LedgerStorage, ledger_id: LedgerId) -> set[int]:
    try:
        return set(storage.availability(ledger_id))
    except NoSuchLedger:
        return set()


async def test_a_tombstone_drops_the_data_then_is_acknowledged(tmp_path: Path) -> None:
    async with setup(tmp_path) as s:
        doomed, kept = await closed_ledger(s, 1), await closed_ledger(s, 2)
        elsewhere = await closed_ledger(s, 3, ensemble=(ME, *OTHERS))
        await tombstone(s, doomed)
        s.storage.delete_ledger(elsewhere.ledger_id)  # never held here any more
        await tombstone(s, elsewhere)
        run = await s.collector.collect()
        assert run.ledgers_deleted == [doomed.ledger_id.qualified_name]
        assert run.tombstones_acknowledged == 2
        assert s.checkpoints  # the drop was made durable before the acknowledgement
        assert held(s.storage, doomed.ledger_id) == set()
        assert held(s.storage, kept.ledger_id) == set(range(10))
        for record in (doomed, elsewhere):
            found = await read_tombstone(s.store, record.ledger_id)
            assert found is not None
            assert found.tombstone.bookies[ME] is not None
            assert found.tombstone.pending == set(OTHERS)
        again = await s.collector.collect()
        assert (again.ledgers_deleted, again.tombstones_acknowledged) == ([], 0)


async def test_a_ledger_dropped_under_its_tombstone_is_remembered_for_the_retention(
    tmp_path: Path,
) -> None:
    """So that a metadata recovery from the bookies never brings it back (issue 18); a
    ledger dropped for another reason (over-replication) leaves no such record."""
    async with setup(tmp_path) as s:
        doomed, extra = await closed_ledger(s, 1), await closed_ledger(s, 2)
        await tombstone(s, doomed)
        await s.collector.collect()
        assert s.storage.deleted_ledgers() == {doomed.ledger_id: DeletedLedger(1_000, 1_000.0)}
        s.storage.delete_ledger(extra.ledger_id)
        assert s.storage.deleted_ledgers() == {doomed.ledger_id: DeletedLedger(1_000, 1_000.0)}
        s.clock[0] += RETENTION - 1
        await s.collector.collect()
        assert doomed.ledger_id in s.storage.deleted_ledgers()
        s.clock[0] += 2
        await s.collector.collect()
        assert s.storage.deleted_ledgers() == {}


async def test_missing_metadata_deletes_nothing_and_reports_an_orphan(tmp_path: Path) -> None:
    async with setup(tmp_path) as s:
        record = await closed_ledger(s, 7)
        await s.store.delete(LEDGER_METADATA.path(record.ledger_id))  # behind the delete path
        run = await s.collector.collect(everything=True)
        assert run.ledgers_deleted == []
        assert run.orphans == [record.ledger_id.qualified_name]
        assert held(s.storage, record.ledger_id) == set(range(10))
        orphans = await s.collector.orphans()
        assert [(o.ledger_id, o.entries) for o in orphans] == [(record.ledger_id, 10)]
        alive = await closed_ledger(s, 8)
        deleted = await s.collector.delete_orphans([record.ledger_id, alive.ledger_id])
        assert deleted == [record.ledger_id]
        assert held(s.storage, record.ledger_id) == set()
        assert held(s.storage, alive.ledger_id) == set(range(10))


async def test_a_store_that_cannot_be_read_deletes_nothing(tmp_path: Path) -> None:
    async with setup(tmp_path) as s:
        doomed = await closed_ledger(s, 1)
        moved = await closed_ledger(s, 2)
        await tombstone(s, doomed)
        await s.ledgers.update(moved.ledger_id, lambda m: m.replace_bookie(0, ME, "d:3181"))
        await s.store.close()
        run = await s.collector.collect(everything=True)
        assert len(run.skipped) == 2, run.skipped
        assert held(s.storage, doomed.ledger_id) == set(range(10))
        assert held(s.storage, moved.ledger_id) == set(range(10))


async def test_extra_copies_of_closed_ledgers_go_unless_marked(tmp_path: Path) -> None:
    async with setup(tmp_path) as s:
        moved = await closed_ledger(s, 1)
        marked = await closed_ledger(s, 2)
        owed = await closed_ledger(s, 3, ensemble=(ME, *OTHERS, "d:3181"), last=7)
        soft = await closed_ledger(s, 4)
        for record in (moved, marked):
            await s.ledgers.update(record.ledger_id, lambda m: m.replace_bookie(0, ME, "d:3181"))
        await UnderReplicationManager(s.store).mark_under_replicated(marked.ledger_id, ["x:1"])
        await s.ledgers.update(
            soft.ledger_id, lambda m: m.deleted(Deletion(5, "soft delete keeps the data"))
        )
        run = await s.collector.collect(everything=True)
        assert run.ledgers_trimmed == [moved.ledger_id.qualified_name]
        assert held(s.storage, moved.ledger_id) == set()
        assert held(s.storage, marked.ledger_id) == set(range(10))
        assert held(s.storage, owed.ledger_id) == set(range(8))  # WQ = E: all its own
        assert held(s.storage, soft.ledger_id) == set(range(10))
        assert run.orphans == []


async def test_entries_outside_the_write_sets_are_trimmed(tmp_path: Path) -> None:
    async with setup(tmp_path) as s:
        ledger_id = LedgerId.classic(9)
        metadata = open_ledger((ME, *OTHERS), 2).close(8, 90)
        await s.ledgers.create_ledger_metadata(ledger_id, metadata)
        write(s.storage, ledger_id, range(12))  # every entry, and 3 past the end
        run = await s.collector.collect(everything=True)
        mine = {e for e in range(9) if ME in metadata.write_set_bookies(e)}
        assert held(s.storage, ledger_id) == mine | {9, 10, 11}
        assert run.entries_trimmed == 9 - len(mine)


@pytest.mark.parametrize("everything", [False, True])
async def test_overreplication_runs_only_when_due_or_forced(
    tmp_path: Path, everything: bool
) -> None:
    async with setup(tmp_path) as s:
        first = await s.collector.collect()
        assert first.overreplication_checked
        second = await s.collector.collect(everything=everything)
        assert second.overreplication_checked is everything
        assert [run["started_ms"] for run in s.collector.details()] == [
            second.started_ms,
            first.started_ms,
        ]
