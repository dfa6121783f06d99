"""Scrubbing ledger storage: every stored entry read back and checked, corrupt copies marked
(kept, answered as EntryCorrupt, never NoSuchEntry) until a good copy is written over them,
the passes recorded across restarts, and no false alarm from entries that compaction moves."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tally.bookie import scrubber
from tally.bookie.compactor import GcSettings
from tally.bookie.entry_log import RECORD_HEADER_SIZE, Location, log_file_name
from tally.bookie.index import FoundBy
from tally.bookie.journal_entries import JournalLocation
from tally.bookie.journal_format import file_name
from tally.bookie.ledger_storage import LedgerStorage
from tally.bookie.scrubber import HEADROOM, Verdict, _LogReads
from tally.core.digest import crc32c
from tally.core.errors import (
    EntryCorrupt,
    EntryUnreadable,
    IllegalOperation,
    NoSuchEntry,
    NoSuchLedger,
)
from tally.core.ids import LedgerId
from tally.core.scrub import ScrubTrigger
from tests.bookie.test_compactor import (
    LEDGERS,
    LOG_SIZE,
    ROOMY,
    add,
    body,
    check_all,
    delete,
    fill,
    opened_with_journal,
    with_kept_entries,
)

EVERYTHING = 1 << 40
Found = list[tuple[LedgerId, list[int]]]


def opened(directory: Path, found: Found | None = None) -> LedgerStorage:
    return LedgerStorage(
        directory,
        log_size_limit=LOG_SIZE,
        gc=GcSettings(),
        disk_space=lambda: ROOMY,
        on_corrupt=None
        if found is None
        else lambda ledger, entries: found.append((ledger, entries)),
    )


def scrub_pass(storage: LedgerStorage, budget: int = EVERYTHING, **options: bool):  # type: ignore[no-untyped-def]
    """Steps until the pass under way (or a new one) is complete; the complete pass."""
    for _ in range(100_000):
        step = storage.scrub(budget, **options)
        if step.scrub.complete:
            return step.scrub
    raise AssertionError("the pass never ended")


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0x5A]))


def flip_entry(storage: LedgerStorage, ledger_id: LedgerId, entry_id: int, within: int) -> None:
    """Flip a byte of the entry's stored copy, `within` bytes into its record (its header
    for an entry log record below RECORD_HEADER_SIZE). Not in the last block of the log
    being written while it is open: its direct writes would write that block again."""
    location = storage._index.location(ledger_id, entry_id)
    if isinstance(location, JournalLocation):
        assert storage._journal is not None
        flip(storage._journal.directory / file_name(location.file_id), location.offset + within)
    else:
        assert isinstance(location, Location)
        flip(storage.directory / "logs" / log_file_name(location.log_id), location.offset + within)


def test_a_pass_over_healthy_storage_checks_every_entry_and_finds_nothing(tmp_path: Path) -> None:
    storage = opened(tmp_path / "bookie")
    model = fill(storage, LEDGERS[:6], 30)
    first = scrub_pass(storage)
    assert first.entries == len(model)
    assert first.bytes >= sum(len(data) + RECORD_HEADER_SIZE for data in model.values())
    assert (first.corrupt, first.unreadable) == (0, 0)
    assert first.trigger is ScrubTrigger.SCHEDULE
    assert first.ended is not None
    assert first.ended >= first.started
    assert storage.corrupt_entries() == []
    stats = storage.stats().scrub
    assert (stats.entries, stats.passes, stats.last_complete) == (len(model), 1, first.ended)
    storage.close()


def test_flipped_bytes_in_entry_logs_are_found_marked_and_answered_as_corrupt(
    tmp_path: Path,
) -> None:
    found: Found = []
    storage = opened(tmp_path / "bookie")
    model = fill(storage, LEDGERS[:4], 30)
    storage.close()
    # stopped: the bytes of one entry, and the header of another (it names another entry)
    bad_bytes, bad_header = (LEDGERS[1], 7), (LEDGERS[2], 20)
    storage = opened(tmp_path / "bookie", found)
    flip_entry(storage, *bad_bytes, within=RECORD_HEADER_SIZE + 3)
    flip_entry(storage, *bad_header, within=RECORD_HEADER_SIZE - 1)
    done = scrub_pass(storage, budget=64 << 10)
    assert (done.entries, done.corrupt, done.unreadable) == (len(model), 2, 0)
    assert found == [(bad_bytes[0], [bad_bytes[1]]), (bad_header[0], [bad_header[1]])]
    listed = storage.corrupt_entries()
    assert [(c.ledger_id, c.entry_id) for c in listed] == [bad_bytes, bad_header]
    assert all(c.mark.found_by is FoundBy.SCRUBBER for c in listed)
    assert [c.entry_id for c in storage.corrupt_entries(bad_bytes[0])] == [bad_bytes[1]]
    assert storage.corrupt_entries(LEDGERS[0]) == []
    for key in (bad_bytes, bad_header):
        with pytest.raises(EntryCorrupt, match="found corrupt by the scrubber") as raised:
            storage.get_entry(*key)
        assert isinstance(raised.value, EntryUnreadable)
        assert not isinstance(raised.value, NoSuchEntry)
        del model[key]
    check_all(storage, model)
    assert storage._index.location(*bad_bytes) is not None, "the index keeps it"
    assert bad_bytes[1] not in storage.availability(bad_bytes[0]), "but cannot serve it"
    assert bad_bytes[1] - 1 in storage.availability(bad_bytes[0])
    stats = storage.stats()
    assert (stats.corrupt_entries, stats.corrupt_marked[FoundBy.SCRUBBER]) == (2, 2)
    assert stats.scrub.corrupt == 2
    # while running: another flip, found by the next pass; the known ones again, not new
    flip_entry(storage, LEDGERS[3], 0, within=RECORD_HEADER_SIZE)
    again = scrub_pass(storage)
    assert again.corrupt == 3
    assert found[2:] == [(LEDGERS[3], [0])]
    assert storage.stats().corrupt_marked[FoundBy.SCRUBBER] == 3
    storage.close()


@pytest.mark.parametrize(
    ("within", "what"),
    [(0, "its length's top byte: past the end"), (3, "its length's low byte: a wrong path")],
)
def test_a_rotten_record_length_loses_no_entry_past_it(
    tmp_path: Path, within: int, what: str
) -> None:
    """The parse of the log cannot go on (or goes astray) past a record whose length rotted:
    the entries the index places in the log that the parse did not find are read alone."""
    found: Found = []
    storage = opened(tmp_path / "bookie")
    model = fill(storage, LEDGERS[:3], 30)
    storage.close()
    storage = opened(tmp_path / "bookie", found)
    victim = (LEDGERS[1], 4)
    flip_entry(storage, *victim, within=within)
    done = scrub_pass(storage)
    assert (done.entries, done.corrupt, done.unreadable) == (len(model), 1, 0), what
    assert found == [(victim[0], [victim[1]])]
    with pytest.raises(EntryCorrupt, match="found corrupt by the scrubber"):
        storage.get_entry(*victim)
    del model[victim]
    check_all(storage, model)
    storage.close()


@pytest.mark.parametrize(
    ("budget", "full_speed"),
    [(EVERYTHING, False), (EVERYTHING, True), (700, True)],
    ids=["scheduled", "full-speed", "full-speed-in-small-steps"],
)
def test_records_longer_than_a_read_are_checked_in_pieces(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    budget: int,
    full_speed: bool,
) -> None:
    """Reads of 256 bytes: most records go on past a read (and past the read ahead of a
    pass at full speed, kept from step to step); every one is checked once, in the parse
    (which never loses its way, so nothing is left to the counts' check)."""
    monkeypatch.setattr(scrubber, "READ_BYTES", 256)
    storage = opened(tmp_path / "bookie")
    model = fill(storage, LEDGERS[:2], 20)
    storage.close()
    storage = opened(tmp_path / "bookie")
    victims = [(LEDGERS[0], 9), (LEDGERS[0], 10), (LEDGERS[1], 3)]
    for victim in victims:
        assert len(model[victim]) > 256 or victim == (LEDGERS[1], 3)
        flip_entry(storage, *victim, within=RECORD_HEADER_SIZE + len(model[victim]) - 1)
    with caplog.at_level(logging.WARNING):
        done = scrub_pass(storage, budget, full_speed=full_speed)
    assert "no record can be parsed" not in caplog.text
    assert (done.entries, done.corrupt) == (len(model), len(victims))
    assert [(c.ledger_id, c.entry_id) for c in storage.corrupt_entries()] == sorted(victims)
    storage.close()


def test_a_log_compacted_away_before_its_padding_is_read_ends_the_file_not_the_step(
    tmp_path: Path,
) -> None:
    """A pass reaches the zeros that pad a log's last block and reads them to tell padding
    from damage; compaction has deleted the log just before (its entries moved on). Found
    by a chaos run: the step failed, and an operator's pass (`--now`) waited a minute for
    each retry; the log is done with instead."""
    storage = opened(tmp_path / "bookie")
    fill(storage, LEDGERS[:4], 40)
    read_span = storage._log.read_span
    deleted: list[int] = []

    def deleted_meanwhile(log_id: int, offset: int, into: memoryview) -> int | None:
        end = storage._log.readable_end(log_id)
        at_padding = end is not None and offset + len(into) == end and len(into) < 4096
        if at_padding and not deleted and log_id != storage._log.current_log_id:
            deleted.append(log_id)
            storage._log.delete_log(log_id)  # as compaction does, once the index moved on
        return read_span(log_id, offset, into)

    storage._log.read_span = deleted_meanwhile  # type: ignore[method-assign]
    done = scrub_pass(storage)
    assert deleted, "no padding was read"
    assert (done.corrupt, done.unreadable) == (0, 0)
    storage.close()


def test_records_the_index_no_longer_points_at_are_skipped_inside_a_run_even_when_rotten(
    tmp_path: Path,
) -> None:
    """A run of records of one ledger is checked against the index at once: entries
    re-added since (their old records are garbage in the middle of the run), entries
    forgotten, and a deleted ledger's records are not counted, and their rot is no alarm;
    rot in the middle of a run is found, and the records around it still count."""
    storage = opened(tmp_path / "bookie")
    model = fill(storage, LEDGERS[:4], 40, rounds=1)
    replaced = [(LEDGERS[0], entry_id) for entry_id in (3, 4, 17)]
    old = {key: storage._index.location(*key) for key in replaced}
    for key in replaced:
        model[key] = add(storage, *key, version=1)
    storage.checkpoint(b"re-added")
    assert storage.forget_entries(LEDGERS[1], [20, 21]) == 2
    for entry_id in (20, 21):
        del model[LEDGERS[1], entry_id]
    gone = storage._index.location(LEDGERS[3], 5)
    delete(storage, model, [LEDGERS[3]])
    assert scrub_pass(storage).entries == len(model)
    logs = storage.directory / "logs"
    for location in [*old.values(), gone]:
        assert isinstance(location, Location)
        flip(logs / log_file_name(location.log_id), location.offset + RECORD_HEADER_SIZE + 1)
    flip_entry(storage, LEDGERS[2], 30, within=RECORD_HEADER_SIZE + 2)
    second = scrub_pass(storage)
    assert (second.entries, second.corrupt) == (len(model), 1)
    assert [(mark.ledger_id, mark.entry_id) for mark in storage.corrupt_entries()] == [
        (LEDGERS[2], 30)
    ]
    del model[LEDGERS[2], 30]
    check_all(storage, model)
    storage.close()


def test_a_corrupt_entry_kept_in_a_journal_file_is_found(tmp_path: Path) -> None:
    storage, model, _, _ = with_kept_entries(tmp_path)
    found: Found = []
    storage._on_corrupt = lambda ledger, entries: found.append((ledger, entries))
    victim = (LEDGERS[2], 5)
    assert isinstance(storage._index.location(*victim), JournalLocation)
    flip_entry(storage, *victim, within=100)
    done = scrub_pass(storage)
    assert (done.entries, done.corrupt) == (len(model), 1)
    assert found == [(victim[0], [victim[1]])]
    with pytest.raises(EntryCorrupt):
        storage.get_entry(*victim)
    del model[victim]
    check_all(storage, model)
    storage.close()
    storage = opened_with_journal(tmp_path)
    with pytest.raises(EntryCorrupt, match="journal file"):
        storage.get_entry(*victim)
    storage.close()


def test_a_read_that_finds_a_bad_copy_marks_it(tmp_path: Path) -> None:
    found: Found = []
    storage = opened(tmp_path / "bookie", found)
    model = fill(storage, LEDGERS[:2], 10)
    victim = (LEDGERS[0], 3)
    flip_entry(storage, *victim, within=RECORD_HEADER_SIZE + 1)
    with pytest.raises(EntryCorrupt, match="CRC32C"):
        storage.get_entry(*victim)
    assert found == [(victim[0], [victim[1]])]
    [listed] = storage.corrupt_entries()
    assert (listed.ledger_id, listed.entry_id, listed.mark.found_by) == (*victim, FoundBy.READ)
    with pytest.raises(EntryCorrupt, match="found corrupt by the read"):
        storage.get_entry(*victim)
    assert found == [(victim[0], [victim[1]])], "reported once"
    done = scrub_pass(storage)
    assert done.corrupt == 1
    assert storage.corrupt_entries() == [listed], "the scrubber keeps the read's mark"
    assert storage.stats().read_errors == 2
    del model[victim]
    check_all(storage, model)
    storage.close()


def test_marks_and_passes_survive_a_restart_and_a_pass_goes_on_where_it_was(
    tmp_path: Path,
) -> None:
    storage = opened(tmp_path / "bookie")
    model = fill(storage, LEDGERS[:5], 40, rounds=4)
    storage.close()
    storage = opened(tmp_path / "bookie")
    victim = (LEDGERS[4], 39)
    flip_entry(storage, *victim, within=RECORD_HEADER_SIZE)
    first = scrub_pass(storage)
    assert first.corrupt == 1
    storage.close()
    storage = opened(tmp_path / "bookie")
    current, passes = storage.scrub_passes()
    assert current is None
    assert passes == [first]
    assert storage.stats().scrub.last_complete == first.ended
    [listed] = storage.corrupt_entries()
    assert (listed.ledger_id, listed.entry_id) == victim
    with pytest.raises(EntryCorrupt):
        storage.get_entry(*victim)
    # a second pass, stopped after a few steps, goes on after a restart
    for _ in range(3):
        step = storage.scrub(2000)
        assert not step.scrub.complete
    storage.close()
    storage = opened(tmp_path / "bookie")
    current, passes = storage.scrub_passes()
    assert current is not None
    assert 0 < current.entries < len(model)
    second = scrub_pass(storage, budget=2000)
    assert second.started == current.started
    assert second.entries == len(model), "no entry checked twice, none left out"
    assert second.corrupt == 1
    assert storage.scrub_passes() == (None, [first, second])
    storage.close()


def test_a_pass_under_a_write_load_ends_and_leaves_the_new_files_to_the_next(
    tmp_path: Path,
) -> None:
    storage = opened(tmp_path / "bookie")
    model = fill(storage, LEDGERS[:4], 40)
    logs_at_start = storage._log.log_ids()
    entry_id, steps = 1000, 0
    while not (step := storage.scrub(4 << 10)).scrub.complete:
        # each step, more new bytes than it reads: the logs grow faster than the pass goes
        for ledger_id in LEDGERS[:4]:
            for added in range(entry_id, entry_id + 20):
                model[ledger_id, added] = add(storage, ledger_id, added)
        entry_id += 20
        storage.checkpoint(b"step %d" % steps)
        steps += 1
        assert steps < 1000, "the pass chases the new logs"
    assert max(storage._log.log_ids()) > max(logs_at_start) + 1
    assert 160 <= step.scrub.entries < len(model)
    assert step.scrub.corrupt == 0
    assert scrub_pass(storage, budget=1 << 30).entries == len(model), "the next pass reads them"
    check_all(storage, model)
    storage.close()


def test_an_operator_pass_runs_at_full_speed_and_says_so(tmp_path: Path) -> None:
    storage = opened(tmp_path / "bookie")
    fill(storage, LEDGERS[:2], 10)
    step = storage.scrub(100)
    assert step.scrub.trigger is ScrubTrigger.SCHEDULE
    assert scrub_pass(storage, full_speed=True).trigger is ScrubTrigger.OPERATOR
    assert scrub_pass(storage, full_speed=True).trigger is ScrubTrigger.OPERATOR
    assert len(storage.scrub_passes()[1]) == 2
    storage.close()


def test_a_plain_re_add_also_ends_a_mark_and_a_delete_or_forget_drops_them(
    tmp_path: Path,
) -> None:
    storage = opened(tmp_path / "bookie")
    model = fill(storage, LEDGERS[:3], 10)
    bad = [(LEDGERS[0], 1), (LEDGERS[1], 2), (LEDGERS[1], 3), (LEDGERS[2], 4)]
    for key in bad:
        flip_entry(storage, *key, within=RECORD_HEADER_SIZE)
    assert scrub_pass(storage).corrupt == 4
    model[bad[0]] = add(storage, *bad[0], version=2)
    storage.checkpoint(b"re-added")
    storage.delete_ledger(LEDGERS[1])
    assert storage.forget_entries(LEDGERS[2], [4]) == 1
    assert storage.corrupt_entries() == []
    assert storage.stats().corrupt_entries == 0
    with pytest.raises(NoSuchLedger):
        storage.get_entry(*bad[1])
    with pytest.raises(NoSuchEntry):
        storage.get_entry(*bad[3])
    assert storage.get_entry(*bad[0])[1] == model[bad[0]]
    storage.close()
    storage = opened(tmp_path / "bookie")
    assert storage.corrupt_entries() == []
    storage.close()


def test_a_marked_copy_that_checks_out_again_is_unmarked(tmp_path: Path) -> None:
    """A read that went wrong on the way (say) must not leave a good copy unusable."""
    storage = opened(tmp_path / "bookie")
    model = fill(storage, LEDGERS[:1], 10)
    victim = (LEDGERS[0], 6)
    flip_entry(storage, *victim, within=RECORD_HEADER_SIZE + 5)
    with pytest.raises(EntryCorrupt):
        storage.get_entry(*victim)
    flip_entry(storage, *victim, within=RECORD_HEADER_SIZE + 5)  # back as it was
    assert scrub_pass(storage).corrupt == 0
    assert storage.corrupt_entries() == []
    check_all(storage, model)
    storage.close()


def test_entries_moved_by_compaction_under_the_scrubber_are_not_corrupt(tmp_path: Path) -> None:
    """Compaction moves the entries of the log the scrubber has just read, and deletes it:
    the records it then checks are not where the index points any more, and a rotten copy
    found where it still pointed is looked up again, and found moved."""
    storage = opened(tmp_path / "bookie")
    model = fill(storage, LEDGERS[:8], 40)
    delete(storage, model, LEDGERS[2:8])
    read_span = storage._log.read_span
    settle = storage._settle
    compacted: list[int] = []
    settled: list[Verdict] = []

    def then_compact(log_id: int, offset: int, into: memoryview) -> int | None:
        read = read_span(log_id, offset, into)
        if not compacted:
            report = storage.collect_garbage(time.time(), force_major=True)
            compacted.extend(report.compacted_entry_logs)
            assert log_id in compacted
            assert read is not None
            # as if a byte had rotted in a record of it: looked up again, found moved
            victim = next(key for key in model if storage._index.location(*key) is not None)
            stale = Location(log_id, offset, 100)
            settled.append(settle(*victim, stale, True, "a test's stale copy"))
        return read

    storage._log.read_span = then_compact  # type: ignore[method-assign]
    done = scrub_pass(storage, budget=8 << 10)
    assert compacted
    assert settled == [Verdict.HEALTHY]
    assert (done.corrupt, done.unreadable) == (0, 0)
    assert storage.corrupt_entries() == []
    check_all(storage, model)
    storage.close()


def test_scrubbing_while_compacting_adding_and_checkpointing_finds_nothing(
    tmp_path: Path,
) -> None:
    storage = opened(tmp_path / "bookie")
    model = fill(storage, LEDGERS, 40)
    delete(storage, model, LEDGERS[1::2])
    stop = threading.Event()
    problems: list[BaseException] = []

    def scrubbing() -> None:
        try:
            while not stop.is_set():
                storage.scrub(8 << 10)
        except BaseException as error:
            problems.append(error)

    scrubber = threading.Thread(target=scrubbing)
    scrubber.start()
    try:
        for round_number in range(3):
            for ledger_id in LEDGERS[:6:2]:
                for entry_id in range(40 + 5 * round_number, 45 + 5 * round_number):
                    model[ledger_id, entry_id] = add(storage, ledger_id, entry_id)
                model[ledger_id, 3] = add(storage, ledger_id, 3, version=round_number + 1)
            storage.checkpoint(b"round %d" % round_number)
            storage.collect_garbage(time.time(), force_major=True)
    finally:
        stop.set()
        scrubber.join()
    assert problems == []
    done = scrub_pass(storage, budget=8 << 10)
    assert (done.corrupt, done.unreadable) == (0, 0)
    assert storage.stats().scrub.corrupt == 0
    assert storage.corrupt_entries() == []
    check_all(storage, model)
    storage.close()


def test_compaction_never_copies_a_corrupt_record_and_compacts_the_file_once_it_is_repaired(
    tmp_path: Path,
) -> None:
    found: Found = []
    storage = opened(tmp_path / "bookie", found)
    model = fill(storage, LEDGERS[:4], 40)
    victim = (LEDGERS[0], 12)
    flip_entry(storage, *victim, within=RECORD_HEADER_SIZE + 9)
    location = storage._index.location(*victim)
    assert isinstance(location, Location)
    delete(storage, model, LEDGERS[1:4])
    report = storage.collect_garbage(time.time(), force_major=True)
    assert any("cannot be read through" in failure for failure in report.failures)
    assert location.log_id not in report.compacted_entry_logs
    assert storage._index.location(*victim) == location, "left where it was"
    moved_past = [
        key
        for key in model
        if key != victim
        and storage._index.location(*key) is not None
        and storage._index.location(*key).log_id != location.log_id  # type: ignore[union-attr]
    ]
    assert len(moved_past) == len(model) - 1, "every other entry copied out of the file"
    [listed] = storage.corrupt_entries()
    assert (listed.ledger_id, listed.entry_id, listed.mark.found_by) == (
        *victim,
        FoundBy.COMPACTION,
    )
    assert found == [(victim[0], [victim[1]])]
    with pytest.raises(EntryCorrupt, match="found corrupt by the compaction"):
        storage.get_entry(*victim)
    del model[victim]
    check_all(storage, model)
    # repaired: the rotten record is garbage, and the file goes at the next compaction
    data = body(*victim)
    storage.add_entry(*victim, crc32c(data), data, victim[1] - 1)
    storage.checkpoint(b"repaired")
    model[victim] = data
    report = storage.collect_garbage(time.time(), force_major=True)
    assert location.log_id in report.compacted_entry_logs
    assert report.failures == ()
    assert not (storage.directory / "logs" / log_file_name(location.log_id)).exists()
    check_all(storage, model)
    assert storage.corrupt_entries() == []
    assert scrub_pass(storage).corrupt == 0
    storage.close()


def test_closing_the_storage_stops_scrubbing(tmp_path: Path) -> None:
    storage = opened(tmp_path / "bookie")
    fill(storage, LEDGERS[:1], 4)
    storage.close()
    with pytest.raises(IllegalOperation, match="closing"):
        storage.scrub(EVERYTHING)


def test_the_reads_of_a_log_left_behind_give_their_buffers_back_first() -> None:
    """A step may leave a log with a read ahead still filling one of the two buffers (damage
    or an I/O error ends the log early); the next log's reads take the same buffers, so the
    one left behind waits for that read before anything else writes into them."""
    started, release = threading.Event(), threading.Event()

    class SlowLog:
        def read_span(self, log_id: int, offset: int, into: memoryview) -> int:
            if offset:  # the read ahead
                started.set()
                assert release.wait(10)
            into[:] = bytes(len(into))
            return len(into)

    buffers = (memoryview(bytearray(HEADROOM + 64)), memoryview(bytearray(HEADROOM + 64)))
    with ThreadPoolExecutor(1) as reader:
        reads = _LogReads(SlowLog(), 1, reader, buffers)  # type: ignore[arg-type]
        raw, fresh = reads.read(0, 64, 1 << 20)
        assert (len(raw), fresh) == (64, 64)
        assert started.wait(10)
        settled = threading.Event()
        waiter = threading.Thread(target=lambda: (reads.settle(), settled.set()))
        waiter.start()
        assert not settled.wait(0.2), "settled while the read ahead still writes its buffer"
        release.set()
        waiter.join(10)
        assert settled.is_set()
