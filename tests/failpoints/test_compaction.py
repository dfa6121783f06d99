"""Compaction's steps: compaction.after_copy (a chunk's live entries appended to the current
entry log and fdatasync'ed, the index not yet pointed at them) and compaction.before_remove
(the index pointed at the copies and synced, the compacted log not yet deleted).

- error, on ledger storage in-process: the run is reported failed (WriteFailed naming the
  failpoint), no log is deleted, the index points at one good copy of every entry (the
  original after_copy, the copy after before_remove) with usage counts that agree, and the
  next run compacts every sparse log away, counts unchanged;
- crash, a bookie process compacting (tests/support/gc_bookie.py) dies at the step:
  restarted, every acknowledged entry of the surviving ledger reads back, counted once,
  and a later run finishes the compaction: every log it had started on is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from tally.bookie.compactor import GcReport, GcSettings, usage_of
from tally.bookie.entry_log import RECORD_HEADER_SIZE
from tally.bookie.ledger_directories import LedgerDirectories
from tally.bookie.ledger_storage import LedgerStorage
from tally.core.compaction import DiskSpace
from tally.core.digest import crc32c
from tally.core.errors import NoSuchLedger, WriteFailed
from tally.core.ids import LedgerId
from tally.failpoints import enabled
from tests.bookie.conftest import sample, scrape
from tests.failpoints.conftest import (
    RawWriter,
    crashed_at,
    entry,
    faulty_bookie,
    in_process_cluster,
    read_back,
)
from tests.support.gc_bookie import DOOMED, FORCE
from tests.support.polling import until
from tests.support.processes import free_port, init_cluster

POINTS = ["compaction.after_copy", "compaction.before_remove"]
LOG_SIZE = 64 << 10
ROOMY = DiskSpace(10**12, 9 * 10**11)
KEPT, DOOMED_LEDGER = LedgerId(0, 1), LedgerId(3, 2)
"""Their entries alternate in every log; the second is deleted, so each log is half live."""


def log_ids(directory: Path) -> set[int]:
    return {int(path.stem, 16) for path in (directory / "logs").glob("*.log")}


# --- in-process ---------------------------------------------------------------------------


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[LedgerStorage]:
    opened = LedgerStorage(
        tmp_path / "ledgers", log_size_limit=LOG_SIZE, gc=GcSettings(), disk_space=lambda: ROOMY
    )
    yield opened
    opened.close()


def fill(storage: LedgerStorage, entries: int) -> dict[int, bytes]:
    """`entries` entries of each ledger, alternating, a checkpoint every 20; the kept
    ledger's entries by id."""
    kept = {}
    for entry_id in range(entries):
        for ledger_id in (KEPT, DOOMED_LEDGER):
            data = entry(ledger_id, entry_id)
            storage.add_entry(ledger_id, entry_id, crc32c(data), data, entry_id - 1)
            if ledger_id == KEPT:
                kept[entry_id] = data
        if entry_id % 10 == 9:
            storage.checkpoint(entry_id.to_bytes(16, "big"))
    storage.checkpoint(entries.to_bytes(16, "big"))
    return kept


def check_entries(storage: LedgerStorage, kept: dict[int, bytes]) -> None:
    for entry_id, data in kept.items():
        assert storage.get_entry(KEPT, entry_id) == (crc32c(data), data), entry_id


def locations(storage: LedgerStorage) -> dict[int, object]:
    return dict(storage._index.ledger_locations(KEPT))


def check_counts(storage: LedgerStorage) -> None:
    """The kept ledger's usage counts are exactly what its index locations make."""
    truth: dict[tuple[object, int], int] = defaultdict(int)
    for _, location in storage._index.ledger_locations(KEPT):
        kind, file_id, size = usage_of(location)
        truth[kind, file_id] += size
    counted = {
        (kind, file_id): size
        for kind, file_id, ledger_id, size in storage._index.usages()
        if ledger_id == KEPT and size
    }
    assert counted == dict(truth)


@pytest.mark.parametrize("name", POINTS)
def test_a_failed_compaction_step_is_reported_and_a_later_run_finishes(
    storage: LedgerStorage, tmp_path: Path, name: str
) -> None:
    kept = fill(storage, 150)
    storage.delete_ledger(DOOMED_LEDGER)
    info = storage.ledger_info(KEPT)
    logs = log_ids(storage.directory)
    assert len(logs) >= 4
    before = locations(storage)
    with enabled(name, "error") as point, pytest.raises(WriteFailed, match=f"failpoint {name}"):
        storage.collect_garbage(time.time(), force_major=True)
    assert point.hits == 1
    assert log_ids(storage.directory) >= logs, "no log deleted by a failed run"
    check_entries(storage, kept)
    check_counts(storage)
    after = locations(storage)
    if name == "compaction.after_copy":
        assert after == before, "the index still points at the originals"
    else:
        moved = {entry_id for entry_id in before if after[entry_id] != before[entry_id]}
        assert moved, "the index points at the copies of the first log compacted"
        assert len({usage_of(before[e])[1] for e in moved}) == 1, "one log's entries moved"

    report = storage.collect_garbage(time.time(), force_major=True)
    assert report.finished
    assert report.failures == ()
    assert not (log_ids(storage.directory) & (logs - {max(logs)})), "every sparse log is gone"
    check_entries(storage, kept)
    check_counts(storage)
    assert storage.ledger_info(KEPT) == info
    storage.close()
    reopened = LedgerStorage(
        tmp_path / "ledgers", log_size_limit=LOG_SIZE, gc=GcSettings(), disk_space=lambda: ROOMY
    )
    try:
        check_entries(reopened, kept)
        assert reopened.ledger_info(KEPT) == info
    finally:
        reopened.close()


# --- crashes ------------------------------------------------------------------------------

CRASH_SETTINGS = {
    "flush_interval": 0.1,
    "entry_log_size_limit": LOG_SIZE,
    "scrub_interval": 0.0,
    "keep_large_entries_in_journal": False,
}


async def test_a_bookie_crashing_mid_compaction_loses_and_doubles_nothing(tmp_path: Path) -> None:
    uri = init_cluster(tmp_path)
    metrics_ports = {name: free_port() for name in POINTS}
    bookies = {
        name: faulty_bookie(
            uri,
            tmp_path / name,
            f"{name}=crash",
            program=("tests.support.gc_bookie",),
            env={"TALLY_GC_INTERVAL": "0.1"},
            extra=("--metrics-port", str(metrics_ports[name])),
            **CRASH_SETTINGS,
        )
        for name in POINTS
    }
    async with in_process_cluster(tmp_path, 0, uri=uri, **CRASH_SETTINGS) as cluster:
        try:
            await asyncio.gather(*(asyncio.to_thread(b.start) for b in bookies.values()))
            writers = {
                name: RawWriter(b.address, [KEPT, DOOMED_LEDGER]) for name, b in bookies.items()
            }
            # A checkpoint writes its entries sorted by ledger: if all 600 adds fit in one
            # (a fast machine), the doomed ledger gets logs of its own, deleted whole with
            # no compaction to crash in. Rounds of a quarter log, each checkpointed before
            # the next, interleave the two ledgers in every log.
            for _ in range(20):
                await asyncio.gather(*(w.add(30) for w in writers.values()))
                for port in metrics_ports.values():
                    await until(lambda p=port: cached_bytes(p) == 0, "a checkpoint")
            for name, bookie in bookies.items():
                assert writers[name].acknowledged_count == 600
                await until(lambda b=bookie: len(log_ids(b.data_dir / "ledgers")) >= 5, "logs")
            for bookie in bookies.values():
                (bookie.data_dir / DOOMED).write_text(f"{DOOMED_LEDGER.scope} {DOOMED_LEDGER.id}\n")
                (bookie.data_dir / FORCE).write_text("major")
            for name, bookie in bookies.items():
                await asyncio.to_thread(crashed_at, bookie, name)
        finally:
            for bookie in bookies.values():
                bookie.kill()
        for name, process in bookies.items():
            bookie = await cluster.take_over(process)
            kept = writers[name].acknowledged[KEPT]
            assert await read_back(bookie.address, {KEPT: kept}) == len(kept)
            await asyncio.to_thread(_delete, bookie.storage, DOOMED_LEDGER)
            bookie = await cluster.restart(bookie.bookie_id)  # all in the logs: no more moves
            [(_, _, storage)] = list(bookie.storage.storages())
            later = await asyncio.to_thread(_collect, bookie.storage)
            assert later.finished, (name, later)
            assert later.failures == (), (name, later)
            assert later.compacted_entry_logs, (name, later)
            dead = log_ids(storage.directory) - pointed_to(storage) - {storage._log.current_log_id}
            assert not dead, f"{name}: logs no entry is in are left: {dead}"
            done = await asyncio.to_thread(_collect, bookie.storage)
            assert (done.compacted_entry_logs, done.deleted_entry_logs) == ((), ()), (name, done)
            assert await read_back(bookie.address, {KEPT: kept}) == len(kept)
            sizes = [len(entry(KEPT, e)) for e in kept]
            info = bookie.storage.ledger_info(KEPT)
            assert (info.entry_count, info.byte_count) == (len(kept), sum(sizes)), (name, info)
            counted = sum(size for _, _, ledger, size in storage._index.usages() if ledger == KEPT)
            assert counted == sum(RECORD_HEADER_SIZE + size for size in sizes), "counted once"


def cached_bytes(metrics_port: int) -> float:
    """Entry bytes the bookie has not checkpointed yet."""
    return sample(scrape(metrics_port), "bookie_write_cache_bytes")


def pointed_to(storage: LedgerStorage) -> set[int]:
    """The entry logs the index points into for the kept ledger."""
    return {usage_of(location)[1] for _, location in storage._index.ledger_locations(KEPT)}


def _collect(storage: LedgerDirectories) -> GcReport:
    return storage.collect_garbage(time.time(), force_major=True)


def _delete(storage: LedgerDirectories, ledger_id: LedgerId) -> None:
    with contextlib.suppress(NoSuchLedger):
        storage.delete_ledger(ledger_id)
