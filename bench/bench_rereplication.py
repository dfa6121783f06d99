"""Measure re-replication: MB/s a replication worker restores after losing a bookie that
held N MiB, beside the raw disk rate measured in the same run (issue 7's figure).

Three bookie processes hold ledgers of 64 KiB entries (E3 WQ2 AQ2, so the victim holds two
thirds of every ledger: N MiB in all); a fourth, empty one starts, the victim is SIGKILLed,
and once its registration has lapsed every ledger is marked under-replicated naming it, as
the auditor would (the auditor's own delay is not part of the figure). One
`ReplicationWorker` with the default settings (`rereplication_entry_batch_size` entries a
read, `rereplication_ledgers_in_parallel` ledgers at once, no rate limit) then repairs them,
in this process; the figure is the bytes it wrote over the time from the marks to the last
mark's removal. Reads come from the two
survivors, writes go to the newcomer; all bookies share the scratch directory's disk.

The reference is bench_bookie.py's: appending 64 KiB blocks to a new file with fdatasync
every 1 MiB, on the same disk (bench_journal.raw_append); beside it, 64 KiB frames echoed
over loopback (raw_socket.py), since each copied byte crosses it twice, and raw_copy.py's:
the disk copying files to itself (the survivors' reads and the newcomer's writes share it)
and a bare Python copy of the same entries over loopback, with no protocol, directly and
through a relay process. The CPU seconds of the worker and each bookie during the repair
are printed too.

Second figure (issue 21): on a new cluster whose lost bookie held min(N, 256) MiB, a writer
in a process of its own (100 B adds, 100 in flight, E3 WQ2 AQ2) measures its adds/s for
10 s alone, then 10 s while one worker repairs with the default `replication_rate_by_bytes`
(or --rate-limit), then 10 s alone again once the repair is over; the figure is the ratio
of the writer during the repair to the mean of the two alone. That cluster's bookies
checkpoint every 2 s (WRITER_BOOKIE_SETTINGS), so that each window pays for its own.

    python bench/bench_rereplication.py [--mib N] [--batch B] [--rate-limit BYTES]
        [--writer-only] [--profile] [--dir D]

--mib defaults to 64 (1024: the issue's 1 GiB). `main()` returns the figures as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from bench_bookie import BookieServer, init_metadata, row
from bench_journal import raw_append
from raw_copy import copy_references
from raw_socket import loopback_mb_per_s
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
WRITER_BOOKIE_SETTINGS = {**BOOKIE_SETTINGS, "TALLY_BOOKIE_FLUSH_INTERVAL": "2"}
"""The cluster with a writer checkpoints every 2 s, not every 60: each window of the writer
then pays for its own entries' checkpoints, where a 60-s checkpoint of what the windows
before it left fell in whichever window its timer chose (in three runs, each time in the
one during the repair, and none in the others)."""
REFERENCE_BYTES = 256 * MIB
WRITER_ENTRY = 100
WRITER_WINDOW = 100
"""The concurrent writer's load: 100 B adds, this many in flight, E3 WQ2 AQ2."""
WRITER_SECONDS = 10.0
"""Each of the writer's three windows: this machine's adds/s drift by 10-30 % between
windows of 4 s, as much as the repair's effect."""
WRITER_MIB = 256
"""The lost bookie's data in the run with a writer: enough for the repair to outlast it."""
CPU_NAMES = ("worker", "survivor_1", "survivor_2", "newcomer")
"""The processes whose CPU seconds during the repair the bench reports."""


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


async def write_for(uri: str, seconds: float) -> float:
    """Acknowledged 100 B adds/s of one ledger writer, `WRITER_WINDOW` in flight, over
    `seconds` after a warm-up of a tenth of that."""
    payload = os.urandom(WRITER_ENTRY)
    async with Client(uri) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
        )
        in_flight = deque(writer.append_nowait(payload) for _ in range(WRITER_WINDOW))
        count, started = 0, time.perf_counter() + seconds / 10
        while True:
            await in_flight.popleft()
            in_flight.append(writer.append_nowait(payload))
            now = time.perf_counter()
            if now < started:
                continue
            if not count:
                print("measuring", flush=True)
            count += 1
            if now >= started + seconds:
                break
        await asyncio.gather(*in_flight)
        await writer.close()
    return count / (time.perf_counter() - started)


def writer_process(uri: str, seconds: float) -> subprocess.Popen[str]:
    """This file's --write mode in a process of its own, as an application would be;
    returned once its warm-up is over and it measures."""
    command = [sys.executable, __file__, "--write", uri, "--seconds", str(seconds)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "measuring":
        process.wait()
        raise RuntimeError(f"the writer exited with {process.returncode}")
    return process


def writer_result(process: subprocess.Popen[str]) -> float:
    out, _ = process.communicate()
    if process.returncode:
        raise RuntimeError(f"the writer exited with {process.returncode}")
    return float(out.split()[-1])


def cpu_seconds(pids: Sequence[int]) -> list[float]:
    """User + system CPU seconds of each process so far (/proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds = []
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        seconds.append((int(fields[11]) + int(fields[12])) / tick)
    return seconds


async def rereplicate(
    uri: str,
    ledgers: list[LedgerId],
    victim: str,
    batch: int,
    bookie_pids: Sequence[int] = (),
    *,
    rate_limit: int = -1,
) -> dict[str, float]:
    """Mark every ledger for `victim`, run one worker until no mark is left, copying at
    most `rate_limit` bytes/s (-1: no limit)."""
    config = replace(
        AutoRecoveryConfig(),
        under_replicated_poll_interval=0.1,
        replication_rate_by_bytes=rate_limit,
    )
    if batch:
        config = replace(config, rereplication_entry_batch_size=batch)
    async with Client(uri) as client:
        manager = client.context.under_replication
        worker = ReplicationWorker(client.context, config, "bench", passwords=(PASSWORD,))
        started = time.perf_counter()
        cpu_before = [time.process_time(), *cpu_seconds(bookie_pids)]
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
            cpu = [
                after - before
                for after, before in zip(
                    [time.process_time(), *cpu_seconds(bookie_pids)], cpu_before, strict=True
                )
            ]
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
        **{f"cpu_seconds_{name}": seconds for name, seconds in zip(CPU_NAMES, cpu, strict=False)},
    }


def measure(
    scratch: Path, victim_mib: int, batch: int, rate_limit: int, *, profile: bool, alone: bool
) -> dict[str, float]:
    """The repair without a rate limit (if `alone`), then on a new cluster a writer alone
    and during a repair at `rate_limit`, then the raw disk and loopback rates."""
    figures = repair_alone(scratch / "alone", victim_mib, batch, profile) if alone else {}
    figures.update(
        repair_beside_writer(scratch / "writer", min(victim_mib, WRITER_MIB), batch, rate_limit)
    )
    figures["raw_append_64k_mb_per_s"] = raw_append(scratch, min(REFERENCE_BYTES, victim_mib * MIB))
    figures["loopback_mb_per_s"] = loopback_mb_per_s()
    if alone:
        figures.update(copy_references(scratch, min(REFERENCE_BYTES // MIB, victim_mib)))
    return figures


def lost_bookie_cluster(
    stack: ExitStack, scratch: Path, victim_mib: int, settings: dict[str, str] = BOOKIE_SETTINGS
) -> tuple[str, list[BookieServer], list[LedgerId], str]:
    """(metadata URI, the live bookies, the ledgers, the lost bookie's address): three
    bookies wrote the ledgers, a fourth started empty, the first was killed and is gone
    from the writable bookies."""
    scratch.mkdir()
    metadata = init_metadata(scratch)
    bookies = [BookieServer(metadata, scratch / f"bookie-{i}", settings=settings) for i in range(4)]
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
    return metadata, bookies[1:], ledgers, victim.address


def repair_alone(scratch: Path, victim_mib: int, batch: int, profile: bool) -> dict[str, float]:
    with ExitStack() as stack:
        metadata, bookies, ledgers, victim = lost_bookie_cluster(stack, scratch, victim_mib)
        pids = [b.process.pid for b in bookies if b.process is not None]
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()
        figures = asyncio.run(rereplicate(metadata, ledgers, victim, batch, pids))
        if profiler is not None:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumtime").print_stats(45)
    figures["ledgers"] = float(len(ledgers))
    return figures


def repair_beside_writer(
    scratch: Path, victim_mib: int, batch: int, rate_limit: int
) -> dict[str, float]:
    """The writer's adds/s alone, then while the worker repairs with the default limit,
    then alone again once the repair is over: the machine's own drift between two windows
    of a few seconds is as large as a repair's effect, so the writer during the repair is
    compared with the mean of the windows on either side of it."""
    with ExitStack() as stack:
        metadata, _, ledgers, victim = lost_bookie_cluster(
            stack, scratch, victim_mib, WRITER_BOOKIE_SETTINGS
        )
        before = writer_result(writer_process(metadata, WRITER_SECONDS))
        writer = writer_process(metadata, WRITER_SECONDS)
        repair = asyncio.run(rereplicate(metadata, ledgers, victim, batch, rate_limit=rate_limit))
        during = writer_result(writer)
        after = writer_result(writer_process(metadata, WRITER_SECONDS))
    if repair["rereplication_seconds"] < WRITER_SECONDS * 1.2:
        print(
            f"warning: the repair ({repair['rereplication_seconds']:.1f} s) ended before the writer"
        )
    return {
        "writer_adds_per_s_alone": (before + after) / 2,
        "writer_adds_per_s_before_repair": before,
        "writer_adds_per_s_after_repair": after,
        "writer_adds_per_s_during_repair": during,
        "limited_rereplication_mb_per_s": repair["rereplication_mb_per_s"],
        "limited_rereplication_seconds": repair["rereplication_seconds"],
        "rate_limit_bytes": float(rate_limit),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB the lost bookie held (64)")
    parser.add_argument("--batch", type=int, default=0, help="entries a read (config's)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    parser.add_argument("--profile", action="store_true", help="profile the worker (cProfile)")
    parser.add_argument(
        "--rate-limit",
        type=int,
        default=AutoRecoveryConfig().replication_rate_by_bytes,
        help="bytes/s of the repair beside the writer (the config's default)",
    )
    parser.add_argument(
        "--writer-only", action="store_true", help="skip the repair without a rate limit"
    )
    parser.add_argument("--write", metavar="URI", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=WRITER_SECONDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write:  # the writer's own process
        print(asyncio.run(write_for(args.write, args.seconds)))
        return {}
    scratch = Path(tempfile.mkdtemp(prefix="bench-rereplication-", dir=args.dir))
    print(
        f"scratch {scratch} (device {os.stat(scratch).st_dev:#x}), python "
        f"{sys.version.split()[0]}, {os.cpu_count()} cores; the lost bookie held {args.mib} MiB"
    )
    try:
        figures = measure(
            scratch,
            args.mib,
            args.batch,
            args.rate_limit,
            profile=args.profile,
            alone=not args.writer_only,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(figures, args.mib)
    return figures


def print_table(figures: dict[str, float], mib: int) -> None:
    raw, loopback = figures["raw_append_64k_mb_per_s"], figures["loopback_mb_per_s"]
    print("| figure | measured | physical reference (same run) | ratio | goal | met? |")
    print("|---|---|---|---|---|---|")
    if "rereplication_mb_per_s" in figures:
        rate = figures["rereplication_mb_per_s"]
        row(
            f"re-replication after losing a bookie that held {mib} MiB, no rate limit "
            f"({figures['ledgers']:.0f} ledgers, 64 KiB entries, {figures['batch']:.0f} a read)",
            f"{rate:,.1f} MB/s ({figures['rereplicated_bytes'] / MIB:,.0f} MiB "
            f"in {figures['rereplication_seconds']:.1f} s)",
            f"raw 64 KiB appends, fdatasync every 1 MiB: {raw:,.0f} MB/s",
            f"{rate / raw:.2f}",
            ">= 0.6",
            "yes" if rate / raw >= 0.6 else "no",
        )
        row(
            "the same, beside the loopback's rate (each byte crosses it twice)",
            f"{rate:,.1f} MB/s",
            f"64 KiB frames echoed over loopback, 64 in flight: {loopback:,.0f} MB/s",
            f"{rate / loopback:.2f}",
            "",
            "",
        )
        for reference, value in (
            (
                "the disk copying to itself, 64 KiB O_DIRECT reads from 2 files, appends "
                "fdatasync'ed every MiB",
                figures["disk_copy_64k_mb_per_s"],
            ),
            ("the same, 1 MiB reads", figures["disk_copy_1m_mb_per_s"]),
            (
                "a bare Python copy (no protocol): 2 sources -> target",
                figures["python_copy_direct_mb_per_s"],
            ),
            (
                "a bare Python copy (no protocol): 2 sources -> relay -> target",
                figures["python_copy_relay_mb_per_s"],
            ),
        ):
            row(
                "the same",
                f"{rate:,.1f} MB/s",
                f"{reference}: {value:,.0f} MB/s",
                f"{rate / value:.2f}",
                "",
                "",
            )
        print(
            "CPU seconds during the repair: "
            + ", ".join(f"{name} {figures[f'cpu_seconds_{name}']:.2f}" for name in CPU_NAMES)
        )
    alone, during = figures["writer_adds_per_s_alone"], figures["writer_adds_per_s_during_repair"]
    limit = figures["rate_limit_bytes"]
    row(
        f"a writer's 100 B adds ({WRITER_WINDOW} in flight, E3 WQ2 AQ2) during a repair "
        f"{'no limit' if limit < 0 else f'at most {limit / 1e6:,.0f} MB/s'} (it ran at "
        f"{figures['limited_rereplication_mb_per_s']:,.1f} MB/s)",
        f"{during:,.0f} adds/s",
        f"the same writer alone, same cluster, before and after the repair: "
        f"{figures['writer_adds_per_s_before_repair']:,.0f} and "
        f"{figures['writer_adds_per_s_after_repair']:,.0f} adds/s (mean {alone:,.0f})",
        f"{during / alone:.2f}",
        ">= 0.8",
        "yes" if during / alone >= 0.8 else "no",
    )


if __name__ == "__main__":
    main()
