"""The replication worker against real bookie processes: lost bookies replaced, forgotten
entries copied back, re-marks kept, locks shared by workers, lost entries reported once,
open ledgers given their grace, the byte rate kept, corrupt copies never copied.

Marks are set by hand (the auditor is another component); each test proves the repair from
the outside, by reading every copy of every entry from every bookie of its write set.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

import tally
from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.replication_worker import ReplicationWorker
from tally.bookie.ledger_storage import LedgerStorage
from tally.client.bookie_connection import BookieConnection
from tally.client.config import ClientConfig
from tally.client.writer import LedgerWriter
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.core.schedule import write_set
from tally.failpoints import enabled
from tally.metadata.cluster import init_cluster
from tally.metadata.ledger_manager import LedgerRecord
from tally.metadata.stores import open_store
from tests.support.cluster import Cluster, eventually_writable, replica_copies, running_cluster
from tests.support.polling import until
from tests.support.rot import rot_entries

PASSWORD = b"worker-test"
CLIENT = ClientConfig(
    add_entry_timeout=2.0, read_timeout=1.5, speculative_read_timeout=0.3, session_timeout=5.0
)
FAST = AutoRecoveryConfig(
    under_replicated_poll_interval=0.2,
    replication_backoff_initial=0.2,
    replication_backoff_max=1.0,
    open_ledger_rereplication_grace_period=2.0,
)
WAIT = 30.0


def payload(ledger_id: LedgerId, entry_id: int, size: int = 100) -> bytes:
    seed = f"{ledger_id.qualified_name}/{entry_id}/".encode()
    return (seed * (size // len(seed) + 1))[:size]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path, 4) as found:
        yield found


@contextlib.asynccontextmanager
async def running_worker(
    uri: str,
    config: AutoRecoveryConfig = FAST,
    worker_id: str = "worker-1",
    passwords: tuple[bytes, ...] = (PASSWORD,),
) -> AsyncIterator[ReplicationWorker]:
    async with tally.Client(uri, config=CLIENT) as client:
        worker = ReplicationWorker(client.context, config, worker_id, passwords=passwords)
        task = asyncio.create_task(worker.run())
        try:
            yield worker
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def write_ledger(
    client: tally.Client,
    entries: int,
    *,
    size: int = 100,
    ensemble: int = 3,
    write_quorum: int = 2,
    close: bool = True,
    password: bytes = PASSWORD,
    digest: str = "crc32c",
) -> LedgerWriter:
    writer = await client.create_ledger(
        ensemble_size=ensemble,
        write_quorum=write_quorum,
        ack_quorum=2,
        password=password,
        digest=digest,
    )
    await asyncio.gather(
        *(writer.append_nowait(payload(writer.ledger_id, e, size)) for e in range(entries))
    )
    if close:
        await writer.close()
    return writer


async def read_record(uri: str, ledger_id: LedgerId) -> LedgerRecord:
    async with tally.Client(uri, config=CLIENT) as client:
        return await client.context.ledgers.read_ledger_metadata(ledger_id)


async def assert_every_copy(
    uri: str, ledger_id: LedgerId, size: int = 100, *, lost: frozenset[int] = frozenset()
) -> LedgerMetadata:
    """Every entry on every bookie of its write set, intact (but `lost` ones, on none)."""
    metadata = (await read_record(uri, ledger_id)).metadata
    copies = await replica_copies(ledger_id, metadata, PASSWORD, metadata.last_entry_id)
    for entry_id, by_bookie in copies.items():
        assert len(by_bookie) == metadata.write_quorum
        if entry_id in lost:
            assert set(by_bookie.values()) == {"NoSuchEntry"}, (entry_id, by_bookie)
        else:
            assert set(by_bookie.values()) == {payload(ledger_id, entry_id, size)}, (
                entry_id,
                by_bookie,
            )
    return metadata


async def is_marked(uri: str, ledger_id: LedgerId) -> bool:
    async with tally.Client(uri, config=CLIENT) as client:
        return await client.context.under_replication.under_replicated(ledger_id) is not None


async def kill_and_wait(cluster: Cluster, bookie: str) -> None:
    cluster.kill(bookie)
    alive = {b.address for b in cluster.bookies if b.process and b.process.poll() is None}
    await eventually_writable(cluster.uri, alive)


def forget(cluster: Cluster, forgotten: dict[str, list[int]], ledger_id: LedgerId) -> None:
    """Make bookies lose entries behind their back: stop, drop from the index, restart."""
    for bookie in forgotten:
        assert cluster.bookie(bookie).stop() == 0
    for bookie, entries in forgotten.items():
        storage = LedgerStorage(cluster.bookie(bookie).data_dir / "ledgers")
        try:
            assert storage.forget_entries(ledger_id, entries) == len(entries)
        finally:
            storage.close()
    cluster.restart(list(forgotten))


async def counted(worker: ReplicationWorker, outcome: str, count: int) -> None:
    """Wait for the worker's count of `outcome` to reach `count` (it is updated just after
    the mark is removed), then check it does not go past it."""

    async def reached() -> bool:
        return worker.status()[outcome] >= count

    await until(reached, f"{count} {outcome}", timeout=5.0)
    assert worker.status()[outcome] == count


def metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


# -- lost bookies ------------------------------------------------------------------------


async def test_a_lost_bookie_is_replaced_everywhere_and_its_marks_removed(
    cluster: Cluster,
) -> None:
    """Also: nothing is taken while replication is disabled; a deleted ledger's mark goes;
    a CRC32C ledger is repaired without its password (the master key is in the metadata);
    an HMAC ledger whose password the worker lacks is left marked, backing off."""
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writers = [await write_ledger(client, 30) for _ in range(2)]
        writers.append(await write_ledger(client, 30, password=b"another application's"))
        stranger = await write_ledger(client, 5, password=b"not the worker's", digest="hmac")
        doomed = await write_ledger(client, 5)
        ensembles = [w.metadata.metadata.segments[0].ensemble for w in writers]
        victim = max(
            (b.address for b in cluster.bookies),
            key=lambda b: sum(b in ensemble for ensemble in ensembles),
        )
        hit = [w.ledger_id for w, ens in zip(writers, ensembles, strict=True) if victim in ens]
        assert hit
        manager = client.context.under_replication
        await manager.disable_replication()
        await kill_and_wait(cluster, victim)
        for ledger_id in [*hit, stranger.ledger_id, doomed.ledger_id]:
            await manager.mark_under_replicated(ledger_id, [victim])
        await client.delete_ledger(doomed.ledger_id)
        replaced_before = metric("replication_worker_num_bookies_replaced_total")

        async with running_worker(cluster.uri) as worker:
            await more_looks(worker, 3)
            assert worker.status()["replicated"] == 0
            assert worker.status()["replication_enabled"] is False
            assert all([await is_marked(cluster.uri, x) for x in hit])

            await manager.enable_replication()

            async def repaired() -> bool:
                return not any([await is_marked(cluster.uri, x) for x in hit])

            await until(repaired, "the lost bookie's ledgers repaired")
            await until(
                lambda: _not(is_marked(cluster.uri, doomed.ledger_id)), "deleted ledger's mark"
            )
            await counted(worker, "replicated", len(hit) + 1)
            assert await is_marked(cluster.uri, stranger.ledger_id)
            assert worker.status()["failed"] >= 1
            assert stranger.ledger_id.qualified_name in {
                b["ledger"] for b in worker.status()["backoffs"]
            }
            assert worker.status()["bytes_copied"] > 0
    assert metric("replication_worker_num_bookies_replaced_total") - replaced_before == len(hit)
    for writer in writers:
        metadata = await assert_every_copy(cluster.uri, writer.ledger_id)
        old = writer.metadata.metadata.segments[0].ensemble
        new = metadata.segments[0].ensemble
        assert [i for i in range(3) if old[i] != new[i]] == (
            [old.index(victim)] if victim in old else []
        )
        assert victim not in new


async def more_looks(worker: ReplicationWorker, count: int) -> None:
    """Until the worker has looked at the marks `count` more times."""
    target = worker.status()["looks"] + count
    await until(lambda: worker.status()["looks"] >= target, f"{count} more looks")


async def _not(found: Awaitable[bool]) -> bool:
    return not await found


async def test_a_worker_stops_at_once_when_its_session_is_lost() -> None:
    uri = "memory://replication-worker-session"
    async with open_store(uri) as store:
        await init_cluster(store)
        async with tally.Client(uri, config=CLIENT) as client:
            worker = ReplicationWorker(client.context, FAST, "short-lived", passwords=(PASSWORD,))
            task = asyncio.create_task(worker.run())
            await more_looks(worker, 2)
            assert not task.done()
            assert worker.status()["replication_enabled"] is True
            await client.context.ledgers.store.expire_session()
            await asyncio.wait_for(task, 5.0)
            assert task.result() is None


async def test_entries_forgotten_by_a_live_bookie_are_copied_back_to_it(
    cluster: Cluster,
) -> None:
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writer = await write_ledger(client, 20, ensemble=3, write_quorum=3)
    before = await read_record(cluster.uri, writer.ledger_id)
    bookie = before.metadata.segments[0].ensemble[1]
    forget(cluster, {bookie: [2, 5, 6, 19]}, writer.ledger_id)
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        await client.context.under_replication.mark_under_replicated(writer.ledger_id, [bookie])
    async with running_worker(cluster.uri) as worker:
        await until(lambda: _not(is_marked(cluster.uri, writer.ledger_id)), "the ledger repaired")
        assert worker.status()["entries_copied"] == 4
    after = await read_record(cluster.uri, writer.ledger_id)
    assert after.version == before.version
    assert after.metadata == before.metadata
    await assert_every_copy(cluster.uri, writer.ledger_id)


async def test_a_mark_made_while_the_worker_sleeps_wakes_it_before_its_poll(
    cluster: Cluster,
) -> None:
    """The worker watches LAST_MARKED: a mark made during its sleep (an hour's poll here) or
    during its pass is looked at at once."""
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writers = [await write_ledger(client, 10, ensemble=3, write_quorum=3) for _ in range(2)]
    lazy = dataclasses.replace(FAST, under_replicated_poll_interval=3600.0)
    async with running_worker(cluster.uri, lazy) as worker:
        await until(lambda: worker.status()["looks"] >= 1, "the first look")
        for ledger_id in [writer.ledger_id for writer in writers]:
            record = await read_record(cluster.uri, ledger_id)
            bookie = record.metadata.segments[0].ensemble[0]
            # on a thread: the worker's loop must keep renewing its session meanwhile
            await asyncio.to_thread(forget, cluster, {bookie: [1, 4]}, ledger_id)
            async with tally.Client(cluster.uri, config=CLIENT) as client:
                await client.context.under_replication.mark_under_replicated(ledger_id, [bookie])

            async def repaired(ledger_id: LedgerId = ledger_id) -> bool:
                return not await is_marked(cluster.uri, ledger_id)

            await until(repaired, "the ledger repaired long before the poll", timeout=WAIT)
        assert worker.status()["entries_copied"] == 4
    for writer in writers:
        await assert_every_copy(cluster.uri, writer.ledger_id)


# -- marks, locks, lost entries -----------------------------------------------------------


async def test_the_byte_rate_is_kept_and_a_remark_during_the_copy_keeps_the_mark(
    cluster: Cluster,
) -> None:
    size, entries, rate = 16 * 1024, 48, 256 * 1024
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writer = await write_ledger(client, entries, size=size)
        victim = writer.metadata.metadata.segments[0].ensemble[0]
        await kill_and_wait(cluster, victim)
        manager = client.context.under_replication
        first = await manager.mark_under_replicated(writer.ledger_id, [victim])
        config = AutoRecoveryConfig(
            under_replicated_poll_interval=0.2, replication_rate_by_bytes=rate
        )
        async with running_worker(cluster.uri, config) as worker:

            async def copying() -> bool:
                return worker.status()["bytes_copied"] > 0

            await until(copying, "the copy started")
            started, copied_at_start = time.monotonic(), worker.status()["bytes_copied"]
            remark = await manager.mark_under_replicated(writer.ledger_id, ["10.0.0.9:3181"])
            assert remark.version > first.version
            assert worker.status()["current_ledgers"] == [writer.ledger_id.qualified_name]

            async def first_turn_over() -> bool:
                return worker.status()["remarked"] == 1

            await until(first_turn_over, "the first turn ended with the mark kept")
            elapsed = time.monotonic() - started
            copied = worker.status()["bytes_copied"] - copied_at_start
            # two thirds of the entries were on the lost bookie (E3 WQ2)
            assert worker.status()["bytes_copied"] == pytest.approx(entries * size * 2 / 3, rel=0.1)
            assert copied / elapsed <= rate * 1.15, (copied, elapsed)
            assert copied / elapsed >= rate * 0.5, (copied, elapsed)

            await until(lambda: _not(is_marked(cluster.uri, writer.ledger_id)), "the second turn")
            await counted(worker, "replicated", 1)
    metadata = await assert_every_copy(cluster.uri, writer.ledger_id, size)
    assert victim not in metadata.bookies()


async def test_a_worker_repairs_at_most_its_ledgers_in_parallel_at_once(cluster: Cluster) -> None:
    """Ledgers are taken several at a time (`rereplication_ledgers_in_parallel`), never
    more: each copy is slowed by a failpoint's delay so that they overlap."""
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writers = [await write_ledger(client, 6, ensemble=3, write_quorum=3) for _ in range(5)]
        victim = writers[0].metadata.metadata.segments[0].ensemble[0]
        hit = [w.ledger_id for w in writers if victim in w.metadata.metadata.bookies()]
        assert len(hit) >= 3
        await kill_and_wait(cluster, victim)
        for ledger_id in hit:
            await client.context.under_replication.mark_under_replicated(ledger_id, [victim])
    seen: list[int] = []
    two_at_once = dataclasses.replace(FAST, rereplication_ledgers_in_parallel=2)
    with enabled("replication.copy", "delay(0.2)"):
        async with running_worker(cluster.uri, two_at_once) as worker:

            async def sample() -> None:  # apart from the slower check of the marks
                while True:
                    seen.append(len(worker.status()["current_ledgers"]))
                    await asyncio.sleep(0.005)

            async def all_repaired() -> bool:
                return not any([await is_marked(cluster.uri, x) for x in hit])

            sampler = asyncio.create_task(sample())
            try:
                await until(all_repaired, "every ledger repaired", timeout=WAIT)
            finally:
                sampler.cancel()
                await asyncio.gather(sampler, return_exceptions=True)
    assert max(seen) == 2, seen
    for ledger_id in hit:
        await assert_every_copy(cluster.uri, ledger_id)


async def test_two_workers_repair_each_ledger_once(cluster: Cluster) -> None:
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writers = [await write_ledger(client, 20) for _ in range(6)]
        victim = cluster.bookies[0].address
        hit = [w for w in writers if victim in w.metadata.metadata.bookies()]
        assert hit
        await kill_and_wait(cluster, victim)
        for writer in hit:
            await client.context.under_replication.mark_under_replicated(writer.ledger_id, [victim])
        replaced_before = metric("replication_worker_num_bookies_replaced_total")
        async with (
            running_worker(cluster.uri, worker_id="w1") as one,
            running_worker(cluster.uri, worker_id="w2") as two,
        ):

            async def all_repaired() -> bool:
                return not any([await is_marked(cluster.uri, w.ledger_id) for w in hit])

            await until(all_repaired, "every ledger repaired")

            async def both_counted() -> bool:
                return one.status()["replicated"] + two.status()["replicated"] == len(hit)

            await until(both_counted, "each ledger counted once", timeout=5.0)
            for worker in (one, two):  # a ledger repaired twice would be counted by then
                await more_looks(worker, 2)
            assert one.status()["replicated"] + two.status()["replicated"] == len(hit)
            assert one.status()["failed"] + two.status()["failed"] == 0
    assert metric("replication_worker_num_bookies_replaced_total") - replaced_before == len(hit)
    for writer in hit:
        metadata = await assert_every_copy(cluster.uri, writer.ledger_id)
        assert victim not in metadata.bookies()


async def test_an_entry_with_no_copy_anywhere_is_listed_lost_not_retried(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writer = await write_ledger(client, 12)
    metadata = writer.metadata.metadata
    ensemble = metadata.segments[0].ensemble
    holders = [ensemble[p] for p in write_set(4, 3, 2)]
    forget(cluster, {holders[0]: [4, 7], holders[1]: [4]}, writer.ledger_id)
    caplog.set_level(logging.INFO, logger="tally.autorecovery.replication_worker")
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        manager = client.context.under_replication
        mark = await manager.mark_under_replicated(writer.ledger_id, [holders[0]])
        async with running_worker(cluster.uri) as worker:

            async def listed() -> bool:
                return await manager.lost_entries(writer.ledger_id) is not None

            await until(listed, "the ledger on the lost-entries list")
            lost = await manager.lost_entries(writer.ledger_id)
            assert lost is not None
            assert lost.ranges == ((4, 4),)
            assert lost.mark_version == mark.version
            assert holders[0] in lost.reason
            assert holders[1] in lost.reason
            await counted(worker, "lost", 1)
            assert metric("replication_worker_lost_entries") == 1
            await more_looks(worker, 3)  # the ledger is not taken again
            assert worker.status()["lost"] == 1
            assert await is_marked(cluster.uri, writer.ledger_id)
            alerts = [r.getMessage() for r in caplog.records if "ALERT" in r.getMessage()]
            assert len(alerts) == 1
            assert writer.ledger_id.qualified_name in alerts[0]
            assert "(4)" in alerts[0]

            await manager.mark_under_replicated(writer.ledger_id, ["10.0.0.9:3181"])

            async def tried_again() -> bool:
                return worker.status()["lost"] == 2

            await until(tried_again, "a re-mark gives the ledger another try")
    # entry 7 was copied back to the bookie that had forgotten it; entry 4 is on none
    await assert_every_copy(cluster.uri, writer.ledger_id, lost=frozenset({4}))


async def test_a_corrupt_copy_is_never_copied_and_is_written_over(cluster: Cluster) -> None:
    """The bad copy the worker runs into while copying is no source, and gets the verified
    copy too."""
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writer = await write_ledger(client, 10, ensemble=3, write_quorum=3)
    ensemble = writer.metadata.metadata.segments[0].ensemble
    victim = ensemble[0]
    target = 4
    first_source = ensemble[write_set(target, 3, 3)[0]]  # position 1: asked first
    assert first_source != victim
    assert cluster.bookie(first_source).stop() == 0  # its copy rots on disk meanwhile
    assert rot_entries(cluster.bookie(first_source).data_dir, writer.ledger_id, [target]) == 1
    cluster.restart([first_source])
    await eventually_writable(cluster.uri, {b.address for b in cluster.bookies})
    corrupt_before = metric("client_read_corrupt_copies_total")
    await kill_and_wait(cluster, victim)
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        await client.context.under_replication.mark_under_replicated(writer.ledger_id, [victim])
    async with running_worker(cluster.uri):
        await until(lambda: _not(is_marked(cluster.uri, writer.ledger_id)), "the ledger repaired")
    assert metric("client_read_corrupt_copies_total") - corrupt_before >= 1
    metadata = (await read_record(cluster.uri, writer.ledger_id)).metadata
    copies = await replica_copies(writer.ledger_id, metadata, PASSWORD, 9)
    newcomer = metadata.segments[0].ensemble[0]
    assert newcomer not in ensemble
    assert all(copies[e][newcomer] == payload(writer.ledger_id, e) for e in range(10))
    assert copies[target][first_source] == payload(writer.ledger_id, target)
    assert metric("replication_worker_num_bad_copies_repaired_total") >= 1


@pytest.mark.parametrize("failure", ["timeout", "closed"])
async def test_a_source_that_does_not_answer_a_batched_read_has_its_entries_copied_alone(
    cluster: Cluster,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    failure: str,
) -> None:
    """READ_ENTRIES unanswered: a timeout, or an older bookie that closes the connection on
    an operation it does not know (stood in for here in the worker's process, closing the
    worker's connection as such a bookie would). Its entries are read one by one instead,
    and the repair is whole; a bookie that closed the connection is not asked to batch
    again in the pass."""
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writer = await write_ledger(client, 30, ensemble=3, write_quorum=3)
    ensemble = writer.metadata.metadata.segments[0].ensemble
    victim = ensemble[0]
    unanswered: list[tuple[str, tuple[int, ...]]] = []

    async def unanswering(
        self: BookieConnection, ledger_id: LedgerId, entry_ids: Sequence[int], max_bytes: int
    ) -> tuple[bytes, ...]:
        unanswered.append((self.address, tuple(entry_ids)))
        if failure == "timeout":
            raise TimeoutError
        self._abort("the bookie closed the connection on an unknown operation")
        raise self._unavailable()

    monkeypatch.setattr(BookieConnection, "read_entries", unanswering)
    caplog.set_level(logging.INFO, logger="tally.autorecovery.ledger_repair")
    await kill_and_wait(cluster, victim)
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        await client.context.under_replication.mark_under_replicated(writer.ledger_id, [victim])
    async with running_worker(cluster.uri) as worker:
        await until(lambda: _not(is_marked(cluster.uri, writer.ledger_id)), "the ledger repaired")
        assert worker.status()["entries_copied"] == 30
    asked = sorted(entry for _, entries in unanswered for entry in entries)
    assert asked == list(range(30)), "each entry asked in a batch once, then alone"
    if failure == "closed":
        sources = [address for address, _ in unanswered]
        assert len(sources) == len(set(sources)), "a closing bookie is asked to batch once"
    assert any("copying them one by one" in r.getMessage() for r in caplog.records)
    await assert_every_copy(cluster.uri, writer.ledger_id)


# -- open ledgers -------------------------------------------------------------------------


async def test_an_open_ledgers_writer_that_changes_ensemble_in_time_is_not_fenced(
    cluster: Cluster,
) -> None:
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writer = await write_ledger(client, 20, close=False)
        victim = writer.metadata.metadata.segments[0].ensemble[1]
        await kill_and_wait(cluster, victim)
        await client.context.under_replication.mark_under_replicated(writer.ledger_id, [victim])
        async with running_worker(cluster.uri) as worker:

            async def deferred() -> bool:
                return worker.status()["deferred"] >= 1

            await until(deferred, "the open ledger deferred")
            for e in range(20, 30):  # the writer goes on: the dead bookie is replaced
                await writer.append(payload(writer.ledger_id, e))
            assert victim not in writer.metadata.metadata.segments[-1].ensemble
            await until(
                lambda: _not(is_marked(cluster.uri, writer.ledger_id)), "the ledger repaired"
            )
            await counted(worker, "replicated", 1)
        record = await read_record(cluster.uri, writer.ledger_id)
        assert record.metadata.state is LedgerState.OPEN
        assert victim not in record.metadata.bookies()
        for e in range(30, 35):
            await writer.append(payload(writer.ledger_id, e))
        await writer.close()
    await assert_every_copy(cluster.uri, writer.ledger_id)


async def test_an_open_ledger_whose_writer_is_gone_is_fenced_closed_and_repaired(
    cluster: Cluster,
) -> None:
    """The writer's client goes away without closing the ledger. WQ 3, AQ 2: recovery
    re-writes the entries past the LAC the bookies know to their write set, which still
    holds the lost bookie, so it needs an ack quorum of the others."""
    fenced_before = metric("replication_worker_num_open_ledgers_fenced_total")
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writer = await write_ledger(client, 20, write_quorum=3, close=False)
    # a third copy still in flight when the client went may have made the writer change
    # ensemble on its way out: the last segment is the stored one
    ensemble = (await read_record(cluster.uri, writer.ledger_id)).metadata.segments[-1].ensemble
    victim = ensemble[2]
    await kill_and_wait(cluster, victim)
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        mark = await client.context.under_replication.mark_under_replicated(
            writer.ledger_id, [victim]
        )
    async with running_worker(cluster.uri) as worker:
        await until(lambda: _not(is_marked(cluster.uri, writer.ledger_id)), "the ledger repaired")
        assert time.time() * 1000 >= mark.first_marked_ms + 2000  # not before the grace
        assert worker.status()["deferred"] >= 1
    record = await read_record(cluster.uri, writer.ledger_id)
    assert record.metadata.state is LedgerState.CLOSED
    assert record.metadata.last_entry_id == 19
    # gone from every segment with entries (an empty trailing one keeps it: nothing to copy)
    assert all(victim not in record.metadata.ensemble_at(e) for e in range(20))
    for survivor in ensemble[:2]:
        connection = await BookieConnection.connect(survivor, request_timeout=5.0)
        try:
            assert (await connection.ledger_info(writer.ledger_id)).fenced
        finally:
            await connection.close()
    assert metric("replication_worker_num_open_ledgers_fenced_total") - fenced_before == 1
    await assert_every_copy(cluster.uri, writer.ledger_id)


async def test_entries_acknowledged_while_the_worker_plans_are_not_listed_lost(
    cluster: Cluster,
) -> None:
    """The writer of an open ledger goes on while the worker asks the bookies what they hold.
    The worker must take the LAC before their lists, not after: a LAC that moved on in
    between would judge the entries acknowledged meanwhile as held by none (a chaos run
    listed one lost, and its mark then stayed for good)."""
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writer = await write_ledger(client, 20, close=False)
        victim = writer.metadata.metadata.segments[0].ensemble[1]
        await kill_and_wait(cluster, victim)
        for e in range(20, 30):  # the writer replaces the dead bookie: segment 0 stays
            await writer.append(payload(writer.ledger_id, e))
        assert victim not in writer.metadata.metadata.segments[-1].ensemble
        await client.context.under_replication.mark_under_replicated(writer.ledger_id, [victim])
        async with running_worker(cluster.uri) as worker:
            original = worker.context.availability
            appended = asyncio.Lock()
            done: list[int] = []

            async def availability(bookie: str, ledger_id: LedgerId) -> object:
                held = await original(bookie, ledger_id)
                async with appended:  # the lists are taken: the writer moves on meanwhile
                    if not done:
                        for e in range(30, 35):
                            done.append(await writer.append(payload(writer.ledger_id, e)))
                return held

            worker.context.availability = availability  # type: ignore[method-assign]
            await until(
                lambda: _not(is_marked(cluster.uri, writer.ledger_id)), "the ledger repaired"
            )
            assert done == [30, 31, 32, 33, 34]
            await counted(worker, "replicated", 1)
        lost = await client.context.under_replication.lost_entries(writer.ledger_id)
        assert lost is None, lost
        await writer.close()
    await assert_every_copy(cluster.uri, writer.ledger_id)
