"""The audit's results: the pass's findings written apart (violations/, over_replicated/)
and counted for the summary, as the online check counts them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from tally.audit import schema
from tally.core.ledger_audit import VIOLATION_CATEGORIES, Category, OverReplication


def write_findings(
    spark: SparkSession, found: DataFrame, bookies: pa.Table, violations_dir: Path, over_dir: Path
) -> None:
    """Write the violations, with a row per registered bookie that did not answer, and apart
    from them the extra copies; `found` is computed once for both writes."""
    found = found.persist(StorageLevel.MEMORY_AND_DISK)  # two writes, one pass
    try:
        extra = F.col("category") == Category.OVER_REPLICATED.value
        violations = found.where(~extra).select(*schema.VIOLATIONS_SCHEMA.names)
        silent = spark.createDataFrame(_unresponsive_bookies(bookies), violations.schema)
        violations.unionByName(silent).write.mode("overwrite").parquet(str(violations_dir))
        _over_replicated(found.where(extra)).write.mode("overwrite").parquet(str(over_dir))
    finally:
        found.unpersist()


def _unresponsive_bookies(bookies: pa.Table) -> pa.Table:
    rows = [
        row
        for row in bookies.to_pylist()
        if row["state"] != schema.BookieState.UNREGISTERED.value and not row["responded"]
    ]
    return pa.Table.from_pylist(
        [
            {
                "scope": None,
                "ledger_id": None,
                "category": Category.UNRESPONSIVE_REGISTERED_BOOKIE.value,
                "segment_index": None,
                "bookie_id": row["bookie_id"],
                "missing_count": None,
                "detail": (
                    f"bookie {row['bookie_id']} (rack {row['rack']}) is registered "
                    f"{row['state']} but did not answer the availability dump"
                ),
            }
            for row in sorted(rows, key=lambda row: row["bookie_id"])
        ],
        schema=schema.VIOLATIONS_SCHEMA,
    )


_OVER_REPLICATED_COLUMNS = {
    "scope": "scope",
    "ledger_id": "ledger_id",
    "segment_index": "segment_index",
    "bookie_id": "bookie_id",
    "entries": "missing_count",
    "bytes": "byte_count",
    "detail": "detail",
}
"""Each OVER_REPLICATED_SCHEMA column, and the findings' column it comes from."""


def _over_replicated(rows: DataFrame) -> DataFrame:
    """The over_replicated rows of the findings, as OVER_REPLICATED_SCHEMA declares them
    (Arrow batches renamed, so that the non-nullable fields are written as such)."""
    return rows.mapInArrow(_as_over_replicated, from_arrow_schema(schema.OVER_REPLICATED_SCHEMA))


def _as_over_replicated(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield pa.RecordBatch.from_arrays(
            [batch.column(found) for found in _OVER_REPLICATED_COLUMNS.values()],
            schema=schema.OVER_REPLICATED_SCHEMA,
        )


def over_replication_totals(rows: DataFrame) -> OverReplication:
    """The totals of the over_replicated rows, as the online check counts them."""
    (total,) = rows.agg(
        F.count_distinct("scope", "ledger_id").alias("ledgers"),
        F.count(F.lit(1)).alias("rows"),
        F.coalesce(F.sum("entries"), F.lit(0)).alias("entries"),
        F.coalesce(F.sum("bytes"), F.lit(0)).alias("bytes"),
    ).collect()
    return OverReplication(
        int(total["ledgers"]), int(total["rows"]), int(total["entries"]), int(total["bytes"])
    )


def category_counts(violations: DataFrame) -> dict[str, int]:
    """Distinct ledgers per category; bookies for unresponsive_registered_bookie."""
    per_ledger = {
        row["category"]: row["ledgers"]
        for row in violations.groupBy("category")
        .agg(F.count_distinct("scope", "ledger_id").alias("ledgers"))
        .collect()
    }
    silent = Category.UNRESPONSIVE_REGISTERED_BOOKIE.value
    per_ledger[silent] = violations.where(F.col("category") == silent).count()
    return {
        category.value: int(per_ledger.get(category.value, 0)) for category in VIOLATION_CATEGORIES
    }
