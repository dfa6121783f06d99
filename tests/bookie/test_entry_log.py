"""Entry logs: round trips, rolling, scans, corruption and write failures, on real files."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.bookie.direct_io import aligned_up
from tally.bookie.entry_log import (
    FILE_HEADER_SIZE,
    RECORD_HEADER_SIZE,
    EntryLog,
    Location,
    log_file_name,
)
from tally.core.digest import crc32c
from tally.core.errors import (
    BadRequest,
    EntryUnreadable,
    IllegalOperation,
    NoSuchEntry,
    WriteFailed,
)
from tally.core.ids import LedgerId

LEDGER = LedgerId(3, 0xFEDCBA9876543210)
OTHER = LedgerId(0, 1)


def payload(entry_id: int, size: int = 40) -> bytes:
    return (entry_id.to_bytes(8, "big") * (size // 8 + 1))[:size]


def append(log: EntryLog, ledger_id: LedgerId, entry_id: int, size: int = 40) -> Location:
    data = payload(entry_id, size)
    return log.append(ledger_id, entry_id, crc32c(data), data)


def test_round_trip_before_and_after_flush(tmp_path: Path) -> None:
    log = EntryLog(tmp_path)
    assert log.current_log_id is None
    locations = {entry_id: append(log, LEDGER, entry_id, 10 + entry_id) for entry_id in range(20)}
    last = append(log, OTHER, 0, 1)
    assert os.path.getsize(tmp_path / log_file_name(0)) == 0, "appends are only buffered"
    for entry_id, location in locations.items():
        assert location.log_id == 0
        assert location.size == RECORD_HEADER_SIZE + 10 + entry_id
        data = payload(entry_id, 10 + entry_id)
        assert log.read(location, LEDGER, entry_id) == (crc32c(data), data)
    assert log.read(last, OTHER, 0) == (crc32c(payload(0, 1)), payload(0, 1))
    log.flush()
    size = os.path.getsize(tmp_path / "00000000.log")
    assert size == aligned_up(last.offset + last.size), "direct writes end on a block"
    for entry_id, location in locations.items():
        assert log.read(location, LEDGER, entry_id)[1] == payload(entry_id, 10 + entry_id)
    assert log.read(last, OTHER, 0)[1] == payload(0, 1)
    assert [record.location for record in log.scan(0)] == [*locations.values(), last]
    log.close()

    reopened = EntryLog(tmp_path)
    assert reopened.read(locations[7], LEDGER, 7)[1] == payload(7, 17)
    later = append(reopened, LEDGER, 100)
    assert later.log_id == 1, "a restart never appends to an old log"
    reopened.close()


def test_offsets_are_contiguous_after_the_file_header(tmp_path: Path) -> None:
    log = EntryLog(tmp_path)
    first = append(log, LEDGER, 0, 5)
    second = append(log, LEDGER, 1, 7)
    assert first.offset == FILE_HEADER_SIZE
    assert second.offset == first.offset + first.size
    log.close()


def test_rolls_at_the_size_limit(tmp_path: Path) -> None:
    limit = 1000
    log = EntryLog(tmp_path, size_limit=limit)
    locations = [append(log, LEDGER, entry_id, 100) for entry_id in range(30)]
    huge = append(log, OTHER, 0, 3 * limit)
    after = append(log, OTHER, 1, 10)
    log.flush()
    ids = log.log_ids()
    assert len(ids) >= 5
    assert huge.log_id != locations[-1].log_id
    assert after.log_id == huge.log_id + 1
    for log_id in ids:
        size = os.path.getsize(tmp_path / log_file_name(log_id))
        assert size <= aligned_up(limit) or log_id == huge.log_id, "records end by the limit"
    for entry_id, location in enumerate(locations):
        assert log.read(location, LEDGER, entry_id)[1] == payload(entry_id, 100)
    assert log.read(huge, OTHER, 0)[1] == payload(0, 3 * limit)
    assert log.read(after, OTHER, 1)[1] == payload(1, 10)
    log.close()


def test_scan_yields_every_flushed_record_in_order(tmp_path: Path) -> None:
    log = EntryLog(tmp_path)
    written = []
    for entry_id in range(10):
        ledger_id = LEDGER if entry_id % 2 else OTHER
        written.append((append(log, ledger_id, entry_id, entry_id * 3 + 1), ledger_id, entry_id))
    log.flush()
    unflushed = append(log, LEDGER, 99)
    records = list(log.scan(0))
    assert [(r.location, r.ledger_id, r.entry_id) for r in records] == written
    for record in records:
        assert record.data == payload(record.entry_id, record.entry_id * 3 + 1)
        assert record.crc32c == crc32c(record.data)
    assert unflushed.offset not in {r.location.offset for r in records}
    log.close()


def test_scan_reports_a_cut_tail_after_the_good_records(tmp_path: Path) -> None:
    log = EntryLog(tmp_path)
    for entry_id in range(3):
        append(log, LEDGER, entry_id)
    last = append(log, LEDGER, 3)
    log.close()
    path = tmp_path / log_file_name(0)
    os.truncate(path, last.offset + last.size - 1)
    seen: list[int] = []
    with pytest.raises(EntryUnreadable, match=f"offset {last.offset}"):
        seen.extend(record.entry_id for record in log.scan(0))
    assert seen == [0, 1, 2]


@pytest.mark.parametrize("direct_io", [True, False])
def test_scan_ends_at_the_padding_but_reports_zeroed_records(
    tmp_path: Path, direct_io: bool
) -> None:
    """Zeros that pad the last block end the records; zeros where records follow are damage
    (a zeroed header would otherwise read as an empty entry of ledger 0:0)."""
    log = EntryLog(tmp_path, direct_io=direct_io)
    locations = [append(log, LEDGER, entry_id, 100) for entry_id in range(3)]
    log.close()
    path = tmp_path / log_file_name(0)
    end = locations[-1].offset + locations[-1].size
    assert os.path.getsize(path) == (aligned_up(end) if direct_io else end)
    assert [record.entry_id for record in log.scan(0)] == [0, 1, 2]
    with open(path, "r+b") as file:
        file.seek(locations[1].offset)
        file.write(bytes(locations[1].size))
    seen: list[int] = []
    with pytest.raises(EntryUnreadable, match=f"offset {locations[1].offset} is zeroed"):
        seen.extend(record.entry_id for record in log.scan(0))
    assert seen == [0]


def test_scan_reports_a_corrupt_record(tmp_path: Path) -> None:
    log = EntryLog(tmp_path)
    locations = [append(log, LEDGER, entry_id) for entry_id in range(3)]
    log.close()
    flip(tmp_path / log_file_name(0), locations[1].offset + RECORD_HEADER_SIZE + 5)
    with pytest.raises(EntryUnreadable, match="corrupt"):
        list(log.scan(0))


def test_scan_of_a_file_with_a_bad_header(tmp_path: Path) -> None:
    log = EntryLog(tmp_path)
    append(log, LEDGER, 0)
    log.close()
    flip(tmp_path / log_file_name(0), 3)
    with pytest.raises(EntryUnreadable, match="bad file header"):
        list(log.scan(0))
    with pytest.raises(EntryUnreadable, match="cannot scan"):
        list(log.scan(7))


def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([byte ^ mask]))


@pytest.fixture(scope="module")
def written_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Location]]:
    directory = tmp_path_factory.mktemp("log")
    log = EntryLog(directory)
    locations = [append(log, LEDGER, entry_id, 24) for entry_id in range(4)]
    log.close()
    return directory, locations


@settings(max_examples=300)
@given(st.integers(0, 3), st.data())
def test_any_flipped_byte_of_a_record_is_detected(
    written_log: tuple[Path, list[Location]], victim: int, data: st.DataObject
) -> None:
    directory, locations = written_log
    location = locations[victim]
    offset = location.offset + data.draw(st.integers(0, location.size - 1), label="byte")
    mask = data.draw(st.integers(1, 255), label="mask")
    path = directory / log_file_name(0)
    flip(path, offset, mask)
    try:
        log = EntryLog(directory)
        with pytest.raises(EntryUnreadable, match=f"entry {victim} of ledger"):
            log.read(location, LEDGER, victim)
        for entry_id, other in enumerate(locations):
            if entry_id != victim:
                assert log.read(other, LEDGER, entry_id)[1] == payload(entry_id, 24)
        log.close()
    finally:
        flip(path, offset, mask)


@settings(max_examples=100)
@given(st.integers(0, 4 * (RECORD_HEADER_SIZE + 24) + FILE_HEADER_SIZE - 1))
def test_a_log_cut_anywhere_never_reads_wrong(
    written_log: tuple[Path, list[Location]], cut: int
) -> None:
    directory, locations = written_log
    original = (directory / log_file_name(0)).read_bytes()
    copy = directory / "cut"
    copy.mkdir(exist_ok=True)
    (copy / log_file_name(0)).write_bytes(original[:cut])
    log = EntryLog(copy)
    for entry_id, location in enumerate(locations):
        if cut >= location.offset + location.size and cut >= FILE_HEADER_SIZE:
            assert log.read(location, LEDGER, entry_id)[1] == payload(entry_id, 24)
        else:
            with pytest.raises(EntryUnreadable):
                log.read(location, LEDGER, entry_id)
    log.close()


def test_a_read_checks_the_ledger_entry_and_size_it_expects(tmp_path: Path) -> None:
    log = EntryLog(tmp_path)
    location = append(log, LEDGER, 5)
    append(log, LEDGER, 6)
    log.flush()
    for ledger_id, entry_id, where in (
        (LEDGER, 6, location),
        (OTHER, 5, location),
        (LedgerId(4, LEDGER.id), 5, location),
        (LEDGER, 5, location._replace(size=location.size - 1)),
        (LEDGER, 5, location._replace(offset=location.offset + 1)),
    ):
        with pytest.raises(EntryUnreadable, match="record header says"):
            log.read(where, ledger_id, entry_id)
    end_of_file = os.path.getsize(tmp_path / log_file_name(0))
    with pytest.raises(EntryUnreadable, match="short read"):
        log.read(location._replace(offset=end_of_file - 10), LEDGER, 6)
    with pytest.raises(EntryUnreadable, match="impossible location"):
        log.read(Location(0, 3, 40), LEDGER, 5)
    log.close()


def test_missing_or_deleted_logs_are_unreadable_not_missing_entries(tmp_path: Path) -> None:
    log = EntryLog(tmp_path, size_limit=200)
    first = append(log, LEDGER, 0, 100)
    second = append(log, LEDGER, 1, 100)
    log.flush()
    assert first.log_id != second.log_id
    assert log.read(first, LEDGER, 0)[1] == payload(0, 100)
    log.delete_log(first.log_id)
    assert first.log_id not in log.log_ids()
    with pytest.raises(EntryUnreadable, match="cannot open") as raised:
        log.read(first, LEDGER, 0)
    assert not isinstance(raised.value, NoSuchEntry)
    with pytest.raises(EntryUnreadable, match="cannot open"):
        log.read(Location(42, FILE_HEADER_SIZE, 100), LEDGER, 0)
    with pytest.raises(IllegalOperation, match="current"):
        log.delete_log(second.log_id)
    log.delete_log(12345)  # nothing there: nothing to do
    log.close()


def test_a_write_failure_is_write_failed_and_the_next_flush_uses_a_new_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = EntryLog(tmp_path)
    kept = append(log, LEDGER, 0)
    log.flush()
    lost = append(log, LEDGER, 1)

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(os, "fdatasync", no_space)
        with pytest.raises(WriteFailed, match="No space left"):
            log.flush()
    assert log.current_log_id is None
    assert log.read(kept, LEDGER, 0)[1] == payload(0)
    again = append(log, LEDGER, 1)
    log.flush()
    assert again.log_id == lost.log_id + 1
    assert log.read(again, LEDGER, 1)[1] == payload(1)
    log.close()


def test_a_log_that_cannot_be_created_is_write_failed_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = EntryLog(tmp_path, size_limit=100)
    first = append(log, LEDGER, 0, 60)
    real_open = os.open

    def no_space(path: str | Path, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_CREAT:
            raise OSError(28, "No space left on device")
        return real_open(path, flags, mode)

    with monkeypatch.context() as patch:
        patch.setattr(os, "open", no_space)
        with pytest.raises(WriteFailed, match="cannot create entry log"):
            append(log, LEDGER, 1, 60)
    assert log.read(first, LEDGER, 0)[1] == payload(0, 60), "the rolled-off log was flushed"
    second = append(log, LEDGER, 1, 60)
    log.flush()
    assert second.log_id > first.log_id
    assert log.read(second, LEDGER, 1)[1] == payload(1, 60)
    log.close()


def test_append_refuses_impossible_records(tmp_path: Path) -> None:
    log = EntryLog(tmp_path)
    with pytest.raises(BadRequest, match="entry id"):
        log.append(LEDGER, -1, 0, b"")
    with pytest.raises(BadRequest, match="not a u32"):
        log.append(LEDGER, 0, 2**32, b"")
    with pytest.raises(BadRequest, match="empty"):
        log.append(LEDGER, 0, 0, b"")
    with pytest.raises(BadRequest, match="size limit"):
        EntryLog(tmp_path, size_limit=FILE_HEADER_SIZE)
    log.close()


def test_reads_from_another_thread_while_the_writer_appends_and_flushes(tmp_path: Path) -> None:
    log = EntryLog(tmp_path, size_limit=4096)
    published: list[tuple[int, Location]] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            checked = 0
            while not done.is_set() or checked < len(published):
                snapshot = published[:]
                for entry_id, location in snapshot[checked:] + snapshot[:: 1 + checked // 20]:
                    expected = payload(entry_id, entry_id % 50 + 1)
                    assert log.read(location, LEDGER, entry_id)[1] == expected
                checked = len(snapshot)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    thread = threading.Thread(target=reader)
    thread.start()
    for entry_id in range(2000):
        published.append((entry_id, append(log, LEDGER, entry_id, entry_id % 50 + 1)))
        if entry_id % 97 == 0:
            log.flush()
    log.flush()
    done.set()
    thread.join()
    assert not errors, errors
    assert len(log.log_ids()) > 10
    log.close()
