"""Snapshot rows read back as the objects they describe, for the tests' own audits."""

from __future__ import annotations

from typing import Any

from tally.core.digest import DigestType
from tally.core.ledger_metadata import LedgerMetadata, LedgerState, Segment


def metadata_of(ledger: dict[str, Any], segments: list[dict[str, Any]]) -> LedgerMetadata:
    """The metadata a LEDGERS row and its SEGMENTS rows describe (master key and creator
    are not in the snapshot: stand-ins); the rows are checked to be consistent."""
    rows = sorted(segments, key=lambda row: row["segment_index"])
    assert [row["segment_index"] for row in rows] == list(range(len(rows)))
    metadata = LedgerMetadata(
        state=LedgerState[ledger["state"]],
        ensemble_size=ledger["ensemble_size"],
        write_quorum=ledger["write_quorum"],
        ack_quorum=ledger["ack_quorum"],
        segments=tuple(Segment(row["first_entry_id"], tuple(row["ensemble"])) for row in rows),
        digest_type=DigestType[ledger["digest_type"]],
        master_key=bytes(32),
        ctime_ms=ledger["ctime_ms"],
        creator_token=b"",
        last_entry_id=ledger["last_entry_id"],
        length=ledger["length"],
    )
    bounds = [(first, -1 if last is None else last) for first, last in metadata.segment_bounds()]
    assert bounds == [(row["first_entry_id"], row["last_entry_id"]) for row in rows]
    return metadata
