from __future__ import annotations

import random
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.availability import (
    GROUP_SIZE,
    HEADER_SIZE,
    MAX_ENTRY_ID,
    MAX_SEQUENCE,
    SMALL_ARRAY,
    EntryAvailability,
    SequenceGroup,
    _group_runs,
)
from tally.core.errors import BadRequest, MalformedData
from tally.core.schedule import expected_entries

# -- an independent reference: the seed's rule, entry by entry -----------------------------


def runs_of(entries: set[int]) -> list[tuple[int, int]]:
    """(start, size) of the maximal runs."""
    runs: list[list[int]] = []
    for entry in sorted(entries):
        if runs and runs[-1][0] + runs[-1][1] == entry:
            runs[-1][1] += 1
        else:
            runs.append([entry, 1])
    return [(start, size) for start, size in runs]


def greedy(entries: set[int]) -> tuple[SequenceGroup, ...]:
    groups: list[SequenceGroup] = []
    for start, size in runs_of(entries):
        if groups:
            first, last, group_size, period = groups[-1]
            if group_size == size and period == 0:
                groups[-1] = SequenceGroup(first, start, size, start - first)
                continue
            if group_size == size and start - last == period:
                groups[-1] = SequenceGroup(first, start, size, period)
                continue
        groups.append(SequenceGroup(start, start, size, 0))
    return tuple(groups)


def encode(groups: list[SequenceGroup] | tuple[SequenceGroup, ...]) -> bytes:
    """The wire form of any grouping, written by hand from the spec."""
    header = struct.pack(">ii", 0, len(groups)) + bytes(56)
    return header + b"".join(struct.pack(">qqii", *group) for group in groups)


def bookkeeper_form(entries: set[int]) -> bytes:
    """What Apache BookKeeper's encoder writes: every run its own group, period 0."""
    return encode([SequenceGroup(start, start, size, 0) for start, size in runs_of(entries)])


def holds(groups: list[SequenceGroup], entry: int) -> bool:
    """Membership read straight off (possibly non-canonical) groups."""
    for first, last, size, period in groups:
        if first <= entry < last + size and (period == 0 or (entry - first) % period < size):
            return True
    return False


def count_of(groups: list[SequenceGroup]) -> int:
    return sum(
        ((last - first) // period + 1 if period else 1) * size
        for first, last, size, period in groups
    )


# -- strategies ----------------------------------------------------------------------------


@st.composite
def periodic_sets(draw: st.DrawFn, span: int = 400) -> set[int]:
    """Runs of a few sizes and periods laid end to end, with holes and strays."""
    entries: set[int] = set()
    cursor = draw(st.integers(0, 10))
    for size, extra, count, gap in draw(
        st.lists(
            st.tuples(st.integers(1, 4), st.integers(0, 4), st.integers(1, 25), st.integers(0, 6)),
            min_size=1,
            max_size=4,
        )
    ):
        period = size + extra
        for index in range(count):
            entries.update(range(cursor + index * period, cursor + index * period + size))
        cursor += count * period + gap
    entries -= draw(st.sets(st.integers(0, span), max_size=5))
    return entries | draw(st.sets(st.integers(0, span), max_size=3))


entry_sets = st.one_of(st.sets(st.integers(0, 300), max_size=80), periodic_sets())


@st.composite
def patterned_sets(draw: st.DrawFn) -> set[int]:
    """One to three periodic patterns over overlapping ranges of [0, 600), with holes."""
    entries: set[int] = set()
    for _ in range(draw(st.integers(1, 3))):
        size = draw(st.integers(1, 5))
        period = size + draw(st.integers(0, 6))
        phase = draw(st.integers(0, period - 1))
        lo = draw(st.integers(0, 300))
        hi = draw(st.integers(lo, 600))
        entries.update(e for e in range(lo, hi) if (e - phase) % period < size)
    return entries - draw(st.sets(st.integers(0, 600), max_size=4))


def random_grouping(entries: set[int], opens: list[bool]) -> list[SequenceGroup]:
    """A valid grouping of the runs that opens a new group wherever `opens` says, even where
    the greedy rule would have joined the run to the group before."""
    groups: list[SequenceGroup] = []
    for index, (start, size) in enumerate(runs_of(entries)):
        if groups and not (opens[index % len(opens)] if opens else False):
            first, last, group_size, period = groups[-1]
            if group_size == size and (period == 0 or start - last == period):
                groups[-1] = SequenceGroup(first, start, size, period or start - first)
                continue
        groups.append(SequenceGroup(start, start, size, 0))
    return groups


def regroup(groups: tuple[SequenceGroup, ...], cuts: list[int]) -> list[SequenceGroup]:
    """A valid, non-canonical grouping of the same entries: groups split into single runs,
    and some runs split into touching pieces."""
    pieces: list[SequenceGroup] = []
    for index, (first, last, size, period) in enumerate(groups):
        for start in range(first, last + 1, period or 1):
            cut = cuts[index % len(cuts)] if cuts else 0
            if 0 < cut < size:
                pieces.append(SequenceGroup(start, start, cut, 0))
                pieces.append(SequenceGroup(start + cut, start + cut, size - cut, 0))
            else:
                pieces.append(SequenceGroup(start, start, size, 0))
    return pieces


# -- the seed's worked examples and the header ---------------------------------------------


def test_seed_example_1_is_one_group() -> None:
    availability = EntryAvailability.from_entries([1, 2, 4, 5, 7, 8, 10, 11])
    assert availability.groups == (SequenceGroup(1, 10, 2, 3),)
    assert availability.to_bytes() == bytes.fromhex(
        "00000000" + "00000001" + "00" * 56 + "0000000000000001" + "000000000000000a" + "00000002"
        "00000003"
    )


def test_seed_example_2_groups_exactly_as_the_seed_writes() -> None:
    availability = EntryAvailability.from_entries([1, 2, 3, 6, 7, 8, 11, 13, 16, 17, 18, 21, 22])
    assert availability.groups == (
        SequenceGroup(1, 6, 3, 5),
        SequenceGroup(11, 13, 1, 2),
        SequenceGroup(16, 16, 3, 0),
        SequenceGroup(21, 21, 2, 0),
    )
    encoded = availability.to_bytes()
    assert struct.unpack_from(">ii", encoded) == (0, 4)  # groups, not the 13 entries
    assert len(encoded) == HEADER_SIZE + 4 * GROUP_SIZE
    assert encoded[8:HEADER_SIZE] == bytes(56)


def test_bookkeeper_bug_example_is_no_violation() -> None:
    # BookKeeper's getUnavailableEntries answers [4, 5, 9] here.
    available = EntryAvailability.from_entries([0, 4, 5, 9])
    expected = EntryAvailability.from_entries([0, 4, 5, 9])
    assert len(expected.difference(available)) == 0
    assert list(expected.intersection(available)) == [0, 4, 5, 9]
    decoded = EntryAvailability.from_bytes(bookkeeper_form({0, 4, 5, 9}))
    assert decoded.difference(expected) == EntryAvailability.empty()


def test_bookkeeper_uncompressed_form_of_a_healthy_bookie_decodes_to_one_group() -> None:
    entries = {e for e in range(3000) if e % 3 < 2}
    decoded = EntryAvailability.from_bytes(bookkeeper_form(entries))
    assert decoded.groups == (SequenceGroup(0, 2997, 2, 3),)
    assert len(decoded) == 2000


# -- round trips and the canonical form ----------------------------------------------------


@settings(max_examples=300)
@given(entry_sets)
def test_round_trip_matches_sets_and_the_seed_rule(entries: set[int]) -> None:
    availability = EntryAvailability.from_entries(sorted(entries))
    assert availability.groups == greedy(entries)
    assert list(availability) == sorted(entries)
    assert len(availability) == len(entries)
    assert availability.to_numpy().tolist() == sorted(entries)
    assert availability.to_numpy().dtype == np.int64
    decoded = EntryAvailability.from_bytes(availability.to_bytes())
    assert decoded == availability
    assert decoded.groups == availability.groups
    for entry in range(-1, max(entries, default=0) + 3):
        assert (entry in availability) == (entry in entries)


@settings(max_examples=200)
@given(entry_sets, st.lists(st.integers(0, 4), max_size=4))
def test_any_valid_grouping_decodes_to_the_canonical_one(
    entries: set[int], cuts: list[int]
) -> None:
    canonical = EntryAvailability.from_entries(entries)
    pieces = regroup(canonical.groups, cuts)
    assert EntryAvailability(pieces) == canonical
    assert EntryAvailability.from_bytes(encode(pieces)).groups == canonical.groups
    assert EntryAvailability.from_bytes(bookkeeper_form(entries)).groups == canonical.groups


@settings(max_examples=100)
@given(entry_sets, st.randoms(use_true_random=False))
def test_unsorted_duplicate_and_numpy_inputs_agree(entries: set[int], rng: random.Random) -> None:
    ordered = sorted(entries)
    shuffled = ordered * 2
    rng.shuffle(shuffled)
    canonical = EntryAvailability.from_entries(ordered)
    assert EntryAvailability.from_entries(shuffled) == canonical
    assert EntryAvailability.from_entries(np.array(shuffled, dtype=np.int32)) == canonical
    assert EntryAvailability.from_entries(np.array(ordered, dtype=np.uint64)) == canonical
    assert EntryAvailability.from_entries(iter(ordered)) == canonical


def test_sequences_longer_than_an_int32_are_cut_and_periods_stay_int32() -> None:
    # One run of 3 * MAX_SEQUENCE + 2 entries: pieces of MAX_SEQUENCE, then the remainder.
    long_run = expected_entries(0, 3 * MAX_SEQUENCE + 1, 1, 1, 0)
    assert long_run.groups == (
        SequenceGroup(0, 2 * MAX_SEQUENCE, MAX_SEQUENCE, MAX_SEQUENCE),
        SequenceGroup(3 * MAX_SEQUENCE, 3 * MAX_SEQUENCE, 2, 0),
    )
    assert len(long_run) == 3 * MAX_SEQUENCE + 2
    assert EntryAvailability.from_bytes(long_run.to_bytes()) == long_run
    touching = [
        SequenceGroup(0, 0, 3, 0),
        SequenceGroup(3, 3, MAX_SEQUENCE, 0),
        SequenceGroup(MAX_SEQUENCE + 3, MAX_SEQUENCE + 3, MAX_SEQUENCE, 0),
        SequenceGroup(2 * MAX_SEQUENCE + 3, 2 * MAX_SEQUENCE + 3, MAX_SEQUENCE - 1, 0),
    ]
    assert EntryAvailability(touching) == long_run
    # The numpy path cuts the same way (it cannot be fed 2^31 ids here, so feed it runs).
    starts = np.array([0, 3 * MAX_SEQUENCE + 10], dtype=np.int64)
    sizes = np.array([3 * MAX_SEQUENCE + 2, 7], dtype=np.int64)
    assert _group_runs(starts, sizes) == (
        *long_run.groups,
        SequenceGroup(3 * MAX_SEQUENCE + 10, 3 * MAX_SEQUENCE + 10, 7, 0),
    )
    # Runs further apart than an int32 cannot share a group.
    near = [0, MAX_SEQUENCE, 2 * MAX_SEQUENCE]
    assert EntryAvailability.from_entries(near).groups == (
        SequenceGroup(0, 2 * MAX_SEQUENCE, 1, MAX_SEQUENCE),
    )
    far = [0, MAX_SEQUENCE + 1, 2 * MAX_SEQUENCE + 2]
    assert EntryAvailability.from_entries(far).groups == tuple(
        SequenceGroup(entry, entry, 1, 0) for entry in far
    )
    assert EntryAvailability([SequenceGroup(entry, entry, 1, 0) for entry in far]).groups == (
        EntryAvailability.from_entries(far).groups
    )
    # Set operations over them stay in the same canonical form.
    every_third = expected_entries(0, 3 * MAX_SEQUENCE + 1, 3, 1, 0)
    rest = expected_entries(0, 3 * MAX_SEQUENCE + 1, 3, 2, 2)
    assert long_run.difference(every_third) == rest
    assert long_run.intersection(every_third) == every_third


def test_largest_entry_ids() -> None:
    top = EntryAvailability.from_entries([MAX_ENTRY_ID - 3, MAX_ENTRY_ID - 1, MAX_ENTRY_ID])
    assert EntryAvailability.from_bytes(top.to_bytes()) == top
    assert MAX_ENTRY_ID in top
    assert MAX_ENTRY_ID - 2 not in top


# -- bad input to from_entries and EntryAvailability(groups) -------------------------------


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([3, -1, 4], "entry id -1 is negative"),
        (np.array([-5, 2], dtype=np.int64), "entry id -5 is negative"),
        ([2**63], "beyond"),
        ([2**64, 1], "outside"),
        ([1.5, 2.0], "integers"),
        (["1", "2"], "integers"),
        ([1, None], "integers"),
        (np.zeros((2, 2), dtype=np.int64), "one-dimensional"),
    ],
)
def test_from_entries_refuses_what_is_not_an_entry_id(entries: object, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        EntryAvailability.from_entries(entries)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([(1, 1, 1)], "not four integers"),
        ([(1, 1, 1, True)], "not four integers"),
        (["abcd"], "not four integers"),
        ([(0, 0, 0, 0)], "sequence group 0: sequence_size 0"),
        ([(0, 4, 2, 1)], "not disjoint"),
        ([(0, 0, 2, 0), (1, 1, 1, 0)], "sequence group 1: .*not after the previous group"),
    ],
)
def test_invalid_groups_are_bad_requests(groups: list[object], message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        EntryAvailability(groups)  # type: ignore[arg-type]


# -- decoding: every malformation rejected, naming where -----------------------------------

HEALTHY = EntryAvailability.from_entries([1, 2, 3, 6, 7, 8, 11, 13, 16, 17, 18, 21, 22])


def with_group(index: int, group: tuple[int, int, int, int]) -> bytes:
    encoded = bytearray(HEALTHY.to_bytes())
    struct.pack_into(">qqii", encoded, HEADER_SIZE + index * GROUP_SIZE, *group)
    return bytes(encoded)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "truncated: 0 bytes"),
        (bytes(63), "truncated: 63 bytes"),
        (struct.pack(">ii", 1, 0) + bytes(56), "version 1 at offset 0"),
        (struct.pack(">ii", -1, 0) + bytes(56), "version -1"),
        (
            struct.pack(">ii", 0, 0) + bytes(55) + b"\x01",
            "reserved header byte at offset 63 is 0x01",
        ),
        (struct.pack(">ii", 0, -1) + bytes(56), "count -1 at offset 4 is negative"),
        (struct.pack(">ii", 0, 2**31 - 1) + bytes(56), "sequence group 0 at offset 64 is cut"),
        (HEALTHY.to_bytes()[:-1], "sequence group 3 at offset 136 is cut"),
        (HEALTHY.to_bytes() + b"\x00", "1 trailing bytes at offset 160"),
        (with_group(0, (-1, 6, 3, 5)), "group 0 at offset 64: first_sequence_start -1 is negative"),
        (with_group(1, (11, 9, 1, 2)), "group 1 at offset 88: last_sequence_start 9 is before"),
        (with_group(1, (11, 13, 0, 2)), "group 1 at offset 88: sequence_size 0"),
        (with_group(1, (11, 13, -3, 2)), "sequence_size -3"),
        (with_group(1, (11, 13, 1, -2)), "sequence_period -2"),
        (with_group(1, (11, 13, 1, 0)), "sequences from 11 to 13 with sequence_period 0"),
        (with_group(1, (11, 14, 1, 2)), "not a whole number of periods"),
        (with_group(1, (11, 13, 3, 2)), "not disjoint"),
        (
            with_group(2, (16, 16, 3, 4)),
            "group 2 at offset 112: one sequence with sequence_period 4",
        ),
        (
            with_group(1, (8, 8, 1, 0)),
            "group 1 at offset 88: .*not after the previous group, which ends at entry 8",
        ),
        (with_group(3, (1, 1, 2, 0)), "group 3 at offset 136: .*not after the previous group"),
        (with_group(3, (MAX_ENTRY_ID, MAX_ENTRY_ID, 2, 0)), "beyond"),
    ],
)
def test_malformed_bytes_are_rejected_saying_where(data: bytes, message: str) -> None:
    with pytest.raises(MalformedData, match=message):
        EntryAvailability.from_bytes(data)


def test_from_bytes_takes_bytes_likes_only() -> None:
    encoded = HEALTHY.to_bytes()
    assert EntryAvailability.from_bytes(bytearray(encoded)) == HEALTHY
    assert EntryAvailability.from_bytes(memoryview(encoded)) == HEALTHY
    with pytest.raises(BadRequest, match="must be bytes"):
        EntryAvailability.from_bytes(64)  # type: ignore[arg-type]


@settings(max_examples=300)
@given(entry_sets, st.data())
def test_a_flipped_byte_is_rejected_or_decodes_to_exactly_what_the_bytes_say(
    entries: set[int], data: st.DataObject
) -> None:
    """Without a checksum, a flip inside a value may describe another well-formed set; the
    decoder must then return exactly that set, and must reject every other flip."""
    encoded = bytearray(EntryAvailability.from_entries(entries).to_bytes())
    offset = data.draw(st.integers(0, len(encoded) - 1))
    encoded[offset] ^= data.draw(st.integers(1, 255))
    try:
        decoded = EntryAvailability.from_bytes(bytes(encoded))
    except MalformedData:
        return
    assert offset >= HEADER_SIZE, "a header flip must never decode"
    said = [SequenceGroup._make(g) for g in struct.iter_unpack(">qqii", encoded[HEADER_SIZE:])]
    assert len(decoded) == count_of(said)
    probes = set(entries)
    for first, last, size, _ in said:
        probes.update({first - 1, first, first + size - 1, first + size, last - 1, last})
        probes.update({last + size - 1, last + size, (first + last) // 2})
    for probe in probes:
        assert (probe in decoded) == holds(said, probe)
    assert EntryAvailability.from_bytes(decoded.to_bytes()) == decoded


@settings(max_examples=100)
@given(entry_sets)
def test_every_cut_is_rejected(entries: set[int]) -> None:
    encoded = EntryAvailability.from_entries(entries).to_bytes()
    for length in range(len(encoded)):
        with pytest.raises(MalformedData):
            EntryAvailability.from_bytes(encoded[:length])


# -- set operations ------------------------------------------------------------------------


def check_operations(these: set[int], those: set[int]) -> None:
    left, right = EntryAvailability.from_entries(these), EntryAvailability.from_entries(those)
    for result, expected in (
        (left.difference(right), these - those),
        (right.difference(left), those - these),
        (left.intersection(right), these & those),
        (right.intersection(left), these & those),
        (left.union(right), these | those),
        (right.union(left), these | those),
    ):
        assert set(result) == expected
        assert result.groups == greedy(expected)  # canonical, group for group


@settings(max_examples=300)
@given(entry_sets, entry_sets)
def test_set_operations_match_python_sets(these: set[int], those: set[int]) -> None:
    check_operations(these, those)


@settings(max_examples=300)
@given(patterned_sets(), patterned_sets())
def test_set_operations_on_different_periods_match_python_sets(
    these: set[int], those: set[int]
) -> None:
    check_operations(these, those)


@settings(max_examples=200)
@given(
    st.integers(0, 50),
    st.integers(0, 400),
    st.integers(1, 6),
    st.data(),
)
def test_expected_minus_available_finds_exactly_the_missing_entries(
    first: int, length: int, ensemble_size: int, data: st.DataObject
) -> None:
    write_quorum = data.draw(st.integers(1, ensemble_size))
    position = data.draw(st.integers(0, ensemble_size - 1))
    expected = expected_entries(first, first + length, ensemble_size, write_quorum, position)
    lost = set(data.draw(st.lists(st.sampled_from(list(expected) or [0]), max_size=4)))
    extra = set(data.draw(st.sets(st.integers(0, 500), max_size=3)))
    available = EntryAvailability.from_entries((set(expected) | extra) - lost)
    assert set(expected.difference(available)) == lost & set(expected)
    assert expected.difference(available) == EntryAvailability.from_entries(lost & set(expected))


@pytest.mark.timeout(20)
def test_ten_million_entry_healthy_ledger_compares_right() -> None:
    entries = 10**7
    expected = expected_entries(0, entries - 1, 3, 2, 1)
    stored = expected.to_numpy()
    assert stored.size == 6_666_667
    available = EntryAvailability.from_bytes(EntryAvailability.from_entries(stored).to_bytes())
    assert available == expected
    assert len(expected.difference(available)) == 0
    assert expected.intersection(available) == expected
    lost = [int(stored[5]), int(stored[3_000_000]), int(stored[-1])]
    damaged = EntryAvailability.from_entries(np.setdiff1d(stored, lost, assume_unique=True))
    assert list(expected.difference(damaged)) == lost
    assert len(damaged.groups) <= 8


@pytest.mark.timeout(20)
def test_results_that_repeat_per_period_cost_groups_not_entries() -> None:
    # Positions 1 and 2 of E=3, WQ=2 share one entry per period; over 10^12 entries the
    # answers are single groups, found without walking the periods.
    last = 10**12
    one, two = expected_entries(0, last, 3, 2, 1), expected_entries(0, last, 3, 2, 2)
    assert one.intersection(two).groups == (SequenceGroup(1, last, 1, 3),)
    assert one.difference(two).groups == (SequenceGroup(0, last - 1, 1, 3),)
    assert len(one.difference(two)) == last // 3 + 1
    # E=4, WQ=3: positions 0 and 1 share entries 3, 4 (mod 4), a run across each period.
    zero, first = expected_entries(4, last, 4, 3, 0), expected_entries(4, last, 4, 3, 1)
    assert zero.intersection(first).groups == (
        SequenceGroup(4, 4, 1, 0),
        SequenceGroup(7, last - 1, 2, 4),
    )
    # A run of the result across the start of every period: all entries from 6 minus 1 mod 3.
    every_entry = EntryAvailability([SequenceGroup(6, 6, 1000, 0)])
    ones = expected_entries(0, last, 3, 1, 1)
    assert every_entry.difference(ones).groups == (
        SequenceGroup(6, 6, 1, 0),
        SequenceGroup(8, 1004, 2, 3),
    )
    every_entry = expected_entries(6, last, 2, 2, 0)
    assert every_entry.difference(ones).groups == (
        SequenceGroup(6, 6, 1, 0),
        SequenceGroup(8, last - 2, 2, 3),
    )
    every_third, every_fifth = (
        expected_entries(0, last, 3, 1, 0),
        expected_entries(0, last, 5, 1, 0),
    )
    common = every_third.intersection(every_fifth)  # periods 3 and 5: one run per 15
    assert common.groups == (SequenceGroup(0, last // 15 * 15, 1, 15),)
    assert every_fifth.intersection(every_third) == common


def test_span_is_every_entry_of_a_range() -> None:
    assert EntryAvailability.span(3, 7).groups == (SequenceGroup(3, 3, 5, 0),)
    assert EntryAvailability.span(3, 2) == EntryAvailability.empty()
    assert EntryAvailability.span(0, 3 * MAX_SEQUENCE + 1) == expected_entries(
        0, 3 * MAX_SEQUENCE + 1, 1, 1, 0
    )
    with pytest.raises(BadRequest, match=r"entries -1\.\.5"):
        EntryAvailability.span(-1, 5)
    with pytest.raises(BadRequest, match="outside"):
        EntryAvailability.span(0, MAX_ENTRY_ID + 1)


def test_union_of_all_positions_is_the_whole_segment() -> None:
    last = 10**12
    union = EntryAvailability.empty()
    for position in range(5):
        union = union.union(expected_entries(7, last, 5, 2, position))
    assert union == EntryAvailability.span(7, last)


# -- the small things ----------------------------------------------------------------------


def test_empty_equality_hash_and_repr() -> None:
    empty = EntryAvailability.empty()
    assert empty == EntryAvailability() == EntryAvailability.from_entries([])
    assert not empty
    assert len(empty) == 0
    assert list(empty) == []
    assert 0 not in empty
    assert empty.to_numpy().size == 0
    assert EntryAvailability.from_bytes(empty.to_bytes()) == empty
    assert repr(empty) == "EntryAvailability(0 entries: none)"
    again = EntryAvailability.from_entries([22, 21, 1, 2, 3, 6, 7, 8, 11, 13, 16, 17, 18])
    assert again == HEALTHY
    assert hash(again) == hash(HEALTHY)
    assert again != EntryAvailability.from_entries([1])
    assert again != {1}
    assert repr(HEALTHY) == (
        "EntryAvailability(13 entries: [1..3] every 5 to [6..8], [11] every 2 to [13], "
        "[16..18], [21..22])"
    )
    assert repr(EntryAvailability.from_entries(range(0, 40, 2))) == (
        "EntryAvailability(20 entries: [0] every 2 to [38])"
    )
    scattered = EntryAvailability.from_entries([k * (k + 3) // 2 for k in range(16)])
    assert len(scattered.groups) == 8
    assert repr(scattered).endswith("[65] every 12 to [77], ... 2 more groups)")


def test_membership_of_non_integers_is_false() -> None:
    assert "1" not in HEALTHY
    assert 1.0 not in HEALTHY
    assert np.int64(1) in HEALTHY
    assert None not in HEALTHY


@pytest.mark.parametrize("count", [SMALL_ARRAY - 1, SMALL_ARRAY, SMALL_ARRAY + 1])
def test_a_few_entries_grouped_in_python_match_the_numpy_grouping(count: int) -> None:
    """Both sides of SMALL_ARRAY give the canonical groups: runs, periods, a lone entry."""
    entries = {*range(0, 3 * (count // 2), 3), *range(2000, 2000 + count - count // 2), 9999}
    ordered = sorted(entries)[:count]
    assert EntryAvailability.from_entries(ordered).groups == greedy(set(ordered))
    assert EntryAvailability.from_entries(ordered[::-1] * 2).groups == greedy(set(ordered))
    with pytest.raises(BadRequest, match="entry id -1 is negative"):
        EntryAvailability.from_entries([*ordered[: count - 1], -1])
