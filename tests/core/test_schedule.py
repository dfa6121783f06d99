from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.availability import MAX_ENTRY_ID, EntryAvailability, SequenceGroup
from tally.core.errors import BadRequest
from tally.core.schedule import (
    check_quorums,
    entries_to_verify,
    expected_entries,
    stores_entry,
    write_set,
)


def test_write_set_is_round_robin() -> None:
    assert write_set(0, 3, 2) == (0, 1)
    assert write_set(2, 3, 2) == (2, 0)
    assert write_set(7, 5, 3) == (2, 3, 4)
    assert write_set(4, 5, 5) == (4, 0, 1, 2, 3)


@settings(max_examples=200)
@given(st.integers(0, 10**6), st.integers(1, 9), st.data())
def test_stores_entry_agrees_with_write_set(
    entry: int, ensemble_size: int, data: st.DataObject
) -> None:
    write_quorum = data.draw(st.integers(1, ensemble_size))
    chosen = write_set(entry, ensemble_size, write_quorum)
    assert len(set(chosen)) == write_quorum
    for position in range(ensemble_size):
        assert stores_entry(position, entry, ensemble_size, write_quorum) == (position in chosen)


@pytest.mark.parametrize(("ensemble", "write", "ack"), [(2, 3, 1), (3, 2, 3), (3, 0, 0), (0, 0, 0)])
def test_check_quorums_refuses_broken_sizes(ensemble: int, write: int, ack: int) -> None:
    with pytest.raises(BadRequest, match=f"E={ensemble} WQ={write} AQ={ack}"):
        check_quorums(ensemble, write, ack)


def test_write_set_refuses_negative_entries() -> None:
    with pytest.raises(BadRequest, match="entry id -1 is negative"):
        write_set(-1, 3, 2)


def brute_force(
    first: int, last: int, ensemble_size: int, write_quorum: int, position: int
) -> set[int]:
    return {
        entry
        for entry in range(first, last + 1)
        if stores_entry(position, entry, ensemble_size, write_quorum)
    }


@settings(max_examples=500)
@given(st.integers(0, 60), st.integers(-3, 80), st.integers(1, 7), st.data())
def test_expected_entries_is_the_brute_force_set_in_canonical_form(
    first: int, length: int, ensemble_size: int, data: st.DataObject
) -> None:
    write_quorum = data.draw(st.integers(1, ensemble_size))
    position = data.draw(st.integers(0, ensemble_size - 1))
    last = first + length
    expected = expected_entries(first, last, ensemble_size, write_quorum, position)
    wanted = brute_force(first, last, ensemble_size, write_quorum, position)
    assert set(expected) == wanted
    assert expected.groups == EntryAvailability.from_entries(wanted).groups
    assert len(expected.groups) <= 3


def test_healthy_position_is_one_group_and_the_seed_example() -> None:
    # Seed example 1 is what position 2 of E=3, WQ=2 holds of entries 1..11.
    assert expected_entries(1, 11, 3, 2, 2).groups == (SequenceGroup(1, 10, 2, 3),)
    assert expected_entries(0, 8, 3, 2, 1).groups == (SequenceGroup(0, 6, 2, 3),)
    assert expected_entries(0, 8, 3, 3, 1).groups == (SequenceGroup(0, 0, 9, 0),)


def test_every_entry_has_write_quorum_copies() -> None:
    first, last, ensemble_size, write_quorum = 5, 200, 5, 3
    copies = [
        len(expected_entries(first, last, ensemble_size, write_quorum, position))
        for position in range(ensemble_size)
    ]
    assert sum(copies) == (last - first + 1) * write_quorum


def test_closed_form_does_not_walk_the_entries() -> None:
    # 10^18 entries: answered in a few groups, with exact counts.
    last = 10**18
    expected = expected_entries(3, last, 5, 2, 4)
    assert len(expected.groups) <= 3
    # Position 4 holds residues 3 and 4 (mod 5).
    assert len(expected) == (last - 3) // 5 + 1 + (last - 4) // 5 + 1
    tail = EntryAvailability.from_entries(range(last - 4, last + 1))
    assert list(tail.intersection(expected)) == [last - 2, last - 1]
    top = expected_entries(MAX_ENTRY_ID - 10, MAX_ENTRY_ID, 3, 2, 0)
    assert set(top) == brute_force(MAX_ENTRY_ID - 10, MAX_ENTRY_ID, 3, 2, 0)


def test_empty_when_last_is_before_first() -> None:
    assert expected_entries(10, 9, 3, 2, 0) == EntryAvailability.empty()
    assert expected_entries(0, -1, 3, 2, 0) == EntryAvailability.empty()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ((0, 10, 3, 4, 0), "E=3 WQ=4"),
        ((0, 10, 0, 0, 0), "E=0 WQ=0"),
        ((0, 10, 3, 2, 3), "position 3 is outside the ensemble 0..2"),
        ((0, 10, 3, 2, -1), "position -1"),
        ((-1, 10, 3, 2, 0), "entries -1..10"),
        ((0, MAX_ENTRY_ID + 1, 3, 2, 0), "outside 0.."),
        ((0, 10, 2**31, 1, 0), "ensemble size 2147483648"),
    ],
)
def test_expected_entries_refuses_bad_arguments(arguments: tuple[int, ...], message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        expected_entries(*arguments)


@pytest.mark.parametrize(
    ("first", "last", "percentage", "expected"),
    [
        (0, 9, 0, [0, 9]),
        (5, 5, 0, [5]),
        (5, 4, 50, []),
        (0, 9, 100, list(range(10))),
        (0, 9, 30, [0, 3, 6, 9]),
        (10, 1009, 1, [10, *range(10, 1010, 100), 1009]),
    ],
)
def test_the_ledger_check_reads_the_ends_and_a_spread_sample(
    first: int, last: int, percentage: int, expected: list[int]
) -> None:
    assert entries_to_verify(first, last, percentage) == sorted(set(expected))
