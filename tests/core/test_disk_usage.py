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


def test_a_journal_out_of_room_is_retried_on_schedule_and_cured_by_a_new_file() -> None:
    policy = DiskPolicy(usage_threshold=0.95, low_water_mark=0.90, journal_retry_interval=10)
    state = DiskState(policy).with_journal_failure("ENOSPC", now=100.0)
    assert state.mode is BookieMode.READ_ONLY
    assert not state.journal_writes
    assert "journal cannot write: ENOSPC" in state.reason
    assert "every 10s" in state.reason
    assert not state.journal_retry_due(109.9)
    assert state.journal_retry_due(110.0)
    assert state.with_usage(0.1).mode is BookieMode.READ_ONLY, "usage does not cure it"

    still = state.with_journal_failure("ENOSPC again", now=110.0)
    assert not still.journal_retry_due(119.9)
    assert still.journal_retry_due(120.0)
    assert still.with_journal_writing().mode is BookieMode.WRITABLE
    assert still.with_journal_writing().journal_writes


def test_a_journal_written_again_leaves_the_usage_thresholds_in_charge() -> None:
    state = (
        DiskState(DiskPolicy(usage_threshold=0.95, low_water_mark=0.90))
        .with_usage(0.96)
        .with_journal_failure("ENOSPC", now=0.0)
        .with_usage(0.92)  # room freed, but not below the low-water mark
        .with_journal_writing()
    )
    assert state.mode is BookieMode.READ_ONLY
    assert state.journal_writes
    assert state.with_usage(0.89).mode is BookieMode.WRITABLE


def test_a_failing_journal_disk_is_retried_too_and_an_io_error_elsewhere_is_not() -> None:
    state = DiskState().with_journal_failure("EIO", now=0.0)
    assert state.mode is BookieMode.READ_ONLY
    assert state.journal_retry_due(10.0)
    assert state.with_journal_writing().mode is BookieMode.WRITABLE
    # A checkpoint's I/O error (ledger storage) is for good: no new journal file cures it.
    broken = state.with_io_error("checkpoint failed: EIO")
    assert not broken.journal_retry_due(1e9)
    assert broken.with_journal_writing().mode is BookieMode.READ_ONLY


@pytest.mark.parametrize("interval", [0.0, -1.0])
def test_a_journal_retry_interval_must_be_positive(interval: float) -> None:
    with pytest.raises(BadRequest, match="retry interval"):
        DiskPolicy(journal_retry_interval=interval)
