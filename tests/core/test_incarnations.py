"""Which bookies came back as a new incarnation: first seen, changed, unchanged, no cookie."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tally.core.incarnations import IncarnationChange, IncarnationReview, review_incarnations

A, B, C, D = "a:1", "b:1", "c:1", "d:1"

bookie_ids = st.sampled_from([A, B, C, D, "e:1", "f:1"])
incarnation_ids = st.sampled_from(["i1", "i2", "i3"])
remembered_maps = st.dictionaries(bookie_ids, st.one_of(st.none(), incarnation_ids))
current_maps = st.dictionaries(bookie_ids, incarnation_ids)


def test_each_kind_of_bookie() -> None:
    review = review_incarnations(
        {A: "old", B: "same", C: "gone", D: None},
        {A: "new", B: "same", D: "any", "e:1": "first"},
    )
    assert review == IncarnationReview(
        first_seen=(IncarnationChange("e:1", None, "first"),),
        changed=(IncarnationChange(A, "old", "new"), IncarnationChange(D, None, "any")),
    )


def test_a_changed_bookie_counts_once_it_is_registered() -> None:
    """Formatted (its cookie written) but not registered yet: not marked, not remembered;
    registered: marked."""
    remembered, current = {A: "old", B: "old"}, {A: "new", B: "new"}
    review = review_incarnations(remembered, current, registered={B})
    assert review.changed == (IncarnationChange(B, "old", "new"),)
    assert review.first_seen == ()
    assert not review_incarnations(remembered, {A: "new"}, registered=set())
    assert len(review_incarnations(remembered, current, registered={A, B}).changed) == 2


def test_nothing_remembered_marks_nothing() -> None:
    review = review_incarnations({}, {A: "i1", B: "i2"})
    assert review.changed == ()
    assert [change.bookie_id for change in review.first_seen] == [A, B]


def test_no_change_is_an_empty_review() -> None:
    assert not review_incarnations({A: "i1"}, {A: "i1"})
    assert not review_incarnations({A: "i1"}, {})


@given(remembered_maps, current_maps)
def test_changed_are_exactly_the_remembered_bookies_with_another_cookie(
    remembered: dict[str, str | None], current: dict[str, str]
) -> None:
    review = review_incarnations(remembered, current)
    assert {c.bookie_id for c in review.changed} == {
        bookie
        for bookie, incarnation in current.items()
        if bookie in remembered and remembered[bookie] != incarnation
    }
    assert {c.bookie_id for c in review.first_seen} == current.keys() - remembered.keys()
    for change in (*review.changed, *review.first_seen):
        assert change.current == current[change.bookie_id]
        assert change.remembered == remembered.get(change.bookie_id)
    # A bookie without a cookie now is never reported: its next format will be.
    reported = [c.bookie_id for c in (*review.changed, *review.first_seen)]
    assert set(reported) <= current.keys()
    assert len(reported) == len(set(reported))


@given(remembered_maps, current_maps)
def test_remembering_all_ends_the_changes_and_remembering_none_repeats_them(
    remembered: dict[str, str | None], current: dict[str, str]
) -> None:
    review = review_incarnations(remembered, current)
    after = {
        **remembered,
        **{c.bookie_id: c.current for c in (*review.first_seen, *review.changed)},
    }
    assert not review_incarnations(after, current)
    # A crash after the marks but before the changed bookies were remembered: the next
    # review finds the same changes and marks again.
    first_only = {**remembered, **{c.bookie_id: c.current for c in review.first_seen}}
    assert review_incarnations(first_only, current).changed == review.changed


@given(remembered_maps, current_maps, bookie_ids, incarnation_ids)
def test_a_deleted_cookie_then_a_new_format_is_a_change(
    remembered: dict[str, str | None], current: dict[str, str], bookie: str, old: str
) -> None:
    remembered = {**remembered, bookie: old}
    without = {k: v for k, v in current.items() if k != bookie}
    assert bookie not in {c.bookie_id for c in review_incarnations(remembered, without).changed}
    formatted = {**without, bookie: old + "-anew"}
    assert IncarnationChange(bookie, old, old + "-anew") in (
        review_incarnations(remembered, formatted).changed
    )
