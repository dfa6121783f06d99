"""`tally audit synth`: realistic synthetic snapshots with known faults, for the audit's tests
and benchmarks.

A snapshot has the schema of `tally.audit.schema`, and `truth.json` lists every finding the
checks must report, no more, no less, for `min_racks` = MIN_RACKS, a grace period of
GRACE_PERIOD_MS, "now" = NOW_MS (snapshot.json's created_ms; checks take it as now) and the
default cluster settings (snapshot.json's cluster_settings): the violations by category,
and apart from them the over-replicated ledgers and the ledgers that must not be reported
(marked within the grace period, DELETED, tombstoned but not stuck).

The healthy majority is generated with numpy, a chunk of ledgers at a time, without a Python
step per ledger: heavy-tailed sizes (most ledgers small, some of 10^7 entries), quorum mixes
(3/3/2, 3/2/2, 5/3/2, as the racks allow), about three segments per ledger whose ensemble
changes replace one or two bookies, a few open ledgers and empty closed ones, and rack-aware
ensembles whose every write set spans min(WQ, racks) racks (patterns of racks found once per
mix and judged by `adherence_of_racks`, so generator and checks cannot disagree). A bookie
keeps its ensemble position while it stays in a ledger, so what it holds is one closed-form
`expected_entries` range: its encoding is computed directly from the arithmetic, and equals
`EntryAvailability.to_bytes` of the same range byte for byte.

Faults are built one ledger at a time with the core's own types (`LedgerMetadata`,
`EntryAvailability`) and each one is verified with `audit_ledger` before it is written: it
must fall in exactly its category (an invalid_metadata ledger is a healthy one, whose first
segment's row then starts at entry 1; a deleted one is a healthy one deleted, with a
tombstone checked by `deletion_stuck`). Fault ledgers never touch an unresponsive bookie;
every other closed ledger that does is listed as potentially_faulty.

The modules: truth.py (truth.json and the terms it holds under: now, grace period, min
racks), cluster.py (bookies, racks and the mixes that place strictly), encodings.py (the
availability encoding in closed form), healthy.py (the healthy majority, a chunk at a time),
faults.py (the fault kinds and the ledgers that carry them) and write.py (`synthesize`: the
Parquet datasets, truth.json and snapshot.json).
"""

from __future__ import annotations

from tally.audit.synth.encodings import expected_encodings
from tally.audit.synth.faults import DEFAULT_FAULTS, FAULT_KINDS, parse_faults
from tally.audit.synth.truth import (
    DELETED_LEDGER,
    GRACE_PERIOD_MS,
    MIN_RACKS,
    NOW_MS,
    TOMBSTONE_PENDING,
    UNREPORTED,
    WITHIN_GRACE,
    ledger_key,
)
from tally.audit.synth.write import synthesize

__all__ = [
    "DEFAULT_FAULTS",
    "DELETED_LEDGER",
    "FAULT_KINDS",
    "GRACE_PERIOD_MS",
    "MIN_RACKS",
    "NOW_MS",
    "TOMBSTONE_PENDING",
    "UNREPORTED",
    "WITHIN_GRACE",
    "expected_encodings",
    "ledger_key",
    "parse_faults",
    "synthesize",
]
