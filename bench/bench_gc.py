"""Measure a bookie's garbage collection beside the physical limits of the same disk, in the
same run (issue 16):

- compaction MB/s: ledger storage (in this process) holding logs of 4 KiB and of 64 KiB
  entries over 20 interleaved ledgers, half of them deleted, compacted by a forced major
  compaction from a cold page cache; the bytes of the files it compacted per second, against
  the raw rate of copying the same files on the same disk (read, write, fdatasync every
  4 MiB, from a cold cache too). Goal >= 0.5. 100-byte entries as a diagnostic: there the
  per-entry work, not the disk, is the limit;
- space back after deletes: a bookie process (tests/support/gc_bookie.py, which stands in
  for the bookie's GC thread: it deletes the ledgers listed in a file, runs
  `collect_garbage` every 0.2 s and lets the journal delete the files it released) takes
  >= 1 GiB of 4 KiB and 64 KiB entries over 20 ledgers (the 64 KiB ones stay in the
  journal); 18 of the 20 ledgers are then deleted and major compaction forced: the time
  until the entry logs and journal files take at most 1.25 x the live bytes, beside the
  time the disk needs at least to read what was written and write the live bytes once at
  its raw rates. The journal files written since the last checkpoint can only go once the
  next checkpoint (every `flush_interval`, 60 s) has indexed their entries;
- adds during compaction: 100-byte adds/s (pipelined, 1,000 in flight) and the p99 latency
  of a paced 1,000 adds/s, on a bookie process compacting ~half-live logs, against the same
  loads on the same bookie with no compaction running. Goal >= 0.7 of the adds/s.

    python bench/bench_gc.py [--dir D] [--quick] [--mib N]

`--quick` writes 256 MiB instead of 1 GiB; `--mib` sets it. Entry logs and journal files are 64 MiB
here (a 64th of what is written for the space figure), not the defaults (1 GiB and 2 GiB):
the log and the journal file being written are never collected, and with the defaults they
would hold most of a 1 GiB run. `main()` returns the figures as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench_bookie import (
    KEY,
    BookieServer,
    cpu_pressure,
    init_metadata,
    paced,
    pipelined,
    running,
)
from bench_journal import drop_cache, quantile, raw_read
from tally.bookie.ledger_storage import LedgerStorage
from tally.client.bookie_connection import BookieConnection
from tally.core.digest import DigestType, crc32c
from tally.core.entry_format import encode_entry
from tally.core.ids import LedgerId

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
FILE_SIZE = 64 * MIB
COPY_CHUNK = 4 * MIB
REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY))
from tests.support.gc_bookie import doom, passes, reports  # noqa: E402  (the driver's files)

FAST_FLUSH = 5.0
LEDGERS = [LedgerId(1, number) for number in range(1, 21)]
"""(bench_bookie's paced load writes ledgers of scope 0.)"""


# -- the disk ---------------------------------------------------------------------------


def raw_copy(paths: Sequence[Path], target: Path) -> float:
    """MB/s of copying `paths` (cold) into new files beside them, fdatasync every 4 MiB."""
    drop_cache(paths)
    total = 0
    started = time.perf_counter()
    for path in paths:
        copy = target / f"copy-{path.name}"
        with path.open("rb", buffering=0) as source:
            fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                while chunk := source.read(COPY_CHUNK):
                    os.write(fd, chunk)
                    os.fdatasync(fd)
                    total += len(chunk)
            finally:
                os.close(fd)
    elapsed = time.perf_counter() - started
    for path in paths:
        (target / f"copy-{path.name}").unlink()
    return total / elapsed / 1e6


def raw_write_read(directory: Path, total: int) -> tuple[float, float]:
    """MB/s of writing `total` bytes to a new file, fdatasync every 4 MiB, then of reading
    it back from a cold cache."""
    path = directory / "raw-write"
    chunk = os.urandom(COPY_CHUNK)
    count = max(1, total // COPY_CHUNK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        started = time.perf_counter()
        for _ in range(count):
            os.write(fd, chunk)
            os.fdatasync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
    try:
        return count * COPY_CHUNK / elapsed / 1e6, raw_read([path])
    finally:
        path.unlink()


# -- compaction in ledger storage -------------------------------------------------------------


def compaction_rate(scratch: Path, entry_size: int, total: int) -> dict[str, float]:
    """Fill storage with `total` bytes of `entry_size` entries over LEDGERS, delete half the
    ledgers, compact (major, forced, cold cache); the rates of it and of a raw copy."""
    directory = scratch / f"storage-{entry_size}"
    storage = LedgerStorage(directory, log_size_limit=FILE_SIZE)
    try:
        data = os.urandom(entry_size)
        crc = crc32c(data)
        per_checkpoint = max(1, (16 * MIB) // (entry_size * len(LEDGERS)))
        entry_id = 0
        while entry_id * entry_size * len(LEDGERS) < total:
            for ledger_id in LEDGERS:
                storage.add_entry(ledger_id, entry_id, crc, data, entry_id - 1)
            entry_id += 1
            if entry_id % per_checkpoint == 0:
                storage.checkpoint(b"bench")
        storage.checkpoint(b"bench")
        for ledger_id in LEDGERS[1::2]:
            storage.delete_ledger(ledger_id)
        logs = sorted((directory / "logs").glob("*.log"))[:-1]  # the current one stays
        copy = raw_copy(logs, scratch)
        drop_cache(logs)
        report = storage.collect_garbage(time.time(), force_major=True)
        compacted = sum(
            usage.total_bytes
            for usage in report.files
            if usage.file_id in report.compacted_entry_logs
        )
        return {
            "compacted_mib": compacted / MIB,
            "compaction_mb_per_s": compacted / report.compaction_seconds / 1e6,
            "moved_mb_per_s": report.moved_bytes / report.compaction_seconds / 1e6,
            "raw_copy_mb_per_s": copy,
        }
    finally:
        storage.close()
        shutil.rmtree(directory, ignore_errors=True)


# -- a bookie process -------------------------------------------------------------------------


def gc_bookie(metadata: str, data_dir: Path, file_size: int = FILE_SIZE) -> BookieServer:
    settings = {
        "PYTHONPATH": str(REPOSITORY),
        "TALLY_GC_INTERVAL": "0.2",
        "TALLY_BOOKIE_ENTRY_LOG_SIZE_LIMIT": str(file_size),
        "TALLY_BOOKIE_JOURNAL_FILE_SIZE": str(file_size),
        "TALLY_BOOKIE_JOURNAL_PREALLOCATE_SIZE": str(min(file_size, 16 * MIB)),
    }
    return BookieServer(metadata, data_dir, settings, program=("tests.support.gc_bookie",))


def entry(ledger_id: LedgerId, entry_id: int, payload: bytes) -> bytes:
    length = (entry_id + 1) * len(payload)
    return encode_entry(ledger_id, entry_id, entry_id - 1, length, payload, DigestType.CRC32C)


async def write(address: str, total: int, sizes: dict[LedgerId, int]) -> int:
    """Write about `total` bytes round-robin over the ledgers (64 in flight); entries each."""
    payloads = {ledger_id: os.urandom(size) for ledger_id, size in sizes.items()}
    per_round = sum(sizes.values())
    rounds = max(1, total // per_round)
    connection = await BookieConnection.connect(address, request_timeout=120)
    try:
        window: list[asyncio.Future[None]] = []
        for entry_id in range(rounds):
            for ledger_id, payload in payloads.items():
                window.append(connection.add_nowait(entry(ledger_id, entry_id, payload), KEY))
            if len(window) >= 64:
                await asyncio.gather(*window)
                window = []
        await asyncio.gather(*window)
    finally:
        await connection.close()
    return rounds


def disk_bytes(data_dir: Path) -> int:
    """Bytes of the entry logs and journal files."""
    paths = [*(data_dir / "ledgers" / "logs").glob("*.log"), *(data_dir / "journal").glob("*.txn")]
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            continue
    return total


def space_back(
    metadata: str, scratch: Path, total: int, flush_interval: float | None = None
) -> dict[str, float]:
    """Delete 90 % of the ledgers of a bookie holding `total` bytes; time the space back.

    Its files are a 64th of `total` each: the journal file being written is never collected,
    and holds up to that much of what was deleted."""
    sizes = {ledger_id: (64 * KIB if number % 2 else 4 * KIB) for number, ledger_id in
             enumerate(LEDGERS)}  # fmt: skip
    server = gc_bookie(metadata, scratch / f"space-{flush_interval}", max(4 * MIB, total // 64))
    if flush_interval is not None:
        server.settings["TALLY_BOOKIE_FLUSH_INTERVAL"] = str(flush_interval)
    with running(server):
        rounds = asyncio.run(write(server.address, total, sizes))
        written = disk_bytes(server.data_dir)
        survivors = LEDGERS[:2]
        live = sum(len(entry(ledger_id, 0, b"x" * sizes[ledger_id])) for ledger_id in survivors)
        live *= rounds
        doom(server.data_dir, [ledger for ledger in LEDGERS if ledger not in survivors])
        started = time.perf_counter()
        (server.data_dir / "gc-force").write_text("major")
        reached = None
        deadline = started + 300
        while time.perf_counter() < deadline:
            if disk_bytes(server.data_dir) <= 1.25 * live:
                reached = time.perf_counter() - started
                break
            time.sleep(0.05)
        final = disk_bytes(server.data_dir)
        moved = sum(int(report["moved_bytes"]) for report in reports(server.data_dir))  # type: ignore[call-overload]
    write_rate, read_rate = raw_write_read(scratch, 256 * MIB)
    return {
        "space_written_mib": written / MIB,
        "space_live_mib": live / MIB,
        "space_final_mib": final / MIB,
        "space_moved_mib": moved / MIB,
        "space_seconds": reached if reached is not None else -1.0,
        "space_floor_seconds": written / (read_rate * 1e6) + live / (write_rate * 1e6),
        "raw_read_mb_per_s": read_rate,
        "raw_write_mb_per_s": write_rate,
    }


def adds_during_compaction(metadata: str, scratch: Path, total: int) -> dict[str, float]:
    """100-byte adds with and without a compaction running on the same bookie."""
    server = gc_bookie(metadata, scratch / "adds")
    figures = {}
    with running(server):
        sizes = dict.fromkeys(LEDGERS, 4 * KIB)
        asyncio.run(write(server.address, total, sizes))
        before = len(reports(server.data_dir))
        doom(server.data_dir, LEDGERS[1::2])
        wait_for(lambda: len(reports(server.data_dir)) >= before + 2, "the deletes")
        for phase in ("idle", "compacting"):
            if phase == "compacting":
                (server.data_dir / "gc-force").write_text("major")
                wait_for(lambda: passes(server.data_dir, "major") > 0, "a forced pass")
            begin = time.time()
            latencies = asyncio.run(paced(server.address, 1000, 2.0))
            figures[f"{phase}_adds_per_s"] = count_adds(server, LedgerId(9, len(figures)))
            end = time.time()
            figures[f"{phase}_p99_ms"] = quantile(latencies, 0.99) * 1e3
            figures[f"{phase}_p50_ms"] = quantile(latencies, 0.5) * 1e3
        (server.data_dir / "gc-force").unlink()
        wait_for(lambda: passes(server.data_dir) == len(reports(server.data_dir)), "the pass")
        compactions = [
            report for report in reports(server.data_dir) if report["compaction"] == "major"
        ]
        first = compactions[0]
        moved = sum(int(report["moved_bytes"]) for report in compactions)  # type: ignore[call-overload]
        figures["compaction_mb"] = moved / 1e6
        compaction_end = float(first["now"]) + float(first["seconds"])  # type: ignore[arg-type]
        figures["load_covered"] = max(0.0, min(1.0, (compaction_end - begin) / (end - begin)))
    return figures


def count_adds(server: BookieServer, ledger_id: LedgerId, count: int = 30_000) -> float:
    load = (entry(ledger_id, entry_id, b"x" * 100) for entry_id in range(count + count // 10))
    seconds = asyncio.run(pipelined(server.address, load, 1000, count))
    return count / seconds


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout} s")
        time.sleep(0.01)


# -- the run ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    parser.add_argument("--quick", action="store_true", help="256 MiB instead of 1 GiB")
    parser.add_argument("--mib", type=int, default=None, help="MiB written per figure")
    args = parser.parse_args(argv)
    total = (args.mib or (256 if args.quick else 1024)) * MIB
    scratch = Path(tempfile.mkdtemp(prefix="bench-gc-", dir=args.dir))
    print(
        f"scratch {scratch} (device {os.stat(scratch).st_dev:#x}), python "
        f"{sys.version.split()[0]}, {os.cpu_count()} cores, {total // MIB} MiB per figure"
    )
    figures: dict[str, float] = {"cpu_pressure_before_pct": cpu_pressure()}
    try:
        for size, name in ((64 * KIB, "64k"), (4 * KIB, "4k"), (100, "100b")):
            amount = total if size > 100 else min(total, 64 * MIB)
            rates = compaction_rate(scratch, size, amount)
            figures.update({f"{name}_{key}": value for key, value in rates.items()})
        metadata = init_metadata(scratch)
        figures.update(space_back(metadata, scratch, total))
        diagnostic = space_back(metadata, scratch, total, flush_interval=FAST_FLUSH)
        figures.update({f"fast_flush_{key}": value for key, value in diagnostic.items()})
        figures.update(adds_during_compaction(metadata, scratch, total))
        figures["cpu_pressure_after_pct"] = cpu_pressure()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(figures)
    return figures


def print_table(figures: dict[str, float]) -> None:
    print(
        f"\nCPU pressure (PSI some, avg60): {figures['cpu_pressure_before_pct']:.0f}% before, "
        f"{figures['cpu_pressure_after_pct']:.0f}% after (0: the machine was ours)"
    )
    print("| figure | measured | physical reference (same run) | ratio | goal |")
    print("|---|---|---|---|---|")
    for name, what in (("64k", "64 KiB"), ("4k", "4 KiB"), ("100b", "100 B (diagnostic)")):
        rate, copy = figures[f"{name}_compaction_mb_per_s"], figures[f"{name}_raw_copy_mb_per_s"]
        print(
            f"| major compaction of half-live logs of {what} entries "
            f"({figures[f'{name}_compacted_mib']:.0f} MiB of files) | {rate:,.0f} MB/s of files "
            f"({figures[f'{name}_moved_mb_per_s']:,.0f} MB/s moved) | raw copy of the same "
            f"files: {copy:,.0f} MB/s | {rate / copy:.2f} | {'>= 0.5' if name != '100b' else ''} |"
        )
    seconds = figures["space_seconds"]
    print(
        f"| disk back to <= 1.25 x live after deleting 18 of 20 ledgers "
        f"({figures['space_written_mib']:.0f} MiB on disk, {figures['space_live_mib']:.0f} MiB "
        f"live, {figures['space_final_mib']:.0f} MiB at the end: "
        f"{figures['space_final_mib'] / figures['space_live_mib']:.2f} x) | "
        f"{f'{seconds:.1f} s' if seconds >= 0 else 'not reached'} "
        f"({figures['space_moved_mib']:.0f} MiB moved) | read it all at "
        f"{figures['raw_read_mb_per_s']:,.0f} MB/s and write the live bytes at "
        f"{figures['raw_write_mb_per_s']:,.0f} MB/s: {figures['space_floor_seconds']:.1f} s | "
        f"{figures['space_floor_seconds'] / seconds if seconds > 0 else 0:.2f} | |"
    )
    fast = figures["fast_flush_space_seconds"]
    print(
        f"| the same with checkpoints every {FAST_FLUSH:g} s, not 60 (diagnostic: the journal "
        f"files written since the last checkpoint wait for the next) | "
        f"{f'{fast:.1f} s' if fast >= 0 else 'not reached'} "
        f"({figures['fast_flush_space_final_mib']:.0f} MiB at the end) | "
        f"{figures['fast_flush_space_floor_seconds']:.1f} s | "
        f"{figures['fast_flush_space_floor_seconds'] / fast if fast > 0 else 0:.2f} | |"
    )
    idle, busy = figures["idle_adds_per_s"], figures["compacting_adds_per_s"]
    print(
        f"| 100 B adds/s (1,000 in flight) during a major compaction | {busy:,.0f} | the same "
        f"bookie idle: {idle:,.0f} | {busy / idle:.2f} | >= 0.7 |"
    )
    print(
        f"| p99 (p50) of 1,000 paced adds/s during the compaction | "
        f"{figures['compacting_p99_ms']:.1f} ms ({figures['compacting_p50_ms']:.1f}) | idle: "
        f"{figures['idle_p99_ms']:.1f} ms ({figures['idle_p50_ms']:.1f}) | "
        f"{figures['idle_p99_ms'] / figures['compacting_p99_ms']:.2f} | |"
    )
    print(
        f"(the compaction moved {figures['compaction_mb']:,.0f} MB and ran through "
        f"{figures['load_covered']:.0%} of the loads' time)"
    )


if __name__ == "__main__":
    main()
