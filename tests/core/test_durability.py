"""The durability check against a brute-force count of every entry's copies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.availability import EntryAvailability
from tally.core.digest import DigestType
from tally.core.durability import DurabilityCategory, check_ledger
from tally.core.errors import BadRequest
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.schedule import expected_entries, write_set
from tests.support.ledgers import rotating_ledger


def _held_by_schedule(metadata: LedgerMetadata) -> dict[str, set[int]]:
    held: dict[str, set[int]] = {}
    for segment, (first, last) in zip(metadata.segments, metadata.segment_bounds(), strict=True):
        assert last is not None
        for entry in range(first, last + 1):
            for position in write_set(entry, metadata.ensemble_size, metadata.write_quorum):
                held.setdefault(segment.ensemble[position], set()).add(entry)
    return held


def _availability(
    metadata: LedgerMetadata, held: dict[str, set[int]]
) -> dict[str, EntryAvailability]:
    """What every bookie of the ledger reports, including those that hold nothing."""
    return {b: EntryAvailability.from_entries(held.get(b, set())) for b in metadata.bookies()}


def _brute_force_fewest_copies(metadata: LedgerMetadata, held: dict[str, set[int]]) -> int:
    fewest = metadata.write_quorum
    for segment, (first, last) in zip(metadata.segments, metadata.segment_bounds(), strict=True):
        assert last is not None
        for entry in range(first, last + 1):
            positions = write_set(entry, metadata.ensemble_size, metadata.write_quorum)
            copies = sum(entry in held.get(segment.ensemble[p], set()) for p in positions)
            fewest = min(fewest, copies)
    return fewest


@st.composite
def damaged_ledgers(draw: st.DrawFn) -> tuple[LedgerMetadata, dict[str, set[int]]]:
    e = draw(st.integers(1, 5))
    wq = draw(st.integers(1, e))
    aq = draw(st.integers(1, wq))
    last = draw(st.integers(0, 60))
    changes = draw(st.lists(st.integers(1, last + 1), max_size=3))
    metadata = rotating_ledger(e, wq, aq, changes, last)
    held = _held_by_schedule(metadata)
    for bookie in list(held):
        lost = draw(st.sets(st.integers(0, last), max_size=6))
        held[bookie] -= lost
    return metadata, held


@settings(max_examples=300, deadline=None)
@given(damaged_ledgers())
def test_category_is_that_of_the_entry_with_fewest_copies(
    case: tuple[LedgerMetadata, dict[str, set[int]]],
) -> None:
    metadata, held = case
    availability = _availability(metadata, held)
    verdict = check_ledger(metadata, availability)
    fewest = _brute_force_fewest_copies(metadata, held)
    assert verdict.fewest_copies == fewest
    assert verdict.category == DurabilityCategory.of_copies(
        fewest, metadata.write_quorum, metadata.ack_quorum
    )
    assert not verdict.unresponsive_bookies


@settings(max_examples=200, deadline=None)
@given(damaged_ledgers())
def test_findings_name_exactly_the_missing_copies(
    case: tuple[LedgerMetadata, dict[str, set[int]]],
) -> None:
    metadata, held = case
    availability = _availability(metadata, held)
    verdict = check_ledger(metadata, availability)
    reported = {
        (f.segment_index, f.bookie_id, entry) for f in verdict.findings for entry in f.missing
    }
    expected = set()
    for index, (segment, (first, last)) in enumerate(
        zip(metadata.segments, metadata.segment_bounds(), strict=True)
    ):
        assert last is not None
        for entry in range(first, last + 1):
            for p in write_set(entry, metadata.ensemble_size, metadata.write_quorum):
                if entry not in held.get(segment.ensemble[p], set()):
                    expected.add((index, segment.ensemble[p], entry))
    assert reported == expected


def test_healthy_ledger_has_no_findings() -> None:
    metadata = rotating_ledger(5, 3, 2, [400], 999)
    held = _held_by_schedule(metadata)
    verdict = check_ledger(metadata, _availability(metadata, held))
    assert verdict.category is None
    assert verdict.fewest_copies == 3
    assert verdict.findings == ()


def test_a_lost_bookie_leaves_its_entries_below_write_quorum() -> None:
    metadata = rotating_ledger(3, 2, 2, [], 99)
    held = _held_by_schedule(metadata)
    held["b1"] = set()
    verdict = check_ledger(metadata, _availability(metadata, held))
    # Entries whose write set holds b1 keep one copy of two: below AQ=2.
    assert verdict.category is DurabilityCategory.BELOW_ACK_QUORUM
    assert verdict.fewest_copies == 1


def test_entry_lost_everywhere_is_no_replica() -> None:
    metadata = rotating_ledger(3, 3, 2, [], 9)
    held = {b: s - {4} for b, s in _held_by_schedule(metadata).items()}
    verdict = check_ledger(metadata, _availability(metadata, held))
    assert verdict.category is DurabilityCategory.NO_REPLICA
    assert verdict.fewest_copies == 0


def test_copies_outside_the_write_set_do_not_count_as_copies() -> None:
    metadata = rotating_ledger(4, 2, 2, [], 19)
    held = _held_by_schedule(metadata)
    # Entry 0 goes to positions 0 and 1; put it on b2 instead of b1.
    held["b1"].discard(0)
    held["b2"].add(0)
    verdict = check_ledger(metadata, _availability(metadata, held))
    assert verdict.category is DurabilityCategory.BELOW_ACK_QUORUM
    assert [(f.bookie_id, tuple(f.missing)) for f in verdict.findings] == [("b1", (0,))]


def test_entries_past_the_end_are_not_reported() -> None:
    metadata = rotating_ledger(3, 2, 2, [], 9)
    held = _held_by_schedule(metadata)
    held["b0"] |= {10, 11, 12}
    verdict = check_ledger(metadata, _availability(metadata, held))
    assert verdict.findings == ()


def test_unresponsive_bookie_is_not_judged() -> None:
    metadata = rotating_ledger(3, 3, 2, [], 29)
    held = _held_by_schedule(metadata)
    availability = _availability(metadata, held)
    del availability["b2"]
    verdict = check_ledger(metadata, availability)
    assert verdict.unresponsive_bookies == {"b2"}
    assert verdict.potentially_faulty
    assert verdict.category is None


def test_ten_million_entry_ledger_is_checked_by_group_arithmetic() -> None:
    metadata = rotating_ledger(5, 3, 2, [6_000_000], 9_999_999)
    expected = _expected_by_closed_form(metadata)
    # One bookie lost one entry in the middle of its second segment.
    damaged = expected["b1"].difference(EntryAvailability.from_entries([7_000_000]))
    expected["b1"] = damaged
    verdict = check_ledger(metadata, expected)
    assert verdict.category is DurabilityCategory.BELOW_WRITE_QUORUM
    assert [(f.bookie_id, list(f.missing)) for f in verdict.findings] == [("b1", [7_000_000])]


def _expected_by_closed_form(metadata: LedgerMetadata) -> dict[str, EntryAvailability]:
    held: dict[str, EntryAvailability] = {}
    for segment, (first, last) in zip(metadata.segments, metadata.segment_bounds(), strict=True):
        assert last is not None
        for position, bookie in enumerate(segment.ensemble):
            part = expected_entries(
                first, last, metadata.ensemble_size, metadata.write_quorum, position
            )
            held[bookie] = held.get(bookie, EntryAvailability.empty()).union(part)
    return held


def test_open_ledgers_are_refused() -> None:
    metadata = LedgerMetadata.create(
        ensemble=("a", "b"),
        write_quorum=2,
        ack_quorum=1,
        digest_type=DigestType.CRC32C,
        password=b"pw",
        ctime_ms=0,
        creator_token=b"t",
    )
    with pytest.raises(BadRequest, match="closed ledgers"):
        check_ledger(metadata, {})
