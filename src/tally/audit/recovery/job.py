"""The metadata recovery's Spark job: join the bookies' exports, decide every ledger, write
the decisions and the report.

The exports' ledger and deleted rows are co-located by ledger and sorted, and one Python
pass (`LedgerDecider`, in `mapInArrow`) hands each ledger's rows to
`core.metadata_recovery.recover_ledger`. The cookies are few: read on the driver, where the
cluster's instance id is decided (the bookies must agree) before any ledger is.

From an older audit snapshot (`--from-snapshot`), its ledgers join the exports' rows as
one more copy each (kind `snapshot`), and its tombstones as deletions (kind `deleted`, by
`SNAPSHOT`); its cluster must be the bookies', and its cluster settings are written back.

Out, under the report directory: `ledgers/` (one row per ledger: its verdict, why, the
metadata to write back, the entries no bookie holds), `cookies/` (each bookie's cookie) and
`summary.json`, whose counts `tally cluster recover` prints.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from tally.audit import schema
from tally.audit.ledger_batches import ledger_starts, whole_ledgers
from tally.audit.recovery.exports import EXPORT_SCHEMA, export_files
from tally.audit.schema import from_int64
from tally.core.availability import EntryAvailability
from tally.core.digest import DigestType
from tally.core.errors import BadRequest, CookieMismatch, MalformedData
from tally.core.ids import LedgerId
from tally.core.metadata_recovery import (
    Holding,
    LedgerRecovery,
    Verdict,
    cluster_instance,
    recover_ledger,
)
from tally.metadata.cookies import Cookie

LEDGERS = "ledgers"
COOKIES = "cookies"
SUMMARY_JSON = "summary.json"
DECISIONS_SCHEMA = pa.schema(
    [
        pa.field("scope", pa.int64(), nullable=False),
        pa.field("ledger_id", pa.int64(), nullable=False),
        pa.field("verdict", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("metadata", pa.binary(), nullable=True),
        pa.field("needs_recovery", pa.bool_(), nullable=False),
        pa.field("lost_entries", pa.int64(), nullable=False),
        pa.field("lost", pa.binary(), nullable=False),
        pa.field("bookies", pa.int32(), nullable=False),
    ]
)
SNAPSHOT = "the snapshot"
"""Who a deletion row of the snapshot's tombstones names, in the place of a bookie."""
COOKIES_SCHEMA = pa.schema(
    [
        pa.field("bookie_id", pa.string(), nullable=False),
        pa.field("cookie", pa.binary(), nullable=False),
    ]
)


def read_cookies(exports: Path) -> dict[str, Cookie]:
    """Each export's cookie, by bookie id (the exports' own rows: no Spark needed)."""
    rows = (
        ds.dataset([str(path) for path in export_files(exports)], schema=EXPORT_SCHEMA)
        .to_table(columns=["bookie_id", "cookie"], filter=ds.field("kind") == "cookie")
        .to_pylist()
    )
    cookies: dict[str, Cookie] = {}
    for row in rows:
        cookie = Cookie.from_bytes(row["cookie"], f"the export of bookie {row['bookie_id']}")
        if cookie.bookie_id in cookies:
            raise MalformedData(
                f"two exports in {exports} are of bookie {cookie.bookie_id}: keep one"
            )
        cookies[cookie.bookie_id] = cookie
    return cookies


def read_snapshot(snapshot: Path, instance_id: str) -> dict[str, Any]:
    """The snapshot's snapshot.json, once it is known to be of the bookies' cluster and to
    hold every ledger's metadata and tombstone decoded (no Spark needed). Format 3 is read
    too: its ledgers and tombstones are those of format 4."""
    schema.require_snapshot(snapshot, formats=(3, schema.FORMAT_VERSION))
    taken = json.loads((snapshot / schema.SNAPSHOT_JSON).read_text())
    recorded = taken.get("cluster", {}).get("instance_id")
    if recorded != instance_id:
        raise CookieMismatch(
            f"the snapshot at {snapshot} is of cluster {recorded}, and the bookies' cookies "
            f"name cluster {instance_id}: give a snapshot of this cluster, or none"
        )
    counts = taken.get("counts", {})
    unreadable = counts.get("unreadable_ledgers", 0), counts.get("unreadable_tombstones", 0)
    if any(unreadable):
        # A deletion whose tombstone did not decode would read as no deletion, and a ledger
        # whose record did not decode as a ledger without metadata: nothing is decided on that.
        raise BadRequest(
            f"the snapshot at {snapshot} holds {unreadable[0]} ledger and {unreadable[1]} "
            "tombstone records that did not decode: recover without --from-snapshot, or "
            "from a snapshot taken without them"
        )
    ledgers = ds.dataset(str(snapshot / schema.LEDGERS), schema=schema.LEDGERS_SCHEMA)
    if ledgers.count_rows(filter=ds.field("metadata").is_null()):
        raise BadRequest(
            f"the snapshot at {snapshot} lacks ledger metadata (a synthetic snapshot?): "
            "recover from one `tally audit snapshot` took"
        )
    return dict(taken)


def run_recovery(
    spark: SparkSession, exports: Path, report: Path, snapshot: Path | None = None
) -> dict[str, Any]:
    """Decide every ledger of the exports in `exports` (and of the `snapshot`) into `report`;
    the summary.

    CookieMismatch (before any ledger is decided) if the cookies name several clusters, or
    the snapshot another one."""
    started = time.perf_counter()
    cookies = read_cookies(exports)
    instance_id = cluster_instance(
        {bookie_id: cookie.instance_id for bookie_id, cookie in cookies.items()}
    )
    taken = None if snapshot is None else read_snapshot(snapshot, instance_id)
    report.mkdir(parents=True, exist_ok=True)
    (report / COOKIES).mkdir(exist_ok=True)
    pq.write_table(
        pa.Table.from_pylist(
            [{"bookie_id": b, "cookie": c.to_bytes()} for b, c in sorted(cookies.items())],
            COOKIES_SCHEMA,
        ),
        report / COOKIES / "cookies.parquet",
    )
    rows = (
        spark.read.parquet(*(str(path) for path in export_files(exports)))
        .where(F.col("kind") != "cookie")
        .select(
            "scope",
            "ledger_id",
            "kind",
            "bookie_id",
            "availability",
            "fenced",
            "last_add_confirmed",
            "master_key",
            "metadata_copy",
            "digest_type",
            "in_limbo",
        )
    )
    if snapshot is not None:
        rows = rows.unionByName(_snapshot_rows(spark, snapshot))
    cores = spark.sparkContext.defaultParallelism
    decided = (
        rows.repartition(max(cores, 2), "ledger_id", "scope")
        .sortWithinPartitions("ledger_id", "scope", "kind", "bookie_id")
        .mapInArrow(LedgerDecider(frozenset(cookies)), from_arrow_schema(DECISIONS_SCHEMA))
    )
    decided.write.mode("overwrite").parquet(str(report / LEDGERS))
    timings = {"decide": time.perf_counter() - started}
    decisions = (
        ds.dataset(str(report / LEDGERS), schema=DECISIONS_SCHEMA)
        .to_table(columns=["verdict", "needs_recovery", "lost_entries"])
        .to_pydict()
    )
    counts = Counter(decisions["verdict"])
    lost = decisions["lost_entries"]
    summary: dict[str, Any] = {
        "instance_id": instance_id,
        "bookies": sorted(cookies),
        "ledgers": {verdict.value: counts[verdict.value] for verdict in Verdict},
        "needs_recovery": sum(decisions["needs_recovery"]),
        "incomplete": sum(1 for count in lost if count),
        "lost_entries": sum(lost),
        **({} if taken is None else _from_snapshot(snapshot, taken)),
        "seconds": round(time.perf_counter() - started, 3),
        "timings": {stage: round(seconds, 3) for stage, seconds in timings.items()},
    }
    (report / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _snapshot_rows(spark: SparkSession, snapshot: Path) -> DataFrame:
    """The snapshot's ledgers as copies (kind `snapshot`) and its tombstones as deletions,
    in the exports' columns."""
    nothing = {
        "availability": F.lit(b""),
        "fenced": F.lit(False),
        "last_add_confirmed": F.lit(-1).cast("long"),
        "master_key": F.lit(None).cast("binary"),
        "digest_type": F.lit(None).cast("string"),
        "in_limbo": F.lit(False),
    }
    ledgers = spark.read.parquet(str(snapshot / schema.LEDGERS)).select(
        "scope",
        "ledger_id",
        F.lit("snapshot").alias("kind"),
        F.lit("").alias("bookie_id"),
        *(value.alias(name) for name, value in nothing.items()),
        F.col("metadata").alias("metadata_copy"),
    )
    tombstones = spark.read.parquet(str(snapshot / schema.TOMBSTONES)).select(
        "scope",
        "ledger_id",
        F.lit("deleted").alias("kind"),
        F.lit(SNAPSHOT).alias("bookie_id"),
        *(value.alias(name) for name, value in nothing.items()),
        F.lit(None).cast("binary").alias("metadata_copy"),
    )
    return ledgers.unionByName(tombstones)


def _from_snapshot(snapshot: Path | None, taken: dict[str, Any]) -> dict[str, Any]:
    """What the summary says of the snapshot, and the cluster settings to write back."""
    return {
        "snapshot": {"path": str(snapshot), "created_ms": taken.get("created_ms")},
        schema.CLUSTER_SETTINGS: taken.get(schema.CLUSTER_SETTINGS),
    }


class LedgerDecider:
    """The `mapInArrow` function: a ledger's export rows in (sorted), its decision out.
    `exported`: the bookies whose exports are read (what the others hold is unknown)."""

    def __init__(self, exported: frozenset[str]) -> None:
        self.exported = exported

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for ledgers in whole_ledgers(batches):
            rows = ledgers.to_pylist()
            bounds = itertools.pairwise(ledger_starts(ledgers).tolist())
            decisions = [self.decide(rows[begin:end]) for begin, end in bounds]
            yield pa.RecordBatch.from_pylist(decisions, DECISIONS_SCHEMA)

    def decide(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """One ledger's decision row, from its export rows."""
        first = rows[0]
        ledger_id = LedgerId(from_int64(first["scope"]), from_int64(first["ledger_id"]))
        holdings, unreadable = [], set()
        for row in rows:
            if row["kind"] != "ledger":
                continue
            if row["in_limbo"]:  # what it does not hold of it is unknown, not missing
                unreadable.add(row["bookie_id"])
            try:
                availability = EntryAvailability.from_bytes(row["availability"])
            except MalformedData:
                unreadable.add(row["bookie_id"])  # what that bookie holds is unknown
                continue
            holdings.append(
                Holding(
                    row["bookie_id"],
                    availability,
                    row["fenced"],
                    row["last_add_confirmed"],
                    row["master_key"],
                    row["metadata_copy"],
                    digest_type_named(row["digest_type"]),
                )
            )
        deleted_by = [row["bookie_id"] for row in rows if row["kind"] == "deleted"]
        recorded = next((row["metadata_copy"] for row in rows if row["kind"] == "snapshot"), None)
        answered = self.exported - unreadable  # of this ledger
        decision = recover_ledger(ledger_id, holdings, deleted_by, answered, recorded)
        return decision_row(first, decision, len(holdings))


def digest_type_named(name: str | None) -> DigestType | None:
    """An export's digest type name as a DigestType; a name this version does not know (an
    export by a newer one) says no more than none."""
    try:
        return None if name is None else DigestType[name]
    except KeyError:
        return None


def decision_row(first: dict[str, Any], decision: LedgerRecovery, bookies: int) -> dict[str, Any]:
    return {
        "scope": first["scope"],
        "ledger_id": first["ledger_id"],
        "verdict": decision.verdict.value,
        "reason": decision.reason,
        "metadata": None if decision.metadata is None else decision.metadata.to_bytes(),
        "needs_recovery": decision.needs_recovery,
        "lost_entries": len(decision.lost_entries),
        "lost": decision.lost_entries.to_bytes(),
        "bookies": bookies,
    }
