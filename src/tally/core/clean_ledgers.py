"""Healthy ledgers recognised a batch at a time, with array arithmetic.

A cluster audit meets millions of ledgers, nearly all healthy, and building metadata and
availability objects for each is costly. `clean_ledgers` proves a
ledger clean with array arithmetic over a whole batch instead, straight from the encoded
reports: each report's groups must be valid, lie inside one stretch of entries that the
bookie holds at one ensemble position, follow that position's round-robin pattern, and add
up to the stretch's closed-form count. A report that holds a subset of what is owed with
as many entries holds exactly what is owed. Whatever the arrays cannot prove (entries past
the end, groups that cross a change of position, a period that is not a multiple of E,
metadata that is not valid) is left to `tally.core.ledger_audit.audit_ledger`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tally.core.availability import GROUP_SIZE, HEADER_SIZE, MAX_ENTRY_ID, VERSION, Int64Array
from tally.core.errors import BadRequest
from tally.core.ledger_metadata import MAX_ENSEMBLE_SIZE

BoolArray = npt.NDArray[np.bool_]

_GROUP_DTYPE = np.dtype([("first", ">i8"), ("last", ">i8"), ("size", ">i4"), ("period", ">i4")])
_RUNS_CHECKED = 8
_LARGEST_END = 1 << 62
"""Ledgers ending later are left to `audit_ledger`, so that no count overflows an int64."""


@dataclass(frozen=True, slots=True)
class LedgerColumns:
    """A batch of closed, non-empty ledgers as columns, bookies as integer codes.

    Segments of a ledger are consecutive and in order; `ensemble_offsets` (one more than the
    segments, from 0) cut `ensemble_bookies` into their ensembles. The reports are the
    encoded availabilities of bookies that responded, and only of those (a responding bookie
    with no report holds nothing), cut by `report_offsets` (from 0) out of `report_data`.
    Per bookie code: `responded`, `valid_id` (a bookie id metadata accepts) and `rack` (a
    rack code).
    """

    ensemble_size: Int64Array
    write_quorum: Int64Array
    ack_quorum: Int64Array
    last_entry_id: Int64Array
    segment_ledger: Int64Array
    segment_first: Int64Array
    ensemble_offsets: Int64Array
    ensemble_bookies: Int64Array
    report_ledger: Int64Array
    report_bookie: Int64Array
    report_offsets: Int64Array
    report_data: npt.NDArray[np.uint8]
    responded: BoolArray
    valid_id: BoolArray
    rack: Int64Array


def clean_ledgers(columns: LedgerColumns, *, min_racks: int, cluster_racks: int) -> BoolArray:
    """Per ledger: True only if `audit_ledger` (not marked under-replicated, with the same
    min racks and cluster racks) finds nothing but its bookies that did not respond, which
    `potentially_faulty` then reports as it would. False means "look closer"."""
    if min_racks < 1 or cluster_racks < 1:
        raise BadRequest(f"min racks {min_racks} and cluster racks {cluster_racks} must be >= 1")
    c = columns
    ok = (
        (c.ensemble_size >= c.write_quorum)
        & (c.write_quorum >= c.ack_quorum)
        & (c.ack_quorum >= 1)
        & (c.ensemble_size <= MAX_ENSEMBLE_SIZE)
        & (c.last_entry_id >= 0)
        & (c.last_entry_id < _LARGEST_END)
    )
    segments = _Segments.of(c, ok)
    stretches = _Stretches.of(c, segments, ok)
    _check_reports(c, stretches, ok)
    _check_placement(c, segments, ok, cluster_racks)
    return ok


@dataclass(frozen=True, slots=True)
class _Segments:
    first: Int64Array
    last: Int64Array
    member_segment: Int64Array
    """Per member (a bookie at a position of a segment), its segment."""
    position: Int64Array

    @classmethod
    def of(cls, c: LedgerColumns, ok: BoolArray) -> _Segments:
        """Segment bounds; clears `ok` for ledgers whose segments make no valid metadata."""
        ledger, first = c.segment_ledger, c.segment_first
        count = first.size
        after = np.zeros(count, dtype=np.bool_)
        after[:-1] = ledger[1:] == ledger[:-1]
        before = np.zeros(count, dtype=np.bool_)
        before[1:] = after[:-1]
        following = np.empty(count, dtype=np.int64)
        following[:-1] = first[1:]
        following[-1:] = 0
        last = np.where(after, following - 1, c.last_entry_id[ledger])
        preceding = np.empty(count, dtype=np.int64)
        preceding[1:] = first[:-1]
        preceding[:1] = 0
        sizes = np.diff(c.ensemble_offsets)
        wrong = (
            (sizes != c.ensemble_size[ledger])
            | np.where(before, first <= preceding, first != 0)
            | (~after & (first > c.last_entry_id[ledger] + 1))
        )
        has_segments = np.zeros(ok.size, dtype=np.bool_)
        has_segments[ledger] = True
        ok &= has_segments
        ok[ledger[wrong]] = False
        member_segment = np.repeat(np.arange(count, dtype=np.int64), sizes)
        position = np.arange(member_segment.size, dtype=np.int64) - np.repeat(
            c.ensemble_offsets[:-1], sizes
        )
        bookies, member_ledger = c.ensemble_bookies, ledger[member_segment]
        ok[member_ledger[~c.valid_id[bookies]]] = False
        order = np.lexsort((bookies, member_segment))
        twice = (member_segment[order][1:] == member_segment[order][:-1]) & (
            bookies[order][1:] == bookies[order][:-1]
        )
        ok[member_ledger[order][1:][twice]] = False
        return cls(first, last, member_segment, position)


@dataclass(frozen=True, slots=True)
class _Stretches:
    """Maximal runs of consecutive segments where a responding bookie holds one position, per
    ledger; and per (ledger, bookie) pair, the entries the schedule puts on it."""

    ledger: Int64Array
    bookie: Int64Array
    low: Int64Array
    high: Int64Array
    position: Int64Array
    pair_key: Int64Array
    """Sorted, unique (ledger, bookie) keys of `pair_owed`."""
    pair_owed: Int64Array

    @classmethod
    def of(cls, c: LedgerColumns, s: _Segments, ok: BoolArray) -> _Stretches:
        holding = np.flatnonzero(
            (s.last >= s.first)[s.member_segment]
            & ok[c.segment_ledger[s.member_segment]]
            & c.responded[c.ensemble_bookies]
        )
        segment = s.member_segment[holding]
        ledger, bookie = c.segment_ledger[segment], c.ensemble_bookies[holding]
        low, high, position = s.first[segment], s.last[segment], s.position[holding]
        order = np.lexsort((low, bookie, ledger))
        ledger, bookie, low, high, position = (
            ledger[order],
            bookie[order],
            low[order],
            high[order],
            position[order],
        )
        new_pair = np.ones(ledger.size, dtype=np.bool_)
        new_pair[1:] = (ledger[1:] != ledger[:-1]) | (bookie[1:] != bookie[:-1])
        new = new_pair.copy()
        new[1:] |= (position[1:] != position[:-1]) | (low[1:] != high[:-1] + 1)
        starts = np.flatnonzero(new)
        ends = np.append(starts[1:], ledger.size)[: starts.size] - 1
        ledger, bookie, position = ledger[starts], bookie[starts], position[starts]
        low, high = low[starts], high[ends]
        e, wq = c.ensemble_size[ledger], c.write_quorum[ledger]
        owed = _scheduled_below(high + 1, position, e, wq) - _scheduled_below(low, position, e, wq)
        pair_starts = np.flatnonzero(new_pair[starts])
        pair_owed = np.add.reduceat(owed, pair_starts) if owed.size else np.empty(0, dtype=np.int64)
        pair_key = _pair_key(ledger[pair_starts], bookie[pair_starts], c.responded.size)
        return cls(ledger, bookie, low, high, position, pair_key, pair_owed)


def _pair_key(ledger: Int64Array, bookie: Int64Array, bookies: int) -> Int64Array:
    return ledger * max(bookies, 1) + bookie


def _scheduled_below(
    stop: Int64Array, position: Int64Array, e: Int64Array, wq: Int64Array
) -> Int64Array:
    """Entries below `stop` that the schedule puts on `position`: WQ per cycle of E, plus
    those of the cyclic window [position - WQ + 1, position] below stop mod E."""
    cycles, rest = np.divmod(stop, e)
    low = position - wq + 1
    reached = np.minimum(position + 1, rest)
    partial = np.where(
        low >= 0, np.maximum(0, reached - low), reached + np.maximum(0, rest - (e + low))
    )
    result: Int64Array = cycles * wq + partial
    return result


def _check_reports(c: LedgerColumns, t: _Stretches, ok: BoolArray) -> None:
    """Clear `ok` for ledgers with a report that is not exactly what its bookie is owed, and
    for those where a bookie owed entries has no report."""
    reports = c.report_ledger.size
    starts, lengths = c.report_offsets[:-1], np.diff(c.report_offsets)
    body = lengths - HEADER_SIZE
    sound = (body >= 0) & (body % GROUP_SIZE == 0)
    counts = np.where(sound, body // GROUP_SIZE, 0)
    headed = np.flatnonzero(sound)
    header = c.report_data[starts[headed, None] + np.arange(HEADER_SIZE)]
    version = header[:, 0:4].copy().view(">i4").ravel()
    declared = header[:, 4:8].copy().view(">i4").ravel()
    sound[headed] = (version == VERSION) & (declared == counts[headed]) & ~header[:, 8:].any(1)
    counts = np.where(sound, counts, 0)

    report = np.repeat(np.arange(reports, dtype=np.int64), counts)
    firsts_at = np.cumsum(counts) - counts
    index = np.arange(report.size, dtype=np.int64) - firsts_at[report]
    at = starts[report] + HEADER_SIZE + GROUP_SIZE * index
    groups = c.report_data[at[:, None] + np.arange(GROUP_SIZE)].copy().view(_GROUP_DTYPE).ravel()
    first = groups["first"].astype(np.int64)
    last = groups["last"].astype(np.int64)
    size = groups["size"].astype(np.int64)
    period = groups["period"].astype(np.int64)
    stop = last + size
    previous_stop = np.zeros(report.size, dtype=np.int64)
    previous_stop[1:] = stop[:-1]
    valid = (
        (size >= 1)
        & (first >= np.where(index == 0, 0, previous_stop))
        & (last <= MAX_ENTRY_ID - size + 1)
        & np.where(
            period == 0,
            last == first,
            (last > first) & (period >= size) & ((last - first) % np.maximum(period, 1) == 0),
        )
    )
    entries = ((last - first) // np.maximum(period, 1) + 1) * size

    ledger, bookie = c.report_ledger[report], c.report_bookie[report]
    stretch = _stretch_of(_pair_key(ledger, bookie, c.responded.size), first, t, c)
    placed = np.zeros(report.size, dtype=np.bool_)
    if t.ledger.size:
        which = np.maximum(stretch, 0)
        placed = (
            (stretch >= 0)
            & (t.high[which] >= stop - 1)
            & _on_schedule(
                first,
                last,
                size,
                period,
                t.position[which],
                c.ensemble_size[ledger],
                c.write_quorum[ledger],
            )
        )
    held = np.concatenate(([0], np.cumsum(entries)))
    held_per_report = held[firsts_at + counts] - held[firsts_at]
    right = sound & (np.bincount(report[~(valid & placed)], minlength=reports) == 0)

    keys = _pair_key(c.report_ledger, c.report_bookie, c.responded.size)
    owed = np.zeros(reports, dtype=np.int64)
    if t.pair_key.size:
        slot = np.minimum(np.searchsorted(t.pair_key, keys), t.pair_key.size - 1)
        owed = np.where(t.pair_key[slot] == keys, t.pair_owed[slot], 0)
    right &= held_per_report == owed
    ok[c.report_ledger[~right]] = False

    ordered = np.sort(keys)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    ok[repeated // max(c.responded.size, 1)] = False
    reported = np.isin(t.pair_key, keys)
    ok[(t.pair_key // max(c.responded.size, 1))[(t.pair_owed > 0) & ~reported]] = False


def _on_schedule(
    first: Int64Array,
    last: Int64Array,
    size: Int64Array,
    period: Int64Array,
    position: Int64Array,
    e: Int64Array,
    wq: Int64Array,
) -> BoolArray:
    """Per group: each of its runs lies in one window of WQ entries of `position`'s
    round-robin pattern. With a period that is a multiple of E the runs all sit alike and the
    first one tells; otherwise (a short segment's runs) each is checked, up to
    `_RUNS_CHECKED` of them, and a longer group is not proven."""
    e = np.maximum(e, 1)
    alike = period % e == 0
    runs = np.where(alike, 1, (last - first) // np.maximum(period, 1) + 1)
    # A damaged report's group (last before first: no valid group, rejected apart) counts
    # as one run here, so that the arrays stay whole; it is never on schedule.
    provable = (runs >= 1) & (runs <= _RUNS_CHECKED)
    checked = np.where(provable, runs, 1)
    group = np.repeat(np.arange(first.size, dtype=np.int64), checked)
    index = np.arange(group.size, dtype=np.int64) - np.repeat(np.cumsum(checked) - checked, checked)
    behind = (position[group] - (first[group] + index * period[group])) % e[group]
    fits = (wq[group] >= e[group]) | ((behind < wq[group]) & (size[group] <= behind + 1))
    misfits = np.bincount(group[~fits], minlength=first.size)
    on: BoolArray = provable & (misfits == 0)
    return on


def _stretch_of(keys: Int64Array, first: Int64Array, t: _Stretches, c: LedgerColumns) -> Int64Array:
    """For each group (its pair key and first entry): the stretch of the same pair that
    starts last at or before it, or -1."""
    stretch_keys = _pair_key(t.ledger, t.bookie, c.responded.size)
    count = stretch_keys.size
    merged_keys = np.concatenate((stretch_keys, keys))
    merged_starts = np.concatenate((t.low, first))
    is_group = np.concatenate((np.zeros(count, np.int64), np.ones(keys.size, np.int64)))
    order = np.lexsort((is_group, merged_starts, merged_keys))
    # Stretches are sorted by (pair key, low), so along `order` their indexes only grow and
    # the running maximum is the latest stretch so far.
    latest = np.maximum.accumulate(np.where(order < count, order, -1)) if order.size else order
    stretch = np.full(keys.size, -1, dtype=np.int64)
    groups = order >= count
    stretch[order[groups] - count] = latest[groups]
    matched = stretch >= 0
    stretch[matched] = np.where(
        stretch_keys[stretch[matched]] == keys[matched], stretch[matched], -1
    )
    return stretch


def _check_placement(c: LedgerColumns, s: _Segments, ok: BoolArray, cluster_racks: int) -> None:
    """Clear `ok` for ledgers with a segment holding entries that is not strictly placed:
    `adherence_of_racks`, for a whole batch of ensembles of one shape at a time. Strict asks
    min(WQ, cluster racks) racks of every write set, never fewer than the rule's
    `racks_required`, so min racks cannot change a clean verdict."""
    ledger = c.segment_ledger
    judged = (s.last >= s.first) & ok[ledger]
    e, wq = c.ensemble_size[ledger], c.write_quorum[ledger]
    for size, quorum in set(zip(e[judged].tolist(), wq[judged].tolist(), strict=True)):
        chosen = np.flatnonzero(judged & (e == size) & (wq == quorum))
        racks = c.rack[c.ensemble_bookies[c.ensemble_offsets[chosen, None] + np.arange(size)]]
        fewest = np.full(chosen.size, quorum, dtype=np.int64)
        for start in range(size if quorum < size else 1):
            window = racks[:, [(start + k) % size for k in range(quorum)]]
            distinct = np.ones(chosen.size, dtype=np.int64)
            for k in range(1, quorum):
                distinct += (window[:, k, None] != window[:, :k]).all(axis=1)
            fewest = np.minimum(fewest, distinct)
        need = min(quorum, cluster_racks)
        ok[ledger[chosen[fewest < need]]] = False
