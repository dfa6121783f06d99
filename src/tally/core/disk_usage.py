"""When a bookie turns read-only and back: disk usage with hysteresis, and I/O errors.

A bookie whose disk crosses the usage threshold (BookKeeper's diskUsageThreshold, 0.95)
stops taking writes but keeps serving reads; it turns writable again only below the
low-water mark (diskUsageLwmThreshold, 0.90), so it does not flap around one value. An
I/O error on the write path makes it read-only until an operator restarts it: a disk that
failed once is not trusted with new data on its own word.
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


@dataclass(frozen=True, slots=True)
class DiskPolicy:
    usage_threshold: float = DEFAULT_USAGE_THRESHOLD
    low_water_mark: float = DEFAULT_LOW_WATER_MARK

    def __post_init__(self) -> None:
        if not 0 < self.low_water_mark <= self.usage_threshold <= 1:
            raise BadRequest(
                "need 0 < low-water mark <= usage threshold <= 1, got "
                f"{self.low_water_mark} and {self.usage_threshold}"
            )


@dataclass(frozen=True, slots=True)
class DiskState:
    """The bookie's mode and why; change it only through the methods below."""

    policy: DiskPolicy = DiskPolicy()
    disk_full: bool = False
    io_error: str | None = None

    @property
    def mode(self) -> BookieMode:
        if self.disk_full or self.io_error is not None:
            return BookieMode.READ_ONLY
        return BookieMode.WRITABLE

    @property
    def reason(self) -> str:
        if self.io_error is not None:
            return f"I/O error: {self.io_error}"
        if self.disk_full:
            return f"disk usage at or above {self.policy.usage_threshold:.0%}"
        return "writable"

    def with_usage(self, fraction_used: float) -> DiskState:
        """Feed a fresh reading of the fullest data disk (0.0 .. 1.0)."""
        if self.disk_full:
            return replace(self, disk_full=fraction_used >= self.policy.low_water_mark)
        return replace(self, disk_full=fraction_used >= self.policy.usage_threshold)

    def with_io_error(self, description: str) -> DiskState:
        return replace(self, io_error=self.io_error or description)
