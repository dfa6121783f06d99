"""The ledger manager on every backend: ids, metadata CRUD by CAS, watches, iteration."""

from __future__ import annotations

import asyncio

import pytest

from tally.core.errors import (
    BadRequest,
    LedgerExists,
    MalformedData,
    MetadataVersionConflict,
    NoSuchLedger,
)
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import Deletion, LedgerMetadata
from tally.metadata import ledger_manager
from tally.metadata.cluster import init_cluster
from tally.metadata.deletion import tombstone_ledger
from tally.metadata.ledger_manager import LedgerManager, LedgerRecord
from tally.metadata.ledger_tree import split, walk
from tally.metadata.paths import (
    IDGEN,
    LEDGER_METADATA,
    LEDGERS,
    SCOPED_SUFFIX,
    TOMBSTONE_RECORDS,
)
from tally.metadata.store import MetadataStore
from tests.metadata.conftest import Backend
from tests.metadata.service_support import (
    Collected,
    delete_now,
    sample_metadata,
    start_service_worker,
)


async def new_ledgers(store: MetadataStore, count: int) -> list[LedgerRecord]:
    manager = LedgerManager(store)
    ids = [await manager.generate_ledger_id() for _ in range(count)]
    return [await manager.create_ledger_metadata(i, sample_metadata()) for i in ids]


# -- ids ---------------------------------------------------------------------------------


async def test_classic_ids_count_up_from_one_and_scoped_ones_are_random(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        manager = LedgerManager(store)
        classic = [await manager.generate_ledger_id() for _ in range(5)]
        assert classic == [LedgerId.classic(i) for i in range(1, 6)]
        scoped = {await manager.generate_ledger_id(scoped=True) for _ in range(50)}
        assert len(scoped) == 50
        assert all(ledger_id.scope != 0 for ledger_id in scoped)
        assert await LedgerManager(store).generate_ledger_id() == LedgerId.classic(6)


async def test_concurrent_creators_on_several_sessions_never_share_an_id(
    backend: Backend,
) -> None:
    async with backend.open() as a, backend.open() as b, backend.open() as c:
        await init_cluster(a)
        managers = [LedgerManager(store) for store in (a, b, c)]
        ids = await asyncio.gather(*(m.generate_ledger_id() for m in managers for _ in range(30)))
        assert len(set(ids)) == 90
        assert sorted(i.id for i in ids) == list(range(1, 91))


async def test_ids_are_never_reused_after_deletes(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        created = await new_ledgers(store, 4)
        manager = LedgerManager(store)
        for record in created:
            await delete_now(manager, record.ledger_id)
        assert await store.children(LEDGERS) == []
    async with backend.open() as later:
        fresh = await LedgerManager(later).generate_ledger_id()
        assert fresh.id > max(record.ledger_id.id for record in created)


async def test_a_full_bucket_moves_the_sequence_to_the_next(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ledger_manager, "IDGEN_BUCKET_SIZE", 4)
    async with backend.open() as a, backend.open() as b:
        await init_cluster(a)
        first, second = LedgerManager(a), LedgerManager(b)
        assert [(await first.generate_ledger_id()).id for _ in range(3)] == [1, 2, 3]
        ids = await asyncio.gather(*(m.generate_ledger_id() for m in (first, second) * 10))
        numbers = sorted(i.id for i in ids)
        assert len(set(numbers)) == 20
        assert all(n % 4 != 0 for n in numbers), "a bucket's first id is never handed out"
        assert numbers[0] > 3
        assert len(await a.children(IDGEN)) >= 7


async def test_two_processes_allocating_at_once_never_share_an_id(
    shared_backend: Backend,
) -> None:
    async with shared_backend.open() as store:
        await init_cluster(store)
        workers = await asyncio.gather(
            *(start_service_worker(shared_backend.uri, 10.0) for _ in range(2))
        )
        try:
            manager = LedgerManager(store)
            replies, mine = await asyncio.gather(
                asyncio.gather(*(worker.ask("ids", 200) for worker in workers)),
                asyncio.gather(*(manager.generate_ledger_id() for _ in range(100))),
            )
        finally:
            for worker in workers:
                await worker.stop()
    theirs = [int(word) for reply in replies for word in reply[1:]]
    assert all(reply[0] == "ids" for reply in replies)
    every = theirs + [i.id for i in mine]
    assert len(every) == 500
    assert len(set(every)) == 500


# -- one ledger --------------------------------------------------------------------------


async def test_create_read_update_delete(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        manager = LedgerManager(store)
        for ledger_id in (await manager.generate_ledger_id(), LedgerId.from_uuid()):
            metadata = sample_metadata()
            created = await manager.create_ledger_metadata(ledger_id, metadata)
            assert created == LedgerRecord(ledger_id, metadata, 0)
            assert await manager.read_ledger_metadata(ledger_id) == created
            closed = metadata.close(99, 4096)
            updated = await manager.write_ledger_metadata(ledger_id, closed, 0)
            assert updated == LedgerRecord(ledger_id, closed, 1)
            assert await manager.read_ledger_metadata(ledger_id) == updated
            with pytest.raises(MetadataVersionConflict, match=f"ledger {ledger_id}.*version 0"):
                await manager.write_ledger_metadata(ledger_id, metadata, 0)
            deleted = await manager.write_ledger_metadata(
                ledger_id, closed.deleted(Deletion(5, "a test")), 1
            )
            stale = LedgerRecord(ledger_id, deleted.metadata, 1)
            assert await tombstone_ledger(manager, stale, now_ms=6) is None
            assert await manager.read_ledger_metadata(ledger_id) == deleted
            assert await tombstone_ledger(manager, deleted, now_ms=6) is not None
            with pytest.raises(NoSuchLedger, match=str(ledger_id)):
                await manager.read_ledger_metadata(ledger_id)
            with pytest.raises(NoSuchLedger):
                await manager.write_ledger_metadata(ledger_id, closed, 2)
        assert await store.children(LEDGERS) == []
        assert await store.children(LEDGERS + SCOPED_SUFFIX) == []


async def test_update_applies_its_change_again_after_a_conflict(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        manager = LedgerManager(store)
        (stale,) = await new_ledgers(store, 1)
        ledger_id = stale.ledger_id
        moved = await manager.write_ledger_metadata(
            ledger_id, stale.metadata.with_custom_metadata({"by": b"another"}), stale.version
        )
        seen: list[int] = []

        def close(metadata: LedgerMetadata) -> LedgerMetadata:
            seen.append(len(metadata.custom_metadata))
            return metadata.close(9, 100)

        closed = await manager.update(ledger_id, close, current=stale)
        assert seen == [len(stale.metadata.custom_metadata), len(moved.metadata.custom_metadata)]
        assert closed.version == moved.version + 1
        assert closed.metadata == moved.metadata.close(9, 100)
        assert await manager.read_ledger_metadata(ledger_id) == closed
        # Nothing to change: nothing written.
        assert await manager.update(ledger_id, lambda metadata: metadata) == closed
        # The change's own error stops the loop, before any write.
        with pytest.raises(BadRequest, match="refused"):
            await manager.update(ledger_id, refuse)
        assert await manager.read_ledger_metadata(ledger_id) == closed


def refuse(metadata: LedgerMetadata) -> LedgerMetadata:
    raise BadRequest("refused")


async def test_update_gives_up_when_every_attempt_meets_another_writer(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        manager = LedgerManager(store)
        (record,) = await new_ledgers(store, 1)
        other = LedgerManager(store)
        writes = 0

        async def meddle() -> None:
            nonlocal writes
            current = await other.read_ledger_metadata(record.ledger_id)
            await other.write_ledger_metadata(
                record.ledger_id,
                current.metadata.with_custom_metadata({"n": str(writes).encode()}),
                current.version,
            )
            writes += 1

        original_read = manager.read_ledger_metadata

        async def read_then_meddle(ledger_id: LedgerId) -> LedgerRecord:
            found = await original_read(ledger_id)
            await meddle()  # another writer gets in between every read and its CAS
            return found

        manager.read_ledger_metadata = read_then_meddle  # type: ignore[method-assign]
        with pytest.raises(MetadataVersionConflict, match="kept changing over 3 attempts"):
            await manager.update(record.ledger_id, lambda m: m.close(0, 1), attempts=3)
        assert writes == 3


async def test_creates_racing_deletes_that_prune_their_parents_all_succeed(
    backend: Backend,
) -> None:
    async with backend.open() as a, backend.open() as b:
        await init_cluster(a)
        deleter, creator = LedgerManager(a), LedgerManager(b)
        for round_number in range(15):
            old, new = LedgerId(9, 2 * round_number), LedgerId(9, 2 * round_number + 1)
            await deleter.create_ledger_metadata(old, sample_metadata())
            await asyncio.gather(
                delete_now(deleter, old),
                creator.create_ledger_metadata(new, sample_metadata()),
            )
            await creator.read_ledger_metadata(new)
            await delete_now(creator, new)
        assert await a.children(LEDGERS + SCOPED_SUFFIX) == []


async def test_a_retried_create_is_recognised_by_its_creator_token(backend: Backend) -> None:
    async with backend.open() as store, backend.open() as other:
        await init_cluster(store)
        mine, theirs = LedgerManager(store), LedgerManager(other)
        ledger_id = await mine.generate_ledger_id()
        metadata = sample_metadata(token=b"creator-1")
        first = await mine.create_ledger_metadata(ledger_id, metadata)
        again = await theirs.create_ledger_metadata(ledger_id, sample_metadata(token=b"creator-1"))
        assert again == first
        with pytest.raises(LedgerExists, match=f"ledger {ledger_id}"):
            await theirs.create_ledger_metadata(ledger_id, sample_metadata(token=b"creator-2"))
        tokenless = await mine.generate_ledger_id()
        await mine.create_ledger_metadata(tokenless, sample_metadata(token=b""))
        with pytest.raises(LedgerExists):
            await mine.create_ledger_metadata(tokenless, sample_metadata(token=b""))


async def test_corrupt_metadata_is_an_error_naming_the_ledger(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        records = await new_ledgers(store, 3)
        broken = records[1].ledger_id
        await store.set(LEDGER_METADATA.path(broken), b"\x00garbage, not metadata")
        manager = LedgerManager(store)
        with pytest.raises(MalformedData, match=f"ledger {broken} metadata"):
            await manager.read_ledger_metadata(broken)
        pages = [page async for page in manager.ledger_pages()]
        assert [r.ledger_id for p in pages for r in p.ledgers] == [
            records[0].ledger_id,
            records[2].ledger_id,
        ]
        (unreadable,) = [u for p in pages for u in p.unreadable]
        assert unreadable.ledger_id == broken
        assert unreadable.path == LEDGER_METADATA.path(broken)
        assert f"ledger {broken}" in str(unreadable.error)


# -- every ledger ------------------------------------------------------------------------


async def test_iteration_visits_every_ledger_in_id_order_page_by_page(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        manager = LedgerManager(store)
        ids = [LedgerId.classic(i) for i in (9_998, 9_999, 10_000, 10_001, 3, 2**64 - 1)]
        ids += [LedgerId(1, 5), LedgerId(1, 70_000), LedgerId.from_uuid(), LedgerId.from_uuid()]
        for ledger_id in ids:
            await manager.create_ledger_metadata(ledger_id, sample_metadata())
        stray = "/ledgers/0000/0000/0000/0000/not-a-ledger"
        await store.create(stray)
        pages = [page async for page in manager.ledger_pages(page_size=3)]
        assert all(len(page.ledgers) <= 3 for page in pages)
        assert [r.ledger_id for p in pages for r in p.ledgers] == sorted(ids)
        assert [u.path for p in pages for u in p.unreadable] == [stray]
        read_back = {r.ledger_id: r for p in pages for r in p.ledgers}
        for ledger_id in ids:
            assert read_back[ledger_id] == await manager.read_ledger_metadata(ledger_id)
        with pytest.raises(BadRequest, match="page size"):
            [page async for page in manager.ledger_pages(page_size=0)]


@pytest.mark.parametrize("wanted", [1, 4, 40])
async def test_subtrees_split_the_ids_of_every_tree_once(backend: Backend, wanted: int) -> None:
    """The ranges a Spark snapshot exports in parallel: every key of the metadata and of the
    tombstones in exactly one of them, an id only the tombstones use included."""
    async with backend.open() as store:
        await init_cluster(store)
        manager = LedgerManager(store)
        ids = [LedgerId.classic(i) for i in (1, 2, 9_999, 10_000, 2**33, 2**64 - 1)]
        ids += [LedgerId(1, 5), LedgerId(7, 70_000), LedgerId.from_uuid()]
        for ledger_id in ids:
            await manager.create_ledger_metadata(ledger_id, sample_metadata())
        gone = [LedgerId.classic(2**50 + 3), LedgerId(9, 1)]  # tombstones only
        for ledger_id in (*gone, ids[1]):
            await store.create(TOMBSTONE_RECORDS.path(ledger_id), b"x", make_parents=True)
        stray = "/ledgers/0000/not-a-ledger"
        await store.create(stray)

        trees = (LEDGER_METADATA, TOMBSTONE_RECORDS)
        parts, strays = await split(store, trees, wanted)
        assert len(parts) >= min(wanted, 4), parts
        met = [path for _, path in strays]  # met splitting, or else walking a part
        for tree, expected in ((LEDGER_METADATA, ids), (TOMBSTONE_RECORDS, [*gone, ids[1]])):
            found = []
            for part in parts:
                async for page in walk(store, tree, within=part):
                    found += [ledger_id for ledger_id, _, _ in page.ledgers]
                    met += page.strays
            assert sorted(found) == sorted(expected), tree
        assert met == [stray]


async def test_ids_allocated_counts_the_ids_handed_out_in_every_bucket(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        manager = LedgerManager(store)
        assert await manager.ids_allocated() == 0
        for _ in range(5):
            await manager.generate_ledger_id()
        await manager.generate_ledger_id(scoped=True)  # not of the sequence
        assert await manager.ids_allocated() == 5
        await manager.skip_ids_through(10**10)  # a metadata recovery's ledgers put back
        await manager.generate_ledger_id()
        assert await manager.ids_allocated() == 6


async def test_iterating_an_empty_cluster_gives_nothing(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        assert [page async for page in LedgerManager(store).ledger_pages()] == []


# -- watches -----------------------------------------------------------------------------


async def test_a_ledger_watch_gives_each_version_then_none_once_deleted(backend: Backend) -> None:
    async with backend.open() as store, backend.open() as writer:
        await init_cluster(store)
        ledger_id = LedgerId.classic(42)
        seen: Collected[LedgerRecord | None] = Collected()
        watcher = await LedgerManager(store).watch_ledger_metadata(ledger_id, seen)
        assert seen.values == [None]
        manager = LedgerManager(writer)
        metadata = sample_metadata()
        await manager.create_ledger_metadata(ledger_id, metadata)
        await seen.wait_for(2)
        closed = metadata.close(9, 100)
        await manager.write_ledger_metadata(ledger_id, closed, 0)
        await seen.wait_for(3)
        deleted = closed.deleted(Deletion(1, "deleted by a test"))
        await delete_now(manager, ledger_id)
        await seen.wait_for(4)
        if seen.values[-1] is not None:
            await seen.wait_for(5)
        assert seen.values[:3] == [
            None,
            LedgerRecord(ledger_id, metadata, 0),
            LedgerRecord(ledger_id, closed, 1),
        ]
        # The DELETED version may be replaced by the tombstone before the watch reads it.
        assert seen.values[-1] is None
        assert all(value == LedgerRecord(ledger_id, deleted, 2) for value in seen.values[3:-1])
        given = len(seen.values)
        watcher.cancel()
        await manager.create_ledger_metadata(ledger_id, metadata)
        # A watch made after it, of another ledger, sees its creation: the cancelled one
        # would have been told of this one's by then.
        witness: Collected[LedgerRecord | None] = Collected()
        other = LedgerId.classic(43)
        await LedgerManager(store).watch_ledger_metadata(other, witness)
        await manager.create_ledger_metadata(other, metadata)
        await witness.wait_for(2)
        assert len(seen.values) == given
