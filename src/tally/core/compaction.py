"""What a bookie's garbage collection does with its files: which to delete, which to compact,
and when a compaction is due (the decisions of BookKeeper's GarbageCollectorThread).

A file here is an entry log or a journal file that holds entries kept in place
(docs/bookie-storage.md). Its live bytes are those of the entries the index points to (an
over-estimate: the storage may count entries it has since dropped); its total bytes are
what it takes on disk. A file in which no ledger still in the index has entries is deleted
(its byte count, which may be off, does not decide that). Otherwise, when a compaction is
due, each file whose live fraction is below the compaction's threshold has its live
entries copied elsewhere and is then deleted: a minor compaction (threshold 0.2, every
hour) frees nearly empty files for little copying; a major one (0.8, every day) also
rewrites files that are mostly live. A major run counts as a minor one too.

Compaction writes before it frees, so it stops where it could fill the disk, as BookKeeper's
does: above the warning threshold (diskUsageWarnThreshold) no major compaction, above the
disk-full threshold (diskUsageThreshold) no minor one either, unless the bookie is told to
force compaction when space is short (isForceGCAllowWhenNoSpace): copying the few live
entries of sparse files is then the way to get space back. Either way a file is compacted
only if its live bytes fit in the free space with `SPACE_RESERVE` of the disk left over.
Files least live come first: they give the most space for the bytes copied.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from tally.core.errors import BadRequest

SPACE_RESERVE = 0.02
"""The fraction of the disk that compaction leaves free whatever it is told."""


class FileKind(enum.Enum):
    ENTRY_LOG = "entry_log"
    JOURNAL = "journal"
    """A journal file that holds entries kept in place."""


class CompactionKind(enum.Enum):
    NONE = "none"
    MINOR = "minor"
    MAJOR = "major"


@dataclass(frozen=True, slots=True)
class FileUsage:
    """One file's bytes on disk, and the ledgers still in the index that have entries in it
    with their bytes (the storage's count: it may include entries dropped one by one)."""

    kind: FileKind
    file_id: int
    total_bytes: int
    live_bytes: int
    live_ledgers: int

    @property
    def live_fraction(self) -> float:
        """Live over total, at most 1 (an empty file is all dead)."""
        if self.total_bytes <= 0:
            return 0.0
        return min(1.0, self.live_bytes / self.total_bytes)


@dataclass(frozen=True, slots=True)
class DiskSpace:
    """The ledger disk's size and free bytes."""

    total_bytes: int
    free_bytes: int

    @property
    def used_fraction(self) -> float:
        if self.total_bytes <= 0:
            return 1.0
        return 1.0 - self.free_bytes / self.total_bytes


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """BookKeeper's settings (minorCompactionThreshold, ...), intervals in seconds. A zero
    threshold or interval turns that compaction off, as in BookKeeper; a forced run still
    compacts with a non-zero threshold."""

    minor_threshold: float = 0.2
    minor_interval: float = 3600.0
    major_threshold: float = 0.8
    major_interval: float = 86400.0
    warn_usage: float = 0.90
    """Disk usage from which major compaction is suspended."""
    full_usage: float = 0.95
    """Disk usage from which minor compaction is suspended too."""
    force_when_no_space: bool = False
    """Compact anyway when the disk is that full (isForceGCAllowWhenNoSpace)."""

    def __post_init__(self) -> None:
        if not 0 <= self.minor_threshold <= self.major_threshold < 1:
            raise BadRequest(
                "compaction thresholds need 0 <= minor <= major < 1, got minor "
                f"{self.minor_threshold} and major {self.major_threshold}"
            )
        if self.minor_interval < 0 or self.major_interval < 0:
            raise BadRequest(
                f"compaction intervals must not be negative, got minor {self.minor_interval} "
                f"and major {self.major_interval}"
            )
        if not 0 < self.warn_usage <= self.full_usage <= 1:
            raise BadRequest(
                "disk usage thresholds need 0 < warning <= full <= 1, got "
                f"{self.warn_usage} and {self.full_usage}"
            )


@dataclass(frozen=True, slots=True)
class CompactionTimes:
    """When the last minor and major compactions finished (seconds, wall clock)."""

    last_minor: float
    last_major: float

    def after(self, kind: CompactionKind, now: float) -> CompactionTimes:
        """The times once a compaction of `kind` has finished at `now`."""
        if kind is CompactionKind.MAJOR:
            return CompactionTimes(now, now)
        if kind is CompactionKind.MINOR:
            return CompactionTimes(now, self.last_major)
        return self


@dataclass(frozen=True, slots=True)
class GcPlan:
    delete: tuple[FileUsage, ...]
    """Files with no entry of a ledger still in the index."""
    compaction: CompactionKind
    compact: tuple[FileUsage, ...]
    """In the order to compact them, least live first."""
    no_room: tuple[FileUsage, ...]
    """Files below the threshold whose live bytes would not fit on the disk now."""
    suspended: str | None
    """Why a due compaction does not run, if it does not."""


def plan_gc(
    files: Iterable[FileUsage],
    policy: CompactionPolicy,
    times: CompactionTimes,
    now: float,
    disk: DiskSpace,
    *,
    force_major: bool = False,
    force_minor: bool = False,
) -> GcPlan:
    """What one garbage collection run does with `files` (none of which is being written).

    `force_major` runs a major compaction now (or a minor one where only that is allowed);
    `force_minor` a minor one.
    """
    files = list(files)
    delete = tuple(sorted((f for f in files if not f.live_ledgers), key=_order))
    used = disk.used_fraction
    short_of_space = used >= policy.warn_usage
    forced_by_space = short_of_space and policy.force_when_no_space
    major_due = policy.major_threshold > 0 and (
        force_major
        or forced_by_space
        or (policy.major_interval > 0 and now - times.last_major >= policy.major_interval)
    )
    minor_due = policy.minor_threshold > 0 and (
        force_minor
        or force_major
        or forced_by_space
        or (policy.minor_interval > 0 and now - times.last_minor >= policy.minor_interval)
    )
    suspend_major = short_of_space and not policy.force_when_no_space
    suspend_minor = used >= policy.full_usage and not policy.force_when_no_space
    if major_due and not suspend_major:
        kind, threshold = CompactionKind.MAJOR, policy.major_threshold
    elif minor_due and not suspend_minor:
        kind, threshold = CompactionKind.MINOR, policy.minor_threshold
    else:
        kind, threshold = CompactionKind.NONE, 0.0
    stopped = [
        name
        for name, due, stop in (
            ("major", major_due, suspend_major),
            ("minor", minor_due, suspend_minor),
        )
        if due and stop
    ]
    suspended = (
        f"{' and '.join(stopped)} compaction suspended: the ledger disk is {used:.0%} full "
        f"(major stops at {policy.warn_usage:.0%}, minor at {policy.full_usage:.0%})"
        if stopped
        else None
    )
    sparse = sorted(
        (f for f in files if f.live_ledgers and f.live_fraction < threshold),
        key=lambda f: (f.live_fraction, *_order(f)),
    )
    headroom = disk.free_bytes - int(disk.total_bytes * SPACE_RESERVE)
    compact, no_room = [], []
    for usage in sparse:
        if usage.live_bytes > headroom:
            no_room.append(usage)
            continue
        compact.append(usage)
        if usage.kind is FileKind.JOURNAL:
            # Its space comes back at the journal's next release, not during this run.
            headroom -= usage.live_bytes
    return GcPlan(delete, kind, tuple(compact), tuple(no_room), suspended)


def _order(usage: FileUsage) -> tuple[str, int]:
    return usage.kind.value, usage.file_id
