"""The scrubber's decisions: when a pass is due, at what rate, in steps of what size."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.core.errors import BadRequest
from tally.core.scrub import (
    MAX_STEP_BYTES,
    MIN_RATE,
    MIN_STEP_BYTES,
    ScrubAction,
    ScrubPass,
    ScrubPlan,
    ScrubPolicy,
    ScrubTrigger,
    next_pass_at,
    plan_scrub,
    scrub_rate,
    step_bytes,
)

WEEK = 604800.0
TB = 10**12

times = st.floats(min_value=0, max_value=1e10, allow_nan=False)
intervals = st.floats(min_value=0, max_value=1e8, allow_nan=False)
disks = st.integers(min_value=0, max_value=10**15)


def complete(started: float, ended: float) -> ScrubPass:
    return ScrubPass(started, ScrubTrigger.SCHEDULE).finished(ended)


@st.composite
def passes(draw: st.DrawFn) -> ScrubPass | None:
    if draw(st.booleans()):
        return None
    started = draw(times)
    return complete(started, started + draw(st.floats(min_value=0, max_value=1e7)))


def test_the_default_rate_reads_a_full_disk_in_about_the_interval() -> None:
    policy = ScrubPolicy()
    assert policy.interval == WEEK
    rate = scrub_rate(policy, 4 * TB)
    assert rate == pytest.approx(4 * TB / WEEK)
    assert 4 * TB / rate == pytest.approx(WEEK)
    assert scrub_rate(policy, 10**9) == MIN_RATE, "a small disk is read at the floor rate"
    assert scrub_rate(ScrubPolicy(rate_bytes=5_000_000), 4 * TB) == 5_000_000


@given(intervals, st.integers(min_value=0, max_value=10**10), disks)
def test_the_rate_is_the_setting_or_a_pass_over_the_full_disk_within_the_interval(
    interval: float, rate_bytes: int, disk: int
) -> None:
    policy = ScrubPolicy(interval, rate_bytes)
    rate = scrub_rate(policy, disk)
    if rate_bytes:
        assert rate == rate_bytes
    else:
        assert rate >= MIN_RATE
        if interval > 0:
            assert disk / rate <= interval * (1 + 1e-9)
            if disk / interval > MIN_RATE:
                assert disk / rate == pytest.approx(interval)


@given(st.one_of(st.none(), st.floats(min_value=1, max_value=1e12, allow_nan=False)))
def test_a_step_is_about_a_second_at_the_rate_and_bounded(rate: float | None) -> None:
    size = step_bytes(rate)
    assert MIN_STEP_BYTES <= size <= MAX_STEP_BYTES
    if rate is None:
        assert size == MAX_STEP_BYTES
    elif MIN_STEP_BYTES <= rate <= MAX_STEP_BYTES:
        assert size == pytest.approx(rate, abs=1)


def test_the_first_pass_starts_at_once_and_the_next_one_interval_after_the_last_ended() -> None:
    policy = ScrubPolicy(interval=WEEK)
    assert plan_scrub(None, None, policy, 1000.0) == ScrubPlan(ScrubAction.STEP)
    last = complete(1000.0, 5000.0)
    assert next_pass_at(last, policy) == 5000.0 + WEEK
    assert plan_scrub(last, None, policy, 6000.0) == ScrubPlan(ScrubAction.WAIT, wait=WEEK - 1000.0)
    assert plan_scrub(last, None, policy, 5000.0 + WEEK) == ScrubPlan(ScrubAction.STEP)


def test_a_pass_under_way_goes_on_at_its_own_speed_and_a_request_speeds_it_up() -> None:
    policy = ScrubPolicy(interval=WEEK)
    last = complete(0.0, 10.0)
    scheduled = ScrubPass(20.0, ScrubTrigger.SCHEDULE).plus(
        bytes_read=5, entries=1, corrupt=0, unreadable=0
    )
    assert plan_scrub(last, scheduled, policy, 30.0) == ScrubPlan(ScrubAction.STEP)
    assert plan_scrub(last, scheduled, policy, 30.0, requested=True) == ScrubPlan(
        ScrubAction.STEP, full_speed=True
    )
    operator = scheduled.at_full_speed()
    assert plan_scrub(last, operator, policy, 30.0) == ScrubPlan(ScrubAction.STEP, full_speed=True)


def test_no_interval_scrubs_only_on_request() -> None:
    policy = ScrubPolicy(interval=0)
    assert next_pass_at(None, policy) is None
    assert plan_scrub(None, None, policy, 1e9) == ScrubPlan(ScrubAction.WAIT)
    assert plan_scrub(None, None, policy, 1e9, requested=True) == ScrubPlan(
        ScrubAction.STEP, full_speed=True
    )
    scheduled = ScrubPass(5.0, ScrubTrigger.SCHEDULE)
    assert plan_scrub(None, scheduled, policy, 1e9) == ScrubPlan(ScrubAction.WAIT), (
        "a scheduled pass under way when scrubbing was set to on request only waits"
    )
    assert plan_scrub(None, scheduled.at_full_speed(), policy, 1e9) == ScrubPlan(
        ScrubAction.STEP, full_speed=True
    )


@given(passes(), intervals, times, st.booleans())
def test_a_pass_is_scheduled_exactly_when_due(
    last: ScrubPass | None, interval: float, now: float, requested: bool
) -> None:
    policy = ScrubPolicy(interval)
    plan = plan_scrub(last, None, policy, now, requested=requested)
    due = next_pass_at(last, policy)
    if requested:
        assert plan == ScrubPlan(ScrubAction.STEP, full_speed=True)
    elif due is None:
        assert plan == ScrubPlan(ScrubAction.WAIT, wait=None)
    elif now >= due:
        assert plan == ScrubPlan(ScrubAction.STEP)
    else:
        assert plan.action is ScrubAction.WAIT
        assert plan.wait is not None
        assert 0 < plan.wait <= interval
        assert last is not None
        assert last.ended is not None
        if now >= last.ended:
            assert now + plan.wait == pytest.approx(due)


@given(passes(), st.floats(min_value=1, max_value=1e8), times)
def test_waiting_out_a_plan_makes_the_pass_due(
    last: ScrubPass | None, interval: float, now: float
) -> None:
    policy = ScrubPolicy(interval)
    plan = plan_scrub(last, None, policy, now)
    if plan.action is ScrubAction.WAIT:
        assert plan.wait is not None
        later = plan_scrub(last, None, policy, max(now + plan.wait, now))
        due = next_pass_at(last, policy)
        assert due is not None
        assert later.action is ScrubAction.STEP or now + plan.wait < due


def test_a_pass_adds_up_its_steps() -> None:
    current = ScrubPass(1.0, ScrubTrigger.SCHEDULE)
    for _ in range(3):
        current = current.plus(bytes_read=100, entries=2, corrupt=1, unreadable=0)
    assert not current.complete
    done = current.finished(9.0)
    assert (done.bytes, done.entries, done.corrupt, done.unreadable) == (300, 6, 3, 0)
    assert done.complete
    assert done.ended == 9.0


def test_negative_settings_are_refused() -> None:
    with pytest.raises(BadRequest):
        ScrubPolicy(interval=-1)
    with pytest.raises(BadRequest):
        ScrubPolicy(rate_bytes=-1)
