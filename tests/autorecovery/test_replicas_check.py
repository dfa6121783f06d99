"""The online replicas check against real bookie processes: entries deleted behind a
bookie's back, bookies paused and killed, metadata changed while the check runs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.replicas_check import ReplicasCheckReport, replicas_check
from tally.bookie.ledger_storage import LedgerStorage
from tally.client.bookie_pool import BookiePool
from tally.client.client import Client
from tally.client.config import ClientConfig
from tally.core.availability import EntryAvailability
from tally.core.digest import master_key
from tally.core.errors import BookieUnavailable, LedgerInLimbo, Timeout
from tally.core.ids import LedgerId
from tally.core.ledger_audit import Category, OverReplication, Violation
from tally.core.protocol import LedgerEntries
from tally.core.schedule import write_set
from tally.metadata.ledger_manager import LedgerRecord
from tally.metadata.paths import READONLY, WRITABLE
from tally.metadata.store import MetadataStore
from tests.support.cluster import Cluster, eventually_writable, running_cluster
from tests.support.processes import BookieProcess, environment, init_cluster

PASSWORD = b"replicas-check"
ENTRIES = 12
NOW = 1_900_000_000.0
"""The check's clock in tests that mark ledgers at chosen times (seconds since the epoch)."""
GAUGES = {
    "no_replica": "auditor_num_ledgers_having_no_replica_of_an_entry",
    "below_ack_quorum": "auditor_num_ledgers_having_less_than_aq_replicas_of_an_entry",
    "below_write_quorum": "auditor_num_ledgers_having_less_than_wq_replicas_of_an_entry",
    "underreplicated_too_long": "auditor_num_ledgers_underreplicated_too_long",
    "unresponsive_registered_bookie": "auditor_num_unresponsive_registered_bookies",
    "potentially_faulty": "auditor_num_ledgers_potentially_faulty",
}
OVER_REPLICATION_GAUGES = {
    "ledgers": "auditor_num_ledgers_over_replicated",
    "entries": "auditor_over_replicated_entries",
    "bytes": "auditor_over_replicated_bytes",
}


def _config(**settings: Any) -> AutoRecoveryConfig:
    return AutoRecoveryConfig(**{"auditor_replicas_check_retry_delay": 0.05, **settings})


def _counts(**found: int) -> dict[str, int]:
    """Every category at 0 but those given."""
    return {category: found.get(category, 0) for category in GAUGES}


def _gauges() -> dict[str, float | None]:
    return {category: REGISTRY.get_sample_value(name) for category, name in GAUGES.items()}


def _over_replication_gauges() -> dict[str, float | None]:
    return {key: REGISTRY.get_sample_value(name) for key, name in OVER_REPLICATION_GAUGES.items()}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path, 3) as running:
        yield running


@pytest.fixture
def four_bookies(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path, 4) as running:
        yield running


@pytest.fixture
def long_session_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Three bookies whose registrations outlive a pause of the whole test."""
    cluster = Cluster(init_cluster(tmp_path), tmp_path)
    cluster.bookies = [BookieProcess(cluster.uri, tmp_path / f"bookie-{i}") for i in range(3)]
    try:
        with (
            environment({"TALLY_BOOKIE_SESSION_TIMEOUT": "60"}),
            ThreadPoolExecutor(3) as pool,
        ):
            list(pool.map(BookieProcess.start, cluster.bookies))
        yield cluster
    finally:
        cluster.shutdown()


async def _write(
    cluster: Cluster, quorums: tuple[int, int, int], count: int = 1
) -> list[LedgerRecord]:
    """`count` closed ledgers of ENTRIES entries each, with E / WQ / AQ `quorums`."""
    e, wq, aq = quorums
    async with Client(cluster.uri) as client:
        records = []
        for _ in range(count):
            writer = await client.create_ledger(
                ensemble_size=e, write_quorum=wq, ack_quorum=aq, password=PASSWORD
            )
            await asyncio.gather(*(writer.append_nowait(b"entry %d" % i) for i in range(ENTRIES)))
            await writer.close()
            records.append(await client.context.ledgers.read_ledger_metadata(writer.ledger_id))
        return records


def _holders(record: LedgerRecord, entry_id: int) -> list[str]:
    """The bookies of the entry's write set, in write-set order."""
    metadata = record.metadata
    ensemble = metadata.ensemble_at(entry_id)
    return [ensemble[p] for p in write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)]


def _forget(cluster: Cluster, lost: Mapping[str, Mapping[LedgerId, Iterable[int]]]) -> None:
    """Stop each bookie, delete the entries from its storage behind its back, restart it."""
    for bookie_id, ledgers in lost.items():
        process = cluster.bookie(bookie_id)
        assert process.stop() == 0
        storage = LedgerStorage(process.data_dir / "ledgers")
        try:
            for ledger_id, entries in ledgers.items():
                wanted = set(entries)
                assert storage.forget_entries(ledger_id, wanted) == len(wanted)
        finally:
            storage.close()
    cluster.restart(list(lost))


async def _check(
    cluster: Cluster,
    config: AutoRecoveryConfig,
    *,
    client_config: ClientConfig | None = None,
    clock: Callable[[], float] = lambda: NOW,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    before_request: Callable[[str, LedgerId], Awaitable[None]] | None = None,
    answer_list: ListAnswer | None = None,
) -> tuple[ReplicasCheckReport, _RecordingPool, dict[LedgerId, frozenset[str]]]:
    """Run the check in a client of its own; the report, what the bookies were asked, and
    the under-replication marks afterwards."""
    async with Client(cluster.uri, config=client_config) as client:
        context = client.context
        pool = _RecordingPool(context.bookies, before_request, answer_list)
        context.bookies = pool  # type: ignore[assignment]
        try:
            report = await replicas_check(context, config, clock=clock, sleep=sleep)
            marks = {
                mark.ledger_id: mark.missing_bookies
                async for mark in context.under_replication.list_under_replicated()
            }
        finally:
            context.bookies = pool.pool
        return report, pool, marks


ListAnswer = Callable[[str, tuple[LedgerId, ...], Any], Awaitable[tuple[LedgerEntries, ...]]]
"""Answers a list of entries of ledgers in a bookie's place: (bookie, ledgers, connection)."""


class _RecordingPool:
    """The check's bookie pool, recording each ledger asked (by GET_LIST_OF_ENTRIES_OF_LEDGER
    or in a GET_LIST_OF_ENTRIES_OF_LEDGERS), each list, and the most requests in flight at
    once; `before_request` runs first for each ledger (a test acting at that moment), and
    `answer_list` answers the lists when given (a test's faulty or old bookie)."""

    def __init__(
        self,
        pool: BookiePool,
        before_request: Callable[[str, LedgerId], Awaitable[None]] | None = None,
        answer_list: ListAnswer | None = None,
    ) -> None:
        self.pool = pool
        self.asked: list[tuple[str, LedgerId]] = []
        self.lists: list[tuple[str, tuple[LedgerId, ...]]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self._before_request = before_request
        self._answer_list = answer_list

    async def get(self, bookie_id: str) -> _RecordingConnection:
        return _RecordingConnection(self, bookie_id, await self.pool.get(bookie_id))


class _RecordingConnection:
    def __init__(self, pool: _RecordingPool, bookie_id: str, connection: Any) -> None:
        self._pool = pool
        self._bookie_id = bookie_id
        self._connection = connection

    async def get_list_of_entries(self, ledger_id: LedgerId) -> EntryAvailability:
        entries: EntryAvailability = await self._counted(
            [ledger_id], self._connection.get_list_of_entries(ledger_id)
        )
        return entries

    async def get_lists_of_entries(self, ledger_ids: Sequence[LedgerId]) -> Any:
        pool = self._pool
        pool.lists.append((self._bookie_id, tuple(ledger_ids)))
        answer = (
            pool._answer_list(self._bookie_id, tuple(ledger_ids), self._connection)
            if pool._answer_list is not None
            else self._connection.get_lists_of_entries(ledger_ids)
        )
        return await self._counted(ledger_ids, answer)

    async def _counted(self, ledger_ids: Sequence[LedgerId], request: Awaitable[Any]) -> Any:
        """Record the ledgers asked, then count the request in flight while it runs."""
        pool = self._pool
        for ledger_id in ledger_ids:
            pool.asked.append((self._bookie_id, ledger_id))
            if pool._before_request is not None:
                await pool._before_request(self._bookie_id, ledger_id)
        pool.in_flight += 1
        pool.most_in_flight = max(pool.most_in_flight, pool.in_flight)
        try:
            return await request
        finally:
            pool.in_flight -= 1


class _ReadsInFlight:
    """Counts the ledger metadata and mark keys a store is reading at once (get: one,
    get_many: each of its paths); a bookie's address, read when the pool dials it, is the
    connection's business and not counted."""

    def __init__(self, store: MetadataStore) -> None:
        self.now = self.most = 0
        get, get_many = store.get, store.get_many
        store.get = lambda path: self._counted([path], get(path))  # type: ignore[method-assign]
        store.get_many = lambda paths: self._counted(  # type: ignore[method-assign]
            paths, get_many(paths)
        )

    async def _counted(self, paths: list[str], read: Awaitable[Any]) -> Any:
        keys = sum(not path.startswith((WRITABLE, READONLY)) for path in paths)
        self.now += keys
        self.most = max(self.most, self.now)
        try:
            return await read
        finally:
            self.now -= keys


# -- a healthy cluster ---------------------------------------------------------------------


async def test_a_healthy_cluster_has_no_findings(cluster: Cluster) -> None:
    closed = await _write(cluster, (3, 2, 2), 2) + await _write(cluster, (3, 3, 2), 2)
    async with Client(cluster.uri) as client:
        await client.create_ledger(password=PASSWORD)  # open: not the check's business
        empty = await client.create_ledger(password=PASSWORD)
        await empty.close()  # closed without entries: nothing to check
    report, pool, marks = await _check(cluster, _config())
    assert report.counts == _counts()
    assert report.findings == ()
    assert report.ledgers_checked == len(closed)
    assert marks == {}
    assert {ledger for _, ledger in pool.asked} == {record.ledger_id for record in closed}
    assert len(pool.asked) == 3 * len(closed)  # each bookie once per ledger
    assert len(pool.lists) == 3  # in one list per bookie: the ledgers fit one page
    assert _gauges() == dict.fromkeys(GAUGES, 0.0)
    assert report.over_replicated == ()
    assert _over_replication_gauges() == dict.fromkeys(OVER_REPLICATION_GAUGES, 0.0)


# -- extra copies --------------------------------------------------------------------------


async def test_extra_copies_are_counted_apart_in_bytes_never_as_findings_nor_marked(
    four_bookies: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Copies written where no write set puts them (as a bookie keeps them from a position
    it held before): over-replication on the ledger's own bookies, in entries and bytes, with
    no finding, no mark and no warning; a bookie the ledger does not name is not asked."""
    (record,) = await _write(four_bookies, (3, 2, 2))
    ledger_id, metadata = record.ledger_id, record.metadata
    ensemble = metadata.segments[0].ensemble
    outsider = next(b.address for b in four_bookies.bookies if b.address not in ensemble)
    member = next(b for b in ensemble if b not in _holders(record, 0))
    async with Client(four_bookies.uri) as client:
        raw = await (await client.context.bookies.get(_holders(record, 0)[0])).read(ledger_id, 0)
        for target in (member, outsider):
            connection = await client.context.bookies.get(target)
            await connection.add(raw, master_key(PASSWORD), recovery=True)

    caplog.set_level(logging.INFO, logger="tally.autorecovery.replicas_check")
    report, pool, marks = await _check(four_bookies, _config())
    assert report.counts == _counts()
    assert report.findings == ()
    assert marks == {}
    assert outsider not in {bookie for bookie, _ in pool.asked}
    size = metadata.length // (metadata.last_entry_id + 1)
    assert report.over_replicated == (
        (ledger_id, Violation(
            Category.OVER_REPLICATED, 0, member, 1,
            f"bookie {member} holds 1 entries of segment 0 (position {ensemble.index(member)}) "
            f"outside its write sets (entries 0), about {size} bytes: extra copies, not a "
            "violation",
            size,
        )),
    )  # fmt: skip
    assert report.over_replication == OverReplication(ledgers=1, rows=1, entries=1, bytes=size)
    assert _over_replication_gauges() == {"ledgers": 1.0, "entries": 1.0, "bytes": float(size)}
    assert _gauges() == dict.fromkeys(GAUGES, 0.0)
    over = [r for r in caplog.records if "over-replicated" in r.getMessage()]
    assert over
    assert all(r.levelno == logging.INFO for r in over)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# -- lost copies ---------------------------------------------------------------------------


async def test_lost_copies_are_classified_by_the_worst_entry_and_marked(cluster: Cluster) -> None:
    below_wq, below_aq = await _write(cluster, (3, 3, 2), 2)
    (no_replica,) = await _write(cluster, (3, 2, 2))
    (healthy,) = await _write(cluster, (3, 2, 2))
    one = _holders(below_wq, 2)[0]  # loses entries 2 and 3: two copies left of three
    two = _holders(below_aq, 4)[:2]  # loses entry 4 on two bookies: one copy left
    both = _holders(no_replica, 5)  # loses entry 5 on both bookies of its write set
    lost: dict[str, dict[LedgerId, list[int]]] = {}
    lost.setdefault(one, {})[below_wq.ledger_id] = [2, 3]
    for bookie in two:
        lost.setdefault(bookie, {})[below_aq.ledger_id] = [4]
    for bookie in both:
        lost.setdefault(bookie, {})[no_replica.ledger_id] = [5]
    await asyncio.to_thread(_forget, cluster, lost)

    report, _, marks = await _check(cluster, _config())
    assert report.counts == _counts(no_replica=1, below_ack_quorum=1, below_write_quorum=1)
    assert report.ledgers_checked == 4
    by_ledger = {finding.ledger_id: finding for finding in report.findings}
    assert set(by_ledger) == {below_wq.ledger_id, below_aq.ledger_id, no_replica.ledger_id}
    assert by_ledger[below_wq.ledger_id].categories == (Category.BELOW_WRITE_QUORUM,)
    assert by_ledger[below_aq.ledger_id].categories == (Category.BELOW_ACK_QUORUM,)
    assert by_ledger[no_replica.ledger_id].categories == (Category.NO_REPLICA,)
    assert marks == {
        below_wq.ledger_id: {one},
        below_aq.ledger_id: set(two),
        no_replica.ledger_id: set(both),
    }
    assert healthy.ledger_id not in marks
    detail = by_ledger[below_wq.ledger_id].detail
    assert "E=3 WQ=3 AQ=2" in detail
    assert "fewest copies 2 of 3" in detail
    assert f"bookie {one} (position " in detail
    assert "lacks 2: 2..3" in detail
    assert "fewest copies 0 of 2" in by_ledger[no_replica.ledger_id].detail
    after_first_run = _gauges()
    assert after_first_run == {category: float(n) for category, n in report.counts.items()}

    # The next run skips the marked ledgers (the worker has them); until it ends, the
    # gauges still show the last full run.
    seen_mid_run = []

    async def look_at_gauges(bookie: str, ledger: LedgerId) -> None:
        seen_mid_run.append(_gauges())

    again, pool, _ = await _check(cluster, _config(), before_request=look_at_gauges)
    assert again.counts == _counts()
    assert again.ledgers_checked == 1
    assert {ledger for _, ledger in pool.asked} == {healthy.ledger_id}
    assert seen_mid_run
    assert all(gauges == after_first_run for gauges in seen_mid_run)
    assert _gauges() == dict.fromkeys(GAUGES, 0.0)


async def test_a_lost_bookie_is_judged_by_the_copies_on_the_others(cluster: Cluster) -> None:
    records = await _write(cluster, (3, 3, 2), 2)
    dead = cluster.bookies[0].address
    cluster.kill(dead)
    await eventually_writable(cluster.uri, {b.address for b in cluster.bookies[1:]})
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await asyncio.sleep(seconds)

    report, _, marks = await _check(cluster, _config(), sleep=sleep)
    assert sleeps == [0.05]  # the ledgers were asked again before being judged
    assert report.counts == _counts(below_write_quorum=2)
    assert {finding.ledger_id for finding in report.findings} == {r.ledger_id for r in records}
    for finding in report.findings:
        assert finding.marked == frozenset()
        assert f"unregistered bookies ['{dead}'] did not answer" in finding.detail
    assert marks == {}  # marking a lost bookie's ledgers is the bookie check's business


# -- marks and the grace period ------------------------------------------------------------


async def test_marked_ledgers_are_skipped_and_reported_when_marked_too_long(
    cluster: Cluster,
) -> None:
    recent, old, unmarked = await _write(cluster, (3, 2, 2), 3)
    async with Client(cluster.uri) as client:
        marks = client.context.under_replication
        await marks.mark_under_replicated(recent.ledger_id, ["b"], now_ms=int(NOW * 1000) - 10_000)
        await marks.mark_under_replicated(old.ledger_id, ["b"], now_ms=int(NOW * 1000) - 7_200_000)

    report, pool, _ = await _check(
        cluster, _config(underreplicated_ledger_recovery_grace_period=3_600)
    )
    assert report.counts == _counts(underreplicated_too_long=1)
    (finding,) = report.findings
    assert finding.ledger_id == old.ledger_id
    assert finding.categories == (Category.UNDERREPLICATED_TOO_LONG,)
    assert "7200 s ago" in finding.detail
    assert "grace period of 3600 s" in finding.detail
    assert report.ledgers_checked == 1
    assert {ledger for _, ledger in pool.asked} == {unmarked.ledger_id}

    never, _, _ = await _check(cluster, _config(underreplicated_ledger_recovery_grace_period=0))
    assert never.counts == _counts()
    assert never.ledgers_checked == 1


# -- bookies that do not answer ------------------------------------------------------------


async def test_a_paused_registered_bookie_is_reported_after_the_retry(
    long_session_cluster: Cluster,
) -> None:
    cluster = long_session_cluster
    records = await _write(cluster, (3, 2, 2), 3)
    stalled = cluster.bookies[1].address
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await asyncio.sleep(seconds)

    cluster.pause(stalled)
    try:
        report, pool, marks = await _check(
            cluster,
            _config(auditor_replicas_check_retry_delay=0.1),
            client_config=ClientConfig(add_entry_timeout=0.5),
            sleep=sleep,
        )
    finally:
        cluster.resume(stalled)
    assert sleeps == [0.1]
    assert report.counts == _counts(unresponsive_registered_bookie=1, potentially_faulty=3)
    bookie_findings = [f for f in report.findings if f.bookie_id is not None]
    assert [f.bookie_id for f in bookie_findings] == [stalled]
    assert "registered (writable)" in bookie_findings[0].detail
    assert "Timeout" in bookie_findings[0].detail
    ledger_findings = {f.ledger_id: f for f in report.findings if f.ledger_id is not None}
    assert set(ledger_findings) == {record.ledger_id for record in records}
    assert all(f.categories == (Category.POTENTIALLY_FAULTY,) for f in ledger_findings.values())
    assert marks == {}  # an unknown is never a missing copy
    # Asked in the walk and again in the retry, but once per step: the first timeout
    # spares the bookie the other ledgers' requests.
    asked_stalled = [ledger for bookie, ledger in pool.asked if bookie == stalled]
    assert 2 <= len(asked_stalled) <= 2 * len(records)


async def test_a_bookie_that_fails_in_the_middle_of_a_list_leaves_its_ledgers_unknown(
    cluster: Cluster,
) -> None:
    """One bookie's list answers the first ledger, fails on the second (an error record) and
    answers the third: the second is unknown, never missing. It is set aside and asked again
    after the retry delay, one ledger at a time, and judged healthy; nothing is marked. A
    list that fails as a whole (a timeout) leaves all its ledgers unknown in the same way."""
    records = await _write(cluster, (3, 2, 2), 3)
    ids = [record.ledger_id for record in records]
    faulty = cluster.bookies[0].address

    async def fail_the_second(
        bookie: str, ledgers: tuple[LedgerId, ...], connection: Any
    ) -> tuple[LedgerEntries, ...]:
        answered: tuple[LedgerEntries, ...] = await connection.get_lists_of_entries(ledgers)
        if bookie != faulty:
            return answered
        limbo = LedgerInLimbo(f"ledger {ledgers[1]} is in limbo")
        return (answered[0], LedgerEntries.failed(ledgers[1], limbo), *answered[2:])

    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    report, pool, marks = await _check(cluster, _config(), sleep=sleep, answer_list=fail_the_second)
    assert sleeps == [0.05]
    assert report.counts == _counts()
    assert report.findings == ()
    assert marks == {}
    assert sorted(pool.lists) == sorted((b.address, tuple(ids)) for b in cluster.bookies)
    again = [ledger for bookie, ledger in pool.asked[len(ids) * 3 :] if bookie == faulty]
    assert again == [ids[1]]  # the others were answered in the list

    async def time_out(
        bookie: str, ledgers: tuple[LedgerId, ...], connection: Any
    ) -> tuple[LedgerEntries, ...]:
        if bookie == faulty:
            raise Timeout(f"bookie {bookie}: no answer")
        answered: tuple[LedgerEntries, ...] = await connection.get_lists_of_entries(ledgers)
        return answered

    sleeps.clear()
    report, pool, marks = await _check(cluster, _config(), sleep=sleep, answer_list=time_out)
    assert sleeps == [0.05]
    assert report.counts == _counts()
    assert marks == {}
    retried = [ledger for bookie, ledger in pool.asked[len(ids) * 3 :] if bookie == faulty]
    assert sorted(retried) == ids


async def test_a_bookie_too_old_for_lists_is_asked_one_ledger_at_a_time(cluster: Cluster) -> None:
    """A bookie that does not know GET_LIST_OF_ENTRIES_OF_LEDGERS closes the connection on
    it; the check then asks it per ledger for the rest of the run, and still finds the
    copies it lacks."""
    healthy, damaged = await _write(cluster, (3, 3, 2), 2)
    old = _holders(damaged, 2)[0]
    await asyncio.to_thread(_forget, cluster, {old: {damaged.ledger_id: [2]}})

    async def too_old(
        bookie: str, ledgers: tuple[LedgerId, ...], connection: Any
    ) -> tuple[LedgerEntries, ...]:
        if bookie == old:
            await connection.close()  # as its reader does on an unknown operation
            raise BookieUnavailable(f"bookie {bookie}: connection closed")
        answered: tuple[LedgerEntries, ...] = await connection.get_lists_of_entries(ledgers)
        return answered

    report, pool, marks = await _check(cluster, _config(), answer_list=too_old)
    assert report.counts == _counts(below_write_quorum=1)
    assert marks == {damaged.ledger_id: {old}}
    assert [bookie for bookie, _ in pool.lists].count(old) == 1
    one_by_one = [ledger for bookie, ledger in pool.asked[6:] if bookie == old]
    assert sorted(set(one_by_one)) == sorted([healthy.ledger_id, damaged.ledger_id])


# -- metadata that changes under the check -------------------------------------------------


async def test_a_ledger_whose_metadata_changed_is_checked_again_not_reported(
    four_bookies: Cluster,
) -> None:
    """The check first sees an ensemble naming a bookie that holds nothing; while it asks
    that bookie, the metadata is put right (as a replication worker's CAS would). Before
    reporting, the check sees the new version, checks again, and finds nothing."""
    cluster = four_bookies
    (record,) = await _write(cluster, (3, 2, 2))
    ensemble = record.metadata.segments[0].ensemble
    real = ensemble[1]
    (stranger,) = {b.address for b in cluster.bookies} - set(ensemble)
    async with Client(cluster.uri) as client:
        ledgers = client.context.ledgers
        wrong = await ledgers.write_ledger_metadata(
            record.ledger_id, record.metadata.replace_bookie(0, real, stranger), record.version
        )

        async def put_right(bookie: str, ledger: LedgerId) -> None:
            if bookie == stranger and ledger == record.ledger_id:
                current = await ledgers.read_ledger_metadata(ledger)
                if current.version == wrong.version:
                    await ledgers.write_ledger_metadata(
                        ledger, current.metadata.replace_bookie(0, stranger, real), wrong.version
                    )

        report, pool, marks = await _check(cluster, _config(), before_request=put_right)
    assert report.counts == _counts()
    assert report.findings == ()
    assert marks == {}
    asked = [bookie for bookie, _ in pool.asked]
    assert stranger in asked
    assert asked.index(real) > asked.index(stranger)  # asked on the new metadata


# -- load limits ---------------------------------------------------------------------------


async def test_requests_and_metadata_reads_in_flight_stay_within_the_limits(
    cluster: Cluster,
) -> None:
    records = await _write(cluster, (3, 2, 2), 24)
    overdue = records[:10]
    async with Client(cluster.uri) as client:
        for record in overdue:
            await client.context.under_replication.mark_under_replicated(
                record.ledger_id, ["b"], now_ms=0
            )
    config = _config(
        auditor_max_concurrent_bookie_requests=2,
        auditor_max_concurrent_metadata_reads=4,
        underreplicated_ledger_recovery_grace_period=60,
    )
    async with Client(cluster.uri) as client:
        context = client.context
        pool = _RecordingPool(context.bookies)
        context.bookies = pool  # type: ignore[assignment]
        reads = _ReadsInFlight(context.ledgers.store)
        try:
            report = await replicas_check(context, config, clock=lambda: NOW)
        finally:
            context.bookies = pool.pool
    assert report.counts == _counts(underreplicated_too_long=len(overdue))
    assert report.ledgers_checked == len(records) - len(overdue)
    assert pool.most_in_flight == 2
    assert reads.most == 4
