"""Measure the time from a corrupt copy's detection to its repair (issue 17's figure).

Four bookie processes on a sqlite store; ledgers of 1 KiB entries (E3 WQ3 AQ2). One bookie
is stopped, a byte of ROTTEN of its entries is flipped in its entry logs, and it is started
again. A scrub pass at full speed (`PUT /api/v1/bookie/scrub?wait=true`, what `tally shell
scrub --now` sends) detects them; the bookie files them in the ledgers' under-replication
marks; a `ReplicationWorker` with the default settings, running in this process, writes
verified copies over them. The figure is the time from the end of the scrub (detection) to
the moment the bookie serves every one of them intact again (checked by reading them from
it, every 10 ms), beside the time the copies themselves take in the same run: reading the
same entries from another bookie and writing them to this one, one after the other.

    python bench/bench_corrupt_repair.py [--rotten N] [--poll SECONDS] [--dir D]

The worker looks at the marks every `under_replicated_poll_interval` (5 s by default), which
bounds the figure from below; --poll shows what is left without it.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from tests.support.rot import rot_entries  # noqa: E402

from bench_bookie import BookieServer, init_metadata  # noqa: E402
from tally.autorecovery.config import AutoRecoveryConfig  # noqa: E402
from tally.autorecovery.replication_worker import ReplicationWorker  # noqa: E402
from tally.client.client import Client  # noqa: E402
from tally.core.digest import master_key  # noqa: E402
from tally.core.ids import LedgerId  # noqa: E402

PASSWORD = b"bench-corrupt-repair"
LEDGERS = 4
ENTRIES = 500
ENTRY = 1024


def body(ledger_id: LedgerId, entry_id: int) -> bytes:
    return (b"%d/%d:" % (ledger_id.id, entry_id) * ENTRY)[:ENTRY]


async def write(uri: str) -> dict[LedgerId, frozenset[str]]:
    """The ledgers written, with their bookies."""
    async with Client(uri) as client:
        written = {}
        for _ in range(LEDGERS):
            writer = await client.create_ledger(
                ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
            )
            await asyncio.gather(
                *(writer.append_nowait(body(writer.ledger_id, e)) for e in range(ENTRIES))
            )
            await writer.close()
            written[writer.ledger_id] = writer.metadata.metadata.bookies()
        return written


def scrub_now(bookie: BookieServer) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{bookie.metrics_port}/api/v1/bookie/scrub?wait=true", method="PUT"
    )
    with urllib.request.urlopen(request, timeout=600) as answer:
        answer.read()


async def repair(
    uri: str, bookie: BookieServer, rotten: dict[LedgerId, list[int]], poll: float | None
) -> dict[str, float]:
    config = AutoRecoveryConfig()
    if poll is not None:
        config = replace(config, under_replicated_poll_interval=poll)
    async with Client(uri) as client:
        worker = ReplicationWorker(client.context, config, "bench")
        task = asyncio.create_task(worker.run())
        try:
            await asyncio.to_thread(scrub_now, bookie)
            detected = time.perf_counter()
            connection = await client.context.bookies.get(bookie.address)
            left = {(ledger_id, e) for ledger_id, entries in rotten.items() for e in entries}
            while left:
                for ledger_id, entry_id in sorted(left):
                    try:
                        await connection.read(ledger_id, entry_id)
                    except Exception:  # still rotten (EntryCorrupt)
                        continue
                    left.discard((ledger_id, entry_id))
                if task.done():
                    task.result()
                    raise RuntimeError("the worker stopped before the repair ended")
                await asyncio.sleep(0.01)
            repaired = time.perf_counter() - detected
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        # The reference: the same copies, read from another bookie and written here.
        sources = {}
        for ledger_id in rotten:
            record = await client.context.ledgers.read_ledger_metadata(ledger_id)
            ensemble = record.metadata.segments[0].ensemble
            source = next(b for b in ensemble if b != bookie.address)
            sources[ledger_id] = await client.context.bookies.get(source)
        started = time.perf_counter()
        for ledger_id, entries in rotten.items():
            for entry_id in entries:
                raw = await sources[ledger_id].read(ledger_id, entry_id)
                await connection.add(raw, master_key(PASSWORD), recovery=True)
        copying = time.perf_counter() - started
    return {"repair_seconds": repaired, "copy_seconds": copying}


def measure(scratch: Path, rotten_count: int, poll: float | None) -> dict[str, float]:
    metadata = init_metadata(scratch)
    settings = {"TALLY_BOOKIE_FLUSH_INTERVAL": "1"}
    bookies = [BookieServer(metadata, scratch / f"bookie-{i}", settings) for i in range(4)]
    with ExitStack() as stack:
        for bookie in bookies:
            bookie.start()
            stack.callback(bookie.stop)
        ledgers = asyncio.run(write(metadata))
        victim = max(bookies, key=lambda b: sum(b.address in held for held in ledgers.values()))
        victim.stop()
        holding = [ledger_id for ledger_id, held in ledgers.items() if victim.address in held]
        per_ledger = max(1, rotten_count // len(holding))
        rotten = {}
        for ledger_id in holding:
            entries = list(range(0, ENTRIES, max(1, ENTRIES // per_ledger)))[:per_ledger]
            if rot_entries(victim.data_dir, ledger_id, entries) != len(entries):
                raise RuntimeError(f"ledger {ledger_id}: not every entry was in an entry log")
            rotten[ledger_id] = entries
        victim.start()
        figures = asyncio.run(repair(metadata, victim, rotten, poll))
    figures["rotten"] = float(sum(map(len, rotten.values())))
    return figures


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rotten", type=int, default=40, help="entries to rot (40)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    parser.add_argument(
        "--poll", type=float, default=None, help="the worker's under_replicated_poll_interval"
    )
    arguments = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-corrupt-", dir=arguments.dir))
    try:
        figures = measure(scratch, arguments.rotten, arguments.poll)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    poll = (
        AutoRecoveryConfig().under_replicated_poll_interval
        if arguments.poll is None
        else arguments.poll
    )
    print(
        f"{figures['rotten']:.0f} rotten copies on one of 4 bookies, worker polling every "
        f"{poll:g} s: repaired "
        f"{figures['repair_seconds']:.2f} s after the scrub found them; the copies alone "
        f"(read from another bookie, written here, one by one): {figures['copy_seconds']:.3f} s"
    )
    return figures


if __name__ == "__main__":
    main()
