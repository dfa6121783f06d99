"""A bookie with two ledger directories, each on a small ext4 file system of its own, loses one
under load (turned read-only by the kernel as on a disk error, or unmounted), with real
processes: four bookies, an auditor and a replication worker.

The bookie stays up, registered and writable, with the failed directory in its registration
and its /metrics; the ledgers it held there are marked and repaired back onto it (FILL, onto
its other directory), so every entry is on WQ readable copies again; nothing acknowledged is
lost, and every entry reads back through the client.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.replicas_check import replicas_check
from tally.chaos.disks import fail_read_only, small_filesystem, unmount_lazily
from tally.client.client import Client
from tally.core.ids import LedgerId
from tally.metadata.bookie_registry import BookieRegistry
from tests.autorecovery.test_end_to_end import PASSWORD, autorecovery, payload, records
from tests.bookie.conftest import sample, scrape
from tests.support.cluster import SESSION_TIMEOUT, read_all, replica_copies, running_cluster
from tests.support.polling import until
from tests.support.processes import BookieProcess, environment, free_port

DISK_BYTES = 64 << 20
SIZE = 1000
BATCH = 10
FAST_BOOKIE = {
    "TALLY_BOOKIE_SESSION_TIMEOUT": str(SESSION_TIMEOUT),
    "TALLY_BOOKIE_FLUSH_INTERVAL": "0.3",
    "TALLY_BOOKIE_DISK_CHECK_INTERVAL": "0.3",
    "TALLY_BOOKIE_LIMBO_CHECK_INTERVAL": "0.5",
}
"""Checkpoints often (the entries reach the ledger disks), quick disk and limbo checks."""
FAILURES: dict[str, Callable[[Path], None]] = {
    "read-only": fail_read_only,
    "unmounted": unmount_lazily,
}
REPAIR_TIMEOUT = 60.0


async def write_under_load(
    uri: str, acked: dict[LedgerId, int], stop: asyncio.Event, writers: int = 4
) -> None:
    """Ledgers E3 WQ3 AQ2, `writers` at a time, each closed after a few batches, until
    `stop`; `acked` holds each ledger's last acknowledged entry."""
    async with Client(uri) as client:

        async def one_writer() -> None:
            while not stop.is_set():
                writer = await client.create_ledger(
                    ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
                )
                ledger_id = writer.ledger_id
                for first in range(0, 4 * BATCH, BATCH):
                    batch = [
                        writer.append_nowait(payload(ledger_id, e, SIZE))
                        for e in range(first, first + BATCH)
                    ]
                    acked[ledger_id] = max(await asyncio.gather(*batch))
                    await asyncio.sleep(0.02)
                await writer.close()

        await asyncio.gather(*(one_writer() for _ in range(writers)))


async def eventually(condition: Callable[[], Awaitable[object]], what: str) -> None:
    await until(condition, what, timeout=REPAIR_TIMEOUT, step=0.3)


@pytest.mark.parametrize("failure", sorted(FAILURES))
async def test_a_failed_ledger_disk_takes_only_its_ledgers_back_to_full_replication(
    tmp_path: Path, failure: str
) -> None:
    with (
        small_filesystem(tmp_path / "disk-a", DISK_BYTES) as disk_a,
        small_filesystem(tmp_path / "disk-b", DISK_BYTES) as disk_b,
        running_cluster(tmp_path / "cluster", 3) as cluster,
    ):
        port = free_port()
        bookie = BookieProcess(
            cluster.uri,
            tmp_path / "two-disks",
            extra=("--ledger-dirs", f"{disk_a},{disk_b}", "--metrics-port", str(port)),
        )
        cluster.bookies.append(bookie)
        with environment(FAST_BOOKIE):
            bookie.start()
        failed = str(disk_a.resolve())

        def placed_on(directory: Path) -> float:
            return sample(scrape(port), "bookie_ledger_dir_ledgers", dir=str(directory.resolve()))

        acked: dict[LedgerId, int] = {}
        stop = asyncio.Event()
        with autorecovery(cluster, "ar"):
            load = asyncio.create_task(write_under_load(cluster.uri, acked, stop))
            try:
                await until(lambda: placed_on(disk_a) >= 3, "ledgers on disk a", timeout=30)
                await until(lambda: placed_on(disk_b) >= 3, "ledgers on disk b", timeout=30)
                FAILURES[failure](disk_a)
                await until(
                    lambda: sample(scrape(port), "bookie_ledger_dir_failed", dir=failed) == 1,
                    "the directory failed",
                )
                assert placed_on(disk_a) == 0  # its ledgers are in limbo on disk b
                written = len(acked)
                await until(lambda: len(acked) >= written + 8, "more ledgers after the failure")
            finally:
                stop.set()
                await load

            assert bookie.process is not None
            assert bookie.process.poll() is None, bookie.log()
            async with Client(cluster.uri) as client:
                registration = await BookieRegistry(client.context.ledgers.store).registration(
                    bookie.address
                )
                assert registration is not None
                assert not registration.read_only
                assert registration.info.failed_ledger_dirs == (failed,)
                marks = client.context.under_replication

                async def repaired() -> bool:
                    marked = [m async for m in marks.list_under_replicated()]
                    in_limbo = sample(scrape(port), "bookie_ledgers_in_limbo")
                    return not marked and in_limbo == 0

                await eventually(repaired, "the failed disk's ledgers repaired")
                assert [lost async for lost in marks.list_lost_entries()] == []
                report = await replicas_check(
                    client.context, AutoRecoveryConfig(metadata=cluster.uri)
                )
                assert all(count == 0 for count in report.counts.values()), report.counts

                for ledger_id, record in (await records(cluster.uri, acked)).items():
                    last = acked[ledger_id]
                    assert record.metadata.last_entry_id == last
                    copies = await replica_copies(ledger_id, record.metadata, PASSWORD, last)
                    for entry_id, by_bookie in copies.items():
                        expected = payload(ledger_id, entry_id, SIZE)
                        assert len(by_bookie) == 3
                        assert all(c == expected for c in by_bookie.values()), (entry_id, by_bookie)
                    reader = await client.open_ledger(ledger_id, password=PASSWORD)
                    assert await read_all(reader) == {
                        e: payload(ledger_id, e, SIZE) for e in range(last + 1)
                    }
        moved = re.search(
            rf"ledger directory {failed} failed: .*; (\d+) of its ledgers", bookie.log()
        )
        assert moved is not None, bookie.log()
        assert int(moved.group(1)) >= 3
