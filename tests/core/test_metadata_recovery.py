"""What a metadata recovery writes back for a ledger, from what its bookies hold (issue 18)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from tally.core.availability import EntryAvailability
from tally.core.digest import DigestType
from tally.core.errors import BadRequest, CookieMismatch
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import Deletion, LedgerMetadata, LedgerState
from tally.core.metadata_recovery import (
    FROM_SNAPSHOT,
    INFERRED_ACK_QUORUM,
    INFERRED_DIGEST,
    SOFT_DELETED,
    Holding,
    LedgerRecovery,
    Verdict,
    cluster_instance,
    recover_ledger,
    unknown_bookie,
)
from tally.core.schedule import write_set
from tests.support.ledgers import held_by_schedule, rotating_ledger

LEDGER = LedgerId(0, 42)


def holdings(
    metadata: LedgerMetadata,
    copies: dict[str, LedgerMetadata | None] | None = None,
    *,
    held: dict[str, set[int]] | None = None,
    key: bytes | None = None,
) -> list[Holding]:
    """Each bookie of the ledger holding what the schedule gives it (or `held`), with the
    copy `copies` names (by default `metadata` itself)."""
    held = held if held is not None else held_by_schedule(metadata)
    found = []
    for bookie, entries in sorted(held.items()):
        copy = metadata if copies is None else copies.get(bookie)
        found.append(
            Holding(
                bookie,
                EntryAvailability.from_entries(entries),
                False,
                -1,
                key if key is not None else metadata.master_key,
                None if copy is None else copy.to_bytes(),
            )
        )
    return found


def decide(found: list[Holding], deleted_by: Sequence[str] = ()) -> LedgerRecovery:
    """The decision, every bookie holding the ledger having answered."""
    return recover_ledger(LEDGER, found, deleted_by, {holding.bookie_id for holding in found})


def test_a_ledger_any_bookie_deleted_under_its_tombstone_stays_deleted() -> None:
    closed = rotating_ledger(3, 2, 2, [], 9)
    decision = decide(holdings(closed), ["b:1"])
    assert decision.verdict is Verdict.DELETED
    assert decision.metadata is None
    assert "b:1" in decision.reason


def test_a_closed_copy_comes_back_exactly() -> None:
    closed = rotating_ledger(3, 2, 2, [5], 19)
    decision = decide(holdings(closed))
    assert decision.verdict is Verdict.EXACT
    assert decision.metadata == closed
    assert not decision.needs_recovery
    assert not decision.lost_entries


def test_the_most_advanced_copy_wins_over_older_segments_copies() -> None:
    first = rotating_ledger(3, 2, 2, [], None)
    closed = rotating_ledger(3, 2, 2, [10], 19)
    older = dict.fromkeys(first.segments[0].ensemble, first)
    newer = dict.fromkeys(closed.segments[-1].ensemble, closed)
    decision = decide(holdings(closed, {**older, **newer}))
    assert decision.metadata == closed


@pytest.mark.parametrize("changes", [[], [4]])
def test_a_copy_not_closed_comes_back_open_for_the_ledger_recovery(changes: list[int]) -> None:
    opened = rotating_ledger(3, 3, 2, changes, None)
    in_recovery = dataclasses.replace(opened, state=LedgerState.IN_RECOVERY)
    held = {bookie: set(range(9)) for bookie in opened.segments[-1].ensemble}
    decision = decide(holdings(in_recovery, held=held))
    assert decision.verdict is Verdict.EXACT
    assert decision.metadata is not None
    assert decision.metadata.state is LedgerState.OPEN
    assert decision.needs_recovery
    assert decision.metadata.segments == opened.segments


def test_among_equal_copies_the_one_that_places_the_data_wins() -> None:
    """A replication worker put d into the first segment and gave d its copy; the others
    still hold the writer's: both equally advanced, d's places what d holds."""
    closed = rotating_ledger(3, 2, 2, [], 8, bookies=("a:1", "b:1", "c:1"))
    repaired = closed.replace_bookie(0, "a:1", "d:1")
    held = held_by_schedule(repaired)
    copies: dict[str, LedgerMetadata | None] = {"b:1": closed, "c:1": closed, "d:1": repaired}
    decision = decide(holdings(repaired, copies, held=held))
    assert decision.metadata == repaired
    assert not decision.lost_entries


def test_entries_no_bookie_holds_are_reported_lost() -> None:
    closed = rotating_ledger(3, 2, 2, [], 8, bookies=("a:1", "b:1", "c:1"))
    held = held_by_schedule(closed)
    for bookie in held:
        held[bookie] -= {3, 4}
    decision = decide(holdings(closed, held=held))
    assert decision.verdict is Verdict.EXACT
    assert set(decision.lost_entries) == {3, 4}


def test_entries_a_bookie_that_did_not_answer_may_hold_are_not_lost() -> None:
    """Its export is missing, or its row could not be read: unknown, never missing."""
    closed = rotating_ledger(3, 2, 2, [], 8, bookies=("a:1", "b:1", "c:1"))
    held = held_by_schedule(closed)
    del held["c:1"]
    for bookie in held:
        held[bookie] -= {3, 4}
    decision = recover_ledger(LEDGER, holdings(closed, held=held), [], {"a:1", "b:1"})
    ensemble = closed.segments[0].ensemble
    on_c = {e for e in (3, 4) if "c:1" in {ensemble[p] for p in write_set(e, 3, 2)}}
    assert on_c
    assert set(decision.lost_entries) == {3, 4} - on_c


def test_without_copies_the_ledger_is_inferred_and_comes_back_open() -> None:
    closed = rotating_ledger(3, 2, 2, [], 29, bookies=("a:1", "b:1", "c:1"))
    copies: dict[str, LedgerMetadata | None] = {}
    decision = decide(holdings(closed, copies))
    assert decision.verdict is Verdict.INFERRED
    assert decision.metadata is not None
    assert decision.metadata.state is LedgerState.OPEN
    assert (decision.metadata.ensemble_size, decision.metadata.write_quorum) == (3, 2)
    assert decision.metadata.ack_quorum == INFERRED_ACK_QUORUM
    assert decision.metadata.segments == closed.segments
    assert decision.metadata.master_key == closed.master_key
    assert decision.metadata.digest_type is INFERRED_DIGEST
    assert "digest type assumed CRC32C (its entries do not say" in decision.reason


def told(found: list[Holding], *digest_types: DigestType | None) -> list[Holding]:
    """The holdings, each bookie's entries telling the digest type given in turn."""
    return [
        dataclasses.replace(holding, digest_type=digest_type)
        for holding, digest_type in zip(found, digest_types, strict=True)
    ]


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_an_inferred_ledger_gets_the_digest_type_its_entries_tell(digest_type: DigestType) -> None:
    """A bookie that read none, or whose V1 entries do not say, does not count against it."""
    closed = rotating_ledger(3, 2, 2, [], 29, bookies=("a:1", "b:1", "c:1"))
    decision = decide(told(holdings(closed, {}), digest_type, None, digest_type))
    assert decision.verdict is Verdict.INFERRED
    assert decision.metadata is not None
    assert decision.metadata.digest_type is digest_type
    assert f"digest type {digest_type.name} from its entries" in decision.reason
    assert "assumed" not in decision.reason


def test_entries_that_disagree_on_the_digest_type_leave_it_assumed() -> None:
    closed = rotating_ledger(3, 2, 2, [], 29, bookies=("a:1", "b:1", "c:1"))
    found = told(holdings(closed, {}), DigestType.CRC32, DigestType.DUMMY, None)
    decision = decide(found)
    assert decision.metadata is not None
    assert decision.metadata.digest_type is INFERRED_DIGEST
    assert "digest type assumed CRC32C (its bookies' entries disagree: CRC32, DUMMY)" in (
        decision.reason
    )


def test_a_ledger_with_a_copy_takes_the_copy_s_digest_type() -> None:
    """What the entries tell is for a ledger without a copy; the copy records the type."""
    closed = rotating_ledger(3, 2, 2, [], 29, bookies=("a:1", "b:1", "c:1"))
    found = told(holdings(closed), DigestType.DUMMY, DigestType.DUMMY, DigestType.DUMMY)
    decision = decide(found)
    assert decision.verdict is Verdict.EXACT
    assert decision.metadata == closed


def test_a_copy_that_does_not_decode_is_left_out() -> None:
    closed = rotating_ledger(3, 2, 2, [], 29, bookies=("a:1", "b:1", "c:1"))
    broken = [
        Holding(h.bookie_id, h.availability, h.fenced, -1, h.master_key, b"not metadata")
        for h in holdings(closed)
    ]
    assert decide(broken).verdict is Verdict.INFERRED


def test_a_lost_position_is_named_as_an_unknown_bookie() -> None:
    closed = rotating_ledger(3, 2, 2, [], 29, bookies=("a:1", "b:1", "c:1"))
    held = held_by_schedule(closed)
    del held["c:1"]
    decision = decide(holdings(closed, {}, held=held))
    assert decision.metadata is not None
    assert unknown_bookie(2) in decision.metadata.segments[0].ensemble


@pytest.mark.parametrize(
    ("keys", "why"),
    [([None, None, None], "no master key"), ([b"a" * 32, b"b" * 32, None], "disagree")],
)
def test_an_inference_needs_one_master_key(keys: list[bytes | None], why: str) -> None:
    closed = rotating_ledger(3, 2, 2, [], 29, bookies=("a:1", "b:1", "c:1"))
    found = [
        Holding(h.bookie_id, h.availability, False, -1, key, None)
        for h, key in zip(holdings(closed, {}), keys, strict=True)
    ]
    decision = decide(found)
    assert decision.verdict is Verdict.NOT_RECOVERABLE
    assert why in decision.reason


def test_a_ledger_no_bookie_holds_is_not_recoverable() -> None:
    assert decide([]).verdict is Verdict.NOT_RECOVERABLE


def test_the_cookies_must_name_one_cluster() -> None:
    assert cluster_instance({"a:1": "x", "b:1": "x"}) == "x"
    with pytest.raises(CookieMismatch, match="c:1 of cluster y"):
        cluster_instance({"a:1": "x", "b:1": "x", "c:1": "y"})
    with pytest.raises(BadRequest, match="no bookie"):
        cluster_instance({})


# From an older snapshot of the store (--from-snapshot)


def from_snapshot(
    found: list[Holding], recorded: LedgerMetadata, answered: set[str] | None = None
) -> LedgerRecovery:
    """The decision with the snapshot's copy, every bookie holding the ledger having
    answered unless `answered` says otherwise."""
    everyone = {holding.bookie_id for holding in found} if answered is None else answered
    return recover_ledger(LEDGER, found, [], everyone, recorded.to_bytes())


def test_the_snapshot_stands_in_for_copies_bookies_never_held() -> None:
    closed = rotating_ledger(3, 2, 2, [5], 19).with_custom_metadata({"app": b"x"})
    decision = from_snapshot(holdings(closed, {}), closed)
    assert decision.verdict is Verdict.EXACT
    assert decision.metadata == closed
    assert decision.reason == FROM_SNAPSHOT


def test_copies_further_along_than_the_snapshot_supersede_it() -> None:
    """Taken while the ledger was open on its first ensemble; it changed ensemble and closed
    after, and the bookies of its last segment hold the closed copy."""
    then = rotating_ledger(3, 2, 2, [], None)
    closed = rotating_ledger(3, 2, 2, [10], 19)
    copies = dict.fromkeys(closed.segments[-1].ensemble, closed)
    decision = from_snapshot(holdings(closed, copies), then)
    assert decision.metadata == closed
    assert decision.reason == ""


def test_on_a_tie_the_snapshot_wins_for_what_changed_without_a_copy() -> None:
    closed = rotating_ledger(3, 2, 2, [], 19)
    archived = closed.with_archived()  # set by an archiver after the close's copies
    decision = from_snapshot(holdings(closed), archived)
    assert decision.metadata == archived


def test_a_stale_snapshot_copy_gives_its_fields_to_an_inference() -> None:
    """The ledger changed ensemble after the snapshot, on bookies that kept no copy: the
    snapshot's single segment does not place the later entries."""
    then = rotating_ledger(3, 2, 2, [], None, bookies=("a:1", "b:1", "c:1", "d:1"))
    then = then.with_custom_metadata({"owner": b"broker-1"})
    later = rotating_ledger(3, 2, 2, [15], 29, bookies=("a:1", "b:1", "c:1", "d:1"))
    decision = from_snapshot(holdings(later, {}), then)
    assert decision.verdict is Verdict.INFERRED
    assert decision.metadata is not None
    assert decision.metadata.segments == later.segments
    assert decision.metadata.custom_metadata == then.custom_metadata
    assert decision.metadata.ctime_ms == then.ctime_ms
    assert "the rest from the snapshot" in decision.reason


def test_a_snapshot_ledger_no_bookie_holds() -> None:
    closed = rotating_ledger(3, 2, 2, [], 19, bookies=("a:1", "b:1", "c:1"))
    everyone = {"a:1", "b:1", "c:1"}
    gone = recover_ledger(LEDGER, [], [], everyone, closed.to_bytes())
    assert gone.verdict is Verdict.NOT_RECOVERABLE
    assert "tombstones forgotten" in gone.reason
    unknown = recover_ledger(LEDGER, [], [], {"a:1"}, closed.to_bytes())
    assert unknown.verdict is Verdict.EXACT, "b and c did not answer: they may hold it all"
    assert unknown.metadata == closed
    empty = rotating_ledger(3, 2, 2, [], -1, bookies=("a:1", "b:1", "c:1"))
    kept = recover_ledger(LEDGER, [], [], everyone, empty.to_bytes())
    assert (kept.verdict, kept.metadata) == (Verdict.EXACT, empty)
    deleted = closed.deleted(Deletion(5, "retention"))
    assert recover_ledger(LEDGER, [], [], everyone, deleted.to_bytes()).verdict is (Verdict.DELETED)


def test_a_soft_deleted_snapshot_ledger_comes_back_deleted_and_is_listed() -> None:
    closed = rotating_ledger(3, 2, 2, [], 19)
    deleted = closed.deleted(Deletion(5, "retention"))
    decision = from_snapshot(holdings(closed), deleted)
    assert decision.metadata == deleted
    assert decision.reason.startswith(SOFT_DELETED)


def test_the_snapshot_s_tombstone_keeps_a_ledger_deleted() -> None:
    closed = rotating_ledger(3, 2, 2, [], 19)
    decision = recover_ledger(LEDGER, holdings(closed), ["the snapshot"], set(), None)
    assert decision.verdict is Verdict.DELETED
