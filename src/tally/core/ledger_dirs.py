"""A bookie's ledger directories: where a new ledger goes, and when a directory has failed.

A bookie with several ledger directories places each ledger on one of them when its first
write arrives, and the ledger stays there: the placement is recorded, so adding a directory
or restarting never moves a ledger nor makes its entries unreadable (seed 003, storage
expansion). `choose_directory` is that first choice: a healthy directory, not full if one
is, with the most free space per ledger already placed on it. Per ledger, so that ledgers
created at once spread over the directories, and a new, empty directory takes new ledgers
until it holds its share; per free byte, so that a larger disk takes more.

A directory fails when its disk or file system does (`DirectoryHealth`): an I/O error that
says so (EIO, EROFS, ...), or a probe of the directory (a small file written, synced and
read back, and the directory still on the device it was on at start-up) that fails or
never finishes. A full disk (ENOSPC) is no failure: it is the disk usage check's business.
An error that says neither (a missing file, an error of the index engine without an errno,
a corrupt record) asks for a probe, which decides. A failed directory stays failed: its
ledgers have gone back to being repaired from their other copies, and an operator brings
the directory back (a replaced disk) with `tally shell cookie update`.
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Sequence
from dataclasses import dataclass, replace

FAILURE_ERRNOS = frozenset(
    {
        errno.EIO,
        errno.EROFS,
        errno.ENODEV,
        errno.ENXIO,
        errno.ESTALE,
        errno.EUCLEAN,  # ext4's "file system corrupted"
        errno.EBADMSG,  # ext4's "metadata checksum failed"
    }
)
"""Errors that say the disk or its file system is gone, read-only or broken."""
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class DiskError(enum.Enum):
    """What an I/O error in a ledger directory says about the directory."""

    FAILED = "failed"
    """Its disk or file system failed."""
    FULL = "full"
    """Its disk is full: no failure."""
    UNCLEAR = "unclear"
    """Neither: probe the directory to know."""


def classify_error(error_number: int | None) -> DiskError:
    """An I/O error by its errno (None: an error that carries none)."""
    if error_number in FAILURE_ERRNOS:
        return DiskError.FAILED
    if error_number in FULL_ERRNOS:
        return DiskError.FULL
    return DiskError.UNCLEAR


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """What one probe of a directory saw."""

    device_at_start: int
    device_now: int | None
    """The directory's device now; None if it could not be looked at."""
    error_number: int | None = None
    """The errno of the step that failed, if one did."""
    error: str = ""
    """What failed ("" if nothing did)."""
    finished: bool = True
    """False when the probe did not finish within its time: the disk hangs."""


class DirectoryState(enum.Enum):
    HEALTHY = "healthy"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class DirectoryHealth:
    """One ledger directory's state: a small state machine fed with errors and probes.

    FAILED is final for the life of the bookie process (and recorded, so that a restart
    keeps it): nothing here makes a failed directory healthy again.
    """

    state: DirectoryState = DirectoryState.HEALTHY
    reason: str = ""
    since: float | None = None
    """When it failed (seconds, the caller's clock)."""

    @property
    def failed(self) -> bool:
        return self.state is DirectoryState.FAILED

    def fail(self, reason: str, now: float) -> DirectoryHealth:
        """Failed for `reason`; a failed directory keeps its first reason."""
        if self.failed:
            return self
        return replace(self, state=DirectoryState.FAILED, reason=reason, since=now)

    def on_error(
        self, error_number: int | None, description: str, now: float
    ) -> tuple[DirectoryHealth, bool]:
        """After an I/O error in the directory: the new health, and whether to probe it."""
        kind = classify_error(error_number)
        if kind is DiskError.FAILED:
            return self.fail(description, now), False
        return self, kind is DiskError.UNCLEAR and not self.failed

    def on_probe(self, probe: ProbeResult, now: float) -> DirectoryHealth:
        """After a probe: failed if the probe did not finish, found the directory on another
        device (its file system unmounted or replaced), or failed for any reason but a full
        disk; otherwise as it was."""
        if not probe.finished:
            return self.fail(f"a probe of the directory did not finish ({probe.error})", now)
        if probe.device_now is not None and probe.device_now != probe.device_at_start:
            return self.fail(
                f"its file system is gone (unmounted or replaced): the directory is on device "
                f"{probe.device_now:#x}, not {probe.device_at_start:#x} as at start-up",
                now,
            )
        if probe.error and classify_error(probe.error_number) is not DiskError.FULL:
            return self.fail(f"a probe of the directory failed: {probe.error}", now)
        return self


@dataclass(frozen=True, slots=True)
class DirectoryView:
    """What the choice of a directory knows of one."""

    failed: bool
    full: bool
    """At or above the disk usage threshold."""
    free_bytes: int
    ledgers: int
    """Ledgers placed on it."""


def choose_directory(directories: Sequence[DirectoryView]) -> int | None:
    """The directory (its index) for a ledger being placed: among the healthy ones, those
    not full if any, the one with the most free bytes per ledger placed (plus one); the
    first on a tie. None when every directory failed."""
    healthy = [i for i, found in enumerate(directories) if not found.failed]
    roomy = [i for i in healthy if not directories[i].full] or healthy
    if not roomy:
        return None
    return max(
        roomy,
        key=lambda i: (directories[i].free_bytes / (directories[i].ledgers + 1), -i),
    )
