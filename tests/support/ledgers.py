"""Ledger metadata for the pure tests: segments rotating over a fixed list of bookies, and
what each bookie holds when nothing is lost."""

from __future__ import annotations

from collections.abc import Sequence

from tally.core.digest import DigestType
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.schedule import write_set

BOOKIES = tuple(f"b{i}" for i in range(8))


def open_ledger(
    ensemble: Sequence[str], write_quorum: int, ack_quorum: int | None = None
) -> LedgerMetadata:
    """A new OPEN ledger on `ensemble` (AQ = WQ unless given)."""
    return LedgerMetadata.create(
        ensemble=tuple(ensemble),
        write_quorum=write_quorum,
        ack_quorum=write_quorum if ack_quorum is None else ack_quorum,
        digest_type=DigestType.CRC32C,
        password=b"pw",
        ctime_ms=0,
        creator_token=b"t",
    )


def rotating_ledger(
    e: int,
    wq: int,
    aq: int,
    changes: Sequence[int],
    last: int | None,
    bookies: Sequence[str] = BOOKIES,
) -> LedgerMetadata:
    """A ledger whose k-th ensemble change (at the sorted `changes`) shifts the ensemble k
    places along `bookies`; closed at `last`, or OPEN when None."""
    metadata = open_ledger(bookies[:e], wq, aq)
    for shift, first in enumerate(sorted(set(changes)), start=1):
        ensemble = tuple(bookies[(i + shift) % len(bookies)] for i in range(e))
        metadata = metadata.with_ensemble_change(first, ensemble)
    return metadata if last is None else metadata.close(last, last + 1)


def held_by_schedule(metadata: LedgerMetadata) -> dict[str, set[int]]:
    """The entries each bookie of a closed ledger holds when nothing is lost."""
    held: dict[str, set[int]] = {bookie: set() for bookie in metadata.bookies()}
    for segment, (first, last) in zip(metadata.segments, metadata.segment_bounds(), strict=True):
        assert last is not None
        for entry in range(first, last + 1):
            for position in write_set(entry, metadata.ensemble_size, metadata.write_quorum):
                held[segment.ensemble[position]].add(entry)
    return held
