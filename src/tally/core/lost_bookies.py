"""Lost bookies: which bookies the auditor counts as lost, since when, and when it must act.

A bookie is lost when it matters (some ledger's segment holding entries names it, or it
was seen registered) and is now neither writable nor read-only. Marking its ledgers starts
copying, which a bookie back after a restart makes useless, hence BookKeeper's
`lost_bookie_recovery_delay`: its ledgers are marked only once it has stayed lost that
long, and not at all if it comes back first. Two bookies lost at once are not waited for
(another loss could leave entries with no copy at all): as soon as more than one bookie is
pending, every pending bookie is due at once, and stays due even if one of them returns.

An operator may change the delay while bookies are pending: each deadline is then measured
again from when its bookie was lost (so a shorter delay can make it due at once), where
BookKeeper restarts the whole new delay from the change.

After its ledgers are marked, a bookie stays listed (state MARKED) until it comes back or
a metadata scan no longer finds it in any ledger (its copies were all moved elsewhere).

The state machine takes times as arguments (seconds, any clock) and does no I/O.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from tally.core.errors import BadRequest
from tally.core.ledger_metadata import LedgerMetadata, LedgerState


class LostBookieState(enum.Enum):
    PENDING = "pending"
    """Waiting for its deadline before its ledgers are marked."""
    MARKED = "marked"
    """Its ledgers were marked under-replicated."""


@dataclass(frozen=True, slots=True)
class LostBookie:
    bookie_id: str
    since: float
    """When the bookie was first found lost (this time)."""
    deadline: float
    """When its ledgers are due to be marked."""
    state: LostBookieState = LostBookieState.PENDING
    escalated_at: float | None = None
    """When another bookie was lost too, which made this one due at once."""
    marked_at: float | None = None


@dataclass(frozen=True, slots=True)
class LostBookiesChange:
    """What one event changed, for the auditor to log."""

    lost: tuple[LostBookie, ...] = ()
    """Newly lost bookies (as they are after the event, escalation included)."""
    returned: tuple[LostBookie, ...] = ()
    """Lost bookies that are registered again; PENDING ones are cancelled."""
    forgotten: tuple[LostBookie, ...] = ()
    """MARKED bookies that no ledger names any more."""
    escalated: tuple[LostBookie, ...] = ()
    """Pending bookies made due at once because more than one bookie is pending."""
    rescheduled: tuple[LostBookie, ...] = ()
    """Pending bookies whose deadline moved with a change of the delay."""


def _check_delay(delay: float) -> float:
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise BadRequest(f"lost bookie recovery delay must be a number of seconds, not {delay!r}")
    if not math.isfinite(delay) or delay < 0:
        raise BadRequest(f"lost bookie recovery delay must be >= 0 seconds, got {delay}")
    return float(delay)


def _ids(bookies: Iterable[str]) -> frozenset[str]:
    if isinstance(bookies, str):
        raise BadRequest(f"expected a collection of bookie ids, not one str {bookies!r}")
    return frozenset(bookies)


class LostBookies:
    """The lost bookies and their deadlines, fed with registrations and metadata scans."""

    def __init__(self, delay: float) -> None:
        self._delay = _check_delay(delay)
        self._registered: frozenset[str] = frozenset()
        self._seen: set[str] = set()
        """Bookies seen registered (and not forgotten since)."""
        self._named: frozenset[str] = frozenset()
        """Bookies the last metadata scan found holding some ledger's entries."""
        self._lost: dict[str, LostBookie] = {}

    @property
    def delay(self) -> float:
        return self._delay

    @property
    def registered(self) -> frozenset[str]:
        return self._registered

    @property
    def lost(self) -> Mapping[str, LostBookie]:
        return MappingProxyType(self._lost)

    def is_lost(self, bookie_id: str) -> bool:
        return bookie_id in self._lost

    # -- events ------------------------------------------------------------------------------

    def registered_changed(self, registered: Iterable[str], now: float) -> LostBookiesChange:
        """The writable and read-only bookies are now exactly `registered`."""
        self._registered = _ids(registered)
        self._seen |= self._registered
        return self._settle(now)

    def named_in_metadata(self, named: Iterable[str], now: float) -> LostBookiesChange:
        """A full metadata scan found exactly `named` holding ledgers' entries.

        A MARKED bookie not among them is forgotten: no ledger needs it any more.
        """
        self._named = _ids(named)
        forgotten = tuple(
            bookie
            for bookie in self._lost.values()
            if bookie.state is LostBookieState.MARKED and bookie.bookie_id not in self._named
        )
        for bookie in forgotten:
            self._seen.discard(bookie.bookie_id)
            del self._lost[bookie.bookie_id]
        change = self._settle(now)
        return replace(change, forgotten=forgotten)

    def delay_changed(self, delay: float, now: float) -> LostBookiesChange:
        """Measure every pending deadline again with the new delay."""
        self._delay = _check_delay(delay)
        rescheduled = []
        for bookie in self._pending():
            deadline = self._deadline(bookie.since, bookie.escalated_at)
            if deadline != bookie.deadline:
                self._lost[bookie.bookie_id] = replace(bookie, deadline=deadline)
                rescheduled.append(self._lost[bookie.bookie_id])
        return LostBookiesChange(rescheduled=tuple(rescheduled))

    def marked(self, bookie_ids: Iterable[str], now: float) -> tuple[LostBookie, ...]:
        """The ledgers of these bookies were marked; those still lost become MARKED."""
        done = []
        for bookie_id in sorted(_ids(bookie_ids)):
            bookie = self._lost.get(bookie_id)
            if bookie is not None:
                self._lost[bookie_id] = replace(bookie, state=LostBookieState.MARKED, marked_at=now)
                done.append(self._lost[bookie_id])
        return tuple(done)

    # -- queries -----------------------------------------------------------------------------

    def due(self, now: float) -> tuple[LostBookie, ...]:
        """PENDING bookies whose deadline has come: their ledgers must be marked now."""
        return tuple(bookie for bookie in self._pending() if bookie.deadline <= now)

    def past_deadline(self, now: float) -> tuple[LostBookie, ...]:
        """Lost bookies whose ledgers should be marked by now: due ones and MARKED ones
        (the bookie check marks these again, should a mark have gone missing)."""
        return tuple(
            bookie
            for bookie in sorted(self._lost.values(), key=lambda b: b.bookie_id)
            if bookie.state is LostBookieState.MARKED or bookie.deadline <= now
        )

    def next_deadline(self) -> float | None:
        """The earliest deadline of a PENDING bookie, or None when none is pending."""
        return min((bookie.deadline for bookie in self._pending()), default=None)

    # -- internals ---------------------------------------------------------------------------

    def _pending(self) -> list[LostBookie]:
        return sorted(
            (b for b in self._lost.values() if b.state is LostBookieState.PENDING),
            key=lambda b: b.bookie_id,
        )

    def _deadline(self, since: float, escalated_at: float | None) -> float:
        deadline = since + self._delay
        return deadline if escalated_at is None else min(deadline, escalated_at)

    def _settle(self, now: float) -> LostBookiesChange:
        """Bring the lost set in line with the registrations and the names, then escalate."""
        should_be_lost = (self._seen | self._named) - self._registered
        returned = tuple(
            self._lost.pop(bookie_id) for bookie_id in sorted(self._lost.keys() - should_be_lost)
        )
        new_ids = sorted(should_be_lost - self._lost.keys())
        for bookie_id in new_ids:
            self._lost[bookie_id] = LostBookie(bookie_id, now, self._deadline(now, None))
        pending = self._pending()
        escalated = []
        if len(pending) > 1:
            for bookie in pending:
                if bookie.escalated_at is None:
                    self._lost[bookie.bookie_id] = replace(
                        bookie, escalated_at=now, deadline=self._deadline(bookie.since, now)
                    )
                    if bookie.bookie_id not in new_ids:
                        escalated.append(self._lost[bookie.bookie_id])
        return LostBookiesChange(
            lost=tuple(self._lost[bookie_id] for bookie_id in new_ids),
            returned=returned,
            escalated=tuple(escalated),
        )


def bookies_holding_entries(metadata: LedgerMetadata) -> frozenset[str]:
    """The bookies of the segments that hold or may still receive entries: every segment of
    an open ledger, and of a closed one all but an empty trailing segment (nothing
    acknowledged there, so a bookie lost from it costs no copy). None of a DELETED ledger:
    it is not repaired, so losing its copies marks nothing."""
    if metadata.state is LedgerState.DELETED:
        return frozenset()
    return frozenset(
        bookie
        for segment, first, last in metadata.segments_with_bounds()
        if last is None or first <= last
        for bookie in segment.ensemble
    )
