"""`tally audit confirm`: re-check each reported finding against the live cluster.

A snapshot is taken over minutes while writers, the auditor and replication workers go on,
so some findings are skew: a ledger deleted or repaired since, a bookie back up. BP-34 asks
to re-read before reporting; this pass does it for the findings only, never for the whole
cluster: for each reported ledger, fresh metadata, its under-replication mark and what each
of its bookies holds now (GetListOfEntriesOfLedger), judged again by the very same
`audit_ledger` the checks ran. A finding is kept only if it still holds.

What "still holds" means per finding:
- a ledger finding: the fresh verdict has the same category for the ledger. A ledger that
  was potentially faulty is judged anew as a whole (its bookies may answer now: this is
  BP-34's delayed re-check), so any category the fresh verdict finds is kept; so is a
  ledger of invalid_metadata, which the snapshot's rows did not let the checks judge;
- orphan_data: the ledger still has neither metadata nor tombstone and a bookie reported
  with its data still holds some; a ledger now gone drops every other finding. A ledger
  deleted since (DELETED metadata, which keeps its data on purpose, or a tombstone, whose
  bookies drop its data at their next garbage collection) is no orphan;
- deletion_stuck: the ledger's tombstone is still there, older than the cluster's
  deletion_stuck_after now, and the bookie reported still holds some of its data
  (`deletion_stuck`, as the checks judged it);
- unresponsive_registered_bookie: the bookie is still registered and still does not answer.
A ledger whose metadata or tombstone no longer decodes cannot be judged: its findings stand
as reported.
Over-replication (over_replicated/) is not confirmed: it is no violation, and nothing acts
on it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tally.audit import schema
from tally.audit.config import DEFAULT_GRACE_PERIOD
from tally.audit.snapshot import DatasetWriter, Progress, write_json
from tally.client.bookie_pool import BookiePool
from tally.client.config import ClientConfig
from tally.core.availability import EntryAvailability
from tally.core.deletion import Tombstone
from tally.core.errors import (
    BookieUnavailable,
    MalformedData,
    NoSuchLedger,
    TallyError,
    Timeout,
)
from tally.core.ids import LedgerId
from tally.core.ledger_audit import (
    VIOLATION_CATEGORIES,
    Category,
    Violation,
    audit_ledger,
    deletion_stuck,
)
from tally.core.ledger_metadata import LedgerState
from tally.core.placement import DEFAULT_MIN_NUM_RACKS_PER_WRITE_QUORUM, racks_in_cluster
from tally.metadata.bookie_registry import BookieRegistry
from tally.metadata.cluster import require_cluster
from tally.metadata.cluster_settings import read_settings
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.stores import open_store
from tally.metadata.tombstones import read_tombstone
from tally.metadata.underreplication import UnderReplicationManager

log = logging.getLogger(__name__)


CONFIRMED = "confirmed"
CONFIRMED_JSON = "confirmed.json"
DEFAULT_GRACE_PERIOD_MS = int(DEFAULT_GRACE_PERIOD * 1000)
"""When neither the caller nor the report's summary.json gives one."""
LEDGER_CONCURRENCY = 16
"""Ledgers re-checked at once; each asks all its bookies in parallel."""
PROBE_LEDGER = LedgerId(0, 0)
"""Asked about to see whether a bookie answers at all: any answer, NoSuchLedger included,
counts as one."""


@dataclass
class _Reported:
    """What the report says about one ledger."""

    categories: set[Category] = field(default_factory=set)
    bookies: set[str] = field(default_factory=set)
    """Bookies named by its rows (those outside its ensembles are asked too)."""
    violations: list[Violation] = field(default_factory=list)
    """Its rows as reported."""

    def holders(self, category: Category) -> set[str]:
        """The bookies its rows of `category` name."""
        return {
            violation.bookie_id
            for violation in self.violations
            if violation.category is category and violation.bookie_id
        }


@dataclass
class _Context:
    ledgers: LedgerManager
    marks: UnderReplicationManager
    registry: BookieRegistry
    pool: BookiePool
    racks: dict[str, str]
    cluster_racks: int
    min_racks: int
    grace_period_ms: int
    stuck_after: int
    """The cluster's deletion_stuck_after now, in seconds."""


async def confirm(
    report: Path,
    metadata_uri: str,
    *,
    progress: Progress | None = None,
    grace_period_ms: int | None = None,
    min_racks: int = DEFAULT_MIN_NUM_RACKS_PER_WRITE_QUORUM,
    client: ClientConfig | None = None,
) -> dict[str, Any]:
    """Re-check `report`/violations/ against the cluster; write `report`/confirmed/ and
    confirmed.json, and return the latter's content.

    `grace_period_ms` defaults to the one summary.json records, else one hour.
    """
    client = client or ClientConfig()
    show = progress or (lambda stage, done, total: None)
    by_ledger, silent_bookies = _read_findings(report)
    store = open_store(metadata_uri, session_timeout=client.session_timeout)
    await store.start()
    try:
        await require_cluster(store, uri=metadata_uri)
        registry = BookieRegistry(store)
        available = await registry.available_bookies()
        placements = await registry.placements()
        racks = {bookie: placement.rack for bookie, placement in placements.items()}
        settings = await read_settings(store)
        context = _Context(
            ledgers=LedgerManager(store),
            marks=UnderReplicationManager(store),
            registry=registry,
            pool=BookiePool(registry, request_timeout=client.read_timeout),
            racks=racks,
            cluster_racks=racks_in_cluster(racks, available.writable | available.read_only),
            min_racks=min_racks,
            grace_period_ms=(
                grace_period_ms if grace_period_ms is not None else _recorded_grace(report)
            ),
            stuck_after=settings.deletion_stuck_after,
        )
        try:
            kept, still_silent = await _recheck(context, by_ledger, silent_bookies, show)
        finally:
            await context.pool.close()
    finally:
        await store.close()
    for bookie in sorted(still_silent):
        kept.setdefault((None, None), []).append(
            Violation(
                Category.UNRESPONSIVE_REGISTERED_BOOKIE,
                None,
                bookie,
                None,
                f"bookie {bookie} is registered and still does not answer",
            )
        )
    reported = {
        (_key(scope, ledger_id, None), category)
        for (scope, ledger_id), found in by_ledger.items()
        for category in found.categories
    } | {(bookie, Category.UNRESPONSIVE_REGISTERED_BOOKIE) for bookie in silent_bookies}
    return _write_confirmed(report, kept, reported)


def _read_findings(report: Path) -> tuple[dict[tuple[int, int], _Reported], set[str]]:
    """The report's findings by ledger, and the bookies it found unresponsive."""
    by_ledger: dict[tuple[int, int], _Reported] = defaultdict(_Reported)
    silent_bookies: set[str] = set()
    for row in pq.read_table(report / schema.VIOLATIONS).to_pylist():
        category = Category(row["category"])
        if row["ledger_id"] is None:
            if category is Category.UNRESPONSIVE_REGISTERED_BOOKIE and row["bookie_id"]:
                silent_bookies.add(row["bookie_id"])
            continue
        reported = by_ledger[row["scope"], row["ledger_id"]]
        reported.categories.add(category)
        reported.violations.append(
            Violation(
                category,
                row["segment_index"],
                row["bookie_id"],
                row["missing_count"],
                row["detail"],
            )
        )
        if row["bookie_id"]:
            reported.bookies.add(row["bookie_id"])
    return by_ledger, silent_bookies


def _key(scope: int | None, ledger_id: int | None, bookie: str | None) -> str:
    """What a finding is about: its ledger, or for a bookie finding, its bookie."""
    return f"{scope}:{ledger_id}" if ledger_id is not None else str(bookie)


def _write_confirmed(
    report: Path,
    kept: dict[tuple[int | None, int | None], list[Violation]],
    reported: set[tuple[str, Category]],
) -> dict[str, Any]:
    """confirmed/ (replacing an earlier one) and confirmed.json; the latter's content."""
    output = report / CONFIRMED
    shutil.rmtree(output, ignore_errors=True)
    rows: dict[str, list[Any]] = {name: [] for name in schema.VIOLATIONS_SCHEMA.names}
    confirmed: dict[Category, set[str]] = defaultdict(set)
    for (scope, ledger_id), violations in kept.items():
        for violation in violations:
            rows["scope"].append(scope)
            rows["ledger_id"].append(ledger_id)
            rows["category"].append(violation.category.value)
            rows["segment_index"].append(violation.segment_index)
            rows["bookie_id"].append(violation.bookie_id)
            rows["missing_count"].append(violation.missing_count)
            rows["detail"].append(violation.detail)
            confirmed[violation.category].add(_key(scope, ledger_id, violation.bookie_id))
    writer = DatasetWriter(output, schema.VIOLATIONS_SCHEMA, schema.VIOLATIONS)
    writer.write_rows(rows)
    writer.close()
    kept_pairs = {(key, category) for category, keys in confirmed.items() for key in keys}
    summary = {
        "confirmed": len(kept_pairs),
        "dropped": len(reported - kept_pairs),
        "categories": {
            category.value: len(confirmed[category]) for category in VIOLATION_CATEGORIES
        },
    }
    write_json(report / CONFIRMED_JSON, summary)
    return summary


def _recorded_grace(report: Path) -> int:
    """The grace period the checks used, as their summary.json records it, if it does."""
    try:
        summary = json.loads((report / schema.SUMMARY_JSON).read_text())
    except (OSError, ValueError):
        return DEFAULT_GRACE_PERIOD_MS
    for holder in (summary, summary.get("params") or {}):
        value = holder.get("grace_period_ms") if isinstance(holder, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return DEFAULT_GRACE_PERIOD_MS


async def _recheck(
    context: _Context,
    by_ledger: dict[tuple[int, int], _Reported],
    silent_bookies: set[str],
    show: Progress,
) -> tuple[dict[tuple[int | None, int | None], list[Violation]], set[str]]:
    """The violations that still hold per reported ledger (in ledger order), and the
    bookies still silent."""
    total = len(by_ledger) + len(silent_bookies)
    done = 0
    limit = asyncio.Semaphore(LEDGER_CONCURRENCY)
    kept: dict[tuple[int, int], list[Violation]] = {}

    async def ledger(key: tuple[int, int], reported: _Reported) -> None:
        nonlocal done
        async with limit:
            kept[key] = await _recheck_ledger(context, key, reported)
        done += 1
        show("confirm", done, total)

    async def bookie(bookie_id: str) -> bool:
        nonlocal done
        silent = await _still_silent(context, bookie_id)
        done += 1
        show("confirm", done, total)
        return silent

    show("confirm", 0, total)
    await asyncio.gather(*(ledger(key, found) for key, found in by_ledger.items()))
    ordered = sorted(silent_bookies)
    silent = await asyncio.gather(*(bookie(b) for b in ordered))
    return {key: kept[key] for key in sorted(kept) if kept[key]}, {
        b for b, is_silent in zip(ordered, silent, strict=True) if is_silent
    }


async def _recheck_ledger(
    context: _Context, key: tuple[int, int], reported: _Reported
) -> list[Violation]:
    ledger_id = LedgerId(schema.from_int64(key[0]), schema.from_int64(key[1]))
    try:
        record = await context.ledgers.read_ledger_metadata(ledger_id)
    except NoSuchLedger:
        return await _without_metadata(context, ledger_id, reported)
    except MalformedData as error:
        return _unreadable(ledger_id, "metadata", error, reported)
    metadata = record.metadata
    if metadata.state is not LedgerState.CLOSED or metadata.last_entry_id < 0:
        return []
    bookies = sorted(metadata.bookies() | reported.bookies)
    answers = await asyncio.gather(*(_held(context, b, ledger_id) for b in bookies))
    mark = await context.marks.under_replicated(ledger_id)
    fresh = audit_ledger(
        metadata,
        {b: held for b, held in zip(bookies, answers, strict=True) if held is not None},
        racks=context.racks,
        min_racks=context.min_racks,
        underreplicated_since_ms=None if mark is None else mark.first_marked_ms,
        now_ms=int(time.time() * 1000),
        grace_period_ms=context.grace_period_ms,
        cluster_racks=context.cluster_racks,
    )
    if reported.categories & {Category.POTENTIALLY_FAULTY, Category.INVALID_METADATA}:
        return [violation for violation in fresh if violation.category.is_violation]
    return [violation for violation in fresh if violation.category in reported.categories]


def _unreadable(
    ledger_id: LedgerId, what: str, error: MalformedData, reported: _Reported
) -> list[Violation]:
    log.error(
        "confirm: ledger %s has an unreadable %s, its findings stand as reported: %s",
        ledger_id,
        what,
        error,
    )
    return reported.violations


async def _without_metadata(
    context: _Context, ledger_id: LedgerId, reported: _Reported
) -> list[Violation]:
    """The findings that still hold of a ledger with no metadata: deletion_stuck ones if it
    has a tombstone, orphan_data ones if it has none either."""
    try:
        found = await read_tombstone(context.ledgers.store, ledger_id)
    except MalformedData as error:
        return _unreadable(ledger_id, "tombstone", error, reported)
    if found is not None:
        return await _stuck(
            context, ledger_id, found.tombstone, reported.holders(Category.DELETION_STUCK)
        )
    return await _orphans(context, ledger_id, reported.holders(Category.ORPHAN_DATA))


async def _stuck(
    context: _Context, ledger_id: LedgerId, tombstone: Tombstone, holders: set[str]
) -> list[Violation]:
    """deletion_stuck rows for the reported bookies that still hold the tombstoned ledger;
    a bookie that does not answer confirms nothing."""
    bookies = sorted(holders)
    answers = await asyncio.gather(*(_held(context, b, ledger_id) for b in bookies))
    return deletion_stuck(
        tombstone,
        {b: held for b, held in zip(bookies, answers, strict=True) if held is not None},
        now_ms=int(time.time() * 1000),
        stuck_after=context.stuck_after,
    )


async def _orphans(context: _Context, ledger_id: LedgerId, holders: set[str]) -> list[Violation]:
    """orphan_data rows for the reported bookies that still hold the ledger, which has
    neither metadata nor tombstone."""
    found = []
    for bookie in sorted(holders):
        held = await _held(context, bookie, ledger_id)
        if held:
            found.append(
                Violation(
                    Category.ORPHAN_DATA,
                    None,
                    bookie,
                    len(held),
                    f"bookie {bookie} still holds {len(held)} entries of ledger {ledger_id}, "
                    "which has neither metadata nor tombstone",
                )
            )
    return found


async def _held(context: _Context, bookie: str, ledger_id: LedgerId) -> EntryAvailability | None:
    """What `bookie` holds of the ledger now (empty if nothing); None if it did not answer."""
    try:
        connection = await context.pool.get(bookie)
        return await connection.get_list_of_entries(ledger_id)
    except NoSuchLedger:
        return EntryAvailability.empty()
    except TallyError as error:
        log.warning("confirm: bookie %s on ledger %s: %s", bookie, ledger_id, error)
        return None


async def _still_silent(context: _Context, bookie: str) -> bool:
    """Registered and not answering: the finding holds. A bookie no longer registered is
    known to be gone, which is what BP-34 asks of an unresponsive one."""
    if await context.registry.registration(bookie) is None:
        return False
    try:
        connection = await context.pool.get(bookie)
        await connection.get_list_of_entries(PROBE_LEDGER)
    except (Timeout, BookieUnavailable):
        return True
    except TallyError:
        return False  # an error answer is an answer
    return False
