"""Measure the audit pipeline: ledgers per second on Spark, and the cost of one ledger's check.

Promises of the audit issue, each beside its physical reference from the same run:

- `run_audit` over synthetic snapshots (about three segments per ledger, a healthy majority,
  every fault kind): wall time and ledgers/s, beside Spark's own floor, the same shuffled and
  sorted row stream passed through a `mapInArrow` that only counts rows; and beside the
  online replicas check on the same data, `audit_ledger` one ledger at a time on one core
  (the online auditor's arithmetic without its network round trips);
- the per-ledger cost of `audit_ledger`, and of the batch path (`clean_ledgers`, per ledger
  of a batch), for healthy ledgers of 10 to 10^7 entries: flat, since both work on sequence
  groups, never on entries.

    python bench/bench_audit.py [--ledgers 100000,1000000] [--master local[2],standalone]
        [--dir DIR]

`--master standalone` starts a local standalone cluster (a master, two workers of one core)
and measures the same on it, with executors that do not have tally installed.

The goal of the issue is 10M ledgers end to end in under 10 minutes on a 2-core machine:
`--ledgers 10000000` measures it (about 1.3 GB of snapshot under DIR, and ~15 minutes with
the floor). `main()` returns the figures as a dict for other tools.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tally.audit import schema
from tally.audit.checks import combined_stream, run_audit, spark_session
from tally.audit.synth import GRACE_PERIOD_MS, MIN_RACKS, NOW_MS, synthesize
from tally.core.availability import EntryAvailability
from tally.core.clean_ledgers import LedgerColumns, clean_ledgers
from tally.core.digest import DigestType
from tally.core.ledger_audit import audit_ledger
from tally.core.ledger_metadata import LedgerMetadata, LedgerState, Segment
from tally.core.schedule import expected_entries

BOOKIES, RACKS = 60, 3
ONLINE_SAMPLE = 20_000
"""Ledgers the one-at-a-time check is timed on (its rate does not depend on the total)."""
ENTRY_SIZES = (10, 1_000, 100_000, 10_000_000)
ENSEMBLE_SIZE, WRITE_QUORUM = 3, 2
BATCH = 10_000


def best_of(repeats: int, action: Callable[[], object]) -> float:
    """The fastest of `repeats` runs, in seconds: the least disturbed by the machine."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


# -- Spark ------------------------------------------------------------------------------------


def floor_seconds(spark: SparkSession, snapshot: Path) -> tuple[float, int]:
    """Spark's floor: the audit's row stream, shuffled and sorted, through a `mapInArrow`
    that only counts rows. Returns (seconds, rows)."""

    def count(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        rows = sum(batch.num_rows for batch in batches)
        yield pa.RecordBatch.from_pydict({"rows": [rows]})

    started = time.perf_counter()
    total = (
        combined_stream(spark, snapshot)
        .mapInArrow(count, "rows long")
        .agg(F.sum("rows"))
        .collect()[0][0]
    )
    return time.perf_counter() - started, int(total)


def audit_seconds(spark: SparkSession, snapshot: Path, out: Path) -> float:
    """Wall time of `run_audit`, whose counts must be those the snapshot's truth.json lists."""
    started = time.perf_counter()
    summary = run_audit(
        spark, snapshot, out, grace_period_ms=GRACE_PERIOD_MS, min_racks=MIN_RACKS, now_ms=NOW_MS
    )
    seconds = time.perf_counter() - started
    truth = json.loads((snapshot / schema.TRUTH_JSON).read_text())["categories"]
    if summary["categories"] != {name: len(keys) for name, keys in truth.items()}:
        raise AssertionError(f"{snapshot}: found {summary['categories']}, injected {truth}")
    return seconds


def online_rate(snapshot: Path, sample: int = ONLINE_SAMPLE) -> float:
    """Ledgers/s of `audit_ledger` called one ledger at a time on the first closed ledgers of
    the snapshot, their availability decoded as an online auditor would."""
    bookies = pq.read_table(snapshot / schema.BOOKIES).to_pylist()
    racks = {b["bookie_id"]: b["rack"] for b in bookies}
    responded = {b["bookie_id"] for b in bookies if b["responded"]}
    ledgers = [
        row
        for row in pq.read_table(snapshot / schema.LEDGERS).slice(0, sample).to_pylist()
        if row["state"] == "CLOSED" and row["last_entry_id"] >= 0
    ]
    wanted = {(row["scope"], row["ledger_id"]) for row in ledgers}
    segments: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in pq.read_table(snapshot / schema.SEGMENTS).to_pylist():
        if (row["scope"], row["ledger_id"]) in wanted:
            segments.setdefault((row["scope"], row["ledger_id"]), []).append(row)
    reports: dict[tuple[int, int], dict[str, bytes]] = {}
    for row in pq.read_table(snapshot / schema.AVAILABILITY).to_pylist():
        key = (row["scope"], row["ledger_id"])
        if key in wanted and row["bookie_id"] in responded:
            reports.setdefault(key, {})[row["bookie_id"]] = row["availability"]
    started = time.perf_counter()
    for row in ledgers:
        key = (row["scope"], row["ledger_id"])
        parts = sorted(segments[key], key=lambda part: part["segment_index"])
        metadata = _metadata(
            row["ensemble_size"],
            row["write_quorum"],
            row["ack_quorum"],
            row["last_entry_id"],
            [(part["first_entry_id"], tuple(part["ensemble"])) for part in parts],
        )
        availability = {b: EntryAvailability.empty() for b in metadata.bookies() & responded}
        for bookie, report in reports.get(key, {}).items():
            availability[bookie] = EntryAvailability.from_bytes(report)
        audit_ledger(
            metadata,
            availability,
            racks=racks,
            min_racks=MIN_RACKS,
            underreplicated_since_ms=row["underreplicated_since_ms"],
            now_ms=NOW_MS,
            grace_period_ms=GRACE_PERIOD_MS,
            cluster_racks=RACKS,
        )
    return len(ledgers) / (time.perf_counter() - started)


# -- one ledger ------------------------------------------------------------------------------


def _metadata(
    e: int, wq: int, aq: int, last: int, segments: Sequence[tuple[int, tuple[str, ...]]]
) -> LedgerMetadata:
    return LedgerMetadata(
        state=LedgerState.CLOSED,
        ensemble_size=e,
        write_quorum=wq,
        ack_quorum=aq,
        segments=tuple(Segment(first, ensemble) for first, ensemble in segments),
        digest_type=DigestType.CRC32C,
        master_key=bytes(32),
        ctime_ms=0,
        creator_token=b"",
        last_entry_id=last,
        length=0,
    )


def _healthy(entries: int) -> tuple[LedgerMetadata, dict[str, EntryAvailability]]:
    """Three segments; each ensemble change replaces the bookie at position 0."""
    cuts = [0, entries // 3, 2 * entries // 3]
    ensembles = [(f"b{3 * i}", "b1", "b2") for i in range(3)]
    segments = [(first, ensemble) for first, ensemble in zip(cuts, ensembles, strict=True)]
    metadata = _metadata(ENSEMBLE_SIZE, WRITE_QUORUM, WRITE_QUORUM, entries - 1, segments)
    held: dict[str, EntryAvailability] = {}
    for segment, (first, last) in zip(metadata.segments, metadata.segment_bounds(), strict=True):
        assert last is not None
        for position, bookie in enumerate(segment.ensemble):
            part = expected_entries(first, last, ENSEMBLE_SIZE, WRITE_QUORUM, position)
            held[bookie] = held.get(bookie, EntryAvailability.empty()).union(part)
    return metadata, held


def per_ledger_seconds(entries: int) -> tuple[float, float]:
    """(audit_ledger s, clean_ledgers s per ledger of a batch of BATCH) for a healthy
    ledger of `entries` entries."""
    metadata, held = _healthy(entries)
    racks = {f"b{i}": f"/r{i % 3}" for i in range(9)}

    def one() -> None:
        found = audit_ledger(
            metadata,
            held,
            racks=racks,
            min_racks=MIN_RACKS,
            underreplicated_since_ms=None,
            now_ms=0,
            grace_period_ms=0,
            cluster_racks=3,
        )
        if found:
            raise AssertionError(f"a healthy ledger of {entries} entries has violations: {found}")

    single = best_of(2000 if entries < 10**6 else 300, one)
    columns = _batch(metadata, held, racks)

    def batch() -> None:
        if not clean_ledgers(columns, min_racks=MIN_RACKS, cluster_racks=3).all():
            raise AssertionError(f"a healthy ledger of {entries} entries is not found clean")

    return single, best_of(20, batch) / BATCH


def _batch(
    metadata: LedgerMetadata, held: dict[str, EntryAvailability], racks: dict[str, str]
) -> LedgerColumns:
    """BATCH copies of one ledger as the Spark job hands them to `clean_ledgers`."""
    names = sorted(racks)
    code = {name: i for i, name in enumerate(names)}
    firsts = [segment.first_entry_id for segment in metadata.segments]
    members = [code[b] for segment in metadata.segments for b in segment.ensemble]
    reports = [(code[b], report.to_bytes()) for b, report in sorted(held.items())]
    blob = np.frombuffer(b"".join(report for _, report in reports), dtype=np.uint8)
    sizes = np.array([len(report) for _, report in reports], dtype=np.int64)
    per_ledger = len(metadata.segments)

    def repeat(values: list[int], width: int) -> np.ndarray:
        return np.tile(np.array(values, dtype=np.int64), BATCH).reshape(-1)[: BATCH * width]

    return LedgerColumns(
        ensemble_size=np.full(BATCH, metadata.ensemble_size, dtype=np.int64),
        write_quorum=np.full(BATCH, metadata.write_quorum, dtype=np.int64),
        ack_quorum=np.full(BATCH, metadata.ack_quorum, dtype=np.int64),
        last_entry_id=np.full(BATCH, metadata.last_entry_id, dtype=np.int64),
        segment_ledger=np.repeat(np.arange(BATCH, dtype=np.int64), per_ledger),
        segment_first=repeat(firsts, per_ledger),
        ensemble_offsets=np.arange(BATCH * per_ledger + 1, dtype=np.int64) * metadata.ensemble_size,
        ensemble_bookies=repeat(members, len(members)),
        report_ledger=np.repeat(np.arange(BATCH, dtype=np.int64), len(reports)),
        report_bookie=repeat([b for b, _ in reports], len(reports)),
        report_offsets=np.concatenate(([0], np.cumsum(np.tile(sizes, BATCH)))),
        report_data=np.tile(blob, BATCH),
        responded=np.ones(len(names) + 1, dtype=np.bool_),
        valid_id=np.ones(len(names) + 1, dtype=np.bool_),
        rack=np.array([int(racks[name][2:]) for name in names] + [0], dtype=np.int64),
    )


# -- the run ---------------------------------------------------------------------------------


STANDALONE = "standalone"
"""The master name that starts a local standalone cluster: a master and two workers of one
core, started from PySpark's jars, whose executors (2 GiB each, as local[2]'s 4 GiB driver
holds two cores) run `python3` of an image without tally (tests/support/spark_standalone)."""


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledgers", default="100000,1000000", help="comma-separated sizes")
    parser.add_argument(
        "--master",
        default="local[2]",
        help=f"comma-separated masters, each measured in turn; {STANDALONE!r} starts one",
    )
    parser.add_argument("--dir", type=Path, help="where snapshots go (default: a temp dir)")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.ledgers.split(",")]
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-audit-"))
    figures: dict[str, float] = {}
    try:
        for master in args.master.split(","):
            with _session(master, root) as spark:
                figures |= _measure(spark, master, root, sizes)
        rate = online_rate(_snapshot(root, sizes[0]))
        figures["online_ledgers_per_s"] = rate
        print(f"online replicas check (audit_ledger one ledger at a time, 1 core): {rate:,.0f}/s")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"one healthy ledger (E={ENSEMBLE_SIZE} WQ={WRITE_QUORUM}, 3 segments), best of many")
    print("  entries        audit_ledger   clean_ledgers (per ledger of a batch)")
    for entries in ENTRY_SIZES:
        single, batched = per_ledger_seconds(entries)
        figures[f"audit_ledger_{entries}_us"] = single * 1e6
        figures[f"clean_ledgers_{entries}_us"] = batched * 1e6
        print(f"  {entries:>10,}  {single * 1e6:10.1f} us  {batched * 1e6:10.2f} us")
    small, large = ENTRY_SIZES[0], ENTRY_SIZES[-1]
    ratio = figures[f"audit_ledger_{large}_us"] / figures[f"audit_ledger_{small}_us"]
    figures["audit_ledger_ratio"] = ratio
    print(f"  ratio {large:,} / {small} entries: {ratio:.2f} (flat is about 1)")
    return figures


@contextlib.contextmanager
def _session(master: str, root: Path) -> Iterator[SparkSession]:
    """A Spark session on `master` (a local standalone cluster for STANDALONE), stopped
    with what it started."""
    if master != STANDALONE:
        spark = spark_session(master)
        try:
            yield spark
        finally:
            spark.stop()
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' launcher
    from tests.support.spark_standalone import executor_python, standalone_cluster

    where = root / "standalone"
    shutil.rmtree(where, ignore_errors=True)
    python_bin = executor_python(where / "executor-image")
    with standalone_cluster(where / "spark", workers=2, memory="3g", python_bin=python_bin) as c:
        spark = spark_session(c.master, conf={"spark.executor.memory": "2g"})
        try:
            yield spark
        finally:
            spark.stop()


def _measure(spark: SparkSession, master: str, root: Path, sizes: list[int]) -> dict[str, float]:
    """The audit and Spark's floor for each size, on `master`; the figures by name."""
    figures: dict[str, float] = {}
    warm = _snapshot(root, 20_000)
    audit_seconds(spark, warm, root / "out-warm")
    floor_seconds(spark, warm)
    shutil.rmtree(root / "out-warm", ignore_errors=True)
    print(f"run_audit on {master} (synthetic, {BOOKIES} bookies, {RACKS} racks)")
    print("  ledgers      audit s  ledgers/s   floor s  ledgers/s  audit/floor  rows")
    for size in sizes:
        snapshot = _snapshot(root, size)
        floor, rows = floor_seconds(spark, snapshot)
        seconds = audit_seconds(spark, snapshot, root / f"out-{size}")
        shutil.rmtree(root / f"out-{size}", ignore_errors=True)
        figures[f"{master}_audit_{size}_s"] = seconds
        figures[f"{master}_audit_{size}_ledgers_per_s"] = size / seconds
        figures[f"{master}_floor_{size}_s"] = floor
        print(
            f"  {size:>10,}  {seconds:7.1f}  {size / seconds:9,.0f}  {floor:8.1f}"
            f"  {size / floor:9,.0f}  {seconds / floor:11.2f}  {rows:,}"
        )
    if sizes[-1] < 10_000_000:
        projected = 10_000_000 / figures[f"{master}_audit_{sizes[-1]}_ledgers_per_s"]
        print(f"10M ledgers at the {sizes[-1]:,} rate: {projected / 60:.1f} min (goal < 10)")
    return figures


def _snapshot(root: Path, ledgers: int) -> Path:
    """A synthetic snapshot of `ledgers` ledgers with the default faults, made once."""
    out = root / f"snapshot-{ledgers}"
    if not (out / schema.SNAPSHOT_JSON).exists():
        synthesize(out, ledgers=ledgers, bookies=BOOKIES, racks=RACKS, faults="default", seed=1)
    return out


if __name__ == "__main__":
    main()
