"""What the online replicas check decides about one ledger, beyond `check_ledger`'s verdict.

BP-34 leaves a few rules to the checker itself, and they are kept here so they hold the
same everywhere and can be tested without bookies:

- A ledger already marked under-replicated is being repaired and is skipped, unless it has
  been marked for longer than the grace period, which is a finding of its own
  (`ledger_audit.marked_too_long`, the Spark job's rule too: a grace period of 0 turns that
  report off, as in BookKeeper).
- Bookies are asked once per ledger, even when they serve several segments, and only those
  of segments that hold entries (an empty trailing segment protects nothing).
- A bookie that did not answer and is no longer registered is lost: it is counted as
  holding nothing, so the ledger is judged by the copies on the bookies that answered.
  Marking for a lost bookie is the bookie check's business (it honours
  `lost_bookie_recovery_delay`), so the mark names only answering bookies that lack
  copies. A registered bookie that did not answer is not judged at all (unknown is never
  negative): the ledger is potentially faulty.
- Extra copies on the bookies that answered are over-replication (`over_replicated`, the
  Spark job's own rows): counted apart from the categories, never marked.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass

from tally.core.availability import EntryAvailability
from tally.core.durability import LedgerDurability, check_ledger
from tally.core.errors import BadRequest
from tally.core.ledger_audit import Category, Violation, over_replicated
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.core.schedule import expected_entries

SpanKey = tuple[tuple[int, int, int], ...]
"""A bookie's segments with entries: (first, last, its position in the ensemble) each."""

SHOWN_RANGES = 4
"""Runs of entries a description names per bookie before it says "...": enough to look."""

REPLICAS_CATEGORIES = (
    Category.NO_REPLICA,
    Category.BELOW_ACK_QUORUM,
    Category.BELOW_WRITE_QUORUM,
    Category.UNDERREPLICATED_TOO_LONG,
    Category.UNRESPONSIVE_REGISTERED_BOOKIE,
    Category.POTENTIALLY_FAULTY,
)
"""The violations the replicas check counts (placement is the placement check's);
over-replication is counted apart."""


@dataclass(frozen=True, slots=True)
class ReplicasJudgement:
    """The replicas check's verdict on one closed ledger."""

    durability: LedgerDurability
    categories: tuple[Category, ...]
    """What the ledger is reported for, worst first; empty when it is healthy."""
    mark_bookies: frozenset[str]
    """Answering bookies that lack copies: the ledger is marked naming them (none: no mark)."""
    lost_bookies: frozenset[str]
    """Unregistered bookies that did not answer, counted as holding nothing."""
    over_replicated: tuple[Violation, ...]
    """Extra copies on the bookies that answered, as the audit's over_replicated rows."""

    @property
    def noteworthy(self) -> bool:
        """Whether there is anything to report: a violation, or extra copies to count."""
        return bool(self.categories or self.over_replicated)

    @property
    def unresponsive_bookies(self) -> frozenset[str]:
        """Registered bookies that did not answer: their copies are not judged."""
        return self.durability.unresponsive_bookies


def checkable(metadata: LedgerMetadata) -> bool:
    """Whether the replicas check judges this ledger: closed, with entries (BP-34)."""
    return metadata.state is LedgerState.CLOSED and metadata.last_entry_id >= 0


def bookies_to_ask(metadata: LedgerMetadata) -> frozenset[str]:
    """Every bookie of a segment that holds entries, each once."""
    return frozenset(
        bookie
        for segment, first, last in metadata.segments_with_bounds()
        if last is not None and last >= first
        for bookie in segment.ensemble
    )


def holds_schedule_exactly(metadata: LedgerMetadata, held: Mapping[str, bytes]) -> bool:
    """Whether the bookies to ask, and only they, answered with exactly the entries their
    write sets put there (`held`: each answer's availability encoding, canonical as
    EntryAvailability writes it). Then `judge_ledger` finds nothing to report: no entry
    lacks a copy and none is extra. A shortcut for the healthy ledger, with no decoding and
    no set operation; any other answer is judged in full."""
    expected = scheduled_encodings(metadata)
    return held.keys() == expected.keys() and all(
        held[bookie] == encoding for bookie, encoding in expected.items()
    )


def scheduled_encodings(metadata: LedgerMetadata) -> dict[str, bytes]:
    """Each bookie to ask, with the encoding of the entries its write sets put there."""
    spans: dict[str, list[tuple[int, int, int]]] = {}
    for segment, first, last in metadata.segments_with_bounds():
        if last is None or last < first:
            continue
        for position, bookie in enumerate(segment.ensemble):
            spans.setdefault(bookie, []).append((first, last, position))
    e, wq = metadata.ensemble_size, metadata.write_quorum
    return {bookie: _scheduled_bytes(e, wq, tuple(held)) for bookie, held in spans.items()}


@functools.lru_cache(maxsize=4096)
def _scheduled_bytes(ensemble_size: int, write_quorum: int, spans: SpanKey) -> bytes:
    """Ledgers of one shape (quorums, segment bounds, positions) share their schedule."""
    held = EntryAvailability.empty()
    for first, last, position in spans:
        held = held.union(expected_entries(first, last, ensemble_size, write_quorum, position))
    return held.to_bytes()


def judge_ledger(
    metadata: LedgerMetadata,
    answers: Mapping[str, EntryAvailability],
    lost: Collection[str] = (),
) -> ReplicasJudgement:
    """Judge a closed ledger with entries on what its bookies answered.

    `answers` maps each bookie that answered to the entries it holds of the ledger (empty
    when it has none). Of the bookies to ask that are absent from it, those in `lost` are
    no longer registered and count as holding nothing; the others are unresponsive.
    """
    if not checkable(metadata):
        raise BadRequest(
            f"the replicas check judges closed ledgers with entries; this one is "
            f"{metadata.state.name} with last entry {metadata.last_entry_id}"
        )
    gone = (bookies_to_ask(metadata) - answers.keys()).intersection(lost)
    empty = EntryAvailability.empty()
    verdict = check_ledger(metadata, {**answers, **dict.fromkeys(gone, empty)})
    categories: list[Category] = []
    if verdict.category is not None:
        categories.append(Category(verdict.category.value))
    if verdict.potentially_faulty:
        categories.append(Category.POTENTIALLY_FAULTY)
    mark = frozenset(
        finding.bookie_id
        for finding in verdict.findings
        if finding.missing and finding.bookie_id in answers
    )
    extra = tuple(over_replicated(metadata, answers))
    return ReplicasJudgement(verdict, tuple(categories), mark, frozenset(gone), extra)


def describe(metadata: LedgerMetadata, judgement: ReplicasJudgement) -> str:
    """Everything an operator needs to understand a judgement, on one line."""
    e, wq, aq = metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum
    verdict = judgement.durability
    bounds = metadata.segment_bounds()
    parts = [
        f"E={e} WQ={wq} AQ={aq}, entries 0..{metadata.last_entry_id}, "
        f"fewest copies {verdict.fewest_copies} of {wq}"
    ]
    for finding in verdict.findings:
        first, last = bounds[finding.segment_index]
        where = (
            f"segment {finding.segment_index} (entries {first}..{last}) bookie "
            f"{finding.bookie_id} (position {finding.position}"
            f"{', lost' if finding.bookie_id in judgement.lost_bookies else ''})"
        )
        parts.append(f"{where} lacks {len(finding.missing)}: {entry_ranges(finding.missing)}")
    parts += [row.detail for row in judgement.over_replicated]
    if judgement.lost_bookies:
        parts.append(
            f"unregistered bookies {sorted(judgement.lost_bookies)} did not answer: counted as "
            "holding nothing, their marking left to the bookie check"
        )
    if judgement.unresponsive_bookies:
        parts.append(
            f"registered bookies {sorted(judgement.unresponsive_bookies)} did not answer: "
            "their copies are not judged"
        )
    return "; ".join(parts)


def entry_ranges(entries: EntryAvailability, shown: int = SHOWN_RANGES) -> str:
    """The first `shown` runs of `entries` as "first..last" (or one id), then "..." if more."""
    runs = list(itertools.islice(_runs(entries), shown + 1))
    text = ", ".join(
        str(start) if start == last else f"{start}..{last}" for start, last in runs[:shown]
    )
    return f"{text}, ..." if len(runs) > shown else text


def _runs(entries: EntryAvailability) -> Iterator[tuple[int, int]]:
    """(first, last) of each maximal run of consecutive entries, in order (the encoding cuts
    runs longer than an int32 into touching pieces, which are joined again here)."""
    pending: tuple[int, int] | None = None
    for first, last, size, period in entries.groups:
        for start in range(first, last + 1, period or 1):
            if pending is not None and start == pending[1] + 1:
                pending = (pending[0], start + size - 1)
                continue
            if pending is not None:
                yield pending
            pending = (start, start + size - 1)
    if pending is not None:
        yield pending
