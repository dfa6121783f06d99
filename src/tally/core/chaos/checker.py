"""The checker of a chaos run (issue 19): the history alone, judged against the invariants
of BookKeeper's protocol (its TLA+ specifications) and of seed 003.

- AllAckedEntriesAreReadable: every acknowledged add of a ledger the workload did not
  delete is read back, with its content, once the cluster settled (its `final`).
- NoTruncation: no ledger ends (closed, recovered, or CLOSED in its `final`) below an
  acknowledged entry.
- NoDivergence: every read of an entry, the writer's add and the final read agree on its
  content, and a ledger is closed at one end only.
- Fencing: no add is acknowledged to the old writer, past the end, once another client's
  recovery fenced the ledger and closed it.
- EntryOrder: a ledger's adds are acknowledged in entry order, 0..k without a gap.
- OnlyOneLedgerOpenAtATime: a log opens its next ledger only once the previous one ended.
- Settled: the settled cluster's checks found nothing, and no deleted ledger came back.
- Incomplete: the history begins with `run` and ends with `end` (the run was not cut short).

One fault, one violation: the writer's acknowledged add is what an entry's content is
judged against, so a final read that differs from it, or ends before it, is reported by
AllAckedEntriesAreReadable (or, for a CLOSED final, NoTruncation) and not again as a
divergence. A tie in time never convicts: an order is only wrong when the times say so.

One pass over the events with state per ledger (dicts keyed by ledger and entry), so a
history of millions of events costs memory in proportion to its acknowledged entries.
"""

from __future__ import annotations

import enum
import math
import sys
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from tally.core.chaos.history import (
    Added,
    Deleted,
    End,
    Ended,
    Event,
    Fault,
    Final,
    LedgerOpened,
    Read,
    Recovered,
    Run,
    Settled,
)

GONE_STATES = frozenset({"DELETED", "GONE"})
"""A final state in which a ledger's data is meant to be gone."""
CLOSED = "CLOSED"
SETTLED_COUNTS = (
    "under_replicated",
    "replicas_check_findings",
    "audit_violations",
    "corrupt_copies",
    "deleted_data_left",
)
"""The fields of `settled` that must be 0 on a cluster that kept its promises."""


class Invariant(enum.StrEnum):
    """The invariants a history is judged against, by the names of the specifications."""

    ALL_ACKED_ENTRIES_ARE_READABLE = "AllAckedEntriesAreReadable"
    NO_TRUNCATION = "NoTruncation"
    NO_DIVERGENCE = "NoDivergence"
    FENCING = "Fencing"
    ENTRY_ORDER = "EntryOrder"
    ONLY_ONE_LEDGER_OPEN_AT_A_TIME = "OnlyOneLedgerOpenAtATime"
    SETTLED = "Settled"
    INCOMPLETE = "Incomplete"


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: where, and in a sentence, how."""

    invariant: Invariant
    ledger: str
    """The ledger's qualified name; "" for the run as a whole."""
    entries: tuple[int, ...]
    """The entries concerned, ascending; () when the violation is about no entry."""
    detail: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a history shows: its violations, and the counts that say how much was checked."""

    violations: tuple[Violation, ...]
    operations: int
    """Workload events: ledgers opened, adds, closes, recoveries, reads, deletes."""
    acknowledged: int
    """Adds with outcome ok."""
    ledgers: int
    reads_checked: int
    """Read events whose digests were compared."""
    faults: Mapping[str, int]
    """Faults started, by kind."""

    @property
    def ok(self) -> bool:
        return not self.violations


def check_history(events: Iterable[Event]) -> Verdict:
    """Judge a whole history, in one pass over its events (which may be a stream)."""
    checker = _Checker()
    for event in events:
        checker.observe(event)
    return checker.verdict()


class _Ack(NamedTuple):
    """An acknowledged add: when, what, and to whom (interned: one string per writer, not
    one per entry)."""

    t: float
    digest: str
    actor: str


class _End(NamedTuple):
    """A `closed` or `recovered` ok: where and when the ledger ended, and by whom."""

    t: float
    last_entry: int
    actor: str
    recovery: bool

    def describe(self) -> str:
        how = "recovered" if self.recovery else "closed"
        return f"{how} by {self.actor} at t={self.t:g}"


@dataclass(slots=True)
class _Ledger:
    """What the history said so far about one ledger."""

    acks: dict[int, _Ack] = field(default_factory=dict)
    max_acked: int = -1
    unacked_reads: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Digests read of entries with no acknowledged add (yet): entry -> (digest, reader)."""
    ends: list[_End] = field(default_factory=list)
    final: Final | None = None
    deleted: bool = False
    delete_failed: bool = False

    def exempt(self) -> bool:
        """Whether the workload deleted it: its entries need not be readable. A failed
        delete may have taken effect (like a failed add), so it exempts a ledger that is
        gone in the end."""
        gone = self.final is not None and self.final.state in GONE_STATES
        return self.deleted or (self.delete_failed and gone)

    def end_time(self) -> float:
        """When it first ended (closed or recovered); infinity while it never did."""
        return min((end.t for end in self.ends), default=math.inf)


class _Checker:
    """The state of one pass: per ledger, per log, and the run's counts."""

    def __init__(self) -> None:
        self.ledgers: dict[str, _Ledger] = {}
        self.opened: dict[str, list[tuple[float, str]]] = {}
        """Per log: its ledgers as opened, (t, ledger), in the history's order."""
        self.violations: list[Violation] = []
        self.began: bool | None = None
        """Whether the first event was `run`; None before the first event."""
        self.ended = False
        self.settled: Settled | None = None
        self.operations = 0
        self.acknowledged = 0
        self.reads_checked = 0
        self.faults: Counter[str] = Counter()

    def _ledger(self, name: str) -> _Ledger:
        ledger = self.ledgers.get(name)
        if ledger is None:
            ledger = self.ledgers[name] = _Ledger()
        return ledger

    def _violate(
        self, invariant: Invariant, ledger: str, entries: Iterable[int], detail: str
    ) -> None:
        self.violations.append(Violation(invariant, ledger, tuple(sorted(entries)), detail))

    def observe(self, event: Event) -> None:
        """Take in the next event of the history."""
        if self.began is None:
            self.began = isinstance(event, Run)
        match event:
            case LedgerOpened():
                self.operations += 1
                self._ledger(event.ledger)
                self.opened.setdefault(event.log, []).append((event.t, event.ledger))
            case Added():
                self.operations += 1
                if event.outcome == "ok":
                    self._acknowledged(event)
                else:
                    self._ledger(event.ledger)
            case Ended():
                self.operations += 1
                ledger = self._ledger(event.ledger)
                if event.outcome == "ok":
                    recovery = isinstance(event, Recovered)
                    ledger.ends.append(_End(event.t, event.last_entry, event.actor, recovery))
            case Read():
                self.operations += 1
                self.reads_checked += 1
                self._read(event)
            case Deleted():
                self.operations += 1
                ledger = self._ledger(event.ledger)
                if event.outcome == "ok":
                    ledger.deleted = True
                else:
                    ledger.delete_failed = True
            case Fault():
                if event.action == "start":
                    self.faults[event.fault] += 1
            case Final():
                self._ledger(event.ledger).final = event
            case Settled():
                self.settled = event
            case End():
                self.ended = True

    def _acknowledged(self, event: Added) -> None:
        """An ok add: the content its entry must have from now on, in entry order."""
        self.acknowledged += 1
        name = event.ledger
        ledger = self._ledger(name)
        entry = event.entry
        if entry is None or entry < 0:
            self._violate(
                Invariant.ENTRY_ORDER,
                name,
                (),
                f"an add acknowledged to {event.actor} at t={event.t:g} has no entry id "
                f"({entry}): a malformed history",
            )
            return
        earlier = ledger.acks.get(entry)
        if earlier is not None:
            self._violate(
                Invariant.ENTRY_ORDER,
                name,
                (entry,),
                f"entry {entry} was acknowledged twice, to {earlier.actor} at "
                f"t={earlier.t:g} and to {event.actor} at t={event.t:g}",
            )
            return
        ack = _Ack(event.t, event.digest, sys.intern(event.actor))
        ledger.acks[entry] = ack
        ledger.max_acked = max(ledger.max_acked, entry)
        self._check_neighbours(name, ledger, entry, ack)
        read = ledger.unacked_reads.pop(entry, None)
        if read is not None and read[0] != ack.digest:
            self._violate(
                Invariant.NO_DIVERGENCE,
                name,
                (entry,),
                f"the add acknowledged to {ack.actor} has other content than {read[1]} saw",
            )

    def _check_neighbours(self, name: str, ledger: _Ledger, entry: int, ack: _Ack) -> None:
        """Entries 0..k acknowledged in the order of their times are exactly those whose
        neighbours' times never go backwards, so two lookups check the order of a stream
        whatever the order of its lines."""
        before = ledger.acks.get(entry - 1)
        if before is not None and before.t > ack.t:
            self._out_of_order(name, entry, before, ack)
        after = ledger.acks.get(entry + 1)
        if after is not None and ack.t > after.t:
            self._out_of_order(name, entry + 1, ack, after)

    def _out_of_order(self, name: str, entry: int, before: _Ack, ack: _Ack) -> None:
        """Entry `entry` (acknowledged as `ack`) was acknowledged before `entry - 1`."""
        self._violate(
            Invariant.ENTRY_ORDER,
            name,
            (entry - 1, entry),
            f"entry {entry} was acknowledged at t={ack.t:g}, before entry {entry - 1} at "
            f"t={before.t:g}",
        )

    def _read(self, event: Read) -> None:
        """A read's digests against what is known of each entry: its acknowledged add, or
        the first read of it while it has none."""
        ledger = self._ledger(event.ledger)
        reader = f"a read by {event.actor} at t={event.t:g}"
        diverged: list[int] = []
        other = ""
        for entry, digest in enumerate(event.digests, start=event.first):
            ack = ledger.acks.get(entry)
            if ack is not None:
                if ack.digest != digest:
                    diverged.append(entry)
                    other = other or f"the add acknowledged to {ack.actor}"
                continue
            known = ledger.unacked_reads.setdefault(entry, (digest, reader))
            if known[0] != digest:
                diverged.append(entry)
                other = other or known[1]
        if diverged:
            self._violate(
                Invariant.NO_DIVERGENCE,
                event.ledger,
                diverged,
                f"{reader} saw other content than {other} at {_count(diverged)}",
            )

    def verdict(self) -> Verdict:
        """The judgement of everything observed, once at the end: what needs the whole
        history is checked here. The run's own violations come first, since an incomplete
        run explains what it lacks."""
        self._check_complete()
        self._check_settled()
        for name, ledger in self.ledgers.items():
            self._check_final(name, ledger)
            self._check_ends(name, ledger)
            self._check_fencing(name, ledger)
            self._check_gaps(name, ledger)
        for log, opened in self.opened.items():
            self._check_one_open(log, opened)
        return Verdict(
            violations=tuple(sorted(self.violations, key=lambda v: v.ledger != "")),
            operations=self.operations,
            acknowledged=self.acknowledged,
            ledgers=len(self.ledgers),
            reads_checked=self.reads_checked,
            faults=dict(self.faults),
        )

    def _check_complete(self) -> None:
        """A run cut short leaves a history without its `run` or its `end`: what it
        shows holds, but it is not the whole run."""
        if not self.began:
            self._violate(
                Invariant.INCOMPLETE, "", (), "the history does not begin with a run event"
            )
        if not self.ended:
            self._violate(
                Invariant.INCOMPLETE,
                "",
                (),
                "the history has no end event: the run was cut short",
            )

    def _check_settled(self) -> None:
        """The settled cluster's own checks must have found nothing."""
        if self.settled is None:
            self._violate(
                Invariant.SETTLED,
                "",
                (),
                "the history has no settled event: nothing says the cluster settled and "
                "passed its checks",
            )
            return
        for name in SETTLED_COUNTS:
            found = getattr(self.settled, name)
            if found:
                self._violate(
                    Invariant.SETTLED, "", (), f"the settled cluster has {name} = {found}"
                )

    def _check_final(self, name: str, ledger: _Ledger) -> None:
        """Every acknowledged entry read back, with its content, once the cluster settled;
        and a deleted ledger stays gone."""
        final = ledger.final
        if ledger.deleted and final is not None and final.state not in GONE_STATES:
            self._violate(
                Invariant.SETTLED,
                name,
                (),
                f"the workload deleted it, yet it came back: its final state is {final.state}",
            )
        if final is not None:
            self._check_unacked_reads(name, ledger, final)
        if not ledger.acks or ledger.exempt():
            return
        if final is None:
            self._violate(
                Invariant.ALL_ACKED_ENTRIES_ARE_READABLE,
                name,
                ledger.acks,
                f"{_count(ledger.acks, 'acknowledged')}, but the history has no final for it",
            )
            return
        past_end: list[int] = []
        unreadable: list[int] = []
        different: list[int] = []
        truncation_reports_past_end = final.state == CLOSED
        for entry, ack in ledger.acks.items():
            if entry > final.last_entry:
                if not truncation_reports_past_end:
                    past_end.append(entry)
                continue
            digest = final.digests[entry] if entry < len(final.digests) else None
            if digest is None:
                unreadable.append(entry)
            elif digest != ack.digest:
                different.append(entry)
        for entries, how in (
            (past_end, f"not read back: past its final end {final.last_entry} ({final.state})"),
            (unreadable, "not read back: the read failed"),
            (different, "read back with other content than acknowledged"),
        ):
            if entries:
                self._violate(
                    Invariant.ALL_ACKED_ENTRIES_ARE_READABLE,
                    name,
                    entries,
                    f"{_count(entries, 'acknowledged')} {how}",
                )

    def _check_unacked_reads(self, name: str, ledger: _Ledger, final: Final) -> None:
        """The final read of an entry no add was acknowledged for must agree with the reads of
        it during the run (an entry that is acknowledged is judged by its add instead)."""
        diverged: list[int] = []
        reader = ""
        for entry, (digest, who) in ledger.unacked_reads.items():
            settled = final.digests[entry] if 0 <= entry < len(final.digests) else None
            if settled is not None and settled != digest:
                diverged.append(entry)
                reader = reader or who
        if diverged:
            self._violate(
                Invariant.NO_DIVERGENCE,
                name,
                diverged,
                f"the final read has other content than {reader} saw at {_count(diverged)}",
            )

    def _check_ends(self, name: str, ledger: _Ledger) -> None:
        """One end per ledger, and none below an acknowledged entry."""
        ends: dict[int, list[str]] = {}
        for end in ledger.ends:
            ends.setdefault(end.last_entry, []).append(end.describe())
        final = ledger.final
        if final is not None and final.state == CLOSED:
            ends.setdefault(final.last_entry, []).append("CLOSED in its final")
        if len(ends) > 1:
            low, high = min(ends), max(ends)
            told = "; ".join(f"{last} ({', '.join(who)})" for last, who in sorted(ends.items()))
            self._violate(
                Invariant.NO_DIVERGENCE,
                name,
                range(low + 1, high + 1),
                f"it was closed at {len(ends)} different ends: {told}",
            )
        for last, who in sorted(ends.items()):
            if last < ledger.max_acked:
                lost = [entry for entry in ledger.acks if entry > last]
                self._violate(
                    Invariant.NO_TRUNCATION,
                    name,
                    lost,
                    f"it ends at {last} ({', '.join(who)}), below {_count(lost, 'acknowledged')}",
                )

    def _check_fencing(self, name: str, ledger: _Ledger) -> None:
        """Once another client's recovery has ended the ledger, the old writer can have
        nothing more acknowledged past that end: the bookies it wrote to were fenced."""
        for end in ledger.ends:
            if not end.recovery:
                continue
            late = [
                entry
                for entry in range(end.last_entry + 1, ledger.max_acked + 1)
                if (ack := ledger.acks.get(entry)) is not None
                and ack.t > end.t
                and ack.actor != end.actor
            ]
            if late:
                writers = sorted({ledger.acks[entry].actor for entry in late})
                self._violate(
                    Invariant.FENCING,
                    name,
                    late,
                    f"{_count(late)} acknowledged to {', '.join(writers)} after it was "
                    f"{end.describe()}, fenced and closed at {end.last_entry}",
                )

    def _check_gaps(self, name: str, ledger: _Ledger) -> None:
        """BookKeeper acknowledges entries in order: a later one acknowledged means every
        earlier one was."""
        if len(ledger.acks) == ledger.max_acked + 1:
            return
        missing = [entry for entry in range(ledger.max_acked) if entry not in ledger.acks]
        self._violate(
            Invariant.ENTRY_ORDER,
            name,
            missing,
            f"{_count(missing)} never acknowledged, yet entry {ledger.max_acked} was",
        )

    def _check_one_open(self, log: str, opened: list[tuple[float, str]]) -> None:
        """Each ledger of a log opened only after every earlier one ended (closed by its
        writer or recovered by a takeover): the latest end so far says it, in one pass."""
        latest_end = -math.inf
        latest = ""
        for t, name in sorted(opened, key=lambda item: item[0]):
            if latest_end > t:
                when = "never ended" if math.isinf(latest_end) else f"ended at t={latest_end:g}"
                self._violate(
                    Invariant.ONLY_ONE_LEDGER_OPEN_AT_A_TIME,
                    name,
                    (),
                    f"log {log} opened it at t={t:g} while its ledger {latest} was open ({when})",
                )
            end = self.ledgers[name].end_time()
            if end > latest_end:
                latest_end, latest = end, name


def _count(entries: Collection[int], adjective: str = "") -> str:
    """Entries in a detail: the one entry by its id, else how many (the violation lists
    them)."""
    words = f"{adjective} " if adjective else ""
    if len(entries) == 1:
        return f"{words}entry {next(iter(entries))}"
    return f"{len(entries)} {words}entries"
