"""Measure the bookie's scrubber beside the physical limits of the same disk, in the same run
(issue 17):

- scrub MB/s at full speed: ledger storage (in this process) holding entry logs of 64 KiB,
  4 KiB and (a diagnostic) 100-byte entries over 20 interleaved ledgers, written with a
  checkpoint every 16 MiB as a bookie writes them, scrubbed by one pass at full speed from
  a cold page cache: the bytes of the files per second of the pass, against the raw rate of
  reading the same files sequentially (8 MiB reads) from a cold cache, in turns (the
  median of the turns' ratios). Goal >= 0.7;
- adds during a scrub: 100-byte adds/s (pipelined, 1,000 in flight) on a bookie process
  whose first pass runs at the default rate (the ledger disk's size over a week) through
  the load, against the same load on the same bookie with scrubbing off (turns off and on,
  each averaged). Goal >= 0.9. The same during a pass at full speed (`tally shell scrub --now`),
  as a diagnostic.

    python bench/bench_scrub.py [--dir D] [--quick] [--mib N] [--rates-only]

`--quick` writes 128 MiB instead of 512 MiB per figure; `--mib` sets it. The page cache is
dropped for the files read (posix_fadvise DONTNEED after an fsync), not the whole machine's.
`main()` returns the figures as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bench_bookie import BookieServer, cpu_pressure, encoded, init_metadata, pipelined, running
from bench_gc import wait_for
from bench_journal import drop_cache, raw_read
from tally.bookie.ledger_storage import LedgerStorage
from tally.client.bookie_connection import BookieConnection
from tally.core.digest import DigestType, crc32c
from tally.core.entry_format import encode_entry
from tally.core.ids import LedgerId
from tally.core.scrub import MAX_STEP_BYTES, ScrubPolicy, scrub_rate

KIB, MIB = 1 << 10, 1 << 20
KEY = bytes(32)
LEDGERS = [LedgerId(1, number) for number in range(1, 21)]
CHECKPOINT_BYTES = 16 * MIB
ADDS = 30_000
TURNS = 3
"""Raw reads and scrub passes of the same files, in turns: the median of each, and of the
ratios of the turns, are reported."""
NO_SCRUB = {"TALLY_BOOKIE_SCRUB_INTERVAL": "0"}


# -- scrubbing ledger storage at full speed ---------------------------------------------------


def scrub_rate_of(scratch: Path, entry_size: int, total: int) -> dict[str, float]:
    """Fill storage with `total` bytes of `entry_size` entries over LEDGERS; the MB/s of a
    full-speed pass and of a raw read of the same files, both from a cold cache."""
    directory = scratch / f"storage-{entry_size}"
    storage = LedgerStorage(directory, log_size_limit=64 * MIB)
    try:
        data = os.urandom(entry_size)
        crc = crc32c(data)
        per_checkpoint = max(1, CHECKPOINT_BYTES // (entry_size * len(LEDGERS)))
        entry_id = 0
        while entry_id * entry_size * len(LEDGERS) < total:
            for ledger_id in LEDGERS:
                storage.add_entry(ledger_id, entry_id, crc, data, entry_id - 1)
            entry_id += 1
            if entry_id % per_checkpoint == 0:
                storage.checkpoint(b"bench")
        storage.checkpoint(b"bench")
        logs = sorted((directory / "logs").glob("*.log"))
        files = sum(path.stat().st_size for path in logs)
        raws, scrubs, entries = [], [], []
        for _ in range(TURNS):
            raws.append(raw_read(logs))
            drop_cache(logs)
            started = time.perf_counter()
            while not (step := storage.scrub(MAX_STEP_BYTES, full_speed=True)).scrub.complete:
                pass
            seconds = time.perf_counter() - started
            assert step.scrub.entries == entry_id * len(LEDGERS), step.scrub
            assert step.scrub.corrupt == 0, step.scrub
            scrubs.append(files / seconds / 1e6)
            entries.append(step.scrub.entries / seconds)
        ratios = sorted(scrub / raw for scrub, raw in zip(scrubs, raws, strict=True))
        return {
            "file_mib": files / MIB,
            "scrub_mb_per_s": statistics.median(scrubs),
            "scrub_entries_per_s": statistics.median(entries),
            "raw_read_mb_per_s": statistics.median(raws),
            "ratio": statistics.median(ratios),
            "ratio_min": ratios[0],
            "ratio_max": ratios[-1],
        }
    finally:
        storage.close()
        shutil.rmtree(directory, ignore_errors=True)


# -- adds while a bookie scrubs -----------------------------------------------------------------


async def write(address: str, total: int, size: int) -> None:
    """About `total` bytes of `size`-byte entries, round-robin over LEDGERS, 64 in flight."""
    payload = os.urandom(size)
    rounds = max(1, total // (size * len(LEDGERS)))
    connection = await BookieConnection.connect(address, request_timeout=120)
    try:
        window: list[asyncio.Future[None]] = []
        for entry_id in range(rounds):
            for ledger_id in LEDGERS:
                raw = encode_entry(
                    ledger_id, entry_id, entry_id - 1, (entry_id + 1) * size, payload,
                    DigestType.CRC32C,
                )  # fmt: skip
                window.append(connection.add_nowait(raw, KEY))
            if len(window) >= 64:
                await asyncio.gather(*window)
                window = []
        await asyncio.gather(*window)
    finally:
        await connection.close()


def adds_per_second(server: BookieServer, ledger_id: LedgerId) -> float:
    load = encoded(ledger_id, 100, ADDS)
    return ADDS / asyncio.run(pipelined(server.address, load, 1000, ADDS))


def scrub_status(server: BookieServer, method: str = "GET") -> dict[str, object]:
    url = f"http://127.0.0.1:{server.metrics_port}/api/v1/bookie/scrub"
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=60) as answer:
        status: dict[str, object] = json.load(answer)
    return status


def adds_while_scrubbing(metadata: str, scratch: Path, total: int) -> dict[str, float]:
    """100-byte adds/s with scrubbing off and during a pass at the default rate, in turns
    (off, on, off, on, off: the machine's drift shows in the turns), then during a pass at
    full speed; one bookie's data, restarted between turns (scrubbing is a setting; with
    it off, the scheduled pass under way waits)."""
    server = BookieServer(metadata, scratch / "adds", dict(NO_SCRUB))
    figures: dict[str, float] = {}
    with running(server):
        asyncio.run(write(server.address, total, 4 * KIB))
    idle, busy, rates, under_way = [], [], [], []
    for turn in range(5):
        scrubbing = turn % 2 == 1
        server.settings = {} if scrubbing else dict(NO_SCRUB)
        with running(server):
            if scrubbing:
                # No pass was ever completed here: the first starts at once, at the
                # default rate, and goes on across the restarts.
                wait_for(lambda: scrub_status(server)["current"] is not None, "the pass")
            before = server.metrics()["bookie_scrub_bytes_total"]
            started = time.perf_counter()
            adds = adds_per_second(server, LedgerId(9, turn + 1))
            seconds = time.perf_counter() - started
            if scrubbing:
                busy.append(adds)
                status = scrub_status(server)
                rates.append((server.metrics()["bookie_scrub_bytes_total"] - before) / seconds)
                under_way.append(status["current"] is not None)
                figures["default_rate_bytes_per_s"] = float(status["rate_bytes_per_second"])  # type: ignore[arg-type]
            else:
                idle.append(adds)
    figures["idle_adds_per_s"] = sum(idle) / len(idle)
    figures["idle_min_adds_per_s"], figures["idle_max_adds_per_s"] = min(idle), max(idle)
    figures["default_rate_adds_per_s"] = sum(busy) / len(busy)
    figures["default_rate_min_adds_per_s"] = min(busy)
    figures["default_rate_max_adds_per_s"] = max(busy)
    figures["default_rate_scrubbed_bytes_per_s"] = sum(rates) / len(rates)
    figures["default_rate_pass_under_way"] = float(all(under_way))
    server.settings = {}
    with running(server):
        scrub_status(server, "PUT")  # the pass under way goes on at full speed
        before = server.metrics()["bookie_scrub_bytes_total"]
        started = time.perf_counter()
        figures["full_speed_adds_per_s"] = adds_per_second(server, LedgerId(9, 9))
        seconds = time.perf_counter() - started
        scrubbed = server.metrics()["bookie_scrub_bytes_total"] - before
        figures["full_speed_scrubbed_mb_per_s"] = scrubbed / seconds / 1e6
        figures["full_speed_pass_under_way"] = float(scrub_status(server)["current"] is not None)
    return figures


# -- the run ----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    parser.add_argument("--quick", action="store_true", help="128 MiB instead of 512 MiB")
    parser.add_argument("--mib", type=int, default=None, help="MiB written per figure")
    parser.add_argument(
        "--rates-only", action="store_true", help="the full-speed rates only (for A/B runs)"
    )
    args = parser.parse_args(argv)
    total = (args.mib or (128 if args.quick else 512)) * MIB
    scratch = Path(tempfile.mkdtemp(prefix="bench-scrub-", dir=args.dir))
    disk = shutil.disk_usage(scratch).total
    print(
        f"scratch {scratch} (device {os.stat(scratch).st_dev:#x}, {disk / 1e9:.0f} GB), python "
        f"{sys.version.split()[0]}, {os.cpu_count()} cores, {total // MIB} MiB per figure"
    )
    figures: dict[str, float] = {"cpu_pressure_before_pct": cpu_pressure()}
    figures["default_rate_of_this_disk"] = scrub_rate(ScrubPolicy(), disk)
    try:
        for size, name in ((64 * KIB, "64k"), (4 * KIB, "4k"), (100, "100b")):
            amount = total if size > 100 else min(total, 32 * MIB)
            rates = scrub_rate_of(scratch, size, amount)
            figures.update({f"{name}_{key}": value for key, value in rates.items()})
        if not args.rates_only:
            metadata = init_metadata(scratch)
            figures.update(adds_while_scrubbing(metadata, scratch, total))
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
        rate, raw = figures[f"{name}_scrub_mb_per_s"], figures[f"{name}_raw_read_mb_per_s"]
        print(
            f"| scrub pass at full speed over entry logs of {what} entries "
            f"({figures[f'{name}_file_mib']:.0f} MiB of files, cold cache; medians of "
            f"{TURNS} turns) | {rate:,.0f} MB/s ({figures[f'{name}_scrub_entries_per_s']:,.0f} "
            f"entries/s) | raw sequential read of the same files: {raw:,.0f} MB/s | "
            f"{figures[f'{name}_ratio']:.2f} ({figures[f'{name}_ratio_min']:.2f}-"
            f"{figures[f'{name}_ratio_max']:.2f}) | {'>= 0.7' if name != '100b' else ''} |"
        )
    if "idle_adds_per_s" not in figures:
        return  # --rates-only
    idle = figures["idle_adds_per_s"]
    spread = f"{figures['idle_min_adds_per_s']:,.0f}-{figures['idle_max_adds_per_s']:,.0f}"
    busy = figures["default_rate_adds_per_s"]
    print(
        f"| 100 B adds/s (1,000 in flight) during a pass at the default rate (mean of 2 turns: "
        f"{figures['default_rate_min_adds_per_s']:,.0f}-"
        f"{figures['default_rate_max_adds_per_s']:,.0f}) | {busy:,.0f} | the same bookie with "
        f"scrubbing off (mean of 3 turns: {spread}): {idle:,.0f} | {busy / idle:.2f} | >= 0.9 |"
    )
    busy = figures["full_speed_adds_per_s"]
    print(
        f"| 100 B adds/s during a pass at full speed (diagnostic) | {busy:,.0f} | {idle:,.0f} "
        f"| {busy / idle:.2f} | |"
    )
    print(
        f"(default rate on this {figures['default_rate_of_this_disk'] * 604800 / 1e9:.0f} GB "
        f"disk: {figures['default_rate_bytes_per_s']:,.0f} B/s; read during the load: "
        f"{figures['default_rate_scrubbed_bytes_per_s']:,.0f} B/s, pass still under way at its "
        f"end: {bool(figures['default_rate_pass_under_way'])}; at full speed: "
        f"{figures['full_speed_scrubbed_mb_per_s']:,.0f} MB/s during the load, under way at "
        f"its end: {bool(figures['full_speed_pass_under_way'])})"
    )


if __name__ == "__main__":
    main()
