"""When a bookie scrubs the entries it stores, and how fast: the decisions of its scrubber
(tally.bookie.scrubber_service), with time as an input.

A pass reads every entry the bookie's index holds and checks it (bookie/scrubber.py). The
passes follow each other `interval` apart (BookKeeper's localScrubPeriod; a week by
default): the next pass is due `interval` after the last complete one ended, a bookie that
never completed one starts at once, and a pass under way (the bookie restarted in the
middle of it) goes on at once from where it was. A zero interval scrubs only on request: a
scheduled pass under way waits until one is asked for (and then goes on at full speed).

A pass reads at a bounded rate so that the bookie's own reads and writes keep the disk:
`rate_bytes` if it is set (localScrubRateLimit), else the ledger disk's size over the
interval, so that one pass over a full disk takes about one interval, and never less than
`MIN_RATE`. An operator's pass (`tally shell scrub --now`) runs at full speed. The work is
done in steps of `step_bytes`: about one second's worth at the rate, so that a step never
holds the disk for long, and the pauses between steps give the rate.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from tally.core.errors import BadRequest

MIN_RATE = 64 << 10
"""Bytes per second a scheduled pass reads at least (a disk smaller than 37 GiB is scrubbed
faster than one pass per interval)."""
STEP_SECONDS = 1.0
"""The time a step at the bounded rate stands for."""
MIN_STEP_BYTES = 64 << 10
MAX_STEP_BYTES = 16 << 20
"""A step's bytes at full speed, and at most at any rate: the index walk and the reads of
one step are sorted by file and offset together, so larger steps read more sequentially."""


class ScrubTrigger(enum.Enum):
    SCHEDULE = "schedule"
    OPERATOR = "operator"
    """Asked for (`tally shell scrub --now`): at full speed."""


@dataclass(frozen=True, slots=True)
class ScrubPass:
    """One pass over the index's entries: under way (`ended` None) or complete."""

    started: float
    """Wall-clock seconds."""
    trigger: ScrubTrigger
    ended: float | None = None
    bytes: int = 0
    """Bytes read from the entry logs and journal files."""
    entries: int = 0
    """Entries checked."""
    corrupt: int = 0
    """Entries whose stored bytes failed their check (marked corrupt)."""
    unreadable: int = 0
    """Entries that could not be read (an I/O error, a missing file): not marked, since
    nothing says that their bytes are bad."""

    @property
    def complete(self) -> bool:
        return self.ended is not None

    def plus(self, *, bytes_read: int, entries: int, corrupt: int, unreadable: int) -> ScrubPass:
        """The pass after one more step."""
        return replace(
            self,
            bytes=self.bytes + bytes_read,
            entries=self.entries + entries,
            corrupt=self.corrupt + corrupt,
            unreadable=self.unreadable + unreadable,
        )

    def finished(self, now: float) -> ScrubPass:
        return replace(self, ended=now)

    def at_full_speed(self) -> ScrubPass:
        """The pass, an operator having asked for one now."""
        return replace(self, trigger=ScrubTrigger.OPERATOR)


@dataclass(frozen=True, slots=True)
class ScrubPolicy:
    """A bookie's settings for scrubbing (BookieConfig has them by name)."""

    interval: float = 604800.0
    """Seconds from the end of one pass to the start of the next; 0: only on request."""
    rate_bytes: int = 0
    """Bytes per second a scheduled pass reads at most; 0: the ledger disk's size over the
    interval."""

    def __post_init__(self) -> None:
        if self.interval < 0 or self.rate_bytes < 0:
            raise BadRequest(
                f"scrub interval and rate must not be negative, got {self.interval} s and "
                f"{self.rate_bytes} bytes/s"
            )


def scrub_rate(policy: ScrubPolicy, disk_bytes: int) -> float:
    """Bytes per second of a scheduled pass over a ledger disk of `disk_bytes`."""
    if policy.rate_bytes > 0:
        return float(policy.rate_bytes)
    if policy.interval <= 0:
        return float(MIN_RATE)
    return max(float(MIN_RATE), disk_bytes / policy.interval)


def step_bytes(rate: float | None) -> int:
    """Bytes one step reads at most, at `rate` bytes per second (None: full speed)."""
    if rate is None:
        return MAX_STEP_BYTES
    return int(min(MAX_STEP_BYTES, max(MIN_STEP_BYTES, rate * STEP_SECONDS)))


def next_pass_at(last: ScrubPass | None, policy: ScrubPolicy) -> float | None:
    """When the next scheduled pass is due (wall clock): None if never (no interval),
    -inf if at once (no pass was ever completed)."""
    if policy.interval <= 0:
        return None
    if last is None or last.ended is None:
        return float("-inf")
    return last.ended + policy.interval


class ScrubAction(enum.Enum):
    STEP = "step"
    """Start a pass, or go on with the one under way, one step."""
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class ScrubPlan:
    action: ScrubAction
    wait: float | None = None
    """With WAIT: seconds until the next pass is due; None: until asked."""
    full_speed: bool = False
    """With STEP: no bound on the rate (an operator's pass)."""


def plan_scrub(
    last: ScrubPass | None,
    current: ScrubPass | None,
    policy: ScrubPolicy,
    now: float,
    *,
    requested: bool = False,
) -> ScrubPlan:
    """What the scrubber does next, given the last complete pass, the one under way (if
    any) and whether an operator asked for a pass now."""
    if requested or (current is not None and current.trigger is ScrubTrigger.OPERATOR):
        return ScrubPlan(ScrubAction.STEP, full_speed=True)
    due = next_pass_at(last, policy)
    if due is None:
        return ScrubPlan(ScrubAction.WAIT)  # a scheduled pass under way waits, unasked
    if current is not None:
        return ScrubPlan(ScrubAction.STEP)
    if now >= due:
        return ScrubPlan(ScrubAction.STEP)
    # At most an interval: a wall clock set back must not put the next pass off further.
    return ScrubPlan(ScrubAction.WAIT, wait=min(due - now, policy.interval))
