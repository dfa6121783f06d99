"""Re-replication of one ledger, decided without I/O: what to copy where, and how often to try.

A replication worker holds a ledger's lock, reads its metadata and asks every registered
bookie of it for its availability; `plan_replication` turns that into a plan. Per segment
that holds entries and per ensemble position:

- the bookie is lost (not registered, and named by the mark, or the mark names nobody):
  REPLACE it; a new bookie, which the placement policy picks, gets every entry of the
  position's write sets, and the segment's ensemble is changed once the copies are in;
- the bookie is registered and its availability lacks entries of its write sets, or holds
  copies of them known to be bad (the mark's `bad_copies`: a scrub, a read or a check found
  them corrupt): FILL them, copied back to the same bookie over the bad copies, with no
  metadata change;
- otherwise nothing.

A bookie that is not registered but not named by the mark is not yet declared lost (the
auditor waits `lost_bookie_recovery_delay` for it), and a registered bookie that did not
answer cannot be judged: both leave the plan incomplete, so the mark stays, while whatever
else is missing is still repaired. The last segment of a ledger that is not closed has no
end yet and its writer still owns it: a declared-lost bookie in it is reported
(`recover_first`) so the worker can give the writer its grace period, then fence and close
the ledger (issue 7, item 6). Its entries up to the LAC are acknowledged and never change,
though: a registered bookie of it that lacks them or holds them bad (its disk failed, it
was formatted anew, rot) has them FILLed, so an idle open ledger does not wait for its
close to get its copies back; the ensemble itself stays the writer's.

An entry is read from a bookie of its write set that holds it and written to every target
at once (`SegmentRepair.entries`). It is lost only when every bookie of its write set is
known not to have a readable copy: declared lost, lacking it in its availability, holding
a copy known to be bad, or answering NoSuchEntry or a corrupt copy. A bad copy is never a
source. An absent bookie that is not declared lost, a
timeout or any other error is unknown, never a loss (seed 003).

Also here: the worker's repair schedule (per-ledger backoff, the open ledger's grace
deadline, lost ledgers left alone until marked again), the token bucket of the copy's byte
rate, ranges of lost entries, and re-applying replacements onto metadata that changed
meanwhile.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import itertools
from collections.abc import Collection, Iterable, Iterator, Mapping

from tally.core.availability import EntryAvailability
from tally.core.errors import BadRequest, BookieUnavailable, EntryUnreadable, NoSuchEntry
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.schedule import expected_entries, write_set


class RepairKind(enum.Enum):
    REPLACE = "replace"
    """The bookie is lost: a new bookie takes its position after receiving its entries."""
    FILL = "fill"
    """The bookie is there but lacks entries: they are copied back to it."""


class Standing(enum.Enum):
    """What is known of one ensemble position's bookie."""

    ANSWERED = "answered"
    """Registered, and its availability is known."""
    SILENT = "silent"
    """Registered, but it did not answer: it may still serve reads."""
    LOST = "lost"
    """Not registered, and declared lost by the mark."""
    ABSENT = "absent"
    """Not registered, not (yet) declared lost: it may come back."""


@dataclasses.dataclass(frozen=True, slots=True)
class PositionRepair:
    position: int
    bookie_id: str
    """The bookie at the position now: the one replaced (REPLACE) or filled (FILL)."""
    kind: RepairKind
    entries: EntryAvailability
    """The entries to copy to the position."""


@dataclasses.dataclass(frozen=True, slots=True)
class EntrySources:
    """Where one entry comes from and goes to."""

    entry_id: int
    targets: tuple[PositionRepair, ...]
    sources: tuple[str, ...]
    """Bookies to read it from, in order: those whose availability has it, then silent ones."""
    without_copy: tuple[str, ...]
    """Bookies of its write set known to have no copy (targets included)."""
    unknown: tuple[str, ...]
    """Bookies of its write set that are absent but not declared lost."""


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentRepair:
    """The repairs of one segment, with what is known of each of its positions."""

    index: int
    first_entry_id: int
    last_entry_id: int
    ensemble: tuple[str, ...]
    write_quorum: int
    repairs: tuple[PositionRepair, ...]
    """At most one per position, by position."""
    standings: tuple[Standing, ...]
    held: tuple[EntryAvailability | None, ...]
    """Per position, the bookie's availability when it ANSWERED, else None."""

    def entries(self) -> Iterator[EntrySources]:
        """Every entry to copy, ascending, each once with all its targets."""
        tagged = [zip(repair.entries, itertools.repeat(i)) for i, repair in enumerate(self.repairs)]
        merged = heapq.merge(*tagged)
        for entry_id, group in itertools.groupby(merged, key=lambda pair: pair[0]):
            yield self.sources_of(entry_id, tuple(self.repairs[i] for _, i in group))

    def sources_of(self, entry_id: int, targets: tuple[PositionRepair, ...]) -> EntrySources:
        if not self.first_entry_id <= entry_id <= self.last_entry_id:
            raise BadRequest(
                f"entry {entry_id} is outside segment {self.index} "
                f"({self.first_entry_id}..{self.last_entry_id})"
            )
        targeted = {repair.position for repair in targets}
        holders: list[str] = []
        silent: list[str] = []
        without: list[str] = []
        unknown: list[str] = []
        for position in write_set(entry_id, len(self.ensemble), self.write_quorum):
            bookie, standing = self.ensemble[position], self.standings[position]
            held = self.held[position]
            if position in targeted or standing is Standing.LOST:
                without.append(bookie)
            elif standing is Standing.ABSENT:
                unknown.append(bookie)
            elif standing is Standing.SILENT:
                silent.append(bookie)
            elif held is not None and entry_id in held:
                holders.append(bookie)
            else:
                without.append(bookie)
        return EntrySources(entry_id, targets, (*holders, *silent), tuple(without), tuple(unknown))


@dataclasses.dataclass(frozen=True, slots=True)
class ReplicationPlan:
    segments: tuple[SegmentRepair, ...]
    """Only the segments with something to copy."""
    unjudged: frozenset[str]
    """Bookies of segments with entries that are silent, or absent but not declared lost."""
    recover_first: frozenset[str]
    """Declared-lost bookies of an unclosed ledger's last segment: fence and close it first."""

    @property
    def complete(self) -> bool:
        """Nothing to copy, nothing unknown, nothing waiting: the ledger has all WQ copies
        of every entry in its bounded segments and no lost bookie anywhere that holds any."""
        return not self.segments and not self.unjudged and not self.recover_first

    def describe(self) -> str:
        """One line for the logs."""
        parts = []
        for segment in self.segments:
            for repair in segment.repairs:
                parts.append(
                    f"segment {segment.index} ({segment.first_entry_id}..{segment.last_entry_id})"
                    f" position {repair.position}: {repair.kind.value} {repair.bookie_id}, "
                    f"{len(repair.entries)} entries"
                )
        if self.unjudged:
            parts.append(f"unjudged bookies {sorted(self.unjudged)}")
        if self.recover_first:
            parts.append(f"lost in the open last segment {sorted(self.recover_first)}")
        return "; ".join(parts) or "nothing to repair"


def plan_replication(
    metadata: LedgerMetadata,
    missing_bookies: Collection[str],
    registered: Collection[str],
    availability: Mapping[str, EntryAvailability],
    bad_copies: Mapping[str, EntryAvailability] | None = None,
    open_last_add_confirmed: int | None = None,
) -> ReplicationPlan:
    """The repairs of one ledger (see the module's docstring for the rules).

    `missing_bookies` is the mark's (empty: every unregistered bookie is lost);
    `registered` the writable and read-only bookies; `availability` what each bookie that
    answered holds of the ledger, over the whole ledger; `bad_copies` the entries whose
    copies on a bookie are known to be bad and not yet written over;
    `open_last_add_confirmed` for a ledger that is not closed, the highest LAC its bookies
    answered (None: unknown).
    """
    registered = frozenset(registered)
    named = frozenset(missing_bookies)
    if bad_copies:
        availability = {
            bookie: held.difference(bad_copies[bookie]) if bookie in bad_copies else held
            for bookie, held in availability.items()
        }

    def standing(bookie: str) -> Standing:
        if bookie in registered:
            return Standing.ANSWERED if bookie in availability else Standing.SILENT
        return Standing.LOST if not named or bookie in named else Standing.ABSENT

    e, wq = metadata.ensemble_size, metadata.write_quorum
    segments: list[SegmentRepair] = []
    unjudged: set[str] = set()
    recover_first: frozenset[str] = frozenset()
    for index, (segment, first, last) in enumerate(metadata.segments_with_bounds()):
        standings = tuple(standing(bookie) for bookie in segment.ensemble)
        open_segment = last is None
        if last is None:
            recover_first = frozenset(
                bookie
                for bookie, found in zip(segment.ensemble, standings, strict=True)
                if found is Standing.LOST
            )
            if open_last_add_confirmed is None:
                continue
            last = open_last_add_confirmed
        if last < first:
            continue
        held = tuple(availability.get(bookie) for bookie in segment.ensemble)
        repairs: list[PositionRepair] = []
        for position, (bookie, found) in enumerate(zip(segment.ensemble, standings, strict=True)):
            expected = expected_entries(first, last, e, wq, position)
            if not expected:
                continue
            if open_segment and found is not Standing.ANSWERED:
                continue  # the writer's to change (a lost one is in recover_first)
            if found in (Standing.SILENT, Standing.ABSENT):
                unjudged.add(bookie)
                continue
            if found is Standing.LOST:
                repairs.append(PositionRepair(position, bookie, RepairKind.REPLACE, expected))
                continue
            holding = held[position]
            assert holding is not None
            missing = expected.difference(holding)
            if missing:
                repairs.append(PositionRepair(position, bookie, RepairKind.FILL, missing))
        if repairs:
            segments.append(
                SegmentRepair(
                    index, first, last, segment.ensemble, wq, tuple(repairs), standings, held
                )
            )
    return ReplicationPlan(tuple(segments), frozenset(unjudged), recover_first)


@dataclasses.dataclass(frozen=True, slots=True)
class Replacement:
    """`new` takes `old`'s position in a segment, whose copies it now holds."""

    segment_index: int
    position: int
    old: str
    new: str


def apply_replacements(
    current: LedgerMetadata, planned: LedgerMetadata, replacements: Iterable[Replacement]
) -> LedgerMetadata | None:
    """`current` with the replacements made, if every replaced segment is still as planned
    (same first entry, same end, `old` still at the position); None if one changed, since
    the copies may then no longer match it. A replacement already made is kept as it is."""
    metadata = current
    planned_bounds, current_bounds = planned.segment_bounds(), current.segment_bounds()
    for replacement in replacements:
        index = replacement.segment_index
        if index >= len(current.segments) or current_bounds[index] != planned_bounds[index]:
            return None
        at = metadata.segments[index].ensemble[replacement.position]
        if at == replacement.new:
            continue
        if at != replacement.old or current.segments[index].ensemble != (
            planned.segments[index].ensemble
        ):
            return None
        metadata = metadata.replace_bookie(index, replacement.old, replacement.new)
    return metadata


def entry_ranges(entry_ids: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Inclusive (first, last) ranges of consecutive ids, ascending, duplicates merged."""
    ranges: list[tuple[int, int]] = []
    for entry_id in sorted(set(entry_ids)):
        if ranges and entry_id == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], entry_id)
        else:
            ranges.append((entry_id, entry_id))
    return tuple(ranges)


def retry_delay(failures: int, initial: float, maximum: float) -> float:
    """Seconds before a ledger that failed `failures` times in a row is tried again:
    `initial`, doubling per failure, never above `maximum` (0 failures: at once)."""
    if failures < 0 or initial <= 0 or maximum < initial:
        raise BadRequest(
            f"backoff needs failures >= 0 and 0 < initial <= maximum, got failures={failures} "
            f"initial={initial} maximum={maximum}"
        )
    if failures == 0:
        return 0.0
    doublings = min(failures - 1, 64)
    return float(min(maximum, initial * 2.0**doublings))


@dataclasses.dataclass(frozen=True, slots=True)
class Backoff:
    failures: int
    """Failed turns in a row (0 for a turn deferred by an open ledger's grace period)."""
    retry_at: float


class RepairSchedule:
    """When a replication worker takes each marked ledger: a small state machine fed with
    what its turns did, with the time as an input (seconds, the worker's clock).

    A ledger whose turn failed waits `retry_delay` before its next; one deferred for an
    open ledger's grace period waits until the deadline given; one reported as lost waits
    until it is marked again (a new mark version). A repaired ledger, or one no longer
    marked, is due again at once.
    """

    def __init__(self, backoff_initial: float, backoff_max: float) -> None:
        retry_delay(1, backoff_initial, backoff_max)  # refuses a bad pair now
        self._initial = backoff_initial
        self._max = backoff_max
        self._backoffs: dict[LedgerId, Backoff] = {}

    def marks_seen(self, marked: Collection[LedgerId]) -> None:
        """Forget the ledgers no longer marked (repaired by another worker, or deleted)."""
        for ledger_id in set(self._backoffs) - set(marked):
            del self._backoffs[ledger_id]

    def is_due(
        self, ledger_id: LedgerId, now: float, *, mark_version: int, lost_at: int | None
    ) -> bool:
        """Whether to take the ledger now; `lost_at`: the mark version at which it went on
        the lost-entries list, if it is there."""
        if lost_at == mark_version:
            return False
        backoff = self._backoffs.get(ledger_id)
        return backoff is None or backoff.retry_at <= now

    def failed(self, ledger_id: LedgerId, now: float) -> Backoff:
        previous = self._backoffs.get(ledger_id)
        failures = (previous.failures if previous else 0) + 1
        backoff = Backoff(failures, now + retry_delay(failures, self._initial, self._max))
        self._backoffs[ledger_id] = backoff
        return backoff

    def deferred(self, ledger_id: LedgerId, until: float) -> None:
        """Not before `until`; the failures counted so far stay."""
        previous = self._backoffs.get(ledger_id)
        self._backoffs[ledger_id] = Backoff(previous.failures if previous else 0, until)

    def done(self, ledger_id: LedgerId) -> None:
        """Repaired, lost or taken by another worker: no backoff left."""
        self._backoffs.pop(ledger_id, None)

    def next_look(self, now: float, poll_interval: float) -> float:
        """Seconds until the worker looks at the marks again: the poll interval, or sooner
        when a backoff ends first."""
        if not self._backoffs:
            return poll_interval
        soonest = min(backoff.retry_at for backoff in self._backoffs.values())
        return max(0.0, min(poll_interval, soonest - now))

    def backoffs(self) -> list[tuple[LedgerId, Backoff]]:
        """The ledgers waiting, soonest first."""
        return sorted(self._backoffs.items(), key=lambda item: item[1].retry_at)


def grace_deadline(first_marked_ms: int, grace_period: float) -> float:
    """When an open ledger's writer has had its grace period to change the ensemble away
    from a lost bookie of its last segment (seconds, wall clock): the worker then fences
    and closes it to repair it."""
    return first_marked_ms / 1000 + grace_period


class TokenBucket:
    """A byte rate: `reserve` says how long to wait before spending `amount` bytes.

    Reservations may run the bucket into debt, so an entry larger than the burst passes
    after its share of time and concurrent copies queue behind each other in turn.
    """

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if not rate > 0 or not burst > 0:
            raise BadRequest(f"a token bucket needs rate > 0 and burst > 0, got {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._updated = now

    def reserve(self, amount: int, now: float) -> float:
        if amount < 0:
            raise BadRequest(f"cannot reserve {amount} bytes")
        elapsed = max(0.0, now - self._updated)
        self._tokens = min(self.burst, self._tokens + elapsed * self.rate)
        self._updated = max(self._updated, now)
        self._tokens -= amount
        return max(0.0, -self._tokens / self.rate)


def targets_of(
    sources: EntrySources, new_bookies: Mapping[int, str]
) -> tuple[tuple[PositionRepair, str], ...]:
    """Each target of the entry with the bookie it is written to: the new bookie of a
    REPLACE position (from `new_bookies`, by position), the bookie itself for a FILL."""
    found = []
    for repair in sources.targets:
        if repair.kind is RepairKind.FILL:
            found.append((repair, repair.bookie_id))
        elif repair.position in new_bookies:
            found.append((repair, new_bookies[repair.position]))
        else:
            raise BadRequest(
                f"position {repair.position} ({repair.bookie_id}) is to be replaced, "
                "but no new bookie was chosen for it"
            )
    return tuple(found)


def read_batches(entries: Iterable[EntrySources], size: int) -> Iterator[list[EntrySources]]:
    """The entries, in batches of at most `size` that one request may read (READ_ENTRIES)
    and one write per target may copy: each batch's entries share their first source and
    their targets. An entry with no source to read is a batch of its own (its copy fails
    or finds it lost), as is every entry when `size` is 1. Batches come as they fill, the
    partly filled ones at the end; entries keep their order within a batch."""
    if size < 1:
        raise BadRequest(f"a read batch holds at least one entry, not {size}")
    filling: dict[tuple[str, tuple[int, ...]], list[EntrySources]] = {}
    for sources in entries:
        if not sources.sources:
            yield [sources]
            continue
        key = (sources.sources[0], tuple(repair.position for repair in sources.targets))
        batch = filling.setdefault(key, [])
        batch.append(sources)
        if len(batch) >= size:
            del filling[key]
            yield batch
    yield from filling.values()


class BatchReadFailure(enum.Enum):
    """What a repair does with the rest of a batch whose read from its source failed."""

    FIRST_ALONE = "first alone"
    """The source holds no usable copy of the first entry (NoSuchEntry, a corrupt or
    unreadable copy): that entry is copied alone, from its other sources; the rest are
    still read together."""
    REST_ALONE = "rest alone"
    """An answer about the whole ledger (NoSuchLedger, in limbo) or none (an error, a
    timeout): every entry left is copied alone."""
    SOURCE_ALONE = "source alone"
    """The connection closed (a bookie too old to know READ_ENTRIES closes it, as does one
    going down): as REST_ALONE, and the source's entries are read one by one for the rest
    of the worker's pass."""


def batch_read_failure(error: BaseException) -> BatchReadFailure:
    """What to do after `error` ended a batched read (never a judgement of the entries:
    an entry copied alone is judged by the answers of all its sources)."""
    if isinstance(error, NoSuchEntry | EntryUnreadable):
        return BatchReadFailure.FIRST_ALONE
    if isinstance(error, BookieUnavailable):
        return BatchReadFailure.SOURCE_ALONE
    return BatchReadFailure.REST_ALONE


def replacements_of(
    segment: SegmentRepair, new_bookies: Mapping[int, str], failed: Collection[int]
) -> tuple[Replacement, ...]:
    """The replacements to commit for a segment: its REPLACE positions but `failed` ones
    (a copy to them did not finish, so the lost bookie's place stays on record)."""
    return tuple(
        Replacement(segment.index, repair.position, repair.bookie_id, new_bookies[repair.position])
        for repair in segment.repairs
        if repair.kind is RepairKind.REPLACE and repair.position not in failed
    )
