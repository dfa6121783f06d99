"""What a bookie's garbage collection may drop, decided from what it read, never from absence.

Two reasons only let a bookie drop a ledger's data:

- a tombstone for the ledger (`on_tombstone`): the delete path's explicit, recorded
  decision; the bookie drops the data, then acknowledges;
- over-replication of a CLOSED ledger whose metadata it read (`overreplication_trim`): the
  ledger's ensembles no longer name this bookie (a repair moved its copies elsewhere), or
  the bookie holds entries of a segment that no write set of its position puts there.

A ledger with no metadata and no tombstone is an orphan: reported, kept, until an operator
deletes it. A DELETED ledger keeps its data (it may be undeleted), and so does an OPEN or
IN_RECOVERY one (its ensemble may still change under its writer or its recovery).
"""

from __future__ import annotations

import dataclasses
import enum

from tally.core.availability import EntryAvailability
from tally.core.deletion import Tombstone
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.core.schedule import expected_entries


class TombstoneAction(enum.Enum):
    DROP_THEN_ACKNOWLEDGE = "drop the ledger's data, then acknowledge"
    ACKNOWLEDGE = "acknowledge: nothing of the ledger is here"
    NOTHING = "nothing to do"


def on_tombstone(tombstone: Tombstone, bookie_id: str, holds_ledger: bool) -> TombstoneAction:
    """What a bookie does with a tombstone it read. Any bookie that holds the ledger's data
    drops it, named or not (a copy the checks never saw); it acknowledges what it dropped
    and, when named, that it holds nothing."""
    if holds_ledger:
        return TombstoneAction.DROP_THEN_ACKNOWLEDGE
    if bookie_id in tombstone.pending:
        return TombstoneAction.ACKNOWLEDGE
    return TombstoneAction.NOTHING


@dataclasses.dataclass(frozen=True, slots=True)
class Trim:
    """What of an over-replicated ledger a bookie may drop."""

    whole_ledger: bool
    """No segment names this bookie: every entry and the ledger's state go."""
    entries: EntryAvailability
    """Otherwise, the entries of its segments outside this bookie's write sets."""


def overreplication_trim(
    metadata: LedgerMetadata, bookie_id: str, held: EntryAvailability
) -> Trim | None:
    """What `bookie_id`, holding `held` of the ledger, may drop as extra copies; None: nothing.

    Entries past a closed ledger's end belong to no segment and are kept: they were never
    acknowledged, and dropping them would erase the evidence of a truncation.
    """
    if metadata.state is not LedgerState.CLOSED:
        return None
    if bookie_id not in metadata.bookies():
        return Trim(True, held)
    extra = EntryAvailability.empty()
    e, wq = metadata.ensemble_size, metadata.write_quorum
    for segment, first, last in metadata.segments_with_bounds():
        if last is None or last < first:
            continue
        here = held.intersection(EntryAvailability.span(first, last))
        if not here:
            continue
        if bookie_id in segment.ensemble:
            position = segment.ensemble.index(bookie_id)
            here = here.difference(expected_entries(first, last, e, wq, position))
        extra = extra.union(here)
    return Trim(False, extra) if extra else None


def due(last_run: float | None, interval: float, now: float) -> bool:
    """Whether a periodic step is due: never run yet, or `interval` seconds since its last run."""
    return last_run is None or now - last_run >= interval
