"""Which ledgers a bookie puts in limbo, and when it may take one out (BookKeeper's BP-46).

A ledger is in limbo on a bookie that may have lost some of its entries (a damaged journal):
until it is repaired, the bookie answers "unknown" where it would answer "no such entry",
since that answer lets a recovery truncate the ledger (seed 003). It is repaired once the
ledger is closed, so its entries are known, and the bookie holds every entry that the
ledger's segments give its ensemble positions. Entries it holds beyond those, or past the
ledger's end, do no harm.

Which ledgers go in: a journal replay that finds damage cannot know which records it lost.
Every ledger with a record in a damaged file after the last checkpoint may have lost one. If
no intact record of a damaged file names any ledger, nothing narrows it down, and every
ledger the bookie knows goes into limbo.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from tally.core.availability import EntryAvailability
from tally.core.durability import check_ledger
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata


def ledgers_to_limbo(
    damaged_files: Collection[int],
    ledgers_by_file: Mapping[int, Collection[LedgerId]],
    known_ledgers: Callable[[], Iterable[LedgerId]],
) -> set[LedgerId]:
    """The ledgers that a replay which found damage in `damaged_files` may have lost records
    of; `ledgers_by_file` names the ledgers of the records replayed from each file."""
    limbo: set[LedgerId] = set()
    for file_id in damaged_files:
        named = ledgers_by_file.get(file_id, ())
        if not named:
            return set(known_ledgers())
        limbo.update(named)
    return limbo


class LimboVerdict(enum.Enum):
    WHOLE = "whole"
    """Closed, and the bookie holds all it should: it leaves limbo."""
    MISSING = "missing"
    """Closed, and entries the bookie should hold are missing: it stays, marked for repair."""
    OPEN = "open"
    """Not closed: which entries exist is not settled yet, so the bookie stays in limbo."""


@dataclass(frozen=True, slots=True)
class LimboCheck:
    verdict: LimboVerdict
    missing: EntryAvailability
    """The entries the bookie lacks (MISSING only)."""


def check_limbo(metadata: LedgerMetadata, bookie_id: str, held: EntryAvailability) -> LimboCheck:
    """Judge one ledger in limbo on `bookie_id`, which holds `held` of it."""
    if not metadata.is_closed:
        return LimboCheck(LimboVerdict.OPEN, EntryAvailability.empty())
    missing = EntryAvailability.empty()
    for finding in check_ledger(metadata, {bookie_id: held}).findings:
        if finding.bookie_id == bookie_id:
            missing = missing.union(finding.missing)
    if missing:
        return LimboCheck(LimboVerdict.MISSING, missing)
    return LimboCheck(LimboVerdict.WHOLE, missing)
