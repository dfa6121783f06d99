"""The auditor's Prometheus metrics (default registry), named after BookKeeper's auditor stats.

One auditor runs per process, so these are module-level. The findings of a check are set
once at the end of each full run, never per batch, so a scrape never sees a half count.
The replicas check's own figures (its duration and its counts per category) are its
module's, since the Spark pipeline may run it instead.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_CHECK_BUCKETS = (0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 12 * 3600.0)
"""Seconds: a check of a test cluster takes milliseconds, of a big one hours."""

ELECTED = Gauge("auditor_elected", "1 while this process is the elected auditor, else 0")
LOST_BOOKIES = Gauge(
    "auditor_lost_bookies",
    "Bookies that some ledger or an earlier registration names but that are neither "
    "writable nor read-only (pending their delay, or with their ledgers marked)",
)
UNDER_REPLICATED_LEDGERS_MARKED = Counter(
    "auditor_num_under_replicated_ledgers_marked",
    "Ledgers marked under-replicated, by cause (lost_bookie, incarnation_changed, "
    "bookie_check, check_all_ledgers, placement_policy_check)",
    ["cause"],
)
INCARNATIONS_CHANGED = Counter(
    "auditor_bookie_incarnations_changed",
    "Bookies found formatted anew under an id the auditor knew (a new incarnation in the "
    "cookie): their ledgers were marked under-replicated",
)
BOOKIE_CHECK_TIME = Histogram(
    "auditor_bookie_check_time_seconds",
    "Duration of a bookie check (every ledger's bookies against the registered ones)",
    buckets=_CHECK_BUCKETS,
)
CHECK_ALL_LEDGERS_TIME = Histogram(
    "auditor_check_all_ledgers_time_seconds",
    "Duration of a ledger check (reading segments' entries from their bookies)",
    buckets=_CHECK_BUCKETS,
)
PLACEMENT_POLICY_CHECK_TIME = Histogram(
    "auditor_placement_policy_check_time_seconds",
    "Duration of a placement check (every closed ledger's segments against the policy)",
    buckets=_CHECK_BUCKETS,
)
LEDGERS_NOT_ADHERING = Gauge(
    "auditor_num_ledgers_not_adhering_to_placement_policy",
    "Closed ledgers with a segment that fails the placement policy (last placement check)",
)
LEDGERS_SOFTLY_ADHERING = Gauge(
    "auditor_num_ledgers_softly_adhering_to_placement_policy",
    "Closed ledgers whose worst segment meets the placement policy only softly (last "
    "placement check)",
)
CHECK_FINDINGS = Gauge(
    "auditor_check_findings",
    "Findings of the last full run of each check: lost bookies (bookie_check), ledgers "
    "with unreadable entries (check_all_ledgers), ledgers not strictly adhering "
    "(placement_policy_check), ledgers and bookies reported (replicas_check)",
    ["check"],
)
CHECK_RUNS = Counter(
    "auditor_check_runs",
    "Check runs by check and result (ok, failed, cancelled)",
    ["check", "result"],
)
LAST_CHECK_TIME = Gauge(
    "auditor_check_last_run_timestamp_seconds",
    "When the last full run of each check started (Unix time), as kept in the store",
    ["check"],
)
BOOKIE_REQUEST_FAILURES = Counter(
    "auditor_ledger_check_failed_reads",
    "Entry reads of the ledger check that failed, by error (NoSuchEntry, Timeout, ...)",
    ["error"],
)
DELETED_LEDGERS = Gauge(
    "auditor_deleted_ledgers",
    "DELETED ledgers within their ledger_delete_retention (undeletable), at the last "
    "deletion check",
)
TOMBSTONES = Gauge("auditor_tombstones", "Tombstones in the store at the last deletion check")
TOMBSTONES_PENDING = Gauge(
    "auditor_tombstones_pending",
    "Tombstones with a named bookie yet to acknowledge dropping the ledger's data",
)
DELETIONS_STUCK = Gauge(
    "auditor_deletion_stuck",
    "Tombstones older than deletion_stuck_after with bookies still to acknowledge them",
)
TOMBSTONES_WITH_VIOLATIONS = Gauge(
    "auditor_tombstones_with_violations",
    "Tombstones of ledgers whose check at deletion found entries on fewer than WQ bookies",
)
