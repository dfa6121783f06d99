"""Read-only mode: usage threshold with a low-water mark, and sticky I/O errors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.core.disk_usage import BookieMode, DiskPolicy, DiskState
from tally.core.errors import BadRequest


def test_turns_read_only_at_threshold_and_back_below_low_water() -> None:
    state = DiskState(DiskPolicy(usage_threshold=0.95, low_water_mark=0.90))
    trail = []
    for usage in [0.5, 0.94, 0.95, 0.93, 0.91, 0.90, 0.89, 0.94]:
        state = state.with_usage(usage)
        trail.append(state.mode)
    w, r = BookieMode.WRITABLE, BookieMode.READ_ONLY
    assert trail == [w, w, r, r, r, r, w, w]


def test_io_error_is_sticky_and_wins_over_usage() -> None:
    state = DiskState().with_io_error("EIO on journal").with_usage(0.1)
    assert state.mode is BookieMode.READ_ONLY
    assert "EIO on journal" in state.reason
    assert state.with_io_error("second").io_error == "EIO on journal"


@given(st.lists(st.floats(0, 1), max_size=30))
def test_mode_follows_the_hysteresis_definition(usages: list[float]) -> None:
    policy = DiskPolicy(0.95, 0.9)
    state = DiskState(policy)
    full = False
    for usage in usages:
        state = state.with_usage(usage)
        full = usage >= (policy.low_water_mark if full else policy.usage_threshold)
        assert (state.mode is BookieMode.READ_ONLY) == full


@pytest.mark.parametrize(("threshold", "low"), [(0.9, 0.95), (1.1, 0.9), (0.9, 0.0)])
def test_bad_policies_are_refused(threshold: float, low: float) -> None:
    with pytest.raises(BadRequest):
        DiskPolicy(usage_threshold=threshold, low_water_mark=low)
