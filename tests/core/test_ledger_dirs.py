"""Where a bookie places a new ledger among its ledger directories, and when a directory has
failed: never a failed directory, full ones last, spread by free space per ledger; a
failure is final, a full disk is none, an unclear error asks for a probe."""

from __future__ import annotations

import errno

from hypothesis import given
from hypothesis import strategies as st

from tally.core.ledger_dirs import (
    DirectoryHealth,
    DirectoryState,
    DirectoryView,
    DiskError,
    ProbeResult,
    choose_directory,
    classify_error,
)

views = st.builds(
    DirectoryView,
    failed=st.booleans(),
    full=st.booleans(),
    free_bytes=st.integers(0, 2**40),
    ledgers=st.integers(0, 10**6),
)


@given(st.lists(views, max_size=8))
def test_the_chosen_directory_is_healthy_and_none_only_when_all_failed(
    directories: list[DirectoryView],
) -> None:
    chosen = choose_directory(directories)
    if all(d.failed for d in directories):
        assert chosen is None
        return
    assert chosen is not None
    assert not directories[chosen].failed
    if any(not d.failed and not d.full for d in directories):
        assert not directories[chosen].full


@given(st.integers(1, 6), st.integers(1, 200))
def test_ledgers_placed_one_after_another_spread_evenly_over_equal_directories(
    count: int, ledgers: int
) -> None:
    placed = [0] * count
    for _ in range(ledgers):
        views = [DirectoryView(False, False, 1 << 30, n) for n in placed]
        chosen = choose_directory(views)
        assert chosen is not None
        placed[chosen] += 1
    assert max(placed) - min(placed) <= 1


def test_a_new_empty_directory_takes_new_ledgers_until_it_holds_its_share() -> None:
    placed = [100, 0]
    choices = []
    for _ in range(102):
        views = [DirectoryView(False, False, 1 << 30, n) for n in placed]
        chosen = choose_directory(views)
        assert chosen is not None
        choices.append(chosen)
        placed[chosen] += 1
    assert choices == [1] * 100 + [0, 1]
    assert placed == [101, 101]


def test_a_larger_disk_takes_more_ledgers() -> None:
    placed = [0, 0]
    for _ in range(300):
        views = [
            DirectoryView(False, False, free, n) for free, n in zip((1, 2), placed, strict=True)
        ]
        chosen = choose_directory(views)
        assert chosen is not None
        placed[chosen] += 1
    assert placed == [100, 200]


def test_full_directories_are_chosen_only_when_every_healthy_one_is_full() -> None:
    roomy = DirectoryView(False, False, 10, 1000)
    full = DirectoryView(False, True, 1 << 40, 0)
    failed = DirectoryView(True, False, 1 << 40, 0)
    assert choose_directory([full, roomy, failed]) == 1
    assert choose_directory([full, failed]) == 0
    assert choose_directory([failed]) is None
    assert choose_directory([]) is None


def test_errors_are_failures_full_disks_or_unclear() -> None:
    for number in (errno.EIO, errno.EROFS, errno.ENODEV, errno.EUCLEAN):
        assert classify_error(number) is DiskError.FAILED
    for number in (errno.ENOSPC, errno.EDQUOT):
        assert classify_error(number) is DiskError.FULL
    for number in (None, errno.ENOENT, errno.EACCES):
        assert classify_error(number) is DiskError.UNCLEAR


def test_an_io_error_fails_the_directory_a_full_disk_does_not_an_unclear_one_asks_a_probe() -> None:
    healthy = DirectoryHealth()
    failed, probe = healthy.on_error(errno.EROFS, "read-only file system", 5.0)
    assert (failed.state, failed.reason, failed.since, probe) == (
        DirectoryState.FAILED,
        "read-only file system",
        5.0,
        False,
    )
    assert healthy.on_error(errno.ENOSPC, "no space", 5.0) == (healthy, False)
    assert healthy.on_error(None, "index error", 5.0) == (healthy, True)
    assert healthy.on_error(errno.ENOENT, "no such file", 5.0) == (healthy, True)
    assert failed.on_error(None, "index error", 6.0) == (failed, False)


def test_a_probe_fails_the_directory_unless_it_worked_or_found_the_disk_full() -> None:
    healthy = DirectoryHealth()
    fine = ProbeResult(device_at_start=7, device_now=7)
    assert healthy.on_probe(fine, 1.0) is healthy
    full = ProbeResult(7, 7, errno.ENOSPC, "write: no space left on device")
    assert healthy.on_probe(full, 1.0) is healthy
    for broken in (
        ProbeResult(7, 8),
        ProbeResult(7, 7, errno.EROFS, "write: read-only file system"),
        ProbeResult(7, None, errno.ENOENT, "stat: no such file or directory"),
        ProbeResult(7, 7, None, "read back other bytes"),
        ProbeResult(7, 7, None, "30 s", finished=False),
    ):
        after = healthy.on_probe(broken, 1.0)
        assert after.failed, broken
        assert after.since == 1.0
    assert "unmounted" in healthy.on_probe(ProbeResult(7, 8), 1.0).reason


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("error"), st.sampled_from([None, errno.EIO, errno.ENOSPC, 2])),
            st.tuples(st.just("probe"), st.sampled_from([None, errno.EIO, errno.ENOSPC])),
        ),
        max_size=20,
    )
)
def test_a_failed_directory_stays_failed_with_its_first_reason(
    events: list[tuple[str, int | None]],
) -> None:
    health = DirectoryHealth().fail("first", 0.0)
    for now, (kind, number) in enumerate(events, start=1):
        if kind == "error":
            health, probe = health.on_error(number, "later", float(now))
            assert not probe
        else:
            error = "" if number is None else "later"
            health = health.on_probe(ProbeResult(1, 1, number, error), float(now))
        assert (health.failed, health.reason, health.since) == (True, "first", 0.0)
