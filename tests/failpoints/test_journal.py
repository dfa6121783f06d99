"""journal.write and journal.fdatasync: a batch the journal could not make durable is
acknowledged to nobody, the bookie turns read-only (and writable again once a new journal
file is written), and what it did acknowledge survives, a restart or a crash included.

- error, in-process: the add whose batch failed is refused, later ones too while the
  journal is failed; every add acknowledged before and after reads back, also after a
  restart (replay stops where the failed file's durable records end);
- crash or error, a bookie process of an E3 WQ3 AQ2 ledger failing at an fdatasync: the
  writer changes its ensemble and goes on, every entry it saw acknowledged reads back,
  and the bookie, read-only or restarted, answers every entry it had acknowledged (never
  NoSuchEntry).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

import tally
from tally.client.config import ClientConfig
from tally.client.writer import LedgerWriter
from tally.core.ids import LedgerId
from tally.failpoints import enabled
from tests.failpoints.conftest import (
    PASSWORD,
    InProcessCluster,
    RawWriter,
    crashed_at,
    faulty_bookie,
    in_process_cluster,
    payload,
    read_back,
)
from tests.support.polling import until
from tests.support.processes import init_cluster

CLIENT = ClientConfig(
    add_entry_timeout=5.0, read_timeout=5.0, speculative_read_timeout=1.0, session_timeout=5.0
)
FAST_RETRY = {"journal_retry_interval": 0.5, "disk_check_interval": 0.1}


@pytest.mark.parametrize("name", ["journal.write", "journal.fdatasync"])
async def test_a_failed_journal_batch_is_acknowledged_to_nobody_and_loses_nothing_acknowledged(
    tmp_path: Path, name: str
) -> None:
    ledgers = [LedgerId(0, 1), LedgerId(5, 2)]
    async with in_process_cluster(tmp_path, 1, **FAST_RETRY) as cluster:
        [bookie_id] = list(cluster.bookies)
        writer = RawWriter(bookie_id, ledgers)
        await writer.add(40)
        assert writer.acknowledged_count == 40
        with enabled(name, "error(EIO)") as point:
            await writer.add(20)
            assert point.hits >= 1
            assert writer.acknowledged_count == 40, "nothing acknowledged past the failure"
            assert sum(map(len, writer.refused.values())) == 20
            await until(lambda: _registered(cluster, bookie_id, "readonly"), "read-only", timeout=5)
            # A new journal file does not pass the failpoint: the journal writes again, and
            # fails again at its first batch.
            await until(lambda: _registered(cluster, bookie_id, "writable"), "resumed", timeout=5)
            await writer.add(1)
            assert writer.acknowledged_count == 40
        await until(lambda: _registered(cluster, bookie_id, "writable"), "resumed", timeout=5)
        await writer.add(20)
        assert writer.acknowledged_count == 60
        assert await read_back(bookie_id, writer.acknowledged) == 60
        await cluster.restart(bookie_id)
        assert await read_back(bookie_id, writer.acknowledged) == 60
        await writer.add(10)
        assert writer.acknowledged_count == 70


async def _registered(cluster: InProcessCluster, bookie_id: str, mode: str) -> bool:
    return await cluster.registered_as(bookie_id) == mode


@pytest.mark.parametrize("action", ["crash", "error(EIO)"])
async def test_a_bookie_failing_at_fdatasync_is_routed_around_and_keeps_what_it_acknowledged(
    tmp_path: Path, action: str
) -> None:
    uri = init_cluster(tmp_path)
    faulty = faulty_bookie(uri, tmp_path / "faulty", f"journal.fdatasync=40*off->{action}")
    async with in_process_cluster(tmp_path, 3, uri=uri) as cluster:
        try:
            await asyncio.to_thread(faulty.start)
            async with tally.Client(uri, config=CLIENT) as client:
                ledger = await _ledger_on(client, faulty.address)
                raw = RawWriter(faulty.address, [LedgerId(0, 10**9)], size=200)
                acknowledged: dict[int, bytes] = {}
                writing = asyncio.create_task(
                    _write_until(ledger, acknowledged, lambda: raw.refused_count > 0)
                )
                await raw.add_until_refused()
                if action == "crash":
                    crashed_at(faulty, "journal.fdatasync")
                await writing
                assert raw.acknowledged_count > 0, "the bookie acknowledged adds before"
                await ledger.close()
                metadata = ledger.metadata.metadata
                assert len(metadata.segments) >= 2
                assert faulty.address in metadata.segments[0].ensemble
                assert faulty.address not in metadata.segments[-1].ensemble
                assert metadata.last_entry_id >= max(acknowledged)
                reader = await client.open_ledger(ledger.ledger_id, password=PASSWORD)
                read = {e.entry_id: e.data async for e in reader.read(0, metadata.last_entry_id)}
                assert {e: read[e] for e in acknowledged} == acknowledged
            if action != "crash":  # refused, read-only, serving reads
                assert faulty.process is not None
                assert faulty.process.poll() is None
                assert await read_back(faulty.address, raw.acknowledged, size=200) == (
                    raw.acknowledged_count
                )
        finally:
            faulty.kill()
        await cluster.take_over(faulty)
        assert await read_back(faulty.address, raw.acknowledged, size=200) == (
            raw.acknowledged_count
        )


async def _ledger_on(client: tally.Client, bookie: str) -> LedgerWriter:
    """An E3 WQ3 AQ2 ledger whose ensemble holds `bookie` (placement is random)."""
    for _ in range(20):
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        if bookie in writer.metadata.metadata.segments[0].ensemble:
            return writer
        await writer.close()
    raise AssertionError(f"no ensemble with {bookie} in 20 tries")


async def _write_until(
    writer: LedgerWriter, acknowledged: dict[int, bytes], failed: Callable[[], bool]
) -> None:
    """Append, 16 in flight, until the faulty bookie has `failed` and 50 more entries were
    acknowledged after it did; what was acknowledged goes into `acknowledged`."""
    after_failure = 0
    pending: set[asyncio.Future[int]] = set()
    number = 0
    while after_failure < 50:
        data = payload(writer.ledger_id, number, 300)
        future = writer.append_nowait(data)
        future.add_done_callback(
            lambda f, data=data: (
                acknowledged.__setitem__(f.result(), data)
                if not f.cancelled() and f.exception() is None
                else None
            )
        )
        pending.add(future)
        number += 1
        if len(pending) >= 16:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if failed():
                after_failure += len(done)
    if pending:
        await asyncio.wait(pending)
    assert all(f.exception() is None for f in pending)
