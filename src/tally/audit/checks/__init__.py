"""The cluster audit as one Spark job over a snapshot: every closed ledger, judged once.

Plan: the ledgers, segments, tombstones and availability tables become one stream of rows
keyed by ledger, shuffled by that key and sorted within each partition, so that a ledger's
rows arrive together (its tombstone row if it has one, its ledger row, then its segments in
order, then one availability row per bookie that holds it). One `mapInArrow` pass walks
that stream batch by batch and judges each ledger with `tally.core.ledger_audit`: healthy
ledgers are recognised with array arithmetic over the whole batch, straight from their
encoded availability (`clean_ledgers`); any other ledger is decoded and given to
`audit_ledger`, the check the online auditor runs too, so both paths say the same. Spark
does the shuffle and sort natively, with no join and no aggregation of lists, and Python
takes no step per healthy ledger (what each part costs is in docs/benchmarks.md).

Data that no ledger row and no tombstone claims is orphan data; data of a tombstoned ledger
is on its way out, and deletion_stuck (`deletion_stuck`) once the tombstone is older than the
cluster's deletion_stuck_after (snapshot.json records it); a DELETED ledger keeps its data on
purpose and is judged on nothing. Registered bookies that did not answer come from the small
bookies table, which travels to every task as a dict. A bookie that did not
answer is not judged anywhere: its (possibly partial) dump is ignored.

Extra copies (over_replicated rows) leave the pass with the violations and are written
apart, to over_replicated/, with their entries and estimated bytes; the summary counts them
apart too (`over_replication`), since they never lower durability.

The modules: session.py (the Spark session), job.py (`run_audit` and the combined stream),
auditor.py (the pass: `LedgerAuditor` and the `BookiesView` it carries), ledger_rows.py (a
ledger's rows made into what `audit_ledger` takes, and the findings of rows it cannot
judge) and results.py (the findings written apart and counted).
"""

from __future__ import annotations

from tally.audit.checks.auditor import BookiesView
from tally.audit.checks.job import combined_stream, run_audit
from tally.audit.checks.session import spark_session

__all__ = ["BookiesView", "combined_stream", "run_audit", "spark_session"]
