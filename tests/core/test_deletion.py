"""The delete discipline's decisions: what may be deleted, and when a tombstone may go."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.core.deletion import (
    DAY,
    ClusterSettings,
    DeletePlan,
    Tombstone,
    parse_seconds,
    plan_delete,
    tombstone_due,
)
from tally.core.errors import BadSetting, DeleteRefused
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import Deletion, LedgerMetadata
from tests.support.ledgers import open_ledger as new_ledger

LEDGER = LedgerId.classic(7)
E3 = ("bk1:3181", "bk2:3181", "bk3:3181")


def open_ledger() -> LedgerMetadata:
    return new_ledger(E3, 2)


def closed() -> LedgerMetadata:
    return open_ledger().close(9, 90)


def test_defaults_are_conservative() -> None:
    settings = ClusterSettings()
    assert settings.ledger_delete_retention >= 3600
    assert settings.tombstone_retention == 7 * DAY
    assert settings.delete_requires_archival is False


def test_settings_parse_as_an_operator_types_them() -> None:
    changed = ClusterSettings().with_text_values(
        {"ledger_delete_retention": " 0", "delete_requires_archival": "yes"}
    )
    assert changed == ClusterSettings(ledger_delete_retention=0, delete_requires_archival=True)
    with pytest.raises(BadSetting, match="no such cluster setting"):
        ClusterSettings().with_text_values({"retention": "1"})
    with pytest.raises(BadSetting, match="must be true or false"):
        ClusterSettings().with_text_values({"delete_requires_archival": "maybe"})
    with pytest.raises(BadSetting, match="at least 0"):
        parse_seconds("tombstone_retention", "-5")
    with pytest.raises(BadSetting, match="whole number of seconds"):
        ClusterSettings().with_text_values({"tombstone_retention": "1h"})
    with pytest.raises(BadSetting, match="whole seconds >= 0"):
        ClusterSettings(tombstone_retention=-1)


def test_a_closed_ledger_is_deleted_and_a_deleted_one_is_left_alone() -> None:
    settings = ClusterSettings()
    assert plan_delete(LEDGER, closed(), settings, force=False) is DeletePlan.DELETE
    deleted = closed().deleted(Deletion(5, "x"))
    assert plan_delete(LEDGER, deleted, settings, force=False) is DeletePlan.ALREADY_DELETED


def test_an_open_ledger_is_refused_unless_forced_then_recovered_first() -> None:
    with pytest.raises(DeleteRefused, match=r"ledger 7 is OPEN.*force"):
        plan_delete(LEDGER, open_ledger(), ClusterSettings(), force=False)
    assert (
        plan_delete(LEDGER, open_ledger(), ClusterSettings(), force=True)
        is DeletePlan.RECOVER_FIRST
    )


def test_archival_required_refuses_unarchived_ledgers_even_forced() -> None:
    settings = ClusterSettings(delete_requires_archival=True)
    with pytest.raises(DeleteRefused, match=r"not archived.*setarchived"):
        plan_delete(LEDGER, closed(), settings, force=True)
    with pytest.raises(DeleteRefused, match="not archived"):
        plan_delete(LEDGER, open_ledger(), settings, force=True)
    assert plan_delete(LEDGER, closed().with_archived(), settings, force=False) is DeletePlan.DELETE


def test_the_tombstone_is_due_at_the_end_of_the_retention() -> None:
    deleted = closed().deleted(Deletion(10_000, "x"))
    assert not tombstone_due(deleted, 10_000 + 59_999, 60)
    assert tombstone_due(deleted, 10_000 + 60_000, 60)
    assert tombstone_due(deleted, 10_000, 0)
    assert not tombstone_due(closed(), 10**12, 0)


def tombstone(bookies: dict[str, int | None], tombstoned_ms: int = 1_000) -> Tombstone:
    return Tombstone(Deletion(500, "x"), tombstoned_ms, 9, 90, bookies)


def test_a_tombstone_names_every_bookie_of_every_segment() -> None:
    metadata = (
        open_ledger()
        .with_ensemble_change(5, ("bk4:3181", "bk2:3181", "bk3:3181"))
        .close(9, 90)
        .deleted(Deletion(500, "trim"))
    )
    made = Tombstone.of(metadata, 2_000)
    assert made.bookies == dict.fromkeys(sorted([*E3, "bk4:3181"]))
    assert made.pending == frozenset([*E3, "bk4:3181"])
    with pytest.raises(DeleteRefused):
        Tombstone.of(closed(), 2_000)


def test_acknowledgements_are_kept_and_an_unnamed_holder_adds_itself() -> None:
    first = tombstone({"a": None, "b": None}).acknowledged("a", 2_000)
    assert first.bookies == {"a": 2_000, "b": None}
    assert first.acknowledged("a", 3_000) is first
    extra = first.acknowledged("z", 4_000)
    assert extra.bookies == {"a": 2_000, "b": None, "z": 4_000}
    assert extra.pending == {"b"}


def test_removal_waits_for_the_retention_after_the_last_ack_or_after_writing() -> None:
    acked = tombstone({"a": 5_000, "b": 9_000})
    assert not acked.removable(9_000 + 9_999, 10)
    assert acked.removable(9_000 + 10_000, 10)
    waiting = tombstone({"a": 5_000, "b": None})
    assert not waiting.removable(1_000 + 9_999, 10)
    assert waiting.removable(1_000 + 10_000, 10)


def test_stuck_means_pending_past_the_threshold() -> None:
    assert tombstone({"a": None}).stuck(1_000 + 3_600_000, 3_600)
    assert not tombstone({"a": None}).stuck(1_000 + 3_599_999, 3_600)
    assert not tombstone({"a": 2_000}).stuck(10**12, 3_600)


def test_overdue_is_the_threshold_past_the_tombstone_whatever_the_acknowledgements() -> None:
    for bookies in ({"a": None}, {"a": 2_000}, {}):
        assert tombstone(bookies).overdue(1_000 + 3_600_000, 3_600)
        assert not tombstone(bookies).overdue(1_000 + 3_599_999, 3_600)
    assert tombstone({"a": None}).overdue(1_000, 0)


@given(
    acks=st.dictionaries(
        st.sampled_from("abcdef"), st.one_of(st.none(), st.integers(1_000, 10**9)), min_size=1
    ),
    now=st.integers(0, 2 * 10**9),
    retention=st.integers(0, 10**6),
)
def test_a_tombstone_never_goes_before_its_retention_since_writing(
    acks: dict[str, int | None], now: int, retention: int
) -> None:
    made = tombstone(acks)
    if made.removable(now, retention):
        assert now >= made.tombstoned_ms + retention * 1000
        acked = [t for t in acks.values() if t is not None]
        if not made.pending:
            assert now >= max(acked) + retention * 1000
