"""The repair plan of one ledger, checked by applying it to a simulated cluster; backoff,
byte rate, lost-entry ranges and re-applying replacements."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.availability import EntryAvailability
from tally.core.errors import (
    BadRequest,
    BookieUnavailable,
    EntryCorrupt,
    EntryUnreadable,
    LedgerInLimbo,
    NoSuchEntry,
    NoSuchLedger,
    TallyError,
    Timeout,
)
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.replication import (
    BatchReadFailure,
    EntrySources,
    PositionRepair,
    RepairKind,
    RepairSchedule,
    Replacement,
    Standing,
    TokenBucket,
    apply_replacements,
    batch_read_failure,
    entry_ranges,
    grace_deadline,
    plan_replication,
    read_batches,
    replacements_of,
    retry_delay,
    targets_of,
)
from tally.core.schedule import expected_entries, write_set
from tests.support.ledgers import BOOKIES, rotating_ledger


def _held_by_schedule(metadata: LedgerMetadata) -> dict[str, set[int]]:
    """What every bookie holds when every add reached its whole write set."""
    held: dict[str, set[int]] = {b: set() for b in metadata.bookies()}
    for segment, (first, last) in zip(metadata.segments, metadata.segment_bounds(), strict=True):
        if last is None:
            last = first + 2 * metadata.ensemble_size  # the writer's entries so far
        for entry in range(first, last + 1):
            for position in write_set(entry, metadata.ensemble_size, metadata.write_quorum):
                held[segment.ensemble[position]].add(entry)
    return held


def _availability(held: dict[str, set[int]], bookies: set[str]) -> dict[str, EntryAvailability]:
    return {b: EntryAvailability.from_entries(held.get(b, set())) for b in bookies}


def test_a_healthy_ledger_needs_nothing() -> None:
    metadata = rotating_ledger(3, 2, 2, [10, 25], 40)
    held = _held_by_schedule(metadata)
    plan = plan_replication(metadata, {"b0"}, set(BOOKIES), _availability(held, set(held)))
    assert plan.complete
    assert plan.segments == ()
    assert plan.describe() == "nothing to repair"


def test_a_lost_bookie_is_replaced_with_every_entry_of_its_positions() -> None:
    metadata = rotating_ledger(3, 2, 2, [10], 30)  # segment 0: b0 b1 b2, segment 1: b1 b2 b3
    held = _held_by_schedule(metadata)
    registered = set(BOOKIES) - {"b1"}
    plan = plan_replication(metadata, {"b1"}, registered, _availability(held, registered))
    assert not plan.complete
    assert [
        (s.index, [(r.position, r.bookie_id, r.kind) for r in s.repairs]) for s in plan.segments
    ] == [
        (0, [(1, "b1", RepairKind.REPLACE)]),
        (1, [(0, "b1", RepairKind.REPLACE)]),
    ]
    assert plan.segments[0].repairs[0].entries == expected_entries(0, 9, 3, 2, 1)
    assert plan.segments[1].repairs[0].entries == expected_entries(10, 30, 3, 2, 0)
    assert "replace b1" in plan.describe()


def test_missing_entries_of_a_registered_bookie_are_filled_back() -> None:
    metadata = rotating_ledger(3, 3, 2, [], 20)
    held = _held_by_schedule(metadata)
    held["b2"] -= {3, 4, 17}
    plan = plan_replication(metadata, {"b2"}, set(BOOKIES), _availability(held, set(held)))
    (segment,) = plan.segments
    (repair,) = segment.repairs
    assert (repair.position, repair.bookie_id, repair.kind) == (2, "b2", RepairKind.FILL)
    assert list(repair.entries) == [3, 4, 17]
    assert plan.unjudged == frozenset()


def test_bad_copies_are_filled_over_and_never_read_from() -> None:
    """A bookie whose index holds entries it cannot serve (found corrupt) gets them again
    from a bookie with a good copy, and is no source for them."""
    metadata = rotating_ledger(3, 3, 2, [], 20)
    held = _held_by_schedule(metadata)
    bad = {"b1": EntryAvailability.from_entries([2, 3]), "b2": EntryAvailability.from_entries([3])}
    plan = plan_replication(
        metadata, {"b1"}, set(BOOKIES), _availability(held, set(held)), bad_copies=bad
    )
    (segment,) = plan.segments
    assert [(r.bookie_id, r.kind, list(r.entries)) for r in segment.repairs] == [
        ("b1", RepairKind.FILL, [2, 3]),
        ("b2", RepairKind.FILL, [3]),
    ]
    two, three = segment.entries()
    assert (two.entry_id, two.sources) == (2, ("b2", "b0"))  # write-set order, b1 left out
    assert (three.entry_id, three.sources, set(three.without_copy)) == (3, ("b0",), {"b1", "b2"})


def test_bad_copies_on_every_bookie_leave_no_source() -> None:
    metadata = rotating_ledger(3, 3, 2, [], 5)
    held = _held_by_schedule(metadata)
    bad = {b: EntryAvailability.from_entries([4]) for b in ("b0", "b1", "b2")}
    plan = plan_replication(
        metadata, {"b0"}, set(BOOKIES), _availability(held, set(held)), bad_copies=bad
    )
    ((sources,),) = [list(segment.entries()) for segment in plan.segments]
    assert sources.sources == ()
    assert set(sources.without_copy) == {"b0", "b1", "b2"}


def test_a_bookie_not_declared_lost_is_unjudged_and_never_replaced() -> None:
    """Not registered, but the mark names another bookie: it may be restarting (the
    auditor's lost_bookie_recovery_delay); the mark must stay, nothing replaces it."""
    metadata = rotating_ledger(3, 2, 2, [], 20)
    held = _held_by_schedule(metadata)
    held["b0"] -= {0}
    registered = {"b0", "b2"}
    plan = plan_replication(metadata, {"b0"}, registered, _availability(held, registered))
    assert plan.unjudged == {"b1"}
    (segment,) = plan.segments
    assert [(r.bookie_id, r.kind) for r in segment.repairs] == [("b0", RepairKind.FILL)]
    assert segment.standings == (Standing.ANSWERED, Standing.ABSENT, Standing.ANSWERED)
    assert not plan.complete


def test_an_empty_mark_declares_every_unregistered_bookie_lost() -> None:
    metadata = rotating_ledger(3, 2, 2, [], 20)
    held = _held_by_schedule(metadata)
    registered = {"b0", "b2"}
    plan = plan_replication(metadata, (), registered, _availability(held, registered))
    assert [(r.bookie_id, r.kind) for r in plan.segments[0].repairs] == [("b1", RepairKind.REPLACE)]
    assert plan.unjudged == frozenset()


def test_a_silent_registered_bookie_is_unjudged_but_still_a_source() -> None:
    metadata = rotating_ledger(3, 3, 2, [], 9)
    held = _held_by_schedule(metadata)
    held["b0"] -= {5}
    answered = _availability(held, {"b0", "b2"})
    plan = plan_replication(metadata, {"b0"}, set(BOOKIES), answered)
    assert plan.unjudged == {"b1"}
    (segment,) = plan.segments
    (sources,) = list(segment.entries())
    assert sources.entry_id == 5
    assert sources.sources == ("b2", "b1")  # holders first, then the silent one
    assert sources.without_copy == ("b0",)


def test_an_open_ledgers_last_segment_is_left_to_its_writer_and_flagged() -> None:
    metadata = rotating_ledger(3, 2, 2, [10], None)  # segment 1 (b1 b2 b3) is open
    held = _held_by_schedule(metadata)
    registered = set(BOOKIES) - {"b2"}
    plan = plan_replication(metadata, {"b2"}, registered, _availability(held, registered))
    assert plan.recover_first == {"b2"}
    (segment,) = plan.segments
    assert segment.index == 0
    assert (segment.first_entry_id, segment.last_entry_id) == (0, 9)
    assert not plan.complete


def test_an_open_ledger_whose_lost_bookie_is_only_in_bounded_segments_is_not_flagged() -> None:
    metadata = rotating_ledger(3, 2, 2, [10], None)
    held = _held_by_schedule(metadata)
    registered = set(BOOKIES) - {"b0"}
    plan = plan_replication(metadata, {"b0"}, registered, _availability(held, registered))
    assert plan.recover_first == frozenset()
    assert [s.index for s in plan.segments] == [0]


def test_an_open_ledgers_last_segment_is_filled_up_to_the_lac_on_registered_bookies() -> None:
    """Entries up to the LAC are acknowledged and never change: a registered bookie of the
    open segment that lacks them (its disk failed) or holds them bad gets them back; the
    writer's entries past the LAC, and its lost or silent bookies, are left to it."""
    metadata = rotating_ledger(3, 2, 2, [10], None)  # segment 1 (b1 b2 b3) is open
    held = _held_by_schedule(metadata)  # the writer's entries so far: 10..16
    lost_disk = {entry for entry in held["b2"] if entry >= 10}
    held["b2"] -= lost_disk
    registered = set(BOOKIES) - {"b3"}  # b3: not declared lost, not registered
    available = _availability(held, registered)
    assert plan_replication(metadata, {"b2"}, registered, available).segments == ()
    bad = {"b1": EntryAvailability.from_entries([11])}
    plan = plan_replication(metadata, {"b2"}, registered, available, bad, 13)
    (segment,) = plan.segments
    assert (segment.index, segment.first_entry_id, segment.last_entry_id) == (1, 10, 13)
    repairs = {repair.bookie_id: (repair.kind, set(repair.entries)) for repair in segment.repairs}
    assert repairs == {
        "b1": (RepairKind.FILL, {11}),
        "b2": (RepairKind.FILL, {entry for entry in lost_disk if entry <= 13}),
    }
    assert plan.unjudged == frozenset()
    assert plan.recover_first == frozenset()
    lost = plan_replication(metadata, {"b3"}, registered, available, None, 13)
    assert lost.recover_first == {"b3"}
    assert all(r.kind is RepairKind.FILL for s in lost.segments for r in s.repairs)
    assert plan_replication(metadata, {"b2"}, registered, available, None, 9).segments == ()


def test_segments_without_entries_are_skipped() -> None:
    metadata = rotating_ledger(3, 2, 2, [10], 9)  # closed at 9: segment 1 starts at 10, empty
    held = _held_by_schedule(metadata)
    registered = set(BOOKIES) - {"b3"}  # b3 is only in the empty segment
    plan = plan_replication(metadata, {"b3"}, registered, _availability(held, registered))
    assert plan.complete


def test_entries_merge_every_target_of_an_entry() -> None:
    metadata = rotating_ledger(4, 3, 2, [], 11)
    held = _held_by_schedule(metadata)
    registered = set(BOOKIES) - {"b0", "b1"}
    plan = plan_replication(metadata, {"b0", "b1"}, registered, _availability(held, registered))
    (segment,) = plan.segments
    seen = list(segment.entries())
    assert [s.entry_id for s in seen] == sorted({s.entry_id for s in seen})
    for sources in seen:
        positions = set(write_set(sources.entry_id, 4, 3))
        assert {r.position for r in sources.targets} == positions & {0, 1}
        assert set(sources.sources) == {metadata.segments[0].ensemble[p] for p in positions} - {
            "b0",
            "b1",
        }
    both = next(s for s in seen if s.entry_id == 0)  # write set 0, 1, 2
    assert len(both.targets) == 2
    new = {0: "b6", 1: "b7"}
    assert [bookie for _, bookie in targets_of(both, new)] == ["b6", "b7"]
    with pytest.raises(BadRequest, match="no new bookie"):
        targets_of(both, {0: "b6"})


def test_sources_of_refuses_entries_outside_the_segment() -> None:
    metadata = rotating_ledger(3, 2, 2, [], 9)
    held = _held_by_schedule(metadata)
    held["b0"].clear()
    plan = plan_replication(metadata, {"b0"}, set(BOOKIES), _availability(held, set(held)))
    with pytest.raises(BadRequest, match="outside segment 0"):
        plan.segments[0].sources_of(10, ())


def test_replacements_skip_positions_whose_copies_failed() -> None:
    metadata = rotating_ledger(4, 2, 2, [], 11)
    held = _held_by_schedule(metadata)
    registered = set(BOOKIES) - {"b0", "b2"}
    plan = plan_replication(metadata, {"b0", "b2"}, registered, _availability(held, registered))
    (segment,) = plan.segments
    new = {0: "b5", 2: "b6"}
    assert replacements_of(segment, new, failed={2}) == (Replacement(0, 0, "b0", "b5"),)


def test_apply_replacements_on_changed_metadata() -> None:
    planned = rotating_ledger(3, 2, 2, [10], None)
    change = Replacement(0, 1, "b1", "b6")
    applied = apply_replacements(planned, planned, [change])
    assert applied is not None
    assert applied.segments[0].ensemble == ("b0", "b6", "b2")
    # the writer added a segment meanwhile: segment 0 is the same, the change still applies
    grown = planned.with_ensemble_change(20, ("b4", "b5", "b3"))
    again = apply_replacements(grown, planned, [change])
    assert again is not None
    assert again.segments[0].ensemble == ("b0", "b6", "b2")
    assert again.segments[2].ensemble == ("b4", "b5", "b3")
    # made already (a CAS whose answer was lost): kept as is
    assert apply_replacements(applied, planned, [change]) == applied
    # the segment's bookie changed otherwise: the copies no longer match it
    other = planned.replace_bookie(0, "b1", "b7")
    assert apply_replacements(other, planned, [change]) is None
    # the replaced segment's end moved: never apply
    shorter = rotating_ledger(3, 2, 2, [5], None)
    assert (
        apply_replacements(
            shorter, rotating_ledger(3, 2, 2, [10], 30), [Replacement(0, 1, "b1", "b6")]
        )
        is None
    )


def test_entry_ranges() -> None:
    assert entry_ranges([]) == ()
    assert entry_ranges([5, 3, 4, 9, 9, 11, 10, 0]) == ((0, 0), (3, 5), (9, 11))


def test_retry_delay_doubles_up_to_the_maximum() -> None:
    assert retry_delay(0, 1.0, 300.0) == 0.0
    assert [retry_delay(n, 1.0, 300.0) for n in range(1, 11)] == [
        1, 2, 4, 8, 16, 32, 64, 128, 256, 300,
    ]  # fmt: skip
    assert retry_delay(10**6, 0.5, 60.0) == 60.0
    for bad in [(-1, 1.0, 2.0), (1, 0.0, 2.0), (1, 3.0, 2.0)]:
        with pytest.raises(BadRequest, match="backoff"):
            retry_delay(*bad)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1_000, 10_000_000),
    st.lists(st.integers(0, 200_000), min_size=1, max_size=60),
    st.floats(0.01, 1.0),
)
def test_token_bucket_never_exceeds_its_rate(rate: int, sizes: list[int], burst_s: float) -> None:
    """Reserving back to back (concurrent copies), every byte is spent no earlier than the
    rate allows after the burst; with waits honoured, the total time is what the rate says."""
    bucket = TokenBucket(rate, rate * burst_s, now=100.0)
    now = 100.0
    spent = 0
    for size in sizes:
        wait = bucket.reserve(size, now)
        assert wait >= 0
        now += wait
        spent += size
        assert spent <= rate * burst_s + rate * (now - 100.0) + 1e-6 * rate
    assert now - 100.0 == pytest.approx(max(0.0, (spent - rate * burst_s) / rate), abs=1e-6)


def test_token_bucket_refills_only_up_to_its_burst() -> None:
    bucket = TokenBucket(1000, 100, now=0.0)
    assert bucket.reserve(100, 0.0) == 0.0
    assert bucket.reserve(100, 1000.0) == 0.0  # idle for long: only the burst is back
    assert bucket.reserve(50, 1000.0) == pytest.approx(0.05)
    with pytest.raises(BadRequest):
        TokenBucket(0, 1, now=0.0)
    with pytest.raises(BadRequest):
        bucket.reserve(-1, 0.0)


# -- the plan, applied to a simulated cluster ------------------------------------------


@st.composite
def _scenarios(draw: st.DrawFn) -> tuple[LedgerMetadata, dict[str, set[int]], set[str], set[str]]:
    """A ledger, what its bookies hold (some entries forgotten), its lost bookies (not
    registered) and the bookies its mark names (any of the ledger's, or none)."""
    e = draw(st.integers(1, 5))
    wq = draw(st.integers(1, e))
    aq = draw(st.integers(1, wq))
    last = draw(st.integers(0, 60))
    changes = draw(st.lists(st.integers(1, last + 1), max_size=3))
    metadata = rotating_ledger(e, wq, aq, changes, draw(st.sampled_from([last, None])))
    held = _held_by_schedule(metadata)
    bookies = sorted(metadata.bookies())
    lost = set(draw(st.lists(st.sampled_from(bookies), max_size=2, unique=True)))
    for bookie in set(bookies) - lost:
        entries = sorted(held[bookie])
        if entries:
            held[bookie] -= set(draw(st.lists(st.sampled_from(entries), max_size=6)))
    named = set(draw(st.lists(st.sampled_from(bookies), max_size=3, unique=True)))
    return metadata, held, lost, named


@settings(max_examples=300, deadline=None)
@given(_scenarios())
def test_applying_the_plan_restores_write_quorum_copies(
    scenario: tuple[LedgerMetadata, dict[str, set[int]], set[str], set[str]],
) -> None:
    """Copy what the plan says from the sources it names, as a worker does, and commit the
    replacements; afterwards every entry of every bounded segment is on all WQ bookies of
    its write set in the new metadata, except where a bookie not declared lost may still
    hold it, and except entries of which no copy was left: those, and only those, are lost."""
    metadata, held, lost, named = scenario
    declared = lost & named if named else lost
    absent = lost - declared
    registered = set(BOOKIES) - lost
    answered = _availability(held, metadata.bookies() - lost)
    plan = plan_replication(metadata, named, registered, answered)
    before = {b: set(entries) for b, entries in held.items()}

    def alive_copy(bookie: str, entry: int) -> bool:
        return bookie not in lost and entry in held.get(bookie, set())

    spare = iter(f"new{i}" for i in range(100))
    lost_entries: set[int] = set()
    uncommitted: set[tuple[int, int]] = set()
    copied: set[tuple[int, int, str, int]] = set()
    updated = metadata
    for segment in plan.segments:
        assert segment.last_entry_id >= segment.first_entry_id
        new = {r.position: next(spare) for r in segment.repairs if r.kind is RepairKind.REPLACE}
        for bookie in new.values():
            held[bookie] = set()
        failed: set[int] = set()
        for sources in segment.entries():
            source = next((b for b in sources.sources if sources.entry_id in before[b]), None)
            if source is None:
                if sources.unknown:
                    failed.update(r.position for r in sources.targets)
                else:
                    lost_entries.add(sources.entry_id)
                continue
            assert source not in lost
            for repair, bookie in targets_of(sources, new):
                held[bookie].add(sources.entry_id)
                copied.add((segment.index, repair.position, bookie, sources.entry_id))
        uncommitted |= {(segment.index, p) for p in failed}
        result = apply_replacements(updated, metadata, replacements_of(segment, new, failed))
        assert result is not None
        updated = result
    # No copy goes beyond the write set it fills: each lands on the bookie the committed
    # metadata puts at a position of the entry's write set (a REPLACE whose copies failed
    # is not committed: what it did copy is over-replication, left to garbage collection).
    for index, position, bookie, entry in copied:
        assert position in write_set(entry, metadata.ensemble_size, metadata.write_quorum)
        if (index, position) not in uncommitted:
            assert updated.segments[index].ensemble[position] == bookie

    bounds = metadata.segment_bounds()
    if bounds[-1][1] is None:
        assert plan.recover_first == declared & set(metadata.segments[-1].ensemble)
        assert all(segment.index < len(bounds) - 1 for segment in plan.segments)
    else:
        assert plan.recover_first == frozenset()
    e, wq = metadata.ensemble_size, metadata.write_quorum
    for index, (segment, (first, last)) in enumerate(
        zip(updated.segments, updated.segment_bounds(), strict=True)
    ):
        if last is None:
            continue
        original = metadata.segments[index].ensemble
        for entry in range(first, last + 1):
            positions = write_set(entry, e, wq)
            survivors = [original[p] for p in positions if alive_copy(original[p], entry)]
            if entry in lost_entries:
                assert not survivors
                assert not absent & {original[p] for p in positions}
                continue
            if not survivors:
                continue  # nothing to copy from; a bookie not declared lost may hold it
            for p in positions:
                if segment.ensemble[p] in absent or (index, p) in uncommitted:
                    continue
                assert alive_copy(segment.ensemble[p], entry), (entry, index, p)
    every_copy_there = all(
        original[p] not in lost and entry in before[original[p]]
        for original, (first, last) in zip(
            [seg.ensemble for seg in metadata.segments], bounds, strict=True
        )
        if last is not None
        for entry in range(first, last + 1)
        for p in write_set(entry, e, wq)
    )
    assert plan.complete == (every_copy_there and not plan.recover_first)
    if not absent:
        # planned again on the repaired cluster: only what no copy was left of remains
        again = plan_replication(
            updated, named, registered | set(held) - lost, _availability(held, updated.bookies())
        )
        remaining = {s.entry_id for segment in again.segments for s in segment.entries()}
        assert remaining == lost_entries
        assert again.unjudged == frozenset()


def test_position_repair_and_sources_are_plain_values() -> None:
    repair = PositionRepair(0, "b0", RepairKind.FILL, EntryAvailability.from_entries([1]))
    sources = EntrySources(1, (repair,), ("b1",), ("b0",), ())
    assert targets_of(sources, {}) == ((repair, "b0"),)


_REPAIRS = tuple(
    PositionRepair(position, f"b{position}", RepairKind.REPLACE, EntryAvailability.from_entries([]))
    for position in range(3)
)


@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(["s1", "s2", "s3"]), max_size=2, unique=True),
            st.lists(st.integers(0, 2), min_size=1, max_size=2, unique=True),
        ),
        max_size=60,
    ),
    st.integers(1, 8),
)
def test_read_batches_take_every_entry_once_in_batches_of_one_source_and_one_set_of_targets(
    shapes: list[tuple[list[str], list[int]]], size: int
) -> None:
    entries = [
        EntrySources(
            entry_id, tuple(_REPAIRS[p] for p in sorted(positions)), tuple(sources), (), ()
        )
        for entry_id, (sources, positions) in enumerate(shapes)
    ]
    batches = list(read_batches(iter(entries), size))
    assert sorted(s.entry_id for batch in batches for s in batch) == list(range(len(entries)))
    for batch in batches:
        assert 1 <= len(batch) <= size
        assert [s.entry_id for s in batch] == sorted(s.entry_id for s in batch)
        if not batch[0].sources:
            assert len(batch) == 1, "an entry without a source is copied alone"
        assert len({(s.sources[:1], s.targets) for s in batch}) == 1
    with pytest.raises(BadRequest):
        list(read_batches(iter(entries), 0))


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (NoSuchEntry("entry 3"), BatchReadFailure.FIRST_ALONE),
        (EntryCorrupt("rotten"), BatchReadFailure.FIRST_ALONE),
        (EntryUnreadable("EIO"), BatchReadFailure.FIRST_ALONE),
        (BookieUnavailable("closed"), BatchReadFailure.SOURCE_ALONE),
        (NoSuchLedger("ledger 9"), BatchReadFailure.REST_ALONE),
        (LedgerInLimbo("journal damage"), BatchReadFailure.REST_ALONE),
        (Timeout("5 s"), BatchReadFailure.REST_ALONE),
        (TimeoutError(), BatchReadFailure.REST_ALONE),
        (TallyError("internal error"), BatchReadFailure.REST_ALONE),
    ],
)
def test_a_failed_batch_read_sends_the_first_entry_or_the_rest_to_be_copied_alone(
    error: BaseException, expected: BatchReadFailure
) -> None:
    assert batch_read_failure(error) is expected


# -- the repair schedule ------------------------------------------------------------------

L1, L2 = LedgerId(0, 1), LedgerId(0, 2)


def test_a_failed_ledger_waits_a_doubling_backoff_while_others_are_due() -> None:
    schedule = RepairSchedule(1.0, 5.0)
    assert schedule.is_due(L1, 100.0, mark_version=0, lost_at=None)
    waits = []
    for _ in range(5):
        backoff = schedule.failed(L1, 100.0)
        waits.append(backoff.retry_at - 100.0)
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert not schedule.is_due(L1, 104.9, mark_version=0, lost_at=None)
    assert schedule.is_due(L1, 105.0, mark_version=0, lost_at=None)
    assert schedule.is_due(L2, 100.0, mark_version=0, lost_at=None)
    schedule.done(L1)
    assert schedule.is_due(L1, 100.0, mark_version=0, lost_at=None)
    assert schedule.failed(L1, 100.0).failures == 1, "a repair resets the count"


def test_a_deferred_ledger_waits_for_its_deadline_and_keeps_its_failures() -> None:
    schedule = RepairSchedule(1.0, 60.0)
    schedule.failed(L1, 0.0)
    schedule.failed(L1, 0.0)
    schedule.deferred(L1, until=30.0)
    assert not schedule.is_due(L1, 29.0, mark_version=0, lost_at=None)
    assert schedule.is_due(L1, 30.0, mark_version=0, lost_at=None)
    assert schedule.failed(L1, 30.0).failures == 3


def test_a_lost_ledger_is_left_alone_until_it_is_marked_again() -> None:
    schedule = RepairSchedule(1.0, 60.0)
    assert not schedule.is_due(L1, 0.0, mark_version=4, lost_at=4)
    assert schedule.is_due(L1, 0.0, mark_version=5, lost_at=4)


def test_ledgers_no_longer_marked_are_forgotten_and_the_next_look_comes_with_a_backoff() -> None:
    schedule = RepairSchedule(2.0, 60.0)
    assert schedule.next_look(0.0, poll_interval=5.0) == 5.0
    schedule.failed(L1, 0.0)  # due at 2.0
    schedule.deferred(L2, until=1.5)
    assert schedule.next_look(1.0, poll_interval=5.0) == 0.5
    assert [ledger for ledger, _ in schedule.backoffs()] == [L2, L1]
    schedule.marks_seen([L1])
    assert [ledger for ledger, _ in schedule.backoffs()] == [L1]
    assert schedule.next_look(3.0, poll_interval=5.0) == 0.0


def test_a_bad_backoff_is_refused_at_once() -> None:
    with pytest.raises(BadRequest):
        RepairSchedule(0.0, 1.0)


def test_the_grace_deadline_counts_from_the_first_mark() -> None:
    assert grace_deadline(first_marked_ms=10_500, grace_period=30.0) == 40.5
