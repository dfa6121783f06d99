"""Which metadata copy a bookie keeps: the most advanced one it was offered."""

from __future__ import annotations

import itertools

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
