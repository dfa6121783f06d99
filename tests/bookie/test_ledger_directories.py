"""Ledger storage over several ledger directories, on real files and real (small) file
systems: each ledger stays on the directory it was placed on across restarts and added
directories; a ledger the record lacks is placed where it is found; a directory whose disk
fails or was replaced empty puts its ledgers in limbo on the others, where they answer
"unknown" (never NoSuchEntry nor NoSuchLedger) until repaired."""

from __future__ import annotations

import errno
import itertools
import shutil
from pathlib import Path

import pytest

from tally.bookie.journal_format import JournalMark
from tally.bookie.ledger_dir_health import errno_of
from tally.bookie.ledger_directories import LedgerDirectories
from tally.bookie.ledger_placement import PlacementRecord
from tally.bookie.ledger_storage import LedgerStorage
from tally.chaos.disks import fail_read_only, small_filesystem, unmount_lazily
from tally.core.admission import admit_add
from tally.core.digest import crc32c
from tally.core.errors import EntryUnreadable, LedgerInLimbo, WriteFailed
from tally.core.ids import LedgerId

KEY = bytes(range(32))
ENTRIES = 5
_marks = itertools.count(1)


def mark() -> bytes:
    return JournalMark(1, next(_marks) * 100).to_bytes()


def data(ledger_id: LedgerId, entry_id: int) -> bytes:
    return f"{ledger_id.qualified_name}/{entry_id}".encode() * 3


def write(storage: LedgerDirectories | LedgerStorage, ledger_id: LedgerId) -> None:
    storage.set_master_key(ledger_id, KEY)
    for entry_id in range(ENTRIES):
        payload = data(ledger_id, entry_id)
        storage.add_entry(ledger_id, entry_id, crc32c(payload), payload, entry_id - 1)


def reads_back(storage: LedgerDirectories, ledger_id: LedgerId) -> bool:
    return all(storage.get_entry(ledger_id, e)[1] == data(ledger_id, e) for e in range(ENTRIES))


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return tmp_path / "journal"


def opened(journal: Path, *directories: Path, **options: object) -> LedgerDirectories:
    return LedgerDirectories(list(directories), journal, log_size_limit=64 << 10, **options)  # type: ignore[arg-type]


def test_ledgers_stay_where_they_were_placed_across_restarts_and_added_directories(
    tmp_path: Path, journal: Path
) -> None:
    a, b, c = (tmp_path / name for name in "abc")
    ledgers = [LedgerId(0, n) for n in range(1, 9)]
    storage = opened(journal, a, b)
    for ledger_id in ledgers:
        write(storage, ledger_id)
    storage.checkpoint(mark())
    placed = {ledger_id: storage.directory_of(ledger_id) for ledger_id in ledgers}
    assert sorted(placed.values()).count(str(a.resolve())) == 4  # spread evenly
    storage.close()

    storage = opened(journal, a, b, c)
    try:
        assert {ledger_id: storage.directory_of(ledger_id) for ledger_id in ledgers} == placed
        assert all(reads_back(storage, ledger_id) for ledger_id in ledgers)
        newer = [LedgerId(0, n) for n in range(100, 104)]
        for ledger_id in newer:
            write(storage, ledger_id)
        # the empty directory takes new ledgers until it holds its share
        assert {storage.directory_of(ledger_id) for ledger_id in newer} == {str(c.resolve())}
        assert storage.lost_at_start == []
    finally:
        storage.close()


def test_a_ledger_in_an_index_but_not_in_the_record_is_placed_where_it_is(
    tmp_path: Path, journal: Path
) -> None:
    """A crash between a checkpoint and the placement's record: the index has the ledger."""
    a, b = tmp_path / "a", tmp_path / "b"
    opened(journal, a, b).close()
    ledger_id = LedgerId(3, 7)
    alone = LedgerStorage(b)
    write(alone, ledger_id)
    alone.checkpoint(mark())
    alone.close()

    storage = opened(journal, a, b)
    try:
        assert storage.directory_of(ledger_id) == str(b.resolve())
        assert reads_back(storage, ledger_id)
    finally:
        storage.close()
    assert PlacementRecord(journal).placements() == {ledger_id: str(b.resolve())}


def test_the_ledgers_of_a_directory_replaced_empty_are_in_limbo_until_repaired(
    tmp_path: Path, journal: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    storage = opened(journal, a, b)
    ledgers = [LedgerId(0, n) for n in range(1, 5)]
    for ledger_id in ledgers:
        write(storage, ledger_id)
    storage.checkpoint(mark())
    on_b = [x for x in ledgers if storage.directory_of(x) == str(b.resolve())]
    storage.close()
    shutil.rmtree(b)
    b.mkdir()  # a new, empty disk

    storage = opened(journal, a, b)
    try:
        assert sorted(storage.lost_at_start) == on_b
        for ledger_id in ledgers:
            assert storage.directory_of(ledger_id) is not None  # nothing moved
            if ledger_id not in on_b:
                assert reads_back(storage, ledger_id)
                continue
            with pytest.raises(LedgerInLimbo):
                storage.get_entry(ledger_id, 0)
            assert storage.ledger_access(ledger_id).lost
            with pytest.raises(WriteFailed):
                admit_add(ledger_id, storage.ledger_access(ledger_id), KEY, recovery=False)
            write(storage, ledger_id)  # the repair's recovery adds
            assert reads_back(storage, ledger_id)
    finally:
        storage.close()


def test_a_directory_whose_file_system_goes_away_is_failed_and_its_ledgers_go_to_limbo(
    tmp_path: Path, journal: Path
) -> None:
    failures: list[tuple[str, str, list[LedgerId]]] = []
    with (
        small_filesystem(tmp_path / "a", 16 << 20, "tmpfs") as a,
        small_filesystem(tmp_path / "b", 16 << 20, "tmpfs") as b,
    ):
        storage = opened(journal, a, b, on_failure=lambda *f: failures.append(f))
        try:
            ledgers = [LedgerId(0, n) for n in range(1, 7)]
            for ledger_id in ledgers:
                write(storage, ledger_id)
            storage.checkpoint(mark())
            on_a = sorted(x for x in ledgers if storage.directory_of(x) == str(a.resolve()))
            assert on_a
            name = str(a.resolve())
            storage.probe(name)
            assert storage.failed_directories() == {}

            unmount_lazily(a)
            storage.probe(name)
            assert list(storage.failed_directories()) == [name]
            assert "unmounted" in storage.failed_directories()[name]
            assert [(d, sorted(moved)) for d, _, moved in failures] == [(name, on_a)]
            for ledger_id in on_a:
                assert storage.directory_of(ledger_id) == str(b.resolve())
                with pytest.raises(LedgerInLimbo):
                    storage.get_entry(ledger_id, 0)
            storage.checkpoint(mark())  # the directory in service only
            storage.close_failed()
            newer = LedgerId(0, 99)
            write(storage, newer)
            assert storage.directory_of(newer) == str(b.resolve())
            storage.checkpoint(mark())
        finally:
            storage.close()

        # a restart keeps the directory out of service and the ledgers in limbo
        storage = opened(journal, a, b)
        try:
            assert list(storage.failed_directories()) == [name]
            assert sorted(storage.limbo_ledgers()) == on_a
            assert all(storage.directory_of(x) == str(b.resolve()) for x in on_a)
        finally:
            storage.close()


def test_a_checkpoint_goes_on_without_a_directory_whose_disk_turned_read_only(
    tmp_path: Path, journal: Path
) -> None:
    with (
        small_filesystem(tmp_path / "a", 64 << 20) as a,
        small_filesystem(tmp_path / "b", 64 << 20) as b,
    ):
        storage = opened(journal, a, b)
        try:
            ledgers = [LedgerId(0, n) for n in range(1, 5)]
            for ledger_id in ledgers:
                write(storage, ledger_id)
            on_a = [x for x in ledgers if storage.directory_of(x) == str(a.resolve())]
            assert on_a
            fail_read_only(a)
            storage.checkpoint(mark())  # no error: a's ledgers went to limbo on b
            name = str(a.resolve())
            assert "Read-only file system" in storage.failed_directories()[name]
            for ledger_id in ledgers:
                if ledger_id in on_a:
                    with pytest.raises(LedgerInLimbo):
                        storage.get_entry(ledger_id, 0)
                else:
                    assert reads_back(storage, ledger_id)
            storage.close_failed()
        finally:
            storage.close()


def test_the_errno_behind_an_error_is_found_in_its_causes_or_in_the_index_engine_s_text() -> None:
    def raised_from(cause: OSError) -> WriteFailed:
        try:
            raise WriteFailed("entry log: write failed") from cause
        except WriteFailed as error:
            return error

    assert errno_of(raised_from(OSError(errno.EIO, "Input/output error"))) == errno.EIO
    engine = WriteFailed(
        "index: IO error: While appending to file: 000012.log: Read-only file system"
    )
    assert errno_of(engine) == errno.EROFS
    assert errno_of(WriteFailed("index: IO error: No space left on device")) == errno.ENOSPC
    assert errno_of(EntryUnreadable("CRC32C of the 10 bytes is 0x1, stored 0x2")) is None
