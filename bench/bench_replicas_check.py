"""Measure the online replicas check over many closed ledgers on real bookies, beside the
physical limit measured in the same run (issue 7).

Three `tally bookie` processes on loopback, a sqlite metadata store, and `--ledgers` closed
ledgers (E=3 WQ=2 AQ=2, `--entries` small entries each) written through `tally.Client`.
Then full `replicas_check` runs: ledgers checked per second, with the default
AutoRecoveryConfig limits (32 bookie requests and 100 metadata reads in flight) and with
both limits raised to `--window`, which shows what the limits cost and what the check
itself costs. Each ledger takes one GET_LIST_OF_ENTRIES_OF_LEDGER request to each of its
three bookies.

The physical reference, same run: the raw GET_LIST_OF_ENTRIES_OF_LEDGER request/reply rate
of one bookie through one `BookieConnection`, `--window` requests in flight (pipelined),
over the same ledgers; beside it, the requests/s the check made. With at least four cores
the three bookies answer in parallel and the check's ceiling, in ledgers/s, is that raw
rate itself; with fewer, the bookies and the checker share the cores and the ceiling is
nearer a third of it (three requests per ledger), so the run prints the cores it had.

    python bench/bench_replicas_check.py [--ledgers 10000] [--entries 4] [--dir D]

The default run takes about two minutes (most of it writing the ledgers). `main()` returns the
figures as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.processes import BookieProcess, init_cluster  # noqa: E402

from tally.autorecovery.config import AutoRecoveryConfig  # noqa: E402
from tally.autorecovery.replicas_check import replicas_check  # noqa: E402
from tally.client.bookie_connection import BookieConnection  # noqa: E402
from tally.client.client import Client  # noqa: E402
from tally.core.ids import LedgerId  # noqa: E402

BOOKIES = 3
PASSWORD = b"bench-replicas-check"
WRITERS = 64
"""Ledgers written at once."""


async def write_ledgers(client: Client, count: int, entries: int) -> list[LedgerId]:
    """`count` closed ledgers of `entries` 100-byte entries, WRITERS at a time."""
    payload = os.urandom(100)
    written: list[LedgerId] = []

    async def one() -> None:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
        )
        await asyncio.gather(*(writer.append_nowait(payload) for _ in range(entries)))
        await writer.close()
        written.append(writer.ledger_id)

    for start in range(0, count, WRITERS):
        await asyncio.gather(*(one() for _ in range(min(WRITERS, count - start))))
    return written


async def raw_list_rate(
    address: str, ledgers: Sequence[LedgerId], window: int, seconds: float
) -> float:
    """GET_LIST_OF_ENTRIES_OF_LEDGER answers/s of one bookie, `window` in flight, cycling
    through `ledgers`, after a warm-up of a tenth of the run."""
    connection = await BookieConnection.connect(address)
    ask = connection.get_list_of_entries
    clock = time.perf_counter
    try:
        sent = 0

        def issue() -> asyncio.Future[object]:
            nonlocal sent
            sent += 1
            return asyncio.ensure_future(ask(ledgers[sent % len(ledgers)]))

        in_flight = deque(issue() for _ in range(window))
        warm_up = clock() + seconds / 10
        while clock() < warm_up:
            await in_flight.popleft()
            in_flight.append(issue())
        answered, started = 0, clock()
        deadline = started + seconds
        while True:
            await in_flight.popleft()
            in_flight.append(issue())
            answered += 1
            if not answered % 100 and clock() >= deadline:
                break
        elapsed = clock() - started
        for future in in_flight:
            await future
        return answered / elapsed
    finally:
        await connection.close()


async def timed_check(client: Client, config: AutoRecoveryConfig, ledgers: int) -> Check:
    cpu = time.process_time()
    report = await replicas_check(client.context, config)
    cpu = time.process_time() - cpu
    if report.ledgers_checked != ledgers or any(report.counts.values()):
        raise RuntimeError(f"unexpected replicas check result: {report}")
    return Check(ledgers / report.duration_s, report.duration_s, cpu / ledgers)


@dataclass(frozen=True)
class Check:
    ledgers_per_s: float
    seconds: float
    cpu_per_ledger: float
    """Seconds of this process's CPU per ledger checked."""


async def measure(
    metadata: str, address: str, ledgers: int, entries: int, window: int, seconds: float
) -> dict[str, float]:
    async with Client(metadata) as client:
        started = time.perf_counter()
        written = await write_ledgers(client, ledgers, entries)
        write_s = time.perf_counter() - started
        raw = await raw_list_rate(address, written, window, seconds)
        checks = {
            "default": await timed_check(client, AutoRecoveryConfig(), ledgers),
            "raised": await timed_check(
                client,
                AutoRecoveryConfig(
                    auditor_max_concurrent_bookie_requests=window,
                    auditor_max_concurrent_metadata_reads=window,
                ),
                ledgers,
            ),
        }
    figures = {
        "ledgers": float(ledgers),
        "write_ledgers_per_s": ledgers / write_s,
        "raw_list_requests_per_s": raw,
    }
    for name, check in checks.items():
        figures |= {
            f"check_{name}_ledgers_per_s": check.ledgers_per_s,
            f"check_{name}_seconds": check.seconds,
            f"check_{name}_cpu_us_per_ledger": check.cpu_per_ledger * 1e6,
            f"check_{name}_requests_to_raw_ratio": BOOKIES * check.ledgers_per_s / raw,
        }
    return figures


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledgers", type=int, default=10_000, help="closed ledgers to check")
    parser.add_argument("--entries", type=int, default=4, help="entries per ledger")
    parser.add_argument("--window", type=int, default=1_000, help="raw requests in flight")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of the raw rate")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="bench-replicas-check-", dir=args.dir))
    print(f"scratch {scratch}, python {sys.version.split()[0]}, {os.cpu_count()} cores")
    bookies: list[BookieProcess] = []
    try:
        metadata = init_cluster(scratch)
        bookies = [BookieProcess(metadata, scratch / f"bookie-{i}").start() for i in range(BOOKIES)]
        figures = asyncio.run(
            measure(
                metadata, bookies[0].address, args.ledgers, args.entries, args.window, args.seconds
            )
        )
    finally:
        for bookie in bookies:
            bookie.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    raw = figures["raw_list_requests_per_s"]
    print("\n| figure | value | physical reference (same run) | ratio |\n|---|---|---|---|")
    for name, limits in (
        ("default", "default limits (32 bookie requests, 100 metadata reads)"),
        ("raised", f"limits raised to {args.window:,}"),
    ):
        rate = figures[f"check_{name}_ledgers_per_s"]
        print(
            f"| replicas check, {args.ledgers:,} closed ledgers (E=3 WQ=2 AQ=2, "
            f"{args.entries} entries), {limits} | {rate:,.0f} ledgers/s "
            f"({figures[f'check_{name}_seconds']:.1f} s; checker CPU "
            f"{figures[f'check_{name}_cpu_us_per_ledger']:.0f} us per ledger), so "
            f"{BOOKIES * rate:,.0f} requests/s "
            f"| raw GET_LIST_OF_ENTRIES_OF_LEDGER, one bookie, {args.window:,} in flight: "
            f"{raw:,.0f} /s ({os.cpu_count()} cores) "
            f"| {figures[f'check_{name}_requests_to_raw_ratio']:.2f} (requests/s); "
            f"{rate / raw:.2f} (ledgers/s) |"
        )
    print(
        f"| writing those ledgers ({WRITERS} at a time) "
        f"| {figures['write_ledgers_per_s']:,.0f} ledgers/s | | |"
    )
    return figures


if __name__ == "__main__":
    main()
