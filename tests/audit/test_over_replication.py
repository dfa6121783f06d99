"""Over-replication as it happens on a real cluster, and the online check and the Spark job
counting it the same way.

The copies the audit used to call misplaced come from bookies that held a position before:
a bookie declared lost is replaced by the replication worker, comes back with its disk,
and is chosen again for another position of the same segment when the next bookie is lost.
It then holds every entry of the segment, a third of them beyond its write sets; the bookie
replaced second, back too, holds its old position's entries of a segment it is no longer
in. The worker copies nothing beyond the write sets it fills: each new bookie holds exactly
its position's entries, or those plus what it kept from before.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

import tally
from tally.audit import schema
from tally.audit.checks import run_audit
from tally.audit.in_cluster import SparkReplicasCheck
from tally.audit.snapshot import take_snapshot
from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.replicas_check import replicas_check
from tally.autorecovery.replication_worker import ReplicationWorker
from tally.client.config import ClientConfig
from tally.core.ids import LedgerId
from tally.core.ledger_audit import VIOLATION_CATEGORIES, OverReplication
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.schedule import expected_entries
from tests.support.cluster import Cluster, eventually_writable, running_cluster

PASSWORD = b"over-replication"
ENTRIES = 30
SIZE = 100
CLIENT = ClientConfig(add_entry_timeout=2.0, read_timeout=1.5, session_timeout=5.0)
WORKER = AutoRecoveryConfig(
    under_replicated_poll_interval=0.2,
    replication_backoff_initial=0.2,
    replication_backoff_max=1.0,
)
WAIT = 30.0


@contextlib.asynccontextmanager
async def _worker(uri: str) -> AsyncIterator[None]:
    async with tally.Client(uri, config=CLIENT) as client:
        worker = ReplicationWorker(client.context, WORKER, "worker-1", passwords=(PASSWORD,))
        task = asyncio.create_task(worker.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _lose_and_replace(cluster: Cluster, ledger_id: LedgerId, bookie: str) -> LedgerMetadata:
    """Kill `bookie`, mark the ledger for it (as the auditor does once it is declared lost),
    let the worker repair it, then bring the bookie back with its disk; the new metadata."""
    cluster.kill(bookie)
    alive = {b.address for b in cluster.bookies if b.process and b.process.poll() is None}
    await eventually_writable(cluster.uri, alive)
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        marks = client.context.under_replication
        await marks.mark_under_replicated(ledger_id, [bookie])
        async with _worker(cluster.uri):
            deadline = time.monotonic() + WAIT
            while await marks.under_replicated(ledger_id) is not None:
                assert time.monotonic() < deadline, f"ledger not repaired for {bookie}"
                await asyncio.sleep(0.1)
        metadata = (await client.context.ledgers.read_ledger_metadata(ledger_id)).metadata
    await asyncio.to_thread(cluster.restart, [bookie])
    await eventually_writable(cluster.uri, {b.address for b in cluster.bookies})
    return metadata


async def _held(uri: str, ledger_id: LedgerId, bookies: list[str]) -> dict[str, set[int]]:
    async with tally.Client(uri, config=CLIENT) as client:
        held = {}
        for bookie in bookies:
            connection = await client.context.bookies.get(bookie)
            held[bookie] = set(await connection.get_list_of_entries(ledger_id))
        return held


def _owed(metadata: LedgerMetadata, position: int) -> set[int]:
    last = metadata.last_entry_id
    return set(expected_entries(0, last, metadata.ensemble_size, metadata.write_quorum, position))


async def _scenario(cluster: Cluster) -> tuple[LedgerId, LedgerMetadata, str, str]:
    """The ledger after two bookies were lost, replaced and back: its id, metadata, the
    bookie back at another position and the one back outside the ensemble."""
    async with tally.Client(cluster.uri, config=CLIENT) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
        )
        await asyncio.gather(*(writer.append_nowait(bytes([e]) * SIZE) for e in range(ENTRIES)))
        await writer.close()
    ledger_id = writer.ledger_id
    first, second, third = writer.metadata.metadata.segments[0].ensemble
    spare = next(b.address for b in cluster.bookies if b.address not in (first, second, third))

    replaced = await _lose_and_replace(cluster, ledger_id, first)
    assert replaced.segments[0].ensemble == (spare, second, third)
    held = await _held(cluster.uri, ledger_id, [spare, first])
    assert held[spare] == _owed(replaced, 0), "the worker copies exactly the position's entries"
    assert held[first] == _owed(replaced, 0), "the replaced bookie came back with its copies"

    # Only `first` is free when `second` is lost: it takes position 1 of the same segment.
    again = await _lose_and_replace(cluster, ledger_id, second)
    assert again.segments[0].ensemble == (spare, first, third)
    held = await _held(cluster.uri, ledger_id, [first, second])
    assert held[first] == _owed(again, 0) | _owed(again, 1) == set(range(ENTRIES))
    assert held[second] == _owed(again, 1)
    return ledger_id, again, first, second


def _spark_rows(out: Path) -> list[tuple[Any, ...]]:
    return sorted(
        (
            LedgerId(schema.from_int64(r["scope"]), schema.from_int64(r["ledger_id"])),
            r["segment_index"],
            r["bookie_id"],
            r["entries"],
            r["bytes"],
            r["detail"],
        )
        for r in pq.read_table(out / schema.OVER_REPLICATED).to_pylist()
    )


def test_copies_left_by_replaced_bookies_are_over_replication_in_both_checks(
    tmp_path: Path, spark: SparkSession
) -> None:
    with running_cluster(tmp_path / "cluster", 4) as cluster:
        ledger_id, metadata, back_inside, back_outside = asyncio.run(_scenario(cluster))
        config = AutoRecoveryConfig(
            metadata=cluster.uri, auditor_audit_dir=str(tmp_path / "audits")
        )
        # one rack (bookies started without one): placed as can be
        one_rack = ClientConfig(min_num_racks_per_write_quorum=1)

        async def online() -> Any:
            async with tally.Client(cluster.uri, config=one_rack) as client:
                return await replicas_check(client.context, config)

        report = asyncio.run(online())
        asyncio.run(take_snapshot(cluster.uri, tmp_path / "snapshot"))
        summary = run_audit(
            spark, tmp_path / "snapshot", tmp_path / "out", grace_period_ms=0, min_racks=1
        )

        async def in_cluster() -> dict[str, Any]:
            async with tally.Client(cluster.uri, config=one_rack) as client:
                return await SparkReplicasCheck(client.context, config)()

        pipeline = asyncio.run(in_cluster())

    # No violation anywhere: an extra copy never lowers durability.
    assert report.findings == ()
    assert set(report.counts.values()) == {0}
    assert set(summary["categories"].values()) == {0}
    assert pq.read_table(tmp_path / "out" / schema.VIOLATIONS).num_rows == 0
    assert pipeline["counts"] == {category.value: 0 for category in VIOLATION_CATEGORIES}
    assert pipeline["marked"] == 0

    # The same rows, word for word, for the bookies both checks ask.
    online_rows = sorted(
        (ledger, row.segment_index, row.bookie_id, row.missing_count, row.byte_count, row.detail)
        for ledger, row in report.over_replicated
    )
    spark_rows = _spark_rows(tmp_path / "out")
    size = SIZE  # the ledger's mean entry size: every entry has SIZE bytes
    assert metadata.length == ENTRIES * SIZE
    extra_inside = len(_owed(metadata, 0) - _owed(metadata, 1))
    assert online_rows == [r for r in spark_rows if r[2] in metadata.bookies()]
    assert [r[:5] for r in online_rows] == [
        (ledger_id, 0, back_inside, extra_inside, extra_inside * size)
    ]
    assert "(position 1) outside its write sets" in online_rows[0][5]

    # The bookie back outside the ledger is not one the online check asks: the Spark job,
    # which has every bookie's dump, sees it too.
    outside = len(_owed(metadata, 1))
    assert [r[:5] for r in spark_rows if r[2] not in metadata.bookies()] == [
        (ledger_id, 0, back_outside, outside, outside * size)
    ]
    assert report.over_replication == OverReplication(1, 1, extra_inside, extra_inside * size)
    assert (
        summary["over_replication"]
        == OverReplication(1, 2, extra_inside + outside, (extra_inside + outside) * size).to_dict()
    )
    assert pipeline["over_replication"] == summary["over_replication"]
