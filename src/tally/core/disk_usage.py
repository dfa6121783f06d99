"""When a bookie turns read-only and back: disk usage with hysteresis, a full journal, and
I/O errors.

A bookie whose disk crosses the usage threshold (BookKeeper's diskUsageThreshold, 0.95)
stops taking writes but keeps serving reads; it turns writable again only below the
low-water mark (diskUsageLwmThreshold, 0.90), so it does not flap around one value.

A journal that runs out of room (ENOSPC or a quota while writing, syncing, preallocating
or creating a file) makes the bookie read-only until a new journal file can be written:
the bookie tries one every `journal_retry_interval` seconds and turns writable again, by
itself, as soon as one fits, since a full disk is cured by room, not by a restart. Any
other I/O error on the write path makes it read-only until an operator restarts it: a disk
that failed once is not trusted with new data on its own word.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from tally.core.errors import BadRequest


class BookieMode(enum.Enum):
    WRITABLE = "writable"
    READ_ONLY = "readonly"


DEFAULT_USAGE_THRESHOLD = 0.95
"""BookKeeper's diskUsageThreshold."""
DEFAULT_LOW_WATER_MARK = 0.90
"""BookKeeper's diskUsageLwmThreshold."""
DEFAULT_JOURNAL_RETRY_INTERVAL = 10.0
"""Seconds between two attempts to write a new journal file after the journal ran out of
room (BookKeeper's diskCheckInterval)."""


@dataclass(frozen=True, slots=True)
class DiskPolicy:
    usage_threshold: float = DEFAULT_USAGE_THRESHOLD
    low_water_mark: float = DEFAULT_LOW_WATER_MARK
    journal_retry_interval: float = DEFAULT_JOURNAL_RETRY_INTERVAL

    def __post_init__(self) -> None:
        if not 0 < self.low_water_mark <= self.usage_threshold <= 1:
            raise BadRequest(
                "need 0 < low-water mark <= usage threshold <= 1, got "
                f"{self.low_water_mark} and {self.usage_threshold}"
            )
        if not self.journal_retry_interval > 0:
            raise BadRequest(
                f"the journal retry interval must be positive, got {self.journal_retry_interval}"
            )


@dataclass(frozen=True, slots=True)
class DiskState:
    """The bookie's mode and why; change it only through the methods below."""

    policy: DiskPolicy = DiskPolicy()
    disk_full: bool = False
    io_error: str | None = None
    journal_failed: str | None = None
    """Why the journal stopped (out of room, or its disk failing), until a new journal file
    is written and synced."""
    journal_retry_at: float = 0.0
    """When (on the caller's clock) to try a new journal file next, while `journal_failed`."""
    checkpoint_out_of_room: str | None = None
    """Why the last checkpoint failed for want of room on a ledger disk, until one succeeds
    (the checkpoints go on: a full disk is no failure)."""

    @property
    def mode(self) -> BookieMode:
        if (
            self.disk_full
            or self.io_error is not None
            or self.journal_failed is not None
            or self.checkpoint_out_of_room is not None
        ):
            return BookieMode.READ_ONLY
        return BookieMode.WRITABLE

    @property
    def journal_writes(self) -> bool:
        """Whether the journal takes records: what recovery's writes need on a full disk."""
        return self.io_error is None and self.journal_failed is None

    @property
    def reason(self) -> str:
        if self.io_error is not None:
            return f"I/O error: {self.io_error}"
        if self.journal_failed is not None:
            return (
                f"the journal cannot write: {self.journal_failed}; writable again once a new "
                f"journal file is written (tried every {self.policy.journal_retry_interval:g}s)"
            )
        if self.checkpoint_out_of_room is not None:
            return (
                f"a checkpoint found no room on a ledger disk: {self.checkpoint_out_of_room}; "
                "writable again at the first checkpoint that succeeds"
            )
        if self.disk_full:
            return f"disk usage at or above {self.policy.usage_threshold:.0%}"
        return "writable"

    def with_usage(self, fraction_used: float) -> DiskState:
        """Feed a fresh reading of the fullest data disk (0.0 .. 1.0)."""
        if self.disk_full:
            return replace(self, disk_full=fraction_used >= self.policy.low_water_mark)
        return replace(self, disk_full=fraction_used >= self.policy.usage_threshold)

    def with_checkpoint_out_of_room(self, description: str) -> DiskState:
        """A checkpoint failed for want of room (ENOSPC) on a ledger disk: read-only, not
        failed (issue 17: a full disk turns writable again by itself)."""
        return replace(self, checkpoint_out_of_room=description)

    def with_checkpoint_done(self) -> DiskState:
        """A checkpoint succeeded: there is room again."""
        return replace(self, checkpoint_out_of_room=None)

    def with_io_error(self, description: str) -> DiskState:
        return replace(self, io_error=self.io_error or description)

    def with_journal_failure(self, description: str, *, now: float) -> DiskState:
        """The journal failed at `now` (a write, a sync, or an attempt at a new file), out of
        room or on a failing disk: it is tried again in a new file `journal_retry_interval`
        later, and a file written and synced makes it take records again (issue 17: a
        journal disk that failed once is read-only, not down for good)."""
        return replace(
            self,
            journal_failed=description,
            journal_retry_at=now + self.policy.journal_retry_interval,
        )

    def journal_retry_due(self, now: float) -> bool:
        """Whether to try a new journal file at `now`."""
        return (
            self.journal_failed is not None
            and self.io_error is None
            and now >= self.journal_retry_at
        )

    def with_journal_writing(self) -> DiskState:
        """A new journal file was written: the journal takes records again."""
        return replace(self, journal_failed=None)
