"""The under-replication manager on every backend: marks, locks, and the auditor's settings."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from tally.core.errors import BadRequest, MalformedData, SessionExpired
from tally.core.ids import LedgerId
from tally.metadata.cluster import init_cluster
from tally.metadata.paths import (
    AUDIT_REQUEST,
    LOST_BOOKIE_RECOVERY_DELAY,
    LOST_ENTRY_RECORDS,
    UNDER_REPLICATION_MARKS,
    UNDERREPLICATED_LEDGERS,
    lock_path,
)
from tally.metadata.store import MetadataStore
from tally.metadata.underreplication import (
    AuditorCheck,
    LostEntries,
    UnderReplicatedLedger,
    UnderReplicationManager,
)
from tests.metadata.conftest import Backend
from tests.metadata.service_support import Collected, start_service_worker
from tests.support.polling import until

L1, L2, L3 = LedgerId.classic(1), LedgerId.classic(20_000), LedgerId(7, 3)


async def test_a_re_mark_merges_its_bookies_and_keeps_the_first_time(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        manager = UnderReplicationManager(store)
        first = await manager.mark_under_replicated(L1, ["b1"], now_ms=100)
        assert first == UnderReplicatedLedger(L1, frozenset({"b1"}), 100, 0)
        merged = await manager.mark_under_replicated(L1, {"b2", "b1"}, now_ms=200)
        assert merged == UnderReplicatedLedger(L1, frozenset({"b1", "b2"}), 100, 1)
        assert await manager.mark_under_replicated(L1, ["b2"], now_ms=300) == merged
        assert await manager.under_replicated(L1) == merged
        assert await manager.under_replicated(L2) is None
        with pytest.raises(BadRequest, match="not one str"):
            await manager.mark_under_replicated(L1, "b3")
        with pytest.raises(BadRequest, match="non-empty str"):
            await manager.mark_under_replicated(L1, [""])


async def test_bad_copies_merge_into_the_mark_and_survive_a_round_trip(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        manager = UnderReplicationManager(store)
        plain = await manager.mark_under_replicated(L1, ["b1"], now_ms=100)
        assert plain.bad_copies == {}
        one = await manager.mark_under_replicated(L1, ["b1"], bad_copies={"b1": [4, 5, 9]})
        assert one.version == 1
        assert {b: list(e) for b, e in one.bad_copies.items()} == {"b1": [4, 5, 9]}
        both = await manager.mark_under_replicated(L1, ["b2"], bad_copies={"b1": [5, 6], "b2": [1]})
        assert both.missing_bookies == {"b1", "b2"}
        assert {b: list(e) for b, e in both.bad_copies.items()} == {
            "b1": [4, 5, 6, 9],
            "b2": [1],
        }
        assert await manager.under_replicated(L1) == both
        again = await manager.mark_under_replicated(L1, ["b1"], bad_copies={"b1": [4]})
        assert again == both  # nothing new: no write
        with pytest.raises(BadRequest, match="non-empty str"):
            await manager.mark_under_replicated(L1, ["b1"], bad_copies={"": [1]})


async def test_concurrent_re_marks_from_several_sessions_lose_no_bookie(backend: Backend) -> None:
    async with backend.open() as a, backend.open() as b:
        await init_cluster(a)
        managers = [UnderReplicationManager(a), UnderReplicationManager(b)]
        bookies = [f"b{i}" for i in range(12)]
        await asyncio.gather(
            *(
                managers[i % 2].mark_under_replicated(L3, [bookie])
                for i, bookie in enumerate(bookies)
            )
        )
        mark = await managers[0].under_replicated(L3)
        assert mark is not None
        assert mark.missing_bookies == frozenset(bookies)


async def test_listing_filters_and_skips_unreadable_marks(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        manager = UnderReplicationManager(store)
        await manager.mark_under_replicated(L3, ["b1"], now_ms=300)
        await manager.mark_under_replicated(L2, ["b2"], now_ms=200)
        await manager.mark_under_replicated(L1, ["b1", "b2"], now_ms=100)
        broken = LedgerId.classic(5)
        await manager.mark_under_replicated(broken, ["b1"], now_ms=1)
        await store.set(UNDER_REPLICATION_MARKS.path(broken), b"{}")

        async def listed(**filters: object) -> list[LedgerId]:
            marks = manager.list_under_replicated(page_size=2, **filters)  # type: ignore[arg-type]
            return [mark.ledger_id async for mark in marks]

        with caplog.at_level(logging.ERROR):
            assert await listed() == [L1, L2, L3]
        assert f"ledger {broken}" in caplog.text
        assert await listed(missing_bookie="b1") == [L1, L3]
        assert await listed(missing_bookie="b9") == []
        assert await listed(marked_before_ms=300) == [L1, L2]
        assert await listed(missing_bookie="b2", marked_before_ms=150) == [L1]


async def test_a_replicated_ledger_loses_its_mark_lock_and_emptied_parents(
    backend: Backend,
) -> None:
    async with backend.open() as worker, backend.open() as other:
        await init_cluster(worker)
        mine, theirs = UnderReplicationManager(worker), UnderReplicationManager(other)
        assert await mine.acquire(L2) is None, "an unmarked ledger cannot be locked"
        assert await worker.exists(lock_path(L2)) is None
        await mine.mark_under_replicated(L2, ["b1"])
        lock = await mine.acquire(L2)
        assert lock is not None
        assert (lock.ledger_id, lock.mark.missing_bookies) == (L2, frozenset({"b1"}))
        assert await theirs.acquire(L2) is None
        assert await mine.acquire(L2) is None, "the lock is not re-entrant"
        assert await mine.mark_replicated(lock)
        assert await mine.under_replicated(L2) is None
        assert await worker.exists(lock_path(L2)) is None
        assert await worker.children(UNDERREPLICATED_LEDGERS) == []


async def test_a_re_mark_during_the_copy_is_never_lost(backend: Backend) -> None:
    async with backend.open() as worker, backend.open() as auditor:
        await init_cluster(worker)
        mine, marks = UnderReplicationManager(worker), UnderReplicationManager(auditor)
        await marks.mark_under_replicated(L1, ["b1"])
        lock = await mine.acquire(L1)
        assert lock is not None
        await marks.mark_under_replicated(L1, ["b2"])  # another bookie lost mid-copy
        assert not await mine.mark_replicated(lock)
        kept = await marks.under_replicated(L1)
        assert kept is not None
        assert kept.missing_bookies == frozenset({"b1", "b2"})
        again = await marks.acquire(L1)
        assert again is not None, "the lock was released for the next round"
        assert again.mark == kept
        assert await marks.mark_replicated(again)
        assert await marks.under_replicated(L1) is None


async def test_release_leaves_the_mark_for_another_worker(backend: Backend) -> None:
    async with backend.open() as a, backend.open() as b:
        await init_cluster(a)
        first, second = UnderReplicationManager(a), UnderReplicationManager(b)
        await first.mark_under_replicated(L1, ["b1"])
        lock = await first.acquire(L1)
        assert lock is not None
        with pytest.raises(BadRequest, match="taken on session"):
            await second.release(lock)
        with pytest.raises(BadRequest, match="taken on session"):
            await second.mark_replicated(lock)
        assert await second.acquire(L1) is None
        await first.release(lock)
        assert await second.acquire(L1) is not None


async def test_a_worker_whose_session_dies_loses_its_lock(backend: Backend) -> None:
    async with backend.open() as dying, backend.open() as other:
        await init_cluster(other)
        survivor = UnderReplicationManager(other)
        await survivor.mark_under_replicated(L1, ["b1"])
        lock = await UnderReplicationManager(dying).acquire(L1)
        assert lock is not None
        await dying.expire_session()
        taken = await survivor.acquire(L1)
        assert taken is not None
        with pytest.raises(SessionExpired, match=f"ledger {L1}"):
            await UnderReplicationManager(dying).mark_replicated(lock)
        assert await survivor.under_replicated(L1) is not None


async def test_a_killed_worker_process_drops_its_lock(shared_backend: Backend) -> None:
    async with shared_backend.open() as store:
        await init_cluster(store)
        manager = UnderReplicationManager(store)
        await manager.mark_under_replicated(L3, ["b1"])
        worker = await start_service_worker(shared_backend.uri, 1.0)
        try:
            assert await worker.ask("lock", L3.qualified_name) == ["locked"]
            assert await manager.acquire(L3) is None
            await worker.kill()
        finally:
            await worker.stop()

        async def free() -> bool:
            return await store.exists(lock_path(L3)) is None

        await until(free, timeout=8)
        assert await manager.acquire(L3) is not None


class _CreateInFlight:
    """A store's create already sent when its caller is cancelled: it lands at the store
    once `land` is set, whatever happened to the caller."""

    def __init__(self, store: MetadataStore) -> None:
        self.sent, self.land = asyncio.Event(), asyncio.Event()
        self.landings: list[asyncio.Future[object]] = []
        self._create = store.create

    async def create(self, *args: Any, **kwargs: Any) -> object:
        async def at_the_store() -> object:
            await self.land.wait()
            return await self._create(*args, **kwargs)

        self.landings.append(asyncio.ensure_future(at_the_store()))
        self.sent.set()
        return await asyncio.shield(self.landings[-1])


async def _take(manager: UnderReplicationManager, taker: str) -> None:
    if taker == "acquire":
        await manager.acquire(L1)
    else:
        async with manager.held_unmarked(L1):
            pass


@pytest.mark.parametrize("cancels", [1, 2])
@pytest.mark.parametrize("taker", ["acquire", "held_unmarked"])
async def test_a_lock_whose_taker_is_cancelled_while_creating_it_is_given_back(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, taker: str, cancels: int
) -> None:
    """The create is already sent when its taker is cancelled (once, or again while it
    gives the lock back, as a pass cancelled twice cancels its turns), and lands after: the
    lock is deleted once it has, not left to keep the ledger from every worker."""
    async with backend.open() as store:
        await init_cluster(store)
        manager = UnderReplicationManager(store)
        await manager.mark_under_replicated(L1, ["b1"])
        in_flight = _CreateInFlight(store)
        monkeypatch.setattr(store, "create", in_flight.create)
        task = asyncio.create_task(_take(manager, taker))
        await in_flight.sent.wait()
        task.cancel()
        await asyncio.sleep(0)  # the taker is giving the lock back, waiting for the create
        if cancels == 2:
            task.cancel()
            await asyncio.sleep(0)
        in_flight.land.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.gather(*in_flight.landings)
        monkeypatch.undo()
        assert await store.exists(lock_path(L1)) is None
        assert await manager.acquire(L1) is not None


async def test_a_cancelled_taker_leaves_another_worker_s_lock_alone(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with backend.open() as a, backend.open() as b:
        await init_cluster(a)
        holder, taker = UnderReplicationManager(a), UnderReplicationManager(b)
        await holder.mark_under_replicated(L1, ["b1"])
        held = await holder.acquire(L1)
        assert held is not None
        in_flight = _CreateInFlight(b)
        monkeypatch.setattr(b, "create", in_flight.create)
        task = asyncio.create_task(taker.acquire(L1))
        await in_flight.sent.wait()
        task.cancel()
        in_flight.land.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.gather(*in_flight.landings, return_exceptions=True)
        stat = await a.exists(lock_path(L1))
        assert stat is not None
        assert stat.ephemeral_owner == a.session_id
        await holder.release(held)


async def test_an_unreadable_mark_is_refused_by_acquire_and_replaced_by_a_re_mark(
    backend: Backend,
) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        manager = UnderReplicationManager(store)
        await manager.mark_under_replicated(L1, ["b1"])
        await store.set(UNDER_REPLICATION_MARKS.path(L1), b"garbage")
        with pytest.raises(MalformedData, match=f"ledger {L1}"):
            await manager.acquire(L1)
        assert await store.exists(lock_path(L1)) is None
        remarked = await manager.mark_under_replicated(L1, ["b2"], now_ms=7)
        assert (remarked.missing_bookies, remarked.first_marked_ms) == (frozenset({"b2"}), 7)
        assert await manager.under_replicated(L1) == remarked


async def test_the_replication_switch_and_its_watch(backend: Backend) -> None:
    async with backend.open() as store, backend.open() as admin:
        await init_cluster(store)
        seen: Collected[bool] = Collected()
        watcher = await UnderReplicationManager(store).watch_replication_enabled(seen)
        operator = UnderReplicationManager(admin)
        assert await operator.is_replication_enabled()
        await operator.disable_replication()
        await operator.disable_replication()
        assert not await operator.is_replication_enabled()
        assert await seen.wait_for(2) == [True, False]
        await operator.enable_replication()
        assert await seen.wait_for(3) == [True, False, True]
        watcher.cancel()


async def test_lost_bookie_recovery_delay_and_its_watch(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    async with backend.open() as store, backend.open() as admin:
        await init_cluster(store)
        seen: Collected[int | None] = Collected()
        await UnderReplicationManager(store).watch_lost_bookie_recovery_delay(seen)
        operator = UnderReplicationManager(admin)
        assert await operator.lost_bookie_recovery_delay() is None
        await operator.set_lost_bookie_recovery_delay(30)
        assert await operator.lost_bookie_recovery_delay() == 30
        assert await seen.wait_for(2) == [None, 30]
        witness: Collected[int | None] = Collected()
        await UnderReplicationManager(store).watch_audit_requests(witness)
        with caplog.at_level(logging.ERROR):
            await admin.set(LOST_BOOKIE_RECOVERY_DELAY, b"thirty")
            await operator.request_audit(now_ms=1)  # seen after the bad value's read
            await witness.wait_for(2)
            assert len(seen.values) == 2
        assert "lost_bookie_recovery_delay" in caplog.text
        await operator.set_lost_bookie_recovery_delay(0)
        assert await seen.wait_for(3) == [None, 30, 0]
        for bad in (-1, 1.5, True):
            with pytest.raises(BadRequest):
                await operator.set_lost_bookie_recovery_delay(bad)  # type: ignore[arg-type]


async def test_a_mark_made_or_changed_reaches_a_watcher_and_an_unchanged_one_does_not(
    backend: Backend,
) -> None:
    async with backend.open() as store, backend.open() as admin:
        await init_cluster(store)
        seen: Collected[int | None] = Collected()
        watcher = await UnderReplicationManager(store).watch_marks(seen)
        marking = UnderReplicationManager(admin)
        await marking.mark_under_replicated(LedgerId(0, 7), ["a:1"], now_ms=10)
        assert await seen.wait_for(2) == [None, 10]
        await marking.mark_under_replicated(LedgerId(0, 7), ["a:1"], now_ms=20)  # no change
        await marking.mark_under_replicated(LedgerId(0, 8), ["b:1"], now_ms=30)
        assert await seen.wait_for(3) == [None, 10, 30]
        await marking.mark_under_replicated(LedgerId(0, 7), [], bad_copies={"c:1": [4]}, now_ms=40)
        assert await seen.wait_for(4) == [None, 10, 30, 40]
        watcher.cancel()


async def test_last_run_times_of_the_auditor_s_checks(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        manager = UnderReplicationManager(store)
        assert await manager.check_time(AuditorCheck.REPLICAS) is None
        await manager.set_check_time(AuditorCheck.REPLICAS, 1_000)
        await manager.set_check_time(AuditorCheck.PLACEMENT_POLICY, 2_000)
        await manager.set_check_time(AuditorCheck.REPLICAS, 3_000)
        assert await manager.check_time(AuditorCheck.REPLICAS) == 3_000
        assert await manager.check_time(AuditorCheck.PLACEMENT_POLICY) == 2_000
        assert await manager.check_time(AuditorCheck.CHECK_ALL_LEDGERS) is None
        with pytest.raises(BadRequest):
            await manager.set_check_time(AuditorCheck.REPLICAS, -5)


async def test_audit_requests_reach_a_watcher_in_order(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    async with backend.open() as store, backend.open() as admin:
        await init_cluster(store)
        seen: Collected[int | None] = Collected()
        watcher = await UnderReplicationManager(store).watch_audit_requests(seen)
        operator = UnderReplicationManager(admin)
        assert await operator.request_audit(now_ms=5) == 5
        assert await seen.wait_for(2) == [None, 5]
        witness: Collected[int | None] = Collected()
        await UnderReplicationManager(store).watch_lost_bookie_recovery_delay(witness)
        with caplog.at_level(logging.ERROR):
            await admin.set(AUDIT_REQUEST, b"now please")
            await operator.set_lost_bookie_recovery_delay(7)  # seen after the bad value's read
            await witness.wait_for(2)
            assert len(seen.values) == 2
        assert "audit_request" in caplog.text
        await operator.request_audit(now_ms=9)
        assert await seen.wait_for(3) == [None, 5, 9]
        watcher.cancel()


async def test_the_lost_entries_list(backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        manager = UnderReplicationManager(store)
        assert await manager.lost_entries(L1) is None
        first = await manager.record_lost_entries(
            L3, [(7, 9), (0, 2)], "no copy of 0-2, 7-9", mark_version=4, now_ms=10
        )
        assert first == LostEntries(L3, ((0, 2), (7, 9)), "no copy of 0-2, 7-9", 10, 4)
        again = await manager.record_lost_entries(L3, [(0, 0)], "only 0 now", mark_version=5)
        assert (await manager.lost_entries(L3)) == again
        await manager.record_lost_entries(L1, [(3, 3)], "entry 3", mark_version=0, now_ms=1)
        assert [lost.ledger_id for lost in [x async for x in manager.list_lost_entries()]] == [
            L1,
            L3,
        ]
        for bad in ([], [(3, 2)], [(-1, 0)]):
            with pytest.raises(BadRequest):
                await manager.record_lost_entries(L2, bad, "bad", mark_version=0)
        await store.create(LOST_ENTRY_RECORDS.path(L2), b"{}", make_parents=True)
        with caplog.at_level(logging.ERROR):
            listed = [lost.ledger_id async for lost in manager.list_lost_entries()]
        assert listed == [L1, L3]
        assert "unreadable lost-entries record" in caplog.text
        with pytest.raises(MalformedData):
            await manager.lost_entries(L2)
        assert await manager.clear_lost_entries(L3)
        assert not await manager.clear_lost_entries(L3)
        assert await manager.lost_entries(L3) is None
