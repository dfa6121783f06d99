"""The settings of `tally local`: where the cluster lives, its shape, and its supervisor's
patience.

Loaded by `tally.config.load` (section `[local]`, variables `TALLY_LOCAL_<SETTING>`);
durations are in seconds. The cluster's own processes take their settings as any bookie
or auto-recovery process does (TALLY_BOOKIE_*, TALLY_AUTORECOVERY_*, TALLY_CLIENT_*
variables, which they inherit).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tally.config import check

DEFAULT_BOOKIES = 3
DEFAULT_RACKS = 3
"""One bookie per rack: a ledger of the client's default shape (E=3 WQ=2) keeps every write
set on two racks, as the placement rule asks and the audit checks; on two racks it cannot."""


@dataclass(frozen=True)
class LocalConfig:
    data_dir: Path = Path(".tally")
    """Holds the metadata store, the bookies' data and logs, and local.json."""
    bookies: int | None = None
    """Bookies to run; fixed at the first `up` (None: DEFAULT_BOOKIES there, and whatever
    the cluster has afterwards)."""
    racks: int | None = None
    """Racks to spread them over, round-robin; fixed at the first `up` (None:
    DEFAULT_RACKS there)."""
    ready_timeout: float = 60.0
    """Seconds a process has to say it serves. A bookie restarted after a crash may first
    wait up to twice its session timeout for its old registration to lapse."""
    stop_timeout: float = 30.0
    """Seconds a process has to stop cleanly after SIGTERM before it gets SIGKILL."""
    restarts: int = 3
    """Automatic restarts of a process (after it lost its metadata session) within
    `restart_window`; past them it stays down."""
    restart_window: float = 600.0

    def __post_init__(self) -> None:
        for name in ("bookies", "racks"):
            value = getattr(self, name)
            check(value is None or value >= 1, name, "must be at least 1")
        for name in ("ready_timeout", "stop_timeout", "restart_window"):
            check(getattr(self, name) > 0, name, "must be more than 0 seconds")
        check(self.restarts >= 0, "restarts", "must not be negative")
