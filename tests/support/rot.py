"""Bit rot for tests: a payload byte flipped on disk under a stopped bookie's entries."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tally.bookie.entry_log import Location, log_file_name
from tally.bookie.journal_entries import JournalLocation
from tally.bookie.ledger_storage import LedgerStorage
from tally.core.ids import LedgerId


def rot_entries(data_dir: Path, ledger_id: LedgerId, entries: Iterable[int]) -> int:
    """Flip the last byte (payload) of each of the entries that the stopped bookie at
    `data_dir` holds, in its entry logs or kept in its journal files; how many."""
    storage = LedgerStorage(data_dir / "ledgers")
    try:
        locations = [storage._index.location(ledger_id, e) for e in entries]
    finally:
        storage.close()
    flipped = 0
    for location in locations:
        if isinstance(location, Location):
            path = data_dir / "ledgers" / "logs" / log_file_name(location.log_id)
        elif isinstance(location, JournalLocation):
            path = data_dir / "journal" / f"{location.file_id:016x}.txn"
        else:
            continue
        with path.open("r+b") as file:
            file.seek(location.offset + location.size - 1)
            byte = file.read(1)[0]
            file.seek(location.offset + location.size - 1)
            file.write(bytes([byte ^ 0x10]))
        flipped += 1
    return flipped
