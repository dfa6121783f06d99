"""Measure the online replicas check over many closed ledgers on real bookies, beside the
physical limits measured in the same run (issues 7 and 21).

Three `tally bookie` processes on loopback, a sqlite metadata store, and `--ledgers` closed
ledgers (E=3 WQ=2 AQ=2, `--entries` small entries each) written through `tally.Client`.
Then full `replicas_check` runs, each in a fresh process of its own (`--run-check`, the same
harness for every code under test): ledgers checked per second and the checker's CPU per
ledger, with the default AutoRecoveryConfig limits (32 bookie requests and 100 metadata
reads in flight, so pages of 50 ledgers). The check asks each bookie once per page of
ledgers (GET_LIST_OF_ENTRIES_OF_LEDGERS); with `--baseline DIR` (the `src` of a checkout of
the code before, e.g. a `git worktree add /tmp/ab-replicas main`), that code's check runs
too, on the same cluster, turns alternating, `--turns` of each.

The physical references, same run, one bookie through one `BookieConnection`, `--window`
requests in flight (pipelined), cycling over the same ledgers:
- the raw GET_LIST_OF_ENTRIES_OF_LEDGERS rate in ledgers/s, lists of `--list-size` (the
  check's page, 50) ledgers: how fast one bookie, one process on one core, answers the
  check's question. Each ledger is asked of its three bookies, which share this machine's
  cores (with the checker too), so the ceiling the run prints is that rate x min(cores, 3)
  / 3: two thirds of it on 2 cores, the rate itself with 3 or more;
- the raw GET_LIST_OF_ENTRIES_OF_LEDGER request/reply rate (one ledger a request), the
  ceiling of a check that asks per ledger (the code before issue 21);
- the walk alone: every ledger's metadata read page by page, as the check reads it.

    python bench/bench_replicas_check.py [--ledgers 10000] [--entries 4] [--baseline DIR]

The default run takes about two minutes (most of it writing the ledgers). `main()` returns the
figures as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
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
PAGE = AutoRecoveryConfig().auditor_max_concurrent_metadata_reads // 2
"""The check's page of ledgers with the default limits."""


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


async def raw_rate(
    address: str,
    ask: Callable[[BookieConnection, int], Awaitable[object]],
    window: int,
    seconds: float,
) -> float:
    """Answers/s of one bookie to `ask(connection, n)` (the n-th request), `window` in
    flight, after a warm-up of a tenth of the run."""
    connection = await BookieConnection.connect(address)
    clock = time.perf_counter
    try:
        sent = 0

        def issue() -> asyncio.Future[object]:
            nonlocal sent
            sent += 1
            return asyncio.ensure_future(ask(connection, sent))

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
            if not answered % 10 and clock() >= deadline:
                break
        elapsed = clock() - started
        for future in in_flight:
            await future
        return answered / elapsed
    finally:
        await connection.close()


async def walk_rate(client: Client, ledgers: int) -> float:
    """Ledgers/s of the check's metadata walk alone: every page read and decoded."""
    started = time.perf_counter()
    seen = 0
    async for page in client.context.ledgers.ledger_pages(PAGE):
        seen += len(page.ledgers)
    if seen != ledgers:
        raise RuntimeError(f"the walk saw {seen} ledgers, {ledgers} were written")
    return ledgers / (time.perf_counter() - started)


def timed_check(code: Path, metadata: str, ledgers: int) -> dict[str, float]:
    """One full check by the code in `code` (a `src` directory), in a process of its own."""
    environment = dict(os.environ, PYTHONPATH=f"{code}:{REPO}")
    done = subprocess.run(
        [sys.executable, __file__, "--run-check", metadata, "--ledgers", str(ledgers)],
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"the check of {code} failed:\n{done.stderr}")
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


async def run_check(metadata: str, ledgers: int) -> dict[str, float]:
    """`--run-check`: one full check with the default limits; its rate and CPU."""
    async with Client(metadata) as client:
        cpu = time.process_time()
        report = await replicas_check(client.context, AutoRecoveryConfig())
        cpu = time.process_time() - cpu
    if report.ledgers_checked != ledgers or any(report.counts.values()):
        raise RuntimeError(f"unexpected replicas check result: {report}")
    return {
        "ledgers_per_s": ledgers / report.duration_s,
        "seconds": report.duration_s,
        "cpu_us_per_ledger": cpu / ledgers * 1e6,
    }


async def prepare(
    metadata: str,
    address: str,
    ledgers: int,
    entries: int,
    window: int,
    list_size: int,
    seconds: float,
) -> dict[str, float]:
    """Write the ledgers, then measure the physical references on them."""
    async with Client(metadata) as client:
        started = time.perf_counter()
        written = await write_ledgers(client, ledgers, entries)
        write_s = time.perf_counter() - started
        walk = await walk_rate(client, ledgers)
    lists = [written[i : i + list_size] for i in range(0, len(written), list_size)]
    raw_lists = await raw_rate(
        address,
        lambda connection, n: connection.get_lists_of_entries(lists[n % len(lists)]),
        max(1, window // list_size),
        seconds,
    )
    raw_single = await raw_rate(
        address,
        lambda connection, n: connection.get_list_of_entries(written[n % len(written)]),
        window,
        seconds,
    )
    return {
        "ledgers": float(ledgers),
        "write_ledgers_per_s": ledgers / write_s,
        "walk_ledgers_per_s": walk,
        "raw_list_ledgers_per_s": raw_lists * list_size,
        "raw_single_requests_per_s": raw_single,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledgers", type=int, default=10_000, help="closed ledgers to check")
    parser.add_argument("--entries", type=int, default=4, help="entries per ledger")
    parser.add_argument("--window", type=int, default=1_000, help="raw ledgers in flight")
    parser.add_argument("--list-size", type=int, default=PAGE, help="ledgers per raw list")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each raw rate")
    parser.add_argument("--turns", type=int, default=2, help="checks of each code")
    parser.add_argument("--baseline", type=Path, help="the src of the code before (A/B)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    parser.add_argument("--run-check", metavar="METADATA", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_check:
        figures = asyncio.run(run_check(args.run_check, args.ledgers))
        print(json.dumps(figures))
        return figures

    codes = {"this code": REPO / "src"}
    if args.baseline is not None:
        codes["baseline"] = args.baseline.resolve()
    scratch = Path(tempfile.mkdtemp(prefix="bench-replicas-check-", dir=args.dir))
    print(f"scratch {scratch}, python {sys.version.split()[0]}, {os.cpu_count()} cores")
    bookies: list[BookieProcess] = []
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in codes}
    try:
        metadata = init_cluster(scratch)
        bookies = [BookieProcess(metadata, scratch / f"bookie-{i}").start() for i in range(BOOKIES)]
        figures = asyncio.run(
            prepare(
                metadata,
                bookies[0].address,
                args.ledgers,
                args.entries,
                args.window,
                args.list_size,
                args.seconds,
            )
        )
        for turn in range(args.turns):
            for name, code in codes.items():
                runs[name].append(timed_check(code, metadata, args.ledgers))
                print(f"turn {turn + 1}, {name}: {runs[name][-1]}", flush=True)
    finally:
        for bookie in bookies:
            bookie.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    raw_lists = figures["raw_list_ledgers_per_s"]
    raw_single = figures["raw_single_requests_per_s"]
    cores = os.cpu_count() or 1
    ceiling = raw_lists * min(cores, BOOKIES) / BOOKIES
    figures["ceiling_ledgers_per_s"] = ceiling
    print("\n| figure | value | physical reference (same run) | ratio |\n|---|---|---|---|")
    for name, checks in runs.items():
        best = max(checks, key=lambda check: check["ledgers_per_s"])
        rate = best["ledgers_per_s"]
        shown = ", ".join(f"{check['ledgers_per_s']:,.0f}" for check in checks)
        figures |= {
            f"check_{name}_ledgers_per_s": rate,
            f"check_{name}_cpu_us_per_ledger": best["cpu_us_per_ledger"],
        }
        print(
            f"| replicas check ({name}), {args.ledgers:,} closed ledgers (E=3 WQ=2 AQ=2, "
            f"{args.entries} entries), default limits | {rate:,.0f} ledgers/s, best of "
            f"{len(checks)} ({shown}); checker CPU {best['cpu_us_per_ledger']:.0f} us per "
            f"ledger | the three bookies' ceiling on {cores} cores: one bookie (one core) "
            f"answers GET_LIST_OF_ENTRIES_OF_LEDGERS, lists of {args.list_size}, at "
            f"{raw_lists:,.0f} ledgers/s, x {min(cores, BOOKIES)} cores / {BOOKIES} bookies "
            f"= {ceiling:,.0f} ledgers/s | {rate / ceiling:.2f} |"
        )
    print(
        f"| one bookie answering GET_LIST_OF_ENTRIES_OF_LEDGER (one ledger a request), "
        f"{args.window:,} in flight | {raw_single:,.0f} ledgers/s | the lists above "
        f"| {raw_single / raw_lists:.2f} |"
    )
    print(
        f"| the walk alone: metadata pages of {PAGE}, read and decoded "
        f"| {figures['walk_ledgers_per_s']:,.0f} ledgers/s | | |"
    )
    print(
        f"| writing those ledgers ({WRITERS} at a time) "
        f"| {figures['write_ledgers_per_s']:,.0f} ledgers/s | | |"
    )
    if "baseline" in runs:
        ratio = figures["check_this code_ledgers_per_s"] / figures["check_baseline_ledgers_per_s"]
        print(f"\nthis code / baseline: {ratio:.2f}x")
    return figures


if __name__ == "__main__":
    main()
