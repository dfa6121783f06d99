"""A ledger's rows in the snapshot, made into what `audit_ledger` and `deletion_stuck` take
(stand-in metadata, a tombstone, decoded reports), and the findings of rows that cannot be
judged, worded once for the pass."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tally.audit import schema
from tally.core.availability import EntryAvailability
from tally.core.deletion import Tombstone
from tally.core.digest import MASTER_KEY_SIZE, DigestType
from tally.core.errors import BadRequest, MalformedData
from tally.core.ids import LedgerId
from tally.core.ledger_audit import Category, Violation
from tally.core.ledger_metadata import Deletion, LedgerMetadata, LedgerState, Segment

_STANDIN_MASTER_KEY = bytes(MASTER_KEY_SIZE)
TOMBSTONE_FIELDS = tuple(
    name for name in schema.TOMBSTONES_SCHEMA.names if name not in ("scope", "ledger_id")
)
"""A TOMBSTONES row's columns but its ledger id: what a tombstone row of the stream carries."""


def standin_metadata(
    ensemble_size: int,
    write_quorum: int,
    ack_quorum: int,
    last: int,
    length: int,
    segments: Sequence[tuple[int, tuple[str, ...]]],
) -> LedgerMetadata:
    """The ledger's metadata as far as the audit reads it; what the snapshot does not carry
    (digest, master key, creator) is a stand-in. BadRequest if the rows make no valid
    ledger."""
    return LedgerMetadata(
        state=LedgerState.CLOSED,
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        segments=tuple(Segment(first, ensemble) for first, ensemble in segments),
        digest_type=DigestType.CRC32C,
        master_key=_STANDIN_MASTER_KEY,
        ctime_ms=0,
        creator_token=b"",
        last_entry_id=last,
        length=length,
    )


def tombstone_of(row: Mapping[str, Any]) -> Tombstone:
    """The tombstone a TOMBSTONES row (its TOMBSTONE_FIELDS) describes; BadRequest if it
    makes none."""
    missing = [name for name in TOMBSTONE_FIELDS if row.get(name) is None]
    if missing:
        raise BadRequest(f"the tombstone has no {', '.join(missing)}")
    bookies, acknowledged = row["bookies"], row["acknowledged_ms"]
    if len(bookies) != len(acknowledged):
        raise BadRequest(
            f"the tombstone names {len(bookies)} bookies but has {len(acknowledged)} "
            "acknowledgements"
        )
    return Tombstone(
        deletion=Deletion(row["deleted_ms"], row["reason"], row["violations"], row["check_detail"]),
        tombstoned_ms=row["tombstoned_ms"],
        last_entry_id=row["last_entry_id"],
        length=row["length"],
        bookies=dict(zip(bookies, acknowledged, strict=True)),
    )


def invalid_metadata(
    scope: int, ledger_id: int, error: BadRequest, what: str = "ledger"
) -> Violation:
    """The finding of a ledger whose snapshot rows make no valid `what` (ledger, tombstone):
    it is not judged, and the job goes on with the others."""
    return Violation(
        Category.INVALID_METADATA,
        None,
        None,
        None,
        f"the snapshot's rows of {ledger_name(scope, ledger_id)} make no valid {what}, so it "
        f"is not judged: {error}",
    )


def decoded(
    metadata: LedgerMetadata, reports: Sequence[tuple[str, bytes]], responded: frozenset[str]
) -> tuple[dict[str, EntryAvailability], dict[str, str]]:
    """The availability map `audit_ledger` takes, and why some reports did not decode.

    Responding bookies of the ledger with no report hold nothing; duplicate reports of one
    bookie are united; a report that does not decode counts as no answer.
    """
    availability = {bookie: EntryAvailability.empty() for bookie in metadata.bookies() & responded}
    undecodable: dict[str, str] = {}
    for bookie, report in reports:
        try:
            held = EntryAvailability.from_bytes(report)
        except MalformedData as exc:
            undecodable[bookie] = f"its report does not decode: {exc}"
            continue
        availability[bookie] = availability.get(bookie, EntryAvailability.empty()).union(held)
    for bookie in undecodable:
        availability.pop(bookie, None)
    return availability, undecodable


def orphan(bookie: str, held: int | None, what: str) -> Violation:
    return Violation(
        Category.ORPHAN_DATA,
        None,
        bookie,
        held,
        f"bookie {bookie} holds {what}, a ledger with neither metadata nor tombstone",
    )


def ledger_name(scope: int, ledger_id: int) -> str:
    return f"ledger {LedgerId(schema.from_int64(scope), schema.from_int64(ledger_id))}"
