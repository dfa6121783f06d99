"""What a bookie's GC may drop: tombstoned ledgers, and extra copies of closed ledgers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tally.core.availability import EntryAvailability
from tally.core.deletion import Tombstone
from tally.core.garbage_collection import TombstoneAction, due, on_tombstone, overreplication_trim
from tally.core.ledger_metadata import Deletion, LedgerMetadata
from tally.core.schedule import write_set
from tests.support.ledgers import open_ledger

E3 = ("a:1", "b:1", "c:1")


def ledger(write_quorum: int = 2) -> LedgerMetadata:
    return open_ledger(E3, write_quorum)


def test_a_tombstone_drops_what_is_held_and_acknowledges_what_is_named() -> None:
    tombstone = Tombstone(Deletion(1, "x"), 2, 9, 90, {"a:1": None, "b:1": 5})
    assert on_tombstone(tombstone, "a:1", True) is TombstoneAction.DROP_THEN_ACKNOWLEDGE
    assert on_tombstone(tombstone, "z:1", True) is TombstoneAction.DROP_THEN_ACKNOWLEDGE
    assert on_tombstone(tombstone, "a:1", False) is TombstoneAction.ACKNOWLEDGE
    assert on_tombstone(tombstone, "b:1", False) is TombstoneAction.NOTHING
    assert on_tombstone(tombstone, "z:1", False) is TombstoneAction.NOTHING


def test_only_closed_ledgers_are_trimmed() -> None:
    everything = EntryAvailability.span(0, 100)
    assert overreplication_trim(ledger(), "z:1", everything) is None  # OPEN
    assert overreplication_trim(ledger().start_recovery(), "z:1", everything) is None
    deleted = ledger().close(9, 90).deleted(Deletion(1, "x"))
    assert overreplication_trim(deleted, "z:1", everything) is None


def test_a_bookie_no_segment_names_drops_the_whole_ledger() -> None:
    held = EntryAvailability.span(0, 9)
    trim = overreplication_trim(ledger().close(9, 90), "z:1", held)
    assert trim is not None
    assert trim.whole_ledger
    moved = ledger().with_ensemble_change(0, ("z:1", "b:1", "c:1")).close(9, 90)
    assert overreplication_trim(moved, "a:1", held) is not None


def test_entries_outside_the_write_sets_go_and_past_the_end_stay() -> None:
    closed = ledger().close(9, 90)  # E3 WQ2: position 0 holds entries 0, 2, 3, 5, 6, 8, 9
    expected = {e for e in range(10) if 0 in write_set(e, 3, 2)}
    assert overreplication_trim(closed, "a:1", EntryAvailability.from_entries(expected)) is None
    held = EntryAvailability.span(0, 14)
    trim = overreplication_trim(closed, "a:1", held)
    assert trim is not None
    assert not trim.whole_ledger
    assert set(trim.entries) == set(range(10)) - expected


@given(
    write_quorum=st.integers(1, 3),
    last=st.integers(-1, 40),
    change=st.integers(0, 41),
    held=st.sets(st.integers(0, 45)),
    bookie=st.sampled_from(["a:1", "b:1", "c:1", "d:1"]),
)
def test_a_trim_never_drops_an_entry_the_schedule_puts_on_the_bookie(
    write_quorum: int, last: int, change: int, held: set[int], bookie: str
) -> None:
    metadata = ledger(write_quorum)
    if change <= last + 1:
        metadata = metadata.with_ensemble_change(change, ("d:1", "b:1", "c:1"))
    metadata = metadata.close(last, max(last + 1, 0))
    trim = overreplication_trim(metadata, bookie, EntryAvailability.from_entries(sorted(held)))
    owed = {entry for entry in range(last + 1) if bookie in metadata.write_set_bookies(entry)}
    extra = {entry for entry in held if entry <= last} - owed
    if trim is None:
        assert not extra or (bookie not in metadata.bookies() and not held)
        return
    if trim.whole_ledger:
        assert not owed
        assert bookie not in metadata.bookies()
    else:
        dropped = set(trim.entries)
        assert dropped <= held
        assert dropped == extra


def test_a_step_is_due_at_first_and_after_its_interval() -> None:
    assert due(None, 60, 0)
    assert not due(100, 60, 159.9)
    assert due(100, 60, 160)
