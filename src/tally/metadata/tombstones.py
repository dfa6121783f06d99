"""Tombstones in the store: what is left of a deleted ledger until every bookie dropped it.

A tombstone lives under /tombstones, split as /ledgers is, and is written in the same
transaction that removes the ledger's metadata (deletion.py), so a ledger always has
one of the two. Bookies acknowledge by compare-and-set; the auditor removes a tombstone
once `Tombstone.removable` says so.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tally.core.deletion import Tombstone
from tally.core.errors import MalformedData, MetadataVersionConflict, NoSuchKey
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import Deletion
from tally.metadata import json_records
from tally.metadata.ledger_tree import DEFAULT_PAGE_SIZE, Subtree, prune_parents, walk
from tally.metadata.paths import TOMBSTONE_RECORDS
from tally.metadata.store import MetadataStore, Versioned

log = logging.getLogger(__name__)

_KIND = "tombstone"
_FIELDS = frozenset(
    {
        "deleted_ms",
        "reason",
        "violations",
        "check_detail",
        "tombstoned_ms",
        "last_entry_id",
        "length",
        "bookies",
        "acknowledged_ms",
    }
)
ACK_ATTEMPTS = 20
"""Compare-and-set tries of one acknowledgement: every named bookie may ack at once."""


@dataclass(frozen=True)
class TombstoneRecord:
    ledger_id: LedgerId
    tombstone: Tombstone
    version: int


def encode_tombstone(tombstone: Tombstone) -> bytes:
    deletion = tombstone.deletion
    bookies = sorted(tombstone.bookies)
    return json_records.encode(
        _KIND,
        {
            "deleted_ms": deletion.time_ms,
            "reason": deletion.reason,
            "violations": deletion.violations,
            "check_detail": deletion.detail,
            "tombstoned_ms": tombstone.tombstoned_ms,
            "last_entry_id": tombstone.last_entry_id,
            "length": tombstone.length,
            "bookies": bookies,
            "acknowledged_ms": [tombstone.bookies[bookie] for bookie in bookies],
        },
    )


def decode_tombstone(data: bytes, ledger_id: LedgerId) -> Tombstone:
    source = f"tombstone of ledger {ledger_id}"
    record = json_records.decode(data, _KIND, _FIELDS, source)
    bookies = record.texts("bookies")
    acks = record.optional_integers("acknowledged_ms")
    if len(acks) != len(bookies):
        raise MalformedData(f"{source}: {len(bookies)} bookies but {len(acks)} acknowledgements")
    with json_records.building(source):
        return Tombstone(
            deletion=Deletion(
                time_ms=record.integer("deleted_ms"),
                reason=record.text("reason"),
                violations=record.integer("violations", low=-1),
                detail=record.string("check_detail"),
            ),
            tombstoned_ms=record.integer("tombstoned_ms"),
            last_entry_id=record.integer("last_entry_id", low=-1),
            length=record.integer("length"),
            bookies=dict(zip(bookies, acks, strict=True)),
        )


def _decoded(ledger_id: LedgerId, found: Versioned) -> TombstoneRecord:
    return TombstoneRecord(ledger_id, decode_tombstone(found.data, ledger_id), found.version)


async def read_tombstone(store: MetadataStore, ledger_id: LedgerId) -> TombstoneRecord | None:
    try:
        found = await store.get(TOMBSTONE_RECORDS.path(ledger_id))
    except NoSuchKey:
        return None
    return _decoded(ledger_id, found)


@dataclass(frozen=True)
class TombstonePage:
    tombstones: tuple[TombstoneRecord, ...]
    unreadable: tuple[tuple[str, MalformedData], ...]
    """Keys whose value does not decode (or that name no ledger), with why."""


async def tombstone_pages(
    store: MetadataStore, page_size: int = DEFAULT_PAGE_SIZE, within: Subtree | None = None
) -> AsyncIterator[TombstonePage]:
    """Every tombstone (in the subtree `within`), in ledger id order, a page at a time."""
    async for page in walk(store, TOMBSTONE_RECORDS, page_size, within):
        found: list[TombstoneRecord] = []
        unreadable = [
            (path, MalformedData(f"{path} is in the tombstone tree but names no ledger"))
            for path in page.strays
        ]
        for ledger_id, path, value in page.ledgers:
            try:
                found.append(_decoded(ledger_id, value))
            except MalformedData as error:
                unreadable.append((path, error))
        yield TombstonePage(tuple(found), tuple(unreadable))


async def acknowledge_tombstone(
    store: MetadataStore, ledger_id: LedgerId, bookie_id: str, now_ms: int
) -> TombstoneRecord | None:
    """Record that `bookie_id` dropped the ledger's data; None if the tombstone is gone."""
    path = TOMBSTONE_RECORDS.path(ledger_id)
    for _ in range(ACK_ATTEMPTS):
        record = await read_tombstone(store, ledger_id)
        if record is None:
            return None
        updated = record.tombstone.acknowledged(bookie_id, now_ms)
        if updated is record.tombstone:
            return record
        try:
            stat = await store.set(path, encode_tombstone(updated), record.version)
        except NoSuchKey:
            return None
        except MetadataVersionConflict:
            continue
        return TombstoneRecord(ledger_id, updated, stat.version)
    raise MetadataVersionConflict(
        f"tombstone of ledger {ledger_id} kept changing over {ACK_ATTEMPTS} acknowledgements"
    )


async def remove_tombstone(store: MetadataStore, record: TombstoneRecord) -> bool:
    """Remove the tombstone if it is still as read (False if it changed or went)."""
    try:
        await store.delete(TOMBSTONE_RECORDS.path(record.ledger_id), record.version)
    except (NoSuchKey, MetadataVersionConflict):
        return False
    await prune_parents(store, TOMBSTONE_RECORDS.parents(record.ledger_id))
    return True
