"""The Spark audit on a real local session: hand-made snapshots with one ledger per case, and
synthetic ones checked against their truth.json and against `audit_ledger`, ledger by ledger."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from tally.audit import schema
from tally.audit.checks import BookiesView, run_audit
from tally.audit.checks.ledger_rows import tombstone_of
from tally.audit.synth import UNREPORTED, ledger_key, synthesize
from tally.cli.audit import app, parse_duration
from tally.cli.main import app as tally_app
from tally.core.availability import EntryAvailability
from tally.core.deletion import ClusterSettings, Tombstone
from tally.core.errors import BadRequest
from tally.core.ledger_audit import VIOLATION_CATEGORIES, Category, audit_ledger, deletion_stuck
from tally.core.ledger_metadata import Deletion
from tally.core.schedule import write_set
from tests.audit.snapshot_rows import metadata_of

NOW = 1_700_000_000_000
HOUR = 3_600_000
DAY = 24 * HOUR
SCOPE = schema.to_int64((1 << 63) + 5)
RACKS = {f"b{i}": f"/r{i % 3}" for i in range(8)}
BOOKIE_ROWS = [
    {"bookie_id": b, "rack": rack, "state": "writable", "responded": b != "b6"}
    for b, rack in RACKS.items()
    if b != "b7"
] + [{"bookie_id": "b7", "rack": "/r1", "state": "unregistered", "responded": False}]


@dataclass
class Case:
    """A ledger of a hand-made snapshot; its bookies hold what the schedule says, then
    `lose` and `gain` change that."""

    ledger_id: int
    ensembles: list[tuple[str, ...]]
    last: int
    firsts: list[int] = field(default_factory=lambda: [0])
    wq: int = 2
    aq: int = 2
    state: str = "CLOSED"
    since: int | None = None
    scope: int = 0
    lose: dict[str, set[int]] = field(default_factory=dict)
    gain: dict[str, set[int]] = field(default_factory=dict)
    reports: dict[str, bytes] = field(default_factory=dict)

    def held(self) -> dict[str, set[int]]:
        held: dict[str, set[int]] = {b: set() for ensemble in self.ensembles for b in ensemble}
        ends = [first - 1 for first in self.firsts[1:]] + [self.last]
        for ensemble, first, last in zip(self.ensembles, self.firsts, ends, strict=True):
            for entry in range(first, last + 1):
                for position in write_set(entry, len(ensemble), self.wq):
                    held[ensemble[position]].add(entry)
        for bookie, entries in self.lose.items():
            held[bookie] -= entries
        for bookie, entries in self.gain.items():
            held[bookie] = held.get(bookie, set()) | entries
        return held


ABC = ("b0", "b1", "b2")
CASES = [
    Case(1, [ABC, ("b0", "b1", "b5")], 99, firsts=[0, 50]),
    Case(2, [ABC], 29, lose={"b1": {7}, "b2": {7}}),
    Case(3, [ABC], 29, lose={"b2": {10}}),
    Case(4, [ABC], 29, wq=3, lose={"b0": {3}}),
    Case(5, [ABC], 29, since=NOW - 2 * HOUR),
    Case(6, [ABC], 29, since=NOW - HOUR // 6, lose={"b1": set(range(30))}),
    Case(7, [("b0", "b3", "b1")], 29),
    Case(8, [("b0", "b3", "b1")], 29, wq=3),
    Case(9, [("b6", "b1", "b2")], 29),
    Case(10, [ABC], 29, gain={"b2": {0}, "b5": {1, 2}}),
    Case(11, [ABC], -1, state="OPEN"),
    Case(12, [ABC], -1),
    Case(schema.to_int64((1 << 64) - 1), [("b3", "b4", "b5")], 49, scope=SCOPE),
    Case(14, [ABC], 9, reports={"b1": b"xx"}),
    Case(20, [ABC], 29, state="DELETED", lose={"b1": {7}, "b2": {7}}),  # not judged: deleted
]
ORPHANS = [("b0", 0, 99, {0, 1, 2}), ("b1", 0, 99, {0, 1, 2}), ("b4", SCOPE, 77, {5})]
IGNORED = [("b6", 0, 98, {0})]  # b6 did not respond: its dump is not judged


@dataclass
class Gone:
    """A tombstoned ledger of a hand-made snapshot: when its tombstone was written, and the
    bookies it names with their acknowledgements."""

    ledger_id: int
    tombstoned_ms: int
    bookies: dict[str, int | None]
    scope: int = 0


TOMBSTONES = [
    Gone(21, NOW - 2 * DAY, {"b0": None, "b1": NOW - DAY}),  # stuck on b0, and on b5 unnamed
    Gone(22, NOW - HOUR, {"b0": None, "b1": None}),  # younger than a day: on its way out
    Gone(23, NOW - 3 * DAY, {"b0": NOW - 2 * DAY}),  # old, and nothing of it is held
    Gone(24, NOW - 2 * DAY, {"b6": None}),  # old, held by b6 only, which did not respond
    Gone(schema.to_int64(2**63 + 26), NOW - 2 * DAY, {"b3": None}, scope=SCOPE),
]
GONE_DATA = [
    ("b0", 0, 21, {0, 1, 2}),
    ("b5", 0, 21, {3}),
    ("b0", 0, 22, {0}),
    ("b1", 0, 22, {1}),
    ("b6", 0, 24, {0}),
    ("b3", SCOPE, schema.to_int64(2**63 + 26), {0, 1}),
]
"""What bookies still hold of the tombstoned ledgers."""


def tombstone_row(gone: Gone, **changes: Any) -> dict[str, Any]:
    return {
        "scope": gone.scope,
        "ledger_id": gone.ledger_id,
        "deleted_ms": gone.tombstoned_ms - DAY,
        "reason": "trimmed by the broker",
        "violations": 0,
        "check_detail": "every entry on WQ bookies",
        "tombstoned_ms": gone.tombstoned_ms,
        "last_entry_id": 9,
        "length": 10,
        "bookies": list(gone.bookies),
        "acknowledged_ms": list(gone.bookies.values()),
    } | changes


def write_snapshot(
    root: Path,
    cases: list[Case],
    strays: list[Any],
    created_ms: int = NOW,
    *,
    tombstones: list[dict[str, Any]] | None = None,
    settings: dict[str, Any] | None = None,
    unreadable: Sequence[dict[str, Any]] = (),
) -> Path:
    """The snapshot of `cases`, `strays` (bookie, scope, ledger id, entries held) and
    `tombstones` (rows; those of TOMBSTONES by default), taken at `created_ms` when the
    cluster settings were `settings` (none recorded by default)."""
    if tombstones is None:
        tombstones = [tombstone_row(gone) for gone in TOMBSTONES]
    ledgers: list[dict[str, Any]] = []
    segments: list[dict[str, Any]] = []
    availability: list[dict[str, Any]] = []
    for case in cases:
        ledgers.append(
            {
                "scope": case.scope,
                "ledger_id": case.ledger_id,
                "state": case.state,
                "ensemble_size": len(case.ensembles[0]),
                "write_quorum": case.wq,
                "ack_quorum": case.aq,
                "last_entry_id": case.last,
                "length": max(case.last + 1, 0),
                "ctime_ms": 0,
                "digest_type": "CRC32C",
                "underreplicated_since_ms": case.since,
                "archived": case.state == "DELETED",
                "deleted_ms": created_ms - HOUR if case.state == "DELETED" else None,
                "metadata": None,
            }
        )
        ends = [first - 1 for first in case.firsts[1:]] + [case.last]
        for index, (first, last, ensemble) in enumerate(
            zip(case.firsts, ends, case.ensembles, strict=True)
        ):
            segments.append(
                {
                    "scope": case.scope,
                    "ledger_id": case.ledger_id,
                    "segment_index": index,
                    "first_entry_id": first,
                    "last_entry_id": last,
                    "ensemble": list(ensemble),
                }
            )
        for bookie, entries in case.held().items():
            report = case.reports.get(bookie, EntryAvailability.from_entries(entries).to_bytes())
            if entries or bookie in case.reports:
                availability.append(_availability(bookie, case.scope, case.ledger_id, report))
    for bookie, scope, ledger_id, entries in strays:
        report = EntryAvailability.from_entries(entries).to_bytes()
        availability.append(_availability(bookie, scope, ledger_id, report))
    for name, rows, table_schema in (
        (schema.LEDGERS, ledgers, schema.LEDGERS_SCHEMA),
        (schema.SEGMENTS, segments, schema.SEGMENTS_SCHEMA),
        (schema.BOOKIES, BOOKIE_ROWS, schema.BOOKIES_SCHEMA),
        (schema.AVAILABILITY, availability, schema.AVAILABILITY_SCHEMA),
        (schema.TOMBSTONES, tombstones, schema.TOMBSTONES_SCHEMA),
        (schema.UNREADABLE, list(unreadable), schema.UNREADABLE_SCHEMA),
    ):
        (root / name).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows, table_schema), root / name / "part-0.parquet")
    recorded: dict[str, Any] = {"created_ms": created_ms}
    if settings is not None:
        recorded[schema.CLUSTER_SETTINGS] = settings
    (root / schema.SNAPSHOT_JSON).write_text(json.dumps(recorded))
    return root


def _availability(bookie: str, scope: int, ledger_id: int, report: bytes) -> dict[str, Any]:
    return {"bookie_id": bookie, "scope": scope, "ledger_id": ledger_id, "availability": report}


def _rows(out: Path) -> set[tuple[Any, ...]]:
    return {
        (r["category"], r["scope"], r["ledger_id"], r["segment_index"], r["bookie_id"],
         r["missing_count"])
        for r in pq.read_table(out / schema.VIOLATIONS).to_pylist()
    }  # fmt: skip


def _invalid_details(out: Path) -> dict[int, str]:
    """The details of the run's invalid_metadata rows, by ledger id."""
    return {
        r["ledger_id"]: r["detail"]
        for r in pq.read_table(out / schema.VIOLATIONS).to_pylist()
        if r["category"] == "invalid_metadata"
    }


def _extra_rows(out: Path) -> set[tuple[Any, ...]]:
    return {
        (r["scope"], r["ledger_id"], r["segment_index"], r["bookie_id"], r["entries"], r["bytes"])
        for r in pq.read_table(out / schema.OVER_REPLICATED).to_pylist()
    }


@pytest.fixture(scope="module")
def handmade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_snapshot(tmp_path_factory.mktemp("handmade"), CASES, ORPHANS + IGNORED + GONE_DATA)


@pytest.fixture(scope="module")
def audited(spark: SparkSession, handmade: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("out")
    return out, run_audit(spark, handmade, out, grace_period_ms=HOUR, min_racks=2)


def test_every_category_is_found_exactly(audited: tuple[Path, dict[str, Any]]) -> None:
    out, summary = audited
    assert _rows(out) == {
        ("no_replica", 0, 2, 0, "b1", 1),
        ("no_replica", 0, 2, 0, "b2", 1),
        ("below_ack_quorum", 0, 3, 0, "b2", 1),
        ("below_write_quorum", 0, 4, 0, "b0", 1),
        ("underreplicated_too_long", 0, 5, None, None, None),
        ("placement_fail", 0, 7, 0, None, None),
        ("placement_soft", 0, 8, 0, None, None),
        ("potentially_faulty", 0, 9, None, "b6", None),
        ("potentially_faulty", 0, 14, None, "b1", None),
        ("orphan_data", 0, 99, None, "b0", 3),
        ("orphan_data", 0, 99, None, "b1", 3),
        ("orphan_data", SCOPE, 77, None, "b4", 1),
        ("deletion_stuck", 0, 21, None, "b0", 3),
        ("deletion_stuck", 0, 21, None, "b5", 1),
        ("deletion_stuck", SCOPE, schema.to_int64(2**63 + 26), None, "b3", 2),
        ("unresponsive_registered_bookie", None, None, None, "b6", None),
    }
    assert summary["categories"] == {
        "no_replica": 1,
        "below_ack_quorum": 1,
        "below_write_quorum": 1,
        "underreplicated_too_long": 1,
        "placement_fail": 1,
        "placement_soft": 1,
        "unresponsive_registered_bookie": 1,
        "potentially_faulty": 2,
        "orphan_data": 2,
        "deletion_stuck": 2,
        "invalid_metadata": 0,
    }
    # Ledger 10's extra copies: apart from the violations, one byte per entry (its length).
    assert _extra_rows(out) == {(0, 10, 0, "b2", 1, 1), (0, 10, 0, "b5", 2, 2)}
    assert summary["over_replication"] == {"ledgers": 1, "rows": 2, "entries": 3, "bytes": 3}
    assert summary["ledgers_checked"] == 12
    assert set(summary["timings"]) == {"read", "audit", "summary", "total", "report"}
    assert summary["params"]["now_ms"] == NOW
    assert summary["params"]["deletion_stuck_after"] == DAY // 1000, "the default: none recorded"
    assert json.loads((out / schema.SUMMARY_JSON).read_text()) == summary
    assert (out / schema.REPORT_HTML).stat().st_size > 1000


def test_details_name_the_evidence(audited: tuple[Path, dict[str, Any]]) -> None:
    out, _ = audited
    details = {
        (r["ledger_id"], r["category"], r["bookie_id"]): r["detail"]
        for r in pq.read_table(out / schema.VIOLATIONS).to_pylist()
    }
    assert details[99, "orphan_data", "b0"] == (
        "bookie b0 holds 3 entries of ledger 99, a ledger with neither metadata nor tombstone"
    )
    assert details[77, "orphan_data", "b4"] == (
        f"bookie b4 holds 1 entries of ledger {(1 << 63) + 5:016x}{77:016x}, a ledger with "
        "neither metadata nor tombstone"
    )
    assert details[14, "potentially_faulty", "b1"].startswith(
        "bookie b1 of segment(s) 0 did not report its entries; its copies are not judged "
        "(its report does not decode: entry availability truncated"
    )
    assert details[21, "deletion_stuck", "b0"] == (
        f"bookie b0 still holds 3 entries (entries 0, 1, 2) of the ledger deleted at "
        f"{NOW - 3 * DAY} ms (trimmed by the broker) and tombstoned {2 * DAY} ms ago, longer "
        "than deletion_stuck_after (86400 s); the tombstone names it and waits for its "
        "acknowledgement: its garbage collection has not dropped them (`tally shell gcstatus "
        "--bookie b0`)"
    )
    assert "the tombstone does not name it" in details[21, "deletion_stuck", "b5"]
    assert details[None, "unresponsive_registered_bookie", "b6"] == (
        "bookie b6 (rack /r0) is registered writable but did not answer the availability dump"
    )


def test_a_record_the_store_cannot_decode_is_invalid_metadata_and_its_data_no_orphan(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Metadata that is there but unreadable never makes its ledger's data orphan."""
    unreadable = [
        {"scope": 0, "ledger_id": 31, "record": "ledger", "path": "/ledgers/x", "error": "bad"},
        {"scope": 0, "ledger_id": 32, "record": "tombstone", "path": "/t/y", "error": "worse"},
    ]
    snapshot = write_snapshot(
        tmp_path / "snap",
        [],
        [("b0", 0, 31, [0, 1]), ("b1", 0, 32, [0]), ("b2", 0, 33, [0])],
        tombstones=[],
        unreadable=unreadable,
    )
    out = tmp_path / "out"
    summary = run_audit(spark, snapshot, out, grace_period_ms=HOUR, min_racks=2)
    assert _rows(out) == {
        ("invalid_metadata", 0, 31, None, None, None),
        ("invalid_metadata", 0, 32, None, None, None),
        ("orphan_data", 0, 33, None, "b2", 1),
        ("unresponsive_registered_bookie", None, None, None, "b6", None),
    }
    assert summary["categories"]["invalid_metadata"] == 2
    details = _invalid_details(out)
    assert details[31] == (
        "the snapshot's rows of ledger 31 make no valid ledger, so it is not judged: the "
        "store's ledger at /ledgers/x does not decode: bad"
    )
    assert details[32].endswith("the store's tombstone at /t/y does not decode: worse")


def test_violations_have_the_contract_schema(audited: tuple[Path, dict[str, Any]]) -> None:
    out, _ = audited
    assert pq.read_schema(next((out / schema.VIOLATIONS).glob("*.parquet"))).equals(
        schema.VIOLATIONS_SCHEMA
    )
    assert pq.read_schema(next((out / schema.OVER_REPLICATED).glob("*.parquet"))).equals(
        schema.OVER_REPLICATED_SCHEMA
    )


def test_ledgers_split_across_arrow_batches_are_judged_whole(
    spark: SparkSession, handmade: Path, audited: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "3")
    try:
        run_audit(spark, handmade, tmp_path, grace_period_ms=HOUR, min_racks=2)
    finally:
        spark.conf.set(key, before)
    assert _rows(tmp_path) == _rows(audited[0])
    assert _extra_rows(tmp_path) == _extra_rows(audited[0])


def test_the_cluster_racks_are_those_of_registered_bookies() -> None:
    """As the client counts them when it enforces the rule: a bookie gone from the registry
    (named by an old ensemble) brings no rack of its own to the cluster."""
    gone = {"bookie_id": "b9", "rack": "/gone", "state": "unregistered", "responded": False}
    table = pa.Table.from_pylist([*BOOKIE_ROWS, gone], schema=schema.BOOKIES_SCHEMA)
    assert BookiesView.of(table).cluster_racks == 3
    read_only = {"bookie_id": "b9", "rack": "/r9", "state": "readonly", "responded": True}
    table = pa.Table.from_pylist([*BOOKIE_ROWS, read_only], schema=schema.BOOKIES_SCHEMA)
    assert BookiesView.of(table).cluster_racks == 4


def test_the_grace_period_and_min_racks_change_the_verdict(
    spark: SparkSession, handmade: Path, tmp_path: Path
) -> None:
    summary = run_audit(spark, handmade, tmp_path, grace_period_ms=3 * HOUR, min_racks=1)
    assert summary["categories"]["underreplicated_too_long"] == 0
    assert summary["categories"]["placement_fail"] == 0
    assert summary["categories"]["placement_soft"] == 2  # ledger 7 is now soft too
    summary = run_audit(
        spark, handmade, tmp_path, grace_period_ms=2 * HOUR, min_racks=2, now_ms=NOW + 3 * HOUR
    )
    assert summary["categories"]["underreplicated_too_long"] == 2


def test_a_grace_period_of_zero_never_reports_a_mark_as_the_online_check(
    spark: SparkSession, handmade: Path, tmp_path: Path
) -> None:
    """One meaning of 0 (BookKeeper's): the report is off, however long the marks are old;
    the marked ledgers are still left to the worker, not judged."""
    summary = run_audit(
        spark, handmade, tmp_path, grace_period_ms=0, min_racks=2, now_ms=NOW + 300 * HOUR
    )
    assert summary["categories"]["underreplicated_too_long"] == 0
    assert not {ledger for _, _, ledger, *_ in _rows(tmp_path)} & {5, 6}


def test_the_threshold_is_the_one_the_snapshot_recorded_and_a_tombstone_wins(
    spark: SparkSession, audited: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """With deletion_stuck_after 0 every tombstoned ledger that a responding bookie still
    holds is stuck. Ledger 25 was tombstoned while the snapshot walked the store, so it has
    a CLOSED ledger row (missing a copy) too: it is judged as deleted, not for durability."""
    during = Case(25, [ABC], 29, lose={"b0": {1}})
    tombstones = [*TOMBSTONES, Gone(25, NOW - 1_000, dict.fromkeys(ABC))]
    snapshot = write_snapshot(
        tmp_path / "snapshot",
        [*CASES, during],
        ORPHANS + IGNORED + GONE_DATA,
        tombstones=[tombstone_row(gone) for gone in tombstones],
        settings=ClusterSettings(deletion_stuck_after=0).to_dict(),
    )
    out = tmp_path / "out"
    summary = run_audit(spark, snapshot, out, grace_period_ms=HOUR, min_racks=2)
    stuck = {
        ("deletion_stuck", 0, 22, None, "b0", 1),
        ("deletion_stuck", 0, 22, None, "b1", 1),
    } | {
        ("deletion_stuck", 0, 25, None, bookie, len(entries))
        for bookie, entries in during.held().items()
    }
    assert _rows(out) == _rows(audited[0]) | stuck
    assert summary["categories"]["deletion_stuck"] == 4
    assert summary["params"]["deletion_stuck_after"] == 0


INVALID = [
    Case(15, [ABC], 29, firsts=[1]),  # the first segment starts at entry 1
    Case(16, [ABC, ("b0", "b1")], 29, firsts=[0, 10]),  # an ensemble of two, E is 3
    Case(17, [ABC, ("b3", "b4", "b5")], 29, firsts=[0, 40]),  # a segment past the end
]


def test_rows_that_make_no_valid_ledger_are_invalid_metadata_and_the_job_goes_on(
    spark: SparkSession, audited: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    broken = tombstone_row(Gone(27, NOW - 2 * DAY, {"b0": None}), acknowledged_ms=[])
    snapshot = write_snapshot(
        tmp_path / "snapshot",
        CASES + INVALID,
        [*ORPHANS, *IGNORED, *GONE_DATA, ("b0", 0, 27, {0})],
        tombstones=[*(tombstone_row(gone) for gone in TOMBSTONES), broken],
    )
    out = tmp_path / "out"
    summary = run_audit(spark, snapshot, out, grace_period_ms=HOUR, min_racks=2)
    before, before_summary = audited
    invalid = {("invalid_metadata", 0, case.ledger_id, None, None, None) for case in INVALID}
    invalid.add(("invalid_metadata", 0, 27, None, None, None))
    assert _rows(out) == _rows(before) | invalid
    assert _extra_rows(out) == _extra_rows(before)
    assert summary["categories"] == before_summary["categories"] | {"invalid_metadata": 4}
    details = _invalid_details(out)
    assert details[15] == (
        "the snapshot's rows of ledger 15 make no valid ledger, so it is not judged: the "
        "first segment starts at entry 1, not 0"
    )
    assert "ledger 16" in details[16]
    assert "ledger 17" in details[17]
    assert details[27] == (
        "the snapshot's rows of ledger 27 make no valid tombstone, so it is not judged: the "
        "tombstone names 1 bookies but has 0 acknowledgements"
    )


def test_a_snapshot_of_another_format_is_refused_before_spark_starts(
    handmade: Path, tmp_path: Path
) -> None:
    old = tmp_path / "old"
    shutil.copytree(handmade, old)
    (old / schema.SNAPSHOT_JSON).write_text(json.dumps({"created_ms": NOW, "format_version": 1}))
    shutil.rmtree(old / schema.TOMBSTONES)
    expected = f"has format 1, and this tally reads format {schema.FORMAT_VERSION}: take a new"
    with pytest.raises(BadRequest, match=expected):
        schema.require_snapshot(old)


def test_a_format_3_snapshot_is_refused_by_the_audit_and_read_by_a_recovery(
    handmade: Path, tmp_path: Path
) -> None:
    """A metadata recovery starts from an older snapshot, by nature taken before format 4."""
    old = tmp_path / "old"
    shutil.copytree(handmade, old)
    (old / schema.SNAPSHOT_JSON).write_text(json.dumps({"created_ms": NOW, "format_version": 3}))
    shutil.rmtree(old / schema.UNREADABLE)
    with pytest.raises(BadRequest, match="has format 3, and this tally reads format 4: take"):
        schema.require_snapshot(old)
    schema.require_snapshot(old, formats=(3, 4))
    shutil.rmtree(old / schema.TOMBSTONES)
    with pytest.raises(BadRequest, match="no tombstones in it"):
        schema.require_snapshot(old, formats=(3, 4))


def test_a_tombstone_row_with_a_field_missing_makes_no_tombstone() -> None:
    """Another tool's snapshot may leave a column null; the stream's JSON then lacks it."""
    row = tombstone_row(TOMBSTONES[0])
    assert tombstone_of(row).tombstoned_ms == TOMBSTONES[0].tombstoned_ms
    del row["tombstoned_ms"]
    with pytest.raises(BadRequest, match=r"the tombstone has no reason, tombstoned_ms$"):
        tombstone_of(row | {"reason": None})


def test_bad_arguments_are_refused(spark: SparkSession, handmade: Path, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="grace period -1 ms is negative"):
        run_audit(spark, handmade, tmp_path, grace_period_ms=-1, min_racks=2)
    with pytest.raises(Exception, match="min racks must be at least 1"):
        run_audit(spark, handmade, tmp_path, grace_period_ms=0, min_racks=0)


# -- synthetic snapshots --------------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synthetic") / "snapshot"
    synthesize(out, ledgers=4000, bookies=20, racks=3, faults="default", seed=3)
    return out


def test_a_synthetic_snapshot_is_found_exactly_as_injected(
    spark: SparkSession, synthetic: Path, tmp_path: Path
) -> None:
    truth = json.loads((synthetic / schema.TRUTH_JSON).read_text())
    summary = run_audit(
        spark, synthetic, tmp_path, grace_period_ms=truth["grace_period_ms"], min_racks=2
    )
    found: dict[str, set[str]] = {category.value: set() for category in VIOLATION_CATEGORIES}
    for row in pq.read_table(tmp_path / schema.VIOLATIONS).to_pylist():
        key = (
            row["bookie_id"]
            if row["ledger_id"] is None
            else ledger_key(row["scope"], row["ledger_id"])
        )
        found[row["category"]].add(key)
    over = Category.OVER_REPLICATED.value
    assert found == {name: set(keys) for name, keys in truth["categories"].items()}
    for key in UNREPORTED:  # marked within the grace period, DELETED, tombstoned not stuck
        assert truth[key], key
        assert not set(truth[key]) & set().union(*found.values()), key
    assert summary["categories"] == {name: len(keys) for name, keys in truth["categories"].items()}
    assert found["potentially_faulty"], "the snapshot should exercise silent bookies"
    extra = pq.read_table(tmp_path / schema.OVER_REPLICATED).to_pylist()
    assert {ledger_key(r["scope"], r["ledger_id"]) for r in extra} == set(truth[over])
    assert summary["over_replication"]["ledgers"] == len(truth[over])
    assert summary["over_replication"]["entries"] == sum(r["entries"] for r in extra)
    assert summary["over_replication"]["bytes"] == sum(r["bytes"] for r in extra) > 0

    assert summary["params"]["deletion_stuck_after"] == truth["deletion_stuck_after"]

    # The batch path and the per-ledger checks agree on every ledger, word for word.
    assert _ledger_rows(tmp_path) == _one_by_one(
        synthetic, truth["now_ms"], truth["grace_period_ms"], truth["deletion_stuck_after"]
    )


def _ledger_rows(out: Path) -> list[tuple[Any, ...]]:
    """The ledger findings of a run, violations and over-replication, as `_one_by_one`'s."""
    violations = [
        (r["scope"], r["ledger_id"], r["category"], r["segment_index"], r["bookie_id"],
         r["missing_count"], r["detail"], None)
        for r in pq.read_table(out / schema.VIOLATIONS).to_pylist()
        if r["category"] not in ("orphan_data", "unresponsive_registered_bookie",
                                 "invalid_metadata")
    ]  # fmt: skip
    extra = [
        (r["scope"], r["ledger_id"], Category.OVER_REPLICATED.value, r["segment_index"],
         r["bookie_id"], r["entries"], r["detail"], r["bytes"])
        for r in pq.read_table(out / schema.OVER_REPLICATED).to_pylist()
    ]  # fmt: skip
    return sorted(violations + extra)


def _one_by_one(
    snapshot: Path, now_ms: int, grace_period_ms: int, stuck_after: int
) -> list[tuple[Any, ...]]:
    """`audit_ledger` on each closed ledger of the snapshot and `deletion_stuck` on each
    tombstoned one, built with plain Python."""
    bookies = pq.read_table(snapshot / schema.BOOKIES).to_pylist()
    racks = {b["bookie_id"]: b["rack"] for b in bookies}
    responded = {b["bookie_id"] for b in bookies if b["responded"]}
    segments: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in pq.read_table(snapshot / schema.SEGMENTS).to_pylist():
        segments.setdefault((row["scope"], row["ledger_id"]), []).append(row)
    held: dict[tuple[int, int], dict[str, EntryAvailability]] = {}
    for row in pq.read_table(snapshot / schema.AVAILABILITY).to_pylist():
        if row["bookie_id"] in responded:
            report = EntryAvailability.from_bytes(row["availability"])
            held.setdefault((row["scope"], row["ledger_id"]), {})[row["bookie_id"]] = report
    rows = []
    for ledger in pq.read_table(snapshot / schema.LEDGERS).to_pylist():
        if ledger["state"] != "CLOSED" or ledger["last_entry_id"] < 0:
            continue
        key = (ledger["scope"], ledger["ledger_id"])
        try:
            metadata = metadata_of(ledger, segments[key])
        except BadRequest:
            continue  # invalid_metadata: found as injected, checked by key

        availability = {b: EntryAvailability.empty() for b in metadata.bookies() & responded}
        availability |= held.get(key, {})
        for v in audit_ledger(
            metadata,
            availability,
            racks=racks,
            min_racks=2,
            underreplicated_since_ms=ledger["underreplicated_since_ms"],
            now_ms=now_ms,
            grace_period_ms=grace_period_ms,
        ):
            rows.append(
                (*key, v.category.value, v.segment_index, v.bookie_id, v.missing_count, v.detail,
                 v.byte_count)
            )  # fmt: skip
    for row in pq.read_table(snapshot / schema.TOMBSTONES).to_pylist():
        key = (row["scope"], row["ledger_id"])
        tombstone = Tombstone(
            Deletion(row["deleted_ms"], row["reason"], row["violations"], row["check_detail"]),
            row["tombstoned_ms"],
            row["last_entry_id"],
            row["length"],
            dict(zip(row["bookies"], row["acknowledged_ms"], strict=True)),
        )
        for v in deletion_stuck(
            tombstone, held.get(key, {}), now_ms=now_ms, stuck_after=stuck_after
        ):
            rows.append(
                (*key, v.category.value, None, v.bookie_id, v.missing_count, v.detail, None)
            )
    return sorted(rows)


# -- the command line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [("1h", HOUR), ("30m", 1_800_000), ("90s", 90_000), ("250ms", 250), ("1h30m", 5_400_000),
     ("2d", 172_800_000), ("0", 0)],
)  # fmt: skip
def test_durations_parse_into_seconds(text: str, ms: int) -> None:
    assert parse_duration(text) * 1000 == pytest.approx(ms)


@pytest.mark.parametrize("text", ["", "1", "h", "1x", "-1h", "1.5h", "1h 2"])
def test_durations_without_a_unit_are_refused(text: str) -> None:
    with pytest.raises(typer.BadParameter, match="is not a duration"):
        parse_duration(text)


def test_the_command_line_runs_the_audit_end_to_end(
    spark: SparkSession, handmade: Path, tmp_path: Path
) -> None:
    done = CliRunner().invoke(
        app,
        ["run", "--snapshot", str(handmade), "--out", str(tmp_path), "--grace-period", "1h",
         "--min-racks", "2"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "12 ledgers checked" in done.output
    assert f"report: {tmp_path / schema.REPORT_HTML}" in done.output
    summary = json.loads((tmp_path / schema.SUMMARY_JSON).read_text())
    assert summary["categories"]["orphan_data"] == 2
    assert SparkSession.getActiveSession() is spark, "the test's session is left running"


def test_the_command_line_refuses_a_bad_duration(handmade: Path, tmp_path: Path) -> None:
    done = CliRunner().invoke(
        app, ["run", "--snapshot", str(handmade), "--out", str(tmp_path), "--grace-period", "1"]
    )
    assert done.exit_code != 0
    assert "is not a duration" in done.output


def test_a_spark_failure_ends_the_command_in_one_line(
    spark: SparkSession, handmade: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "snapshot"
    shutil.copytree(handmade, broken)
    parts = list((broken / schema.LEDGERS).rglob("*.parquet"))
    assert parts
    for part in parts:
        part.write_bytes(b"not a parquet file")
    done = CliRunner().invoke(
        tally_app, ["audit", "run", "--snapshot", str(broken), "--out", str(tmp_path / "out")]
    )
    assert done.exit_code == 1
    assert "Traceback" not in done.output
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith("error: Spark failed: "), line
    assert "tally --debug" in line
