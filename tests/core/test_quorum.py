from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tally.core.answers import Answer
from tally.core.errors import (
    BadRequest,
)
from tally.core.quorum import (
    FencingTracker,
    PendingAdds,
    RecoveryRead,
    RecoveryReadDecision,
    coverage_threshold,
    decide_recovery_read,
)
from tally.core.schedule import write_set

POS, NEG, UNK = Answer.POSITIVE, Answer.NEGATIVE, Answer.UNKNOWN
RECOVERABLE = RecoveryReadDecision.RECOVERABLE
UNRECOVERABLE = RecoveryReadDecision.UNRECOVERABLE
WAIT = RecoveryReadDecision.WAIT
ABORT = RecoveryReadDecision.ABORT

SEED_TABLE = [
    (2, 1, 2),
    (2, 2, 1),
    (3, 1, 3),
    (3, 2, 2),
    (3, 3, 1),
    (4, 2, 3),
    (4, 3, 2),
    (4, 4, 1),
]


@st.composite
def quorums(draw: st.DrawFn, max_ensemble: int = 6) -> tuple[int, int, int]:
    ensemble = draw(st.integers(1, max_ensemble))
    write = draw(st.integers(1, ensemble))
    return ensemble, write, draw(st.integers(1, write))


def brute_force_coverage(cohort: range, ack_quorum: int, holders: set[int]) -> bool:
    """Every ack quorum inside the cohort holds a bookie with the property."""
    return all(any(b in holders for b in q) for q in combinations(cohort, ack_quorum))


# --- quorum coverage -------------------------------------------------------------------


@pytest.mark.parametrize(("wq", "aq", "negatives"), SEED_TABLE)
def test_seed_table_negative_threshold(wq: int, aq: int, negatives: int) -> None:
    assert coverage_threshold(wq, aq) == negatives
    unknowns = [UNK] * (wq - negatives)
    assert decide_recovery_read(wq, aq, dict(enumerate([NEG] * negatives))) is UNRECOVERABLE
    short = dict(enumerate([NEG] * (negatives - 1) + unknowns))
    assert decide_recovery_read(wq, aq, short) is WAIT
    assert decide_recovery_read(wq, aq, {**short, wq - 1: UNK}) is ABORT


@settings(max_examples=300)
@given(data=st.data(), size=st.integers(1, 8))
def test_threshold_matches_every_ack_quorum_definition(data: st.DataObject, size: int) -> None:
    ack_quorum = data.draw(st.integers(1, size))
    holders = data.draw(st.sets(st.integers(0, size - 1)))
    cohort = range(size)
    by_count = len(holders) >= coverage_threshold(size, ack_quorum)
    assert by_count == brute_force_coverage(cohort, ack_quorum, holders)
    # The second definition: no ack quorum lies wholly among bookies lacking the property.
    lacking = set(cohort) - holders
    assert by_count == (not any(set(q) <= lacking for q in combinations(cohort, ack_quorum)))


@pytest.mark.parametrize(("size", "aq"), [(2, 3), (3, 0), (0, 0), (1, -1)])
def test_coverage_threshold_rejects_bad_sizes(size: int, aq: int) -> None:
    with pytest.raises(BadRequest, match="cohort size"):
        coverage_threshold(size, aq)


# --- recovery reads ----------------------------------------------------------------------

# The seed's figures: WQ=3, AQ=2, so two explicit negatives close the ledger.
SEED_FIGURES = {
    "positive #1": ([UNK, POS, NEG], [WAIT, RECOVERABLE, RECOVERABLE]),
    "negative #1": ([NEG, NEG, POS], [WAIT, UNRECOVERABLE, UNRECOVERABLE]),
    "unknown #1": ([UNK, UNK, UNK], [WAIT, WAIT, ABORT]),
    "wait": ([NEG, UNK], [WAIT, WAIT]),
    "positive #2": ([NEG, UNK, POS], [WAIT, WAIT, RECOVERABLE]),
    "negative #2": ([UNK, NEG, NEG], [WAIT, WAIT, UNRECOVERABLE]),
    "unknown #2": ([NEG, UNK, UNK], [WAIT, WAIT, ABORT]),
}


@pytest.mark.parametrize("figure", SEED_FIGURES)
def test_seed_figures(figure: str) -> None:
    answers, verdicts = SEED_FIGURES[figure]
    read = RecoveryRead(entry_id=4, ensemble_size=3, write_quorum=3, ack_quorum=2)
    positions = read.write_set
    assert positions == (1, 2, 0)
    got = [read.record(p, r) for p, r in zip(positions, answers, strict=False)]
    assert got == verdicts
    assert read.decision is verdicts[-1]


def test_answers_after_the_verdict_are_ignored() -> None:
    read = RecoveryRead(entry_id=0, ensemble_size=3, write_quorum=3, ack_quorum=2)
    assert read.record(0, NEG) is WAIT
    assert read.record(1, NEG) is UNRECOVERABLE
    assert read.record(2, POS) is UNRECOVERABLE
    assert read.record(1, POS) is UNRECOVERABLE  # a repeat, too, once decided


def test_positive_wins_over_negatives_in_one_map() -> None:
    assert decide_recovery_read(3, 2, {0: NEG, 1: NEG, 2: POS}) is RECOVERABLE


responses_maps = st.dictionaries(st.integers(0, 5), st.sampled_from(Answer), max_size=6)


@st.composite
def write_sets_and_answers(draw: st.DrawFn) -> tuple[int, int, dict[int, Answer]]:
    wq = draw(st.integers(1, 6))
    aq = draw(st.integers(1, wq))
    answers = draw(st.dictionaries(st.integers(0, wq - 1), st.sampled_from(Answer)))
    return wq, aq, answers


@settings(max_examples=400)
@given(write_sets_and_answers())
def test_recovery_decision_matches_brute_force(case: tuple[int, int, dict[int, Answer]]) -> None:
    wq, aq, answers = case
    decision = decide_recovery_read(wq, aq, answers)
    negatives = {p for p, r in answers.items() if r is NEG}
    if POS in answers.values():
        expected = RECOVERABLE
    elif brute_force_coverage(range(wq), aq, negatives):
        expected = UNRECOVERABLE
    elif len(answers) == wq:
        expected = ABORT
    else:
        expected = WAIT
    assert decision is expected
    if decision is UNRECOVERABLE:
        assert len(negatives) >= wq - aq + 1


@settings(max_examples=300)
@given(write_sets_and_answers())
def test_unknowns_count_as_silence_not_negatives(
    case: tuple[int, int, dict[int, Answer]],
) -> None:
    wq, aq, answers = case
    silent = {p: r for p, r in answers.items() if r is not UNK}
    with_unknowns = decide_recovery_read(wq, aq, answers)
    without = decide_recovery_read(wq, aq, silent)
    if with_unknowns is ABORT:
        assert without is WAIT  # only the count of outstanding bookies changed
    else:
        assert with_unknowns is without


def test_recovery_read_rejects_bad_arguments() -> None:
    with pytest.raises(BadRequest, match="write quorum"):
        RecoveryRead(0, ensemble_size=3, write_quorum=2, ack_quorum=3)
    with pytest.raises(BadRequest, match="negative"):
        RecoveryRead(-1, ensemble_size=3, write_quorum=2, ack_quorum=2)
    read = RecoveryRead(5, ensemble_size=4, write_quorum=2, ack_quorum=2)
    assert read.write_set == (1, 2)
    for outside in (0, 3, 4, -1):
        with pytest.raises(BadRequest, match=f"position {outside} is not in the write set"):
            read.record(outside, NEG)
    read.record(1, UNK)
    with pytest.raises(BadRequest, match="already answered"):
        read.record(1, NEG)
    with pytest.raises(BadRequest, match="3 responses for a write set of 2"):
        decide_recovery_read(2, 1, {0: UNK, 1: UNK, 2: UNK})
    with pytest.raises(BadRequest, match="cohort size"):
        decide_recovery_read(2, 3, {})


# --- fencing -----------------------------------------------------------------------------


@st.composite
def fencing_cases(draw: st.DrawFn) -> tuple[tuple[int, int, int], dict[int, Answer]]:
    e, wq, aq = draw(quorums())
    return (e, wq, aq), draw(st.dictionaries(st.integers(0, e - 1), st.sampled_from(Answer)))


def fed_tracker(e: int, wq: int, aq: int, answers: dict[int, Answer]) -> FencingTracker:
    tracker = FencingTracker(e, wq, aq)
    for position, response in answers.items():
        tracker.record(position, response, lac=position if response is POS else None)
    return tracker


def writer_can_confirm(e: int, wq: int, aq: int, unfenced: set[int]) -> bool:
    """Some entry's write set holds an ack quorum of bookies that may be unfenced."""
    return any(
        set(q) <= unfenced
        for entry_id in range(e)
        for q in combinations(write_set(entry_id, e, wq), aq)
    )


@settings(max_examples=400)
@given(fencing_cases())
def test_fencing_completes_exactly_when_no_write_set_has_an_unfenced_ack_quorum(
    case: tuple[tuple[int, int, int], dict[int, Answer]],
) -> None:
    (e, wq, aq), answers = case
    tracker = fed_tracker(e, wq, aq, answers)
    fenced = {p for p, r in answers.items() if r is not UNK}
    unknown = {p for p, r in answers.items() if r is UNK}
    assert tracker.fenced == fenced
    assert tracker.is_complete == (not writer_can_confirm(e, wq, aq, set(range(e)) - fenced))
    assert tracker.can_still_complete == (not writer_can_confirm(e, wq, aq, unknown))
    if tracker.is_complete:
        assert tracker.can_still_complete


@settings(max_examples=300)
@given(fencing_cases())
def test_ensemble_count_implies_write_set_rule_and_equals_it_when_wq_is_e(
    case: tuple[tuple[int, int, int], dict[int, Answer]],
) -> None:
    (e, wq, aq), answers = case
    tracker = fed_tracker(e, wq, aq, answers)
    by_count = len(tracker.fenced) >= coverage_threshold(e, aq)
    if by_count:
        assert tracker.is_complete
    if wq == e:
        assert tracker.is_complete == by_count


def test_write_set_rule_needs_fewer_bookies_than_the_ensemble_count() -> None:
    tracker = FencingTracker(ensemble_size=4, write_quorum=2, ack_quorum=2)
    tracker.record(0, POS, lac=7)
    assert not tracker.is_complete  # write set (2, 3) is still an unfenced ack quorum
    tracker.record(2, NEG)
    assert tracker.is_complete
    assert len(tracker.fenced) == 2 < coverage_threshold(4, 2)


def test_fencing_with_full_stripes_needs_e_minus_aq_plus_one() -> None:
    tracker = FencingTracker(ensemble_size=3, write_quorum=3, ack_quorum=2)
    tracker.record(0, NEG)
    assert not tracker.is_complete
    assert tracker.can_still_complete
    tracker.record(1, UNK)
    assert tracker.can_still_complete
    tracker.record(2, POS, lac=3)
    assert tracker.is_complete


def test_unknowns_can_make_fencing_impossible() -> None:
    tracker = FencingTracker(ensemble_size=5, write_quorum=3, ack_quorum=2)
    tracker.record(0, UNK)
    assert tracker.can_still_complete
    tracker.record(1, UNK)  # write set (0, 1, 2) keeps two maybe-unfenced bookies
    assert not tracker.can_still_complete
    for position in (2, 3, 4):
        tracker.record(position, POS, lac=0)
    assert not tracker.is_complete


def test_max_lac_comes_from_positive_answers_only() -> None:
    tracker = FencingTracker(ensemble_size=4, write_quorum=3, ack_quorum=2)
    assert tracker.max_lac == -1
    tracker.record(0, NEG)
    tracker.record(1, UNK)
    assert tracker.max_lac == -1
    tracker.record(2, POS, lac=12)
    tracker.record(3, POS, lac=9)
    assert tracker.max_lac == 12


def test_fencing_tracker_rejects_bad_arguments() -> None:
    with pytest.raises(BadRequest, match="ensemble size"):
        FencingTracker(ensemble_size=2, write_quorum=3, ack_quorum=2)
    tracker = FencingTracker(ensemble_size=3, write_quorum=2, ack_quorum=2)
    for outside in (-1, 3):
        with pytest.raises(BadRequest, match=f"position {outside} is outside the ensemble"):
            tracker.record(outside, NEG)
    with pytest.raises(BadRequest, match="needs a LAC"):
        tracker.record(0, POS)
    with pytest.raises(BadRequest, match="needs a LAC >= -1, got -2"):
        tracker.record(0, POS, lac=-2)
    for response in (NEG, UNK):
        with pytest.raises(BadRequest, match="carries no LAC"):
            tracker.record(0, response, lac=3)
    tracker.record(0, POS, lac=-1)
    with pytest.raises(BadRequest, match="already answered"):
        tracker.record(0, NEG)


# --- pending adds ------------------------------------------------------------------------


def test_confirms_in_entry_order_at_ack_quorum() -> None:
    adds = PendingAdds(ensemble_size=3, write_quorum=3, ack_quorum=2)
    assert [adds.add(e) for e in range(3)] == [(0, 1, 2), (1, 2, 0), (2, 0, 1)]
    adds.ack(1, 0)
    adds.ack(1, 2)
    assert adds.release() == ()  # entry 1 has AQ acks but entry 0 has none
    adds.ack(0, 0)
    adds.ack(0, 0)  # repeats are harmless
    assert adds.release() == ()
    adds.ack(0, 1)
    assert adds.release() == (0, 1)
    assert adds.last_add_confirmed == 1
    assert adds.release() == ()


def test_failure_after_confirmation_is_reported_not_ignored() -> None:
    adds = PendingAdds(ensemble_size=3, write_quorum=3, ack_quorum=2)
    adds.add(0)
    adds.ack(0, 0)
    adds.ack(0, 1)
    assert adds.release() == (0,)
    adds.failed(0, 2)
    assert adds.failed_positions == frozenset()  # a new segment cannot cover entry 0
    assert adds.take_under_replicated() == ((0, 2),)
    adds.failed(0, 2)
    assert adds.take_under_replicated() == ()


def test_repeated_failure_is_reported_once() -> None:
    adds = PendingAdds(ensemble_size=3, write_quorum=3, ack_quorum=1)
    adds.add(0)
    adds.ack(0, 0)
    assert adds.release() == (0,)
    adds.failed(0, 1)
    adds.failed(0, 1)
    assert adds.take_under_replicated() == ((0, 1),)
    adds.failed(0, 1)  # entry 0 still waits for position 2, so it is remembered
    assert adds.take_under_replicated() == ()


def test_failure_before_confirmation_but_beyond_aq_is_reported_at_release() -> None:
    adds = PendingAdds(ensemble_size=3, write_quorum=3, ack_quorum=2)
    adds.add(0)
    adds.failed(0, 0)
    assert adds.failed_positions == {0}
    adds.ack(0, 1)
    adds.ack(0, 2)
    assert adds.take_under_replicated() == ()
    assert adds.release() == (0,)
    assert adds.take_under_replicated() == ((0, 0),)


def test_first_answer_per_position_stands() -> None:
    adds = PendingAdds(ensemble_size=3, write_quorum=2, ack_quorum=2)
    adds.add(0)
    adds.failed(0, 0)  # e.g. a timeout
    adds.ack(0, 0)  # the late ack does not count
    adds.ack(0, 1)
    assert adds.release() == ()
    adds.add(1)
    adds.ack(1, 1)
    adds.failed(1, 1)  # an error after the ack does not erase the copy
    adds.ack(1, 2)
    assert adds.failed_positions == {0}


def test_replace_resets_the_position_for_unconfirmed_entries() -> None:
    adds = PendingAdds(ensemble_size=4, write_quorum=3, ack_quorum=2)
    for entry_id in range(5):
        adds.add(entry_id)
    adds.ack(0, 0)
    adds.ack(0, 2)
    assert adds.release() == (0,)
    adds.ack(1, 1)  # entry 1 reaches AQ through position 2 ...
    adds.ack(1, 2)
    adds.failed(2, 2)  # ... whose bookie then fails
    assert adds.failed_positions == {2}
    # Entries 1.. go to the new segment; all but 3 (write set 3, 0, 1) include position 2.
    assert adds.replace(2) == (1, 2, 4)
    assert adds.failed_positions == frozenset()
    assert adds.release() == ()  # entry 1 lost the old bookie's ack
    adds.ack(1, 2)  # the new bookie's ack
    assert adds.release() == (1,)
    assert adds.replace(1) == (3, 4)
    assert adds.take_under_replicated() == ()


def test_copies_beyond_the_ack_quorum_stay_in_flight_until_answered_or_given_up() -> None:
    adds = PendingAdds(ensemble_size=3, write_quorum=3, ack_quorum=2)
    for entry_id in range(3):
        adds.add(entry_id)
    assert adds.copies_in_flight == 0  # none confirmed yet
    for entry_id in range(3):
        adds.ack(entry_id, 0)
        adds.ack(entry_id, 1)
    adds.ack(0, 1)  # a repeat is not a second answer
    assert adds.release() == (0, 1, 2)
    # Confirmed at AQ=2, each entry still waits for its copy at position 2.
    assert adds.unanswered() == ((0, 2), (1, 2), (2, 2))
    assert adds.copies_in_flight == 3
    adds.ack(0, 2)
    adds.failed(1, 2)
    assert adds.take_under_replicated() == ((1, 2),)
    assert adds.give_up() == ((2, 2),)  # silent: it may not have the copy
    assert adds.copies_in_flight == 0
    assert adds.unanswered() == ()
    assert adds.take_under_replicated() == ((2, 2),)
    adds.ack(2, 2)  # a late ack after giving up does not count
    assert adds.give_up() == ()


def test_only_confirmed_entries_copies_are_in_flight_or_given_up() -> None:
    adds = PendingAdds(ensemble_size=3, write_quorum=3, ack_quorum=2)
    adds.add(0)
    adds.ack(0, 0)
    assert adds.copies_in_flight == 0  # entry 0 waits for its ack quorum, not beyond it
    assert adds.give_up() == ()
    adds.ack(0, 1)
    assert adds.release() == (0,)
    assert adds.unanswered() == ((0, 2),)
    assert adds.copies_in_flight == 1


def test_resumes_after_a_known_lac() -> None:
    adds = PendingAdds(ensemble_size=3, write_quorum=2, ack_quorum=1, last_add_confirmed=9)
    assert adds.next_entry_id == 10
    assert adds.add(10) == (1, 2)
    adds.ack(10, 2)
    assert adds.release() == (10,)


def test_pending_adds_rejects_bad_arguments() -> None:
    with pytest.raises(BadRequest, match="ack quorum"):
        PendingAdds(ensemble_size=3, write_quorum=2, ack_quorum=0)
    with pytest.raises(BadRequest, match="below -1"):
        PendingAdds(3, 2, 2, last_add_confirmed=-2)
    adds = PendingAdds(ensemble_size=4, write_quorum=2, ack_quorum=2, last_add_confirmed=4)
    with pytest.raises(BadRequest, match="next entry id is 5"):
        adds.add(6)
    adds.add(5)
    for entry_id in (4, 6, -1):
        with pytest.raises(BadRequest, match=f"entry {entry_id} was never added"):
            adds.ack(entry_id, 1)
        with pytest.raises(BadRequest, match=f"entry {entry_id} was never added"):
            adds.failed(entry_id, 1)
    for outside in (0, 3, 4, -1):
        with pytest.raises(BadRequest, match=f"position {outside} is not in the write set"):
            adds.ack(5, outside)
        with pytest.raises(BadRequest, match=f"position {outside} is not in the write set"):
            adds.failed(5, outside)
    for outside in (4, -1):
        with pytest.raises(BadRequest, match="outside the ensemble"):
            adds.replace(outside)


@settings(max_examples=200)
@given(data=st.data(), sizes=quorums(), count=st.integers(1, 8))
def test_any_ack_order_confirms_a_gap_free_prefix(
    data: st.DataObject, sizes: tuple[int, int, int], count: int
) -> None:
    e, wq, aq = sizes
    adds = PendingAdds(e, wq, aq)
    for entry_id in range(count):
        adds.add(entry_id)
    answers = [(entry_id, p) for entry_id in range(count) for p in write_set(entry_id, e, wq)]
    order = data.draw(st.permutations(answers))
    acked: dict[int, int] = dict.fromkeys(range(count), 0)
    confirmed: list[int] = []
    for entry_id, position in order:
        adds.ack(entry_id, position)
        acked[entry_id] += 1
        confirmed.extend(adds.release())
        # The longest prefix of entries that each have AQ acks, no more and no less.
        prefix = 0
        while prefix < count and acked[prefix] >= aq:
            prefix += 1
        assert confirmed == list(range(prefix))
        assert adds.last_add_confirmed == prefix - 1
    assert confirmed == list(range(count))


class PendingAddsMachine(RuleBasedStateMachine):
    """Random adds, acks, failures, releases and replacements against a plain model:
    the first answer per (entry, position) stands until the position is replaced."""

    def __init__(self) -> None:
        super().__init__()
        self.adds: PendingAdds | None = None
        self.answers: dict[tuple[int, int], bool] = {}  # True: ack, False: failure
        self.lac = -1
        self.reported: set[tuple[int, int]] = set()

    @precondition(lambda self: self.adds is None)
    @rule(sizes=quorums(max_ensemble=5))
    def start(self, sizes: tuple[int, int, int]) -> None:
        self.adds = PendingAdds(*sizes)
        self.sizes = sizes

    def _positions(self, entry_id: int) -> tuple[int, ...]:
        e, wq, _ = self.sizes
        return write_set(entry_id, e, wq)

    @precondition(lambda self: self.adds is not None and self.adds.next_entry_id < 12)
    @rule()
    def add(self) -> None:
        assert self.adds is not None
        entry_id = self.adds.next_entry_id
        assert self.adds.add(entry_id) == self._positions(entry_id)

    @precondition(lambda self: self.adds is not None and self.adds.next_entry_id > 0)
    @rule(data=st.data(), ack=st.booleans())
    def answer(self, data: st.DataObject, ack: bool) -> None:
        assert self.adds is not None
        entry_id = data.draw(st.integers(0, self.adds.next_entry_id - 1))
        position = data.draw(st.sampled_from(self._positions(entry_id)))
        counted = (entry_id, position) not in self.answers
        self.answers.setdefault((entry_id, position), ack)
        if not ack:
            self.adds.failed(entry_id, position)
            return
        # True exactly when this ack gives the entry after the LAC its ack quorum: the
        # writer releases only then (and after failures and ensemble changes).
        completes = counted and entry_id == self.lac + 1 and self._acks(entry_id) == self.sizes[2]
        assert self.adds.ack(entry_id, position) is completes

    @precondition(lambda self: self.adds is not None and self.adds.next_entry_id > 0)
    @rule(data=st.data())
    def acks_of_one_receive(self, data: st.DataObject) -> None:
        """One position's acks to several entries (repeats too), given in one call."""
        assert self.adds is not None
        entry_id = data.draw(st.integers(0, self.adds.next_entry_id - 1))
        position = data.draw(st.sampled_from(self._positions(entry_id)))
        held = [e for e in range(self.adds.next_entry_id) if position in self._positions(e)]
        entry_ids = data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=6))
        due = False
        for acked_id in entry_ids:
            counted = (acked_id, position) not in self.answers
            self.answers.setdefault((acked_id, position), True)
            due |= counted and acked_id == self.lac + 1 and self._acks(acked_id) == self.sizes[2]
        assert self.adds.ack_all(entry_ids, position) is due

    @precondition(lambda self: self.adds is not None)
    @rule()
    def release(self) -> None:
        assert self.adds is not None
        expected: list[int] = []
        while self.lac + 1 < self.adds.next_entry_id and self._acks(self.lac + 1) >= self.sizes[2]:
            self.lac += 1
            expected.append(self.lac)
        assert self.adds.release() == tuple(expected)

    @precondition(lambda self: self.adds is not None)
    @rule(data=st.data())
    def replace(self, data: st.DataObject) -> None:
        assert self.adds is not None
        position = data.draw(st.integers(0, self.sizes[0] - 1))
        expected = tuple(
            entry_id
            for entry_id in range(self.lac + 1, self.adds.next_entry_id)
            if position in self._positions(entry_id)
        )
        for entry_id in expected:
            self.answers.pop((entry_id, position), None)
        assert self.adds.replace(position) == expected

    @precondition(lambda self: self.adds is not None)
    @rule()
    def give_up(self) -> None:
        assert self.adds is not None
        silent = self._unanswered()
        assert self.adds.give_up() == tuple(sorted(silent))
        for copy in silent:
            self.answers[copy] = False

    @precondition(lambda self: self.adds is not None)
    @rule()
    def take_under_replicated(self) -> None:
        assert self.adds is not None
        taken = self.adds.take_under_replicated()
        assert list(taken) == sorted(set(taken))
        assert not self.reported & set(taken), "reported twice"
        self.reported |= set(taken)
        expected = {
            (entry_id, position)
            for (entry_id, position), ack in self.answers.items()
            if not ack and entry_id <= self.lac
        }
        assert self.reported == expected

    def _acks(self, entry_id: int) -> int:
        return sum(self.answers.get((entry_id, p)) is True for p in self._positions(entry_id))

    def _unanswered(self) -> set[tuple[int, int]]:
        assert self.adds is not None
        return {
            (entry_id, position)
            for entry_id in range(self.lac + 1)
            for position in self._positions(entry_id)
            if (entry_id, position) not in self.answers
        }

    @invariant()
    def lac_and_failed_positions_agree(self) -> None:
        if self.adds is None:
            return
        assert self.adds.last_add_confirmed == self.lac
        assert self.adds.failed_positions == {
            position
            for (entry_id, position), ack in self.answers.items()
            if not ack and entry_id > self.lac
        }

    @invariant()
    def copies_in_flight_are_the_unanswered_ones(self) -> None:
        if self.adds is None:
            return
        unanswered = self._unanswered()
        assert self.adds.unanswered() == tuple(sorted(unanswered))
        assert self.adds.copies_in_flight == len(unanswered)


TestPendingAddsMachine = PendingAddsMachine.TestCase
TestPendingAddsMachine.settings = settings(max_examples=150, stateful_step_count=40)
