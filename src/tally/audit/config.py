"""The audit's settings: where Spark runs, and the rules the checks judge by.

Loaded by `tally.config.load` (section `[audit]`, variables `TALLY_AUDIT_<SETTING>`) for
`tally audit snapshot | run | confirm`; durations are in seconds. Confirm's reads of the
live cluster take the client's settings (`[client]`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tally.config import check
from tally.core.placement import DEFAULT_MIN_NUM_RACKS_PER_WRITE_QUORUM

DEFAULT_GRACE_PERIOD = 3600.0


@dataclass(frozen=True)
class AuditConfig:
    metadata: str = ""
    """Metadata store URI of the cluster to snapshot or confirm against."""
    spark_master: str = "local[*]"
    """The Spark master the checks run on."""
    spark_memory: str = "4g"
    """Memory of the driver (and of a local master's executors)."""
    grace_period: float = DEFAULT_GRACE_PERIOD
    """Seconds a ledger may stay marked under-replicated before it is reported as marked
    too long; 0 never reports it (as the auditor's grace period of 0)."""
    min_num_racks_per_write_quorum: int = DEFAULT_MIN_NUM_RACKS_PER_WRITE_QUORUM
    """Racks every write set must span, capped by WQ and by the racks the cluster has."""
    snapshot_session_timeout: float = 30.0
    """Seconds of the snapshot's metadata session (a long walk of the ledgers)."""
    snapshot_bookie_timeout: float = 30.0
    """Seconds the snapshot waits for each frame of a bookie's availability dump."""

    def __post_init__(self) -> None:
        check(self.grace_period >= 0, "grace_period", "must not be negative (0: never)")
        check(
            self.min_num_racks_per_write_quorum >= 1,
            "min_num_racks_per_write_quorum",
            "must be at least 1",
        )
        for name in ("snapshot_session_timeout", "snapshot_bookie_timeout"):
            check(getattr(self, name) > 0, name, "must be more than 0 seconds")
        check(bool(self.spark_master), "spark_master", "must name a Spark master")
