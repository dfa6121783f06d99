"""Large entries kept in the journal: indexed there at the checkpoint, never copied, read back
and checked; the journal files that hold them survive; rot in them is reported, not hidden."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
from pathlib import Path

import pytest

from tally.bookie import journal_records
from tally.bookie.direct_io import enable_direct
from tally.bookie.journal import Journal
from tally.bookie.journal_entries import (
    ENTRY_HEAD,
    KEPT_ENTRY_SIZE,
    JournalEntries,
    JournalLocation,
)
from tally.bookie.journal_files import journal_files
from tally.bookie.journal_format import JournalMark
from tally.bookie.ledger_storage import LedgerStorage
from tally.bookie.read_handles import ReadHandles
from tally.core.digest import crc32c
from tally.core.errors import EntryUnreadable, NoSuchEntry
from tally.core.ids import LedgerId
from tests.bookie.conftest import (
    KEY,
    BookieUnderTest,
    connected,
    entry,
    new_ledger,
    running,
    sample,
)

LEDGER = LedgerId(7, 42)
LARGE = KEPT_ENTRY_SIZE


def payload(entry_id: int, size: int) -> bytes:
    return (f"{entry_id}:".encode() * size)[:size]


async def journaled(directory: Path, entries: list[bytes]) -> list[JournalMark]:
    """Journal each entry as the bookie does (record head, then the bytes): their marks."""
    journal = Journal(directory)
    for _ in journal.replay():
        pass
    await journal.start()
    marks: list[asyncio.Future[JournalMark]] = []
    for entry_id, data in enumerate(entries):
        head = journal_records.entry_record_head(LEDGER, entry_id, entry_id - 1, crc32c(data))
        marks.append(journal.append_nowait(head + data))
    done = list(await asyncio.gather(*marks))
    await journal.close()
    return done


def stored_with_kept(tmp_path: Path, entries: list[bytes]) -> LedgerStorage:
    """Storage holding `entries` of LEDGER, those of KEPT_ENTRY_SIZE or more kept in the
    journal, checkpointed."""
    marks = asyncio.run(journaled(tmp_path / "journal", entries))
    storage = LedgerStorage(
        tmp_path / "ledgers", journal_entries=JournalEntries(tmp_path / "journal")
    )
    for entry_id, (data, mark) in enumerate(zip(entries, marks, strict=True)):
        storage.add_entry(LEDGER, entry_id, crc32c(data), data, entry_id - 1)
        if len(data) >= LARGE:
            location = JournalLocation(
                mark.file_id, mark.offset - len(data), len(data), crc32c(data)
            )
            storage.keep_in_journal(LEDGER, entry_id, location)
    storage.checkpoint(marks[-1].to_bytes())
    return storage


def entry_log_bytes(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted((directory / "logs").glob("*.log")))


def test_large_entries_are_indexed_in_the_journal_and_small_ones_copied(tmp_path: Path) -> None:
    entries = [payload(0, 100), payload(1, LARGE), payload(2, 3 * LARGE + 5), payload(3, 10)]
    storage = stored_with_kept(tmp_path, entries)
    logs = entry_log_bytes(tmp_path / "ledgers")
    assert [data in logs for data in entries] == [True, False, False, True], "large: not copied"
    (file_id, _), *others = journal_files(tmp_path / "journal")
    assert not others
    assert storage.kept_journal_files() == {file_id}
    assert (storage.stats().entries_kept_in_journal, storage.stats().kept_journal_files) == (2, 1)
    for entry_id, data in enumerate(entries):
        assert storage.get_entry(LEDGER, entry_id) == (crc32c(data), data)
    storage.close()

    reopened = LedgerStorage(
        tmp_path / "ledgers", journal_entries=JournalEntries(tmp_path / "journal")
    )
    assert reopened.kept_journal_files() == {file_id}
    for entry_id, data in enumerate(entries):
        assert reopened.get_entry(LEDGER, entry_id) == (crc32c(data), data)

    total = sum(map(len, entries))
    assert reopened.ledger_info(LEDGER).byte_count == total
    assert reopened.forget_entries(LEDGER, [2]) == 1
    assert reopened.ledger_info(LEDGER).byte_count == total - len(entries[2])
    reopened.close()

    without_journal = LedgerStorage(tmp_path / "ledgers")
    with pytest.raises(EntryUnreadable, match="opened without the journal"):
        without_journal.get_entry(LEDGER, 1)
    without_journal.close()


@pytest.mark.parametrize("where", ["bytes", "head"])
def test_rot_in_a_kept_entry_is_unreadable_never_no_such_entry(tmp_path: Path, where: str) -> None:
    entries = [payload(0, LARGE), payload(1, LARGE)]
    stored_with_kept(tmp_path, entries).close()
    (_, path), *_ = journal_files(tmp_path / "journal")
    content = bytearray(path.read_bytes())
    start = content.index(entries[1])
    content[start + 100 if where == "bytes" else start - ENTRY_HEAD.size + 10] ^= 0x01
    path.write_bytes(content)
    storage = LedgerStorage(
        tmp_path / "ledgers", journal_entries=JournalEntries(tmp_path / "journal")
    )
    message = "corrupt" if where == "bytes" else "the journal record there"
    with pytest.raises(EntryUnreadable, match=message):
        storage.get_entry(LEDGER, 1)
    assert storage.get_entry(LEDGER, 0)[1] == entries[0]
    assert storage.stats().read_errors == 1
    storage.close()


@pytest.mark.parametrize("direct_io", [True, False])
def test_kept_entries_read_back_the_same_through_o_direct_or_the_page_cache(
    tmp_path: Path, direct_io: bool
) -> None:
    """Records at unaligned offsets, larger and smaller than the last read's buffer, read
    whole; a record cut by the file's end is a short read (unreadable), in both modes."""
    sizes = [LARGE + 1, 5 * LARGE + 3, LARGE, 2 * LARGE + 4095]
    entries = [payload(entry_id, size) for entry_id, size in enumerate(sizes)]
    stored_with_kept(tmp_path, entries).close()
    journal = JournalEntries(tmp_path / "journal", direct_io=direct_io)
    storage = LedgerStorage(tmp_path / "ledgers", journal_entries=journal)
    for entry_id in [0, 1, 2, 3, 1, 0]:
        assert storage.get_entry(LEDGER, entry_id) == (crc32c(entries[entry_id]), entries[entry_id])
    (file_id, path), *_ = journal_files(tmp_path / "journal")
    probe = os.open(path, os.O_RDONLY)
    try:
        direct_allowed = enable_direct(probe)
    finally:
        os.close(probe)
    fd = journal._handles._handles[file_id].fd
    assert bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT) == (direct_io and direct_allowed)
    storage.close()

    content = path.read_bytes()
    path.write_bytes(content[: content.index(entries[3]) + 1000])
    cut = LedgerStorage(
        tmp_path / "ledgers",
        journal_entries=JournalEntries(tmp_path / "journal", direct_io=direct_io),
    )
    with pytest.raises(EntryUnreadable, match="short read"):
        cut.get_entry(LEDGER, 3)
    assert cut.get_entry(LEDGER, 2)[1] == entries[2]
    cut.close()


@pytest.mark.parametrize(("code", "unreadable"), [(errno.EIO, True), (errno.EINVAL, False)])
def test_a_disk_error_is_unreadable_and_a_misaligned_read_is_no_answer_about_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, unreadable: bool
) -> None:
    """EIO says the copy cannot be read (a repair takes it as no usable copy there); EINVAL
    from an O_DIRECT read says this code asked wrongly, which says nothing of the copy, so
    it is raised as it is: an internal error, unknown to whoever asked."""
    entries = [payload(0, LARGE)]
    stored_with_kept(tmp_path, entries).close()
    storage = LedgerStorage(
        tmp_path / "ledgers", journal_entries=JournalEntries(tmp_path / "journal")
    )

    def failing(*_: object) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(ReadHandles, "pread_into", failing)
    with pytest.raises((OSError, EntryUnreadable)) as raised:
        storage.get_entry(LEDGER, 0)
    assert isinstance(raised.value, EntryUnreadable) == unreadable
    storage.close()


def test_a_missing_journal_file_is_unreadable(tmp_path: Path) -> None:
    stored_with_kept(tmp_path, [payload(0, LARGE)]).close()
    for _, path in journal_files(tmp_path / "journal"):
        path.unlink()
    storage = LedgerStorage(
        tmp_path / "ledgers", journal_entries=JournalEntries(tmp_path / "journal")
    )
    with pytest.raises(EntryUnreadable, match="read failed"):
        storage.get_entry(LEDGER, 0)
    storage.close()


def test_a_re_add_with_other_bytes_is_not_kept_at_the_old_record(tmp_path: Path) -> None:
    """The journal record the location names must hold the bytes the cache holds."""
    first, second = payload(0, LARGE), payload(9, LARGE)
    marks = asyncio.run(journaled(tmp_path / "journal", [first]))
    storage = LedgerStorage(
        tmp_path / "ledgers", journal_entries=JournalEntries(tmp_path / "journal")
    )
    storage.add_entry(LEDGER, 0, crc32c(first), first, -1)
    storage.add_entry(LEDGER, 0, crc32c(second), second, -1)
    location = JournalLocation(marks[0].file_id, marks[0].offset - LARGE, LARGE, crc32c(first))
    storage.keep_in_journal(LEDGER, 0, location)
    storage.checkpoint(marks[0].to_bytes())
    assert second in entry_log_bytes(tmp_path / "ledgers")
    assert storage.get_entry(LEDGER, 0)[1] == second
    assert storage.kept_journal_files() == set()
    storage.close()


def test_release_before_keeps_the_files_named(tmp_path: Path) -> None:
    async def three_files() -> Journal:
        journal = Journal(tmp_path, file_size=4096, preallocate_size=4096)
        await journal.start()
        for number in range(3):
            await journal.append(os.urandom(3000) + bytes([number]))
        return journal

    async def release() -> list[Path]:
        journal = await three_files()
        ids = [file_id for file_id, _ in journal_files(tmp_path)]
        released = journal.release_before(journal.last_mark(), keep={ids[0]})
        await journal.close()
        return released

    released = asyncio.run(release())
    remaining = [file_id for file_id, _ in journal_files(tmp_path)]
    assert len(released) == 1
    assert remaining == [1, 3], "file 1 kept, file 2 released, file 3 still written"


# -- the bookie process -----------------------------------------------------------------


@pytest.mark.parametrize("keep", [True, False])
async def test_a_bookie_writes_large_entries_once_and_reads_them_after_a_restart(
    cluster: str, tmp_path: Path, keep: bool
) -> None:
    ledger = new_ledger()
    payloads = [os.urandom(64 << 10), b"small", os.urandom(20 << 10)]
    entries = [entry(ledger, i, data) for i, data in enumerate(payloads)]
    settings = {"keep_large_entries_in_journal": keep}
    bookie = BookieUnderTest(cluster, tmp_path / "bookie", settings=settings)
    with running(bookie):
        async with connected(bookie.address) as connection:
            for data in entries:
                await connection.add(data, KEY)
        assert bookie.stop() == 0  # checkpoints on the way out
        logs = entry_log_bytes(bookie.data_dir / "ledgers")
        assert payloads[1] in logs
        for large in (payloads[0], payloads[2]):
            assert (large in logs) is not keep
        journal = b"".join(
            path.read_bytes() for _, path in journal_files(bookie.data_dir / "journal")
        )
        assert payloads[0] in journal, "released only when nothing points into it"

        bookie.start()
        async with connected(bookie.address) as connection:
            for entry_id, data in enumerate(entries):
                assert await connection.read(ledger, entry_id) == data
        kept_files = sample(bookie.metrics(), "bookie_kept_journal_files")
        assert kept_files == (1 if keep else 0), "counted from the index after a restart"
        if keep:
            bookie.stop()
            (_, path), *_ = journal_files(bookie.data_dir / "journal")
            content = bytearray(path.read_bytes())
            content[content.index(payloads[0]) + 1000] ^= 0x40
            path.write_bytes(content)
            bookie.start()
            async with connected(bookie.address) as connection:
                with pytest.raises(EntryUnreadable, match="corrupt"):
                    await connection.read(ledger, 0)
                assert await connection.read(ledger, 2) == entries[2]
                with pytest.raises(NoSuchEntry):
                    await connection.read(ledger, 3)
            assert sample(bookie.metrics(), "bookie_ledger_storage_read_errors_total") == 1
