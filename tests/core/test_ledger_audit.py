"""The audit of one ledger against brute-force counts, entry by entry and write set by write set."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.availability import EntryAvailability
from tally.core.clean_ledgers import LedgerColumns, clean_ledgers
from tally.core.deletion import Tombstone
from tally.core.digest import DigestType
from tally.core.durability import DurabilityCategory
from tally.core.errors import BadRequest
from tally.core.ledger_audit import (
    VIOLATION_CATEGORIES,
    Category,
    Violation,
    audit_ledger,
    deletion_stuck,
    marked_too_long,
    potentially_faulty,
)
from tally.core.ledger_metadata import Deletion, LedgerMetadata, LedgerState, Segment
from tally.core.placement import (
    DEFAULT_RACK,
    PlacementAdherence,
    adherence_of_racks,
    rack_of,
)
from tally.core.schedule import write_set
from tests.support.ledgers import held_by_schedule

BOOKIES = [f"b{i}" for i in range(8)]
RACKS = {bookie: f"/r{i % 3}" for i, bookie in enumerate(BOOKIES)}
HOUR_MS = 3_600_000


def _ledger(wq: int, aq: int, ensembles: list[tuple[str, ...]], firsts: list[int], last: int):
    return LedgerMetadata(
        state=LedgerState.CLOSED,
        ensemble_size=len(ensembles[0]),
        write_quorum=wq,
        ack_quorum=aq,
        segments=tuple(Segment(f, e) for f, e in zip(firsts, ensembles, strict=True)),
        digest_type=DigestType.CRC32C,
        master_key=bytes(32),
        ctime_ms=0,
        creator_token=b"",
        last_entry_id=last,
        length=last + 1,
    )


def _audit(
    metadata: LedgerMetadata,
    held: dict[str, set[int]],
    *,
    racks: dict[str, str] = RACKS,
    min_racks: int = 2,
    since: int | None = None,
    now: int = 10 * HOUR_MS,
    cluster_racks: int | None = None,
) -> list[Violation]:
    availability = {b: EntryAvailability.from_entries(s) for b, s in held.items()}
    return audit_ledger(
        metadata,
        availability,
        racks=racks,
        min_racks=min_racks,
        underreplicated_since_ms=since,
        now_ms=now,
        grace_period_ms=HOUR_MS,
        cluster_racks=cluster_racks,
    )


def _rows(violations: list[Violation]) -> list[tuple[str, int | None, str | None, int | None]]:
    return [(v.category.value, v.segment_index, v.bookie_id, v.missing_count) for v in violations]


# -- against brute force -----------------------------------------------------------------------


@st.composite
def audited_ledgers(draw: st.DrawFn) -> tuple[LedgerMetadata, dict[str, set[int]], dict[str, str]]:
    """A closed ledger with ensemble changes, then damage: lost entries, strays, silent
    bookies, foreign bookies holding entries, and random racks."""
    e = draw(st.integers(1, 5))
    wq = draw(st.integers(1, e))
    aq = draw(st.integers(1, wq))
    last = draw(st.integers(0, 50))
    firsts = [0, *sorted(draw(st.sets(st.integers(1, last + 1), max_size=3)))]
    ensembles = [tuple(draw(st.permutations(BOOKIES))[:e]) for _ in firsts]
    metadata = _ledger(wq, aq, ensembles, firsts, last)
    held = held_by_schedule(metadata)
    entries = st.integers(0, last + 3)
    for bookie in sorted(held):
        held[bookie] -= draw(st.sets(entries, max_size=5))
        held[bookie] |= draw(st.sets(entries, max_size=2))
    for bookie in draw(st.sets(st.sampled_from(BOOKIES), max_size=2)):
        held[bookie] = held.get(bookie, set()) | draw(st.sets(entries, max_size=3))
    for bookie in draw(st.sets(st.sampled_from(sorted(held)), max_size=2)):
        del held[bookie]
    racks = {b: draw(st.sampled_from(["/a", "/b", "/c"])) for b in BOOKIES}
    return metadata, held, racks


def _expected_rows(
    metadata: LedgerMetadata, held: dict[str, set[int]], racks: dict[str, str], min_racks: int
) -> list[tuple[str, int | None, str | None, int | None]]:
    e, wq, aq = metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum
    bounds = metadata.segment_bounds()
    fewest = wq
    missing: dict[tuple[int, str], int] = {}
    extra: dict[tuple[int, str], int] = {}
    for index, (segment, (first, last)) in enumerate(zip(metadata.segments, bounds, strict=True)):
        assert last is not None
        for entry in range(first, last + 1):
            positions = write_set(entry, e, wq)
            lacking = [
                segment.ensemble[p]
                for p in positions
                if segment.ensemble[p] in held and entry not in held[segment.ensemble[p]]
            ]
            fewest = min(fewest, wq - len(lacking))
            for bookie in lacking:
                missing[index, bookie] = missing.get((index, bookie), 0) + 1
            owners = {segment.ensemble[p] for p in positions}
            for bookie, entries in held.items():
                if entry in entries and bookie not in owners:
                    extra[index, bookie] = extra.get((index, bookie), 0) + 1
    rows: list[tuple[str, int | None, str | None, int | None]] = []
    category = DurabilityCategory.of_copies(fewest, wq, aq)
    if category is not None:
        by_position = [
            (index, segment.ensemble.index(bookie), bookie, count)
            for (index, bookie), count in missing.items()
            for segment in [metadata.segments[index]]
        ]
        rows += [(category.value, i, b, n) for i, _, b, n in sorted(by_position)]
    rows += [("over_replicated", i, b, n) for (i, b), n in sorted(extra.items())]
    holding = {  # an empty trailing segment's bookies hold nothing that counts
        bookie
        for segment, (first, last) in zip(metadata.segments, bounds, strict=True)
        if last is not None and last >= first
        for bookie in segment.ensemble
    }
    rows += [("potentially_faulty", None, b, None) for b in sorted(holding - held.keys())]
    cluster = len(set(racks.values()))
    for index, (segment, (first, last)) in enumerate(zip(metadata.segments, bounds, strict=True)):
        assert last is not None
        if last < first:
            continue
        spans = min(
            len({racks[segment.ensemble[(s + k) % e]] for k in range(wq)}) for s in range(e)
        )
        if spans < min(wq, min_racks, cluster):
            rows.append(("placement_fail", index, None, None))
        elif spans < min(wq, cluster):
            rows.append(("placement_soft", index, None, None))
    return rows


@settings(max_examples=400, deadline=None)
@given(audited_ledgers(), st.integers(1, 4))
def test_rows_match_a_brute_force_count_of_every_entry(
    case: tuple[LedgerMetadata, dict[str, set[int]], dict[str, str]], min_racks: int
) -> None:
    metadata, held, racks = case
    found = _audit(metadata, held, racks=racks, min_racks=min_racks)
    assert _rows(found) == _expected_rows(metadata, held, racks, min_racks)
    for violation in found:
        if violation.missing_count is not None:
            assert str(violation.missing_count) in violation.detail
        if violation.category is Category.OVER_REPLICATED:
            assert violation.missing_count is not None
            mean = metadata.length / (metadata.last_entry_id + 1)
            assert violation.byte_count == int(violation.missing_count * mean)
        else:
            assert violation.byte_count is None


@settings(max_examples=100, deadline=None)
@given(audited_ledgers(), st.integers(0, 3 * HOUR_MS))
def test_a_marked_ledger_is_judged_only_on_how_long_it_has_been_marked(
    case: tuple[LedgerMetadata, dict[str, set[int]], dict[str, str]], marked_for: int
) -> None:
    metadata, held, racks = case
    found = _audit(metadata, held, racks=racks, since=1000, now=1000 + marked_for)
    if marked_for <= HOUR_MS:
        assert found == []
    else:
        assert _rows(found) == [("underreplicated_too_long", None, None, None)]
        assert f"{marked_for} ms ago" in found[0].detail


@settings(max_examples=200, deadline=None)
@given(
    audited_ledgers(),
    st.integers(0, 10 * HOUR_MS),
    st.integers(0, 10 * HOUR_MS),
    st.sampled_from([0, 0, 1, HOUR_MS]) | st.integers(0, 3 * HOUR_MS),
)
def test_the_spark_audit_and_the_online_check_read_the_grace_period_alike(
    case: tuple[LedgerMetadata, dict[str, set[int]], dict[str, str]],
    since: int,
    now: int,
    grace: int,
) -> None:
    """`audit_ledger` (the Spark job, confirm) reports a mark exactly when `marked_too_long`
    (the online check) does: a grace period of 0 never reports one."""
    metadata, held, racks = case
    found = audit_ledger(
        metadata,
        {b: EntryAvailability.from_entries(s) for b, s in held.items()},
        racks=racks,
        min_racks=2,
        underreplicated_since_ms=since,
        now_ms=now,
        grace_period_ms=grace,
    )
    assert bool(found) == marked_too_long(since, now, grace)
    if grace == 0:
        assert found == []


# -- one example per category ------------------------------------------------------------------

ABC = ("b0", "b1", "b2")


def test_a_healthy_well_placed_ledger_has_no_violations() -> None:
    metadata = _ledger(2, 2, [ABC, ("b0", "b1", "b5")], [0, 500], 999)
    assert _audit(metadata, held_by_schedule(metadata)) == []


def test_an_entry_on_no_bookie_is_no_replica() -> None:
    metadata = _ledger(2, 1, [ABC], [0], 9)
    held = held_by_schedule(metadata)
    held["b0"].discard(3)
    held["b1"].discard(3)
    found = _audit(metadata, held)
    assert _rows(found) == [("no_replica", 0, "b0", 1), ("no_replica", 0, "b1", 1)]
    assert found[0].detail == (
        "bookie b0 (segment 0, position 0) lacks 1 of the 7 entries its write sets put there "
        "(entries 3); the worst entry of the ledger has 0 of WQ=2 copies (AQ=1)"
    )


def test_a_lost_bookie_leaves_entries_below_ack_quorum() -> None:
    metadata = _ledger(2, 2, [ABC], [0], 29)
    held = held_by_schedule(metadata)
    held["b1"] = set()
    found = _audit(metadata, held)
    assert _rows(found) == [("below_ack_quorum", 0, "b1", 20)]
    assert "(entries 0, 1, 3, 4, 6, ...)" in found[0].detail


def test_one_missing_copy_of_three_is_below_write_quorum() -> None:
    metadata = _ledger(3, 2, [ABC], [0], 9)
    held = held_by_schedule(metadata)
    held["b2"].discard(7)
    assert _rows(_audit(metadata, held)) == [("below_write_quorum", 0, "b2", 1)]


def test_the_worst_entry_sets_the_category_of_every_row() -> None:
    metadata = _ledger(3, 2, [ABC], [0], 9)
    held = held_by_schedule(metadata)
    held["b2"].discard(7)
    for bookie in ABC:
        held[bookie].discard(4)
    assert {v.category for v in _audit(metadata, held)} == {Category.NO_REPLICA}


def test_entries_outside_their_write_sets_are_over_replication_counted_in_bytes() -> None:
    metadata = _ledger(2, 2, [ABC, ("b3", "b4", "b5")], [0, 10], 19)
    metadata = dataclasses.replace(metadata, length=20 * 1000 + 7)  # 1000.35 bytes per entry
    held = held_by_schedule(metadata)
    held["b2"].add(0)  # entry 0 goes to b0 and b1
    held["b0"].add(15)  # b0 is not in segment 1
    held["b7"] = {1, 2, 30}  # b7 is in no ensemble; 30 is past the end
    found = _audit(metadata, held)
    assert _rows(found) == [
        ("over_replicated", 0, "b2", 1),
        ("over_replicated", 0, "b7", 2),
        ("over_replicated", 1, "b0", 1),
    ]
    assert [v.byte_count for v in found] == [1000, 2000, 1000]
    assert found[0].detail == (
        "bookie b2 holds 1 entries of segment 0 (position 2) outside its write sets "
        "(entries 0), about 1000 bytes: extra copies, not a violation"
    )
    assert found[1].detail == (
        "bookie b7 holds 2 entries of segment 0 although it is not in the segment's ensemble "
        "(entries 1, 2), about 2000 bytes: extra copies, not a violation"
    )
    assert not any(v.category.is_violation for v in found)


def test_a_bookie_back_at_another_position_holds_every_entry_extra_copies_only() -> None:
    """The copies the issue found: b3 held position 0, was replaced there by b4 while it was
    down, came back and was later chosen for position 1; what it keeps of position 0 is
    over-replication, and the ledger has no violation."""
    metadata = _ledger(2, 2, [("b4", "b3", "b2")], [0], 29)
    held = held_by_schedule(metadata)
    held["b3"] = set(range(30))
    found = _audit(metadata, held)
    assert _rows(found) == [("over_replicated", 0, "b3", 10)]
    assert [v.category for v in found if v.category.is_violation] == []


def test_entries_past_the_end_are_leftovers_not_strays() -> None:
    metadata = _ledger(2, 2, [ABC, ("b3", "b4", "b5")], [0, 10], 9)
    held = held_by_schedule(metadata)
    held["b3"] = {10, 11}
    held["b7"] = {12}
    assert _audit(metadata, held) == []


def test_a_silent_bookie_makes_the_ledger_potentially_faulty_and_is_not_judged() -> None:
    metadata = _ledger(2, 2, [ABC, ("b0", "b1", "b5")], [0, 5], 9)
    held = held_by_schedule(metadata)
    del held["b1"]
    found = _audit(metadata, held)
    assert _rows(found) == [("potentially_faulty", None, "b1", None)]
    assert found[0].detail == (
        "bookie b1 of segment(s) 0, 1 did not report its entries; its copies are not judged"
    )


def test_write_sets_on_too_few_racks_fail_placement() -> None:
    metadata = _ledger(2, 2, [("b0", "b3", "b1")], [0], 9)  # racks /r0 /r0 /r1
    found = _audit(metadata, held_by_schedule(metadata))
    assert _rows(found) == [("placement_fail", 0, None, None)]
    assert found[0].detail == (
        "segment 0 (entries 0..9) on racks ['/r0', '/r0', '/r1']: a write set of WQ=2 spans 1 "
        "racks, fewer than 2 (min racks 2, 3 racks in the cluster)"
    )


def test_write_sets_short_of_the_cluster_racks_are_soft() -> None:
    metadata = _ledger(3, 2, [("b0", "b3", "b1")], [0], 9)
    held = held_by_schedule(metadata)
    assert _rows(_audit(metadata, held)) == [("placement_soft", 0, None, None)]
    assert _audit(metadata, held, cluster_racks=2) == []


def test_unknown_racks_stand_in_the_default_rack() -> None:
    metadata = _ledger(2, 2, [ABC], [0], 9)
    held = held_by_schedule(metadata)
    # In a cluster of two racks, bookies whose racks are unknown all stand in one.
    assert _rows(_audit(metadata, held, racks={}, cluster_racks=2)) == [
        ("placement_fail", 0, None, None)
    ]
    # Counted from what is known, that one default rack is the whole cluster: no failure.
    assert _audit(metadata, held, racks={}) == []


def test_a_cluster_on_one_rack_meets_the_rule() -> None:
    metadata = _ledger(3, 2, [ABC], [0], 9)
    one_rack = dict.fromkeys(RACKS, "/r0")
    assert _audit(metadata, held_by_schedule(metadata), racks=one_rack, min_racks=3) == []


def test_an_empty_trailing_segment_is_not_judged_on_placement() -> None:
    metadata = _ledger(2, 2, [ABC, ("b0", "b3", "b6")], [0, 10], 9)
    assert _audit(metadata, held_by_schedule(metadata)) == []


def test_a_ledger_marked_within_the_grace_period_is_skipped_whatever_its_state() -> None:
    metadata = _ledger(2, 2, [("b0", "b3", "b6")], [0], 9)
    held: dict[str, set[int]] = {}
    assert _audit(metadata, held, since=0, now=HOUR_MS) == []
    found = _audit(metadata, held, since=0, now=HOUR_MS + 1)
    assert found == [
        Violation(
            Category.UNDERREPLICATED_TOO_LONG,
            None,
            None,
            None,
            f"marked under-replicated at 0 ms, {HOUR_MS + 1} ms ago: longer than the grace "
            f"period of {HOUR_MS} ms",
        )
    ]


# -- refusals ----------------------------------------------------------------------------------


def test_open_and_empty_ledgers_are_refused() -> None:
    opened = LedgerMetadata.create(
        ensemble=ABC,
        write_quorum=2,
        ack_quorum=2,
        digest_type=DigestType.CRC32C,
        password=b"",
        ctime_ms=0,
        creator_token=b"",
    )
    with pytest.raises(BadRequest, match="OPEN with last entry -1"):
        _audit(opened, {})
    with pytest.raises(BadRequest, match="CLOSED with last entry -1"):
        _audit(opened.close(-1, 0), {})


def test_a_negative_grace_period_is_refused() -> None:
    metadata = _ledger(2, 2, [ABC], [0], 9)
    with pytest.raises(BadRequest, match="grace period -1 ms"):
        audit_ledger(
            metadata,
            {},
            racks=RACKS,
            min_racks=2,
            underreplicated_since_ms=None,
            now_ms=0,
            grace_period_ms=-1,
        )


def test_category_values_are_the_report_names() -> None:
    assert [c.value for c in Category] == [c.name.lower() for c in Category]
    assert len(Category) == 12
    assert [c for c in Category if not c.is_violation] == [Category.OVER_REPLICATED]
    assert tuple(c for c in Category if c.is_violation) == VIOLATION_CATEGORIES


# -- deletion_stuck ---------------------------------------------------------------------------

TOMBSTONED_MS = 5 * HOUR_MS
STUCK_AFTER = 3_600


def _tombstone() -> Tombstone:
    return Tombstone(
        Deletion(HOUR_MS, "retention"),
        TOMBSTONED_MS,
        29,
        30,
        {"b0": None, "b1": TOMBSTONED_MS + 5, "b2": TOMBSTONED_MS + 7},
    )


def _stuck(held: dict[str, set[int]], now: int) -> list[Violation]:
    availability = {b: EntryAvailability.from_entries(s) for b, s in held.items()}
    return deletion_stuck(_tombstone(), availability, now_ms=now, stuck_after=STUCK_AFTER)


def test_a_tombstone_past_the_threshold_is_stuck_on_each_bookie_that_holds_data() -> None:
    held = {"b3": {4}, "b0": set(range(10)), "b2": set(), "b1": {0, 1}}
    rows = _stuck(held, TOMBSTONED_MS + HOUR_MS)
    assert _rows(rows) == [
        ("deletion_stuck", None, "b0", 10),
        ("deletion_stuck", None, "b1", 2),
        ("deletion_stuck", None, "b3", 1),
    ]
    details = {row.bookie_id: row.detail for row in rows}
    assert details["b0"] == (
        "bookie b0 still holds 10 entries (entries 0, 1, 2, 3, 4, ...) of the ledger deleted "
        f"at {HOUR_MS} ms (retention) and tombstoned {HOUR_MS} ms ago, longer than "
        "deletion_stuck_after (3600 s); the tombstone names it and waits for its "
        "acknowledgement: its garbage collection has not dropped them (`tally shell gcstatus "
        "--bookie b0`)"
    )
    assert (
        f"it acknowledged the tombstone at {TOMBSTONED_MS + 5} ms, yet holds them"
        in (details["b1"])
    )
    assert "the tombstone does not name it" in details["b3"]


def test_a_younger_tombstone_is_a_deletion_on_its_way_not_stuck() -> None:
    assert _stuck({"b0": {1, 2}}, TOMBSTONED_MS + HOUR_MS - 1) == []
    assert _stuck({"b0": {1, 2}}, TOMBSTONED_MS) == []


def test_a_tombstone_whose_bookies_hold_nothing_is_not_stuck() -> None:
    assert _stuck({"b0": set(), "b1": set()}, TOMBSTONED_MS + 10 * HOUR_MS) == []
    assert _stuck({}, TOMBSTONED_MS + 10 * HOUR_MS) == []


# -- clean_ledgers: the batch fast path -------------------------------------------------------

Raw = tuple[int, int, int, int, list[tuple[int, tuple[str, ...]]], dict[str, bytes]]
"""(E, WQ, AQ, last entry, segments, reports): a ledger as a snapshot has it, maybe invalid."""

NAMES = [*BOOKIES, "bad\nid"]


def _columns(ledgers: list[Raw], responded: set[str], racks: dict[str, str]) -> LedgerColumns:
    code = {name: i for i, name in enumerate(NAMES)}
    rack_codes = {rack: i for i, rack in enumerate(sorted(set(racks.values()) | {DEFAULT_RACK}))}
    segment_ledger, segment_first, offsets, members = [], [], [0], []
    report_ledger, report_bookie, report_offsets, data = [], [], [0], bytearray()
    for index, (_, _, _, _, segments, reports) in enumerate(ledgers):
        for first, ensemble in segments:
            segment_ledger.append(index)
            segment_first.append(first)
            members += [code[b] for b in ensemble]
            offsets.append(len(members))
        for bookie, report in reports.items():
            if bookie not in responded:
                continue
            report_ledger.append(index)
            report_bookie.append(code[bookie])
            data += report
            report_offsets.append(len(data))

    def ints(values: list[int]) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    return LedgerColumns(
        ensemble_size=ints([raw[0] for raw in ledgers]),
        write_quorum=ints([raw[1] for raw in ledgers]),
        ack_quorum=ints([raw[2] for raw in ledgers]),
        last_entry_id=ints([raw[3] for raw in ledgers]),
        segment_ledger=ints(segment_ledger),
        segment_first=ints(segment_first),
        ensemble_offsets=ints(offsets),
        ensemble_bookies=ints(members),
        report_ledger=ints(report_ledger),
        report_bookie=ints(report_bookie),
        report_offsets=ints(report_offsets),
        report_data=np.frombuffer(bytes(data), dtype=np.uint8),
        responded=np.array([name in responded for name in NAMES]),
        valid_id=np.array([name.isprintable() for name in NAMES]),
        rack=ints([rack_codes[rack_of(racks, name)] for name in NAMES]),
    )


def _verdict(raw: Raw, responded: set[str], racks: dict[str, str], min_racks: int):
    """What audit_ledger says, or None when the raw ledger is no valid metadata or a report
    does not decode."""
    e, wq, aq, last, segments, reports = raw
    try:
        metadata = _ledger(wq, aq, [ens for _, ens in segments], [f for f, _ in segments], last)
        if metadata.ensemble_size != e:
            return None
        availability = {b: EntryAvailability.empty() for b in metadata.bookies() & responded}
        availability |= {
            b: EntryAvailability.from_bytes(r) for b, r in reports.items() if b in responded
        }
    except (BadRequest, IndexError):
        return None
    return audit_ledger(
        metadata,
        availability,
        racks=racks,
        min_racks=min_racks,
        underreplicated_since_ms=None,
        now_ms=0,
        grace_period_ms=0,
        cluster_racks=len(set(racks.values())),
    )


def _one_group_per_run(entries: set[int]) -> bytes:
    """A valid but not canonical encoding, as Apache BookKeeper writes it."""
    runs: list[list[int]] = []
    for entry in sorted(entries):
        if runs and runs[-1][1] == entry:
            runs[-1][1] += 1
        else:
            runs.append([entry, entry + 1])
    header = struct.pack(">ii56x", 0, len(runs))
    return header + b"".join(struct.pack(">qqii", a, a, b - a, 0) for a, b in runs)


@st.composite
def raw_ledgers(draw: st.DrawFn) -> tuple[Raw, set[str]]:
    """Mostly healthy ledgers with BookKeeper's ensemble changes (a replaced bookie takes the
    same position), then at most a few faults of any kind, metadata and encoding included."""
    e = draw(st.integers(1, 5))
    wq = draw(st.integers(1, e))
    aq = draw(st.integers(1, wq))
    last = draw(st.integers(0, 60))
    firsts = [0, *sorted(draw(st.sets(st.integers(1, last + 1), max_size=3)))]
    pool = draw(st.permutations(BOOKIES))
    ensemble, spare = list(pool[:e]), list(pool[e:])
    segments = []
    for first in firsts:
        segments.append((first, tuple(ensemble)))
        if spare:
            ensemble[draw(st.integers(0, e - 1))] = spare.pop()
    metadata = _ledger(wq, aq, [ens for _, ens in segments], firsts, last)
    held = held_by_schedule(metadata)
    faults = draw(st.lists(st.integers(0, 9), max_size=2))
    responded = set(BOOKIES)
    encode = {b: EntryAvailability.from_entries(s).to_bytes for b, s in held.items()}
    reports = {b: f() for b, f in encode.items() if held[b] or draw(st.booleans())}
    for fault in faults:
        bookie = draw(st.sampled_from(sorted(held)))
        entry = draw(st.integers(0, last + 3))
        if fault == 0:
            held[bookie].discard(entry)
            reports[bookie] = EntryAvailability.from_entries(held[bookie]).to_bytes()
        elif fault == 1:
            held[bookie].add(entry)
            reports[bookie] = EntryAvailability.from_entries(held[bookie]).to_bytes()
        elif fault == 2:
            responded.discard(bookie)
            reports.pop(bookie, None)
        elif fault == 3:
            reports[bookie] = _one_group_per_run(held[bookie])
        elif fault == 4 and reports.get(bookie):
            cut = bytearray(reports[bookie])
            cut[draw(st.integers(0, len(cut) - 1))] ^= 1 << draw(st.integers(0, 7))
            reports[bookie] = bytes(cut)
        elif fault == 5:
            reports[draw(st.sampled_from(BOOKIES))] = EntryAvailability.from_entries(
                {entry}
            ).to_bytes()
        elif fault == 6:
            segments[-1] = (segments[-1][0], (*segments[-1][1][:-1], segments[-1][1][0]))
        elif fault == 7:
            segments[0] = (draw(st.integers(0, 2)), segments[0][1])
        elif fault == 8:
            segments[-1] = (segments[-1][0], (*segments[-1][1][:-1], "bad\nid"))
        else:
            e = draw(st.integers(0, 6))
    return (e, wq, aq, last, segments, reports), responded


@settings(max_examples=300, deadline=None)
@given(st.lists(raw_ledgers(), min_size=1, max_size=6), st.integers(1, 3))
def test_a_ledger_found_clean_has_no_violation(
    batch: list[tuple[Raw, set[str]]], min_racks: int
) -> None:
    responded = set.intersection(*(r for _, r in batch))
    ledgers = [raw for raw, _ in batch]
    clean = clean_ledgers(_columns(ledgers, responded, RACKS), min_racks=min_racks, cluster_racks=3)
    for raw, found_clean in zip(ledgers, clean.tolist(), strict=True):
        if found_clean:
            assert _verdict(raw, responded, RACKS, min_racks) == _silent(raw, responded)


def _silent(raw: Raw, responded: set[str]) -> list[Violation]:
    """What `clean_ledgers` leaves to say about a clean ledger: its silent bookies."""
    _, _, _, last, segments, _ = raw
    ends = [first - 1 for first, _ in segments[1:]] + [last]
    silent = {
        bookie
        for (first, ensemble), end in zip(segments, ends, strict=True)
        if end >= first
        for bookie in ensemble
        if bookie not in responded
    }
    return potentially_faulty([ensemble for _, ensemble in segments], silent)


def _healthy(e: int, wq: int, firsts: list[int], last: int, keep: bool = True) -> Raw:
    """A well-placed ledger whose bookies hold what the schedule says; `keep` replaces a
    bookie at its position, as BookKeeper's ensemble change does."""
    ensemble = [f"b{i}" for i in range(e)]
    segments = []
    for change, first in enumerate(firsts):
        segments.append((first, tuple(ensemble)))
        ensemble[change % e] = f"b{e + change}"
    metadata = _ledger(wq, 1, [ens for _, ens in segments], firsts, last)
    reports = {
        bookie: EntryAvailability.from_entries(held).to_bytes()
        for bookie, held in held_by_schedule(metadata).items()
    }
    return e, wq, 1, last, segments, reports


SPREAD = {bookie: f"/r{i}" for i, bookie in enumerate(BOOKIES)}


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.data())
def test_healthy_ledgers_are_found_clean(e: int, data: st.DataObject) -> None:
    wq = data.draw(st.integers(1, e))
    changes = data.draw(st.integers(0, 3))
    cuts = data.draw(st.lists(st.integers(3 * e, 40), min_size=changes + 1, max_size=changes + 1))
    firsts = [sum(cuts[:i]) for i in range(changes + 1)]
    raw = _healthy(e, wq, firsts, sum(cuts) - 1)
    assert _verdict(raw, set(BOOKIES), SPREAD, 2) == []
    columns = _columns([raw], set(BOOKIES), SPREAD)
    assert clean_ledgers(columns, min_racks=2, cluster_racks=len(BOOKIES)).tolist() == [True]


def _damaged(change: str) -> Raw:
    e, wq, aq, last, segments, reports = _healthy(3, 2, [0, 30], 59)
    reports = dict(reports)
    if change == "missing entry":
        reports["b1"] = _without(reports["b1"], 4)
    elif change == "leftover past the end":
        reports["b1"] = _with(reports["b1"], 60)
    elif change == "stray on a foreign bookie":
        reports["b7"] = EntryAvailability.from_entries([5]).to_bytes()
    elif change == "owed but not reported":
        del reports["b2"]
    elif change == "unknown version":
        reports["b2"] = b"\x00\x00\x00\x01" + reports["b2"][4:]
    elif change == "reserved byte set":
        reports["b2"] = reports["b2"][:20] + b"\x01" + reports["b2"][21:]
    elif change == "truncated":
        reports["b2"] = reports["b2"][:-1]
    elif change == "overlapping groups":
        run = struct.pack(">qqii", 0, 0, 2, 0)
        reports["b0"] = struct.pack(">ii56x", 0, 2) + run + run
    elif change == "first segment not at 0":
        segments = [(1, segments[0][1]), segments[1]]
    elif change == "wrong ensemble size":
        e = 4
    elif change == "bad quorums":
        aq = 3
    return e, wq, aq, last, segments, reports


def _without(report: bytes, entry: int) -> bytes:
    held = EntryAvailability.from_bytes(report)
    return held.difference(EntryAvailability.from_entries([entry])).to_bytes()


def _with(report: bytes, entry: int) -> bytes:
    return (
        EntryAvailability.from_bytes(report)
        .union(EntryAvailability.from_entries([entry]))
        .to_bytes()
    )


@pytest.mark.parametrize(
    "change",
    [
        "missing entry",
        "leftover past the end",
        "stray on a foreign bookie",
        "owed but not reported",
        "unknown version",
        "reserved byte set",
        "truncated",
        "overlapping groups",
        "first segment not at 0",
        "wrong ensemble size",
        "bad quorums",
    ],
)
def test_anything_unproven_is_left_to_audit_ledger(change: str) -> None:
    healthy, damaged = _healthy(3, 2, [0, 30], 59), _damaged(change)
    columns = _columns([healthy, damaged, healthy], set(BOOKIES), SPREAD)
    assert clean_ledgers(columns, min_racks=2, cluster_racks=8).tolist() == [True, False, True]


def test_a_bookie_that_did_not_respond_is_left_out_of_a_clean_verdict() -> None:
    raw = _healthy(3, 2, [0, 30], 59)
    responded = set(BOOKIES) - {"b1"}
    columns = _columns([raw], responded, SPREAD)
    assert clean_ledgers(columns, min_racks=2, cluster_racks=8).tolist() == [True]
    assert _silent(raw, responded) == _verdict(raw, responded, SPREAD, 2)
    assert _rows(_silent(raw, responded)) == [("potentially_faulty", None, "b1", None)]


@pytest.mark.parametrize("min_racks", [1, 2, 3])
@pytest.mark.parametrize("cluster_racks", [1, 2, 3])
@pytest.mark.parametrize("spread", [1, 2, 3])
def test_placement_is_judged_as_adherence_of_racks_does(
    min_racks: int, cluster_racks: int, spread: int
) -> None:
    raw = _healthy(3, 2, [0, 30], 59)
    racks = {bookie: f"/r{i % spread}" for i, bookie in enumerate(BOOKIES)}
    columns = _columns([raw], set(BOOKIES), racks)
    strict = all(
        adherence_of_racks([racks[b] for b in ensemble], 2, min_racks, cluster_racks)
        is PlacementAdherence.MEETS_STRICT
        for _, ensemble in raw[4]
    )
    found = clean_ledgers(columns, min_racks=min_racks, cluster_racks=cluster_racks)
    assert found.tolist() == [strict]


def test_an_empty_batch_is_fine() -> None:
    columns = _columns([], set(BOOKIES), SPREAD)
    assert clean_ledgers(columns, min_racks=2, cluster_racks=1).tolist() == []


def test_a_report_damaged_into_a_group_that_ends_before_it_starts_is_judged_not_clean() -> None:
    """Found by the property above: a flipped bit made a group's first entry 2^56 + 2 and
    its last 5; counting its runs gave a negative number, and numpy refused it, ending the
    whole batch's audit. Now the group is simply not on schedule: the ledger is judged."""
    hexed = {
        "b5": "0900000000000000090000000100000000",
        "b6": "0800000000000000080000000100000000",
        "b2": "0100000000000000070000000200000003",
        "b1": "0000000000000000000000000100000000",
        "b7": "0100000000000000010000000100000000000000000000000300000000000000060000000200000003"
        "000000000000000900000000000000090000000100000000",
        "b0": "0000000000000000000000000100000000010000000000000200000000000000050000000200000003",
    }
    groups = {"b5": 1, "b6": 1, "b2": 1, "b1": 1, "b7": 3, "b0": 2}
    reports = {
        bookie: (groups[bookie]).to_bytes(8, "big") + bytes(63) + bytes.fromhex(tail)
        for bookie, tail in hexed.items()
    }
    segments = [
        (0, ("b0", "b1", "b2")),
        (1, ("b0", "b7", "b2")),
        (7, ("b6", "b7", "b2")),
        (9, ("b5", "b7", "b2")),
    ]
    raw: Raw = (2, 2, 1, 9, segments, reports)
    one = (1).to_bytes(8, "big") + bytes(63) + bytes.fromhex("0000000000000000000000000100000000")
    small: Raw = (1, 1, 1, 0, [(0, ("b0",))], {"b0": one})
    responded = set(BOOKIES)
    ledgers = [small, small, raw]  # as the property drew them: the batch's arrays together
    clean = clean_ledgers(_columns(ledgers, responded, RACKS), min_racks=1, cluster_racks=3)
    assert clean.tolist()[2] is False
