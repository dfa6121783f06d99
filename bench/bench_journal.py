"""Measure the bookie's journal beside the physical limits of the same disk, in the same run.

The issue's figures are for the whole bookie; the journal is the part of them that touches
the disk, so it must leave most of the budget to the rest:

- 64 KiB records, pipelined: MB/s against the raw rate of appending 64 KiB blocks with
  fdatasync every 1 MiB (goal for the bookie: >= 50 %);
- 100-byte records: acknowledged appends/s, with N concurrent appenders and with the
  server's pipelined `append_nowait` (goal for the bookie: >= 30,000/s);
- p99 append latency at a paced 1,000 appends/s against 2 x the disk's p99 fdatasync
  latency + 1 ms, with no group wait (the default) and with BookKeeper's 2 ms;
- replay (restart) MB/s from a cold page cache against a raw sequential read of the same
  files, and the time to replay a 1 GiB journal (measured for 64 KiB records, extrapolated
  from a smaller journal for 100-byte records, where the per-record cost dominates).

Physical references: a 128-byte pwrite + fdatasync in a loop (into preallocated space, and
appending to a growing file: the reason the journal preallocates), sequential 64 KiB
appends with fdatasync every MiB, and a cold sequential read.

    python bench/bench_journal.py [--dir D] [--seconds S] [--replay-mib M]

`main()` returns the figures as a dict for other tools.
"""

from __future__ import annotations

import argparse
import asyncio
import mmap
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tally.bookie.journal import Journal
from tally.bookie.journal_files import journal_files
from tally.bookie.journal_format import JournalMark

KIB, MIB = 1 << 10, 1 << 20
SMALL, LARGE = 100, 64 * KIB


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the disk ---------------------------------------------------------------------------


def raw_fdatasync(directory: Path, seconds: float, *, grow: bool) -> list[float]:
    """Latencies of a 128-byte write + fdatasync, looped for `seconds`."""
    path = directory / f"raw-fdatasync-{'grow' if grow else 'prealloc'}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if not grow:
            os.posix_fallocate(fd, 0, 64 * MIB)
            os.fsync(fd)
        block, position, latencies = os.urandom(128), 0, []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            os.pwrite(fd, block, position)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - started)
            position += len(block)
    finally:
        os.close(fd)
        path.unlink()
    return latencies


def raw_append(directory: Path, total: int) -> float:
    """MB/s of appending 64 KiB blocks to a new file with fdatasync every 1 MiB."""
    path = directory / "raw-append"
    block = os.urandom(LARGE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        started = time.perf_counter()
        for written in range(LARGE, total + 1, LARGE):
            os.write(fd, block)
            if written % MIB == 0:
                os.fdatasync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()
    return total / elapsed / 1e6


def raw_direct_writers(directory: Path, writers: int, total: int) -> float:
    """Aggregate MB/s of `writers` threads each writing `total` bytes to a file of its own
    with O_DIRECT, 1 MiB per write, each write followed by fdatasync: what the disk gives
    the journal and an entry log written at the same time."""
    chunk = mmap.mmap(-1, MIB)
    chunk.write(os.urandom(MIB))

    def write(index: int) -> None:
        path = directory / f"raw-direct-{index}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        try:
            for offset in range(0, total, MIB):
                os.pwrite(fd, chunk, offset)
                os.fdatasync(fd)
        finally:
            os.close(fd)
            path.unlink()

    with ThreadPoolExecutor(writers) as pool:
        started = time.perf_counter()
        for done in [pool.submit(write, index) for index in range(writers)]:
            done.result()
        elapsed = time.perf_counter() - started
    chunk.close()
    return writers * total / elapsed / 1e6


def drop_cache(paths: Sequence[Path]) -> None:
    """Evict the (clean, synced) pages of `paths`: a cold start without touching the rest."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def raw_read(paths: Sequence[Path]) -> float:
    """MB/s of reading `paths` sequentially, 8 MiB at a time, from a cold cache (1 MiB reads
    were twice as slow on this project's disks: the reference must be the disk's best)."""
    drop_cache(paths)
    total = 0
    started = time.perf_counter()
    for path in paths:
        with path.open("rb", buffering=0) as f:
            while chunk := f.read(8 * MIB):
                total += len(chunk)
    return total / (time.perf_counter() - started) / 1e6


# -- the journal ------------------------------------------------------------------------


async def closed_loop(directory: Path, appenders: int, seconds: float) -> float:
    """Appends/s of `appenders` coroutines, each awaiting one 100-byte append at a time."""
    journal = Journal(directory)
    await journal.start()
    loop = asyncio.get_running_loop()
    record, count = os.urandom(SMALL), 0
    deadline = loop.time() + seconds

    async def appender() -> None:
        nonlocal count
        while loop.time() < deadline:
            await journal.append(record)
            count += 1

    started = loop.time()
    await asyncio.gather(*[appender() for _ in range(appenders)])
    elapsed = loop.time() - started
    await journal.close()
    return count / elapsed


async def pipelined(
    directory: Path, size: int, window: int, total: int, **options: int
) -> tuple[float, Journal]:
    """Appends/s of `total` records of `size` bytes with `window` in flight (append_nowait)."""
    journal = Journal(directory, **options)
    await journal.start()
    record = os.urandom(size)
    in_flight: deque[asyncio.Future[JournalMark]] = deque()
    started = time.perf_counter()
    for _ in range(total):
        if len(in_flight) >= window:
            await in_flight.popleft()
        in_flight.append(journal.append_nowait(record))
    for future in in_flight:
        await future
    elapsed = time.perf_counter() - started
    await journal.close()
    return total / elapsed, journal


async def paced(
    directory: Path, rate: float, seconds: float, delay: float
) -> tuple[list[float], Journal]:
    """Latencies of 100-byte appends issued at a steady `rate`, each timed until acknowledged."""
    journal = Journal(directory, max_batch_delay=delay)
    await journal.start()
    loop = asyncio.get_running_loop()
    record, latencies = os.urandom(SMALL), []
    count = int(rate * seconds)
    finished = loop.create_future()

    def issue() -> None:
        issued = loop.time()

        def acknowledged(_: object) -> None:
            latencies.append(loop.time() - issued)
            if len(latencies) == count:
                finished.set_result(None)

        journal.append_nowait(record).add_done_callback(acknowledged)

    first = loop.time() + 0.05
    for i in range(count):
        loop.call_at(first + i / rate, issue)
    await finished
    await journal.close()
    return latencies, journal


async def fill(directory: Path, size: int, total_bytes: int) -> None:
    records = max(1, total_bytes // (size + 8))
    await pipelined(directory, size, max(64, 4 * MIB // size), records)


def replay_rate(directory: Path) -> tuple[float, int, int]:
    """(seconds, bytes, records) of a cold replay of everything in `directory`."""
    drop_cache([path for _, path in journal_files(directory)])
    count = total = 0
    started = time.perf_counter()
    for _, record in Journal(directory).replay():
        count += 1
        total += len(record)
    return time.perf_counter() - started, total, count


# -- the run ----------------------------------------------------------------------------


def row(figure: str, value: str, reference: str, ratio: str, goal: str = "") -> None:
    print(f"| {figure} | {value} | {reference} | {ratio} | {goal} |")


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of timed loops")
    parser.add_argument("--replay-mib", type=int, default=1024, help="64 KiB replay journal")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-journal-", dir=args.dir))
    print(
        f"scratch {scratch} (device {os.stat(scratch).st_dev:#x}), python {sys.version.split()[0]}"
    )

    def fresh(name: str) -> Path:
        path = scratch / name
        shutil.rmtree(path, ignore_errors=True)
        return path

    try:
        sync = raw_fdatasync(scratch, args.seconds, grow=False)
        grow = raw_fdatasync(scratch, args.seconds, grow=True)
        append_rate = raw_append(scratch, 256 * MIB)
        sync_p50, sync_p99 = quantile(sync, 0.5), quantile(sync, 0.99)
        budget = 2 * sync_p99 + 0.001

        closed = {
            n: asyncio.run(closed_loop(fresh(f"c{n}"), n, args.seconds)) for n in (1, 16, 256)
        }
        nowait, _ = asyncio.run(pipelined(fresh("nowait"), SMALL, 4096, 300_000))
        large, large_journal = asyncio.run(pipelined(fresh("large"), LARGE, 64, 4096))
        large_rate = large * LARGE / 1e6
        half, _ = asyncio.run(
            pipelined(fresh("large-half"), LARGE, 64, 4096, max_batch_bytes=512 * KIB)
        )
        half_rate = half * LARGE / 1e6
        latencies = {}
        for delay in (0.0, 0.002):
            samples, journal = asyncio.run(paced(fresh(f"p{delay}"), 1000, args.seconds, delay))
            latencies[delay] = (samples, journal.stats.fdatasync_quantile(0.99))

        big = fresh("replay-large")
        asyncio.run(fill(big, LARGE, args.replay_mib * MIB))
        reads, replays = [], []
        for _ in range(2):  # interleaved, best of each: the disk's own caches favour neither
            reads.append(raw_read([path for _, path in journal_files(big)]))
            replays.append(replay_rate(big))
        read_rate = max(reads)
        big_seconds, big_bytes, _ = min(replays)
        shutil.rmtree(big)
        small = fresh("replay-small")
        asyncio.run(fill(small, SMALL, 64 * MIB))
        small_seconds, small_bytes, small_records = replay_rate(small)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    on_disk = big_bytes * (LARGE + 8) / LARGE
    small_on_disk = small_bytes * (SMALL + 8) / SMALL
    figures = {
        "fdatasync_per_s": len(sync) / sum(sync),
        "fdatasync_p50_ms": sync_p50 * 1e3,
        "fdatasync_p99_ms": sync_p99 * 1e3,
        "fdatasync_grow_p50_ms": quantile(grow, 0.5) * 1e3,
        "fdatasync_grow_p99_ms": quantile(grow, 0.99) * 1e3,
        "raw_append_64k_mb_per_s": append_rate,
        "raw_read_mb_per_s": read_rate,
        **{f"journal_100b_{n}_appenders_per_s": rate for n, rate in closed.items()},
        "journal_100b_pipelined_per_s": nowait,
        "journal_64k_mb_per_s": large_rate,
        "journal_64k_512k_batches_mb_per_s": half_rate,
        "journal_64k_records_per_batch": large_journal.stats.records
        / max(1, large_journal.stats.batches),
        "latency_budget_ms": budget * 1e3,
        **{
            f"paced_1000_delay_{delay * 1e3:g}ms_p{q}_ms": quantile(samples, q / 100) * 1e3
            for delay, (samples, _) in latencies.items()
            for q in (50, 99)
        },
        "replay_64k_mb_per_s": on_disk / big_seconds / 1e6,
        "replay_64k_1gib_s": big_seconds * (1 << 30) / on_disk,
        "replay_100b_records_per_s": small_records / small_seconds,
        "replay_100b_mb_per_s": small_on_disk / small_seconds / 1e6,
        "replay_100b_1gib_s": small_seconds * (1 << 30) / small_on_disk,
    }

    print()
    print("| figure | journal | physical reference (same run) | ratio | goal (bookie) |")
    print("|---|---|---|---|---|")
    row(
        "128 B write + fdatasync, preallocated",
        f"{figures['fdatasync_per_s']:,.0f}/s",
        f"p50 {sync_p50 * 1e3:.3f} ms, p99 {sync_p99 * 1e3:.3f} ms",
        "",
        "reference",
    )
    row(
        "the same, appending to a growing file",
        f"p50 {figures['fdatasync_grow_p50_ms']:.3f} ms, "
        f"p99 {figures['fdatasync_grow_p99_ms']:.3f} ms",
        "preallocated, above",
        f"{figures['fdatasync_grow_p50_ms'] / figures['fdatasync_p50_ms']:.2f}x (p50)",
        "why preallocate",
    )
    for n, rate in closed.items():
        row(
            f"100 B appends, {n} appender{'s' if n > 1 else ''} (await append)",
            f"{rate:,.0f}/s",
            f"{figures['fdatasync_per_s']:,.0f} fdatasync/s",
            f"{rate / figures['fdatasync_per_s']:.1f} records per fdatasync",
            ">= 30,000/s" if n > 1 else "",
        )
    row(
        "100 B appends, pipelined append_nowait (4096 in flight)",
        f"{nowait:,.0f}/s",
        f"{figures['fdatasync_per_s']:,.0f} fdatasync/s",
        f"{nowait / 30_000:.1f}x the goal",
        ">= 30,000/s",
    )
    row(
        "64 KiB appends, pipelined (64 in flight), 1 MiB batches (default)",
        f"{large_rate:,.0f} MB/s ({figures['journal_64k_records_per_batch']:.1f} per batch)",
        f"{append_rate:,.0f} MB/s raw 64 KiB appends, fdatasync per MiB",
        f"{large_rate / append_rate:.2f}",
        ">= 0.50",
    )
    row(
        "the same, 512 KiB batches (BookKeeper's journalBufferedWritesThreshold)",
        f"{half_rate:,.0f} MB/s",
        f"{append_rate:,.0f} MB/s",
        f"{half_rate / append_rate:.2f}",
        "why 1 MiB",
    )
    for delay, (samples, journal_p99) in latencies.items():
        p99 = quantile(samples, 0.99)
        row(
            f"p99 latency at 1,000 appends/s, group wait {delay * 1e3:g} ms",
            f"{p99 * 1e3:.3f} ms (p50 {quantile(samples, 0.5) * 1e3:.3f}, "
            f"journal fdatasync p99 {journal_p99 * 1e3:.3f})",
            f"2 x p99 fdatasync + 1 ms = {budget * 1e3:.3f} ms",
            f"{p99 / budget:.2f}",
            "<= 1",
        )
    row(
        f"replay, 64 KiB records, {on_disk / MIB:,.0f} MiB, cold cache",
        f"{figures['replay_64k_mb_per_s']:,.0f} MB/s; "
        f"1 GiB in {figures['replay_64k_1gib_s']:.2f} s",
        f"{read_rate:,.0f} MB/s cold sequential 8 MiB reads of the same files",
        f"{figures['replay_64k_mb_per_s'] / read_rate:.2f}",
        "",
    )
    row(
        f"replay, 100 B records, {small_on_disk / MIB:,.0f} MiB, cold cache",
        f"{figures['replay_100b_records_per_s']:,.0f} records/s = "
        f"{figures['replay_100b_mb_per_s']:,.0f} MB/s; 1 GiB in "
        f"{figures['replay_100b_1gib_s']:.1f} s (extrapolated)",
        f"{read_rate:,.0f} MB/s cold sequential read",
        f"{figures['replay_100b_mb_per_s'] / read_rate:.2f}",
        "",
    )
    return figures


if __name__ == "__main__":
    main()
