"""The auditor: election and takeover with the checks' cadence, lost bookies and their delay,
audit requests, the bookie, ledger and placement checks.

Most tests run in-process on a memory store, with bookies that only register (a bookie is
lost when its store session closes) and ledger metadata written directly; the ledger check
and a killed bookie run against real bookie processes. A fake clock drives the scheduler:
its sleep returns at once, so days of intervals pass in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from tally.autorecovery.auditor import Auditor
from tally.autorecovery.config import AutoRecoveryConfig
from tally.bookie.ledger_storage import LedgerStorage
from tally.client.client import Client
from tally.client.config import ClientConfig
from tally.core.digest import DigestType
from tally.core.errors import TallyError
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import Deletion, LedgerMetadata
from tally.core.schedule import write_set
from tally.metadata.auditor_election import who_is_auditor
from tally.metadata.bookie_registry import BookieInfo, BookiePlacement, BookieRegistry
from tally.metadata.cluster import init_cluster
from tally.metadata.cookies import Cookie, CookieManager
from tally.metadata.incarnations import RememberedIncarnations
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.paths import AUDITOR, incarnation_path
from tally.metadata.store import MetadataStore
from tally.metadata.stores import open_store
from tally.metadata.underreplication import AuditorCheck, UnderReplicationManager
from tests.support.cluster import Cluster, eventually_writable, running_cluster
from tests.support.polling import until

B1, B2, B3, B4 = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"
"""Registered by the tests, never listening: a read from them is refused at once."""
HOUR = 3600.0
WAIT = 10.0
_names = itertools.count()


class FakeClock:
    """Unix seconds that move only when told; its sleep yields and returns at once, and is
    counted: each is a loop of the auditor that looked at the time and waits."""

    def __init__(self) -> None:
        self.now = time.time()
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        await asyncio.sleep(0.01)

    async def turns(self, count: int = 10) -> None:
        """Until the auditor's loops have waited `count` more times on this clock: they
        have looked at the time (and anything due) since the test last moved it."""
        target = self.sleeps + count
        await until(lambda: self.sleeps >= target, f"{count} more waits on the fake clock")


def config(**settings: object) -> AutoRecoveryConfig:
    """Every check off and no delay, unless the test says otherwise."""
    base: dict[str, object] = {
        "auditor_periodic_bookie_check_interval": 0.0,
        "auditor_periodic_check_interval": 0.0,
        "auditor_periodic_placement_policy_check_interval": 0.0,
        "auditor_replicas_check_interval": 0.0,
    }
    return AutoRecoveryConfig(**{**base, **settings})  # type: ignore[arg-type]


def incarnations_changed() -> float:
    return REGISTRY.get_sample_value("auditor_bookie_incarnations_changed_total") or 0.0


def marks_counter(cause: str) -> float:
    value = REGISTRY.get_sample_value(
        "auditor_num_under_replicated_ledgers_marked_total", {"cause": cause}
    )
    return value or 0.0


# -- an in-process cluster: a memory store, registered bookies, written metadata -------------


@dataclasses.dataclass
class Harness:
    uri: str
    store: MetadataStore
    clock: FakeClock
    bookie_stores: dict[str, MetadataStore] = dataclasses.field(default_factory=dict)

    @property
    def ledgers(self) -> LedgerManager:
        return LedgerManager(self.store)

    @property
    def marks(self) -> UnderReplicationManager:
        return UnderReplicationManager(self.store)

    async def up(self, *bookies: str) -> None:
        for bookie in bookies:
            store = open_store(self.uri)
            await store.start()
            info = BookieInfo(bookie, None, "test", 0)
            await BookieRegistry(store).register(bookie, info)
            self.bookie_stores[bookie] = store

    async def down(self, *bookies: str) -> None:
        """The bookies' sessions end: their registrations go at once."""
        for bookie in bookies:
            await self.bookie_stores.pop(bookie).close()

    async def ledger(
        self,
        ensemble: tuple[str, ...],
        *,
        write_quorum: int = 2,
        last: int | None = 9,
        deleted: bool = False,
    ) -> LedgerId:
        """A ledger on `ensemble`, closed at `last` (None: left open), then DELETED if asked."""
        ledger_id = await self.ledgers.generate_ledger_id()
        metadata = LedgerMetadata.create(
            ensemble=ensemble,
            write_quorum=write_quorum,
            ack_quorum=1,
            digest_type=DigestType.CRC32C,
            password=b"",
            ctime_ms=0,
            creator_token=b"",
        )
        if last is not None:
            metadata = metadata.close(last, 10 * (last + 1))
        if deleted:
            metadata = metadata.deleted(Deletion(1, "deleted by the test"))
        await self.ledgers.create_ledger_metadata(ledger_id, metadata)
        return ledger_id

    async def format(self, *bookies: str) -> dict[str, str]:
        """Give each bookie a new cookie, as its format does (after an operator deleted the
        old one); the new incarnation ids."""
        cookies = CookieManager(self.store)
        for bookie in bookies:
            if await cookies.get(bookie) is not None:
                await cookies.delete(bookie)
            await cookies.put(Cookie.new(bookie, ["/data"], "instance"), None)
        return {bookie: (await cookies.incarnations())[bookie] for bookie in bookies}

    async def remembered(self) -> dict[str, str | None]:
        found = await RememberedIncarnations(self.store).all()
        return {bookie: record.incarnation_id for bookie, record in found.items()}

    async def marked(self) -> dict[LedgerId, frozenset[str]]:
        return {
            mark.ledger_id: mark.missing_bookies
            async for mark in self.marks.list_under_replicated()
        }

    @contextlib.asynccontextmanager
    async def auditor(
        self,
        settings: AutoRecoveryConfig,
        candidate: str = "auditor-1",
        *,
        placement: str = "default",
        replicas_check: Callable[[], Awaitable[object]] | None = None,
    ) -> AsyncIterator[tuple[Auditor, asyncio.Task[None], Client]]:
        async with Client(self.uri, config=ClientConfig(placement=placement)) as client:
            auditor = Auditor(
                client.context,
                settings,
                candidate,
                replicas_check=replicas_check,
                clock=self.clock,
                sleep=self.clock.sleep,
            )
            task = asyncio.create_task(auditor.run())
            try:
                yield auditor, task, client
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


@contextlib.asynccontextmanager
async def harness() -> AsyncIterator[Harness]:
    uri = f"memory://auditor-test-{next(_names)}"
    store = open_store(uri)
    await store.start()
    await init_cluster(store)
    state = Harness(uri, store, FakeClock())
    try:
        yield state
    finally:
        for bookie_store in state.bookie_stores.values():
            await bookie_store.close()
        await store.close()


def lost_state(auditor: Auditor) -> dict[str, str]:
    return {b["bookie_id"]: b["state"] for b in auditor.status()["lost_bookies"]}


def last_runs(auditor: Auditor) -> dict[str, int | None]:
    return {name: check["last_run_ms"] for name, check in auditor.status()["checks"].items()}


class FakeReplicasCheck:
    """Counts its runs; blocks while `gate` is clear; sees its cancellation."""

    def __init__(self) -> None:
        self.runs = 0
        self.cancelled = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self) -> object:
        self.runs += 1
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return SimpleNamespace(counts={"no_replica": 0}, findings=(1, 2))


# -- pure helpers ----------------------------------------------------------------------------


# -- election --------------------------------------------------------------------------------


async def test_one_candidate_audits_and_a_successor_keeps_the_cadence() -> None:
    settings = config(
        auditor_periodic_bookie_check_interval=HOUR,
        auditor_periodic_check_interval=HOUR,
        auditor_periodic_placement_policy_check_interval=HOUR,
        auditor_replicas_check_interval=HOUR,
    )
    replicas = FakeReplicasCheck()
    async with harness() as h:
        await h.up(B1, B2)
        async with h.auditor(settings, "first", replicas_check=replicas) as (first, task, _):
            await until(lambda: all(last_runs(first).values()))
            recorded = {check: await h.marks.check_time(check) for check in AuditorCheck}
            assert recorded == {AuditorCheck(k): v for k, v in last_runs(first).items()}
            assert replicas.runs == 1
            assert first.status()["checks"]["replicas_check"]["last_findings"] == 2
            async with h.auditor(settings, "second", replicas_check=replicas) as (second, _, _):

                async def both_voted() -> bool:
                    return len(await h.store.children(AUDITOR)) == 2

                await until(both_voted, "the second candidate's vote")
                await h.clock.turns()
                assert first.status()["elected"]
                assert not second.status()["elected"]
                assert await who_is_auditor(h.store) == "first"

                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await until(lambda: second.status()["elected"])
                assert await who_is_auditor(h.store) == "second"
                await until(lambda: last_runs(second) == last_runs(first))
                await h.clock.turns()
                assert replicas.runs == 1, "the successor keeps the cadence"
                assert {c: await h.marks.check_time(c) for c in AuditorCheck} == recorded

                h.clock.advance(HOUR + 1)
                await until(lambda: replicas.runs == 2)
                await until(
                    lambda: all(
                        run is not None and run > recorded[AuditorCheck(name)]
                        for name, run in last_runs(second).items()
                    )
                )


async def test_losing_the_session_stops_a_running_check_and_run_returns() -> None:
    replicas = FakeReplicasCheck()
    replicas.gate.clear()
    settings = config(auditor_replicas_check_interval=HOUR)
    async with (
        harness() as h,
        h.auditor(settings, "first", replicas_check=replicas) as (first, task, client),
        h.auditor(settings, "second") as (second, _, _),
    ):
        await until(lambda: replicas.runs == 1)
        assert first.status()["checks"]["replicas_check"]["running"]
        await client.context.ledgers.store.expire_session()
        await asyncio.wait_for(task, WAIT)  # returns, does not raise
        assert replicas.cancelled == 1
        assert not first.status()["elected"]
        assert first.status()["checks"]["replicas_check"]["last_run_ms"] is None
        await until(lambda: second.status()["elected"])
        # The cut-short check never ran to its end: the successor runs it (here with
        # the online replicas check, which finds nothing on an empty cluster).
        await until(lambda: second.status()["checks"]["replicas_check"]["last_run_ms"])


# -- lost bookies ----------------------------------------------------------------------------


async def test_a_lost_bookie_with_no_delay_has_its_ledgers_marked_at_once() -> None:
    async with harness() as h:
        await h.up(B1, B2, B3)
        on_b2 = {await h.ledger((B1, B2)), await h.ledger((B2, B3), last=None)}
        elsewhere = await h.ledger((B1, B3))
        # B2 is in the empty trailing segment only: it holds none of this ledger's entries.
        ledger_id = await h.ledgers.generate_ledger_id()
        trailing = (
            LedgerMetadata.create(
                ensemble=(B1, B3),
                write_quorum=2,
                ack_quorum=1,
                digest_type=DigestType.CRC32C,
                password=b"",
                ctime_ms=0,
                creator_token=b"",
            )
            .with_ensemble_change(5, (B1, B2))
            .close(4, 50)
        )
        await h.ledgers.create_ledger_metadata(ledger_id, trailing)
        before = marks_counter("lost_bookie")
        async with h.auditor(config()) as (auditor, _, _):
            await until(lambda: auditor.status()["elected"])
            await h.down(B2)
            await until(lambda: lost_state(auditor) == {B2: "marked"})
            assert await h.marked() == dict.fromkeys(on_b2, frozenset({B2}))
            assert elsewhere not in await h.marked()
            (lost,) = auditor.status()["lost_bookies"]
            assert lost["ledgers_marked"] == 2
            assert lost["deadline_ms"] == lost["since_ms"]
            assert marks_counter("lost_bookie") - before == 2
            mark = await h.marks.under_replicated(next(iter(on_b2)))
            assert mark is not None
            assert mark.first_marked_ms == int(h.clock() * 1000)


async def test_a_bookie_back_within_the_delay_costs_no_mark_and_one_that_stays_does() -> None:
    async with harness() as h:
        await h.up(B1, B2, B3)
        ledger_id = await h.ledger((B1, B2))
        async with h.auditor(config(lost_bookie_recovery_delay=600)) as (auditor, _, _):
            await until(lambda: auditor.status()["elected"])
            await h.down(B2)
            await until(lambda: lost_state(auditor) == {B2: "pending"})
            (lost,) = auditor.status()["lost_bookies"]
            assert lost["deadline_ms"] - lost["since_ms"] == 600_000
            h.clock.advance(300)
            await h.up(B2)
            await until(lambda: lost_state(auditor) == {})
            h.clock.advance(600)  # past the old deadline: nothing is pending, nothing is due
            assert await h.marked() == {}

            await h.down(B2)
            await until(lambda: lost_state(auditor) == {B2: "pending"})
            h.clock.advance(599)
            await h.clock.turns()
            assert await h.marked() == {}
            h.clock.advance(2)
            await until(lambda: lost_state(auditor) == {B2: "marked"})
            assert await h.marked() == {ledger_id: frozenset({B2})}


async def test_two_bookies_lost_together_are_marked_without_waiting() -> None:
    async with harness() as h:
        await h.up(B1, B2, B3)
        both = await h.ledger((B1, B2))
        one = await h.ledger((B2, B3))
        async with h.auditor(config(lost_bookie_recovery_delay=3600)) as (auditor, _, _):
            await until(lambda: auditor.status()["elected"])
            await h.down(B1)
            await until(lambda: lost_state(auditor) == {B1: "pending"})
            await h.down(B2)
            await until(lambda: lost_state(auditor) == {B1: "marked", B2: "marked"})
            assert await h.marked() == {both: frozenset({B1, B2}), one: frozenset({B2})}
            assert all(b["escalated"] for b in auditor.status()["lost_bookies"])


async def test_a_delay_changed_in_the_store_applies_to_pending_bookies() -> None:
    async with harness() as h:
        await h.up(B1, B2)
        ledger_id = await h.ledger((B1, B2))
        async with h.auditor(config(lost_bookie_recovery_delay=60)) as (auditor, _, _):
            await until(lambda: auditor.status()["elected"])
            await h.down(B2)
            await until(lambda: lost_state(auditor) == {B2: "pending"})
            since = auditor.status()["lost_bookies"][0]["since_ms"]

            await h.marks.set_lost_bookie_recovery_delay(7200)
            await until(lambda: auditor.status()["lost_bookie_recovery_delay"] == 7200)
            assert auditor.status()["lost_bookies"][0]["deadline_ms"] == since + 7_200_000
            h.clock.advance(120)
            await h.clock.turns()
            assert await h.marked() == {}, "the store's delay wins over the configured one"

            await h.marks.set_lost_bookie_recovery_delay(100)
            await until(lambda: lost_state(auditor) == {B2: "marked"})
            assert await h.marked() == {ledger_id: frozenset({B2})}


async def test_a_new_auditor_finds_bookies_lost_before_it_was_elected() -> None:
    async with harness() as h:
        await h.up(B1)
        ledger_id = await h.ledger((B1, B2))  # B2 never registered while this auditor ran
        async with h.auditor(config(lost_bookie_recovery_delay=60)) as (auditor, _, _):
            await until(lambda: lost_state(auditor) == {B2: "pending"})
            h.clock.advance(61)
            await until(lambda: lost_state(auditor) == {B2: "marked"})
            assert await h.marked() == {ledger_id: frozenset({B2})}


# -- incarnations ----------------------------------------------------------------------------


async def test_a_bookie_formatted_anew_has_exactly_its_ledgers_marked() -> None:
    async with harness() as h:
        await h.up(B1, B2, B3)
        first = await h.format(B1, B2, B3)
        closed = await h.ledger((B1, B2))
        still_open = await h.ledger((B2, B3), last=None)
        await h.ledger((B1, B3))  # elsewhere
        await h.ledger((B1, B2), deleted=True)  # DELETED: not repaired, so not marked
        await h.ledger((B1, B2), last=-1)  # closed empty: B2 holds nothing of it
        trailing = await h.ledgers.generate_ledger_id()  # B2 only in an empty last segment
        await h.ledgers.create_ledger_metadata(
            trailing,
            LedgerMetadata.create(
                ensemble=(B1, B3),
                write_quorum=2,
                ack_quorum=1,
                digest_type=DigestType.CRC32C,
                password=b"",
                ctime_ms=0,
                creator_token=b"",
            )
            .with_ensemble_change(5, (B1, B2))
            .close(4, 50),
        )
        before, changes = marks_counter("incarnation_changed"), incarnations_changed()
        settings = config(lost_bookie_recovery_delay=3600)
        async with h.auditor(settings) as (auditor, _, _):

            async def remembered_all() -> bool:
                return await h.remembered() == first

            await until(remembered_all, "the first-seen bookies remembered")
            assert await h.marked() == {}, "a bookie seen for the first time marks nothing"

            # B2 stops, its disks are wiped and its cookie deleted; it formats anew and
            # registers again well within lost_bookie_recovery_delay.
            await h.down(B2)
            await until(lambda: lost_state(auditor) == {B2: "pending"})
            again = await h.format(B2)
            await h.up(B2)
            await until(lambda: lost_state(auditor) == {})

            async def remembered_again() -> bool:
                return (await h.remembered())[B2] == again[B2]

            await until(remembered_again, "the new incarnation remembered")
            assert await h.marked() == {closed: {B2}, still_open: {B2}}
            assert marks_counter("incarnation_changed") - before == 2
            assert incarnations_changed() - changes == 1
            assert (await h.remembered())[B1] == first[B1]


async def test_marks_come_before_remembering_so_a_failure_between_marks_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with harness() as h:
        await h.up(B1, B2)
        ledger_id = await h.ledger((B1, B2))
        await h.format(B1, B2)
        memory = RememberedIncarnations(h.store)
        for bookie, incarnation in (await CookieManager(h.store).incarnations()).items():
            await memory.remember(bookie, incarnation, expected_version=None, now_ms=0)
        # The record of B2 does not decode: its past is unknown, which counts as a change.
        await h.store.set(incarnation_path(B2), b"garbage")
        old = await h.remembered()
        assert old[B2] is None
        current = {**await CookieManager(h.store).incarnations(), **await h.format(B1)}

        real_remember = RememberedIncarnations.remember
        failures: list[str] = []

        async def failing(
            self: RememberedIncarnations,
            bookie_id: str,
            incarnation_id: str,
            *,
            expected_version: int | None,
            now_ms: int,
        ) -> None:
            if not failures:
                failures.append(bookie_id)
                raise TallyError("the store went away")
            await real_remember(
                self, bookie_id, incarnation_id, expected_version=expected_version, now_ms=now_ms
            )

        monkeypatch.setattr(RememberedIncarnations, "remember", failing)
        before = marks_counter("incarnation_changed")
        async with h.auditor(config()) as (auditor, _, _):
            await until(lambda: failures, "the failed remember")
            assert await h.marked() == {ledger_id: frozenset({B1, B2})}, "marked first"
            assert await h.remembered() == old, "nothing remembered after the failure"
            h.clock.advance(61)  # past RETRY_DELAY

            async def remembered() -> bool:
                return await h.remembered() == current

            await until(remembered, "remembered on the retry")
            assert marks_counter("incarnation_changed") - before == 2, "marked again"
            assert await h.marked() == {ledger_id: frozenset({B1, B2})}
            assert auditor.status()["elected"]


# -- the periodic checks ---------------------------------------------------------------------


async def test_an_audit_request_runs_every_check_that_has_not_run_since() -> None:
    settings = config(
        auditor_periodic_bookie_check_interval=HOUR,
        auditor_periodic_check_interval=HOUR,
        auditor_periodic_placement_policy_check_interval=HOUR,
        auditor_replicas_check_interval=HOUR,
    )
    replicas = FakeReplicasCheck()
    async with harness() as h, h.auditor(settings, replicas_check=replicas) as (auditor, _, _):
        await until(lambda: all(last_runs(auditor).values()))
        first = last_runs(auditor)
        h.clock.advance(5)
        requested = await h.marks.request_audit(now_ms=int(h.clock() * 1000))
        await until(
            lambda: all(run is not None and run >= requested for run in last_runs(auditor).values())
        )
        assert replicas.runs == 2
        assert all(last_runs(auditor)[name] > run for name, run in first.items() if run)
        assert auditor.status()["audit_requested_ms"] == requested
        await h.clock.turns()
        assert replicas.runs == 2, "a request runs each check once"


async def test_the_bookie_check_marks_again_a_lost_bookie_s_ledgers_and_honours_the_delay() -> None:
    settings = config(lost_bookie_recovery_delay=60, auditor_periodic_bookie_check_interval=HOUR)
    async with harness() as h:
        await h.up(B1, B3)
        ledger_id = await h.ledger((B1, B2))  # B2 never registered
        await h.ledger((B1, B3))
        async with h.auditor(settings) as (auditor, _, _):
            await until(lambda: last_runs(auditor)["bookie_check"])
            assert auditor.status()["checks"]["bookie_check"]["last_findings"] == 1
            assert lost_state(auditor) == {B2: "pending"}
            assert await h.marked() == {}, "the delay is not over"
            h.clock.advance(61)
            await until(lambda: lost_state(auditor) == {B2: "marked"})
            assert await h.marked() == {ledger_id: frozenset({B2})}

            # The mark goes (a worker gave up, an operator removed it): the next bookie
            # check marks the ledger again, as its bookie is still lost.
            lock = await h.marks.acquire(ledger_id)
            assert lock is not None
            assert await h.marks.mark_replicated(lock)
            before = marks_counter("bookie_check")
            h.clock.advance(HOUR)
            await until(lambda: marks_counter("bookie_check") - before == 1)
            assert await h.marked() == {ledger_id: frozenset({B2})}


async def test_the_placement_check_counts_failing_and_soft_ledgers_and_marks_for_repair() -> None:
    settings = config(
        auditor_periodic_placement_policy_check_interval=HOUR,
        repaired_placement_policy_not_adhering_bookie_enable=True,
    )
    async with harness() as h:
        await h.up(B1, B2, B3, B4)
        registry = BookieRegistry(h.store)
        for bookie, rack in ((B1, "/r1"), (B2, "/r1"), (B3, "/r2"), (B4, "/r3")):
            await registry.set_placement(bookie, BookiePlacement(rack, "/zone"))
        failing = await h.ledger((B1, B2))
        await h.ledger((B1, B2, B3), write_quorum=3)  # 2 racks of the 3: meets softly
        await h.ledger((B1, B3))  # strictly
        await h.ledger((B1, B2), last=None)  # open: not judged
        await h.ledger((B1, B2), last=-1)  # closed empty: nothing placed
        async with h.auditor(settings, placement="rack-aware") as (auditor, _, _):
            await until(lambda: last_runs(auditor)["placement_policy_check"])
            assert (
                REGISTRY.get_sample_value("auditor_num_ledgers_not_adhering_to_placement_policy")
                == 1
            )
            assert (
                REGISTRY.get_sample_value("auditor_num_ledgers_softly_adhering_to_placement_policy")
                == 1
            )
            assert auditor.status()["checks"]["placement_policy_check"]["last_findings"] == 2
            assert await h.marked() == {failing: frozenset({B2})}


async def test_the_ledger_check_marks_unreachable_bookies_but_leaves_lost_ones_their_delay() -> (
    None
):
    settings = config(auditor_periodic_check_interval=HOUR, lost_bookie_recovery_delay=3600)
    async with harness() as h:
        await h.up(B1)  # registered, but nothing listens there
        ledger_id = await h.ledger((B1, B3))  # B3 is not registered: lost, with its delay
        await h.ledger((B1, B3), last=-1)  # closed empty: nothing to read
        await h.ledger((B1, B3), deleted=True)  # DELETED: kept for an undelete, not judged
        async with h.auditor(settings) as (auditor, _, _):
            await until(lambda: last_runs(auditor)["check_all_ledgers"])
            assert await h.marked() == {ledger_id: frozenset({B1})}
            assert auditor.status()["checks"]["check_all_ledgers"]["last_findings"] == 1
            assert lost_state(auditor) == {B3: "pending"}


async def test_the_spark_pipeline_s_summary_counts_as_the_check_s_findings() -> None:
    async def spark_mode() -> object:  # what SparkReplicasCheck returns: a summary dict
        return {"counts": {"no_replica": 2, "below_write_quorum": 3}, "marked": 2}

    settings = config(auditor_replicas_check_interval=HOUR)
    async with harness() as h, h.auditor(settings, replicas_check=spark_mode) as (auditor, _, _):
        await until(lambda: last_runs(auditor)["replicas_check"])
        assert auditor.status()["checks"]["replicas_check"]["last_findings"] == 5


async def test_a_failing_check_is_retried_later_and_the_others_go_on() -> None:
    calls: list[float] = []

    async def broken() -> object:
        calls.append(0)
        raise RuntimeError("replicas check blew up")

    settings = config(
        auditor_replicas_check_interval=HOUR, auditor_periodic_bookie_check_interval=HOUR
    )
    async with harness() as h, h.auditor(settings, replicas_check=broken) as (auditor, _, _):
        await until(lambda: calls and last_runs(auditor)["bookie_check"])
        status = auditor.status()["checks"]["replicas_check"]
        assert status["last_run_ms"] is None
        assert "blew up" in status["last_error"]
        assert await h.marks.check_time(AuditorCheck.REPLICAS) is None
        await h.clock.turns()
        assert len(calls) == 1, "not retried at once"
        h.clock.advance(61)
        await until(lambda: len(calls) == 2)


# -- real bookies ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("auditor"), 3) as running:
        yield running


async def _write(client: Client, entries: int) -> tuple[LedgerId, LedgerMetadata]:
    writer = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
    for i in range(entries):
        await writer.append(b"entry %d" % i)
    await writer.close()
    record = await client.context.ledgers.read_ledger_metadata(writer.ledger_id)
    return writer.ledger_id, record.metadata


@contextlib.asynccontextmanager
async def real_auditor(
    uri: str, settings: AutoRecoveryConfig, candidate: str
) -> AsyncIterator[Auditor]:
    """An auditor on its own client of a real cluster, cancelled on the way out."""
    async with Client(uri) as client:
        auditor = Auditor(client.context, settings, candidate)
        task = asyncio.create_task(auditor.run())
        try:
            yield auditor
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _forget(data_dir: Path, ledger_id: LedgerId, entries: list[int]) -> int:
    storage = LedgerStorage(data_dir / "ledgers")
    try:
        return storage.forget_entries(ledger_id, entries)
    finally:
        storage.close()


async def test_the_ledger_check_marks_a_ledger_whose_entry_a_bookie_lost(
    cluster: Cluster,
) -> None:
    async with Client(cluster.uri) as client:
        damaged, metadata = await _write(client, 10)
        healthy, _ = await _write(client, 10)
        victim = metadata.segments[0].ensemble[write_set(9, 3, 2)[0]]
        process = cluster.bookie(victim)
        # In a thread, as every blocking step here: a blocked loop can stall a store's close.
        await asyncio.to_thread(process.stop)
        assert await asyncio.to_thread(_forget, process.data_dir, damaged, [9]) == 1
        await asyncio.to_thread(cluster.restart, [victim])
        await eventually_writable(cluster.uri, {b.address for b in cluster.bookies})

        settings = config(auditor_periodic_check_interval=HOUR, lost_bookie_recovery_delay=3600)
        before = marks_counter("check_all_ledgers")
        async with real_auditor(cluster.uri, settings, "ledger-checker") as auditor:
            await until(lambda: last_runs(auditor)["check_all_ledgers"], timeout=30)
        marks = client.context.under_replication
        mark = await marks.under_replicated(damaged)
        assert mark is not None
        assert mark.missing_bookies == {victim}
        assert await marks.under_replicated(healthy) is None
        assert auditor.status()["checks"]["check_all_ledgers"]["last_findings"] == 1
        assert marks_counter("check_all_ledgers") - before == 1
        failed = REGISTRY.get_sample_value(
            "auditor_ledger_check_failed_reads_total", {"error": "NoSuchEntry"}
        )
        assert failed is not None
        assert failed >= 1


async def test_a_killed_bookie_s_ledgers_are_marked_naming_it(cluster: Cluster) -> None:
    async with Client(cluster.uri) as client:
        ledgers = [await _write(client, 3) for _ in range(3)]
        victim = cluster.bookies[0].address
        holding = {ledger_id for ledger_id, metadata in ledgers if victim in metadata.bookies()}
        assert holding  # E=3 on 3 bookies: every ledger
        async with real_auditor(cluster.uri, config(), "kill-watcher") as auditor:
            await until(lambda: auditor.status()["elected"])
            await asyncio.to_thread(cluster.kill, victim)
            await until(lambda: lost_state(auditor) == {victim: "marked"}, timeout=30)
        marks = client.context.under_replication
        for ledger_id in holding:
            mark = await marks.under_replicated(ledger_id)
            assert mark is not None
            assert victim in mark.missing_bookies
    await asyncio.to_thread(cluster.restart, [victim])
