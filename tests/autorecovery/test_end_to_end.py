"""Auto-recovery end to end, with real processes: bookies and `tally autorecovery` processes
on a sqlite store, killed and paused as incidents would.

Each test ends by proving durability from the outside: a replicas check with zero
violations, and every entry of every ledger read from every bookie of its write set.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.replicas_check import replicas_check
from tally.bookie.ledger_storage import LedgerStorage
from tally.client.client import Client
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.schedule import write_set
from tally.metadata.auditor_election import who_is_auditor
from tally.metadata.ledger_manager import LedgerRecord
from tally.metadata.paths import LOCKS
from tests.support.cluster import SESSION_TIMEOUT, Cluster, replica_copies, running_cluster
from tests.support.polling import until
from tests.support.processes import AutoRecoveryProcess, tally
from tests.support.rot import rot_entries

PASSWORD = b"e2e"
REPAIR_TIMEOUT = 60.0
"""Seconds for the whole cluster to be back at full replication after an incident."""
FAST_SETTINGS = {
    "session_timeout": str(SESSION_TIMEOUT),
    "lost_bookie_recovery_delay": "0",
    "under_replicated_poll_interval": "0.5",
    "replication_backoff_initial": "0.2",
    "auditor_replicas_check_retry_delay": "0.5",
}
"""Fast reactions; the periodic checks keep their long defaults unless a test asks."""
CLIENT_SETTINGS = {"placement": "default"}
"""The worker's client: the test bookies have no racks."""


def payload(ledger_id: LedgerId, entry_id: int, size: int) -> bytes:
    seed = hashlib.sha256(f"{ledger_id.qualified_name}/{entry_id}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


async def write_ledgers(
    uri: str, count: int, entries: int, size: int = 100, *, write_quorum: int = 2
) -> dict[LedgerId, int]:
    """`count` closed ledgers E3 WQ`write_quorum` AQ2; their last entry ids."""
    async with Client(uri) as client:

        async def one() -> tuple[LedgerId, int]:
            writer = await client.create_ledger(
                ensemble_size=3, write_quorum=write_quorum, ack_quorum=2, password=PASSWORD
            )
            futures = [
                writer.append_nowait(payload(writer.ledger_id, e, size)) for e in range(entries)
            ]
            await asyncio.gather(*futures)
            await writer.close()
            return writer.ledger_id, entries - 1

        return dict(await asyncio.gather(*(one() for _ in range(count))))


async def records(uri: str, ledgers: dict[LedgerId, int]) -> dict[LedgerId, LedgerRecord]:
    async with Client(uri) as client:
        found = await asyncio.gather(
            *(client.context.ledgers.read_ledger_metadata(x) for x in ledgers)
        )
    return dict(zip(ledgers, found, strict=True))


async def wait_repaired(uri: str, ledgers: dict[LedgerId, int], lost: str | None) -> None:
    """Until no ledger's metadata names `lost` (if given) and no ledger is marked."""
    deadline = time.monotonic() + REPAIR_TIMEOUT
    async with Client(uri) as client:
        manager = client.context.under_replication
        while True:
            found = await asyncio.gather(
                *(client.context.ledgers.read_ledger_metadata(x) for x in ledgers)
            )
            naming = [
                r.ledger_id for r in found if lost is not None and lost in r.metadata.bookies()
            ]
            marked = [m.ledger_id async for m in manager.list_under_replicated()]
            if not naming and not marked:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"after {REPAIR_TIMEOUT:.0f}s {len(naming)} ledgers still name {lost} "
                    f"and {len(marked)} are marked"
                )
            await asyncio.sleep(0.5)


async def assert_fully_replicated(uri: str, ledgers: dict[LedgerId, int], size: int = 100) -> None:
    """Zero violations by the replicas check, and every copy of every entry intact."""
    async with Client(uri) as client:
        report = await replicas_check(client.context, AutoRecoveryConfig(metadata=uri))
        assert report.ledgers_checked >= len(ledgers)
        assert all(count == 0 for count in report.counts.values()), report.counts
    for ledger_id, record in (await records(uri, ledgers)).items():
        metadata: LedgerMetadata = record.metadata
        for segment in metadata.segments:
            assert len(set(segment.ensemble)) == len(segment.ensemble), segment
        copies = await replica_copies(ledger_id, metadata, PASSWORD, ledgers[ledger_id])
        for entry_id, by_bookie in copies.items():
            expected = payload(ledger_id, entry_id, size)
            assert len(by_bookie) == metadata.write_quorum
            assert all(copy == expected for copy in by_bookie.values()), (entry_id, by_bookie)


def most_used_bookie(found: dict[LedgerId, LedgerRecord]) -> str:
    counts: dict[str, int] = {}
    for record in found.values():
        for bookie in record.metadata.bookies():
            counts[bookie] = counts.get(bookie, 0) + 1
    return max(counts, key=lambda b: counts[b])


@contextlib.contextmanager
def autorecovery(cluster: Cluster, name: str, **settings: str) -> Iterator[AutoRecoveryProcess]:
    process = AutoRecoveryProcess(
        cluster.uri,
        cluster.root / f"{name}.log",
        name,
        settings={**FAST_SETTINGS, **settings},
        client_settings=CLIENT_SETTINGS,
    ).start()
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path, 5) as found:
        yield found


async def test_a_killed_bookie_s_ledgers_return_to_full_replication(cluster: Cluster) -> None:
    ledgers = await write_ledgers(cluster.uri, 50, 20)
    victim = most_used_bookie(await records(cluster.uri, ledgers))
    with autorecovery(cluster, "ar-1"):
        cluster.kill(victim)
        await wait_repaired(cluster.uri, ledgers, victim)
        await assert_fully_replicated(cluster.uri, ledgers)


async def test_a_killed_auditor_is_replaced_and_the_new_one_repairs(cluster: Cluster) -> None:
    ledgers = await write_ledgers(cluster.uri, 12, 10)
    with autorecovery(cluster, "ar-first") as first, autorecovery(cluster, "ar-second"):
        async with Client(cluster.uri) as client:
            store = client.context.ledgers.store
            assert await who_is_auditor(store) == "ar-first"
            first.kill()

            async def second_elected() -> bool:
                return await who_is_auditor(store) == "ar-second"

            await until(second_elected, "ar-second elected", timeout=4 * SESSION_TIMEOUT + 5)
        victim = most_used_bookie(await records(cluster.uri, ledgers))
        cluster.kill(victim)
        await wait_repaired(cluster.uri, ledgers, victim)
        await assert_fully_replicated(cluster.uri, ledgers)


async def test_a_worker_killed_mid_copy_leaves_the_ledger_to_another(cluster: Cluster) -> None:
    size = 4096
    ledgers = await write_ledgers(cluster.uri, 6, 60, size)
    victim = most_used_bookie(await records(cluster.uri, ledgers))
    with autorecovery(cluster, "ar-slow", replication_rate_by_bytes="40000") as slow:
        cluster.kill(victim)
        async with Client(cluster.uri) as client:
            store = client.context.ledgers.store

            async def copying() -> bool:
                return bool(await store.children(LOCKS))

            await until(copying, "the slow worker holds a lock", timeout=3 * SESSION_TIMEOUT + 10)
        slow.kill()
        with autorecovery(cluster, "ar-fast"):
            await wait_repaired(cluster.uri, ledgers, victim)
    async with Client(cluster.uri) as client:
        manager = client.context.under_replication
        assert [x async for x in manager.list_lost_entries()] == []
    for record in (await records(cluster.uri, ledgers)).values():
        replaced = [s for s in record.metadata.segments if victim not in s.ensemble]
        assert len(replaced) == len(record.metadata.segments)
    await assert_fully_replicated(cluster.uri, ledgers, size)


async def test_entries_deleted_behind_a_bookie_s_back_are_found_and_copied_back(
    cluster: Cluster,
) -> None:
    ledgers = await write_ledgers(cluster.uri, 5, 30)
    found = await records(cluster.uri, ledgers)
    damaged_ledger = next(iter(ledgers))
    metadata = found[damaged_ledger].metadata
    bookie_id = metadata.segments[0].ensemble[0]
    bookie = cluster.bookie(bookie_id)
    bookie.stop()
    storage = LedgerStorage(bookie.data_dir / "ledgers")
    try:
        forgotten = storage.forget_entries(damaged_ledger, range(30))
    finally:
        storage.close()
    assert forgotten > 0
    cluster.restart([bookie_id])
    async with Client(cluster.uri) as client:
        before = await replicas_check(client.context, AutoRecoveryConfig(metadata=cluster.uri))
        # WQ = AQ = 2: one copy left of some entries is below the ack quorum.
        assert before.counts["below_ack_quorum"] == 1, before.counts
        assert before.counts["no_replica"] == before.counts["below_write_quorum"] == 0
        mark = await client.context.under_replication.under_replicated(damaged_ledger)
        assert mark is not None
        assert mark.missing_bookies == {bookie_id}
    with autorecovery(cluster, "ar-audit"):
        triggered = tally("shell", "triggeraudit", "--metadata", cluster.uri)
        assert triggered.returncode == 0, triggered.stderr
        await wait_repaired(cluster.uri, ledgers, lost=None)
    after = await records(cluster.uri, ledgers)
    assert after[damaged_ledger].metadata.segments == metadata.segments, "copied back in place"
    await assert_fully_replicated(cluster.uri, ledgers)


async def test_rotten_copies_found_by_the_ledger_check_are_written_over(cluster: Cluster) -> None:
    """Bytes flipped in a bookie's entry log: the index still says the entries are there,
    so only their bad copies, named in the mark, make the worker copy them back."""
    ledgers = await write_ledgers(cluster.uri, 3, 30)
    found = await records(cluster.uri, ledgers)
    damaged = next(iter(ledgers))
    metadata = found[damaged].metadata
    bookie_id = metadata.segments[0].ensemble[0]
    held = [e for e in range(30) if 0 in write_set(e, 3, 2)]
    bookie = cluster.bookie(bookie_id)
    bookie.stop()
    assert rot_entries(bookie.data_dir, damaged, held) == len(held)
    cluster.restart([bookie_id])
    before = await replica_copies(damaged, metadata, PASSWORD, 29)
    assert {before[e][bookie_id] for e in held} == {"EntryUnreadable"}
    with autorecovery(
        cluster,
        "ar-rot",
        auditor_periodic_check_interval="1",
        auditor_ledger_verification_percentage="100",
    ):
        await until(
            lambda: _copies_read_back(damaged, metadata, bookie_id, held),
            "the bad copies written over",
            timeout=REPAIR_TIMEOUT,
        )
        await wait_repaired(cluster.uri, ledgers, lost=None)
    assert (await records(cluster.uri, ledgers))[damaged].metadata.segments == metadata.segments
    await assert_fully_replicated(cluster.uri, ledgers)


async def _copies_read_back(
    ledger_id: LedgerId, metadata: LedgerMetadata, bookie_id: str, entries: list[int]
) -> bool:
    copies = await replica_copies(ledger_id, metadata, PASSWORD, max(entries))
    return all(copies[e][bookie_id] == payload(ledger_id, e, 100) for e in entries)


async def test_a_client_read_of_a_bad_copy_gets_it_repaired(cluster: Cluster) -> None:
    """No check runs: the client's read, served by another copy, files the bad ones."""
    ledgers = await write_ledgers(cluster.uri, 1, 30)
    (damaged,) = ledgers
    metadata = (await records(cluster.uri, ledgers))[damaged].metadata
    bookie_id = metadata.segments[0].ensemble[0]
    held = [e for e in range(30) if 0 in write_set(e, 3, 2)]
    bookie = cluster.bookie(bookie_id)
    bookie.stop()
    assert rot_entries(bookie.data_dir, damaged, held) == len(held)
    cluster.restart([bookie_id])
    async with Client(cluster.uri) as client:
        reader = await client.open_ledger(damaged, password=PASSWORD)
        for entry_id in range(30):
            assert (await reader.read_entry(entry_id)).data == payload(damaged, entry_id, 100)
    read_first = [e for e in held if write_set(e, 3, 2)[0] == 0]  # the reads met these
    async with Client(cluster.uri) as client:
        mark = await client.context.under_replication.under_replicated(damaged)
    assert mark is not None
    assert list(mark.bad_copies[bookie_id]) == read_first
    with autorecovery(cluster, "ar-read"):
        await wait_repaired(cluster.uri, ledgers, lost=None)
    assert await _copies_read_back(damaged, metadata, bookie_id, read_first)


async def test_a_scrub_finds_rotten_copies_and_the_bookie_files_their_repair(
    cluster: Cluster,
) -> None:
    """Bytes flipped in entry logs and in entries kept in journal files: `tally shell scrub
    --now` finds them, the bookie files them in the ledgers' marks, client reads go on
    meanwhile, and a worker writes good copies over them."""
    small = await write_ledgers(cluster.uri, 1, 30, size=100)
    large = await write_ledgers(cluster.uri, 1, 12, size=20_000)  # kept in the journal
    found = await records(cluster.uri, {**small, **large})
    (small_id,), (large_id,) = small, large
    ensembles = {x: found[x].metadata.segments[0].ensemble for x in (small_id, large_id)}
    bookie_id = sorted(set(ensembles[small_id]) & set(ensembles[large_id]))[0]
    held = {
        ledger_id: [
            e
            for e in range(last + 1)
            if ensembles[ledger_id].index(bookie_id) in write_set(e, 3, 2)
        ]
        for ledger_id, last in {**small, **large}.items()
    }
    bookie = cluster.bookie(bookie_id)
    bookie.stop()
    for ledger_id, entries in held.items():
        assert rot_entries(bookie.data_dir, ledger_id, entries) == len(entries)
    bookie.extra = (*bookie.extra, "--metrics-port", "0")  # the admin HTTP `scrub` talks to
    cluster.restart([bookie_id])
    scrub = tally("shell", "scrub", "--bookie", bookie_id, "--now", "--metadata", cluster.uri)
    assert scrub.returncode == 0, scrub.stderr
    async with Client(cluster.uri) as client:
        marks = client.context.under_replication

        async def filed(ledger_id: LedgerId) -> bool:
            mark = await marks.under_replicated(ledger_id)
            return mark is not None and list(mark.bad_copies.get(bookie_id, ())) == held[ledger_id]

        for ledger_id in held:
            await until(lambda ledger_id=ledger_id: filed(ledger_id), "the bookie files them")
        for ledger_id, last in {**small, **large}.items():  # reads go on meanwhile
            reader = await client.open_ledger(ledger_id, password=PASSWORD)
            size = 100 if ledger_id == small_id else 20_000
            for entry_id in range(last + 1):
                data = (await reader.read_entry(entry_id)).data
                assert data == payload(ledger_id, entry_id, size)
    with autorecovery(cluster, "ar-scrub"):
        await wait_repaired(cluster.uri, {**small, **large}, lost=None)
    await assert_fully_replicated(cluster.uri, small, size=100)
    await assert_fully_replicated(cluster.uri, large, size=20_000)
