"""The replication workers' Prometheus metrics, named after BookKeeper's ReplicationWorker
stats in snake_case, in the default registry (one worker per process; several in a test
add up, as several threads of one BookKeeper process would)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_OP_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)

REREPLICATE_OP_SECONDS = Histogram(
    "replication_worker_rereplicate_op_seconds",
    "One ledger's turn under its lock, from taking the lock to giving it back, by outcome "
    "(replicated, remarked, deferred, lost, failed)",
    ["outcome"],
    buckets=_OP_BUCKETS,
)
LEDGERS_REPLICATED = Counter(
    "replication_worker_num_full_or_partial_ledgers_replicated",
    "Ledger turns that copied at least one entry, whether or not the ledger is whole again",
)
ENTRIES_UNABLE_TO_READ = Counter(
    "replication_worker_num_entries_unable_to_read_for_replication",
    "Entries to copy that no bookie of their write set served (unknown failures and losses)",
)
ENTRIES_WRITTEN = Counter(
    "replication_worker_num_entries_written",
    "Entry copies written to a bookie (an entry with two targets counts twice)",
)
BAD_COPIES_REPAIRED = Counter(
    "replication_worker_num_bad_copies_repaired",
    "Bad copies (corrupt or unreadable on their bookie) written over with a verified copy",
)
BYTES_READ = Counter(
    "replication_worker_num_bytes_read", "Entry bytes read from bookies to be copied"
)
BYTES_WRITTEN = Counter(
    "replication_worker_num_bytes_written", "Entry bytes written to bookies by re-replication"
)
BOOKIES_REPLACED = Counter(
    "replication_worker_num_bookies_replaced",
    "Segment positions whose lost bookie was replaced in the ledger metadata",
)
OPEN_LEDGERS_FENCED = Counter(
    "replication_worker_num_open_ledgers_fenced",
    "Open ledgers fenced and closed because their writer kept a lost bookie past the grace period",
)
LOST_ENTRIES = Gauge(
    "replication_worker_lost_entries",
    "Ledgers on the lost-entries list: entries no bookie holds a readable copy of",
)
