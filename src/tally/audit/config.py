"""The audit's settings: where Spark runs, and the rules the checks judge by.

Loaded by `tally.config.load` (section `[audit]`, variables `TALLY_AUDIT_<SETTING>`) for
`tally audit snapshot | run | confirm`; durations are in seconds. Confirm's reads of the
live cluster take the client's settings (`[client]`).
"""

from __future__ import annotations

from collections.abc import Iterable
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
    spark_conf: tuple[str, ...] = ()
    """Any Spark settings, as KEY=VALUE (`--conf`), applied after tally's own: executor
    memory and cores, `spark.pyspark.python` for the executors' interpreter, ..."""
    spark_snapshot_from: int = 500_000
    """Ledger ids handed out from which `tally audit snapshot` without --master runs as a
    Spark job on spark_master (below, in one process; docs/benchmarks.md has why)."""
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
        check(self.spark_snapshot_from >= 0, "spark_snapshot_from", "must not be negative")
        for name in ("snapshot_session_timeout", "snapshot_bookie_timeout"):
            check(getattr(self, name) > 0, name, "must be more than 0 seconds")
        check(bool(self.spark_master), "spark_master", "must name a Spark master")
        parse_spark_conf(self.spark_conf)

    @property
    def spark_settings(self) -> dict[str, str]:
        """`spark_conf` as a mapping."""
        return parse_spark_conf(self.spark_conf)


def parse_spark_conf(items: Iterable[str]) -> dict[str, str]:
    """`KEY=VALUE` items (as `--conf` takes them) as settings; BadSetting on any other."""
    settings: dict[str, str] = {}
    for item in items:
        key, equals, value = item.partition("=")
        check(
            bool(equals and key.strip()),
            "spark_conf",
            f"{item!r} is not KEY=VALUE (e.g. spark.executor.memory=2g)",
        )
        settings[key.strip()] = value.strip()
    return settings
