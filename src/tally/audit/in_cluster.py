"""The audit pipeline as the auditor's replicas check (`auditor_replicas_check_mode = spark`).

The online check asks every bookie about every ledger, one request each; here the auditor
takes a snapshot instead (one streamed dump per bookie), runs the checks on Spark, confirms
each finding against the live cluster (so snapshot skew never marks a healthy ledger), and
marks the confirmed durability findings under-replicated, naming the bookies that lack
copies, so that the replication workers repair them as they do after the online check.
Over-replication is returned apart from the counts, as the online check's report keeps it.
The last few audits stay on disk, each with its report.html.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tally.audit import schema
from tally.audit.checks import run_audit, spark_session
from tally.audit.confirm import confirm
from tally.audit.snapshot import take_snapshot
from tally.autorecovery.config import AutoRecoveryConfig
from tally.client.context import ClientContext
from tally.core.ids import LedgerId
from tally.core.ledger_audit import Category

log = logging.getLogger(__name__)

KEPT_AUDITS = 3
DURABILITY = frozenset(
    {Category.NO_REPLICA.value, Category.BELOW_ACK_QUORUM.value, Category.BELOW_WRITE_QUORUM.value}
)


class SparkReplicasCheck:
    """One audit per call; its summary, confirmation and report path as the check's result."""

    def __init__(self, context: ClientContext, config: AutoRecoveryConfig) -> None:
        self.context = context
        self.config = config
        self.root = (
            Path(config.auditor_audit_dir)
            if config.auditor_audit_dir
            else Path(tempfile.gettempdir()) / "tally-audits"
        )
        self._spark: Any = None

    async def __call__(self) -> dict[str, Any]:
        started = time.time()
        run = self.root / f"audit-{int(started * 1000)}"
        snapshot, report = run / "snapshot", run / "report"
        grace_ms = int(self.config.underreplicated_ledger_recovery_grace_period * 1000)
        min_racks = self.context.config.min_num_racks_per_write_quorum
        await take_snapshot(self.config.metadata, snapshot)
        if self._spark is None:
            self._spark = await asyncio.to_thread(spark_session, self.config.auditor_spark_master)
        summary = await asyncio.to_thread(
            run_audit,
            self._spark,
            snapshot,
            report,
            grace_period_ms=grace_ms,
            min_racks=min_racks,
        )
        confirmed = await confirm(
            report,
            self.config.metadata,
            grace_period_ms=grace_ms,
            min_racks=min_racks,
            client=self.context.config,
        )
        marked = await self._mark(report / "confirmed")
        self._prune()
        log.info(
            "spark audit of %d ledgers in %.1fs: %s confirmed, %s dropped, %d marked; report %s",
            summary["ledgers_checked"],
            time.time() - started,
            confirmed["confirmed"],
            confirmed["dropped"],
            marked,
            report / schema.REPORT_HTML,
        )
        return {
            "counts": confirmed["categories"],
            "over_replication": summary["over_replication"],
            "ledgers_checked": summary["ledgers_checked"],
            "marked": marked,
            "report": str(report / schema.REPORT_HTML),
        }

    async def _mark(self, confirmed: Path) -> int:
        """Mark every ledger with a confirmed durability finding, naming its bookies."""
        rows = pq.read_table(confirmed).to_pylist()
        missing: dict[LedgerId, set[str]] = defaultdict(set)
        for row in rows:
            if row["category"] in DURABILITY and row["ledger_id"] is not None:
                ledger_id = LedgerId(
                    schema.from_int64(row["scope"]), schema.from_int64(row["ledger_id"])
                )
                if row["bookie_id"] is not None:
                    missing[ledger_id].add(row["bookie_id"])
                else:
                    missing.setdefault(ledger_id, set())
        for ledger_id, bookies in missing.items():
            await self.context.under_replication.mark_under_replicated(ledger_id, bookies)
        return len(missing)

    def _prune(self) -> None:
        runs = sorted(self.root.glob("audit-*"), key=lambda path: path.name)
        for old in runs[:-KEPT_AUDITS]:
            shutil.rmtree(old, ignore_errors=True)
