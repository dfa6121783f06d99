"""Garbage collection in a real bookie process, through the real path (tombstones made by
the delete path, the bookie's GC thread on a short timer, compaction due at every run):
SIGKILLed again and again while it deletes and compacts under a write load, it loses no
acknowledged entry; and once most ledgers are deleted, its disk usage comes back to within
a small factor of its live bytes.

Each round writes a new generation of ledgers, pipelined, with entries from 100 bytes to
40 KiB (those of 16 KiB and more stay in the journal: kept journal files are compacted too),
while the previous generation is mostly deleted, so that the bookie deletes and compacts
entry logs and journal files as it takes adds. The bookie is SIGKILLed a random moment after
a compaction has moved entries in this incarnation, restarted, and every acknowledged entry
of every ledger not deleted is read back byte for byte. `TALLY_GC_CRASH_SEED=<n>` reruns a
seed.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tally.client.bookie_connection import BookieConnection
from tally.core.deletion import ClusterSettings
from tally.core.errors import NoSuchEntry, NoSuchLedger
from tally.core.ids import LedgerId
from tally.metadata import deletion
from tally.metadata.cluster_settings import write_settings
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.tombstones import read_tombstone
from tests.bookie.conftest import KEY, BookieUnderTest, entry, sample
from tests.support.cluster import store_session
from tests.support.ledgers import open_ledger
from tests.support.load import add_until_gone
from tests.support.polling import until

SEED = int(os.environ.get("TALLY_GC_CRASH_SEED", "1601"))
ROUNDS = 8
LEDGERS_PER_ROUND = 6
SURVIVORS_PER_ROUND = 2
PAYLOAD_SIZES = (100, 100, 1000, 4096, 20_000, 40_000)
WINDOW = 64
SETTINGS = {
    "flush_interval": 0.2,
    "write_cache_max_bytes": 2 << 20,
    "journal_file_size": 2 << 20,
    "journal_preallocate_size": 1 << 20,
    "entry_log_size_limit": 1 << 20,
    "keep_large_entries_in_journal": True,
    # GC every 0.1 s, each run compacting every file with a dead byte or more.
    "gc_wait_time": 0.1,
    "minor_compaction_threshold": 0.5,
    "minor_compaction_interval": 0.1,
    "major_compaction_threshold": 0.99,
    "major_compaction_interval": 0.1,
    # The test machine's own disk, however full other tests left it, is not this test's
    # business: compaction suspended near a full disk (and a read-only bookie) is tested
    # on file systems made for it.
    "disk_usage_warn_threshold": 1.0,
    "disk_usage_threshold": 1.0,
    "disk_usage_lwm_threshold": 1.0,
}


def payload(ledger_id: LedgerId, entry_id: int) -> bytes:
    rng = random.Random(f"{ledger_id.scope}/{ledger_id.id}/{entry_id}")
    return rng.randbytes(rng.choice(PAYLOAD_SIZES))


def encoded(ledger_id: LedgerId, entry_id: int) -> bytes:
    return entry(ledger_id, entry_id, payload(ledger_id, entry_id))


@dataclass
class Writer:
    """Pipelined adds over the ledgers of one generation; what was acknowledged."""

    acknowledged: dict[LedgerId, set[int]] = field(default_factory=dict)
    next_entry: dict[LedgerId, int] = field(default_factory=dict)

    async def run(self, address: str, ledgers: list[LedgerId], rng: random.Random) -> None:
        """Add until the bookie goes away."""
        for ledger_id in ledgers:
            self.acknowledged.setdefault(ledger_id, set())
            self.next_entry.setdefault(ledger_id, 0)
        await add_until_gone(
            address, lambda connection: self._add(connection, rng.choice(ledgers)), WINDOW
        )

    def _add(self, connection: BookieConnection, ledger_id: LedgerId) -> asyncio.Future[None]:
        entry_id = self.next_entry[ledger_id]
        self.next_entry[ledger_id] += 1
        future = connection.add_nowait(encoded(ledger_id, entry_id), KEY)

        def done(future: asyncio.Future[None]) -> None:
            if not future.cancelled() and future.exception() is None:
                self.acknowledged[ledger_id].add(entry_id)

        future.add_done_callback(done)
        return future


async def verify(address: str, writer: Writer, doomed: set[LedgerId], where: str) -> int:
    """Read back every acknowledged entry of every ledger not deleted; how many."""
    connection = await BookieConnection.connect(address, request_timeout=30)
    checked = 0
    try:
        for ledger_id, acknowledged in writer.acknowledged.items():
            if ledger_id in doomed:
                continue
            entry_ids = sorted(acknowledged)
            for first in range(0, len(entry_ids), 256):
                batch = entry_ids[first : first + 256]
                reads = await asyncio.gather(
                    *(connection.read(ledger_id, e) for e in batch), return_exceptions=True
                )
                for entry_id, stored in zip(batch, reads, strict=True):
                    what = f"{where}: ledger {ledger_id} entry {entry_id} (acknowledged)"
                    assert not isinstance(stored, BaseException), f"{what}: {stored!r}"
                    assert stored == encoded(ledger_id, entry_id), f"{what}: bytes differ"
                    checked += 1
    finally:
        await connection.close()
    return checked


async def create(uri: str, bookie: str, ledgers: list[LedgerId]) -> None:
    """Their metadata: open, on this one bookie."""
    async with store_session(uri) as store:
        for ledger_id in ledgers:
            await LedgerManager(store).create_ledger_metadata(ledger_id, open_ledger([bookie], 1))


async def close_and_delete(
    uri: str, writer: Writer, closing: list[LedgerId], dooming: set[LedgerId]
) -> None:
    """Close the ledgers of a finished generation and delete some through the delete path
    (retention 0: a tombstone at once)."""
    async with store_session(uri) as store:
        await write_settings(store, ClusterSettings(ledger_delete_retention=0))
        ledgers = LedgerManager(store)
        for ledger_id in closing:
            last = max(writer.acknowledged[ledger_id], default=-1)
            await ledgers.update(ledger_id, lambda m, last=last: m.close(last, last + 1))
            if ledger_id in dooming:
                await deletion.delete_ledger(ledgers, ledger_id, reason="test", now_ms=0)


async def acknowledged_by_all(uri: str, ledgers: set[LedgerId]) -> bool:
    async with store_session(uri) as store:
        for ledger_id in ledgers:
            found = await read_tombstone(store, ledger_id)
            if found is not None and found.tombstone.pending:
                return False
    return True


@pytest.fixture
def gc_bookie(cluster: str, tmp_path: Path) -> Iterator[BookieUnderTest]:
    process = BookieUnderTest(cluster, tmp_path / "bookie", settings=dict(SETTINGS))
    try:
        yield process
    finally:
        process.kill()


@pytest.mark.timeout(480)  # 27 s on a quiet machine, 94 s on a busy one, more beside a worker
def test_sigkill_during_compaction_under_a_write_load_loses_no_acknowledged_entry(
    gc_bookie: BookieUnderTest,
) -> None:
    asyncio.run(crash_rounds(gc_bookie))


async def crash_rounds(bookie: BookieUnderTest) -> None:
    rng = random.Random(SEED)
    writer = Writer()
    doomed: set[LedgerId] = set()
    previous: list[LedgerId] = []
    moved_before_kill = mid_run = 0
    for round_number in range(1, ROUNDS + 1):
        where = f"seed {SEED} (TALLY_GC_CRASH_SEED), round {round_number}"
        await asyncio.to_thread(bookie.start)
        try:
            checked = await verify(bookie.address, writer, doomed, where)
        except AssertionError as error:
            raise AssertionError(f"{error}\n--- bookie log ---\n{bookie.log()}") from error
        dooming = set(previous[SURVIVORS_PER_ROUND:])
        await close_and_delete(bookie.metadata, writer, previous, dooming)
        doomed |= dooming
        ledgers = [LedgerId(round_number, number) for number in range(1, LEDGERS_PER_ROUND + 1)]
        await create(bookie.metadata, bookie.address, ledgers)
        writing = asyncio.create_task(
            writer.run(bookie.address, ledgers, random.Random(rng.random()))
        )
        moved = await moved_entries(bookie, timeout=15)
        moved_before_kill += moved
        await asyncio.sleep(rng.uniform(0, 0.15))
        in_run = sample(await asyncio.to_thread(bookie.metrics), "bookie_gc_running") == 1
        bookie.kill()
        mid_run += in_run
        await asyncio.wait_for(writing, 30)
        acknowledged = sum(len(writer.acknowledged[ledger]) for ledger in ledgers)
        print(
            f"{where}: {checked} entries read back, {acknowledged} adds acknowledged, killed "
            f"{'after a compaction moved entries' if moved else 'with nothing compacted'}, "
            f"{'in' if in_run else 'between'} garbage collection runs"
        )
        previous = ledgers
    await asyncio.to_thread(bookie.start)
    checked = await verify(bookie.address, writer, doomed, f"seed {SEED}, at the end")
    assert checked > 200  # not a vacuous run; how many depends on the machine's speed
    await until(lambda: acknowledged_by_all(bookie.metadata, doomed), "tombstones acknowledged")
    connection = await BookieConnection.connect(bookie.address, request_timeout=30)
    try:
        for ledger_id in sorted(doomed):
            assert await gone(connection, ledger_id), f"ledger {ledger_id} was deleted"
    finally:
        await connection.close()
    bookie.stop()
    assert moved_before_kill >= ROUNDS - 1, "kills came once compaction was moving entries"
    assert mid_run >= 1, "a kill came in the middle of a garbage collection run"


async def moved_entries(bookie: BookieUnderTest, timeout: float) -> bool:
    """Wait until a compaction of this incarnation has moved entries."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metrics = await asyncio.to_thread(bookie.metrics)
        if sample(metrics, "bookie_gc_moved_entries_total") > 0:
            return True
        await asyncio.sleep(0.01)
    return False


async def gone(connection: BookieConnection, ledger_id: LedgerId) -> bool:
    """Whether the bookie holds nothing of the ledger (its tombstone is acknowledged, so the
    drop was checkpointed before: no replay can bring it back)."""
    try:
        await connection.read(ledger_id, 0)
    except (NoSuchLedger, NoSuchEntry):
        return True
    return False


def disk_bytes(data_dir: Path) -> int:
    """Bytes of the entry logs and journal files (the index aside); a file the running
    bookie deletes between the listing and its look counts nothing."""
    paths = [*(data_dir / "ledgers" / "logs").glob("*.log"), *(data_dir / "journal").glob("*.txn")]
    return sum(_size(path) for path in paths)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@pytest.mark.timeout(360)
def test_after_most_ledgers_are_deleted_the_disk_comes_back_near_the_live_bytes(
    gc_bookie: BookieUnderTest,
) -> None:
    asyncio.run(delete_most(gc_bookie))


async def delete_most(bookie: BookieUnderTest) -> None:
    await asyncio.to_thread(bookie.start)
    ledgers = [LedgerId(0, number) for number in range(1, 21)]
    await create(bookie.metadata, bookie.address, ledgers)
    connection = await BookieConnection.connect(bookie.address, request_timeout=30)
    written = 0
    try:
        entry_id = 0
        while written < 64 << 20:
            batch = [encoded(ledger_id, entry_id) for ledger_id in ledgers]
            await asyncio.gather(*(connection.add(data, KEY) for data in batch))
            written += sum(map(len, batch))
            entry_id += 1
    finally:
        await connection.close()
    survivors = ledgers[::10]
    live = sum(len(encoded(ledger_id, e)) for ledger_id in survivors for e in range(entry_id))
    before = disk_bytes(bookie.data_dir)
    assert before > written
    writer = Writer(acknowledged={ledger_id: set(range(entry_id)) for ledger_id in ledgers})
    doomed = {ledger for ledger in ledgers if ledger not in survivors}
    await close_and_delete(bookie.metadata, writer, ledgers, doomed)
    slack = 2 * SETTINGS["journal_file_size"] + SETTINGS["entry_log_size_limit"]
    bound = 1.25 * live + slack
    deadline = time.monotonic() + 240  # a GC run every 0.1 s: seconds, unless the CPU is shared
    while (now := disk_bytes(bookie.data_dir)) > bound:
        assert time.monotonic() < deadline, (
            f"{now} bytes on disk after deleting 90 % of {written} bytes; {live} live bytes"
        )
        await asyncio.sleep(0.1)
    print(
        f"{written / 2**20:.0f} MiB written, {before / 2**20:.1f} MiB on disk; after deleting "
        f"18 of 20 ledgers: {now / 2**20:.1f} MiB for {live / 2**20:.1f} MiB live"
    )
    assert await verify(bookie.address, writer, doomed, "after the deletes") == 2 * entry_id
    bookie.stop()
