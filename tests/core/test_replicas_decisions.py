"""The replicas check's own rules, against brute-force counts over every entry."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.availability import MAX_SEQUENCE, EntryAvailability, SequenceGroup
from tally.core.errors import BadRequest
from tally.core.ledger_audit import Category, marked_too_long, over_replicated
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.replicas_decisions import (
    bookies_to_ask,
    checkable,
    describe,
    entry_ranges,
    holds_schedule_exactly,
    judge_ledger,
)
from tally.core.schedule import write_set
from tests.support.ledgers import held_by_schedule, rotating_ledger

BOOKIES = [f"b{i}" for i in range(6)]


def _open(e: int, wq: int, aq: int, changes: Sequence[int] = ()) -> LedgerMetadata:
    return rotating_ledger(e, wq, aq, changes, None, BOOKIES)


def _closed(e: int, wq: int, aq: int, last: int, changes: Sequence[int] = ()) -> LedgerMetadata:
    return rotating_ledger(e, wq, aq, changes, last, BOOKIES)


def _answers(held: dict[str, set[int]]) -> dict[str, EntryAvailability]:
    return {b: EntryAvailability.from_entries(entries) for b, entries in held.items()}


# -- marked too long -----------------------------------------------------------------------


def test_a_grace_period_of_zero_never_reports_a_mark() -> None:
    assert not marked_too_long(0, 10**12, 0)


def test_a_mark_is_overdue_only_past_the_grace_period() -> None:
    assert not marked_too_long(1_000, 4_600, 3_600)
    assert marked_too_long(1_000, 4_601, 3_600)


def test_a_negative_grace_period_is_refused() -> None:
    with pytest.raises(BadRequest, match="-1 ms is negative"):
        marked_too_long(0, 0, -1)


@given(st.integers(0, 10**13), st.integers(0, 10**13), st.integers(0, 10**9))
def test_overdue_is_age_beyond_grace(marked: int, now: int, grace: int) -> None:
    assert marked_too_long(marked, now, grace) == (grace > 0 and now - marked > grace)


# -- which ledgers and bookies -------------------------------------------------------------


def test_only_closed_ledgers_with_entries_are_checkable() -> None:
    assert checkable(_closed(3, 2, 2, 0))
    assert not checkable(_open(3, 2, 2))
    assert not checkable(_open(3, 2, 2).close(-1, 0))


def test_each_bookie_is_asked_once_though_it_serves_several_segments() -> None:
    metadata = _closed(3, 2, 2, 9, changes=[4, 7])  # b0 b1 b2 | b1 b2 b3 | b2 b3 b4
    assert bookies_to_ask(metadata) == {"b0", "b1", "b2", "b3", "b4"}


def test_the_bookies_of_an_empty_trailing_segment_are_not_asked() -> None:
    metadata = _open(3, 2, 2, changes=[5]).close(4, 5)  # b0 b1 b2 | b1 b2 b3 (empty)
    assert bookies_to_ask(metadata) == {"b0", "b1", "b2"}


# -- judging -------------------------------------------------------------------------------


def test_a_healthy_ledger_has_no_findings() -> None:
    metadata = _closed(3, 2, 2, 20)
    judgement = judge_ledger(metadata, _answers(held_by_schedule(metadata)))
    assert judgement.categories == ()
    assert judgement.mark_bookies == frozenset()
    assert judgement.durability.fewest_copies == 2


def test_missing_copies_are_classified_and_marked_naming_the_bookie() -> None:
    metadata = _closed(3, 3, 2, 20)
    held = held_by_schedule(metadata)
    held["b1"] -= {4, 5}
    held["b2"] -= {5}
    judgement = judge_ledger(metadata, _answers(held))
    assert judgement.categories == (Category.BELOW_ACK_QUORUM,)
    assert judgement.durability.fewest_copies == 1
    assert judgement.mark_bookies == {"b1", "b2"}


def test_an_entry_with_no_copy_is_no_replica() -> None:
    metadata = _closed(3, 2, 2, 20)
    held = held_by_schedule(metadata)
    for position in write_set(7, 3, 2):
        held[BOOKIES[position]].discard(7)
    judgement = judge_ledger(metadata, _answers(held))
    assert judgement.categories == (Category.NO_REPLICA,)
    assert judgement.durability.fewest_copies == 0


def test_a_lost_bookie_counts_as_holding_nothing_and_is_left_out_of_the_mark() -> None:
    metadata = _closed(3, 3, 2, 20)
    held = held_by_schedule(metadata)
    del held["b0"]
    judgement = judge_ledger(metadata, _answers(held), lost={"b0"})
    assert judgement.categories == (Category.BELOW_WRITE_QUORUM,)
    assert judgement.lost_bookies == {"b0"}
    assert judgement.unresponsive_bookies == frozenset()
    assert judgement.mark_bookies == frozenset()


def test_a_registered_bookie_that_did_not_answer_is_not_judged() -> None:
    metadata = _closed(3, 2, 2, 20)
    held = held_by_schedule(metadata)
    del held["b0"]
    judgement = judge_ledger(metadata, _answers(held))
    assert judgement.categories == (Category.POTENTIALLY_FAULTY,)
    assert judgement.unresponsive_bookies == {"b0"}
    assert judgement.durability.fewest_copies == 2


def test_extra_copies_are_over_replication_neither_a_category_nor_marked() -> None:
    metadata = _closed(3, 2, 2, 20)
    held = held_by_schedule(metadata)
    extra = next(e for e in range(21) if e not in held["b0"])
    held["b0"].add(extra)
    held["b5"] = {3, 4}  # a bookie the ledger does not name, as the Spark job may see one
    judgement = judge_ledger(metadata, _answers(held))
    assert judgement.categories == ()
    assert judgement.mark_bookies == frozenset()
    assert judgement.noteworthy
    assert judgement.over_replicated == tuple(over_replicated(metadata, _answers(held)))
    assert [(v.bookie_id, v.missing_count) for v in judgement.over_replicated] == [
        ("b0", 1),
        ("b5", 2),
    ]


def test_every_category_of_a_ledger_is_reported_worst_first() -> None:
    metadata = _closed(4, 3, 2, 20)
    held = held_by_schedule(metadata)
    held["b1"] -= {1}
    held["b1"].add(next(e for e in range(21) if e not in held["b1"] and e != 1))
    del held["b3"]
    judgement = judge_ledger(metadata, _answers(held))
    assert judgement.categories == (Category.BELOW_WRITE_QUORUM, Category.POTENTIALLY_FAULTY)
    assert [v.bookie_id for v in judgement.over_replicated] == ["b1"]


@pytest.mark.parametrize("metadata", [_open(3, 2, 2), _open(3, 2, 2).close(-1, 0)])
def test_ledgers_that_are_not_checkable_are_refused(metadata: LedgerMetadata) -> None:
    with pytest.raises(BadRequest, match="closed ledgers with entries"):
        judge_ledger(metadata, {})


@st.composite
def damaged(
    draw: st.DrawFn,
) -> tuple[LedgerMetadata, dict[str, set[int]], set[str], set[str]]:
    """A ledger, what its answering bookies hold, and which bookies are lost / silent."""
    e = draw(st.integers(1, 4))
    wq = draw(st.integers(1, e))
    aq = draw(st.integers(1, wq))
    last = draw(st.integers(0, 40))
    metadata = _closed(e, wq, aq, last, draw(st.lists(st.integers(1, last + 1), max_size=2)))
    held = held_by_schedule(metadata)
    for bookie in held:
        held[bookie] -= draw(st.sets(st.integers(0, last), max_size=5))
    silent = draw(st.sets(st.sampled_from(sorted(bookies_to_ask(metadata)))))
    lost = draw(st.sets(st.sampled_from(sorted(silent)))) if silent else set()
    return metadata, {b: h for b, h in held.items() if b not in silent}, lost, silent - lost


@settings(max_examples=200, deadline=None)
@given(damaged())
def test_judgement_matches_a_count_of_every_entry(
    case: tuple[LedgerMetadata, dict[str, set[int]], set[str], set[str]],
) -> None:
    """Lost bookies hold nothing; unresponsive ones are given the benefit of the doubt."""
    metadata, held, lost, unresponsive = case
    judgement = judge_ledger(metadata, _answers(held), lost)
    fewest, lacking = metadata.write_quorum, set()
    for segment, (first, last) in zip(metadata.segments, metadata.segment_bounds(), strict=True):
        assert last is not None
        for entry in range(first, last + 1):
            copies = 0
            for position in write_set(entry, metadata.ensemble_size, metadata.write_quorum):
                bookie = segment.ensemble[position]
                if bookie in unresponsive or entry in held.get(bookie, set()):
                    copies += 1
                elif bookie in held:
                    lacking.add(bookie)
            fewest = min(fewest, copies)
    assert judgement.durability.fewest_copies == fewest
    assert judgement.mark_bookies == lacking
    assert judgement.lost_bookies == lost
    assert judgement.unresponsive_bookies == unresponsive
    assert (Category.POTENTIALLY_FAULTY in judgement.categories) == bool(unresponsive)


@settings(max_examples=200, deadline=None)
@given(damaged())
def test_the_healthy_shortcut_holds_exactly_when_the_full_judgement_finds_nothing(
    case: tuple[LedgerMetadata, dict[str, set[int]], set[str], set[str]],
) -> None:
    """On the answers of every bookie to ask (lost copies, no extra ones), holding the
    schedule exactly is having nothing to report; a silent bookie is never exact."""
    metadata, held, lost, unresponsive = case
    asked = bookies_to_ask(metadata)
    answers = _answers({bookie: held[bookie] for bookie in held if bookie in asked})
    encoded = {bookie: entries.to_bytes() for bookie, entries in answers.items()}
    exact = holds_schedule_exactly(metadata, encoded)
    if lost or unresponsive:
        assert not exact
    else:
        assert exact == (not judge_ledger(metadata, answers).noteworthy)


@pytest.mark.parametrize("changes", [(), (3,), (2, 5)])
def test_a_ledger_held_as_scheduled_takes_the_shortcut_and_an_extra_copy_does_not(
    changes: tuple[int, ...],
) -> None:
    metadata = _closed(3, 2, 2, 7, changes)
    asked = bookies_to_ask(metadata)
    held = {b: e for b, e in held_by_schedule(metadata).items() if b in asked}
    encoded = {b: EntryAvailability.from_entries(e).to_bytes() for b, e in held.items()}
    assert holds_schedule_exactly(metadata, encoded)
    some = min(held)
    extra = dict(encoded, **{some: EntryAvailability.span(0, 7).to_bytes()})
    assert not holds_schedule_exactly(metadata, extra)
    assert judge_ledger(metadata, _answers(dict(held, **{some: set(range(8))}))).noteworthy
    past_the_end = EntryAvailability.from_entries({*held[some], 8}).to_bytes()
    assert not holds_schedule_exactly(metadata, dict(encoded, **{some: past_the_end}))
    assert not holds_schedule_exactly(metadata, dict(encoded, stranger=encoded[some]))


# -- describing ----------------------------------------------------------------------------


def test_a_description_names_quorums_copies_bookies_and_ranges() -> None:
    metadata = _closed(3, 2, 2, 20)
    held = held_by_schedule(metadata)
    held["b1"] -= {0, 1, 3}
    del held["b2"]
    text = describe(metadata, judge_ledger(metadata, _answers(held), lost={"b2"}))
    assert text.startswith("E=3 WQ=2 AQ=2, entries 0..20, fewest copies 0 of 2")
    assert "segment 0 (entries 0..20) bookie b1 (position 1) lacks 3: 0..1, 3" in text
    assert "bookie b2 (position 2, lost) lacks 14" in text
    assert "unregistered bookies ['b2'] did not answer" in text


def test_a_description_names_unresponsive_and_extra_copies() -> None:
    metadata = _closed(3, 2, 2, 20)
    held = held_by_schedule(metadata)
    held["b0"].add(next(e for e in range(21) if e not in held["b0"]))
    del held["b1"]
    text = describe(metadata, judge_ledger(metadata, _answers(held)))
    assert "bookie b0 holds 1 entries of segment 0 (position 0) outside its write sets" in text
    assert "registered bookies ['b1'] did not answer: their copies are not judged" in text


def test_entry_ranges_show_the_first_runs_then_an_ellipsis() -> None:
    assert entry_ranges(EntryAvailability.from_entries([1, 2, 4, 5, 7, 9]), shown=3) == (
        "1..2, 4..5, 7, ..."
    )
    assert entry_ranges(EntryAvailability.from_entries([1, 2, 4]), shown=3) == "1..2, 4"
    assert entry_ranges(EntryAvailability.empty()) == ""


def test_entry_ranges_join_the_pieces_of_a_run_longer_than_an_int32() -> None:
    long_run = EntryAvailability([SequenceGroup(0, MAX_SEQUENCE, MAX_SEQUENCE, MAX_SEQUENCE)])
    assert entry_ranges(long_run) == f"0..{2 * MAX_SEQUENCE - 1}"


@given(st.sets(st.integers(0, 200)), st.integers(1, 6))
def test_entry_ranges_are_the_runs_of_the_sorted_ids(entries: set[int], shown: int) -> None:
    runs: list[list[int]] = []
    for entry in sorted(entries):
        if runs and runs[-1][1] == entry - 1:
            runs[-1][1] = entry
        else:
            runs.append([entry, entry])
    expected = ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs[:shown])
    if len(runs) > shown:
        expected += ", ..."
    assert entry_ranges(EntryAvailability.from_entries(sorted(entries)), shown) == expected
