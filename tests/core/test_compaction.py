"""Garbage collection's decisions: which files go, which are compacted, and when."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.core.compaction import (
    SPACE_RESERVE,
    CompactionKind,
    CompactionPolicy,
    CompactionTimes,
    DiskSpace,
    FileKind,
    FileUsage,
    GcPlan,
    plan_gc,
)
from tally.core.errors import BadRequest

HOUR, DAY = 3600.0, 86400.0
ROOMY = DiskSpace(total_bytes=10**12, free_bytes=9 * 10**11)
POLICY = CompactionPolicy()


def usage(file_id: int, live: int, total: int = 100, ledgers: int | None = None) -> FileUsage:
    return FileUsage(FileKind.ENTRY_LOG, file_id, total, live, 1 if ledgers is None else ledgers)


def plan(
    files: list[FileUsage],
    *,
    since_minor: float = 0.0,
    since_major: float = 0.0,
    disk: DiskSpace = ROOMY,
    policy: CompactionPolicy = POLICY,
    force_major: bool = False,
    force_minor: bool = False,
) -> GcPlan:
    """The plan at `now`, the last compactions that long ago."""
    now = 10 * DAY
    times = CompactionTimes(now - since_minor, now - since_major)
    return plan_gc(
        files, policy, times, now, disk, force_major=force_major, force_minor=force_minor
    )


def test_files_without_a_live_ledger_are_deleted_whatever_their_count_says() -> None:
    files = [usage(1, 0, ledgers=0), usage(2, 0, ledgers=1), usage(3, 40, ledgers=0)]
    result = plan(files)
    assert [f.file_id for f in result.delete] == [1, 3]
    assert result.compaction is CompactionKind.NONE
    assert result.compact == ()


def test_minor_every_hour_and_major_every_day_least_live_first() -> None:
    files = [usage(1, 15), usage(2, 5), usage(3, 50), usage(4, 85), usage(5, 0, ledgers=1)]
    assert plan(files, since_minor=HOUR - 1, since_major=HOUR - 1).compaction is (
        CompactionKind.NONE
    )
    minor = plan(files, since_minor=HOUR, since_major=HOUR)
    assert minor.compaction is CompactionKind.MINOR
    assert [f.file_id for f in minor.compact] == [5, 2, 1], "below 20 % live, least live first"
    major = plan(files, since_minor=HOUR, since_major=DAY)
    assert major.compaction is CompactionKind.MAJOR
    assert [f.file_id for f in major.compact] == [5, 2, 1, 3], "below 80 %"
    assert plan(files, force_minor=True).compaction is CompactionKind.MINOR
    assert plan(files, force_major=True).compaction is CompactionKind.MAJOR


def test_times_after_a_run() -> None:
    times = CompactionTimes(1.0, 2.0)
    assert times.after(CompactionKind.MINOR, 9.0) == CompactionTimes(9.0, 2.0)
    assert times.after(CompactionKind.MAJOR, 9.0) == CompactionTimes(9.0, 9.0)
    assert times.after(CompactionKind.NONE, 9.0) == times


def test_a_zero_threshold_or_interval_turns_a_compaction_off() -> None:
    files = [usage(1, 10)]
    no_interval = CompactionPolicy(minor_interval=0, major_interval=0)
    assert plan(files, policy=no_interval, since_minor=DAY, since_major=DAY).compaction is (
        CompactionKind.NONE
    )
    assert plan(files, policy=no_interval, force_major=True).compaction is CompactionKind.MAJOR
    no_major = CompactionPolicy(major_threshold=0.2, minor_threshold=0.0)
    assert plan(files, policy=no_major, force_minor=True).compaction is CompactionKind.NONE
    off = CompactionPolicy(minor_threshold=0.0, major_threshold=0.0)
    assert plan(files, policy=off, force_major=True).compaction is CompactionKind.NONE


def test_a_nearly_full_disk_suspends_major_then_minor_compaction() -> None:
    files = [usage(1, 10), usage(2, 50)]
    total = 10**12
    warn = DiskSpace(total, int(total * 0.09))
    result = plan(files, disk=warn, since_minor=DAY, since_major=DAY)
    assert result.compaction is CompactionKind.MINOR
    assert [f.file_id for f in result.compact] == [1]
    assert result.suspended is not None
    assert result.suspended.startswith("major compaction suspended")
    full = DiskSpace(total, int(total * 0.04))
    result = plan(files, disk=full, force_major=True)
    assert result.compaction is CompactionKind.NONE
    assert result.suspended is not None
    assert result.suspended.startswith("major and minor compaction suspended")
    assert "96% full" in result.suspended
    assert plan(files, disk=full).suspended is None, "nothing was due"
    forcing = CompactionPolicy(force_when_no_space=True)
    result = plan(files, disk=full, policy=forcing)
    assert result.compaction is CompactionKind.MAJOR, "space short: compaction forced"
    assert result.suspended is None
    assert [f.file_id for f in result.compact] == [1, 2]


def test_a_file_is_compacted_only_if_its_live_bytes_fit_with_the_reserve_left() -> None:
    disk = DiskSpace(total_bytes=1000, free_bytes=200)  # 180 bytes above the reserve
    logs = [usage(1, 150, total=1000), usage(2, 120, total=1000), usage(3, 190, total=1000)]
    result = plan(logs, disk=disk, force_major=True)
    assert [f.file_id for f in result.compact] == [2, 1], "each log's space comes back at once"
    assert [f.file_id for f in result.no_room] == [3]
    journal = FileUsage(FileKind.JOURNAL, 7, 1000, 100, 1)
    result = plan([*logs, journal], disk=disk, force_major=True)
    assert [(f.kind, f.file_id) for f in result.compact] == [(FileKind.JOURNAL, 7)]
    assert [f.file_id for f in result.no_room] == [2, 1, 3], (
        "a journal file's space comes back only at the journal's release: it uses up room"
    )


def test_settings_are_checked() -> None:
    for bad in (
        {"minor_threshold": 0.5, "major_threshold": 0.4},
        {"major_threshold": 1.0},
        {"minor_threshold": -0.1},
        {"minor_interval": -1.0},
        {"warn_usage": 0.96, "full_usage": 0.95},
        {"warn_usage": 0.0},
    ):
        with pytest.raises(BadRequest):
            CompactionPolicy(**bad)  # type: ignore[arg-type]


def test_live_fraction() -> None:
    assert usage(1, 50).live_fraction == 0.5
    assert usage(1, 500).live_fraction == 1.0, "an over-count is capped"
    assert usage(1, 0, total=0).live_fraction == 0.0
    assert DiskSpace(0, 0).used_fraction == 1.0


files_strategy = st.lists(
    st.builds(
        FileUsage,
        st.sampled_from(FileKind),
        st.integers(0, 50),
        st.integers(0, 10**6),
        st.integers(0, 10**6),
        st.integers(0, 3),
    ),
    max_size=30,
    unique_by=lambda f: (f.kind, f.file_id),
)


@given(
    files_strategy,
    st.floats(0, 2 * DAY),
    st.floats(0, 2 * DAY),
    st.integers(0, 10**7),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_every_plan_keeps_the_rules(
    files: list[FileUsage],
    since_minor: float,
    since_major: float,
    free: int,
    force_major: bool,
    force_minor: bool,
    force_when_no_space: bool,
) -> None:
    policy = CompactionPolicy(force_when_no_space=force_when_no_space)
    disk = DiskSpace(10**7, free)
    result = plan(
        files,
        policy=policy,
        disk=disk,
        since_minor=since_minor,
        since_major=since_major,
        force_major=force_major,
        force_minor=force_minor,
    )
    assert set(result.delete) == {f for f in files if f.live_ledgers == 0}
    threshold = {
        CompactionKind.MAJOR: policy.major_threshold,
        CompactionKind.MINOR: policy.minor_threshold,
        CompactionKind.NONE: 0.0,
    }[result.compaction]
    sparse = {f for f in files if f.live_ledgers and f.live_fraction < threshold}
    assert set(result.compact) | set(result.no_room) == sparse
    assert not set(result.compact) & set(result.no_room)
    fractions = [f.live_fraction for f in result.compact]
    assert fractions == sorted(fractions)
    headroom = free - int(disk.total_bytes * SPACE_RESERVE)
    for chosen in result.compact:
        assert chosen.live_bytes <= headroom
        if chosen.kind is FileKind.JOURNAL:
            headroom -= chosen.live_bytes
    used = disk.used_fraction
    if used >= policy.full_usage and not force_when_no_space:
        assert result.compaction is CompactionKind.NONE
    if used >= policy.warn_usage and not force_when_no_space:
        assert result.compaction is not CompactionKind.MAJOR
    if result.compaction is CompactionKind.NONE and result.suspended is None:
        forced_by_space = used >= policy.warn_usage and force_when_no_space
        due = force_major or force_minor or since_minor >= HOUR or since_major >= DAY
        assert not due
        assert not forced_by_space
