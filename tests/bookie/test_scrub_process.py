"""Scrubbing in a real bookie process: bytes flipped in an entry log and in a journal file that
keeps an entry, while the bookie was stopped and while it runs, are found by a pass (asked for
with `tally shell scrub --now`, or on a short schedule), marked, shown in the status and the
metrics, and answered as EntryCorrupt (never NoSuchEntry) across a restart."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tally.bookie.entry_log import RECORD_HEADER_SIZE, Location, log_file_name
from tally.bookie.index import Index
from tally.bookie.journal_entries import JournalLocation
from tally.bookie.journal_format import file_name
from tally.core.errors import EntryCorrupt, NoSuchEntry
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
from tests.bookie.test_scrubber import flip
from tests.support.polling import wait_until
from tests.support.processes import tally

LARGE = 20 << 10
"""Stays in the journal (keep_large_entries_in_journal)."""


def payloads(count: int, large: set[int]) -> list[bytes]:
    return [os.urandom(LARGE) if i in large else b"entry %d " % i * 20 for i in range(count)]


async def write(address: str, ledger: LedgerId, data: list[bytes]) -> list[bytes]:
    encoded = [entry(ledger, entry_id, payload) for entry_id, payload in enumerate(data)]
    async with connected(address) as connection:
        for raw in encoded:
            await connection.add(raw, KEY)
    return encoded


async def read_all(address: str, ledger: LedgerId, count: int) -> dict[int, bytes | Exception]:
    found: dict[int, bytes | Exception] = {}
    async with connected(address) as connection:
        for entry_id in range(count + 1):
            try:
                found[entry_id] = await connection.read(ledger, entry_id)
            except (EntryCorrupt, NoSuchEntry) as error:
                found[entry_id] = error
    return found


def flip_stored(data_dir: Path, ledger: LedgerId, entry_id: int) -> Location | JournalLocation:
    """Flip a byte of the entry's stored bytes, where the index (read beside the bookie, if
    it runs) says they are."""
    index = Index.open_read_only(data_dir / "ledgers" / "index")
    try:
        location = index.location(ledger, entry_id)
    finally:
        index.close()
    if isinstance(location, JournalLocation):
        flip(data_dir / "journal" / file_name(location.file_id), location.offset + 100)
    else:
        assert isinstance(location, Location)
        path = data_dir / "ledgers" / "logs" / log_file_name(location.log_id)
        flip(path, location.offset + RECORD_HEADER_SIZE + 2)
    return location


def shell_scrub(uri: str, bookie: BookieUnderTest, *options: str) -> dict[str, Any]:
    done = tally(
        "shell", "scrub", "--bookie", bookie.address, "--json", *options, "--metadata", uri
    )
    assert done.returncode == 0, done.stderr
    status: dict[str, Any] = json.loads(done.stdout)[bookie.address]
    return status


def admin_json(bookie: BookieUnderTest, path: str) -> Any:
    url = f"http://127.0.0.1:{bookie.metrics_port}{path}"
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.load(answer)


def check_reads(
    found: dict[int, bytes | Exception], written: list[bytes], corrupt: set[int]
) -> None:
    for entry_id, raw in enumerate(written):
        if entry_id in corrupt:
            assert isinstance(found[entry_id], EntryCorrupt), found[entry_id]
        else:
            assert found[entry_id] == raw
    assert isinstance(found[len(written)], NoSuchEntry)


def test_flipped_bytes_found_by_a_pass_asked_for_and_kept_marked_across_restarts(
    cluster: str, tmp_path: Path
) -> None:
    ledger = new_ledger()
    data = payloads(12, large={3, 8})
    settings = {"keep_large_entries_in_journal": True, "scrub_interval": 3600}
    bookie = BookieUnderTest(cluster, tmp_path / "bookie", settings=settings)
    with running(bookie):
        written = asyncio.run(write(bookie.address, ledger, data))
        assert bookie.stop() == 0  # checkpoints on the way out
        # stopped: one entry in the journal, one in an entry log
        assert isinstance(flip_stored(bookie.data_dir, ledger, 3), JournalLocation)
        assert isinstance(flip_stored(bookie.data_dir, ledger, 6), Location)
        bookie.start()
        status = shell_scrub(cluster, bookie, "--now")
        latest = status["passes"][0]
        assert latest["trigger"] == "operator"
        assert (latest["entries"], latest["corrupt"], latest["unreadable"]) == (12, 2, 0)
        assert latest["bytes"] >= sum(len(raw) for raw in written)
        assert status["corrupt_entries"] == 2
        assert [(c["ledger_id"], c["entry_id"], c["found_by"]) for c in status["corrupt"]] == [
            (str(ledger), 3, "scrubber"),
            (str(ledger), 6, "scrubber"),
        ]
        check_reads(asyncio.run(read_all(bookie.address, ledger, 12)), written, {3, 6})
        metrics = bookie.metrics()
        assert sample(metrics, "bookie_scrub_corrupt_entries_total") == 2
        assert sample(metrics, "bookie_corrupt_entries") == 2
        assert sample(metrics, "bookie_corrupt_entries_marked_total", found_by="scrubber") == 2
        assert sample(metrics, "bookie_corrupt_entries_reported_total") == 2
        assert sample(metrics, "bookie_scrub_entries_total") == 12
        assert sample(metrics, "bookie_scrub_bytes_total") == latest["bytes"]
        assert sample(metrics, "bookie_scrub_last_complete_pass_time_seconds") == pytest.approx(
            latest["ended"]
        )
        assert "found corrupt here and marked" in bookie.log()
        # a restart keeps the marks and the passes, and the schedule with them
        bookie.stop()
        bookie.start()
        again = admin_json(bookie, "/api/v1/bookie/scrub")
        assert again["passes"] == status["passes"]
        assert again["current"] is None
        assert again["next_pass_due"] == pytest.approx(status["passes"][0]["ended"] + 3600)
        assert admin_json(bookie, "/api/v1/bookie/corrupt_entries") == status["corrupt"]
        found = asyncio.run(read_all(bookie.address, ledger, 12))
        check_reads(found, written, {3, 6})
        assert "found corrupt by the scrubber" in str(found[3])
        metrics = bookie.metrics()
        assert sample(metrics, "bookie_scrub_last_complete_pass_time_seconds") == pytest.approx(
            latest["ended"]
        )
        assert sample(metrics, "bookie_corrupt_entries") == 2
        done = tally("shell", "scrub", "--bookie", bookie.address, "--metadata", cluster)
        assert done.returncode == 0, done.stderr
        assert "2 entries marked corrupt" in done.stdout
        assert "scrubber" in done.stdout


def test_bytes_flipped_under_a_running_bookie_are_found_by_its_scheduled_passes(
    cluster: str, tmp_path: Path
) -> None:
    ledger = new_ledger()
    # what is flipped is followed by more records: never in the block a direct write rewrites
    data = payloads(60, large={0, 30, 31, 32})
    settings = {
        "keep_large_entries_in_journal": True,
        "scrub_interval": 0.5,
        "scrub_rate_bytes": 1 << 20,
        "flush_interval": 0.2,
    }
    bookie = BookieUnderTest(cluster, tmp_path / "bookie", settings=settings)
    with running(bookie):
        written = asyncio.run(write(bookie.address, ledger, data))
        wait_until(
            lambda: (
                sample(bookie.metrics(), "bookie_entries_kept_in_journal_total") == 4
                and sample(bookie.metrics(), "bookie_write_cache_bytes") == 0
            ),
            "the entries checkpointed",
        )
        passes_before = sample(bookie.metrics(), "bookie_scrub_passes_total")
        assert isinstance(flip_stored(bookie.data_dir, ledger, 0), JournalLocation)
        assert isinstance(flip_stored(bookie.data_dir, ledger, 1), Location)
        wait_until(
            lambda: sample(bookie.metrics(), "bookie_corrupt_entries") == 2,
            "the corrupt entries found",
            timeout=30,
        )
        corrupt = admin_json(bookie, f"/api/v1/bookie/corrupt_entries?ledger_id={ledger}")
        assert [(c["entry_id"], c["found_by"]) for c in corrupt] == [
            (0, "scrubber"),
            (1, "scrubber"),
        ]
        assert admin_json(bookie, "/api/v1/bookie/corrupt_entries?ledger_id=999999") == []
        check_reads(asyncio.run(read_all(bookie.address, ledger, 60)), written, {0, 1})
        status = admin_json(bookie, "/api/v1/bookie/scrub")
        assert status["interval"] == 0.5
        assert status["rate_bytes_per_second"] == 1 << 20
        assert status["rate_configured"]
        scheduled = [done for done in status["passes"] if done["trigger"] == "schedule"]
        assert scheduled
        assert max(done["corrupt"] for done in scheduled) == 2
        assert sample(bookie.metrics(), "bookie_scrub_passes_total") > passes_before


def test_a_recovery_add_writes_over_bad_copies_only(cluster: str, tmp_path: Path) -> None:
    """A repair's copy (a recovery add of the same bytes) is acknowledged without a write
    over a copy that checks out; over one marked corrupt, or one found bad as it is looked
    at, it is written and ends the mark. A recovering client's re-encoded entry (its own
    LAC: other bytes) is written as any add."""
    ledger = new_ledger()
    data = payloads(6, large=set())
    settings = {"scrub_interval": 3600, "flush_interval": 0.2}
    bookie = BookieUnderTest(cluster, tmp_path / "bookie", settings=settings)
    with running(bookie):
        written = asyncio.run(write(bookie.address, ledger, data))
        assert bookie.stop() == 0
        flip_stored(bookie.data_dir, ledger, 2)
        bookie.start()
        assert shell_scrub(cluster, bookie, "--now")["corrupt_entries"] == 1
        assert bookie.stop() == 0
        flip_stored(bookie.data_dir, ledger, 4)  # rotten, not known yet
        bookie.start()

        async def repair() -> None:
            async with connected(bookie.address) as connection:
                for raw in written:
                    await connection.add(raw, KEY, recovery=True)

        asyncio.run(repair())
        assert sample(bookie.metrics(), "bookie_recovery_add_entry_kept_total") == 4
        wait_until(
            lambda: sample(bookie.metrics(), "bookie_corrupt_entries") == 0,
            "the marks ended by the checkpoint of the copies written over them",
        )
        check_reads(asyncio.run(read_all(bookie.address, ledger, 6)), written, set())
        re_encoded = entry(ledger, 0, data[0], lac=3)

        async def recover() -> bytes:
            async with connected(bookie.address) as connection:
                await connection.add(re_encoded, KEY, recovery=True)
                return await connection.read(ledger, 0)

        assert asyncio.run(recover()) == re_encoded
        assert sample(bookie.metrics(), "bookie_recovery_add_entry_kept_total") == 4
