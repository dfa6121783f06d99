"""The delete path: the one place where ledger metadata goes (BP-31's delete discipline).

`delete_ledger` is the choke point every deletion takes (client, shell, HTTP): it refuses
what `core.deletion.plan_delete` refuses, recovers an open ledger first when forced, has the
ledger checked once more, and moves it to DELETED. `tombstone_ledger` replaces DELETED
metadata by its tombstone, in one transaction; nothing else removes ledger metadata.
`sweep_deletions` (run by the auditor) tombstones what is past its retention and removes
tombstones past theirs.

Recovering and checking need bookies, which this layer does not talk to: the caller
passes them in (the client does).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import Counter

from tally.core.deletion import ClusterSettings, DeletePlan, Tombstone, plan_delete, tombstone_due
from tally.core.errors import (
    DeleteRefused,
    KeyExists,
    LedgerDeleted,
    MetadataVersionConflict,
    NoSuchKey,
    NoSuchLedger,
)
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import Deletion, LedgerState
from tally.metadata.cluster_settings import read_settings
from tally.metadata.ledger_manager import LedgerManager, LedgerRecord
from tally.metadata.ledger_tree import prune_parents
from tally.metadata.paths import LEDGER_METADATA, TOMBSTONE_RECORDS
from tally.metadata.store import Create, Delete, MetadataStore
from tally.metadata.tombstones import (
    TombstoneRecord,
    encode_tombstone,
    read_tombstone,
    remove_tombstone,
    tombstone_pages,
)
from tally.metadata.underreplication import UnderReplicationManager

log = logging.getLogger(__name__)

LEDGERS_DELETED = Counter("ledgers_deleted", "Ledgers this process moved to DELETED")
LEDGERS_DELETED_WITH_VIOLATIONS = Counter(
    "ledgers_deleted_with_violations",
    "Of those, ledgers whose check at deletion found entries on fewer than WQ bookies: "
    "what the cluster was losing without anyone knowing",
)

TOMBSTONE_ATTEMPTS = 5
NOT_CHECKED = (-1, "not checked: the delete was made without a client to ask the bookies")

Recover = Callable[[LedgerRecord], Awaitable[LedgerRecord]]
"""Recovers an OPEN or IN_RECOVERY ledger and returns its CLOSED record."""
Check = Callable[[LedgerRecord], Awaitable[tuple[int, str]]]
"""The durability check of one closed ledger: (missing copies, verdict in a sentence)."""


@dataclass(frozen=True)
class DeleteOutcome:
    ledger_id: LedgerId
    plan: DeletePlan
    deletion: Deletion
    tombstone: TombstoneRecord | None
    """Written at once when the cluster's `ledger_delete_retention` is 0."""
    record: LedgerRecord
    """The ledger's DELETED record (the last one, when it was tombstoned at once)."""


async def _deleted_error(store: MetadataStore, ledger_id: LedgerId) -> LedgerDeleted | None:
    """LedgerDeleted describing the ledger's tombstone, if it has one."""
    found = await read_tombstone(store, ledger_id)
    if found is None:
        return None
    tombstone = found.tombstone
    return LedgerDeleted(
        f"ledger {ledger_id} was deleted ({tombstone.deletion.reason}) and is past its "
        f"retention: only its tombstone is left, and its bookies drop its data "
        f"({len(tombstone.pending)} of {len(tombstone.bookies)} still to)"
    )


async def read_existing(ledgers: LedgerManager, ledger_id: LedgerId) -> LedgerRecord:
    """The ledger's record; LedgerDeleted if it only has a tombstone, NoSuchLedger if neither."""
    try:
        return await ledgers.read_ledger_metadata(ledger_id)
    except NoSuchLedger:
        error = await _deleted_error(ledgers.store, ledger_id)
        if error is None:
            raise
        raise error from None


async def read_undeleted(ledgers: LedgerManager, ledger_id: LedgerId) -> LedgerRecord:
    """The record of a ledger that can be read: LedgerDeleted for a deleted one."""
    record = await read_existing(ledgers, ledger_id)
    deletion = record.metadata.deletion
    if deletion is not None:
        raise LedgerDeleted(
            f"ledger {ledger_id} was deleted ({deletion.reason}); `tally shell undeleteledger "
            f"{ledger_id}` restores it until its retention ends"
        )
    return record


async def delete_ledger(
    ledgers: LedgerManager,
    ledger_id: LedgerId,
    *,
    reason: str,
    now_ms: int,
    force: bool = False,
    recover: Recover | None = None,
    check: Check | None = None,
) -> DeleteOutcome:
    """Delete the ledger as the cluster's settings allow (see the module docstring)."""
    record = await read_existing(ledgers, ledger_id)
    settings = await read_settings(ledgers.store)
    plan = plan_delete(ledger_id, record.metadata, settings, force=force)
    if plan is DeletePlan.RECOVER_FIRST:
        if recover is None:
            raise DeleteRefused(
                f"ledger {ledger_id} is {record.metadata.state.name} and must be recovered "
                "before it is deleted, which takes a client"
            )
        log.info("ledger %s: recovering it before deleting it (forced)", ledger_id)
        record = await recover(record)
        plan_delete(ledger_id, record.metadata, settings, force=False)
    if plan is DeletePlan.ALREADY_DELETED:
        deletion = record.metadata.deletion
        assert deletion is not None
    else:
        violations, detail = NOT_CHECKED if check is None else await check(record)
        asked = Deletion(now_ms, reason, violations, detail)
        record = await ledgers.update(
            ledger_id, lambda metadata: metadata.deleted(asked), current=record
        )
        deletion = record.metadata.deletion or asked
        _log_deletion(ledger_id, deletion, settings)
    tombstone = None
    if tombstone_due(record.metadata, now_ms, settings.ledger_delete_retention):
        tombstone = await tombstone_ledger(ledgers, record, now_ms)
    return DeleteOutcome(ledger_id, plan, deletion, tombstone, record)


def _log_deletion(ledger_id: LedgerId, deletion: Deletion, settings: ClusterSettings) -> None:
    LEDGERS_DELETED.inc()
    if deletion.violations > 0:
        LEDGERS_DELETED_WITH_VIOLATIONS.inc()
        log.warning(
            "ledger %s deleted (%s) while it broke its durability contract: %s",
            ledger_id,
            deletion.reason,
            deletion.detail,
        )
    log.info(
        "ledger %s deleted (%s); undeletable for %d s; check: %s",
        ledger_id,
        deletion.reason,
        settings.ledger_delete_retention,
        deletion.detail,
    )


async def undelete_ledger(
    ledgers: LedgerManager, ledger_id: LedgerId, *, now_ms: int
) -> LedgerRecord:
    """DELETED -> CLOSED, unchanged otherwise; LedgerDeleted once it is a tombstone."""
    record = await read_existing(ledgers, ledger_id)
    try:
        record = await ledgers.update(
            ledger_id, lambda metadata: metadata.undeleted(now_ms), current=record
        )
    except NoSuchLedger:
        error = await _deleted_error(ledgers.store, ledger_id)
        raise (error or LedgerDeleted(f"ledger {ledger_id} went while undeleting it")) from None
    log.info("ledger %s undeleted", ledger_id)
    return record


async def set_archived(ledgers: LedgerManager, ledger_id: LedgerId) -> LedgerRecord:
    """Set the ledger's archival bit (an archiver copied it elsewhere)."""
    record = await read_existing(ledgers, ledger_id)
    return await ledgers.update(ledger_id, lambda found: found.with_archived(), current=record)


async def tombstone_ledger(
    ledgers: LedgerManager, record: LedgerRecord, now_ms: int
) -> TombstoneRecord | None:
    """Replace a DELETED ledger's metadata by its tombstone, in one transaction.

    None when the metadata changed meanwhile (undeleted, say) or went: nothing is written.
    """
    store, ledger_id = ledgers.store, record.ledger_id
    tombstone = Tombstone.of(record.metadata, now_ms)
    path = TOMBSTONE_RECORDS.path(ledger_id)
    for _ in range(TOMBSTONE_ATTEMPTS):
        await _make_parents(store, TOMBSTONE_RECORDS.parents(ledger_id))
        try:
            await store.transaction(
                [
                    Delete(LEDGER_METADATA.path(ledger_id), record.version),
                    Create(path, encode_tombstone(tombstone)),
                ]
            )
        except NoSuchKey:
            # The metadata went, or a parent of the tombstone was pruned meanwhile.
            if await _gone(ledgers, ledger_id):
                return None
            continue
        except (MetadataVersionConflict, KeyExists):
            return None
        await prune_parents(store, LEDGER_METADATA.parents(ledger_id))
        await UnderReplicationManager(store).forget_deleted(ledger_id)
        log.info(
            "ledger %s: metadata replaced by its tombstone; bookies %s are to drop its data",
            ledger_id,
            sorted(tombstone.bookies),
        )
        return TombstoneRecord(ledger_id, tombstone, 0)
    raise MetadataVersionConflict(
        f"ledger {ledger_id}: could not write its tombstone in {TOMBSTONE_ATTEMPTS} attempts"
    )


async def _gone(ledgers: LedgerManager, ledger_id: LedgerId) -> bool:
    try:
        await ledgers.read_ledger_metadata(ledger_id)
    except NoSuchLedger:
        return True
    return False


async def _make_parents(store: MetadataStore, parents: list[str]) -> None:
    """Create the missing keys of `parents` (nearest first), farthest first."""
    for parent in reversed(parents):
        with contextlib.suppress(KeyExists):
            await store.create(parent, make_parents=True)


@dataclass
class SweepReport:
    """What one sweep of the deletions did and saw."""

    tombstoned: list[LedgerId] = field(default_factory=list)
    tombstones_removed: list[LedgerId] = field(default_factory=list)
    deleted_ledgers: int = 0
    """DELETED ledgers still within their retention."""
    tombstones: int = 0
    """Tombstones left after the sweep."""
    tombstones_pending: int = 0
    """Of those, with a named bookie yet to acknowledge."""
    stuck: list[LedgerId] = field(default_factory=list)
    """Tombstones older than `deletion_stuck_after` with bookies yet to acknowledge."""
    with_violations: list[LedgerId] = field(default_factory=list)
    """Tombstones of ledgers deleted while their durability check found missing copies."""
    unreadable: int = 0


async def sweep_deletions(ledgers: LedgerManager, now_ms: int) -> SweepReport:
    """Tombstone the DELETED ledgers past their retention; remove the tombstones past theirs."""
    store = ledgers.store
    settings = await read_settings(store)
    report = SweepReport()
    async for page in ledgers.ledger_pages():
        for record in page.ledgers:
            if record.metadata.state is not LedgerState.DELETED:
                continue
            if not tombstone_due(record.metadata, now_ms, settings.ledger_delete_retention):
                report.deleted_ledgers += 1
            elif await tombstone_ledger(ledgers, record, now_ms) is not None:
                report.tombstoned.append(record.ledger_id)
    async for tombstone_page in tombstone_pages(store):
        report.unreadable += len(tombstone_page.unreadable)
        for found in tombstone_page.tombstones:
            tombstone = found.tombstone
            removable = tombstone.removable(now_ms, settings.tombstone_retention)
            if removable and await remove_tombstone(store, found):
                _log_removal(found)
                report.tombstones_removed.append(found.ledger_id)
                continue
            report.tombstones += 1
            report.tombstones_pending += bool(tombstone.pending)
            if tombstone.stuck(now_ms, settings.deletion_stuck_after):
                report.stuck.append(found.ledger_id)
            if tombstone.deletion.violations > 0:
                report.with_violations.append(found.ledger_id)
    return report


def _log_removal(found: TombstoneRecord) -> None:
    pending = sorted(found.tombstone.pending)
    if pending:
        log.warning(
            "tombstone of ledger %s removed past its retention although bookies %s never "
            "acknowledged it: data they still hold of it is orphan data, reported and kept "
            "until an operator deletes it (`tally shell gc orphans`)",
            found.ledger_id,
            pending,
        )
    else:
        log.info("tombstone of ledger %s removed: every bookie dropped its data", found.ledger_id)
