"""The replicas check's Prometheus metrics, named after BookKeeper's auditor stats.

The per-category figures are gauges set once at the end of each full run, so a scrape in
the middle of a run still shows the last complete run's findings rather than a partial
count (never reset per batch).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import Counter, Gauge, Histogram

from tally.core.ledger_audit import Category, OverReplication

NUM_LEDGERS_HAVING_NO_REPLICA_OF_AN_ENTRY = Gauge(
    "auditor_num_ledgers_having_no_replica_of_an_entry",
    "Ledgers with an entry that no bookie of its write set holds, at the last replicas check",
)
NUM_LEDGERS_HAVING_LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY = Gauge(
    "auditor_num_ledgers_having_less_than_aq_replicas_of_an_entry",
    "Ledgers whose worst entry has some copies but fewer than AQ, at the last replicas check",
)
NUM_LEDGERS_HAVING_LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY = Gauge(
    "auditor_num_ledgers_having_less_than_wq_replicas_of_an_entry",
    "Ledgers whose worst entry has AQ or more copies but fewer than WQ, at the last replicas check",
)
NUM_LEDGERS_UNDERREPLICATED_TOO_LONG = Gauge(
    "auditor_num_ledgers_underreplicated_too_long",
    "Ledgers marked under-replicated for longer than "
    "underreplicated_ledger_recovery_grace_period, at the last replicas check",
)
NUM_UNRESPONSIVE_REGISTERED_BOOKIES = Gauge(
    "auditor_num_unresponsive_registered_bookies",
    "Registered bookies that did not answer the replicas check, even after its retry",
)
NUM_LEDGERS_POTENTIALLY_FAULTY = Gauge(
    "auditor_num_ledgers_potentially_faulty",
    "Ledgers not fully judged by the last replicas check: a registered bookie of theirs did "
    "not answer",
)
NUM_LEDGERS_OVER_REPLICATED = Gauge(
    "auditor_num_ledgers_over_replicated",
    "Ledgers with extra copies (entries on a bookie whose write sets do not include them), at "
    "the last replicas check: over-replication, not a violation",
)
OVER_REPLICATED_ENTRIES = Gauge(
    "auditor_over_replicated_entries",
    "Extra copies of entries found by the last replicas check",
)
OVER_REPLICATED_BYTES = Gauge(
    "auditor_over_replicated_bytes",
    "Payload bytes of the extra copies found by the last replicas check, estimated at each "
    "ledger's mean entry size",
)
REPLICAS_CHECK_TIME = Histogram(
    "auditor_replicas_check_time_seconds",
    "Duration of each full replicas check",
    buckets=(1.0, 10.0, 60.0, 300.0, 900.0, 3_600.0, 4 * 3_600.0, 12 * 3_600.0, 86_400.0),
)
REPLICAS_CHECK_LEDGERS = Counter(
    "auditor_replicas_check_ledgers",
    "Ledgers whose copies the replicas check compared with their schedule",
)

_GAUGES = {
    Category.NO_REPLICA: NUM_LEDGERS_HAVING_NO_REPLICA_OF_AN_ENTRY,
    Category.BELOW_ACK_QUORUM: NUM_LEDGERS_HAVING_LESS_THAN_AQ_REPLICAS_OF_AN_ENTRY,
    Category.BELOW_WRITE_QUORUM: NUM_LEDGERS_HAVING_LESS_THAN_WQ_REPLICAS_OF_AN_ENTRY,
    Category.UNDERREPLICATED_TOO_LONG: NUM_LEDGERS_UNDERREPLICATED_TOO_LONG,
    Category.UNRESPONSIVE_REGISTERED_BOOKIE: NUM_UNRESPONSIVE_REGISTERED_BOOKIES,
    Category.POTENTIALLY_FAULTY: NUM_LEDGERS_POTENTIALLY_FAULTY,
}


def record_run(
    counts: Mapping[str, int], over_replication: OverReplication, duration_s: float
) -> None:
    """Publish one full run: every category's gauge, the over-replication, and the run's
    duration."""
    for category, gauge in _GAUGES.items():
        gauge.set(counts[category.value])
    NUM_LEDGERS_OVER_REPLICATED.set(over_replication.ledgers)
    OVER_REPLICATED_ENTRIES.set(over_replication.entries)
    OVER_REPLICATED_BYTES.set(over_replication.bytes)
    REPLICAS_CHECK_TIME.observe(duration_s)
