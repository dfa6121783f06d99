"""The checkpoint's steps: entry_log.write (the entry log's write and fdatasync),
checkpoint.after_flush (the logs flushed, the index batch not yet written), index.batch
(the index's RocksDB write batch) and checkpoint.before_mark (the batch written, not yet
synced: the journal mark in it is not durable).

- error, in-process (ENOSPC, until the failpoint is off): the checkpoint is reported failed
  and the bookie turns read-only (out of room); every acknowledged entry is still served
  (from the write cache the checkpoint gave back, or the index); the journal is released
  past nothing and, before the index is written, its mark stays where it was; once
  checkpoints succeed again the bookie is writable, and after a restart everything
  acknowledged reads back;
- crash, one bookie process per failpoint, dying in the middle of a checkpoint under a
  write load: restarted, its journal replay restores every entry it acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from tally.bookie.journal_files import journal_files
from tally.core.ids import LedgerId
from tally.failpoints import enabled
from tests.failpoints.conftest import (
    InProcessCluster,
    RawWriter,
    crashed_at,
    faulty_bookie,
    in_process_cluster,
    read_back,
)
from tests.support.polling import until
from tests.support.processes import init_cluster

POINTS = ["entry_log.write", "checkpoint.after_flush", "index.batch", "checkpoint.before_mark"]
SETTINGS = {
    # A checkpoint when the write cache holds 128 KiB (about 120 adds), and every 0.5 s.
    "flush_interval": 0.5,
    "write_cache_max_bytes": 128 << 10,
    # Journal files small enough that a checkpoint would release some.
    "journal_file_size": 128 << 10,
    "journal_preallocate_size": 64 << 10,
}
CRASH_SETTINGS = {**SETTINGS, "flush_interval": 60.0, "scrub_interval": 0.0}
"""No checkpoint but when the cache is full (none before the writer's adds), and no scrub
pass (which records itself in the index)."""
LEDGERS = [LedgerId(0, 1), LedgerId(0, 2**63 - 1), LedgerId(7, 3)]


@pytest.mark.parametrize("name", POINTS)
async def test_a_failed_checkpoint_is_reported_and_gives_back_what_it_took(
    tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="tally.bookie.server")
    async with in_process_cluster(tmp_path, 1, **SETTINGS) as cluster:
        [bookie_id] = list(cluster.bookies)
        bookie = cluster.bookies[bookie_id]
        writer = RawWriter(bookie_id, LEDGERS)
        await writer.add(60)
        assert writer.acknowledged_count == 60
        with enabled(name, "error(ENOSPC)") as point:
            await writer.add(200)
            await until(lambda: point.hits >= 1, "a checkpoint failed", timeout=10)
            # No checkpoint succeeds from here on (they take turns, and each fails).
            hits, checkpoints = point.hits, bookie.storage.stats().checkpoints
            mark = bookie.storage.last_checkpoint_mark()
            journals = set(journal_files(bookie.config.journal_directory))
            await until(lambda: point.hits >= hits + 2, "two more failed", timeout=10)
            await until(lambda: _registered(cluster, bookie_id, "readonly"), "read-only")
            assert bookie.storage.stats().checkpoints == checkpoints
            await read_back(bookie_id, writer.acknowledged)
            if name != "checkpoint.before_mark":  # there the index batch is written
                assert bookie.storage.last_checkpoint_mark() == mark
            kept = set(journal_files(bookie.config.journal_directory))
            assert journals <= kept, "a failed checkpoint releases no journal file"
        assert any(
            f"failpoint {name}" in record.getMessage() and "no room" in record.getMessage()
            for record in caplog.records
        ), [record.getMessage() for record in caplog.records]
        await until(lambda: _registered(cluster, bookie_id, "writable"), "writable again")
        assert bookie.storage.stats().checkpoints > checkpoints
        acknowledged = writer.acknowledged_count
        await writer.add(30)
        assert writer.acknowledged_count == acknowledged + 30
        assert await read_back(bookie_id, writer.acknowledged) == writer.acknowledged_count
        await cluster.restart(bookie_id)
        assert await read_back(bookie_id, writer.acknowledged) == writer.acknowledged_count


async def test_a_checkpoint_out_of_room_is_tried_again_every_flush_interval(
    tmp_path: Path,
) -> None:
    """A checkpoint that failed gave its entries back to the write cache, full as when it
    started: the next try waits flush_interval, as a checkpoint out of room is documented to
    (and its log line says), rather than come at the loop's next turn, 0.1 s later. Every
    failed try leaves an empty entry log behind (the log a failed write leaves is never
    written again): tried ten times a second, a full disk got 26 of them in 3 s."""
    async with in_process_cluster(tmp_path, 1, **SETTINGS) as cluster:
        [bookie_id] = list(cluster.bookies)
        writer = RawWriter(bookie_id, LEDGERS)
        await writer.add(60)
        with enabled("entry_log.write", "error(ENOSPC)") as point:
            await writer.add(200)
            await until(lambda: point.hits >= 1, "a checkpoint failed", timeout=10)
            loop = asyncio.get_running_loop()
            started = loop.time()
            await until(lambda: point.hits >= 3, "two more tries", timeout=10)
            interval = SETTINGS["flush_interval"]
            assert loop.time() - started >= 2 * interval * 0.8, "tried again at once"


async def _registered(cluster: InProcessCluster, bookie_id: str, mode: str) -> bool:
    return await cluster.registered_as(bookie_id) == mode


async def test_a_bookie_crashing_mid_checkpoint_replays_every_acknowledged_entry(
    tmp_path: Path,
) -> None:
    uri = init_cluster(tmp_path)
    terms = dict.fromkeys(POINTS, "crash")
    terms["index.batch"] = "1*off->crash"  # the first start writes the index once
    bookies = {
        name: faulty_bookie(uri, tmp_path / name, f"{name}={term}", **CRASH_SETTINGS)
        for name, term in terms.items()
    }
    async with in_process_cluster(tmp_path, 0, uri=uri, **CRASH_SETTINGS) as cluster:
        try:
            await asyncio.gather(*(asyncio.to_thread(b.start) for b in bookies.values()))
            writers = {name: RawWriter(b.address, LEDGERS) for name, b in bookies.items()}
            await asyncio.gather(*(w.add_until_refused() for w in writers.values()))
            for name, bookie in bookies.items():
                crashed_at(bookie, name)
                # The cache filled (about 120 entries of 1000 B) while up to 32 adds (the
                # writer's window) were in it unacknowledged: a crash in the first
                # checkpoint of a full cache comes after some 90 acknowledgements.
                assert writers[name].acknowledged_count >= 64, "crashed in a checkpoint"
        finally:
            for bookie in bookies.values():
                bookie.kill()
        await asyncio.gather(*(cluster.take_over(b) for b in bookies.values()))
        for name, bookie in bookies.items():
            writer = writers[name]
            assert await read_back(bookie.address, writer.acknowledged) == (
                writer.acknowledged_count
            ), name
            # What the crash left half-written (an empty log, log records that no index
            # points to) is garbage to the next collection, nothing worse. The index batch
            # of checkpoint.before_mark was written to RocksDB's WAL: a process crash does
            # not lose it, and the first log is live there.
            restarted = await cluster.restart(bookie.address)
            run = await restarted.garbage_collector.trigger()
            assert run.skipped == [], (name, run.skipped)
            assert run.storage["failures"] == [], (name, run.storage)
            if name != "checkpoint.before_mark":
                assert run.storage["deleted_entry_logs"] == [0], (name, run.storage)
            assert await read_back(bookie.address, writer.acknowledged) == (
                writer.acknowledged_count
            ), name
