"""The audit's one Python pass, the `mapInArrow` function: a partition's sorted rows in,
each ledger judged once, findings out. It runs in Spark's Python workers and needs nothing
of Spark: healthy ledgers are recognised for a whole batch at once (`clean_ledgers`), and
only the others are decoded and given to `audit_ledger`, the check the online auditor runs.

A ledger with a tombstone is deleted: whatever other rows it has, only the data its bookies
still hold is judged, by `deletion_stuck`. A ledger with neither metadata nor tombstone is
orphan data; a DELETED one, which keeps its data on purpose, is judged on nothing; one whose
metadata or tombstone the store holds but cannot decode is invalid_metadata, its data
neither judged nor orphan."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tally.audit import schema
from tally.audit.checks.ledger_rows import (
    decoded,
    invalid_metadata,
    ledger_name,
    orphan,
    standin_metadata,
    tombstone_of,
)
from tally.audit.ledger_batches import ledger_starts, whole_ledgers
from tally.core.availability import EntryAvailability
from tally.core.clean_ledgers import LedgerColumns, clean_ledgers
from tally.core.errors import BadRequest, MalformedData
from tally.core.ledger_audit import (
    Violation,
    audit_ledger,
    deletion_stuck,
    potentially_faulty,
)
from tally.core.ledger_metadata import Segment
from tally.core.placement import DEFAULT_RACK, racks_in_cluster

PART_UNREADABLE, PART_TOMBSTONE, PART_LEDGER, PART_AVAILABILITY = -3, -2, -1, 2**31 - 1
"""`part` of an unreadable record's row, a tombstone row, a ledger row and an availability
row; a segment row's is its index. An unreadable record comes first: whatever else the
ledger has, its metadata cannot be read whole. A ledger's tombstone row comes next, so that
it wins over a ledger row of the same ledger (one tombstoned while the snapshot walked the
store)."""

FINDINGS_SCHEMA = schema.VIOLATIONS_SCHEMA.append(pa.field("byte_count", pa.int64()))
"""What the pass yields: violation rows and over_replicated rows, split when written."""


@dataclass(frozen=True)
class BookiesView:
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
    def of(cls, bookies: pa.Table) -> BookiesView:
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


class LedgerAuditor:
    """The `mapInArrow` function: sorted combined rows in, violation rows out."""

    def __init__(
        self,
        cluster: BookiesView,
        *,
        grace_period_ms: int,
        min_racks: int,
        now_ms: int,
        stuck_after: int,
    ) -> None:
        self.cluster = cluster
        self.grace_period_ms = grace_period_ms
        self.min_racks = min_racks
        self.now_ms = now_ms
        self.stuck_after = stuck_after
        """The cluster's deletion_stuck_after, in seconds."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for ledgers in whole_ledgers(batches):
            yield self.judge(ledgers)

    def judge(self, table: pa.Table) -> pa.RecordBatch:
        """Violation rows of the whole ledgers in `table` (sorted combined rows)."""
        table = table.combine_chunks()
        starts = ledger_starts(table)
        ledger_of_row = np.repeat(np.arange(len(starts) - 1), np.diff(starts))
        first_rows = starts[:-1]
        part = table.column("part").to_numpy()
        known = part[first_rows] == PART_LEDGER
        tombstoned = part[first_rows] == PART_TOMBSTONE
        unreadable = part[first_rows] == PART_UNREADABLE
        held = part[starts[1:] - 1] == PART_AVAILABILITY  # availability rows come last
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
        closer = (audited & ~clean) | (~known & ~tombstoned) | (tombstoned & held) | silent
        rows = np.flatnonzero(closer[ledger_of_row])
        found = _Rows()
        if rows.size:
            picked = table.take(rows)
            values = {name: picked.column(name).to_pylist() for name in picked.column_names}
            bounds = itertools.pairwise(ledger_starts(picked).tolist())
            for ledger, (begin, end) in zip(np.flatnonzero(closer).tolist(), bounds, strict=True):
                if unreadable[ledger]:
                    self._unreadable(found, values, begin)
                elif silent[ledger]:
                    self._silent(found, values, begin, end)
                elif known[ledger]:
                    self._ledger(found, values, begin, end)
                elif tombstoned[ledger]:
                    self._tombstoned(found, values, begin, end)
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
        name = ledger_name(scope, ledger_id)
        for row in range(begin, end):
            bookie = values["bookie_id"][row]
            if values["part"][row] != PART_AVAILABILITY or bookie not in self.cluster.responded:
                continue
            try:
                held = len(EntryAvailability.from_bytes(values["availability"][row]))
            except MalformedData as exc:
                found.add(scope, ledger_id, orphan(bookie, None, f"data of {name} ({exc})"))
                continue
            found.add(scope, ledger_id, orphan(bookie, held, f"{held} entries of {name}"))

    def _unreadable(self, found: _Rows, values: Mapping[str, list[Any]], begin: int) -> None:
        """A ledger whose record the store cannot decode: one finding, and its data is not
        called orphan (its metadata is there, unread)."""
        scope, ledger_id = values["scope"][begin], values["ledger_id"][begin]
        record = json.loads(values["record"][begin])
        what, path, why = record["record"], record["path"], record["error"]
        error = BadRequest(f"the store's {what} at {path} does not decode: {why}")
        found.add(scope, ledger_id, invalid_metadata(scope, ledger_id, error, what))

    def _tombstoned(
        self, found: _Rows, values: Mapping[str, list[Any]], begin: int, end: int
    ) -> None:
        """A tombstoned ledger's data still on bookies that responded: deletion_stuck rows once
        the tombstone is old enough. A report that does not decode tells nothing."""
        scope, ledger_id = values["scope"][begin], values["ledger_id"][begin]
        try:
            tombstone = tombstone_of(json.loads(values["record"][begin]))
        except BadRequest as exc:
            found.add(scope, ledger_id, invalid_metadata(scope, ledger_id, exc, "tombstone"))
            return
        held: dict[str, EntryAvailability] = {}
        for row in range(begin + 1, end):
            bookie = values["bookie_id"][row]
            if values["part"][row] != PART_AVAILABILITY or bookie not in self.cluster.responded:
                continue
            try:
                report = EntryAvailability.from_bytes(values["availability"][row])
            except MalformedData:
                continue
            held[bookie] = held.get(bookie, EntryAvailability.empty()).union(report)
        for violation in deletion_stuck(
            tombstone, held, now_ms=self.now_ms, stuck_after=self.stuck_after
        ):
            found.add(scope, ledger_id, violation)

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
            metadata = standin_metadata(
                values["ensemble_size"][begin],
                values["write_quorum"][begin],
                values["ack_quorum"][begin],
                values["last_entry_id"][begin],
                values["length"][begin],
                segments,
            )
            availability, undecodable = decoded(metadata, reports, self.cluster.responded)
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
            found.add(scope, ledger_id, invalid_metadata(scope, ledger_id, exc))
            return
        for violation in violations:
            why = undecodable.get(violation.bookie_id or "")
            if why is not None:
                violation = dataclasses.replace(violation, detail=f"{violation.detail} ({why})")
            found.add(scope, ledger_id, violation)


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
        self.columns: dict[str, list[Any]] = {name: [] for name in FINDINGS_SCHEMA.names}

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
        return pa.RecordBatch.from_pydict(self.columns, schema=FINDINGS_SCHEMA)
