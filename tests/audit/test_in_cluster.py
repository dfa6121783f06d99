"""The pipeline as the auditor's replicas check (spark mode), over real bookie processes:
it finds entries deleted behind a bookie's back, confirms them, marks the ledger naming
that bookie, and leaves a report; the online check agrees with it on the same cluster."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pyspark.sql import SparkSession

import tally
from tally.audit.in_cluster import KEPT_AUDITS, SparkReplicasCheck
from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.replicas_check import replicas_check
from tally.bookie.ledger_storage import LedgerStorage
from tally.core.ids import LedgerId
from tests.support.cluster import running_cluster


async def _write(uri: str) -> list[LedgerId]:
    async with tally.Client(uri) as client:
        ledgers = []
        for _ in range(4):
            writer = await client.create_ledger(
                ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw"
            )
            await asyncio.gather(*(writer.append_nowait(b"x" * 50) for _ in range(20)))
            await writer.close()
            ledgers.append(writer.ledger_id)
        return ledgers


async def _audit(uri: str, audits: Path) -> tuple[dict[str, object], dict[str, int], set[str]]:
    config = AutoRecoveryConfig(metadata=uri, auditor_audit_dir=str(audits))
    async with tally.Client(uri) as client:
        online = await replicas_check(client.context, config)
        # The online check marked the ledger: clear it so the pipeline judges it afresh.
        async for mark in client.context.under_replication.list_under_replicated():
            lock = await client.context.under_replication.acquire(mark.ledger_id)
            assert lock is not None
            assert await client.context.under_replication.mark_replicated(lock)
        check = SparkReplicasCheck(client.context, config)
        result = await check()
        assert Path(str(result["report"])).read_text().startswith("<!DOCTYPE html>")
        for _ in range(KEPT_AUDITS):
            later = await check()
            assert later["counts"]["below_write_quorum"] == 0, "marked: left to the worker"
        marks = [m async for m in client.context.under_replication.list_under_replicated()]
        missing = {bookie for mark in marks for bookie in mark.missing_bookies}
        return result, dict(online.counts), missing


def test_spark_mode_confirms_marks_and_agrees_with_the_online_check(
    tmp_path: Path, spark: SparkSession
) -> None:
    with running_cluster(tmp_path / "cluster", 3) as cluster:
        ledgers = asyncio.run(_write(cluster.uri))
        bookie = cluster.bookies[1]
        bookie.stop()
        storage = LedgerStorage(bookie.data_dir / "ledgers")
        try:
            assert storage.forget_entries(ledgers[2], range(5, 9)) == 4
        finally:
            storage.close()
        cluster.restart([bookie.address])
        result, online, missing = asyncio.run(_audit(cluster.uri, tmp_path / "audits"))
    counts = result["counts"]
    assert isinstance(counts, dict)
    assert counts.get("below_write_quorum") == online["below_write_quorum"] == 1
    assert all(counts.get(name, 0) == 0 for name in ("no_replica", "below_ack_quorum"))
    assert result["ledgers_checked"] == len(ledgers)
    assert result["marked"] == 1
    assert missing == {bookie.address}
    assert len(list((tmp_path / "audits").glob("audit-*"))) == KEPT_AUDITS
