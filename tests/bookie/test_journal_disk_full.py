"""A bookie process whose journal disk fills up: read-only, serving reads, and writable again
by itself once there is room, without a restart; and the same bookie started on a full
journal disk.

The journal lives on a small ext4 file system that the test makes, the rest of the bookie on
the test's directory. The usage thresholds are set to 1.0, so that what turns the bookie
read-only here is its journal running out of room, not the disk check's usage reading (the
filler leaves a little room: less than a journal file's preallocation).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tally.chaos.disks import fill, small_filesystem
from tally.client.bookie_connection import BookieConnection
from tally.core.errors import WriteFailed, WriteOnReadOnlyBookie
from tally.core.ids import LedgerId
from tests.bookie.conftest import (
    KEY,
    BookieUnderTest,
    connected,
    entry,
    new_ledger,
    registration_of,
    running,
    sample,
)
from tests.support.async_tests import run
from tests.support.polling import until

PREALLOCATE = 512 << 10
LEFT = 64 << 10
"""Room the filler leaves: less than one preallocation, so the journal cannot grow."""
PAYLOAD = bytes(range(256)) * 64
"""16 KiB: about thirty adds use up one preallocation."""


@pytest.fixture
def journal_disk(tmp_path: Path) -> Iterator[Path]:
    with small_filesystem(tmp_path / "journal-disk", 64 << 20) as disk:
        yield disk


def journal_bookie(cluster: str, tmp_path: Path, journal_disk: Path) -> BookieUnderTest:
    return BookieUnderTest(
        cluster,
        tmp_path / "bookie",
        settings={
            "journal_dir": journal_disk / "journal",
            "journal_file_size": 8 << 20,
            "journal_preallocate_size": PREALLOCATE,
            "disk_usage_threshold": 1.0,
            "disk_usage_lwm_threshold": 1.0,
            "disk_check_interval": 0.05,
            "journal_retry_interval": 0.1,
            "flush_interval": 3600,  # no checkpoint: a restart replays the journal
        },
    )


async def wait_registered(cluster: str, bookie: BookieUnderTest, mode: str) -> None:
    async def registered() -> bool:
        return await registration_of(cluster, bookie.address) == mode

    await until(registered, f"{bookie.address} registered {mode}", step=0.05)


async def reads_back(connection: BookieConnection, ledger: LedgerId, entry_ids: list[int]) -> None:
    for entry_id in entry_ids:
        assert await connection.read(ledger, entry_id) == entry(ledger, entry_id, PAYLOAD)


def test_a_full_journal_disk_makes_the_bookie_read_only_until_room_appears(
    cluster: str, tmp_path: Path, journal_disk: Path
) -> None:
    """Adds fail on a full journal disk, never acknowledged; the bookie turns read-only and
    serves reads; room freed, it turns writable again without a restart. Killed and started
    again on a disk full again, it replays both journal files, starts read-only serving every
    acknowledged entry, and turns writable once room appears. Two bookie starts in one
    test, which take seconds each on a loaded machine: hence a deadline of its own."""
    run(full_journal_disk(cluster, tmp_path, journal_disk), deadline=90.0)


async def full_journal_disk(cluster: str, tmp_path: Path, journal_disk: Path) -> None:
    bookie = journal_bookie(cluster, tmp_path, journal_disk)
    ledger = new_ledger()
    with running(bookie):
        acknowledged: list[int] = []
        async with connected(bookie.address) as connection:
            for entry_id in range(5):
                await connection.add(entry(ledger, entry_id, PAYLOAD), KEY)
                acknowledged.append(entry_id)
            filler = fill(journal_disk, leave=LEFT)

            failed, error = None, None
            for entry_id in range(5, 500):
                try:
                    await connection.add(entry(ledger, entry_id, PAYLOAD), KEY)
                except WriteFailed as refused:
                    failed, error = entry_id, refused
                    break
                acknowledged.append(entry_id)
            assert failed is not None, "the journal never ran out of room"
            assert "No space left on device" in str(error)

            await wait_registered(cluster, bookie, "readonly")
            with pytest.raises(WriteOnReadOnlyBookie, match="journal cannot write"):
                await connection.add(entry(ledger, failed, PAYLOAD), KEY)
            with pytest.raises(WriteOnReadOnlyBookie, match="journal cannot write"):
                await connection.add(entry(ledger, failed, PAYLOAD), KEY, recovery=True)
            await reads_back(connection, ledger, acknowledged)
            metrics = bookie.metrics()
            assert sample(metrics, "bookie_read_only") == 1
            assert sample(metrics, "bookie_journal_failed") == 1
            assert sample(metrics, "bookie_journal_write_failures_total") >= 1
            assert "its journal is out of room" in bookie.log()
            assert "free space on the journal's disk" in bookie.log()

            filler.unlink()
            await wait_registered(cluster, bookie, "writable")
            for entry_id in range(failed, failed + 5):
                await connection.add(entry(ledger, entry_id, PAYLOAD), KEY)
                acknowledged.append(entry_id)
            await reads_back(connection, ledger, acknowledged)
        metrics = bookie.metrics()
        assert sample(metrics, "bookie_read_only") == 0
        assert sample(metrics, "bookie_journal_failed") == 0
        assert "its journal writes again, in a new file" in bookie.log()

        bookie.kill()  # a crash: what was acknowledged is in the journal's two files only
        filler = fill(journal_disk, leave=LEFT)
        bookie.start()  # replays them, then cannot write a new journal file
        await wait_registered(cluster, bookie, "readonly")
        async with connected(bookie.address) as connection:
            await reads_back(connection, ledger, acknowledged)
            with pytest.raises(WriteOnReadOnlyBookie, match="journal cannot write"):
                await connection.add(entry(ledger, failed + 5, PAYLOAD), KEY)
            assert sample(bookie.metrics(), "bookie_journal_failed") == 1

            filler.unlink()
            await wait_registered(cluster, bookie, "writable")
            await connection.add(entry(ledger, failed + 5, PAYLOAD), KEY)
            await reads_back(connection, ledger, [*acknowledged, failed + 5])
        assert sample(bookie.metrics(), "bookie_ledgers_in_limbo") == 0
        assert bookie.stop() == 0
    log = bookie.log()
    assert "damaged" not in log
    assert "Traceback" not in log


def test_a_journal_disk_too_small_for_two_journal_files_is_named_at_start(
    cluster: str, tmp_path: Path, journal_disk: Path
) -> None:
    """A journal file is let go once the next is written: on a disk that cannot hold two,
    the bookie would fill it with one and stay read-only; it says so as it starts."""
    small_files = journal_bookie(cluster, tmp_path / "fits", journal_disk)
    with running(small_files):
        assert "cannot hold two journal files" not in small_files.log()
    too_large = BookieUnderTest(
        cluster,
        tmp_path / "too-large",
        settings={"journal_dir": journal_disk / "journal-2", "journal_file_size": 48 << 20},
    )
    with running(too_large):
        assert "cannot hold two journal files of journal_file_size (48 MiB)" in too_large.log()
