"""The durability contract of a closed ledger: every entry on all WQ bookies of its write set.

Each bookie reports which entries of the ledger it holds (its availability); the round-robin
schedule says which it should hold. Their difference, per segment and ensemble position, is
what is missing there. An entry's copies are WQ minus the positions missing it, and the
ledger is classified by its worst entry. Everything is set arithmetic on the condensed
encoding, so a healthy ledger of any length costs a few group operations, which is what lets
the online auditor and the Spark job run the very same check over a whole cluster.

A bookie that did not answer is not judged: its positions count neither as missing nor as
present, and the ledger is reported as potentially faulty instead (BP-34).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from tally.core.availability import EntryAvailability
from tally.core.errors import BadRequest
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.core.schedule import expected_entries


class DurabilityCategory(enum.Enum):
    """A ledger's worst entry, worst first; the names are those of the audit reports."""

    NO_REPLICA = "no_replica"
    BELOW_ACK_QUORUM = "below_ack_quorum"
    BELOW_WRITE_QUORUM = "below_write_quorum"

    @classmethod
    def of_copies(
        cls, copies: int, write_quorum: int, ack_quorum: int
    ) -> DurabilityCategory | None:
        """The category of an entry with `copies` copies; None when it has all WQ."""
        if copies <= 0:
            return cls.NO_REPLICA
        if copies < ack_quorum:
            return cls.BELOW_ACK_QUORUM
        if copies < write_quorum:
            return cls.BELOW_WRITE_QUORUM
        return None


@dataclass(frozen=True, slots=True)
class SegmentBookieFinding:
    """What one bookie, at one position of one segment, holds against what it should."""

    segment_index: int
    position: int
    bookie_id: str
    missing: EntryAvailability
    """Entries of its write sets that it does not hold."""


@dataclass(frozen=True, slots=True)
class LedgerDurability:
    """The verdict on one closed ledger."""

    category: DurabilityCategory | None
    """The worst entry's category over the bookies that answered; None when all is well."""
    fewest_copies: int
    """Copies of the worst entry, counting only the bookies that answered."""
    findings: tuple[SegmentBookieFinding, ...]
    """Per segment and position: only those with something missing."""
    unresponsive_bookies: frozenset[str]
    """Bookies of the ledger with no availability: the ledger is potentially faulty."""

    @property
    def potentially_faulty(self) -> bool:
        return bool(self.unresponsive_bookies)


def check_ledger(
    metadata: LedgerMetadata, availability: Mapping[str, EntryAvailability]
) -> LedgerDurability:
    """Compare a closed ledger's schedule with its bookies' availability.

    `availability` maps bookie id to the entries that bookie holds of this ledger (over the
    whole ledger: a bookie may serve several segments); a bookie absent from it did not
    answer. Copies beyond the schedule do not count: an entry's copies are those of its
    write set (`ledger_audit.over_replicated` reports the others).
    """
    if metadata.state is not LedgerState.CLOSED:
        raise BadRequest(
            f"the durability contract is checked on closed ledgers; this one is "
            f"{metadata.state.name}"
        )
    e, wq, aq = metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum
    findings: list[SegmentBookieFinding] = []
    unresponsive: set[str] = set()
    most_missing = 0
    for index, (segment, first, last) in enumerate(metadata.segments_with_bounds()):
        if last is None or last < first:
            continue
        missing_by_position: list[EntryAvailability] = []
        for position, bookie in enumerate(segment.ensemble):
            held = availability.get(bookie)
            if held is None:
                unresponsive.add(bookie)
                continue
            expected = expected_entries(first, last, e, wq, position)
            missing = expected.difference(held)
            if missing:
                findings.append(SegmentBookieFinding(index, position, bookie, missing))
                missing_by_position.append(missing)
        most_missing = max(most_missing, _highest_overlap(missing_by_position))
    fewest_copies = wq - most_missing
    return LedgerDurability(
        category=DurabilityCategory.of_copies(fewest_copies, wq, aq),
        fewest_copies=fewest_copies,
        findings=tuple(findings),
        unresponsive_bookies=frozenset(unresponsive),
    )


def _highest_overlap(sets: list[EntryAvailability]) -> int:
    """The largest number of the given sets that share one entry.

    `levels[k]` holds the entries found in at least k + 1 of the sets seen so far; each new
    set lifts what it shares with a level to the level above. Set operations only, so
    periodic losses (a whole bookie) cost as little as one missing entry.
    """
    levels: list[EntryAvailability] = []
    for current in sets:
        for k in range(len(levels) - 1, -1, -1):
            lifted = levels[k].intersection(current)
            if not lifted:
                continue
            if k + 1 == len(levels):
                levels.append(lifted)
            else:
                levels[k + 1] = levels[k + 1].union(lifted)
        if levels:
            levels[0] = levels[0].union(current)
        else:
            levels.append(current)
    return len(levels)
