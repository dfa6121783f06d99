"""A read that waits on a slow disk holds one of the bookie's read threads, not its event
loop: adds to other ledgers are answered meanwhile (BookKeeper's read worker threads).

The slow disk is the `entry_log.read` failpoint's delay before each entry-log read, in a
real bookie process: this kernel has no device-mapper, whose delay target would slow a
real device. Entries reach an entry log through the last checkpoint of a clean stop, and
leave the page cache before the reads (one served from it would not wait for the disk).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from pathlib import Path

import pytest

from tally.bookie.read_workers import ReadWorkers
from tally.core.errors import BookieUnavailable, EntryUnreadable
from tally.core.ids import LedgerId
from tests.bookie.conftest import KEY, connected, entry, new_ledger
from tests.support.page_cache import drop_page_cache
from tests.support.polling import until
from tests.support.processes import BookieProcess, init_cluster

SLOW_READ = 3.0
"""Seconds the slow disk takes for each entry-log read."""


async def _bookie_with_checkpointed(
    tmp_path: Path, ledger_id: LedgerId, failpoints: str, read_threads: int = 4
) -> BookieProcess:
    """A bookie holding entries 0 and 1 of `ledger_id` in an entry log, restarted with
    `failpoints` set."""
    bookie = BookieProcess(
        init_cluster(tmp_path),
        tmp_path / "bookie",
        env={"TALLY_BOOKIE_READ_THREADS": str(read_threads)},
    )
    await asyncio.to_thread(bookie.start)
    async with connected(bookie.address) as connection:
        for entry_id in (0, 1):
            await connection.add(entry(ledger_id, entry_id), KEY)
    assert await asyncio.to_thread(bookie.stop) == 0  # its last checkpoint writes them out
    drop_page_cache(bookie.data_dir)  # their reads need the disk, and wait for it
    bookie.env = {**bookie.env, "TALLY_FAILPOINTS": failpoints}
    await asyncio.to_thread(bookie.start)
    return bookie


@pytest.mark.parametrize("read_threads", [4, 1, 0])
async def test_a_read_slowed_by_its_disk_stalls_adds_only_when_read_on_the_loop(
    tmp_path: Path, read_threads: int
) -> None:
    """The read and the add leave in one write, the read first. With read threads the
    add is acknowledged, and the added entry read back from memory, while the read still
    waits on the disk, even with its one read thread held by it (the entry in memory is
    answered on the loop); read on the event loop (`read_threads = 0`), the add waits for
    the read."""
    slow, busy = new_ledger(), new_ledger()
    bookie = await _bookie_with_checkpointed(
        tmp_path, slow, f"entry_log.read=delay({SLOW_READ})", read_threads
    )
    try:
        async with connected(bookie.address) as connection:
            read = asyncio.ensure_future(connection.read(slow, 0))
            started = time.monotonic()
            await connection.add(entry(busy, 0), KEY)
            assert await connection.read(busy, 0) == entry(busy, 0)  # from the write cache
            add_seconds = time.monotonic() - started
            read_done_at_ack = read.done()
            assert await read == entry(slow, 0)
            read_seconds = time.monotonic() - started
    finally:
        await asyncio.to_thread(bookie.stop)
    assert read_seconds >= SLOW_READ
    if read_threads:
        assert not read_done_at_ack, "the read was answered before the add it was slower than"
        assert add_seconds < SLOW_READ / 2, f"the add waited {add_seconds:.2f}s for the read"
    else:
        assert read_done_at_ack, "read on the loop, the read should have held the add back"
        assert add_seconds >= SLOW_READ


async def test_a_read_that_fails_on_a_read_thread_answers_unreadable_never_absent(
    tmp_path: Path,
) -> None:
    """An I/O error reading a held entry is EntryUnreadable (unknown), not NoSuchEntry,
    whether it is a READ's one entry or a READ_ENTRIES' first; the bookie serves on."""
    ledger_id = new_ledger()
    bookie = await _bookie_with_checkpointed(tmp_path, ledger_id, "entry_log.read=2*error(EIO)")
    try:
        async with connected(bookie.address) as connection:
            with pytest.raises(EntryUnreadable, match="read failed"):
                await connection.read(ledger_id, 0)
            with pytest.raises(EntryUnreadable, match="read failed"):
                await connection.read_entries(ledger_id, [0, 1], 1 << 20)
            assert await connection.read_entries(ledger_id, [0, 1], 1 << 20) == (
                entry(ledger_id, 0),
                entry(ledger_id, 1),
            )
    finally:
        assert await asyncio.to_thread(bookie.stop) == 0


async def test_a_bookie_stops_cleanly_while_a_slow_read_is_under_way(tmp_path: Path) -> None:
    """A bookie stopped while a read waits on its disk exits cleanly, every stopping step
    done, and the reader hears that it went away."""
    ledger_id = new_ledger()
    bookie = await _bookie_with_checkpointed(
        tmp_path, ledger_id, f"entry_log.read=delay({SLOW_READ})"
    )
    async with connected(bookie.address) as connection:
        read = asyncio.ensure_future(connection.read(ledger_id, 0))
        await until(lambda: "failpoint entry_log.read: delay" in bookie.log(), "the slow read")
        assert await asyncio.to_thread(bookie.stop) == 0
        with pytest.raises(BookieUnavailable):
            await read
    last_run = bookie.log().split("failpoint entry_log.read: delay")[-1]
    assert "stopping:" not in last_run, last_run


async def test_a_read_runs_on_a_worker_and_its_outcome_comes_back_on_the_loop() -> None:
    workers = ReadWorkers[int](2)
    outcomes: asyncio.Queue[tuple[int | Exception, int]] = asyncio.Queue()

    def told(outcome: int | Exception) -> None:
        outcomes.put_nowait((outcome, threading.get_ident()))

    def fails() -> int:
        raise EntryUnreadable("a bad sector")

    try:
        workers.run(threading.get_ident, told)
        reader, told_on = await outcomes.get()
        assert reader != threading.get_ident()
        assert told_on == threading.get_ident()
        workers.run(fails, told)
        error, told_on = await outcomes.get()
        assert isinstance(error, EntryUnreadable)
        assert told_on == threading.get_ident()
    finally:
        workers.close()


def test_without_threads_a_read_runs_where_it_is_asked() -> None:
    outcomes: list[int | Exception] = []
    ReadWorkers[int](0).run(threading.get_ident, outcomes.append)
    assert outcomes == [threading.get_ident()]


async def test_a_read_asked_once_the_workers_closed_is_answered_unavailable() -> None:
    workers = ReadWorkers[int](2)
    workers.close()
    outcome: asyncio.Future[int | Exception] = asyncio.get_running_loop().create_future()
    workers.run(lambda: 1, outcome.set_result)
    assert isinstance(await outcome, BookieUnavailable)


async def test_the_reads_of_one_turn_are_shared_among_the_threads_and_each_answered() -> None:
    """Ten reads asked in one turn go to the four threads in four shares, all at once (a
    barrier holds each share's first read until four threads reach it)."""
    workers = ReadWorkers[int](4)
    barrier = threading.Barrier(4, timeout=10)
    answers: dict[int, int | Exception] = {}
    all_answered = asyncio.get_running_loop().create_future()

    def read(n: int) -> int:
        if n < 4:
            barrier.wait()  # the first read of each share: n = 0..3
        return n * n

    def answered(n: int, outcome: int | Exception) -> None:
        answers[n] = outcome
        if len(answers) == 10:
            all_answered.set_result(None)

    try:
        for n in range(10):
            workers.run(functools.partial(read, n), functools.partial(answered, n))
        await all_answered
    finally:
        workers.close()
    assert answers == {n: n * n for n in range(10)}


async def test_read_entries_in_memory_are_answered_while_the_read_thread_waits_on_disk(
    tmp_path: Path,
) -> None:
    """READ_ENTRIES whose first entry is in memory is answered from the loop, as far as
    the entries in memory go; one whose first is on the slow disk waits its turn there."""
    ledger_id = new_ledger()
    bookie = await _bookie_with_checkpointed(
        tmp_path, ledger_id, f"entry_log.read=delay({SLOW_READ})", read_threads=1
    )
    try:
        async with connected(bookie.address) as connection:
            for entry_id in (2, 3):  # entries 0 and 1 are in an entry log, these in memory
                await connection.add(entry(ledger_id, entry_id), KEY)
            from_disk = asyncio.ensure_future(
                connection.read_entries(ledger_id, [0, 1, 2], 1 << 20)
            )
            await until(lambda: "failpoint entry_log.read: delay" in bookie.log(), "the slow read")
            assert await connection.read_entries(ledger_id, [2, 3], 1 << 20) == (
                entry(ledger_id, 2),
                entry(ledger_id, 3),
            )
            assert not from_disk.done(), "the read from memory waited for the one on disk"
            assert await from_disk == (
                entry(ledger_id, 0),
                entry(ledger_id, 1),
                entry(ledger_id, 2),
            )
    finally:
        assert await asyncio.to_thread(bookie.stop) == 0
