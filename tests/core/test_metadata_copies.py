"""Which metadata copy a bookie keeps: the most advanced one it was offered."""

from __future__ import annotations

import dataclasses
import itertools

from tally.core.ledger_metadata import Deletion
from tally.core.metadata_copies import progress, supersedes
from tests.support.ledgers import rotating_ledger


def test_more_segments_then_a_later_state_then_a_later_end_supersede() -> None:
    first = rotating_ledger(3, 2, 2, [], None)
    changed = rotating_ledger(3, 2, 2, [10], None)
    recovering = changed.start_recovery()
    closed = rotating_ledger(3, 2, 2, [10], 20)
    longer = rotating_ledger(3, 2, 2, [10], 30)
    ordered = [first, changed, recovering, closed, longer]
    assert [progress(copy) for copy in ordered] == sorted(progress(copy) for copy in ordered)
    for older, newer in itertools.pairwise(ordered):
        assert supersedes(newer, older)
        assert not supersedes(older, newer)
    assert supersedes(first, None)
    assert not supersedes(closed, closed), "the same copy again changes nothing"


def test_a_delete_then_an_undelete_supersede_a_close_whatever_order_they_arrive_in() -> None:
    closed = rotating_ledger(3, 2, 2, [10], 20)
    deleted = closed.deleted(Deletion(9_000, "retention"))
    undeleted = deleted.undeleted(now_ms=100)  # an undeleting client whose clock is behind
    deleted_again = undeleted.deleted(Deletion(50, "again"))
    history = [closed, deleted, undeleted, deleted_again]
    for older, newer in itertools.pairwise(history):
        assert supersedes(newer, older)
        assert not supersedes(older, newer), "a late copy of an earlier state is left"
    assert not supersedes(closed, deleted), "a slow close does not undo a delete"
    archived = dataclasses.replace(closed, archived=True)
    assert not supersedes(archived, closed), "the same progress: the held copy stays"
