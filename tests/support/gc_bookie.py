"""A bookie process whose garbage collection bench/bench_gc.py drives from files:

    python -m tests.support.gc_bookie --metadata URI --data-dir DIR --listen HOST:PORT \
        [--metrics-port PORT]

It runs a `Bookie` as `tally bookie` does (settings from TALLY_BOOKIE_* variables, the same
"ready on" line), and beside it a loop standing in for the bookie's garbage collection
thread: every `TALLY_GC_INTERVAL` seconds (default 0.2) it deletes from ledger storage the
ledgers listed in `DIR/doomed-ledgers` (lines "scope id") that it still holds, then runs
`LedgerStorage.collect_garbage`, forcing the compaction named in `DIR/gc-force` if that file
exists ("major" or "minor"), lets the journal delete the journal files the run released
(rather than wait for the next checkpoint's release), and appends the report to
`DIR/gc-reports.jsonl` (and a line to `DIR/gc-passes` as each pass starts, so that a test
can tell whether one was running).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import time
from pathlib import Path

from tally.bookie.compactor import GcReport
from tally.bookie.config import BookieConfig
from tally.bookie.journal_format import JournalMark
from tally.bookie.server import Bookie
from tally.cli.bookie import admin_http
from tally.config import load
from tally.core.errors import NoSuchLedger
from tally.core.ids import LedgerId

DOOMED = "doomed-ledgers"
FORCE = "gc-force"
REPORTS = "gc-reports.jsonl"
PASSES = "gc-passes"

log = logging.getLogger(__name__)


def doomed_ledgers(data_dir: Path) -> list[LedgerId]:
    path = data_dir / DOOMED
    if not path.exists():
        return []
    return [LedgerId(*map(int, line.split())) for line in path.read_text().splitlines() if line]


def doom(data_dir: Path, ledgers: list[LedgerId]) -> None:
    """Add ledgers to those the process deletes (from the test's side)."""
    with (data_dir / DOOMED).open("a") as file:
        file.writelines(f"{ledger.scope} {ledger.id}\n" for ledger in ledgers)


def reports(data_dir: Path) -> list[dict[str, object]]:
    """The reports written so far (from the test's side); a line cut by a kill is left out."""
    path = data_dir / REPORTS
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            found.append(json.loads(line))
    return found


def passes(data_dir: Path, forcing: str = "") -> int:
    """How many passes have started (from the test's side); with `forcing`, how many of
    them force that compaction."""
    path = data_dir / PASSES
    lines = path.read_text().splitlines() if path.exists() else []
    return sum(1 for line in lines if not forcing or line == f"started {forcing}")


def collect(bookie: Bookie, data_dir: Path) -> GcReport:
    """One pass of the stand-in GC thread (in a worker thread)."""
    storage = bookie.storage
    force = (data_dir / FORCE).read_text().strip() if (data_dir / FORCE).exists() else ""
    with (data_dir / PASSES).open("a") as file:
        file.write(f"started {force}\n")
    for ledger_id in doomed_ledgers(data_dir):
        with contextlib.suppress(NoSuchLedger):
            storage.delete_ledger(ledger_id)
    report = storage.collect_garbage(
        time.time(), force_major=force == "major", force_minor=force == "minor"
    )
    mark = storage.last_checkpoint_mark()
    if (report.released_journal_files or report.compacted_journal_files) and mark:
        # What the checkpoint does after its index write: the files before the index's
        # mark that the index no longer points into go (the same files, or fewer).
        bookie.journal.release_before(
            JournalMark.from_bytes(mark), keep=storage.kept_journal_files()
        )
    record = dataclasses.asdict(report)
    record["compaction"] = report.compaction.value
    record["files"] = [(f.kind.value, f.file_id, f.total_bytes, f.live_bytes) for f in report.files]
    with (data_dir / REPORTS).open("a") as file:
        file.write(json.dumps(record) + "\n")
    return report


async def gc_loop(bookie: Bookie, data_dir: Path, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        try:
            await asyncio.to_thread(collect, bookie, data_dir)
        except Exception:
            log.exception("garbage collection failed")


async def serve(config: BookieConfig, interval: float) -> None:
    bookie = Bookie(config, admin_http=admin_http)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: loop.create_task(bookie.stop()))
    await bookie.start()
    print(f"bookie {bookie.bookie_id} ready on {bookie.address}", flush=True)
    collector = asyncio.create_task(gc_loop(bookie, config.data_dir, interval))
    await bookie.wait_stopped()
    collector.cancel()


def main() -> None:
    parser = argparse.ArgumentParser()
    for option in ("--metadata", "--data-dir", "--listen"):
        parser.add_argument(option, required=True)
    parser.add_argument("--metrics-port", type=int)
    arguments = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = load(
        BookieConfig,
        "bookie",
        overrides={
            "metadata": arguments.metadata,
            "data_dir": Path(arguments.data_dir),
            "listen": arguments.listen,
            "metrics_port": arguments.metrics_port,
        },
    )
    asyncio.run(serve(config, float(os.environ.get("TALLY_GC_INTERVAL", "0.2"))))


if __name__ == "__main__":
    main()
