"""The lost-bookies state machine: delay, cancellation, escalation, delay changes, forgetting."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.digest import DigestType
from tally.core.errors import BadRequest
from tally.core.ledger_metadata import Deletion, LedgerMetadata, LedgerState, Segment
from tally.core.lost_bookies import (
    LostBookies,
    LostBookieState,
    bookies_holding_entries,
)

A, B, C, D = "a:1", "b:1", "c:1", "d:1"


def test_a_bookie_seen_registered_then_gone_is_lost_until_its_deadline() -> None:
    lost = LostBookies(60)
    assert lost.registered_changed({A, B}, 100.0).lost == ()
    change = lost.registered_changed({B}, 110.0)
    assert [(b.bookie_id, b.since, b.deadline) for b in change.lost] == [(A, 110.0, 170.0)]
    assert lost.due(169.9) == ()
    assert lost.next_deadline() == 170.0
    assert [b.bookie_id for b in lost.due(170.0)] == [A]


def test_delay_zero_makes_a_lost_bookie_due_at_once() -> None:
    lost = LostBookies(0)
    lost.registered_changed({A, B}, 1.0)
    lost.registered_changed({B}, 2.0)
    assert [b.bookie_id for b in lost.due(2.0)] == [A]


def test_a_bookie_back_before_its_deadline_is_never_due() -> None:
    lost = LostBookies(60)
    lost.registered_changed({A, B}, 0.0)
    lost.registered_changed({B}, 10.0)
    change = lost.registered_changed({A, B}, 20.0)
    assert [b.bookie_id for b in change.returned] == [A]
    assert change.returned[0].state is LostBookieState.PENDING
    assert lost.due(1000.0) == ()
    assert lost.next_deadline() is None
    assert not lost.lost


def test_read_only_counts_as_registered() -> None:
    lost = LostBookies(0)
    lost.registered_changed({A, B}, 0.0)
    assert lost.registered_changed({A, B}, 1.0).lost == ()  # B went read-only: still listed
    assert not lost.lost


def test_a_second_lost_bookie_makes_both_due_at_once() -> None:
    lost = LostBookies(600)
    lost.registered_changed({A, B, C}, 0.0)
    lost.registered_changed({B, C}, 10.0)
    assert lost.due(20.0) == ()
    change = lost.registered_changed({C}, 20.0)
    assert [b.bookie_id for b in change.lost] == [B]
    assert [b.bookie_id for b in change.escalated] == [A]
    assert [b.bookie_id for b in lost.due(20.0)] == [A, B]
    assert lost.lost[A].since == 10.0, "escalation keeps when the bookie was lost"
    assert lost.lost[A].deadline == 20.0


def test_two_bookies_lost_in_one_event_are_due_at_once() -> None:
    lost = LostBookies(600)
    lost.registered_changed({A, B, C}, 0.0)
    lost.registered_changed({C}, 5.0)
    assert [b.bookie_id for b in lost.due(5.0)] == [A, B]


def test_escalation_sticks_when_one_of_the_two_returns() -> None:
    lost = LostBookies(600)
    lost.registered_changed({A, B, C}, 0.0)
    lost.registered_changed({C}, 5.0)
    lost.registered_changed({A, C}, 6.0)
    assert [b.bookie_id for b in lost.due(6.0)] == [B]


def test_a_bookie_lost_after_the_others_were_marked_waits_its_delay() -> None:
    lost = LostBookies(600)
    lost.registered_changed({A, B, C}, 0.0)
    lost.registered_changed({C}, 5.0)
    lost.marked({A, B}, 5.0)
    lost.registered_changed(set(), 7.0)
    assert lost.due(8.0) == ()
    assert lost.lost[C].deadline == 607.0
    assert {b.bookie_id for b in lost.past_deadline(8.0)} == {A, B}


def test_a_shorter_delay_is_measured_from_when_the_bookie_was_lost() -> None:
    lost = LostBookies(3600)
    lost.registered_changed({A, B}, 0.0)
    lost.registered_changed({B}, 100.0)
    change = lost.delay_changed(60, 500.0)
    assert [(b.bookie_id, b.deadline) for b in change.rescheduled] == [(A, 160.0)]
    assert [b.bookie_id for b in lost.due(500.0)] == [A]


def test_a_longer_delay_postpones_a_pending_bookie() -> None:
    lost = LostBookies(60)
    lost.registered_changed({A, B}, 0.0)
    lost.registered_changed({B}, 100.0)
    lost.delay_changed(3600, 120.0)
    assert lost.due(1000.0) == ()
    assert lost.next_deadline() == 3700.0
    assert lost.delay_changed(3600, 130.0).rescheduled == ()


def test_a_delay_change_leaves_marked_bookies_and_escalations() -> None:
    lost = LostBookies(60)
    lost.registered_changed({A, B, C, D}, 0.0)
    lost.registered_changed({C, D}, 10.0)
    lost.delay_changed(3600, 11.0)
    assert [b.bookie_id for b in lost.due(11.0)] == [A, B]
    lost.marked({A, B}, 11.0)
    lost.registered_changed({D}, 12.0)
    lost.delay_changed(0, 13.0)
    assert lost.lost[A].state is LostBookieState.MARKED
    assert [b.bookie_id for b in lost.due(13.0)] == [C]


def test_bookies_named_in_metadata_and_never_registered_are_lost() -> None:
    lost = LostBookies(30)
    lost.registered_changed({A}, 0.0)
    change = lost.named_in_metadata({A, B}, 50.0)
    assert [(b.bookie_id, b.since, b.deadline) for b in change.lost] == [(B, 50.0, 80.0)]


def test_a_marked_bookie_no_ledger_names_is_forgotten() -> None:
    lost = LostBookies(0)
    lost.registered_changed({A, B}, 0.0)
    lost.registered_changed({A}, 1.0)
    lost.named_in_metadata({A, B}, 2.0)
    assert [b.bookie_id for b in lost.marked({B}, 2.0)] == [B]
    assert lost.named_in_metadata({A, B}, 3.0).forgotten == ()
    change = lost.named_in_metadata({A}, 4.0)
    assert [b.bookie_id for b in change.forgotten] == [B]
    assert not lost.lost
    assert lost.registered_changed({A}, 5.0).lost == (), "forgotten: not lost again"


def test_a_pending_bookie_seen_registered_stays_lost_when_no_ledger_names_it() -> None:
    lost = LostBookies(60)
    lost.registered_changed({A, B}, 0.0)
    lost.registered_changed({A}, 1.0)
    lost.named_in_metadata({A}, 2.0)
    assert lost.is_lost(B)


def test_marking_a_bookie_that_came_back_meanwhile_does_nothing() -> None:
    lost = LostBookies(0)
    lost.registered_changed({A, B}, 0.0)
    lost.registered_changed({B}, 1.0)
    lost.registered_changed({A, B}, 2.0)
    assert lost.marked({A}, 3.0) == ()
    assert not lost.lost


@pytest.mark.parametrize("delay", [-1, float("nan"), float("inf"), True, "5"])
def test_bad_delays_are_refused(delay: object) -> None:
    with pytest.raises(BadRequest):
        LostBookies(delay)  # type: ignore[arg-type]
    with pytest.raises(BadRequest):
        LostBookies(0).delay_changed(delay, 0.0)  # type: ignore[arg-type]


def test_one_str_is_not_a_set_of_bookies() -> None:
    with pytest.raises(BadRequest):
        LostBookies(0).registered_changed("a:1", 0.0)


# -- the model check -------------------------------------------------------------------------

BOOKIES = [A, B, C, D]
events = st.lists(
    st.one_of(
        st.tuples(st.just("registered"), st.frozensets(st.sampled_from(BOOKIES))),
        st.tuples(st.just("named"), st.frozensets(st.sampled_from(BOOKIES))),
        st.tuples(st.just("delay"), st.integers(0, 100)),
        st.tuples(st.just("mark_due"), st.none()),
        st.tuples(st.just("tick"), st.integers(0, 60)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 100), events)
def test_the_machine_agrees_with_a_model_of_the_rules(
    initial: int, sequence: list[tuple[str, Any]]
) -> None:
    lost = LostBookies(initial)
    now = 0.0
    delay = float(initial)
    seen: set[str] = set()
    named: frozenset[str] = frozenset()
    registered: frozenset[str] = frozenset()
    for kind, value in sequence:
        before = dict(lost.lost)
        if kind == "tick":
            now += value
            continue
        if kind == "registered":
            registered = value
            seen |= value
            change = lost.registered_changed(value, now)
        elif kind == "named":
            named = value
            change = lost.named_in_metadata(value, now)
            for bookie in change.forgotten:
                assert bookie.state is LostBookieState.MARKED
                assert bookie.bookie_id not in named
                seen.discard(bookie.bookie_id)
        elif kind == "delay":
            delay = float(value)
            change = lost.delay_changed(value, now)
        else:
            due = lost.due(now)
            assert all(b.state is LostBookieState.PENDING and b.deadline <= now for b in due)
            lost.marked([b.bookie_id for b in due], now)
            assert not lost.due(now)
            continue
        # The lost set is exactly what matters and is not registered.
        assert set(lost.lost) == (seen | named) - registered
        for bookie in change.returned:
            assert bookie.bookie_id in registered or bookie.bookie_id not in seen | named
        for bookie in change.lost:
            assert bookie.bookie_id not in before
            assert bookie.since == now
        pending = [b for b in lost.lost.values() if b.state is LostBookieState.PENDING]
        for bookie in pending:
            full = bookie.since + delay
            if bookie.escalated_at is None:
                assert bookie.deadline == full
            else:
                assert bookie.deadline == min(full, bookie.escalated_at)
        if len(pending) > 1:
            assert all(b.deadline <= now for b in pending), "two lost at once: no waiting"
        if delay == 0:
            assert all(b.deadline <= now for b in pending)
        assert lost.next_deadline() == min((b.deadline for b in pending), default=None)
        for bookie in lost.lost.values():
            if bookie.bookie_id in before:
                assert bookie.since == before[bookie.bookie_id].since


# -- which bookies a ledger needs ------------------------------------------------------------


def _ledger(
    state: LedgerState, segments: list[tuple[int, tuple[str, ...]]], last: int
) -> LedgerMetadata:
    metadata = LedgerMetadata(
        state=LedgerState.OPEN,
        ensemble_size=2,
        write_quorum=2,
        ack_quorum=1,
        segments=tuple(Segment(first, ensemble) for first, ensemble in segments),
        digest_type=DigestType.CRC32C,
        master_key=bytes(32),
        ctime_ms=0,
        creator_token=b"",
    )
    return metadata if state is LedgerState.OPEN else metadata.close(last, max(0, last + 1))


def test_an_open_ledger_needs_every_segment_s_bookies() -> None:
    metadata = _ledger(LedgerState.OPEN, [(0, (A, B)), (5, (A, C))], -1)
    assert bookies_holding_entries(metadata) == {A, B, C}


def test_a_closed_ledger_does_not_need_its_empty_trailing_segment() -> None:
    metadata = _ledger(LedgerState.CLOSED, [(0, (A, B)), (5, (A, C))], 4)
    assert bookies_holding_entries(metadata) == {A, B}
    assert bookies_holding_entries(_ledger(LedgerState.CLOSED, [(0, (A, B))], -1)) == set()
    full = _ledger(LedgerState.CLOSED, [(0, (A, B)), (5, (A, C))], 5)
    assert bookies_holding_entries(full) == {A, B, C}


def test_a_deleted_ledger_needs_no_bookie() -> None:
    deleted = _ledger(LedgerState.CLOSED, [(0, (A, B))], 9).deleted(Deletion(1, "trimmed"))
    assert bookies_holding_entries(deleted) == set()
