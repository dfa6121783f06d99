"""Measure what a bookie's read threads cost and what they buy, with `read_threads` 1 (the
default), 4, and 0 (reads on the event loop) in the same run, beside the raw request/reply
rate over loopback measured in the same run.

Three `tally bookie` processes on loopback, a sqlite metadata store, one `tally.Client` in
this process. For each setting:

- catch-up reads: a closed E=3 WQ=2 AQ=2 ledger of 1 KiB entries, written, its bookies
  restarted (their last checkpoint puts every entry in an entry log), then read back in
  order by one reader (`max_outstanding_reads`, 64, in flight, a READ each): entries/s and
  the CPU per entry of the client and of the bookies together;
- a writer beside a slow disk: 1 KiB adds, 1,000 in flight, on a new E=3 WQ=3 AQ=2 ledger,
  alone and then while a reader reads random entries of such a closed ledger (16 at once)
  from bookies whose every entry-log read from the disk takes SLOW_READ seconds more (the
  `entry_log.read` failpoint: this kernel has no device-mapper to slow a real device),
  the entry logs' pages evicted from the page cache every 20 ms (a disk bigger than
  memory). Its adds/s during / alone is what a disk turning slow costs the writes of every
  other ledger of its bookies.

    python bench/bench_reads.py [--dir D] [--entries N] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.page_cache import drop_page_cache  # noqa: E402
from tests.support.processes import BookieProcess, init_cluster  # noqa: E402

from bench_client import PASSWORD, cpu_seconds, windowed  # noqa: E402
from raw_socket import request_reply_rate  # noqa: E402
from tally.client.client import Client  # noqa: E402
from tally.core.ids import LedgerId  # noqa: E402

KIB = 1 << 10
ENTRY_SIZE = KIB
BOOKIES = 3
WINDOW = 1_000
SLOW_READ = 0.005
"""Seconds the slowed disk adds to each entry-log read: a disk retrying, not yet failed."""
READS_IN_FLIGHT = 16
EVICT_EVERY = 0.02
SETTINGS = (1, 4, 0)
"""The `read_threads` compared: the default, more, and reads on the event loop (last)."""


@contextlib.contextmanager
def cluster(scratch: Path, read_threads: int) -> Iterator[tuple[str, list[BookieProcess]]]:
    """BOOKIES bookie processes with `read_threads`, on a new cluster under `scratch`."""
    metadata = init_cluster(scratch)
    env = {"TALLY_BOOKIE_READ_THREADS": str(read_threads)}
    bookies: list[BookieProcess] = []
    try:
        for i in range(BOOKIES):
            bookies.append(BookieProcess(metadata, scratch / f"bookie-{i}", env=env).start())
        yield metadata, bookies
    finally:
        for bookie in bookies:
            bookie.stop()


def restart(bookies: Sequence[BookieProcess], failpoints: str = "") -> list[int]:
    """Stop the bookies (a last checkpoint each: every entry in an entry log) and start them
    again, with `failpoints` set; their new pids."""
    for bookie in bookies:
        bookie.stop()
    for bookie in bookies:
        bookie.env = {**bookie.env, "TALLY_FAILPOINTS": failpoints}
        bookie.start()
    return [bookie.process.pid for bookie in bookies if bookie.process is not None]


async def write_closed(metadata: str, entries: int) -> LedgerId:
    """A closed E3 WQ2 AQ2 ledger of `entries` 1 KiB entries."""
    payload = os.urandom(ENTRY_SIZE)
    async with Client(metadata) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
        )
        window: list[asyncio.Future[int]] = []
        for _ in range(entries):
            window.append(writer.append_nowait(payload))
            if len(window) >= WINDOW:
                await asyncio.gather(*window)
                window.clear()
        await asyncio.gather(*window)
        await writer.close()
        return writer.ledger_id


async def read_back(client: Client, ledger_id: LedgerId, pids: Sequence[int]) -> dict[str, float]:
    """Entries/s of one reader over the whole ledger, and the CPU per entry."""
    reader = await client.open_ledger(ledger_id, password=PASSWORD, recovery=False)
    started, cpu, bookie_cpu = time.perf_counter(), time.process_time(), cpu_seconds(pids)
    count = 0
    async for _ in reader.read(0, reader.last_entry_id):
        count += 1
    seconds = time.perf_counter() - started
    return {
        "entries_per_s": count / seconds,
        "client_us": (time.process_time() - cpu) / count * 1e6,
        "bookies_us": (cpu_seconds(pids) - bookie_cpu) / count * 1e6,
    }


async def writer_beside_reads(
    metadata: str,
    ledger_id: LedgerId,
    seconds: float,
    pids: Sequence[int],
    ledger_dirs: Sequence[Path],
) -> dict[str, float]:
    """A writer's adds/s alone, then while a reader reads random entries of `ledger_id`,
    READS_IN_FLIGHT at once, from a disk bigger than memory: the entry logs' pages are
    evicted from the page cache every EVICT_EVERY seconds, so most reads wait for it."""
    payload = os.urandom(ENTRY_SIZE)
    async with Client(metadata) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        alone = await windowed(writer, payload, WINDOW, seconds, pids)
        reader = await client.open_ledger(ledger_id, password=PASSWORD, recovery=False)
        reads = 0

        async def read_on() -> None:
            nonlocal reads
            while True:
                await reader.read_entry(random.randint(0, reader.last_entry_id))
                reads += 1

        logs = [log for directory in ledger_dirs for log in directory.rglob("*.log")]

        async def evict_on() -> None:
            while True:
                for log in logs:
                    drop_page_cache(log)
                await asyncio.sleep(EVICT_EVERY)

        background = [asyncio.create_task(read_on()) for _ in range(READS_IN_FLIGHT)]
        background.append(asyncio.create_task(evict_on()))
        try:
            during = await windowed(writer, payload, WINDOW, seconds, pids)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
        await writer.close()
    return {
        "alone": alone.adds_per_s,
        "during": during.adds_per_s,
        "reads_per_s": reads / (seconds * 1.1),
    }


def measure(scratch: Path, read_threads: int, entries: int, seconds: float) -> dict[str, float]:
    with cluster(scratch / f"catch-up-{read_threads}", read_threads) as (metadata, bookies):
        ledger_id = asyncio.run(write_closed(metadata, entries))
        pids = restart(bookies)

        async def catch_up() -> dict[str, float]:
            async with Client(metadata) as client:
                return await read_back(client, ledger_id, pids)

        figures = asyncio.run(catch_up())
    with cluster(scratch / f"slow-{read_threads}", read_threads) as (metadata, bookies):
        ledger_id = asyncio.run(write_closed(metadata, entries // 4))
        pids = restart(bookies, f"entry_log.read=delay({SLOW_READ})")
        dirs = [bookie.data_dir / "ledgers" for bookie in bookies]
        figures |= asyncio.run(writer_beside_reads(metadata, ledger_id, seconds, pids, dirs))
    return figures


def main(argv: Sequence[str] | None = None) -> dict[int, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    parser.add_argument("--entries", type=int, default=20_000, help="entries read back")
    parser.add_argument("--seconds", type=float, default=4.0, help="each writer window")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-reads-", dir=args.dir))
    print(f"scratch {scratch}, python {sys.version.split()[0]}, {os.cpu_count()} cores")
    try:
        raw_rate = request_reply_rate(args.seconds * 0.75)
        results = {n: measure(scratch, n, args.entries, args.seconds) for n in SETTINGS}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    on = [results[n] for n in SETTINGS[:-1]]
    off = results[0]
    heads = " | ".join(f"read_threads = {n}" for n in SETTINGS)
    ratios = " | ".join(f"{n} / 0" for n in SETTINGS[:-1])
    print(f"| figure | {heads} | {ratios} |")
    print("|---" * (len(SETTINGS) * 2) + "|")

    def line(figure: str, shown: Callable[[dict[str, float]], str], key: str) -> None:
        values = " | ".join(shown(results[n]) for n in SETTINGS)
        against = " | ".join(f"{r[key] / off[key]:.2f}" for r in on)
        print(f"| {figure} | {values} | {against} |")

    line(
        "catch-up reads, 1 KiB, 64 in flight: entries/s",
        lambda r: f"{r['entries_per_s']:,.0f}",
        "entries_per_s",
    )
    line(
        "the same: CPU per entry, client / bookies (ratio: bookies)",
        lambda r: f"{r['client_us']:.0f} / {r['bookies_us']:.0f} us",
        "bookies_us",
    )
    line(
        "a writer's 1 KiB adds/s (E3 WQ3 AQ2, 1,000 in flight), alone",
        lambda r: f"{r['alone']:,.0f}",
        "alone",
    )
    line(
        f"the same beside a reader whose every entry-log read is {SLOW_READ * 1e3:g} ms slower",
        lambda r: (
            f"{r['during']:,.0f} ({r['during'] / r['alone']:.2f} of alone; "
            f"{r['reads_per_s']:,.0f} reads/s)"
        ),
        "during",
    )
    print(
        f"\nreference: raw request/reply over loopback, 100 B, 1,000 in flight: {raw_rate:,.0f}/s"
    )
    return results


if __name__ == "__main__":
    main()
