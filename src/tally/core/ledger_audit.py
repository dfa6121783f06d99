"""The audit's verdict on one closed ledger: every finding it has, as report rows.

BP-34's checker, for one ledger, in one pure function that the online auditor, the Spark job
and the confirmation pass all call, so that they cannot disagree. The order of the checks is
the seed's: a ledger already marked under-replicated is left to re-replication (and reported
only once that has taken too long); any other ledger is judged on its durability
(`check_ledger`, worst entry), its extra copies (entries on a bookie where no write set puts
them), its unresponsive bookies and the placement of each ensemble.

Extra copies are over-replication, not a violation: a copy beyond the write set never lowers
durability. They are left behind where a bookie held a position before: a bookie declared
lost and replaced by re-replication that comes back with its disk, then possibly chosen
again for another position of the same segment (it then holds every entry of the segment);
adds in flight to a bookie that a writer's or a recovery's ensemble change replaces; copies
of a repair given up before its new bookie was committed. They are counted apart, in entries
and estimated bytes, and raise no alert; the garbage collection trims them.

A deleted ledger is judged on none of this: a DELETED one keeps its data on purpose (it may
be undeleted), and a tombstoned one only on whether its bookies dropped its data in time
(`deletion_stuck`).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tally.core.availability import (
    EntryAvailability,
)
from tally.core.deletion import Tombstone
from tally.core.durability import DurabilityCategory, LedgerDurability, check_ledger
from tally.core.errors import BadRequest
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.core.placement import (
    PlacementAdherence,
    adherence_of_racks,
    fewest_racks_per_write_set,
    rack_of,
    racks_required,
)
from tally.core.schedule import expected_entries

SHOWN_ENTRIES = 5
"""Entry ids a detail sentence names before it says "...": enough to go and look."""


class Category(enum.Enum):
    """What the audit reports; the values are the report's and the summary's names."""

    NO_REPLICA = "no_replica"
    BELOW_ACK_QUORUM = "below_ack_quorum"
    BELOW_WRITE_QUORUM = "below_write_quorum"
    UNDERREPLICATED_TOO_LONG = "underreplicated_too_long"
    PLACEMENT_FAIL = "placement_fail"
    PLACEMENT_SOFT = "placement_soft"
    UNRESPONSIVE_REGISTERED_BOOKIE = "unresponsive_registered_bookie"
    POTENTIALLY_FAULTY = "potentially_faulty"
    ORPHAN_DATA = "orphan_data"
    DELETION_STUCK = "deletion_stuck"
    """A bookie still holds data of a ledger tombstoned longer than deletion_stuck_after ago."""
    INVALID_METADATA = "invalid_metadata"
    """The Spark job's: a snapshot's rows that make no valid ledger, which is not judged."""
    OVER_REPLICATED = "over_replicated"

    @property
    def is_violation(self) -> bool:
        """Everything but over-replication, which is counted apart and raises no alert: an
        extra copy never lowers durability."""
        return self is not Category.OVER_REPLICATED


VIOLATION_CATEGORIES = tuple(category for category in Category if category.is_violation)


_OF_DURABILITY = {
    DurabilityCategory.NO_REPLICA: Category.NO_REPLICA,
    DurabilityCategory.BELOW_ACK_QUORUM: Category.BELOW_ACK_QUORUM,
    DurabilityCategory.BELOW_WRITE_QUORUM: Category.BELOW_WRITE_QUORUM,
}
_OF_ADHERENCE = {
    PlacementAdherence.FAIL: Category.PLACEMENT_FAIL,
    PlacementAdherence.MEETS_SOFT: Category.PLACEMENT_SOFT,
}


@dataclass(frozen=True, slots=True)
class Violation:
    """One report row of a ledger (the ledger id is the caller's to add); an over_replicated
    row is a finding of the same shape, though not a violation.

    `missing_count` counts the entries the row is about: missing ones for a durability row,
    extra ones for an over_replicated row; None where no entries are counted. `byte_count`
    is an over_replicated row's estimate of its extra copies' bytes (`estimated_bytes`).
    """

    category: Category
    segment_index: int | None
    bookie_id: str | None
    missing_count: int | None
    detail: str
    byte_count: int | None = None


@dataclass(frozen=True, slots=True)
class OverReplication:
    """The totals of over_replicated rows, as the online check and the Spark job both give
    them: ledgers with extra copies, rows (one per segment and bookie), extra entries, and
    their estimated bytes."""

    ledgers: int = 0
    rows: int = 0
    entries: int = 0
    bytes: int = 0

    @classmethod
    def of(cls, rows: Iterable[tuple[object, Violation]]) -> OverReplication:
        """Totals of (ledger, row) pairs; rows of other categories are left out."""
        ledgers: set[object] = set()
        count = entries = size = 0
        for ledger, row in rows:
            if row.category is not Category.OVER_REPLICATED:
                continue
            ledgers.add(ledger)
            count += 1
            entries += row.missing_count or 0
            size += row.byte_count or 0
        return cls(len(ledgers), count, entries, size)

    def to_dict(self) -> dict[str, int]:
        return {
            "ledgers": self.ledgers,
            "rows": self.rows,
            "entries": self.entries,
            "bytes": self.bytes,
        }


def audit_ledger(
    metadata: LedgerMetadata,
    availability: Mapping[str, EntryAvailability],
    *,
    racks: Mapping[str, str],
    min_racks: int,
    underreplicated_since_ms: int | None,
    now_ms: int,
    grace_period_ms: int,
    cluster_racks: int | None = None,
) -> list[Violation]:
    """Every finding of one closed, non-empty ledger, in a stable order: violations and its
    over_replicated rows.

    `availability` maps each bookie that answered to what it holds of this ledger (empty when
    it holds nothing); a bookie of the ledger absent from it did not answer, and the ledger
    is potentially faulty rather than judged on that bookie. Bookies outside the ledger's
    ensembles may appear too: what they hold up to the last entry is over-replication.

    A ledger marked under-replicated is being repaired: nothing is reported until it is
    `marked_too_long` (past `grace_period_ms`, never with a grace period of 0), then one
    underreplicated_too_long row and nothing else, since its metadata is about to change and
    any other finding would be stale (seed 000).

    Placement is judged per segment that holds entries (an empty trailing segment protects
    nothing) with `adherence_of_racks`; `cluster_racks` defaults to the racks that `racks`
    names, together with those of the ledger's own bookies.
    """
    if metadata.state is not LedgerState.CLOSED or metadata.last_entry_id < 0:
        raise BadRequest(
            f"the audit judges closed ledgers with entries; this one is {metadata.state.name} "
            f"with last entry {metadata.last_entry_id}"
        )
    if grace_period_ms < 0:
        raise BadRequest(f"grace period {grace_period_ms} ms is negative")
    if underreplicated_since_ms is not None:
        return _underreplicated(underreplicated_since_ms, now_ms, grace_period_ms)
    verdict = check_ledger(metadata, availability)
    return [
        *_durability(metadata, verdict),
        *over_replicated(metadata, availability),
        *potentially_faulty([s.ensemble for s in metadata.segments], verdict.unresponsive_bookies),
        *_placement(metadata, racks, min_racks, cluster_racks),
    ]


def marked_too_long(first_marked_ms: int, now_ms: int, grace_period_ms: int) -> bool:
    """Whether a ledger marked under-replicated at `first_marked_ms` is overdue: marked for
    longer than the grace period. A grace period of 0 never reports a mark, as BookKeeper's
    underreplicatedLedgerRecoveryGracePeriod of 0 turns the report off; the online check and
    the Spark job both read it so."""
    if grace_period_ms < 0:
        raise BadRequest(f"grace period {grace_period_ms} ms is negative")
    return grace_period_ms > 0 and now_ms - first_marked_ms > grace_period_ms


def _underreplicated(since_ms: int, now_ms: int, grace_period_ms: int) -> list[Violation]:
    if not marked_too_long(since_ms, now_ms, grace_period_ms):
        return []
    marked_for = now_ms - since_ms
    return [
        Violation(
            Category.UNDERREPLICATED_TOO_LONG,
            None,
            None,
            None,
            f"marked under-replicated at {since_ms} ms, {marked_for} ms ago: longer than the "
            f"grace period of {grace_period_ms} ms",
        )
    ]


def _durability(metadata: LedgerMetadata, verdict: LedgerDurability) -> list[Violation]:
    if verdict.category is None:
        return []
    category = _OF_DURABILITY[verdict.category]
    e, wq, aq = metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum
    bounds = metadata.segment_bounds()
    found = []
    for finding in verdict.findings:
        if not finding.missing:
            continue
        first, last = bounds[finding.segment_index]
        assert last is not None  # closed ledger
        owed = len(expected_entries(first, last, e, wq, finding.position))
        found.append(
            Violation(
                category,
                finding.segment_index,
                finding.bookie_id,
                len(finding.missing),
                f"bookie {finding.bookie_id} (segment {finding.segment_index}, position "
                f"{finding.position}) lacks {len(finding.missing)} of the {owed} entries its "
                f"write sets put there ({_entries(finding.missing)}); the worst entry of the "
                f"ledger has {verdict.fewest_copies} of WQ={wq} copies (AQ={aq})",
            )
        )
    return found


def over_replicated(
    metadata: LedgerMetadata, availability: Mapping[str, EntryAvailability]
) -> list[Violation]:
    """The over_replicated rows of a closed ledger: per segment with entries and bookie of
    `availability`, the segment's entries the bookie holds that no write set of the segment
    puts there (all of them for a bookie outside the segment's ensemble); by segment, then
    bookie. Entries past the ledger's end (written, never acknowledged, then cut off by
    recovery) belong to no segment and are not counted.

    The online check and the Spark job both call this, on what the bookies they asked
    answered: the online check asks the bookies of the ledger's ensembles, the Spark job has
    every bookie's dump, so only it sees copies on a bookie the ledger no longer names.
    """
    e, wq = metadata.ensemble_size, metadata.write_quorum
    found = []
    for index, (segment, first, last) in enumerate(metadata.segments_with_bounds()):
        if last is None or last < first:
            continue
        span = EntryAvailability.span(first, last)
        for bookie in sorted(availability):
            held = availability[bookie].intersection(span)
            if not held:
                continue
            if bookie in segment.ensemble:
                position = segment.ensemble.index(bookie)
                extra = held.difference(expected_entries(first, last, e, wq, position))
                why = f"(position {position}) outside its write sets"
            else:
                extra, why = held, "although it is not in the segment's ensemble"
            if extra:
                size = estimated_bytes(metadata, len(extra))
                found.append(
                    Violation(
                        Category.OVER_REPLICATED,
                        index,
                        bookie,
                        len(extra),
                        f"bookie {bookie} holds {len(extra)} entries of segment {index} {why} "
                        f"({_entries(extra)}), about {size} bytes: extra copies, not a violation",
                        size,
                    )
                )
    return found


def estimated_bytes(metadata: LedgerMetadata, entries: int) -> int:
    """Bytes of `entries` copies of the ledger's entries, at its mean entry size (its length
    over its entries, rounded down): availability says which entries a bookie holds, not
    their sizes. Payload bytes, without the header and digest each copy also stores."""
    count = metadata.last_entry_id + 1
    return entries * metadata.length // count if count > 0 else 0


def deletion_stuck(
    tombstone: Tombstone,
    held: Mapping[str, EntryAvailability],
    *,
    now_ms: int,
    stuck_after: int,
) -> list[Violation]:
    """The deletion_stuck rows of a tombstoned ledger, by bookie: one per bookie of `held`
    (what the bookies that answered hold of the ledger) that holds any of it once the
    tombstone is `stuck_after` seconds old (the cluster's `deletion_stuck_after`).

    Every bookie drops a tombstoned ledger's data at its next garbage collection, named by
    the tombstone or not (`garbage_collection.on_tombstone`); one that still holds it that
    long after has a collection that does not run or fails. Before then the data is on its
    way out: neither stuck nor orphan, no row. The Spark job and the confirmation both call
    this; the auditor's deletion check counts the tombstones still waiting for an
    acknowledgement instead (`Tombstone.stuck`), since it asks no bookie.
    """
    if not tombstone.overdue(now_ms, stuck_after):
        return []
    deletion = tombstone.deletion
    found = []
    for bookie in sorted(held):
        entries = held[bookie]
        if not entries:
            continue
        found.append(
            Violation(
                Category.DELETION_STUCK,
                None,
                bookie,
                len(entries),
                f"bookie {bookie} still holds {len(entries)} entries ({_entries(entries)}) of "
                f"the ledger deleted at {deletion.time_ms} ms ({deletion.reason}) and "
                f"tombstoned {now_ms - tombstone.tombstoned_ms} ms ago, longer than "
                f"deletion_stuck_after ({stuck_after} s); {_acknowledgement(tombstone, bookie)}"
                f": its garbage collection has not dropped them (`tally shell gcstatus "
                f"--bookie {bookie}`)",
            )
        )
    return found


def _acknowledgement(tombstone: Tombstone, bookie: str) -> str:
    if bookie not in tombstone.bookies:
        return "the tombstone does not name it (a copy the delete path did not know of)"
    acknowledged = tombstone.bookies[bookie]
    if acknowledged is None:
        return "the tombstone names it and waits for its acknowledgement"
    return f"it acknowledged the tombstone at {acknowledged} ms, yet holds them"


def potentially_faulty(
    ensembles: Sequence[Sequence[str]], silent: Iterable[str]
) -> list[Violation]:
    """The potentially_faulty rows of a ledger whose `silent` bookies (those of its segments
    with entries that did not answer) went unjudged: one per bookie, in order, naming the
    segments it is in."""
    found = []
    for bookie in sorted(silent):
        segments = [str(index) for index, ensemble in enumerate(ensembles) if bookie in ensemble]
        found.append(
            Violation(
                Category.POTENTIALLY_FAULTY,
                None,
                bookie,
                None,
                f"bookie {bookie} of segment(s) {', '.join(segments)} did not report its "
                f"entries; its copies are not judged",
            )
        )
    return found


def _placement(
    metadata: LedgerMetadata,
    racks: Mapping[str, str],
    min_racks: int,
    cluster_racks: int | None,
) -> list[Violation]:
    wq = metadata.write_quorum
    found = []
    for index, (segment, first, last) in enumerate(metadata.segments_with_bounds()):
        assert last is not None  # closed ledger
        if last < first:
            continue
        placed = [rack_of(racks, bookie) for bookie in segment.ensemble]
        in_cluster = cluster_racks if cluster_racks is not None else len({*racks.values(), *placed})
        category = _OF_ADHERENCE.get(adherence_of_racks(placed, wq, min_racks, in_cluster))
        if category is None:
            continue
        need = (
            racks_required(wq, min_racks, in_cluster)
            if category is Category.PLACEMENT_FAIL
            else min(wq, in_cluster)
        )
        found.append(
            Violation(
                category,
                index,
                None,
                None,
                f"segment {index} (entries {first}..{last}) on racks {placed}: a write set of "
                f"WQ={wq} spans {fewest_racks_per_write_set(placed, wq)} racks, fewer than "
                f"{need} (min racks {min_racks}, {in_cluster} racks in the cluster)",
            )
        )
    return found


def _entries(entries: Iterable[int]) -> str:
    shown = list(itertools.islice(entries, SHOWN_ENTRIES + 1))
    text = ", ".join(str(entry) for entry in shown[:SHOWN_ENTRIES])
    return f"entries {text}, ..." if len(shown) > SHOWN_ENTRIES else f"entries {text}"
