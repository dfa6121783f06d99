"""JSON-ready views of what the metadata store holds, shared by every face (shell, HTTP)
so that `tally shell ... --json` and the admin API say the same thing the same way."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from tally.core.disk_usage import BookieMode
from tally.metadata.bookie_registry import BookiePlacement, BookieRegistration, BookieRegistry
from tally.metadata.cookies import CookieManager
from tally.metadata.ledger_manager import LedgerRecord
from tally.metadata.store import MetadataStore
from tally.metadata.underreplication import LostEntries, UnderReplicatedLedger


def bookie_view(
    bookie_id: str, registration: BookieRegistration | None, placement: BookiePlacement | None
) -> dict[str, Any]:
    """One bookie as the store knows it; state "down" when it has no registration."""
    info = registration.info if registration is not None else None
    state = "down"
    if registration is not None:
        state = (BookieMode.READ_ONLY if registration.read_only else BookieMode.WRITABLE).value
    return {
        "bookie_id": bookie_id,
        "state": state,
        "address": info.address if info else None,
        "http_port": info.http_port if info else None,
        "version": info.version if info else None,
        "start_time_ms": info.start_time_ms if info else None,
        "rack": placement.rack if placement else None,
        "failed_ledger_dirs": list(info.failed_ledger_dirs) if info else None,
    }


async def bookie_views(
    store: MetadataStore, states: Iterable[str] = ("writable", "readonly")
) -> list[dict[str, Any]]:
    """The bookies in `states` (writable, readonly, down), by id. Down bookies are those
    formatted for the cluster (they have a cookie) and not registered now."""
    wanted = frozenset(states)
    registry = BookieRegistry(store)
    available, placements = await asyncio.gather(
        registry.available_bookies(), registry.placements()
    )
    candidates = set(available.writable | available.read_only)
    if "down" in wanted:
        candidates.update(await CookieManager(store).bookie_ids())
    ids = sorted(candidates)
    registrations = await asyncio.gather(*(registry.registration(b) for b in ids))
    views = [bookie_view(b, r, placements.get(b)) for b, r in zip(ids, registrations, strict=True)]
    return [view for view in views if view["state"] in wanted]


def ledger_view(record: LedgerRecord) -> dict[str, Any]:
    """A ledger's metadata, its segments' ensembles included, under both forms of its id."""
    return {
        "ledger_id": str(record.ledger_id),
        "qualified_name": record.ledger_id.qualified_name,
        "metadata_version": record.version,
        **record.metadata.to_dict(),
    }


def under_replicated_view(mark: UnderReplicatedLedger) -> dict[str, Any]:
    return {
        "ledger_id": str(mark.ledger_id),
        "qualified_name": mark.ledger_id.qualified_name,
        "missing_bookies": sorted(mark.missing_bookies),
        "first_marked_ms": mark.first_marked_ms,
    }


def lost_entries_view(lost: LostEntries) -> dict[str, Any]:
    return {
        "ledger_id": str(lost.ledger_id),
        "qualified_name": lost.ledger_id.qualified_name,
        "entries": [[first, last] for first, last in lost.ranges],
        "reason": lost.reason,
        "recorded_ms": lost.recorded_ms,
    }
