"""Garbage collection of ledger storage's files: the usage counts, deletion of dead files,
minor and major compaction of entry logs and kept journal files, and what survives failures,
races and SIGKILLs in the middle of it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import rocksdict
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tally.bookie import compactor
from tally.bookie.compactor import GcSettings, usage_of
from tally.bookie.journal import Journal, JournalStats
from tally.bookie.journal_entries import JournalEntries, JournalLocation, kept_location
from tally.bookie.journal_files import journal_files
from tally.bookie.journal_format import JournalMark
from tally.bookie.journal_records import entry_record_head
from tally.bookie.ledger_directories import LedgerDirectory
from tally.bookie.ledger_storage import LedgerStorage
from tally.bookie.metrics import BookieMetrics
from tally.core.compaction import CompactionKind, CompactionPolicy, DiskSpace, FileKind
from tally.core.digest import crc32c
from tally.core.errors import IllegalOperation, NoSuchEntry, NoSuchLedger, WriteFailed
from tally.core.ids import LedgerId

LOG_SIZE = 64 << 10
ROOMY = DiskSpace(10**12, 9 * 10**11)
DAY = 86400.0
Counts = dict[tuple[FileKind, int, LedgerId], int]


def body(ledger_id: LedgerId, entry_id: int, version: int = 0, size: int | None = None) -> bytes:
    """Entry bytes that are a function of (ledger, entry, version); 50 to 1,049 bytes."""
    stamp = f"{ledger_id.scope}/{ledger_id.id}/{entry_id}/{version};".encode()
    length = size if size is not None else 50 + (entry_id * 7919 + ledger_id.id * 31) % 1000
    return (stamp * (length // len(stamp) + 1))[:length]


def add(storage: LedgerStorage, ledger_id: LedgerId, entry_id: int, version: int = 0) -> bytes:
    data = body(ledger_id, entry_id, version)
    storage.add_entry(ledger_id, entry_id, crc32c(data), data, entry_id - 1)
    return data


def opened(directory: Path, **settings: object) -> LedgerStorage:
    return LedgerStorage(
        directory,
        log_size_limit=LOG_SIZE,
        gc=GcSettings(**settings),  # type: ignore[arg-type]
        disk_space=lambda: ROOMY,
    )


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[LedgerStorage]:
    opened_storage = opened(tmp_path / "bookie")
    yield opened_storage
    opened_storage.close()


def truth(storage: LedgerStorage) -> Counts:
    """The usage counts as the index's locations give them."""
    counts: Counts = defaultdict(int)
    for ledger_id, _, location in storage._index.all_locations():
        kind, file_id, size = usage_of(location)
        counts[kind, file_id, ledger_id] += size
    return dict(counts)


def counted(storage: LedgerStorage) -> Counts:
    return {
        (kind, file_id, ledger_id): size
        for kind, file_id, ledger_id, size in storage._index.usages()
        if size
    }


def check_counts(storage: LedgerStorage) -> None:
    """The counts of the ledgers still in the index are exactly what the index points to
    (what these tests do never makes them over-count); a deleted ledger's counts may stay
    until a run looks at their file."""
    present = set(storage._index.ledgers())
    assert {key: size for key, size in counted(storage).items() if key[2] in present} == truth(
        storage
    )


def log_bytes(storage: LedgerStorage) -> int:
    return sum(path.stat().st_size for path in (storage.directory / "logs").glob("*.log"))


def log_ids(storage: LedgerStorage) -> list[int]:
    return storage._log.log_ids()


def check_all(storage: LedgerStorage, model: dict[tuple[LedgerId, int], bytes]) -> None:
    for (ledger_id, entry_id), data in model.items():
        assert storage.get_entry(ledger_id, entry_id) == (crc32c(data), data)


def fill(
    storage: LedgerStorage, ledgers: list[LedgerId], entries: int, rounds: int | None = None
) -> dict[tuple[LedgerId, int], bytes]:
    """Write `entries` entries of each ledger over `rounds` checkpoints (one per two entries
    of each ledger by default, so that the ledgers share every log)."""
    rounds = rounds or max(1, entries // 2)
    model = {}
    per_round = entries // rounds
    for round_number in range(rounds):
        for ledger_id in ledgers:
            for entry_id in range(round_number * per_round, (round_number + 1) * per_round):
                model[ledger_id, entry_id] = add(storage, ledger_id, entry_id)
        storage.checkpoint(round_number.to_bytes(4, "big"))
    return model


def delete(
    storage: LedgerStorage, model: dict[tuple[LedgerId, int], bytes], ledgers: list[LedgerId]
) -> None:
    for ledger_id in ledgers:
        storage.delete_ledger(ledger_id)
    for key in [key for key in model if key[0] in ledgers]:
        del model[key]


LEDGERS = [LedgerId(scope, number) for scope in (0, 9) for number in range(1, 11)]


# -- accounting ---------------------------------------------------------------------------


def test_checkpoints_count_each_ledgers_bytes_in_each_log_and_the_counts_survive_a_reopen(
    storage: LedgerStorage,
) -> None:
    model = fill(storage, LEDGERS[:4], 200, rounds=4)
    assert len(log_ids(storage)) > 3
    assert len(truth(storage)) > 12
    assert counted(storage) == truth(storage)
    for entry_id in range(0, 200, 3):  # replacing re-adds: the old copies' bytes go
        model[LEDGERS[0], entry_id] = add(storage, LEDGERS[0], entry_id, version=1)
    storage.checkpoint(b"re-added")
    assert storage.forget_entries(LEDGERS[1], range(50, 150)) == 100
    for entry_id in range(50, 150):
        del model[LEDGERS[1], entry_id]
    assert counted(storage) == truth(storage)
    storage.close()
    storage = opened(storage.directory)
    assert counted(storage) == truth(storage)
    assert storage._index.unaccounted_files() == set()
    check_all(storage, model)
    storage.close()


def forget_counts(directory: Path) -> None:
    """Make the index look like one written before usage was counted."""
    from tests.support.raw_index import index_families  # this file also runs as a script

    raw = rocksdict.Rdict(
        str(directory / "index"), rocksdict.Options(raw_mode=True), index_families(directory)
    )
    usage = raw.get_column_family("usage")
    for key in list(usage.keys()):
        del usage[key]
    del raw.get_column_family("meta")[b"unaccounted_files"]
    raw.close()
    del usage, raw


@pytest.mark.parametrize("torn", [False, True])
def test_logs_written_before_counting_are_counted_once_by_a_scan(
    storage: LedgerStorage, torn: bool
) -> None:
    model = fill(storage, LEDGERS[:6], 120, rounds=6)
    delete(storage, model, LEDGERS[:2])
    storage.close()
    forget_counts(storage.directory)
    logs = sorted((storage.directory / "logs").glob("*.log"))
    if torn:  # a crash tore the tail of a log: the scan stops there
        with open(logs[1], "ab") as file:
            file.write(b"\x00\x00\x01\x00garbage")
    storage = opened(storage.directory)
    assert storage._index.unaccounted_files() == {(FileKind.ENTRY_LOG, i) for i in log_ids(storage)}
    assert counted(storage) == {}
    report = storage.collect_garbage(time.time())
    assert storage._index.unaccounted_files() == set()
    assert counted(storage) == truth(storage), "live records only, dead ones not counted"
    assert report.deleted_entry_logs == ()
    check_all(storage, model)
    storage.close()


# -- deletion -------------------------------------------------------------------------------


def test_logs_whose_ledgers_are_all_deleted_go_and_the_others_stay(storage: LedgerStorage) -> None:
    doomed, kept = LedgerId(0, 1), LedgerId(0, 2)
    model = fill(storage, [doomed], 400, rounds=1)
    doomed_logs = set(log_ids(storage))
    model.update(fill(storage, [kept], 200, rounds=1))
    mixed = {log_id for (_, log_id, ledger) in truth(storage) if ledger == kept} & doomed_logs
    assert len(doomed_logs - mixed) >= 3
    nothing = storage.collect_garbage(time.time())
    assert nothing.deleted_entry_logs == ()
    assert (min(doomed_logs), 1) in {(f.file_id, f.live_ledgers) for f in nothing.files}
    before = log_bytes(storage)
    delete(storage, model, [doomed])
    report = storage.collect_garbage(time.time())
    gone = set(report.deleted_entry_logs)
    assert gone == set(range(min(gone), max(gone) + 1))
    assert gone.isdisjoint(mixed)
    assert not gone & set(log_ids(storage))
    assert report.compaction is CompactionKind.NONE, "the intervals have not passed"
    assert report.reclaimed_bytes == before - log_bytes(storage)
    assert storage.stats().gc.deleted_entry_logs == len(gone)
    check_all(storage, model)
    with pytest.raises(NoSuchLedger):
        storage.get_entry(doomed, 0)
    assert all(kind is not FileKind.ENTRY_LOG or f not in gone for kind, f, _ in counted(storage))
    storage.close()
    storage = opened(storage.directory)
    check_all(storage, model)
    assert storage.collect_garbage(time.time()).deleted_entry_logs == ()
    storage.close()


def test_the_current_log_is_never_deleted(storage: LedgerStorage) -> None:
    ledger = LedgerId(0, 5)
    fill(storage, [ledger], 10)
    current = storage._log.current_log_id
    assert current is not None
    storage.delete_ledger(ledger)
    assert storage.collect_garbage(time.time(), force_major=True).deleted_entry_logs == ()
    assert current in log_ids(storage)
    storage.close()
    storage = opened(storage.directory)  # no current log after a restart: now it may go
    assert storage.collect_garbage(time.time()).deleted_entry_logs == (current,)
    storage.close()


# -- compaction -----------------------------------------------------------------------------


def test_major_compaction_copies_the_live_entries_and_frees_the_space(
    storage: LedgerStorage,
) -> None:
    model = fill(storage, LEDGERS, 60)
    survivors = LEDGERS[::5]
    delete(storage, model, [ledger for ledger in LEDGERS if ledger not in survivors])
    live = sum(len(data) for data in model.values())
    infos = {ledger: storage.ledger_info(ledger) for ledger in survivors}
    availability = {ledger: storage.availability(ledger) for ledger in survivors}
    before, logs_before = log_bytes(storage), log_ids(storage)
    assert before > 5 * live
    minor = storage.collect_garbage(time.time(), force_minor=True)
    assert minor.compaction is CompactionKind.MINOR
    major = storage.collect_garbage(time.time(), force_major=True)
    assert major.compaction is CompactionKind.MAJOR
    assert major.finished
    compacted = set(minor.compacted_entry_logs) | set(major.compacted_entry_logs)
    assert compacted, "every log was about a fifth live"
    assert set(log_ids(storage)).isdisjoint(compacted)
    assert log_bytes(storage) < 1.6 * live + 2 * LOG_SIZE
    assert minor.moved_bytes <= live, "an entry moves once per run at most"
    assert major.moved_bytes <= live, "(the next run may move it again: it went to a log of old)"
    assert major.moved_entries > 0
    assert major.compaction_bytes_per_second > 0
    check_all(storage, model)
    for ledger in survivors:
        assert storage.ledger_info(ledger) == infos[ledger]
        assert storage.availability(ledger) == availability[ledger]
    check_counts(storage)
    assert max(log_ids(storage)) > max(logs_before), "copied into new logs"
    gc = storage.stats().gc
    assert gc.compacted_entry_logs["major"] == len(major.compacted_entry_logs)
    assert gc.moved_bytes == minor.moved_bytes + major.moved_bytes
    storage.close()
    storage = opened(storage.directory)
    check_all(storage, model)
    for ledger_id, entry_id in [(LEDGERS[1], 0), (LEDGERS[2], 59)]:
        with pytest.raises(NoSuchLedger):
            storage.get_entry(ledger_id, entry_id)
    storage.close()


def test_minor_compaction_leaves_the_logs_that_are_mostly_live(storage: LedgerStorage) -> None:
    sparse = fill(storage, LEDGERS, 40)  # logs about 10 % live after the delete
    delete(storage, sparse, LEDGERS[1:10] + LEDGERS[11:])
    sparse_logs = set(log_ids(storage))
    dense_ledgers = [LedgerId(7, 1), LedgerId(7, 2)]
    dense = fill(storage, dense_ledgers, 300)  # then logs about half live
    delete(storage, dense, dense_ledgers[1:])
    model = {**sparse, **dense}
    report = storage.collect_garbage(time.time(), force_minor=True)
    assert report.compaction is CompactionKind.MINOR
    assert set(report.compacted_entry_logs) <= sparse_logs
    assert report.compacted_entry_logs
    for usage in report.files:
        if usage.file_id in report.compacted_entry_logs:
            assert usage.live_fraction < 0.2
        elif usage.live_ledgers:
            assert usage.live_fraction >= 0.2
    check_all(storage, model)


def test_compaction_runs_when_it_is_due(tmp_path: Path) -> None:
    storage = opened(tmp_path)
    model = fill(storage, LEDGERS, 40)
    delete(storage, model, LEDGERS[4:])
    start = 1_000_000.0
    assert storage.collect_garbage(start).compaction is CompactionKind.NONE
    assert storage.collect_garbage(start + 3599).compaction is CompactionKind.NONE
    minor = storage.collect_garbage(start + 3600)
    assert minor.compaction is CompactionKind.MINOR
    assert minor.compacted_entry_logs
    storage.close()
    storage = opened(tmp_path)  # the times are kept across restarts
    assert storage.collect_garbage(start + 7199).compaction is CompactionKind.NONE
    assert storage.collect_garbage(start + DAY).compaction is CompactionKind.MAJOR
    assert storage.collect_garbage(start + DAY + 1).compaction is CompactionKind.NONE
    check_all(storage, model)
    storage.close()


def test_a_nearly_full_disk_suspends_compaction_but_dead_logs_still_go(tmp_path: Path) -> None:
    full = DiskSpace(10**12, 4 * 10**10)
    storage = LedgerStorage(tmp_path, log_size_limit=LOG_SIZE, disk_space=lambda: full)
    model = fill(storage, LEDGERS, 40)
    dead = fill(storage, [LedgerId(5, 5)], 300, rounds=1)
    delete(storage, model, LEDGERS[2:])
    delete(storage, dead, [LedgerId(5, 5)])
    report = storage.collect_garbage(time.time(), force_major=True)
    assert report.compaction is CompactionKind.NONE
    assert report.suspended is not None
    assert "96% full" in report.suspended
    assert report.deleted_entry_logs
    assert report.compacted_entry_logs == ()
    check_all(storage, model)
    storage.close()
    forcing = GcSettings(policy=CompactionPolicy(force_when_no_space=True))
    storage = LedgerStorage(tmp_path, log_size_limit=LOG_SIZE, gc=forcing, disk_space=lambda: full)
    report = storage.collect_garbage(time.time())
    assert report.compaction is CompactionKind.MAJOR, "forced by the lack of space"
    assert report.compacted_entry_logs
    check_all(storage, model)
    storage.close()


def test_a_run_is_bounded_in_time_and_the_next_one_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compactor, "CHUNK_RECORDS", 10)
    storage = opened(tmp_path, major_max_time=5.0)
    model = fill(storage, LEDGERS, 60)
    delete(storage, model, LEDGERS[3:])
    now = [0.0]
    storage._compactor._clock = lambda: now[0]

    def slow_sleep(seconds: float) -> None:
        now[0] += 1.0  # each chunk "takes" a second

    storage._compactor._sleep = slow_sleep
    storage._compactor.settings = GcSettings(rate_bytes=10**12, major_max_time=5.0)
    first = storage.collect_garbage(1e6, force_major=True)
    assert first.compaction is CompactionKind.MAJOR
    assert not first.finished
    assert 0 < first.moved_entries <= 60
    check_all(storage, model)
    runs = 1
    while not storage.collect_garbage(1e6 + runs, force_major=True).finished:
        runs += 1
        assert runs < 50
        check_all(storage, model)
    assert runs > 1
    check_counts(storage)
    check_all(storage, model)
    storage.close()


def test_compaction_is_rate_limited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compactor, "CHUNK_BYTES", 2000)
    storage = opened(tmp_path, rate_bytes=20_000)
    model = fill(storage, LEDGERS, 40)
    delete(storage, model, LEDGERS[2:])
    waits: list[float] = []
    now = [0.0]  # time passes only while the compaction waits: every byte past the burst does

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    storage._compactor._sleep = sleep
    storage._compactor._clock = lambda: now[0]
    report = storage.collect_garbage(1e6, force_major=True)
    assert report.moved_bytes > 10 * 2000
    assert len(waits) > 10
    assert sum(waits) == pytest.approx((report.moved_bytes - 2000) / 20_000)
    check_all(storage, model)
    storage.close()


def test_the_metrics_show_what_garbage_collection_did(storage: LedgerStorage) -> None:
    model = fill(storage, LEDGERS, 40)
    dead = fill(storage, [LedgerId(5, 5)], 300, rounds=1)
    delete(storage, model, LEDGERS[2:])
    delete(storage, dead, [LedgerId(5, 5)])
    report = storage.collect_garbage(time.time(), force_major=True)
    assert report.deleted_entry_logs
    assert report.compacted_entry_logs
    metrics = BookieMetrics()
    directory = LedgerDirectory(str(storage.directory), failed=False, reason="", ledgers=0)
    metrics.watch(JournalStats, storage.stats, lambda: [directory])
    text = generate_latest(metrics.registry).decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples["bookie_gc_runs_total", ()] == 1
    assert samples["bookie_gc_deleted_entry_logs_total", ()] == len(report.deleted_entry_logs)
    compacted = ("bookie_gc_compacted_entry_logs_total", (("type", "major"),))
    assert samples[compacted] == len(report.compacted_entry_logs)
    reclaimed = sum(
        value for (name, _), value in samples.items() if name == "bookie_gc_reclaimed_bytes_total"
    )
    assert reclaimed == report.reclaimed_bytes
    assert samples["bookie_gc_moved_bytes_total", ()] == report.moved_bytes
    assert samples["bookie_gc_compaction_bytes_per_second", ()] > 0
    every = ("bookie_gc_live_fraction_bucket", (("kind", "entry_log"), ("le", "+Inf")))
    assert samples[every] == len(report.files)
    sparse = ("bookie_gc_live_fraction_bucket", (("kind", "entry_log"), ("le", "0.2")))
    assert 0 < samples[sparse] <= len(report.files)


# -- races ----------------------------------------------------------------------------------


def test_a_re_add_or_a_delete_during_compaction_wins(tmp_path: Path) -> None:
    storage = opened(tmp_path, rate_bytes=10**12)
    model = fill(storage, LEDGERS, 40)
    delete(storage, model, LEDGERS[4:])
    victim, re_added = LEDGERS[1], (LEDGERS[2], 7)
    raced = False

    def race(seconds: float) -> None:
        """Between the scan's look at the index and the move (maintenance not held)."""
        nonlocal raced
        if raced:
            return
        raced = True
        storage.delete_ledger(victim)
        model[re_added] = add(storage, *re_added, version=3)
        storage.checkpoint(b"race")

    storage._compactor._sleep = race
    report = storage.collect_garbage(time.time(), force_major=True)
    assert raced
    assert report.finished
    delete_from_model = [key for key in model if key[0] == victim]
    for key in delete_from_model:
        del model[key]
    with pytest.raises(NoSuchLedger):
        storage.get_entry(victim, 0)
    check_all(storage, model)
    assert storage.get_entry(*re_added)[1] == body(*re_added, version=3)
    check_counts(storage)
    storage.close()


def test_a_read_that_raced_a_compaction_looks_the_entry_up_again(storage: LedgerStorage) -> None:
    model = fill(storage, LEDGERS, 30)
    delete(storage, model, LEDGERS[2:])
    entry = (LEDGERS[1], 11)
    stale = storage._index.location(*entry)
    report = storage.collect_garbage(time.time(), force_major=True)
    assert stale is not None
    assert stale.log_id in report.compacted_entry_logs  # type: ignore[union-attr]
    looked_up = storage._index.location
    calls = []

    def first_stale(ledger_id: LedgerId, entry_id: int):  # type: ignore[no-untyped-def]
        calls.append((ledger_id, entry_id))
        return stale if len(calls) == 1 else looked_up(ledger_id, entry_id)

    storage._index.location = first_stale  # type: ignore[method-assign]
    assert storage.get_entry(*entry)[1] == model[entry]
    assert len(calls) == 2
    calls.clear()
    storage.delete_ledger(entry[0])
    with pytest.raises(NoSuchLedger):  # deleted meanwhile: absent, never unreadable
        storage.get_entry(*entry)
    storage._index.location = looked_up  # type: ignore[method-assign]
    assert storage.stats().read_errors == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_adds_reads_and_checkpoints_go_on_during_compaction(tmp_path: Path, seed: int) -> None:
    storage = opened(tmp_path)
    rng = random.Random(seed)
    model = fill(storage, LEDGERS, 40)
    delete(storage, model, LEDGERS[5:])
    next_entry = dict.fromkeys(LEDGERS[:5], 40)
    stop = threading.Event()
    errors: list[BaseException] = []
    reports = []

    def collector() -> None:
        try:
            while not stop.is_set():
                reports.append(storage.collect_garbage(time.time(), force_major=True))
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    def checkpointer() -> None:
        try:
            marks = 0
            while not stop.is_set():
                marks += 1
                storage.checkpoint(marks.to_bytes(4, "big"))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=collector), threading.Thread(target=checkpointer)]
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        step = 0
        while (len(reports) < 4 or step < 3000) and time.monotonic() < deadline:
            step += 1
            ledger = rng.choice(LEDGERS[:5])
            action = rng.random()
            if action < 0.4:
                entry_id = next_entry[ledger]
                next_entry[ledger] += 1
                model[ledger, entry_id] = add(storage, ledger, entry_id)
            elif action < 0.5:
                entry_id = rng.randrange(next_entry[ledger])
                model[ledger, entry_id] = add(storage, ledger, entry_id, rng.randrange(1, 5))
            else:
                entry_id = rng.randrange(next_entry[ledger])
                data = model[ledger, entry_id]
                assert storage.get_entry(ledger, entry_id) == (crc32c(data), data)
            if step % 200 == 0:
                time.sleep(0.001)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        sys.setswitchinterval(switch_interval)
    assert not errors, errors
    assert len(reports) >= 4, f"{len(reports)} garbage collection runs in 60 s"
    assert sum(report.moved_entries for report in reports) > 0
    assert storage.stats().read_errors == 0
    storage.checkpoint(b"last")
    check_all(storage, model)
    check_counts(storage)
    storage.close()
    storage = opened(tmp_path)
    check_all(storage, model)
    storage.close()


def test_closing_the_storage_stops_a_run(tmp_path: Path) -> None:
    storage = opened(tmp_path, rate_bytes=10**12)
    model = fill(storage, LEDGERS, 40)
    delete(storage, model, LEDGERS[3:])
    storage._compactor._sleep = lambda seconds: storage.close()  # between two chunks
    with pytest.raises(IllegalOperation, match="closing"):
        storage.collect_garbage(time.time(), force_major=True)
    storage = opened(tmp_path)
    check_all(storage, model)
    assert storage.collect_garbage(time.time(), force_major=True).finished
    check_all(storage, model)
    storage.close()


# -- failures between the steps -------------------------------------------------------------


@pytest.mark.parametrize("step", ["fdatasync", "index write", "index sync", "unlink"])
def test_a_failure_at_any_step_of_a_compaction_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    storage = opened(tmp_path)
    model = fill(storage, LEDGERS, 40)
    delete(storage, model, LEDGERS[3:])
    index, log = storage._index, storage._log

    def fail(*args: object) -> None:
        raise WriteFailed(f"injected failure at the {step}")

    with monkeypatch.context() as patch:
        if step == "fdatasync":  # of the copies

            def no_fdatasync(fd: int) -> None:
                raise OSError(5, "Input/output error")

            patch.setattr(os, "fdatasync", no_fdatasync)
        elif step == "index write":  # of the batch that points at the copies, once synced
            flush, write = log.flush, index.write
            flushed = []

            def flush_then_arm() -> None:
                flush()
                flushed.append(True)

            def write_unless_armed(batch: object) -> None:
                if flushed:
                    fail()
                write(batch)  # type: ignore[arg-type]

            patch.setattr(log, "flush", flush_then_arm)
            patch.setattr(index, "write", write_unless_armed)
        elif step == "index sync":  # before the old file goes
            patch.setattr(index, "sync", fail)
        else:
            patch.setattr(log, "delete_log", fail)
        with pytest.raises(WriteFailed):
            storage.collect_garbage(time.time(), force_major=True)
    check_all(storage, model)
    storage.close()  # as a crash would: no checkpoint
    storage = opened(tmp_path)
    check_all(storage, model)
    report = storage.collect_garbage(time.time(), force_major=True)
    assert report.finished
    assert report.compacted_entry_logs
    check_all(storage, model)
    check_counts(storage)
    storage.close()


# -- kept journal files ---------------------------------------------------------------------

LARGE = 20 << 10


async def journaled(
    directory: Path, entries: list[tuple[LedgerId, int, bytes]]
) -> list[JournalMark]:
    """Journal the entries as the bookie does, in journal files of about 128 KiB."""
    journal = Journal(directory, file_size=128 << 10, preallocate_size=64 << 10)
    for _ in journal.replay():
        pass
    await journal.start()
    marks = [
        journal.append_nowait(entry_record_head(ledger_id, entry_id, -1, crc32c(data)) + data)
        for ledger_id, entry_id, data in entries
    ]
    done = list(await asyncio.gather(*marks))
    await journal.close()
    return done


DOOMED_ALONE = LedgerId(3, 3)


def with_kept_entries(
    tmp_path: Path,
) -> tuple[
    LedgerStorage,
    dict[tuple[LedgerId, int], bytes],
    list[tuple[LedgerId, int, bytes]],
    list[JournalMark],
]:
    """Storage whose large entries stay in journal files of ~128 KiB: the first files mix
    four ledgers, the next hold DOOMED_ALONE only, the last the checkpoint's mark."""
    entries = []
    for entry_id in range(12):
        for ledger_id in LEDGERS[:4]:
            entries.append((ledger_id, entry_id, body(ledger_id, entry_id, size=LARGE)))
    entries += [(DOOMED_ALONE, e, body(DOOMED_ALONE, e, size=LARGE)) for e in range(30)]
    entries.append((LEDGERS[0], 99, b"the checkpoint's mark is in the last file"))
    marks = asyncio.run(journaled(tmp_path / "journal", entries))
    storage = opened_with_journal(tmp_path)
    model = {}
    for (ledger_id, entry_id, data), mark in zip(entries, marks, strict=True):
        storage.add_entry(ledger_id, entry_id, crc32c(data), data, -1)
        location = kept_location(mark, len(data), crc32c(data))
        if location is not None:
            storage.keep_in_journal(ledger_id, entry_id, location)
        model[ledger_id, entry_id] = data
    storage.checkpoint(marks[-1].to_bytes())
    return storage, model, entries, marks


def opened_with_journal(tmp_path: Path) -> LedgerStorage:
    return LedgerStorage(
        tmp_path / "ledgers",
        log_size_limit=LOG_SIZE,
        journal_entries=JournalEntries(tmp_path / "journal"),
        disk_space=lambda: ROOMY,
    )


def test_kept_journal_files_are_released_or_compacted(tmp_path: Path) -> None:
    storage, model, entries, marks = with_kept_entries(tmp_path)
    journal_dir = tmp_path / "journal"
    doomed_alone = DOOMED_ALONE
    kept = storage.kept_journal_files()
    assert len(kept) >= 8
    assert counted(storage) == truth(storage)
    deleted = [doomed_alone, *LEDGERS[1:4]]
    last = marks[-1].file_id
    survivor_files = {
        m.file_id for (ledger, _, _), m in zip(entries, marks, strict=True) if ledger == LEDGERS[0]
    }
    only_doomed = kept - survivor_files - {last}
    assert len(only_doomed) >= 3
    delete(storage, model, deleted)
    report = storage.collect_garbage(time.time(), force_major=True)
    assert set(report.released_journal_files) == only_doomed
    compacted = set(report.compacted_journal_files)
    assert compacted == survivor_files - {last}, "those files were a quarter live"
    assert storage.kept_journal_files() == kept - only_doomed - compacted
    assert storage.stats().gc.released_journal_files == len(only_doomed)
    check_all(storage, model)
    for entry_id in range(12):
        location = storage._index.location(LEDGERS[0], entry_id)
        assert not isinstance(location, JournalLocation) or location.file_id not in compacted
    check_counts(storage)
    # the journal's next release deletes them
    released = Journal(journal_dir).release_before(marks[-1], keep=storage.kept_journal_files())
    assert {int(path.stem, 16) for path in released} == only_doomed | compacted
    assert {file_id for file_id, _ in journal_files(journal_dir)}.isdisjoint(
        only_doomed | compacted
    )
    check_all(storage, model)
    storage.close()
    storage = LedgerStorage(
        tmp_path / "ledgers", log_size_limit=LOG_SIZE, journal_entries=JournalEntries(journal_dir)
    )
    check_all(storage, model)
    with pytest.raises(NoSuchLedger):
        storage.get_entry(doomed_alone, 0)
    with pytest.raises(NoSuchEntry):
        storage.get_entry(LEDGERS[0], 12)
    storage.close()


def test_kept_journal_files_written_before_counting_are_counted_by_a_scan(tmp_path: Path) -> None:
    storage, model, _, _ = with_kept_entries(tmp_path)
    delete(storage, model, [LEDGERS[1]])
    storage.close()
    forget_counts(tmp_path / "ledgers")
    storage = opened_with_journal(tmp_path)
    kept = storage.kept_journal_files()
    unaccounted = storage._index.unaccounted_files()
    assert unaccounted is not None
    assert {file_id for kind, file_id in unaccounted if kind is FileKind.JOURNAL} == kept
    storage.collect_garbage(time.time())
    remaining = storage._index.unaccounted_files()
    assert remaining is not None
    assert {file_id for kind, file_id in remaining if kind is FileKind.JOURNAL} == {max(kept)}, (
        "the file of the checkpoint's mark waits until a later mark"
    )
    present = set(storage._index.ledgers())
    assert {key: size for key, size in counted(storage).items() if key[2] in present} == {
        key: size for key, size in truth(storage).items() if key[:2] not in remaining
    }
    check_all(storage, model)
    storage.close()


# -- SIGKILL in the middle of it ------------------------------------------------------------

CRASH_LEDGERS = [LedgerId(0, number) for number in range(1, 13)]
CRASH_ENTRIES = 30


def crash_round(round_number: int) -> tuple[list[LedgerId], list[LedgerId]]:
    """The ledgers written in a round, and those deleted at its end."""
    written = [CRASH_LEDGERS[(round_number + i) % len(CRASH_LEDGERS)] for i in range(6)]
    written = [LedgerId(round_number, ledger.id) for ledger in written]
    doomed = written[1:5] if round_number % 2 else written[:3]
    return written, doomed


def crash_child(directory: Path) -> None:
    """Rounds of adds, a checkpoint, deletes and a forced major compaction, going on from
    the last round checkpointed (whose deletes it makes again: they may not have happened)."""
    storage = opened(directory)
    mark = storage.last_checkpoint_mark()
    done = int.from_bytes(mark, "big") if mark else 0
    for ledger_id in crash_round(done)[1] if done else []:
        with contextlib.suppress(NoSuchLedger):
            storage.delete_ledger(ledger_id)
    round_number = done + 1
    while True:
        written, doomed = crash_round(round_number)
        for entry_id in range(CRASH_ENTRIES):
            for ledger_id in written:
                add(storage, ledger_id, entry_id)
        storage.checkpoint(round_number.to_bytes(8, "big"))
        for ledger_id in doomed:
            storage.delete_ledger(ledger_id)
        print(round_number, flush=True)
        storage.collect_garbage(time.time(), force_major=True)
        round_number += 1


def test_sigkill_during_garbage_collection_loses_no_live_entry(tmp_path: Path) -> None:
    rng = random.Random(11)
    directory = tmp_path / "bookie"
    for attempt in range(8):
        child = subprocess.Popen(
            [sys.executable, __file__, str(directory)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        first = None
        while True:
            line = child.stdout.readline()
            assert line, f"the child ended early with {child.wait()}"
            first = first or int(line)
            if int(line) >= first + 2:
                break
        time.sleep(rng.uniform(0, 0.2))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        storage = opened(directory)
        mark = storage.last_checkpoint_mark()
        assert mark is not None
        done = int.from_bytes(mark, "big")
        for round_number in range(1, done + 1):
            written, doomed = crash_round(round_number)
            for ledger_id in written:
                if ledger_id in doomed:
                    if round_number < done:
                        with pytest.raises(NoSuchLedger):
                            storage.get_entry(ledger_id, 0)
                    continue
                for entry_id in range(CRASH_ENTRIES):
                    data = body(ledger_id, entry_id)
                    assert storage.get_entry(ledger_id, entry_id) == (crc32c(data), data), (
                        attempt,
                        round_number,
                    )
        check_counts(storage)
        storage.close()


if __name__ == "__main__":
    crash_child(Path(sys.argv[1]))
