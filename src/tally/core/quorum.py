"""Quorum rules: when an add is confirmed, when fencing suffices, when recovery may close.

Each rule is a count over bookies' answers, so each is a pure function or a small state
machine fed one answer at a time; the asyncio client only sends requests and feeds the
answers in.

Quorum coverage is the idea behind both recovery rules. A property has coverage over a
cohort of bookies when every ack quorum (any AQ bookies) inside the cohort holds at least
one bookie with the property. Put the other way round: fewer than AQ bookies of the cohort
lack it, which as a count is `cohort size - AQ + 1` bookies with the property. A bookie that
has not answered, or answered with an error, counts as lacking the property: silence and
failures prove nothing about what it stores.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from tally.core.answers import Answer
from tally.core.errors import BadRequest
from tally.core.schedule import check_quorums, stores_entry, write_set


def coverage_threshold(cohort_size: int, ack_quorum: int) -> int:
    """How many bookies of a cohort must have a property for it to reach quorum coverage.

    With `k` bookies lacking the property, some ack quorum lies wholly among them exactly
    when `k >= ack_quorum`; so coverage needs `k <= ack_quorum - 1`, that is at least
    `cohort_size - ack_quorum + 1` bookies with it.
    """
    if not cohort_size >= ack_quorum >= 1:
        raise BadRequest(
            f"need cohort size >= ack quorum >= 1, got cohort size {cohort_size}, AQ={ack_quorum}"
        )
    return cohort_size - ack_quorum + 1


class RecoveryReadDecision(Enum):
    """Recovery's verdict on one entry beyond the highest known LAC."""

    RECOVERABLE = "recoverable"
    """A verified copy exists: recovery re-writes the entry and reads on."""
    UNRECOVERABLE = "unrecoverable"
    """No ack quorum of the write set can hold the entry: the ledger ends before it."""
    WAIT = "wait"
    """Outstanding answers may still settle it either way."""
    ABORT = "abort"
    """Every bookie answered and neither rule holds: leave the ledger IN_RECOVERY, retry."""


def decide_recovery_read(
    write_quorum: int, ack_quorum: int, responses: Mapping[int, Answer]
) -> RecoveryReadDecision:
    """Decide one entry from the answers of its write set so far (keyed by ensemble position).

    Generous on positives, strict on closing: one positive is enough to recover the entry,
    even beside negatives, because re-writing an entry the writer never confirmed is
    harmless while dropping one it did confirm truncates the ledger. Closing needs quorum
    coverage of explicit negatives over the write set, `WQ - AQ + 1` of them: only then can
    no AQ bookies of the write set have acknowledged it. A single outstanding bookie might
    still answer positively, so the verdict is ABORT only once all WQ have answered.
    """
    needed = coverage_threshold(write_quorum, ack_quorum)
    if len(responses) > write_quorum:
        raise BadRequest(
            f"{len(responses)} responses for a write set of {write_quorum} bookies "
            f"(positions {sorted(responses)})"
        )
    answers = list(responses.values())
    if Answer.POSITIVE in answers:
        return RecoveryReadDecision.RECOVERABLE
    if answers.count(Answer.NEGATIVE) >= needed:
        return RecoveryReadDecision.UNRECOVERABLE
    if len(answers) == write_quorum:
        return RecoveryReadDecision.ABORT
    return RecoveryReadDecision.WAIT


class RecoveryRead:
    """The recovery read of one entry: collects its write set's answers until a verdict.

    The first verdict other than WAIT is final, as the client acts on it at once; answers
    arriving afterwards are ignored.
    """

    def __init__(
        self, entry_id: int, ensemble_size: int, write_quorum: int, ack_quorum: int
    ) -> None:
        check_quorums(ensemble_size, write_quorum, ack_quorum)
        self.entry_id = entry_id
        self.write_set = write_set(entry_id, ensemble_size, write_quorum)
        self._ack_quorum = ack_quorum
        self._responses: dict[int, Answer] = {}
        self._decision = RecoveryReadDecision.WAIT

    @property
    def decision(self) -> RecoveryReadDecision:
        return self._decision

    def record(self, position: int, response: Answer) -> RecoveryReadDecision:
        """Take one bookie's answer and return the verdict so far."""
        if position not in self.write_set:
            raise BadRequest(
                f"position {position} is not in the write set {self.write_set} "
                f"of entry {self.entry_id}"
            )
        if self._decision is not RecoveryReadDecision.WAIT:
            return self._decision
        if position in self._responses:
            raise BadRequest(f"position {position} already answered for entry {self.entry_id}")
        self._responses[position] = response
        self._decision = decide_recovery_read(
            len(self.write_set), self._ack_quorum, self._responses
        )
        return self._decision


class FencingTracker:
    """The fencing LAC reads of ledger recovery, over the last segment's ensemble.

    When is fencing enough? The old writer can confirm an add only with AQ acks from the
    entry's write set, and every write set is a round-robin window of WQ positions. So it is
    stopped once no write set holds AQ bookies that may still be unfenced: in each window
    at least `WQ - AQ + 1` fenced bookies (quorum coverage with the write set as cohort).
    It cannot escape to other bookies, because an ensemble change is a metadata update and
    the ledger is already IN_RECOVERY.

    The usual statement takes the whole ensemble as the cohort: `E - AQ + 1` fenced bookies.
    That leaves at most AQ - 1 unfenced anywhere, hence in every window, so it always
    implies the rule above, and equals it when WQ = E (the one write set is the ensemble).
    With WQ < E it asks for more than safety needs: with E=4, WQ=2, AQ=2, fencing positions
    0 and 2 covers every window although E - AQ + 1 = 3. This tracker applies the per write
    set rule, as BookKeeper does.

    Answers count as fenced when explicit, positive or negative. This relies on a contract
    of the bookie: a fencing read records the fence durably before anything is looked up,
    creating the ledger's fence record if the bookie has never seen the ledger, so its
    NoSuchEntry or NoSuchLedger is spoken by a fenced bookie. Negatives carry no LAC.
    Unknown answers count as unfenced: a timed-out bookie may never have seen the request.
    """

    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
        check_quorums(ensemble_size, write_quorum, ack_quorum)
        self.ensemble_size = ensemble_size
        self._write_sets = {
            frozenset(write_set(first, ensemble_size, write_quorum))
            for first in range(ensemble_size)
        }
        self._needed = coverage_threshold(write_quorum, ack_quorum)
        self._responses: dict[int, Answer] = {}
        self._max_lac = -1

    def record(self, position: int, response: Answer, lac: int | None = None) -> None:
        """Take one bookie's answer; a positive one carries that bookie's LAC (-1: none)."""
        if not 0 <= position < self.ensemble_size:
            raise BadRequest(f"position {position} is outside the ensemble of {self.ensemble_size}")
        if position in self._responses:
            raise BadRequest(f"position {position} already answered the fencing read")
        if response is Answer.POSITIVE:
            if lac is None or lac < -1:
                raise BadRequest(f"a positive fencing answer needs a LAC >= -1, got {lac}")
            self._max_lac = max(self._max_lac, lac)
        elif lac is not None:
            raise BadRequest(f"a {response.value} fencing answer carries no LAC, got {lac}")
        self._responses[position] = response

    @property
    def fenced(self) -> frozenset[int]:
        """Positions known to be fenced."""
        return frozenset(p for p, r in self._responses.items() if r is not Answer.UNKNOWN)

    @property
    def is_complete(self) -> bool:
        """Whether the old writer can no longer confirm any add."""
        return self._covers(self.fenced)

    @property
    def can_still_complete(self) -> bool:
        """False once unknown answers alone leave some write set AQ bookies unfenced."""
        unknown = {p for p, r in self._responses.items() if r is Answer.UNKNOWN}
        return self._covers(frozenset(range(self.ensemble_size)) - unknown)

    @property
    def max_lac(self) -> int:
        """The highest LAC a fenced bookie reported, -1 if none: where recovery reads start."""
        return self._max_lac

    def _covers(self, fenced: frozenset[int]) -> bool:
        return all(len(ws & fenced) >= self._needed for ws in self._write_sets)


@dataclass(slots=True)
class _Add:
    """One entry's answers, a bit per ensemble position in each mask: a writer keeps one
    per add in flight, so they are ints rather than two sets made for every entry."""

    write_set: tuple[int, ...]
    acked: int = 0
    failed: int = 0

    def settled(self) -> bool:
        return (self.acked | self.failed).bit_count() == len(self.write_set)

    def failed_positions(self) -> list[int]:
        return [p for p in self.write_set if self.failed >> p & 1]

    def unanswered(self) -> list[int]:
        answered = self.acked | self.failed
        return sorted(p for p in self.write_set if not answered >> p & 1)


class PendingAdds:
    """A writer's adds in flight: acks per entry, confirmation at AQ, strictly in order.

    Feed it `ack` and `failed` per (entry, ensemble position) and call `release` for the
    entries newly confirmed: the longest gap-free run after the LAC whose entries each have
    AQ acks, so the LAC never passes an entry short of AQ. Releasing is a separate call so
    that the client can hold it during an ensemble change, whose new segment starts at
    LAC + 1 and must not see the LAC move.

    The first answer per (entry, position) stands: a late ack after a timeout was counted as
    a failure is ignored (the copy is treated as missing, which is safe), and an error after
    an ack does not erase the copy. `replace` clears a position for the unconfirmed entries
    so the new bookie's answers count. Positions mean the bookie of the entry's own segment:
    the client drops answers from a bookie replaced since it sent the request.

    Write errors on entries that are confirmed, or get confirmed despite them (WQ > AQ), are
    not ignored: they are collected for `take_under_replicated`, as the new segment cannot
    cover entries at or below the LAC.

    A confirmed entry's copies beyond AQ may still be in flight: the entry is kept until
    each has answered. A closing writer waits for them (`copies_in_flight`), and when it
    can wait no longer, `give_up` counts the silent ones as failed, since a bookie that did
    not answer may not have the copy; they are then reported like any other such error.
    """

    def __init__(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        last_add_confirmed: int = -1,
    ) -> None:
        check_quorums(ensemble_size, write_quorum, ack_quorum)
        if last_add_confirmed < -1:
            raise BadRequest(f"last add confirmed {last_add_confirmed} is below -1")
        self.ensemble_size = ensemble_size
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self._first_entry_id = last_add_confirmed + 1
        self._lac = last_add_confirmed
        self._next_entry_id = last_add_confirmed + 1
        self._adds: dict[int, _Add] = {}
        self._under_replicated: set[tuple[int, int]] = set()
        self._in_flight = 0
        self._write_sets = tuple(
            write_set(entry_id, ensemble_size, write_quorum) for entry_id in range(ensemble_size)
        )
        """Entry e's write set is the (e mod E)-th: one lookup per add."""

    @property
    def last_add_confirmed(self) -> int:
        return self._lac

    @property
    def next_entry_id(self) -> int:
        return self._next_entry_id

    @property
    def copies_in_flight(self) -> int:
        """Copies of confirmed entries that have not answered yet."""
        return self._in_flight

    @property
    def failed_positions(self) -> frozenset[int]:
        """Positions with a write error on an unconfirmed entry: replace these bookies."""
        return frozenset(
            position
            for entry_id in range(self._lac + 1, self._next_entry_id)
            for position in self._adds[entry_id].failed_positions()
        )

    def add(self, entry_id: int) -> tuple[int, ...]:
        """Start the add of `entry_id`, the next id; returns the positions to send it to."""
        if entry_id != self._next_entry_id:
            raise BadRequest(
                f"entry {entry_id} added, but the next entry id is {self._next_entry_id}"
            )
        positions = self._write_sets[entry_id % self.ensemble_size]
        self._adds[entry_id] = _Add(positions)
        self._next_entry_id += 1
        return positions

    def ack(self, entry_id: int, position: int) -> bool:
        """Record that the bookie at `position` stored `entry_id` (repeats are harmless);
        True when this ack completes the entry after the LAC, so `release` has work: most
        acks (the others of an entry, those of entries behind a gap) leave it nothing."""
        return self.ack_all((entry_id,), position)

    def ack_all(self, entry_ids: Iterable[int], position: int) -> bool:
        """`ack` of each entry in turn, in one call: a receive brings a bookie's answers
        to many entries at once. True when any of them leaves `release` work."""
        adds, lac, quorum = self._adds, self._lac, self.ack_quorum
        # A negative position has no bit: it is never in a write set, and _lookup refuses it.
        bit = 1 << position if position >= 0 else 0
        due = False
        for entry_id in entry_ids:
            add = adds.get(entry_id)
            if add is None or position not in add.write_set:
                add = self._lookup(entry_id, position)
                if add is None:
                    continue
            if (add.acked | add.failed) & bit:
                continue
            add.acked |= bit
            if entry_id <= lac:
                self._in_flight -= 1
                self._forget_if_done(entry_id, add)
            elif entry_id == lac + 1 and add.acked.bit_count() == quorum:
                due = True
        return due

    def failed(self, entry_id: int, position: int) -> None:
        """Record that the bookie at `position` failed to store `entry_id`."""
        add = self._lookup(entry_id, position)
        bit = 1 << position
        if add is None or (add.acked | add.failed) & bit:
            return
        add.failed |= bit
        if entry_id <= self._lac:
            self._in_flight -= 1
            self._under_replicated.add((entry_id, position))
        self._forget_if_done(entry_id, add)

    def release(self) -> tuple[int, ...]:
        """Confirm and return the entries that now extend the LAC, in order."""
        released: list[int] = []
        while (add := self._adds.get(self._lac + 1)) is not None and (
            add.acked.bit_count() >= self.ack_quorum
        ):
            self._lac += 1
            released.append(self._lac)
            self._in_flight += len(add.write_set) - (add.acked | add.failed).bit_count()
            if add.failed:
                self._under_replicated.update(
                    (self._lac, position) for position in add.failed_positions()
                )
            self._forget_if_done(self._lac, add)
        return tuple(released)

    def replace(self, position: int) -> tuple[int, ...]:
        """A new bookie takes `position` from LAC + 1 on: forget that position's answers for
        the unconfirmed entries and return those to re-send to the new bookie."""
        if not 0 <= position < self.ensemble_size:
            raise BadRequest(f"position {position} is outside the ensemble of {self.ensemble_size}")
        resend: list[int] = []
        for entry_id in range(self._lac + 1, self._next_entry_id):
            add = self._adds[entry_id]
            if position in add.write_set:
                add.acked &= ~(1 << position)
                add.failed &= ~(1 << position)
                resend.append(entry_id)
        return tuple(resend)

    def unanswered(self) -> tuple[tuple[int, int], ...]:
        """(entry, position) pairs of the confirmed entries' copies in flight, in order."""
        return tuple(
            (entry_id, position)
            for entry_id, add in sorted(self._adds.items())
            if entry_id <= self._lac
            for position in add.unanswered()
        )

    def give_up(self) -> tuple[tuple[int, int], ...]:
        """Count the confirmed entries' copies in flight as failed (for
        `take_under_replicated`), as a writer that stops waiting must; returns them."""
        given_up = self.unanswered()
        for entry_id, position in given_up:
            self.failed(entry_id, position)
        return given_up

    def take_under_replicated(self) -> tuple[tuple[int, int], ...]:
        """(entry, position) pairs of confirmed entries whose copy there failed, once each."""
        taken = tuple(sorted(self._under_replicated))
        self._under_replicated.clear()
        return taken

    def _lookup(self, entry_id: int, position: int) -> _Add | None:
        add = self._adds.get(entry_id)
        if add is not None and position in add.write_set:
            return add  # an add in flight, a position of its write set: nothing to check
        if not self._first_entry_id <= entry_id < self._next_entry_id:
            raise BadRequest(
                f"entry {entry_id} was never added (added: {self._first_entry_id}.."
                f"{self._next_entry_id - 1})"
            )
        if not 0 <= position < self.ensemble_size or not stores_entry(
            position, entry_id, self.ensemble_size, self.write_quorum
        ):
            raise BadRequest(
                f"position {position} is not in the write set "
                f"{write_set(entry_id, self.ensemble_size, self.write_quorum)} of entry {entry_id}"
            )
        # None: confirmed with every copy answered, so any further answer is a repeat.
        return add

    def _forget_if_done(self, entry_id: int, add: _Add) -> None:
        if entry_id <= self._lac and add.settled():
            del self._adds[entry_id]
