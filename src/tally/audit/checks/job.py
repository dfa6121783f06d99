"""The audit's Spark job: read the snapshot, plan the one stream of a ledger's rows that the
pass reads, run the pass, and write the findings, the summary and the report."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from tally.audit import schema
from tally.audit.checks.auditor import (
    FINDINGS_SCHEMA,
    PART_AVAILABILITY,
    PART_LEDGER,
    PART_TOMBSTONE,
    PART_UNREADABLE,
    BookiesView,
    LedgerAuditor,
)
from tally.audit.checks.ledger_rows import TOMBSTONE_FIELDS
from tally.audit.checks.results import category_counts, over_replication_totals, write_findings
from tally.audit.report import write_report
from tally.core.deletion import ClusterSettings
from tally.core.errors import BadRequest
from tally.core.ledger_metadata import LedgerState

ROWS_PER_PARTITION = 1_000_000
"""Combined rows per shuffle partition, about: a partition's sort stays in memory on a small
machine; the count is rounded up to whole waves of tasks so that no core idles at the end."""


def run_audit(
    spark: SparkSession,
    snapshot: Path,
    out: Path,
    *,
    grace_period_ms: int,
    min_racks: int,
    now_ms: int | None = None,
) -> dict[str, Any]:
    """Audit the snapshot in `snapshot` into `out` (violations/, over_replicated/,
    summary.json, report.html).

    `now_ms` is when under-replication marks and tombstones are measured from: by default
    when the snapshot was taken (snapshot.json's created_ms), since that is when they were
    read; the clock if the snapshot does not say. A ledger marked for longer than
    `grace_period_ms` is reported (`marked_too_long`; 0: never, as in the online check), and
    data still held of a ledger tombstoned longer than the cluster's deletion_stuck_after ago
    (as snapshot.json records it; the default if it does not) is deletion_stuck. Returns the
    summary it writes.
    """
    if grace_period_ms < 0:
        raise BadRequest(f"grace period {grace_period_ms} ms is negative")
    if min_racks < 1:
        raise BadRequest(f"min racks must be at least 1, got {min_racks}")
    schema.require_snapshot(snapshot)
    now = _snapshot_time(snapshot) if now_ms is None else now_ms
    stuck_after = _deletion_stuck_after(snapshot)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)

    mark = time.perf_counter()
    bookies = _read(spark, snapshot, schema.BOOKIES).toArrow()
    cluster = BookiesView.of(bookies)
    ledgers = _read(spark, snapshot, schema.LEDGERS)
    checked = ledgers.where(_audited(ledgers)).count()
    timings["read"] = time.perf_counter() - mark

    mark = time.perf_counter()
    auditor = LedgerAuditor(
        cluster,
        grace_period_ms=grace_period_ms,
        min_racks=min_racks,
        now_ms=now,
        stuck_after=stuck_after,
    )
    stream = combined_stream(spark, snapshot)
    found = stream.mapInArrow(auditor, from_arrow_schema(FINDINGS_SCHEMA))
    violations_dir, over_dir = out / schema.VIOLATIONS, out / schema.OVER_REPLICATED
    write_findings(spark, found, bookies, violations_dir, over_dir)
    timings["audit"] = time.perf_counter() - mark

    mark = time.perf_counter()
    categories = category_counts(spark.read.parquet(str(violations_dir)))
    over_replication = over_replication_totals(spark.read.parquet(str(over_dir)))
    timings["summary"] = time.perf_counter() - mark
    timings["total"] = time.perf_counter() - started
    summary: dict[str, Any] = {
        "categories": categories,
        "over_replication": over_replication.to_dict(),
        "ledgers_checked": checked,
        "timings": {stage: round(seconds, 3) for stage, seconds in timings.items()},
        "params": {
            "snapshot": str(snapshot),
            "grace_period_ms": grace_period_ms,
            "min_racks": min_racks,
            "now_ms": now,
            "deletion_stuck_after": stuck_after,
            "cluster_racks": cluster.cluster_racks,
        },
    }
    mark = time.perf_counter()
    write_report(out, summary, violations_dir, cluster.racks, over_replicated=over_dir)
    summary["timings"]["report"] = round(time.perf_counter() - mark, 3)
    (out / schema.SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _snapshot_time(snapshot: Path) -> int:
    try:
        created = json.loads((snapshot / schema.SNAPSHOT_JSON).read_text())["created_ms"]
    except (OSError, ValueError, KeyError, TypeError):
        return int(time.time() * 1000)
    return int(created)


def _deletion_stuck_after(snapshot: Path) -> int:
    """The cluster's deletion_stuck_after (seconds) as snapshot.json records it, else the
    default; BadSetting if it records one that is no setting."""
    try:
        recorded = json.loads((snapshot / schema.SNAPSHOT_JSON).read_text())
        value = recorded[schema.CLUSTER_SETTINGS]["deletion_stuck_after"]
    except (OSError, ValueError, KeyError, TypeError):
        return ClusterSettings().deletion_stuck_after
    return ClusterSettings(deletion_stuck_after=value).deletion_stuck_after


def _read(spark: SparkSession, snapshot: Path, table: str) -> DataFrame:
    return spark.read.parquet(str(snapshot / table))


def _audited(ledgers: DataFrame) -> Column:
    return (ledgers.state == LedgerState.CLOSED.name) & (ledgers.last_entry_id >= 0)


def combined_stream(spark: SparkSession, snapshot: Path) -> DataFrame:
    """What the audit's one Python pass reads: per ledger, a ledger row (last_entry_id -1
    unless it is audited; its length, for the bytes of extra copies), its segment rows, its
    tombstone row and its unreadable rows (the table's row but its ledger id, as JSON text in
    one column, `record`: as a struct column, null in every other row, it makes Spark's Arrow
    transfer of all rows to the pass far slower) and its availability rows, co-located and
    sorted.

    `part` orders a ledger's rows: unreadable records, the tombstone row, the ledger row, its
    segments by index, then the availability rows. The sort leads with ledger_id so that
    Spark's sort prefix (the first key) tells rows apart.
    """
    ledgers = _read(spark, snapshot, schema.LEDGERS)
    segments = _read(spark, snapshot, schema.SEGMENTS)
    availability = _read(spark, snapshot, schema.AVAILABILITY)
    tombstones = _read(spark, snapshot, schema.TOMBSTONES)
    unreadable = _read(spark, snapshot, schema.UNREADABLE)
    # The stream's columns after scope, ledger_id and part, with their types.
    columns = {
        "ensemble_size": "int",
        "write_quorum": "int",
        "ack_quorum": "int",
        "last_entry_id": "long",
        "length": "long",
        "underreplicated_since_ms": "long",
        "first_entry_id": "long",
        "ensemble": "array<string>",
        "bookie_id": "string",
        "availability": "binary",
        "record": "string",
    }

    def stream_rows(frame: DataFrame, part: Column, *kept: str, **made: Column) -> DataFrame:
        """`frame` as rows of the stream: its `kept` columns, the `made` ones, null in the
        others."""
        return frame.select(
            "scope",
            "ledger_id",
            part.alias("part"),
            *(
                F.col(name)
                if name in kept
                else made[name].alias(name)
                if name in made
                else F.lit(None).cast(kind).alias(name)
                for name, kind in columns.items()
            ),
        )

    ledger_rows = stream_rows(
        ledgers,
        F.lit(PART_LEDGER),
        "ensemble_size",
        "write_quorum",
        "ack_quorum",
        "length",
        "underreplicated_since_ms",
        last_entry_id=F.when(_audited(ledgers), F.col("last_entry_id")).otherwise(-1),
    )
    segment_rows = stream_rows(segments, F.col("segment_index"), "first_entry_id", "ensemble")
    tombstone_rows = stream_rows(
        tombstones, F.lit(PART_TOMBSTONE), record=F.to_json(F.struct(*TOMBSTONE_FIELDS))
    )
    unreadable_rows = stream_rows(
        unreadable, F.lit(PART_UNREADABLE), record=F.to_json(F.struct("record", "path", "error"))
    )
    availability_rows = stream_rows(
        availability, F.lit(PART_AVAILABILITY), "bookie_id", "availability"
    )
    rows = sum(
        ds.dataset(snapshot / name, format="parquet").count_rows()
        for name in (
            schema.LEDGERS,
            schema.SEGMENTS,
            schema.AVAILABILITY,
            schema.TOMBSTONES,
            schema.UNREADABLE,
        )
    )
    cores = spark.sparkContext.defaultParallelism
    partitions = cores * max(1, math.ceil(rows / ROWS_PER_PARTITION / cores))
    return (
        ledger_rows.unionByName(segment_rows)
        .unionByName(tombstone_rows)
        .unionByName(unreadable_rows)
        .unionByName(availability_rows)
        .repartition(partitions, "ledger_id", "scope")
        .sortWithinPartitions("ledger_id", "scope", "part")
    )
