from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.availability import EntryAvailability
from tally.core.errors import BadRequest
from tally.core.metadata_inference import (
    InferredLedger,
    InferredSegment,
    NotInferable,
    infer_ledger,
    missing,
    unexplained,
)
from tally.core.schedule import expected_entries

Segments = Sequence[tuple[int, Sequence[str | None]]]
Ledger = tuple[int, int, int, list[tuple[int, tuple[str, ...]]]]
"""E, WQ, the last entry and the segments of a ledger."""


def holdings(
    segments: Segments, ensemble_size: int, write_quorum: int, last: int
) -> dict[str, EntryAvailability]:
    """What each bookie holds when every entry is where the metadata places it."""
    held: dict[str, EntryAvailability] = {}
    ends = [first - 1 for first, _ in segments[1:]] + [last]
    for (first, ensemble), end in zip(segments, ends, strict=True):
        for position, bookie in enumerate(ensemble):
            if bookie is not None:
                entries = expected_entries(first, end, ensemble_size, write_quorum, position)
                held[bookie] = held.get(bookie, EntryAvailability.empty()).union(entries)
    return held


def placement(ledger: InferredLedger) -> list[tuple[int, tuple[str | None, ...]]]:
    return [(segment.first_entry_id, segment.ensemble) for segment in ledger.segments]


def inferred(held: Mapping[str, EntryAvailability]) -> InferredLedger:
    result = infer_ledger(held)
    assert isinstance(result, InferredLedger), result
    return result


def assert_well_formed(ledger: InferredLedger) -> None:
    """Segments from entry 0 up, each an ensemble of E positions with no bookie twice."""
    firsts = [segment.first_entry_id for segment in ledger.segments]
    assert firsts[0] == 0
    assert firsts == sorted(set(firsts))
    for segment in ledger.segments:
        named = [bookie for bookie in segment.ensemble if bookie is not None]
        assert len(segment.ensemble) == ledger.ensemble_size
        assert len(named) == len(set(named))


def assert_explains(ledger: InferredLedger, held: Mapping[str, EntryAvailability]) -> None:
    """A reader following the inferred metadata finds every held entry on a bookie that holds
    it, and the metadata places no held entry elsewhere than on its holders."""
    assert_well_formed(ledger)
    shape = (ledger.ensemble_size, ledger.write_quorum, ledger.last_entry_seen)
    assert unexplained(placement(ledger), *shape, held) == {}
    assert not missing(placement(ledger), *shape, held)


def segment(first: int, *ensemble: str | None) -> InferredSegment:
    return InferredSegment(first, ensemble)


# -- examples ------------------------------------------------------------------------------


def test_one_segment_shows_its_shape_and_positions() -> None:
    ledger = inferred(holdings([(0, ("c", "a", "b"))], 3, 2, 99))
    assert (ledger.ensemble_size, ledger.write_quorum) == (3, 2)
    assert ledger.segments == (segment(0, "c", "a", "b"),)
    assert ledger.last_entry_seen == 99
    assert ledger.ambiguous == ()


def test_every_bookie_holding_every_entry_leaves_the_order_open() -> None:
    ledger = inferred(holdings([(0, ("c", "a", "b"))], 3, 3, 99))
    assert (ledger.ensemble_size, ledger.write_quorum) == (3, 3)
    assert ledger.segments == (segment(0, "a", "b", "c"),)
    assert any("ensemble order arbitrary" in note for note in ledger.ambiguous)


def test_ensemble_change_starts_a_segment_after_the_old_holders_last_entry() -> None:
    truth = [(0, ("a", "b", "c")), (100, ("a", "d", "c"))]
    held = holdings(truth, 3, 2, 199)
    ledger = inferred(held)
    # b's last entry at position 1 is 99 (99 mod 3 = 0): the change is known to be at 100.
    assert ledger.segments == (segment(0, "a", "b", "c"), segment(100, "a", "d", "c"))
    assert_explains(ledger, held)


def test_boundary_is_the_earliest_the_data_allows() -> None:
    # With E=4 WQ=1, position 3 holds only entries 3 mod 4: b's last is 7, d's first 11, so
    # any boundary in 8..11 places every held entry alike; 8 is taken.
    held = holdings([(0, ("a", "e", "f", "b")), (10, ("a", "e", "f", "d"))], 4, 1, 40)
    ledger = inferred(held)
    assert ledger.segments == (segment(0, "a", "e", "f", "b"), segment(8, "a", "e", "f", "d"))
    assert_explains(ledger, held)


def test_replaced_bookie_of_an_old_segment_takes_its_position() -> None:
    # c died: re-replication copied its entries of segment 0 onto f, and the writer had
    # already moved on to a new ensemble; c holds nothing any more.
    truth = [(0, ("a", "b", "f")), (100, ("a", "d", "e"))]
    held = holdings(truth, 3, 2, 199)
    ledger = inferred(held)
    assert ledger.segments == (segment(0, "a", "b", "f"), segment(100, "a", "d", "e"))
    assert_explains(ledger, held)


def test_lost_bookie_leaves_its_position_empty() -> None:
    held = holdings([(0, ("a", "b", "c"))], 3, 2, 99)
    del held["b"]
    ledger = inferred(held)
    assert (ledger.ensemble_size, ledger.write_quorum) == (3, 2)
    assert ledger.segments == (segment(0, "a", None, "c"),)
    assert_explains(ledger, held)


def test_stray_copy_is_left_aside_and_noted() -> None:
    # c was replaced by d in segment 0 but still holds its old copies there.
    truth = [(0, ("a", "b", "d")), (100, ("a", "d", "b"))]
    held = holdings(truth, 3, 2, 199)
    stray = expected_entries(0, 99, 3, 2, 2)
    held["c"] = stray
    ledger = inferred(held)
    assert (ledger.ensemble_size, ledger.write_quorum) == (3, 2)
    assert placement(ledger) == truth
    shape = (ledger.ensemble_size, ledger.write_quorum, ledger.last_entry_seen)
    assert unexplained(placement(ledger), *shape, held) == {"c": stray}
    assert not missing(placement(ledger), *shape, held)
    assert any("bookie c" in note and "stray" in note for note in ledger.ambiguous)


def test_tiny_ledger_takes_the_smallest_shape_and_says_so() -> None:
    held = holdings([(0, ("a", "b", "c", "d"))], 4, 2, 1)
    ledger = inferred(held)
    assert (ledger.ensemble_size, ledger.write_quorum) == (3, 2)
    assert ledger.segments == (segment(0, "a", "b", "c"),)
    assert any("may be larger" in note for note in ledger.ambiguous)
    assert_explains(ledger, held)


def test_nothing_held_is_not_inferable() -> None:
    assert infer_ledger({}) == NotInferable("no bookie holds any entry")
    assert infer_ledger({"a": EntryAvailability.empty()}) == NotInferable(
        "no bookie holds any entry"
    )


def test_entries_without_any_copy_are_not_inferable() -> None:
    held = holdings([(0, ("a", "b"))], 2, 1, 99)
    held["a"] = held["a"].difference(EntryAvailability.span(40, 59))
    assert infer_ledger(held) == NotInferable("entries 40 every 2 to 58 are held by no bookie")


def test_unexplained_and_missing_check_a_metadata_copy() -> None:
    metadata = [(0, ("a", "b", "c")), (10, ("a", "d", "c"))]
    held = holdings(metadata, 3, 2, 19)
    assert unexplained(metadata, 3, 2, 19, held) == {}
    assert not missing(metadata, 3, 2, 19, held)
    held["b"] = held["b"].union(EntryAvailability.from_entries([12]))
    held["d"] = held["d"].difference(EntryAvailability.from_entries([10, 13]))
    held["c"] = held["c"].difference(EntryAvailability.from_entries([10]))
    assert unexplained(metadata, 3, 2, 19, held) == {"b": EntryAvailability.from_entries([12])}
    assert missing(metadata, 3, 2, 19, held) == EntryAvailability.from_entries([10])
    # Entries past the last one are placed nowhere; an empty position places nothing.
    assert unexplained([(0, ("a", None, "c"))], 3, 2, 9, held).keys() == {"a", "b", "c", "d"}


@pytest.mark.parametrize(
    ("segments", "last", "match"),
    [
        ([(0, ("a", "b"))], 9, "needs 3 distinct bookies"),
        ([(0, ("a", "a", "b"))], 9, "needs 3 distinct bookies"),
        ([(0, ("a", "b", "c")), (0, ("a", "b", "d"))], 9, "strictly increase"),
        ([(0, ("a", "b", "c"))], -2, "below -1"),
    ],
)
def test_metadata_checks_refuse_inconsistent_metadata(
    segments: Segments, last: int, match: str
) -> None:
    with pytest.raises(BadRequest, match=match):
        unexplained(segments, 3, 2, last, {})


def test_ten_million_entries_infer_in_well_under_a_second() -> None:
    truth = [
        (0, ("a", "b", "c", "d", "e")),
        (4_000_000, ("a", "f", "c", "d", "e")),
        (7_000_001, ("a", "f", "c", "b", "e")),
    ]
    held = holdings(truth, 5, 3, 9_999_999)
    started = time.perf_counter()
    ledger = inferred(held)
    elapsed = time.perf_counter() - started
    assert elapsed < 0.5
    assert (ledger.ensemble_size, ledger.write_quorum) == (5, 3)
    assert len(ledger.segments) == 3
    assert_explains(ledger, held)


# -- random ledgers ------------------------------------------------------------------------


@st.composite
def ledgers(draw: st.DrawFn) -> Ledger:
    """A random ledger: segments start anywhere, and draw their ensembles from a pool a
    little larger than E, so bookies come back in later segments at other positions."""
    size = draw(st.integers(1, 6))
    quorum = draw(st.integers(1, size))
    last = draw(st.integers(0, 500))
    later_firsts = draw(st.lists(st.integers(1, max(1, last)), max_size=3, unique=True))
    firsts = [0, *sorted(first for first in later_firsts if first <= last)]
    pool = [f"bookie-{index}" for index in range(size + draw(st.integers(0, 3)))]
    ensembles = [tuple(draw(st.permutations(pool))[:size]) for _ in firsts]
    return size, quorum, last, list(zip(firsts, ensembles, strict=True))


@settings(max_examples=150, deadline=None)
@given(ledgers(), st.data())
def test_inferred_metadata_finds_every_surviving_entry(ledger: Ledger, data: st.DataObject) -> None:
    """With a bookie perhaps gone, the inferred metadata places every entry a bookie holds on
    it (so a reader finds each surviving entry), and the truth's metadata agrees with the
    data; a long one-segment ledger with all its bookies shows its true shape."""
    size, quorum, last, truth = ledger
    held = holdings(truth, size, quorum, last)
    dropped = data.draw(st.none() | st.sampled_from(sorted(held)))
    held.pop(dropped or "", None)

    assert unexplained(truth, size, quorum, last, held) == {}
    surviving = functools.reduce(EntryAvailability.union, held.values(), EntryAvailability.empty())
    assert missing(truth, size, quorum, last, held) == EntryAvailability.span(0, last).difference(
        surviving
    )

    result = infer_ledger(held)
    if not surviving:
        assert result == NotInferable("no bookie holds any entry")
        return
    last_seen = surviving.groups[-1].stop - 1
    if EntryAvailability.span(0, last_seen).difference(surviving):
        assert isinstance(result, NotInferable)
        assert "held by no bookie" in result.reason
        return
    assert isinstance(result, InferredLedger)
    assert result.last_entry_seen == last_seen
    assert_explains(result, held)
    if dropped is None and len(truth) == 1 and last + 1 >= 2 * size:
        assert (result.ensemble_size, result.write_quorum) == (size, quorum)
        if size > quorum:
            assert result.segments == (InferredSegment(0, truth[0][1]),)
            assert result.ambiguous == ()


@settings(max_examples=60, deadline=None)
@given(ledgers(), st.data())
def test_stray_copies_hide_no_entry(ledger: Ledger, data: st.DataObject) -> None:
    """A bookie also holding an old copy of a segment's position (over-replication) still
    leaves every entry placed on a holder, and in a long ledger only that copy, or the
    bookie it duplicates, is left unexplained."""
    size, quorum, last, truth = ledger
    index = data.draw(st.integers(0, len(truth) - 1))
    first, ensemble = truth[index]
    end = truth[index + 1][0] - 1 if index + 1 < len(truth) else last
    position = data.draw(st.integers(0, size - 1))
    outsiders = [f"bookie-{number}" for number in range(10) if f"bookie-{number}" not in ensemble]
    stray = data.draw(st.sampled_from(["bookie-stray", *outsiders]))
    held = holdings(truth, size, quorum, last)
    copies = expected_entries(first, end, size, quorum, position)
    held[stray] = held.get(stray, EntryAvailability.empty()).union(copies)

    result = inferred(held)
    assert_well_formed(result)
    shape = (result.ensemble_size, result.write_quorum, result.last_entry_seen)
    assert not missing(placement(result), *shape, held)
    if len(truth) == 1 and quorum < size and end - first + 1 >= 3 * size:
        assert (result.ensemble_size, result.write_quorum) == (size, quorum)
        assert unexplained(placement(result), *shape, held).keys() <= {stray, ensemble[position]}
