"""truth.json: every finding the checks must report on a synthetic snapshot, the ledgers they
must not report, and the terms it holds under, which generator and checks both take from
here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tally.audit import schema
from tally.audit.snapshot import write_json
from tally.core.deletion import ClusterSettings
from tally.core.ledger_audit import VIOLATION_CATEGORIES, Category

NOW_MS = 1_700_000_000_000
"""The snapshot's time (2023-11-14): fixed, so that a seed gives the same bytes every time."""
GRACE_PERIOD_MS = 3_600_000
MIN_RACKS = 2
MAX_AGE_MS = 30 * 86_400_000
"""Ledgers were created at most this long before NOW_MS."""

SETTINGS = ClusterSettings()
"""The synthetic cluster's settings, recorded in snapshot.json: the defaults."""

WITHIN_GRACE = "underreplicated_within_grace"
"""A fault key: ledgers marked under-replicated within the grace period, with copies really
missing, which the checks must NOT report (truth.json lists them apart)."""
DELETED_LEDGER = "deleted_ledger"
"""A fault key: DELETED ledgers, whose bookies keep their data (it may be undeleted), which
the checks must NOT report, as orphan data or otherwise (truth.json lists them apart)."""
TOMBSTONE_PENDING = "tombstone_pending"
"""A fault key: tombstoned ledgers that are not stuck (a tombstone younger than
deletion_stuck_after with bookies still holding data, or an older one whose bookies all
dropped it), which the checks must NOT report (truth.json lists them apart)."""
UNREPORTED = (WITHIN_GRACE, DELETED_LEDGER, TOMBSTONE_PENDING)


def ledger_key(scope: int, ledger_id: int) -> str:
    """truth.json's name of a ledger, from its stored int64 halves: unsigned "scope:id"."""
    return f"{schema.from_int64(scope)}:{schema.from_int64(ledger_id)}"


def write_truth(
    out: Path, truth: dict[str, list[str]], unreported: dict[str, list[str]], params: dict[str, Any]
) -> None:
    """Write truth.json: the ledgers (or bookies) of each category, and apart from them those
    of each UNREPORTED key, sorted so that a seed gives the same bytes, and the terms the
    checks must be run with."""
    write_json(
        out / schema.TRUTH_JSON,
        {
            "categories": {
                category.value: sorted(truth[category.value]) for category in VIOLATION_CATEGORIES
            },
            Category.OVER_REPLICATED.value: sorted(truth[Category.OVER_REPLICATED.value]),
            **{key: sorted(unreported[key]) for key in UNREPORTED},
            "params": params,
            "now_ms": NOW_MS,
            "grace_period_ms": GRACE_PERIOD_MS,
            "deletion_stuck_after": SETTINGS.deletion_stuck_after,
        },
    )
