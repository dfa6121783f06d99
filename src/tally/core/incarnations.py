"""Bookie incarnations: which bookies came back as a new incarnation under the same id.

A bookie's cookie gets a new incarnation id each time the bookie is formatted, which it
is only with empty directories (`tally.bookie.cookie_check`). So a bookie id whose
incarnation differs from the one the auditor remembers lost every copy it held, even if
it is registered and up again: the ledgers with a segment on it must be marked, which the
lost-bookie path never does for a bookie that came back within its delay.

The auditor marks those ledgers first and remembers the new incarnation after, so a crash
in between finds the change again and marks again rather than forgets. A bookie seen for
the first time is only remembered: there is nothing to compare it with. A bookie without a
cookie (deleted by an operator, or not yet formatted) keeps its remembered incarnation,
so that the format that follows is seen as the change it is.

No I/O here: the auditor reads both sides from the store.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class IncarnationChange:
    bookie_id: str
    remembered: str | None
    """The incarnation remembered; None when none was (first seen) or its record does not
    decode (then the bookie counts as changed: an unknown past is never a clean one)."""
    current: str
    """The incarnation in the bookie's cookie now."""


@dataclass(frozen=True, slots=True)
class IncarnationReview:
    first_seen: tuple[IncarnationChange, ...] = ()
    """Bookies remembered by no record: remember them, mark nothing."""
    changed: tuple[IncarnationChange, ...] = ()
    """Bookies formatted anew since remembered: mark their ledgers, then remember them."""

    def __bool__(self) -> bool:
        return bool(self.first_seen or self.changed)


def review_incarnations(
    remembered: Mapping[str, str | None],
    current: Mapping[str, str],
    registered: Collection[str] | None = None,
) -> IncarnationReview:
    """Compare the remembered incarnations (bookie id -> incarnation id, None for a record
    that does not decode) with the cookies' (bookie id -> incarnation id), by bookie id.

    With `registered` (the bookies registered now), a changed bookie counts only once it
    is registered: a bookie formats its cookie before it registers, and a mark made in
    between would name a bookie that is not there, which the replication worker takes for
    lost and replaces, where copying back onto the new incarnation was wanted. Its
    registration wakes the auditor again."""
    first_seen, changed = [], []
    for bookie_id in sorted(current):
        incarnation = current[bookie_id]
        if bookie_id not in remembered:
            first_seen.append(IncarnationChange(bookie_id, None, incarnation))
        elif remembered[bookie_id] != incarnation and (
            registered is None or bookie_id in registered
        ):
            changed.append(IncarnationChange(bookie_id, remembered[bookie_id], incarnation))
    return IncarnationReview(tuple(first_seen), tuple(changed))
