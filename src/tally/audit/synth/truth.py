"""truth.json: every finding the checks must report on a synthetic snapshot, and the terms
it holds under, which generator and checks both take from here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tally.audit import schema
from tally.audit.snapshot import write_json
from tally.core.ledger_audit import VIOLATION_CATEGORIES, Category

NOW_MS = 1_700_000_000_000
"""The snapshot's time (2023-11-14): fixed, so that a seed gives the same bytes every time."""
GRACE_PERIOD_MS = 3_600_000
MIN_RACKS = 2
MAX_AGE_MS = 30 * 86_400_000
"""Ledgers were created at most this long before NOW_MS."""

WITHIN_GRACE = "underreplicated_within_grace"
"""A fault key: ledgers marked under-replicated within the grace period, with copies really
missing, which the checks must NOT report (truth.json lists them apart)."""


def ledger_key(scope: int, ledger_id: int) -> str:
    """truth.json's name of a ledger, from its stored int64 halves: unsigned "scope:id"."""
    return f"{schema.from_int64(scope)}:{schema.from_int64(ledger_id)}"


def write_truth(
    out: Path, truth: dict[str, list[str]], within_grace: list[str], params: dict[str, Any]
) -> None:
    """Write truth.json: the ledgers (or bookies) of each category, sorted so that a seed
    gives the same bytes, and the terms the checks must be run with."""
    write_json(
        out / schema.TRUTH_JSON,
        {
            "categories": {
                category.value: sorted(truth[category.value]) for category in VIOLATION_CATEGORIES
            },
            Category.OVER_REPLICATED.value: sorted(truth[Category.OVER_REPLICATED.value]),
            WITHIN_GRACE: sorted(within_grace),
            "params": params,
            "now_ms": NOW_MS,
            "grace_period_ms": GRACE_PERIOD_MS,
        },
    )
