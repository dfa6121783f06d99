"""Measure re-replication: MB/s a replication worker restores after losing a bookie that
held N MiB, beside the raw disk rate measured in the same run (issue 7's figure).

Three bookie processes hold ledgers of 64 KiB entries (E3 WQ2 AQ2, so the victim holds two
thirds of every ledger: N MiB in all); a fourth, empty one starts, the victim is SIGKILLed,
and once its registration has lapsed every ledger is marked under-replicated naming it, as
the auditor would (the auditor's own delay is not part of the figure). One
`ReplicationWorker` with the default settings (`rereplication_entry_batch_size` entries in
flight, no rate limit) then repairs them, in this process; the figure is the bytes it wrote
over the time from the marks to the last mark's removal. Reads come from the two
survivors, writes go to the newcomer; all bookies share the scratch directory's disk.

The reference is bench_bookie.py's: appending 64 KiB blocks to a new file with fdatasync
every 1 MiB, on the same disk (bench_journal.raw_append).

    python bench/bench_rereplication.py [--mib N] [--batch B] [--dir D]

--mib defaults to 64 (1024: the issue's 1 GiB). `main()` returns the figures as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from bench_bookie import BookieServer, init_metadata, row
from bench_journal import raw_append
from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.replication_worker import ReplicationWorker
from tally.client.client import Client
from tally.core.ids import LedgerId

KIB, MIB = 1 << 10, 1 << 20
ENTRY = 64 * KIB
LEDGER_ENTRIES = 256
"""16 MiB ledgers: several ledgers even at the default size, as a real bookie holds."""
PASSWORD = b"bench-rereplication"
BOOKIE_SETTINGS = {"TALLY_BOOKIE_SESSION_TIMEOUT": "2"}
"""A killed bookie's registration lapses in seconds, so the run does not wait 10 s."""
REFERENCE_BYTES = 256 * MIB


async def write_ledgers(uri: str, victim_mib: int) -> list[LedgerId]:
    """Ledgers on the three running bookies; the victim (any of them) holds `victim_mib`."""
    total = victim_mib * MIB * 3 // 2
    ledgers = max(1, round(total / (ENTRY * LEDGER_ENTRIES)))
    per_ledger = max(1, total // ENTRY // ledgers)
    payload = os.urandom(ENTRY)
    written: list[LedgerId] = []
    async with Client(uri) as client:
        for _ in range(ledgers):
            writer = await client.create_ledger(
                ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
            )
            await asyncio.gather(*(writer.append_nowait(payload) for _ in range(per_ledger)))
            await writer.close()
            written.append(writer.ledger_id)
    return written


async def wait_writable(uri: str, expected: set[str], timeout: float = 60.0) -> None:
    async with Client(uri) as client:
        deadline = time.monotonic() + timeout
        while set(await client.context.registry.writable_bookies()) != expected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the writable bookies did not become {sorted(expected)}")
            await asyncio.sleep(0.1)


async def rereplicate(
    uri: str, ledgers: list[LedgerId], victim: str, batch: int
) -> dict[str, float]:
    """Mark every ledger for `victim`, run one worker until no mark is left."""
    config = replace(AutoRecoveryConfig(), under_replicated_poll_interval=0.1)
    if batch:
        config = replace(config, rereplication_entry_batch_size=batch)
    async with Client(uri) as client:
        manager = client.context.under_replication
        worker = ReplicationWorker(client.context, config, "bench", passwords=(PASSWORD,))
        started = time.perf_counter()
        for ledger_id in ledgers:
            await manager.mark_under_replicated(ledger_id, [victim])
        task = asyncio.create_task(worker.run())
        try:
            while [mark async for mark in manager.list_under_replicated()]:
                if task.done():
                    task.result()
                    raise RuntimeError("the worker stopped before the repair ended")
                await asyncio.sleep(0.05)
            elapsed = time.perf_counter() - started
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        status = worker.status()
        records = [await client.context.ledgers.read_ledger_metadata(x) for x in ledgers]
    if any(victim in record.metadata.bookies() for record in records):
        raise RuntimeError(f"a ledger still names the lost bookie {victim}")
    if status["failed"] or status["lost"]:
        raise RuntimeError(f"the worker did not repair everything cleanly: {status}")
    return {
        "rereplication_seconds": elapsed,
        "rereplicated_bytes": float(status["bytes_copied"]),
        "rereplicated_entries": float(status["entries_copied"]),
        "rereplication_mb_per_s": status["bytes_copied"] / elapsed / 1e6,
        "batch": float(config.rereplication_entry_batch_size),
    }


def measure(scratch: Path, victim_mib: int, batch: int) -> dict[str, float]:
    metadata = init_metadata(scratch)
    bookies = [
        BookieServer(metadata, scratch / f"bookie-{i}", settings=BOOKIE_SETTINGS) for i in range(4)
    ]
    with ExitStack() as stack:
        for bookie in bookies[:3]:
            bookie.start()
            stack.callback(bookie.stop)
        ledgers = asyncio.run(write_ledgers(metadata, victim_mib))
        newcomer = bookies[3]
        newcomer.start()
        stack.callback(newcomer.stop)
        victim = bookies[0]
        victim.kill()
        asyncio.run(wait_writable(metadata, {b.address for b in bookies[1:]}))
        figures = asyncio.run(rereplicate(metadata, ledgers, victim.address, batch))
    figures["ledgers"] = float(len(ledgers))
    figures["raw_append_64k_mb_per_s"] = raw_append(scratch, min(REFERENCE_BYTES, victim_mib * MIB))
    return figures


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB the lost bookie held (64)")
    parser.add_argument("--batch", type=int, default=0, help="entries in flight (config's)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-rereplication-", dir=args.dir))
    print(
        f"scratch {scratch} (device {os.stat(scratch).st_dev:#x}), python "
        f"{sys.version.split()[0]}, {os.cpu_count()} cores; the lost bookie held {args.mib} MiB"
    )
    try:
        figures = measure(scratch, args.mib, args.batch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(figures, args.mib)
    return figures


def print_table(figures: dict[str, float], mib: int) -> None:
    raw = figures["raw_append_64k_mb_per_s"]
    rate = figures["rereplication_mb_per_s"]
    print("| figure | measured | physical reference (same run) | ratio | goal | met? |")
    print("|---|---|---|---|---|---|")
    row(
        f"re-replication after losing a bookie that held {mib} MiB "
        f"({figures['ledgers']:.0f} ledgers, 64 KiB entries, {figures['batch']:.0f} in flight)",
        f"{rate:,.1f} MB/s ({figures['rereplicated_bytes'] / MIB:,.0f} MiB, "
        f"{figures['rereplicated_entries']:,.0f} entries "
        f"in {figures['rereplication_seconds']:.1f} s)",
        f"raw 64 KiB appends, fdatasync every 1 MiB: {raw:,.0f} MB/s",
        f"{rate / raw:.2f}",
        "",
        "",
    )


if __name__ == "__main__":
    main()
