"""The cluster audit as one Spark job over a snapshot: every closed ledger, judged once.

Plan: the ledgers, segments and availability tables become one stream of rows keyed by
ledger, shuffled by that key and sorted within each partition, so that a ledger's rows
arrive together (ledger row, then its segments in order, then one availability row per
bookie that holds it). One `mapInArrow` pass walks that stream batch by batch and judges
each ledger with `tally.core.ledger_audit`: healthy ledgers are recognised with array
arithmetic over the whole batch, straight from their encoded availability
(`clean_ledgers`); any other ledger is decoded and given to `audit_ledger`, the check the
online auditor runs too, so both paths say the same. Spark does the shuffle and sort
natively, with no join and no aggregation of lists; the Python side costs a few
microseconds per healthy ledger.

Data that no ledger row claims is orphan data; registered bookies that did not answer come
from the small bookies table, which travels to every task as a dict. A bookie that did not
answer is not judged anywhere: its (possibly partial) dump is ignored.

Extra copies (over_replicated rows) leave the pass with the violations and are written
apart, to over_replicated/, with their entries and estimated bytes; the summary counts them
apart too (`over_replication`), since they never lower durability.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from tally.audit import schema
from tally.audit.report import write_report
from tally.core.availability import EntryAvailability
from tally.core.digest import MASTER_KEY_SIZE, DigestType
from tally.core.errors import BadRequest, MalformedData
from tally.core.ids import LedgerId
from tally.core.ledger_audit import (
    VIOLATION_CATEGORIES,
    Category,
    LedgerColumns,
    OverReplication,
    Violation,
    audit_ledger,
    clean_ledgers,
    potentially_faulty,
)
from tally.core.ledger_metadata import LedgerMetadata, LedgerState, Segment
from tally.core.placement import DEFAULT_RACK, racks_in_cluster

PART_LEDGER, PART_AVAILABILITY = -1, 2**31 - 1
"""`part` of a ledger row and of an availability row; a segment row's is its index."""

ROWS_PER_PARTITION = 1_000_000
"""Combined rows per shuffle partition, about: a partition's sort stays in memory on a small
machine; the count is rounded up to whole waves of tasks so that no core idles at the end."""

BATCH_ROWS = 20_000
"""Rows per Arrow batch handed to Python: large enough to amortise the per-batch cost."""

_STANDIN_MASTER_KEY = bytes(MASTER_KEY_SIZE)
_FINDINGS_SCHEMA = schema.VIOLATIONS_SCHEMA.append(pa.field("byte_count", pa.int64()))
"""What the pass yields: violation rows and over_replicated rows, split when written."""


def spark_session(master: str = "local[*]", *, memory: str = "4g") -> SparkSession:
    """A session for the audit: no UI, quiet logs, Arrow on, workers on this interpreter.

    Every part of tally that runs Spark starts its session here. `memory` sizes the driver
    (which is also the executor in local mode); it only takes effect if this call starts
    the JVM.
    """
    cores = os.cpu_count() or 2
    builder: Any = SparkSession.builder
    with _python_workers(master):
        session: SparkSession = (
            builder.master(master)
            .appName("tally-audit")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.log.level", "ERROR")
            .config("spark.driver.memory", memory)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", str(max(4, 2 * cores)))
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(BATCH_ROWS))
            .getOrCreate()
        )
    return session


@contextlib.contextmanager
def _python_workers(master: str) -> Iterator[None]:
    """Local Spark workers run on this interpreter, which can import tally.

    PySpark takes the workers' interpreter from PYSPARK_PYTHON when the context starts, or
    else `python3` from PATH, which need not be this environment's (it ignores
    `spark.pyspark.python` in-process). An explicit PYSPARK_PYTHON is left as it is.
    """
    if not master.startswith("local") or os.environ.get("PYSPARK_PYTHON"):
        yield
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        yield
    finally:
        os.environ.pop("PYSPARK_PYTHON", None)


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

    `now_ms` is when under-replication marks are measured from: by default when the snapshot
    was taken (snapshot.json's created_ms), since that is when the marks were read; the
    clock if the snapshot does not say. A ledger marked for longer than `grace_period_ms` is
    reported (`marked_too_long`; 0: never, as in the online check). Returns the summary it
    writes.
    """
    if grace_period_ms < 0:
        raise BadRequest(f"grace period {grace_period_ms} ms is negative")
    if min_racks < 1:
        raise BadRequest(f"min racks must be at least 1, got {min_racks}")
    schema.require_snapshot(snapshot)
    now = _snapshot_time(snapshot) if now_ms is None else now_ms
    timings: dict[str, float] = {}
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)

    mark = time.perf_counter()
    bookies = _read(spark, snapshot, schema.BOOKIES).toArrow()
    cluster = Cluster.of(bookies)
    ledgers = _read(spark, snapshot, schema.LEDGERS)
    checked = ledgers.where(_audited(ledgers)).count()
    timings["read"] = time.perf_counter() - mark

    mark = time.perf_counter()
    auditor = LedgerAuditor(
        cluster, grace_period_ms=grace_period_ms, min_racks=min_racks, now_ms=now
    )
    stream = combined_stream(spark, snapshot)
    found = stream.mapInArrow(auditor, from_arrow_schema(_FINDINGS_SCHEMA))
    found = found.persist(StorageLevel.MEMORY_AND_DISK)  # two writes, one pass
    violations_dir, over_dir = out / schema.VIOLATIONS, out / schema.OVER_REPLICATED
    try:
        extra = F.col("category") == Category.OVER_REPLICATED.value
        violations = found.where(~extra).select(*schema.VIOLATIONS_SCHEMA.names)
        silent = spark.createDataFrame(_unresponsive_bookies(bookies), violations.schema)
        violations.unionByName(silent).write.mode("overwrite").parquet(str(violations_dir))
        _over_replicated(found.where(extra)).write.mode("overwrite").parquet(str(over_dir))
    finally:
        found.unpersist()
    timings["audit"] = time.perf_counter() - mark

    mark = time.perf_counter()
    categories = _category_counts(spark.read.parquet(str(violations_dir)))
    over_replication = _over_replication(spark.read.parquet(str(over_dir)))
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


def _read(spark: SparkSession, snapshot: Path, table: str) -> DataFrame:
    return spark.read.parquet(str(snapshot / table))


def _audited(ledgers: DataFrame) -> Column:
    return (ledgers.state == LedgerState.CLOSED.name) & (ledgers.last_entry_id >= 0)


def combined_stream(spark: SparkSession, snapshot: Path) -> DataFrame:
    """What the audit's one Python pass reads: per ledger, a ledger row (last_entry_id -1
    unless it is audited; its length, for the bytes of extra copies), its segment rows and
    its availability rows, co-located and sorted.

    `part` orders a ledger's rows: the ledger row, its segments by index, then the
    availability rows. The sort leads with ledger_id so that Spark's sort prefix (the first
    key) tells rows apart.
    """
    ledgers = _read(spark, snapshot, schema.LEDGERS)
    segments = _read(spark, snapshot, schema.SEGMENTS)
    availability = _read(spark, snapshot, schema.AVAILABILITY)

    def none(kind: str, name: str) -> Column:
        return F.lit(None).cast(kind).alias(name)

    ledger_rows = ledgers.select(
        "scope",
        "ledger_id",
        F.lit(PART_LEDGER).alias("part"),
        "ensemble_size",
        "write_quorum",
        "ack_quorum",
        F.when(_audited(ledgers), F.col("last_entry_id")).otherwise(-1).alias("last_entry_id"),
        "length",
        "underreplicated_since_ms",
        none("long", "first_entry_id"),
        none("array<string>", "ensemble"),
        none("string", "bookie_id"),
        none("binary", "availability"),
    )
    segment_rows = segments.select(
        "scope",
        "ledger_id",
        F.col("segment_index").alias("part"),
        none("int", "ensemble_size"),
        none("int", "write_quorum"),
        none("int", "ack_quorum"),
        none("long", "last_entry_id"),
        none("long", "length"),
        none("long", "underreplicated_since_ms"),
        "first_entry_id",
        "ensemble",
        none("string", "bookie_id"),
        none("binary", "availability"),
    )
    availability_rows = availability.select(
        "scope",
        "ledger_id",
        F.lit(PART_AVAILABILITY).alias("part"),
        none("int", "ensemble_size"),
        none("int", "write_quorum"),
        none("int", "ack_quorum"),
        none("long", "last_entry_id"),
        none("long", "length"),
        none("long", "underreplicated_since_ms"),
        none("long", "first_entry_id"),
        none("array<string>", "ensemble"),
        "bookie_id",
        "availability",
    )
    rows = sum(
        ds.dataset(snapshot / name, format="parquet").count_rows()
        for name in (schema.LEDGERS, schema.SEGMENTS, schema.AVAILABILITY)
    )
    cores = spark.sparkContext.defaultParallelism
    partitions = cores * max(1, math.ceil(rows / ROWS_PER_PARTITION / cores))
    return (
        ledger_rows.unionByName(segment_rows)
        .unionByName(availability_rows)
        .repartition(partitions, "ledger_id", "scope")
        .sortWithinPartitions("ledger_id", "scope", "part")
    )


@dataclass(frozen=True)
class Cluster:
    """What every task needs of the bookies table, small enough to travel with the task:
    racks by id, and per bookie code (an index into `ids`; one more code stands for any
    bookie the table does not name) whether it responded, has a valid id, and its rack."""

    racks: Mapping[str, str]
    responded: frozenset[str]
    cluster_racks: int
    ids: pa.Array
    responded_by_code: np.ndarray
    valid_by_code: np.ndarray
    rack_by_code: np.ndarray

    @classmethod
    def of(cls, bookies: pa.Table) -> Cluster:
        rows = sorted(bookies.to_pylist(), key=lambda row: row["bookie_id"])
        racks = {row["bookie_id"]: row["rack"] for row in rows}
        unregistered = schema.BookieState.UNREGISTERED.value
        registered = [row["bookie_id"] for row in rows if row["state"] != unregistered]
        rack_codes: dict[str, int] = {DEFAULT_RACK: 0}
        for rack in racks.values():
            rack_codes.setdefault(rack, len(rack_codes))
        return cls(
            racks=racks,
            responded=frozenset(row["bookie_id"] for row in rows if row["responded"]),
            cluster_racks=racks_in_cluster(racks, registered),
            ids=pa.array([row["bookie_id"] for row in rows], pa.string()),
            responded_by_code=np.array([row["responded"] for row in rows] + [False], np.bool_),
            valid_by_code=np.array([_valid_bookie_id(row["bookie_id"]) for row in rows] + [False]),
            rack_by_code=np.array([rack_codes[row["rack"]] for row in rows] + [0], np.int64),
        )

    def codes(self, ids: pa.Array) -> np.ndarray:
        """Bookie codes of bookie ids (the extra code for ids the table does not name)."""
        found = pc.index_in(ids, value_set=self.ids)
        return _int64(pc.fill_null(found, len(self.ids)).to_numpy())


def _valid_bookie_id(bookie: str) -> bool:
    try:
        Segment(0, (bookie,))
    except BadRequest:
        return False
    return True


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


def _over_replication(rows: DataFrame) -> OverReplication:
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


def _category_counts(violations: DataFrame) -> dict[str, int]:
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


class LedgerAuditor:
    """The `mapInArrow` function: sorted combined rows in, violation rows out.

    A ledger's rows may straddle two batches, so the rows of the last ledger of a batch wait
    for the next one (or the end of the partition).
    """

    def __init__(
        self, cluster: Cluster, *, grace_period_ms: int, min_racks: int, now_ms: int
    ) -> None:
        self.cluster = cluster
        self.grace_period_ms = grace_period_ms
        self.min_racks = min_racks
        self.now_ms = now_ms

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        pending: pa.Table | None = None
        for batch in batches:
            table = pa.Table.from_batches([batch])
            if pending is not None and pending.num_rows:
                table = pa.concat_tables([pending, table])
            starts = _ledger_starts(table)
            pending = table.slice(int(starts[-2]))
            if len(starts) > 2:
                yield self.judge(table.slice(0, int(starts[-2])))
        if pending is not None and pending.num_rows:
            yield self.judge(pending)

    def judge(self, table: pa.Table) -> pa.RecordBatch:
        """Violation rows of the whole ledgers in `table` (sorted combined rows)."""
        table = table.combine_chunks()
        starts = _ledger_starts(table)
        ledger_of_row = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
        first_rows = starts[:-1]
        known = table.column("part").to_numpy()[first_rows] == PART_LEDGER
        last = table.column("last_entry_id").fill_null(-1).to_numpy()[first_rows]
        marked = table.column("underreplicated_since_ms").is_valid().to_numpy()[first_rows]
        audited = known & (last >= 0)
        quick = np.flatnonzero(audited & ~marked)
        columns = self._columns(table, quick, ledger_of_row)
        clean = np.zeros(len(first_rows), dtype=np.bool_)
        clean[quick] = clean_ledgers(
            columns, min_racks=self.min_racks, cluster_racks=self.cluster.cluster_racks
        )
        silent = np.zeros(len(first_rows), dtype=np.bool_)
        members = np.repeat(columns.segment_ledger, np.diff(columns.ensemble_offsets))
        silent[quick[members[~columns.responded[columns.ensemble_bookies]]]] = True
        silent &= clean
        closer = (audited & ~clean) | ~known | silent
        rows = np.flatnonzero(closer[ledger_of_row])
        found = _Rows()
        if rows.size:
            picked = table.take(rows)
            values = {name: picked.column(name).to_pylist() for name in picked.column_names}
            bounds = itertools.pairwise(_ledger_starts(picked).tolist())
            for ledger, (begin, end) in zip(np.flatnonzero(closer).tolist(), bounds, strict=True):
                if silent[ledger]:
                    self._silent(found, values, begin, end)
                elif known[ledger]:
                    self._ledger(found, values, begin, end)
                else:
                    self._orphans(found, values, begin, end)
        return found.batch()

    def _columns(
        self, table: pa.Table, ledgers: np.ndarray, ledger_of_row: np.ndarray
    ) -> LedgerColumns:
        """The ledgers of `table` at `ledgers` (indexes of ledgers in the table) as
        `clean_ledgers` takes them."""
        index = np.full(int(ledger_of_row[-1]) + 1 if ledger_of_row.size else 0, -1, np.int64)
        index[ledgers] = np.arange(ledgers.size)
        row_ledger = index[ledger_of_row]
        part = table.column("part").to_numpy()
        chosen = row_ledger >= 0
        ledger_rows = np.flatnonzero(chosen & (part == PART_LEDGER))
        segment_rows = np.flatnonzero(chosen & (part >= 0) & (part != PART_AVAILABILITY))
        report_rows = np.flatnonzero(chosen & (part == PART_AVAILABILITY))
        ids = table.column("bookie_id").chunk(0).take(report_rows)
        report_codes = self.cluster.codes(ids)
        answered = self.cluster.responded_by_code[report_codes]
        report_rows, report_codes = report_rows[answered], report_codes[answered]
        ensembles = table.column("ensemble").chunk(0).take(segment_rows)
        report_offsets, report_data = _binary(
            table.column("availability").chunk(0).take(report_rows)
        )

        def ints(name: str) -> np.ndarray:
            return _int64(table.column(name).chunk(0).take(ledger_rows).to_numpy())

        return LedgerColumns(
            ensemble_size=ints("ensemble_size"),
            write_quorum=ints("write_quorum"),
            ack_quorum=ints("ack_quorum"),
            last_entry_id=ints("last_entry_id"),
            segment_ledger=row_ledger[segment_rows],
            segment_first=table.column("first_entry_id")
            .chunk(0)
            .take(segment_rows)
            .fill_null(-1)
            .to_numpy()
            .astype(np.int64),
            ensemble_offsets=_offsets(ensembles),
            ensemble_bookies=self.cluster.codes(ensembles.flatten()),
            report_ledger=row_ledger[report_rows],
            report_bookie=report_codes,
            report_offsets=report_offsets,
            report_data=report_data,
            responded=self.cluster.responded_by_code,
            valid_id=self.cluster.valid_by_code,
            rack=self.cluster.rack_by_code,
        )

    def _orphans(self, found: _Rows, values: Mapping[str, list[Any]], begin: int, end: int) -> None:
        scope, ledger_id = values["scope"][begin], values["ledger_id"][begin]
        name = _ledger_name(scope, ledger_id)
        for row in range(begin, end):
            bookie = values["bookie_id"][row]
            if values["part"][row] != PART_AVAILABILITY or bookie not in self.cluster.responded:
                continue
            try:
                held = len(EntryAvailability.from_bytes(values["availability"][row]))
            except MalformedData as exc:
                found.add(scope, ledger_id, _orphan(bookie, None, f"data of {name} ({exc})"))
                continue
            found.add(scope, ledger_id, _orphan(bookie, held, f"{held} entries of {name}"))

    def _silent(self, found: _Rows, values: Mapping[str, list[Any]], begin: int, end: int) -> None:
        """A clean ledger but for bookies that did not respond: their rows, as audit_ledger
        words them."""
        ensembles = [
            tuple(values["ensemble"][row])
            for row in range(begin + 1, end)
            if values["part"][row] != PART_AVAILABILITY
        ]
        firsts = [
            values["first_entry_id"][row]
            for row in range(begin + 1, end)
            if values["part"][row] != PART_AVAILABILITY
        ]
        ends = [first - 1 for first in firsts[1:]] + [values["last_entry_id"][begin]]
        silent = {
            bookie
            for ensemble, first, last in zip(ensembles, firsts, ends, strict=True)
            if last >= first
            for bookie in ensemble
            if bookie not in self.cluster.responded
        }
        for violation in potentially_faulty(ensembles, silent):
            found.add(values["scope"][begin], values["ledger_id"][begin], violation)

    def _ledger(self, found: _Rows, values: Mapping[str, list[Any]], begin: int, end: int) -> None:
        scope, ledger_id = values["scope"][begin], values["ledger_id"][begin]
        segments: list[tuple[int, tuple[str, ...]]] = []
        reports: list[tuple[str, bytes]] = []
        for row in range(begin + 1, end):
            if values["part"][row] == PART_AVAILABILITY:
                if values["bookie_id"][row] in self.cluster.responded:
                    reports.append((values["bookie_id"][row], values["availability"][row]))
            else:
                ensemble = values["ensemble"][row]
                segments.append((values["first_entry_id"][row], tuple(ensemble or ())))
        try:
            metadata = _standin_metadata(
                values["ensemble_size"][begin],
                values["write_quorum"][begin],
                values["ack_quorum"][begin],
                values["last_entry_id"][begin],
                values["length"][begin],
                segments,
            )
            availability, undecodable = _decoded(metadata, reports, self.cluster.responded)
            violations = audit_ledger(
                metadata,
                availability,
                racks=self.cluster.racks,
                min_racks=self.min_racks,
                underreplicated_since_ms=values["underreplicated_since_ms"][begin],
                now_ms=self.now_ms,
                grace_period_ms=self.grace_period_ms,
                cluster_racks=self.cluster.cluster_racks,
            )
        except BadRequest as exc:
            found.add(scope, ledger_id, _invalid_metadata(scope, ledger_id, exc))
            return
        for violation in violations:
            why = undecodable.get(violation.bookie_id or "")
            if why is not None:
                violation = dataclasses.replace(violation, detail=f"{violation.detail} ({why})")
            found.add(scope, ledger_id, violation)


def _standin_metadata(
    ensemble_size: int,
    write_quorum: int,
    ack_quorum: int,
    last: int,
    length: int,
    segments: Sequence[tuple[int, tuple[str, ...]]],
) -> LedgerMetadata:
    """The ledger's metadata as far as the audit reads it; what the snapshot does not carry
    (digest, master key, creator) is a stand-in. BadRequest if the rows make no valid
    ledger."""
    return LedgerMetadata(
        state=LedgerState.CLOSED,
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        segments=tuple(Segment(first, ensemble) for first, ensemble in segments),
        digest_type=DigestType.CRC32C,
        master_key=_STANDIN_MASTER_KEY,
        ctime_ms=0,
        creator_token=b"",
        last_entry_id=last,
        length=length,
    )


def _invalid_metadata(scope: int, ledger_id: int, error: BadRequest) -> Violation:
    """The finding of a ledger whose snapshot rows make no valid ledger: it is not judged,
    and the job goes on with the others."""
    return Violation(
        Category.INVALID_METADATA,
        None,
        None,
        None,
        f"the snapshot's rows of {_ledger_name(scope, ledger_id)} make no valid ledger, so it "
        f"is not judged: {error}",
    )


def _decoded(
    metadata: LedgerMetadata, reports: Sequence[tuple[str, bytes]], responded: frozenset[str]
) -> tuple[dict[str, EntryAvailability], dict[str, str]]:
    """The availability map `audit_ledger` takes, and why some reports did not decode.

    Responding bookies of the ledger with no report hold nothing; duplicate reports of one
    bookie are united; a report that does not decode counts as no answer.
    """
    availability = {bookie: EntryAvailability.empty() for bookie in metadata.bookies() & responded}
    undecodable: dict[str, str] = {}
    for bookie, report in reports:
        try:
            held = EntryAvailability.from_bytes(report)
        except MalformedData as exc:
            undecodable[bookie] = f"its report does not decode: {exc}"
            continue
        availability[bookie] = availability.get(bookie, EntryAvailability.empty()).union(held)
    for bookie in undecodable:
        availability.pop(bookie, None)
    return availability, undecodable


def _orphan(bookie: str, held: int | None, what: str) -> Violation:
    return Violation(
        Category.ORPHAN_DATA,
        None,
        bookie,
        held,
        f"bookie {bookie} holds {what}, a ledger the metadata does not have",
    )


def _ledger_name(scope: int, ledger_id: int) -> str:
    return f"ledger {LedgerId(schema.from_int64(scope), schema.from_int64(ledger_id))}"


def _ledger_starts(table: pa.Table) -> np.ndarray:
    """Row indexes where a ledger's rows begin, then the row count."""
    scopes = table.column("scope").to_numpy()
    ids = table.column("ledger_id").to_numpy()
    changes = np.flatnonzero((scopes[1:] != scopes[:-1]) | (ids[1:] != ids[:-1])) + 1
    return _int64(np.concatenate(([0], changes, [table.num_rows])))


def _offsets(array: pa.ListArray) -> np.ndarray:
    """A list array's offsets, from 0."""
    offsets = _int64(array.offsets.to_numpy())
    return _int64(offsets - offsets[0])


def _binary(array: pa.BinaryArray) -> tuple[np.ndarray, np.ndarray]:
    """A binary array's offsets (from 0) and bytes, straight from its buffers."""
    _, offsets_buffer, data_buffer = array.buffers()
    if offsets_buffer is None or len(array) == 0:
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8)
    width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    offsets = _int64(
        np.frombuffer(offsets_buffer, dtype=width)[array.offset : array.offset + len(array) + 1]
    )
    if data_buffer is None:
        return offsets - offsets[0], np.zeros(0, dtype=np.uint8)
    data = np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0] : offsets[-1]]
    return offsets - offsets[0], data


def _int64(values: Any) -> np.ndarray:
    converted: np.ndarray = np.asarray(values, dtype=np.int64)
    return converted


class _Rows:
    """Violation rows gathered column by column, then one Arrow batch."""

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in _FINDINGS_SCHEMA.names}

    def add(self, scope: int, ledger_id: int, violation: Violation) -> None:
        for name, value in (
            ("scope", scope),
            ("ledger_id", ledger_id),
            ("category", violation.category.value),
            ("segment_index", violation.segment_index),
            ("bookie_id", violation.bookie_id),
            ("missing_count", violation.missing_count),
            ("detail", violation.detail),
            ("byte_count", violation.byte_count),
        ):
            self.columns[name].append(value)

    def batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict(self.columns, schema=_FINDINGS_SCHEMA)
