"""The auto-recovery process's settings, with BookKeeper's names, meanings and defaults where
it has the setting, and a documented departure where its default is unsafe or off.

Loaded by `tally.config.load` (section `[autorecovery]`, variables
`TALLY_AUTORECOVERY_<SETTING>`); durations are in seconds. The process's replication
worker and placement check use the client's settings (`[client]`, tally.client.config),
placement included, so that the worker places new bookies by the rule clients write by.
"""

from __future__ import annotations

from dataclasses import dataclass

from tally.config import check
from tally.metadata.store import DEFAULT_SESSION_TIMEOUT

REPLICAS_CHECK_MODES = ("online", "spark")


@dataclass(frozen=True)
class AutoRecoveryConfig:
    metadata: str = ""
    """Metadata store URI (`sqlite:///path`, `zk://host:port/root`)."""
    http_host: str = "127.0.0.1"
    http_port: int | None = None
    """Serve the admin HTTP app (/metrics, /heartbeat, /api/v1/...) here (0: any free port)."""
    session_timeout: float = DEFAULT_SESSION_TIMEOUT
    """Metadata store session timeout, seconds: how fast another auditor takes over."""
    # -- the auditor ---------------------------------------------------------------------
    lost_bookie_recovery_delay: int = 0
    """Seconds to wait before marking a lost bookie's ledgers, unless an operator set the
    cluster-wide value in the metadata store (which wins, as in BookKeeper)."""
    auditor_periodic_bookie_check_interval: float = 86_400.0
    """Seconds between bookie checks (all metadata's bookies against the registered ones)."""
    auditor_periodic_check_interval: float = 604_800.0
    """Seconds between ledger checks (reading segments' entries from their bookies)."""
    auditor_ledger_verification_percentage: int = 0
    """Percentage of each segment's entries the ledger check reads; 0: first and last only."""
    auditor_periodic_placement_policy_check_interval: float = 86_400.0
    """Seconds between placement checks (BookKeeper: 0, off); 0 turns the check off."""
    repaired_placement_policy_not_adhering_bookie_enable: bool = False
    """Mark ledgers that fail the placement policy for repair (BookKeeper's name)."""
    auditor_replicas_check_interval: float = 86_400.0
    """Seconds between replicas checks (BookKeeper: 0, off, as its check costs one request
    per entry range; the availability encoding makes it cheap here); 0 turns it off."""
    auditor_deletion_check_interval: float = 300.0
    """Seconds between deletion checks: DELETED ledgers past ledger_delete_retention get
    their tombstone, tombstones past tombstone_retention go, stuck ones are counted; 0
    turns it off (then nothing deleted is ever tombstoned, unless the retention is 0)."""
    auditor_replicas_check_mode: str = "online"
    """`online`: the auditor asks bookies itself; `spark`: it runs the audit pipeline
    (snapshot, checks on Spark, confirm) and marks what it confirms."""
    auditor_spark_master: str = "local[2]"
    """The Spark master of the pipeline in `spark` mode."""
    auditor_audit_dir: str = ""
    """Where `spark` mode keeps its last audits (snapshot, report.html); "" for a
    directory of its own under the system's temporary directory."""
    auditor_replicas_check_retry_delay: float = 60.0
    """Seconds before a ledger whose bookies did not answer is checked again."""
    underreplicated_ledger_recovery_grace_period: float = 3_600.0
    """Seconds a ledger may stay marked before the replicas check reports it as marked too
    long, online or in spark mode (BookKeeper: 0, which never reports it); 0 turns the report
    off in both."""
    auditor_max_concurrent_metadata_reads: int = 100
    """Ledger metadata reads in flight during a check (auditorMaxNumberOfConcurrentOpen-
    LedgerOperations), so a check of a big cluster never floods the store."""
    auditor_max_concurrent_bookie_requests: int = 32
    """Requests to bookies in flight during a check, over all bookies."""

    # -- the replication worker ----------------------------------------------------------
    open_ledger_rereplication_grace_period: float = 30.0
    """Seconds the writer of an OPEN ledger has to change its ensemble before the worker
    fences and closes the ledger to repair its last segment."""
    replication_rate_by_bytes: int = 10_000_000
    """Bytes/s the worker copies at most; -1: unlimited (replicationRateByBytes, whose
    default is -1). 10 MB/s keeps a writer's small adds during a repair at about 0.8 or more
    of their rate without it on a 2-core machine; 20 MB/s took them to 0.4-0.85 (median 0.63;
    bench_rereplication.py, docs/benchmarks.md, issue 21). A lost bookie holding 1 GiB then
    takes about 110 s to repair, per worker: raise it where the bookies have CPU to spare."""
    rereplication_entry_batch_size: int = 64
    """Entries of one ledger read from a source in one request (READ_ENTRIES, up to about
    1 MiB of them) and written to each target together; two such batches of a ledger are
    in flight.
    BookKeeper's rereplicationEntryBatchSize (10) counts entries copied in parallel, one
    read each."""
    rereplication_ledgers_in_parallel: int = 4
    """Ledgers one worker repairs at once, each under its own lock (BookKeeper's worker
    takes one at a time; a cluster runs one worker per bookie). One at a time left the
    bookies idle while a ledger was planned and committed and between its batches: a lost
    bookie's 256 MiB were copied at 133-165 MB/s, 190-200 with two ledgers at once and
    207-228 with four or eight (docs/benchmarks.md, issue 21). The rate limit is the
    worker's, whatever the number."""
    replication_backoff_initial: float = 1.0
    """Seconds before a failed ledger is tried again by this worker; doubles per failure."""
    replication_backoff_max: float = 300.0
    """The longest wait between tries (lockReleaseOfFailedLedgerGracePeriod, 5 min)."""
    ledger_passwords: tuple[str, ...] = ()
    """Passwords (UTF-8) of HMAC ledgers, whose copies the worker can only verify with the
    MAC key; other digests need none (the master key is in the metadata)."""
    under_replicated_poll_interval: float = 5.0
    """Seconds between looks for marked ledgers besides the watch (a missed event heals)."""

    def __post_init__(self) -> None:
        check(
            self.auditor_replicas_check_mode in REPLICAS_CHECK_MODES,
            "auditor_replicas_check_mode",
            f"must be one of {', '.join(REPLICAS_CHECK_MODES)}",
        )
        check(
            0 <= self.auditor_ledger_verification_percentage <= 100,
            "auditor_ledger_verification_percentage",
            "must be in 0..100",
        )
        check(
            self.lost_bookie_recovery_delay >= 0,
            "lost_bookie_recovery_delay",
            "must not be negative",
        )
        for name in (
            "auditor_max_concurrent_metadata_reads",
            "auditor_max_concurrent_bookie_requests",
            "rereplication_entry_batch_size",
            "rereplication_ledgers_in_parallel",
        ):
            check(getattr(self, name) >= 1, name, "must be at least 1")
        check(
            self.replication_rate_by_bytes == -1 or self.replication_rate_by_bytes > 0,
            "replication_rate_by_bytes",
            "must be -1 (unlimited) or more than 0",
        )
        for name in (
            "session_timeout",
            "replication_backoff_initial",
            "under_replicated_poll_interval",
            "auditor_replicas_check_retry_delay",
        ):
            check(getattr(self, name) > 0, name, "must be more than 0 seconds")
        check(
            self.replication_backoff_max >= self.replication_backoff_initial,
            "replication_backoff_max",
            "must be at least replication_backoff_initial",
        )
        for name in (
            "auditor_periodic_bookie_check_interval",
            "auditor_periodic_check_interval",
            "auditor_periodic_placement_policy_check_interval",
            "auditor_replicas_check_interval",
            "auditor_deletion_check_interval",
            "underreplicated_ledger_recovery_grace_period",
            "open_ledger_rereplication_grace_period",
        ):
            check(getattr(self, name) >= 0, name, "must not be negative")
