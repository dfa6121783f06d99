"""Infer a ledger's shape (ensemble size, write quorum, segments) from the entries its bookies
hold, to rebuild the metadata of a ledger whose store was lost and which left no copy of it on
its bookies (issue 18's recovery job); and check a copy that does exist against the data.

A bookie at position p of a segment's ensemble holds the segment's entries e with
(p - e) mod E < WQ: runs of WQ entries, E apart. Their period, length and phase show E, WQ
and the bookie's position; where a position's holder changes, a segment ends. But holdings
fit many shapes (any fit E = WQ = the number of bookies, with a segment wherever the holders
change), so each candidate is fitted and the smallest explanation wins: a segment costs its E
bookie ids, a held entry left unexplained (a stray copy left by re-replication) costs one.

A fit grows segments from the last entry down while one ensemble places exactly what its
bookies hold (nothing where a bookie holds nothing, so the position of a bookie that is gone
stays empty): that gives the fewest segments, each starting at the earliest entry the data
allows, which places every held entry as a later start would. Where every bookie's holdings
repeat every E entries, one period says all that the rest of the stretch would, so the walk
jumps over it: a healthy ledger of millions of entries costs a few steps per group.

No I/O and no clock: the recovery job gathers the holdings and writes the metadata. The ack
quorum leaves no trace in the data, so none is inferred.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

from tally.core.availability import MAX_ENTRY_ID, EntryAvailability, SequenceGroup
from tally.core.errors import BadRequest
from tally.core.schedule import check_quorums, expected_entries

WIDEST_ENSEMBLE = 256
"""The largest ensemble size tried beyond the number of bookies holding entries (a period
seen in the data, when bookies are gone): a fit's cost grows with it, and real ensembles
are a handful of bookies."""

_PAST_LAST_ENTRY = MAX_ENTRY_ID + 1
_DESCRIBED_GROUPS = 3


@dataclass(frozen=True, slots=True)
class InferredSegment:
    first_entry_id: int
    ensemble: tuple[str | None, ...]
    """None where no bookie holds the position's entries (its holder is gone)."""


@dataclass(frozen=True, slots=True)
class InferredLedger:
    ensemble_size: int
    write_quorum: int
    segments: tuple[InferredSegment, ...]
    """First entry ids ascending, the first 0."""
    last_entry_seen: int
    """The highest entry id any bookie holds: later entries may have been lost with their
    bookies, so the recovery job decides where the ledger ends."""
    ambiguous: tuple[str, ...]
    """What the data did not determine, for the operator (empty when it determined all)."""


@dataclass(frozen=True, slots=True)
class NotInferable:
    reason: str


def infer_ledger(held: Mapping[str, EntryAvailability]) -> InferredLedger | NotInferable:
    """The shape that explains `held` (bookie id -> the entries it holds of this ledger) with
    the fewest segments and stray copies; NotInferable when entries up to the highest held
    one have no copy at all, since no metadata could make them readable."""
    copies = {
        bookie: _Copies.of(bookie, entries) for bookie, entries in sorted(held.items()) if entries
    }
    if not copies:
        return NotInferable("no bookie holds any entry")
    last = max(copy.entries.groups[-1].stop for copy in copies.values()) - 1
    largest = _largest_group(copies)
    lost, most_holders = _survey(copies, last, largest.sequence_period if largest else 1)
    if lost:
        return NotInferable(f"entries {_describe(lost)} are held by no bookie")
    likeliest = (
        _Shape(largest.sequence_period, largest.sequence_size)
        if largest
        else _Shape(most_holders, most_holders)
    )
    best, *as_good = _cheapest_fits(copies, last, likeliest, most_holders)
    return InferredLedger(
        ensemble_size=best.shape.ensemble_size,
        write_quorum=best.shape.write_quorum,
        segments=_segments(best),
        last_entry_seen=last,
        ambiguous=_notes(best, as_good, last),
    )


def unexplained(
    metadata_segments: Sequence[tuple[int, Sequence[str | None]]],
    ensemble_size: int,
    write_quorum: int,
    last_entry_id: int,
    held: Mapping[str, EntryAvailability],
) -> dict[str, EntryAvailability]:
    """Per bookie, the entries it holds that the metadata does not place on it: stray copies,
    or signs that the metadata is not this data's. Empty when all are where it says."""
    placed: dict[str, list[SequenceGroup]] = {}
    for first, last, ensemble in _segment_bounds(
        metadata_segments, ensemble_size, write_quorum, last_entry_id
    ):
        for position, bookie in enumerate(ensemble):
            if bookie is not None:
                schedule = expected_entries(first, last, ensemble_size, write_quorum, position)
                placed.setdefault(bookie, []).extend(schedule.groups)
    found = {}
    for bookie, entries in held.items():
        extra = entries.difference(EntryAvailability(placed.get(bookie, ())))
        if extra:
            found[bookie] = extra
    return found


def missing(
    metadata_segments: Sequence[tuple[int, Sequence[str | None]]],
    ensemble_size: int,
    write_quorum: int,
    last_entry_id: int,
    held: Mapping[str, EntryAvailability],
) -> EntryAvailability:
    """The entries of 0..last_entry_id with no copy on any bookie the metadata places them on:
    a reader following the metadata cannot find them (empty when the data is complete)."""
    segments = _segment_bounds(metadata_segments, ensemble_size, write_quorum, last_entry_id)
    unplaced = segments[0][0] if segments else last_entry_id + 1
    gaps = list(EntryAvailability.span(0, unplaced - 1).groups)
    copies = {bookie: _Copies.of(bookie, entries) for bookie, entries in held.items()}
    for first, last, ensemble in segments:
        found = EntryAvailability.empty()
        for position, bookie in enumerate(ensemble):
            if bookie in copies:
                schedule = expected_entries(first, last, ensemble_size, write_quorum, position)
                found = found.union(schedule.intersection(copies[bookie].near(first, last)))
        gaps.extend(EntryAvailability.span(first, last).difference(found).groups)
    return EntryAvailability(gaps)


def _segment_bounds(
    metadata_segments: Sequence[tuple[int, Sequence[str | None]]],
    ensemble_size: int,
    write_quorum: int,
    last_entry_id: int,
) -> list[tuple[int, int, Sequence[str | None]]]:
    """(first, last entry, ensemble) of each segment holding entries up to last_entry_id,
    refusing metadata no ledger could have."""
    check_quorums(ensemble_size, write_quorum, 1)
    if last_entry_id < -1:
        raise BadRequest(f"last entry id {last_entry_id} is below -1")
    firsts = [first for first, _ in metadata_segments]
    if any(first < 0 for first in firsts[:1]) or any(a >= b for a, b in pairwise(firsts)):
        raise BadRequest(f"segment first entry ids {firsts} must be >= 0 and strictly increase")
    bounds = []
    ends = [*(first - 1 for first in firsts[1:]), last_entry_id]
    for (first, ensemble), end in zip(metadata_segments, ends, strict=True):
        named = [bookie for bookie in ensemble if bookie is not None]
        if len(ensemble) != ensemble_size or len(set(named)) != len(named):
            raise BadRequest(
                f"segment at entry {first} needs {ensemble_size} distinct bookies, got {ensemble}"
            )
        if first <= min(end, last_entry_id):
            bounds.append((first, min(end, last_entry_id), ensemble))
    return bounds


class _Shape(NamedTuple):
    ensemble_size: int
    write_quorum: int


@dataclass(frozen=True, slots=True)
class _Copies:
    """One bookie's copies of the ledger's entries, with the lookups the walk needs."""

    bookie: str
    entries: EntryAvailability
    group_starts: tuple[int, ...]
    group_kinds: Mapping[tuple[int, int, int], int]
    """How many groups it has of each (period, run length, runs), for `_least_cost`."""

    @classmethod
    def of(cls, bookie: str, entries: EntryAvailability) -> _Copies:
        kinds: dict[tuple[int, int, int], int] = {}
        for group in entries.groups:
            kind = (group.sequence_period, group.sequence_size, group.sequence_count)
            kinds[kind] = kinds.get(kind, 0) + 1
        starts = tuple(group.first_sequence_start for group in entries.groups)
        return cls(bookie, entries, starts, kinds)

    def near(self, first: int, last: int) -> EntryAvailability:
        """The groups that meet [first, last], whole: a cheap slice to intersect with a
        segment's schedule, where the whole holdings would cost a walk over all groups."""
        start = max(0, bisect_right(self.group_starts, first) - 1)
        stop = bisect_right(self.group_starts, last)
        return EntryAvailability(self.entries.groups[start:stop])

    def around(self, entry: int, period: int) -> tuple[bool, int, int]:
        """Whether the bookie holds `entry`, and the stretch [low, high] around it in which
        what it holds repeats every `period` entries: a group of that period or a single run
        as a whole, else one run or one gap."""
        groups = self.entries.groups
        index = bisect_right(self.group_starts, entry) - 1
        low = 0
        if index >= 0:
            first, _, size, step = group = groups[index]
            if entry < group.stop:
                if step in (0, period):
                    return step == 0 or (entry - first) % step < size, first, group.stop - 1
                run = entry - (entry - first) % step
                if entry < run + size:
                    return True, run, run + size - 1
                return False, run + size, run + step - 1
            low = group.stop
        following = index + 1
        high = (
            groups[following].first_sequence_start - 1
            if following < len(groups)
            else _PAST_LAST_ENTRY
        )
        return False, low, high


@dataclass(frozen=True, slots=True)
class _Stray:
    """Copies a segment leaves unexplained, all of which `twin` holds where it is placed."""

    bookie: str
    copies: EntryAvailability
    twin: str


@dataclass(frozen=True, slots=True)
class _Piece:
    """A fitted segment: for each bookie placed in it, the positions (bits) it could take."""

    first: int
    last: int
    fits: Mapping[str, int]
    strays: tuple[_Stray, ...]


@dataclass(frozen=True, slots=True)
class _Fit:
    shape: _Shape
    pieces: tuple[_Piece, ...]

    @property
    def stray_copies(self) -> int:
        return sum(len(stray.copies) for piece in self.pieces for stray in piece.strays)

    @property
    def cost(self) -> int:
        return len(self.pieces) * self.shape.ensemble_size + self.stray_copies

    def rank(self) -> tuple[int, int, int, _Shape]:
        """Cheapest first; then fewer strays, fewer segments, the smaller shape."""
        return self.cost, self.stray_copies, len(self.pieces), self.shape


def _largest_group(copies: Mapping[str, _Copies]) -> SequenceGroup | None:
    """The group of three runs or more with the most entries: a healthy bookie of a long
    segment, whose period and run length are likeliest the ledger's E and WQ."""
    return max(
        (
            group
            for copy in copies.values()
            for group in copy.entries.groups
            if group.sequence_count > 2 and group.sequence_period <= WIDEST_ENSEMBLE
        ),
        key=lambda group: (group.entry_count, group),
        default=None,
    )


def _survey(copies: Mapping[str, _Copies], last: int, period: int) -> tuple[EntryAvailability, int]:
    """The entries of [0, last] no bookie holds, and the most bookies holding one entry.

    Where all holdings repeat every `period` entries so do the holes and the holders, so one
    period of each such stretch is looked at (a union of the holdings would cost far more:
    bookies of different phases make a union of many groups).
    """
    holes = EntryAvailability.empty()
    most_holders = 0
    entry = last
    while entry >= 0:
        holders, low, high = _holders_around(copies, entry, period)
        if min(high, last) - entry >= period:
            entry = low - 1
            continue
        most_holders = max(most_holders, len(holders))
        if not holders:
            repeats = (entry - low) // period
            lowest = entry - repeats * period
            hole = SequenceGroup(lowest, entry, 1, period if repeats else 0)
            holes = holes.union(EntryAvailability([hole]))
        entry -= 1
    return holes, most_holders


def _cheapest_fits(
    copies: Mapping[str, _Copies], last: int, likeliest: _Shape, most_holders: int
) -> list[_Fit]:
    """The fits of least cost, best first. The likeliest shape is fitted first, so its cost
    bounds every other fit, which stops as soon as it costs more (or cannot cost less)."""
    shapes = _candidate_shapes(copies, most_holders) | {likeliest}
    least_costs = {shape: _least_cost(shape, copies) for shape in shapes}
    others = sorted(shapes - {likeliest}, key=lambda shape: (least_costs[shape], shape))
    cheapest: list[_Fit] = []
    budget = math.inf
    for shape in (likeliest, *others):
        if least_costs[shape] > budget:
            continue
        fit = _Fitter(shape, copies, budget).fit(last)
        if fit is None:
            continue
        if fit.cost < budget:
            cheapest, budget = [], fit.cost
        cheapest.append(fit)
    return sorted(cheapest, key=_Fit.rank)


def _candidate_shapes(copies: Mapping[str, _Copies], most_holders: int) -> set[_Shape]:
    """Every shape with WQ < E up to as many bookies as hold entries; the period and run
    length of every group of three runs or more (E exceeds the bookies left when some are
    gone); and E = WQ = the most holders an entry has, as with E = WQ a segment ends where
    its holders change whatever E is, so a larger one only costs more."""
    bookies = len(copies)
    shapes = {_Shape(size, quorum) for size in range(2, bookies + 1) for quorum in range(1, size)}
    shapes.add(_Shape(most_holders, most_holders))
    for copy in copies.values():
        shapes.update(
            _Shape(period, size)
            for period, size, runs in copy.group_kinds
            if runs > 2 and period <= WIDEST_ENSEMBLE
        )
    return shapes


def _least_cost(shape: _Shape, copies: Mapping[str, _Copies]) -> int:
    """A lower bound on the cost of any fit of `shape` without strays, from the groups alone.

    In a segment a bookie holds runs of WQ entries E apart but for the two at its edges (with
    E = WQ, one run). So a group of other runs meets a segment in at most two of them (one
    with E = WQ) and in at most WQ entries of each; and only one segment spans the gap between
    two groups of a bookie, so the segments meeting each of its groups, added up, exceed the
    segments by at most its groups - 1.
    """
    size, quorum = shape

    def segments_meeting(period: int, run: int, runs: int) -> int:
        if (period, run) == shape:
            return 1
        if size == quorum:
            return runs
        pieces = runs * -(-run // quorum)
        return -(-pieces // min(2, runs))

    fewest = max(
        1 + sum(count * (segments_meeting(*kind) - 1) for kind, count in copy.group_kinds.items())
        for copy in copies.values()
    )
    return fewest * size


class _Fitter:
    """Fits one shape: grows segments from the last entry down (see the module docstring)."""

    def __init__(self, shape: _Shape, copies: Mapping[str, _Copies], budget: float) -> None:
        self._shape = shape
        self._copies = copies
        self._budget = budget
        self._pieces: list[_Piece] = []
        self._cost = 0
        size, quorum = shape
        run = (1 << quorum) - 1
        self._write_sets = [
            ((run << first) | (run >> (size - first))) & ((1 << size) - 1) for first in range(size)
        ]
        """Per entry id mod E, the positions of its write set, as bits."""

    def fit(self, last_entry: int) -> _Fit | None:
        """The segments of [0, last_entry], or None if this shape costs more than the budget
        or must leave aside copies that are not duplicates."""
        size, quorum = self._shape
        end, entry = last_entry, last_entry
        fits: dict[str, int] = {}
        strays: frozenset[str] = frozenset()
        while entry >= 0:
            holders, low, high = _holders_around(self._copies, entry, size)
            if min(high, end) - entry >= size:
                entry = low - 1
                continue
            grown = self._grow(fits, strays, entry, end, holders)
            if grown is None and not strays and quorum < size and quorum < len(holders):
                chosen = self._choose_strays(entry, holders, fits)
                grown = self._grow(fits, chosen, entry, end, holders)
                if grown is not None:
                    strays = chosen
            if grown is not None:
                fits = grown
                entry -= 1
            elif entry < end:
                if not self._close(entry + 1, end, fits, strays):
                    return None
                end, fits, strays = entry, {}, frozenset()
            else:
                return None
        if not self._close(0, end, fits, strays):
            return None
        return _Fit(self._shape, tuple(reversed(self._pieces)))

    def _grow(
        self,
        fits: Mapping[str, int],
        strays: frozenset[str],
        entry: int,
        end: int,
        holders: frozenset[str],
    ) -> dict[str, int] | None:
        """`fits` for the segment [entry, end], or None when no ensemble places exactly what
        its bookies hold there. `strays` are left aside, but only where the entry has more
        holders than its write quorum: elsewhere their copy is no duplicate."""
        if len(holders) <= self._shape.write_quorum and not strays.isdisjoint(holders):
            return None
        here = self._write_sets[entry % self._shape.ensemble_size]
        grown = {
            bookie: mask & here if bookie in holders else mask & ~here
            for bookie, mask in fits.items()
            if bookie not in strays
        }
        newcomers = holders - strays - grown.keys()
        if newcomers:
            free = here & ~self._positions_used(entry + 1, end)
            grown.update(dict.fromkeys(newcomers, free))
        return grown if len(_assign(grown)) == len(grown) else None

    def _positions_used(self, first: int, last: int) -> int:
        """The positions holding some entry of [first, last]: a bookie holding none of them
        cannot be at one."""
        size = self._shape.ensemble_size
        used = 0
        for entry in range(first, min(last, first + size - 1) + 1):
            used |= self._write_sets[entry % size]
        return used

    def _choose_strays(
        self, entry: int, holders: frozenset[str], fits: Mapping[str, int]
    ) -> frozenset[str]:
        """The holders of an over-replicated entry to leave aside: duplicates first (a stray
        holds what its twin holds, so they agree over the last two rounds), then those not
        yet in the segment, then those holding fewer entries of the ledger."""
        size, quorum = self._shape
        window = EntryAvailability.span(max(0, entry - 2 * size + 1), entry)
        ranked = sorted(holders, key=lambda b: (b not in fits, -len(self._copies[b].entries), b))
        seen: set[EntryAvailability] = set()
        originals: list[str] = []
        duplicates: list[str] = []
        for bookie in ranked:
            recent = self._copies[bookie].entries.intersection(window)
            (duplicates if recent in seen else originals).append(bookie)
            seen.add(recent)
        return frozenset((originals + duplicates)[quorum:])

    def _close(
        self, first: int, last: int, fits: Mapping[str, int], strays: frozenset[str]
    ) -> bool:
        """Record the segment [first, last]; False once the fit costs more than the budget or
        leaves aside copies no bookie of the segment duplicates."""
        left_aside = []
        span = EntryAvailability.span(first, last)
        for bookie in sorted(strays):
            copies = self._copies[bookie].entries.intersection(span)
            if not copies:
                continue
            twin = self._twin(copies, fits)
            if twin is None:
                return False
            left_aside.append(_Stray(bookie, copies, twin))
        self._pieces.append(_Piece(first, last, fits, tuple(left_aside)))
        self._cost += self._shape.ensemble_size + sum(len(stray.copies) for stray in left_aside)
        return self._cost <= self._budget

    def _twin(self, copies: EntryAvailability, fits: Mapping[str, int]) -> str | None:
        """A bookie of the segment that holds all of `copies`, if they span over two rounds of
        the ensemble: a stray copy of a position, not the chance overlap of a few entries."""
        first, last = copies.groups[0].first_sequence_start, copies.groups[-1].stop - 1
        if last - first < 2 * self._shape.ensemble_size:
            return None
        return next(
            (b for b in sorted(fits) if not copies.difference(self._copies[b].entries)), None
        )


def _holders_around(
    copies: Mapping[str, _Copies], entry: int, period: int
) -> tuple[frozenset[str], int, int]:
    """The bookies holding `entry`, and the stretch around it where what every bookie holds
    repeats every `period` entries."""
    holders = []
    low, high = 0, _PAST_LAST_ENTRY
    for copy in copies.values():
        holds, start, stop = copy.around(entry, period)
        if holds:
            holders.append(copy.bookie)
        low, high = max(low, start), min(high, stop)
    return frozenset(holders), low, high


def _assign(fits: Mapping[str, int], preferred: Mapping[str, int] | None = None) -> dict[str, int]:
    """As many bookies as possible on distinct positions, each within its bits (augmenting
    paths). A bookie keeps its `preferred` position where it can; the others take the lowest
    free positions in bookie id order, so an arbitrary order is the sorted one."""
    preferred = preferred or {}
    choices = {bookie: _positions(mask, preferred.get(bookie)) for bookie, mask in fits.items()}
    holder_of: dict[int, str] = {}

    def place(bookie: str, tried: set[int]) -> bool:
        free = next((p for p in choices[bookie] if p not in holder_of), None)
        if free is not None:
            holder_of[free] = bookie
            return True
        for position in choices[bookie]:
            if position not in tried:
                tried.add(position)
                if position not in holder_of or place(holder_of[position], tried):
                    holder_of[position] = bookie
                    return True
        return False

    for bookie in sorted(fits, key=lambda b: (b not in preferred, preferred.get(b, 0), b)):
        place(bookie, set())
    return {bookie: position for position, bookie in holder_of.items()}


def _positions(mask: int, first: int | None) -> list[int]:
    """The positions set in `mask`, ascending, with `first` moved ahead if it is one."""
    found = [position for position in range(mask.bit_length()) if mask >> position & 1]
    if first in found:
        found.remove(first)
        found.insert(0, first)
    return found


def _segments(fit: _Fit) -> tuple[InferredSegment, ...]:
    """The fit's ensembles, first segment first, bookies keeping their positions across
    segments where they can; neighbours that came out alike are one segment."""
    segments: list[InferredSegment] = []
    positions: dict[str, int] = {}
    for piece in fit.pieces:
        positions = _assign(piece.fits, positions)
        holder_at = {position: bookie for bookie, position in positions.items()}
        ensemble = tuple(holder_at.get(p) for p in range(fit.shape.ensemble_size))
        if not segments or segments[-1].ensemble != ensemble:
            segments.append(InferredSegment(piece.first, ensemble))
    return tuple(segments)


def _notes(best: _Fit, as_good: Sequence[_Fit], last: int) -> tuple[str, ...]:
    """What the data left open about `best`, which fits as cheaply as `as_good`."""
    size, quorum = best.shape
    notes = []
    if size == quorum > 1:
        notes.append(
            "ensemble order arbitrary: every bookie holds every entry of its segments "
            "(ensemble size = write quorum), so positions follow bookie ids"
        )
    if last + 1 < 2 * size:
        notes.append(
            f"ensemble size and write quorum may be larger: entries 0..{last} are fewer than "
            f"two rounds of the ensemble, and E={size} WQ={quorum} is the smallest shape that fits"
        )
    if as_good:
        shapes = ", ".join(
            f"E={fit.shape.ensemble_size} WQ={fit.shape.write_quorum}" for fit in as_good
        )
        notes.append(f"shape not determined: the entries fit {shapes} as well")
    notes.extend(
        f"bookie {stray.bookie} holds entries {_describe(stray.copies)} that bookie "
        f"{stray.twin} holds too: taken for stray copies (over-replication) and left aside"
        for piece in best.pieces
        for stray in piece.strays
    )
    return tuple(notes)


def _describe(entries: EntryAvailability) -> str:
    """The first few groups of `entries`, for a message: "40..59", "3..4 every 6 to 99..100"."""

    def run(start: int, size: int) -> str:
        return str(start) if size == 1 else f"{start}..{start + size - 1}"

    parts = [
        run(first, size)
        if period == 0
        else f"{run(first, size)} every {period} to {run(last, size)}"
        for first, last, size, period in entries.groups[:_DESCRIBED_GROUPS]
    ]
    if len(entries.groups) > _DESCRIBED_GROUPS:
        parts.append(f"and {len(entries.groups) - _DESCRIBED_GROUPS} more groups")
    return ", ".join(parts)
