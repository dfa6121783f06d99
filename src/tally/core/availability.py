"""Which entries of a ledger a bookie holds: the condensed encoding of BP-34.

Entries are described by sequence groups: runs (sequences) of `sequence_size` consecutive
entries, `sequence_period` apart. A healthy bookie of a ledger with ensemble size E and write
quorum WQ holds one run of WQ entries every E entries, so a whole ledger is one group.

Wire format (version 0, big-endian): a 64-byte header (int32 version, int32 number of
sequence groups, 56 zero bytes), then 24 bytes per group (int64 first_sequence_start, int64
last_sequence_start, int32 sequence_size, int32 sequence_period). The count is of groups, as
Apache BookKeeper writes it, so either side decodes the other's bytes.

Canonical form: the greedy grouping, left to right, of the maximal runs. A run joins the open
group when its size is the group's and either the group has one run so far (the distance
becomes the period) or it starts one period after the group's last run. Runs longer than
2^31-1 entries are cut into pieces of 2^31-1 (sizes are int32), and a period must fit an
int32 too. Every `EntryAvailability` holds its canonical groups, so equal entry sets have
equal groups and equal bytes, whatever grouping (e.g. BookKeeper's one group per run) came in.

The decoder's job is to refuse everything that is not well-formed, never to guess: another
version, non-zero reserved bytes (version 0 defines them as zero; a writer that uses them
must change the version), a count that disagrees with the length, trailing bytes, groups
that overlap, are out of order, or have impossible values. It accepts any valid grouping.
The format has no checksum, so a flipped bit inside a value may still describe a valid,
different set: integrity is the transport's job (the protocol's frames and digests).

Set operations walk both group lists: inside a stretch where each side is within one group,
both are periodic, so the result is computed for one window of the common period (the lcm)
and extended arithmetically, as groups. Equal periods (the healthy case) cost O(1) per
stretch, so comparing a ledger's expected and available entries costs O(groups), not
O(entries); unequal periods cost the runs of one lcm window (or of the stretch, if shorter)
plus the groups of the result. Results are in canonical form.
"""

from __future__ import annotations

import math
import struct
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from itertools import pairwise
from typing import NamedTuple, Self

import numpy as np
import numpy.typing as npt

from tally.core.errors import BadRequest, MalformedData

VERSION = 0
HEADER_SIZE = 64
GROUP_SIZE = 24
MAX_ENTRY_ID = 2**63 - 1
MAX_SEQUENCE = 2**31 - 1
"""The largest sequence size and sequence period: both are int32 on the wire."""

SMALL_ARRAY = 64
"""Entry ids up to which from_entries groups them in plain Python: numpy's fixed cost per
call is larger than the work for a few entries (a bookie answering lists of small ledgers)."""

_HEADER = struct.Struct(">ii56x")
_GROUP = struct.Struct(">qqii")

Int64Array = npt.NDArray[np.int64]
_Run = tuple[int, int]
"""[start, stop) of consecutive entries."""
_Pattern = tuple[int, int, int]
"""(phase, size, period): the entries e with (e - phase) mod period < size."""
_RunOp = Callable[[list[_Run], list[_Run]], list[_Run]]


class SequenceGroup(NamedTuple):
    """Runs of `sequence_size` entries, `sequence_period` apart (0 when there is one run)."""

    first_sequence_start: int
    last_sequence_start: int
    sequence_size: int
    sequence_period: int

    @property
    def sequence_count(self) -> int:
        period = self.sequence_period
        return (
            1
            if period == 0
            else (self.last_sequence_start - self.first_sequence_start) // period + 1
        )

    @property
    def entry_count(self) -> int:
        return self.sequence_count * self.sequence_size

    @property
    def stop(self) -> int:
        """One past the group's last entry, as in `range`."""
        return self.last_sequence_start + self.sequence_size


class EntryAvailability:
    """An immutable set of entry ids, held as canonical sequence groups.

    Build it with `from_entries`, `from_bytes`, `empty`, or from groups in any valid grouping
    (`EntryAvailability(groups)`, which raises BadRequest for invalid ones).
    """

    __slots__ = ("_count", "_groups", "_starts")

    _groups: tuple[SequenceGroup, ...]
    _starts: list[int]
    _count: int

    def __init__(self, groups: Iterable[SequenceGroup] = ()) -> None:
        self._set(
            _canonical(map(_as_group, groups), BadRequest, lambda index: f"sequence group {index}")
        )

    def _set(self, groups: tuple[SequenceGroup, ...]) -> None:
        self._groups = groups
        self._starts = [group.first_sequence_start for group in groups]
        self._count = sum(group.entry_count for group in groups)

    @classmethod
    def _of(cls, groups: tuple[SequenceGroup, ...]) -> Self:
        """Wrap groups already in canonical form (no checks)."""
        made = cls.__new__(cls)
        made._set(groups)
        return made

    @classmethod
    def empty(cls) -> Self:
        return cls._of(())

    @classmethod
    def span(cls, first: int, last: int) -> Self:
        """Every entry of [first, last] (none when last < first): a segment's whole range."""
        if first < 0 or last > MAX_ENTRY_ID:
            raise BadRequest(f"entries {first}..{last} are outside 0..{MAX_ENTRY_ID}")
        builder = _Canonical()
        if first <= last:
            builder.add_run(first, last + 1)
        return cls._of(builder.finish())

    @classmethod
    def from_entries(cls, entries: Iterable[int] | npt.NDArray[np.integer]) -> Self:
        """The availability of the given entry ids.

        Fast path: a 1-D int64 numpy array, sorted and without duplicates, is encoded without
        a Python step per entry or per run (one per group). Anything else is converted,
        sorted and deduplicated first. Negative or non-integer ids raise BadRequest.
        """
        ids = _entry_ids(entries)
        if ids.size == 0:
            return cls.empty()
        if ids.size <= SMALL_ARRAY:
            return cls._of(_small_groups(ids.tolist()))
        lowest = int(ids.min())
        if lowest < 0:
            raise BadRequest(f"entry id {lowest} is negative")
        steps = np.diff(ids)
        if not bool((steps > 0).all()):
            ids = np.unique(ids)
            steps = np.diff(ids)
        bounds = np.concatenate(([0], np.flatnonzero(steps != 1) + 1, [ids.size]))
        return cls._of(_group_runs(ids[bounds[:-1]], np.diff(bounds)))

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Self:
        """Decode the condensed encoding; anything not well-formed raises MalformedData.

        Accepted: version 0, reserved bytes zero, exactly as many groups as the header says,
        groups ascending and disjoint, each valid (see `EntryAvailability(groups)`); the
        grouping need not be canonical (BookKeeper writes one group per run).
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise BadRequest(f"entry availability must be bytes, not {type(data).__name__}")
        raw = bytes(data)
        if len(raw) < HEADER_SIZE:
            raise MalformedData(
                f"entry availability truncated: {len(raw)} bytes, the header alone is {HEADER_SIZE}"
            )
        version, count = _HEADER.unpack_from(raw)
        if version != VERSION:
            raise MalformedData(
                f"entry availability version {version} at offset 0 is unknown (only {VERSION})"
            )
        if raw[8:HEADER_SIZE].count(0) != HEADER_SIZE - 8:
            reserved = next(offset for offset in range(8, HEADER_SIZE) if raw[offset])
            raise MalformedData(
                f"entry availability reserved header byte at offset {reserved} is "
                f"{raw[reserved]:#04x}, must be 0"
            )
        if count < 0:
            raise MalformedData(f"entry availability group count {count} at offset 4 is negative")
        size = HEADER_SIZE + count * GROUP_SIZE
        if len(raw) < size:
            cut = (len(raw) - HEADER_SIZE) // GROUP_SIZE
            raise MalformedData(
                f"entry availability truncated: {count} sequence groups need {size} bytes, "
                f"got {len(raw)}; sequence group {cut} at offset "
                f"{HEADER_SIZE + cut * GROUP_SIZE} is cut"
            )
        if len(raw) > size:
            raise MalformedData(
                f"entry availability has {len(raw) - size} trailing bytes at offset {size}, "
                f"after the {count} sequence groups its header declares"
            )
        groups = map(SequenceGroup._make, _GROUP.iter_unpack(raw[HEADER_SIZE:]))
        return cls._of(
            _canonical(
                groups,
                MalformedData,
                lambda index: (
                    f"sequence group {index} at offset {HEADER_SIZE + index * GROUP_SIZE}"
                ),
            )
        )

    def to_bytes(self) -> bytes:
        """The condensed encoding, in canonical form."""
        if len(self._groups) > MAX_SEQUENCE:
            raise BadRequest(f"{len(self._groups)} sequence groups do not fit an int32 count")
        return _HEADER.pack(VERSION, len(self._groups)) + b"".join(
            _GROUP.pack(*group) for group in self._groups
        )

    @property
    def groups(self) -> tuple[SequenceGroup, ...]:
        return self._groups

    def to_numpy(self) -> Int64Array:
        """All entry ids, ascending, as int64 (vectorised; memory is one int64 per entry)."""
        if not self._groups:
            return np.empty(0, dtype=np.int64)
        table = np.array(self._groups, dtype=np.int64)
        firsts, lasts, sizes, periods = table.T
        sequence_counts = (lasts - firsts) // np.maximum(periods, 1) + 1
        sequence_starts = _expand(firsts, sequence_counts, periods)
        return _expand(sequence_starts, np.repeat(sizes, sequence_counts), np.int64(1))

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return bool(self._groups)

    def __contains__(self, entry: object) -> bool:
        if not isinstance(entry, int | np.integer):
            return False
        entry_id = int(entry)
        index = bisect_right(self._starts, entry_id) - 1
        if index < 0:
            return False
        first, _, size, period = group = self._groups[index]
        if entry_id >= group.stop:
            return False
        return period == 0 or (entry_id - first) % period < size

    def __iter__(self) -> Iterator[int]:
        for first, last, size, period in self._groups:
            for start in range(first, last + 1, period or 1):
                yield from range(start, start + size)

    def difference(self, other: EntryAvailability) -> EntryAvailability:
        """Entries here and not in `other`: expected minus available is what a bookie lacks."""
        if not self._groups or not other._groups:
            return self
        if self._groups == other._groups:
            return EntryAvailability.empty()
        return EntryAvailability._of(
            _combine(self._groups, other._groups, _subtract_runs, keeps=(True, False))
        )

    def intersection(self, other: EntryAvailability) -> EntryAvailability:
        """Entries in both."""
        if self._groups == other._groups:
            return self
        if not self._groups or not other._groups:
            return EntryAvailability.empty()
        return EntryAvailability._of(
            _combine(self._groups, other._groups, _intersect_runs, keeps=(False, False))
        )

    def union(self, other: EntryAvailability) -> EntryAvailability:
        """Entries in either: e.g. what any copy of a ledger holds."""
        if not other._groups or self._groups == other._groups:
            return self
        if not self._groups:
            return other
        return EntryAvailability._of(
            _combine(self._groups, other._groups, _unite_runs, keeps=(True, True))
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EntryAvailability):
            return NotImplemented
        return self._groups == other._groups

    def __hash__(self) -> int:
        return hash(self._groups)

    def __repr__(self) -> str:
        shown = ", ".join(_describe(group) for group in self._groups[:_REPR_GROUPS])
        if len(self._groups) > _REPR_GROUPS:
            shown += f", ... {len(self._groups) - _REPR_GROUPS} more groups"
        return f"EntryAvailability({self._count} entries: {shown or 'none'})"


_REPR_GROUPS = 6


def _describe(group: SequenceGroup) -> str:
    first, last, size, period = group

    def run(start: int) -> str:
        return f"[{start}]" if size == 1 else f"[{start}..{start + size - 1}]"

    return run(first) if period == 0 else f"{run(first)} every {period} to {run(last)}"


def _entry_ids(entries: Iterable[int] | npt.NDArray[np.integer]) -> Int64Array:
    """`entries` as a 1-D int64 array, refusing what is not an entry id."""
    values = entries if isinstance(entries, np.ndarray) else np.asarray(list(entries))
    if values.ndim != 1:
        raise BadRequest(f"entry ids must be one-dimensional, got shape {values.shape}")
    if values.size == 0:
        return np.empty(0, dtype=np.int64)
    if values.dtype.kind == "O" and all(
        isinstance(value, int) and not isinstance(value, bool) for value in values
    ):
        raise BadRequest(f"entry ids {min(values)}..{max(values)} are outside 0..{MAX_ENTRY_ID}")
    if values.dtype.kind not in "iu":
        raise BadRequest(f"entry ids must be integers, got {values.dtype}")
    if values.dtype.kind == "u" and int(values.max()) > MAX_ENTRY_ID:
        raise BadRequest(f"entry id {int(values.max())} is beyond {MAX_ENTRY_ID}")
    return values.astype(np.int64, copy=False)


def _small_groups(ids: list[int]) -> tuple[SequenceGroup, ...]:
    """The canonical groups of a few entry ids, in any order."""
    if any(later <= earlier for earlier, later in pairwise(ids)):
        ids = sorted(set(ids))
    if ids[0] < 0:
        raise BadRequest(f"entry id {ids[0]} is negative")
    builder = _Canonical()
    for entry_id in ids:
        builder.add_run(entry_id, entry_id + 1)
    return builder.finish()


def _expand(starts: Int64Array, counts: Int64Array, steps: Int64Array | np.int64) -> Int64Array:
    """Concatenated arithmetic progressions: counts[i] values from starts[i], steps[i] apart."""
    firsts_at = np.cumsum(counts) - counts
    index_in_progression = np.arange(int(firsts_at[-1] + counts[-1])) - np.repeat(firsts_at, counts)
    step_each = np.repeat(steps, counts) if isinstance(steps, np.ndarray) else steps
    return np.repeat(starts, counts) + index_in_progression * step_each


def _split_long_sequences(starts: Int64Array, sizes: Int64Array) -> tuple[Int64Array, Int64Array]:
    """Cut runs longer than an int32 into pieces of MAX_SEQUENCE and a remainder."""
    pieces = (sizes + MAX_SEQUENCE - 1) // MAX_SEQUENCE
    piece_starts = _expand(starts, pieces, np.int64(MAX_SEQUENCE))
    remaining = _expand(sizes, pieces, np.int64(-MAX_SEQUENCE))
    return piece_starts, np.minimum(remaining, MAX_SEQUENCE)


def _group_runs(starts: Int64Array, sizes: Int64Array) -> tuple[SequenceGroup, ...]:
    """The canonical groups of maximal runs, with one Python step per group.

    Link j is the pair (run j, run j+1); it is usable when the sizes are equal and the
    distance fits an int32. A group opening at run i with link i usable takes link i's
    distance as its period and extends to the end of the stretch of usable links of that
    distance. numpy finds where every stretch ends, so the greedy walk jumps group to group.
    """
    if int(sizes.max()) > MAX_SEQUENCE:
        starts, sizes = _split_long_sequences(starts, sizes)
    runs = starts.size
    distances = np.diff(starts)
    usable = (sizes[1:] == sizes[:-1]) & (distances <= MAX_SEQUENCE)
    continues = np.append(usable[1:] & (distances[1:] == distances[:-1]), False)
    stretch_last_links = np.flatnonzero(usable & ~continues).tolist()
    heads: list[int] = []
    tails: list[int] = []
    run = 0
    while run < runs:
        heads.append(run)
        if run + 1 < runs and usable[run]:
            run = stretch_last_links[bisect_left(stretch_last_links, run)] + 1
        tails.append(run)
        run += 1
    head, tail = np.array(heads), np.array(tails)
    periods = np.where(tail > head, starts[np.minimum(head + 1, runs - 1)] - starts[head], 0)
    return tuple(
        map(
            SequenceGroup._make,
            zip(
                starts[head].tolist(),
                starts[tail].tolist(),
                sizes[head].tolist(),
                periods.tolist(),
                strict=True,
            ),
        )
    )


class _Canonical:
    """Greedy grouping of ascending runs, fed a run or a periodic block of runs at a time.

    The last run stays pending until the next input, which may touch it and lengthen it.
    A block of many runs costs O(1): after its first three runs the open group has the
    block's size and period, so the rest join it arithmetically.
    """

    __slots__ = ("_first", "_groups", "_last", "_period", "_run_start", "_run_stop", "_size")

    def __init__(self) -> None:
        self._groups: list[SequenceGroup] = []
        self._first = self._last = self._size = self._period = 0
        self._run_start = self._run_stop = -1

    def add_run(self, start: int, stop: int) -> None:
        if start == self._run_stop:
            self._run_stop = stop
            return
        self._flush_run()
        self._run_start, self._run_stop = start, stop

    def add_block(self, start: int, size: int, period: int, count: int) -> None:
        """`count` runs of `size` entries, `period` apart (period >= size)."""
        if count == 1 or period == size:
            self.add_run(start, start + (count - 1) * period + size)
        elif period > MAX_SEQUENCE:
            for index in range(count):
                self.add_run(start + index * period, start + index * period + size)
        else:
            self.add_run(start, start + size)
            self._flush_run()
            self._sequences(start + period, size, period, count - 2)
            last = start + (count - 1) * period
            self._run_start, self._run_stop = last, last + size

    def finish(self) -> tuple[SequenceGroup, ...]:
        self._flush_run()
        self._close()
        return tuple(self._groups)

    def _flush_run(self) -> None:
        start, size = self._run_start, self._run_stop - self._run_start
        if start < 0:
            return
        self._run_start = self._run_stop = -1
        if size > MAX_SEQUENCE:
            pieces = size // MAX_SEQUENCE
            self._sequences(start, MAX_SEQUENCE, MAX_SEQUENCE, pieces)
            start, size = start + pieces * MAX_SEQUENCE, size - pieces * MAX_SEQUENCE
        if size:
            self._join(start, size)

    def _sequences(self, start: int, size: int, period: int, count: int) -> None:
        for index in range(min(count, 3)):
            self._join(start + index * period, size)
        if count > 3:
            self._last = start + (count - 1) * period

    def _join(self, start: int, size: int) -> None:
        if size == self._size:
            if self._period == 0:
                if start - self._first <= MAX_SEQUENCE:
                    self._period, self._last = start - self._first, start
                    return
            elif start - self._last == self._period:
                self._last = start
                return
        self._close()
        self._first = self._last = start
        self._size, self._period = size, 0

    def _close(self) -> None:
        if self._size:
            self._groups.append(SequenceGroup(self._first, self._last, self._size, self._period))


def _as_group(value: object) -> SequenceGroup:
    """A caller's group (any 4-tuple of ints) as a SequenceGroup, or BadRequest."""
    if not (
        isinstance(value, tuple)
        and len(value) == 4
        and all(isinstance(part, int) and not isinstance(part, bool) for part in value)
    ):
        raise BadRequest(f"entry availability sequence group {value!r} is not four integers")
    return SequenceGroup._make(value)


def _checked(group: SequenceGroup, floor: int) -> str | None:
    """Why `group` is not a valid sequence group starting at `floor` or later, if it is not."""
    first, last, size, period = group
    if not 0 < size <= MAX_SEQUENCE:
        return f"sequence_size {size} is outside 1..{MAX_SEQUENCE}"
    if not 0 <= period <= MAX_SEQUENCE:
        return f"sequence_period {period} is outside 0..{MAX_SEQUENCE}"
    if first < 0:
        return f"first_sequence_start {first} is negative"
    if first < floor:
        return (
            f"first_sequence_start {first} is not after the previous group, "
            f"which ends at entry {floor - 1}"
        )
    if last < first:
        return f"last_sequence_start {last} is before first_sequence_start {first}"
    if last + size - 1 > MAX_ENTRY_ID:
        return f"last entry {last + size - 1} is beyond {MAX_ENTRY_ID}"
    if last == first:
        if period:
            return f"one sequence with sequence_period {period}, not 0"
    elif period == 0:
        return f"sequences from {first} to {last} with sequence_period 0"
    elif period < size:
        return f"sequences of {size} entries every {period} are not disjoint"
    elif (last - first) % period:
        return (
            f"last_sequence_start {last} is not a whole number of periods of {period} "
            f"after first_sequence_start {first}"
        )
    return None


def _canonical(
    groups: Iterable[SequenceGroup],
    error: type[BadRequest],
    where: Callable[[int], str],
) -> tuple[SequenceGroup, ...]:
    """Check groups in any grouping (raising `error` at the first bad one); regroup greedily."""
    builder = _Canonical()
    floor = 0
    for index, group in enumerate(groups):
        problem = _checked(group, floor)
        if problem is not None:
            raise error(f"entry availability {where(index)}: {problem}")
        first, last, size, period = group
        builder.add_block(first, size, period, (last - first) // (period or 1) + 1)
        floor = last + size
    return builder.finish()


def _pattern(group: SequenceGroup) -> _Pattern:
    """The periodic set equal to `group` inside its span (every entry when runs touch)."""
    first, _, size, period = group
    if period in (0, size):
        return (0, 1, 1)
    return (first % period, size, period)


def _runs(pattern: _Pattern | None, lo: int, hi: int) -> list[_Run]:
    """The runs of `pattern` (none when absent) inside [lo, hi), clipped to it."""
    if pattern is None:
        return []
    phase, size, period = pattern
    if size == period:
        return [(lo, hi)] if lo < hi else []
    start = lo - (lo - phase) % period
    if start + size <= lo:
        start += period
    found = []
    while start < hi:
        found.append((max(start, lo), min(start + size, hi)))
        start += period
    return found


def _intersect_runs(these: list[_Run], those: list[_Run]) -> list[_Run]:
    found = []
    i = j = 0
    while i < len(these) and j < len(those):
        lo, hi = max(these[i][0], those[j][0]), min(these[i][1], those[j][1])
        if lo < hi:
            found.append((lo, hi))
        if these[i][1] < those[j][1]:
            i += 1
        else:
            j += 1
    return found


def _unite_runs(these: list[_Run], those: list[_Run]) -> list[_Run]:
    found: list[_Run] = []
    for start, stop in sorted(these + those):
        if found and start <= found[-1][1]:
            found[-1] = (found[-1][0], max(found[-1][1], stop))
        else:
            found.append((start, stop))
    return found


def _subtract_runs(these: list[_Run], those: list[_Run]) -> list[_Run]:
    found = []
    j = 0
    for start, stop in these:
        while j < len(those) and those[j][1] <= start:
            j += 1
        k = j
        while k < len(those) and those[k][0] < stop:
            if those[k][0] > start:
                found.append((start, those[k][0]))
            start = max(start, those[k][1])
            k += 1
        if start < stop:
            found.append((start, stop))
    return found


def _side(groups: tuple[SequenceGroup, ...], index: int) -> tuple[int, int, _Pattern] | None:
    """(start, stop, pattern) of groups[index], or None past the end."""
    if index == len(groups):
        return None
    group = groups[index]
    return group.first_sequence_start, group.stop, _pattern(group)


def _combine(
    these: tuple[SequenceGroup, ...],
    those: tuple[SequenceGroup, ...],
    op: _RunOp,
    keeps: tuple[bool, bool],
) -> tuple[SequenceGroup, ...]:
    """`op` of two group lists, stretch by stretch between the boundaries of either side.

    `keeps`: whether entries of `these`, and of `those`, survive `op` where the other side
    has no group (so such stretches are skipped when they do not).
    """
    builder = _Canonical()
    i = j = lo = 0
    this, that = _side(these, 0), _side(those, 0)
    while this is not None or that is not None:
        this_at = this[2] if this is not None and this[0] <= lo else None
        that_at = that[2] if that is not None and that[0] <= lo else None
        hi = MAX_ENTRY_ID + 1
        if this is not None:
            hi = this[1] if this_at else this[0]
        if that is not None:
            hi = min(hi, that[1] if that_at else that[0])
        if (this_at and (that_at or keeps[0])) or (that_at and keeps[1]):
            _emit(builder, lo, hi, this_at, that_at, op)
        lo = hi
        if this is not None and this[1] <= lo:
            i += 1
            this = _side(these, i)
        if that is not None and that[1] <= lo:
            j += 1
            that = _side(those, j)
    return builder.finish()


def _emit(
    builder: _Canonical,
    lo: int,
    hi: int,
    this: _Pattern | None,
    that: _Pattern | None,
    op: _RunOp,
) -> None:
    """Feed `builder` with op(this, that) on [lo, hi), where each side is periodic or absent.

    The result repeats every L = lcm of the periods. It is computed on one window of L,
    rotated to start at an entry outside the result so no run crosses a window boundary,
    and fed as blocks: one block for the whole stretch when the window's runs continue the
    same period across windows, otherwise the window's groups once per window.
    """

    def window(start: int, stop: int) -> list[_Run]:
        return op(_runs(this, start, stop), _runs(that, start, stop))

    length = math.lcm(*(pattern[2] for pattern in (this, that) if pattern is not None))
    if hi - lo <= length:
        for start, stop in window(lo, hi):
            builder.add_run(start, stop)
        return
    found = window(lo, lo + length)
    if not found:
        return
    if found[0] == (lo, lo + length):
        builder.add_run(lo, hi)
        return
    origin = lo
    if found[0][0] == lo:
        origin = found[0][1]
        builder.add_run(lo, origin)
        found = [*found[1:], (lo + length, origin + length)]
    offsets = _Canonical()
    for start, stop in found:
        offsets.add_run(start - origin, stop - origin)
    shape = offsets.finish()
    windows = (hi - origin) // length
    first, last, size, period = shape[0]
    if len(shape) == 1 and first + length - last == (period or length):
        if windows:
            builder.add_block(
                origin + first, size, period or length, shape[0].sequence_count * windows
            )
    else:
        for index in range(windows):
            base = origin + index * length
            for group in shape:
                builder.add_block(
                    base + group.first_sequence_start,
                    group.sequence_size,
                    group.sequence_period,
                    group.sequence_count,
                )
    tail = origin + windows * length
    for start, stop in found:
        if tail + start - origin >= hi:
            break
        builder.add_run(tail + start - origin, min(tail + stop - origin, hi))
