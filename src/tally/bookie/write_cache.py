"""The bookie's write cache: entries added since the last checkpoint, by ledger.

Adds land here; a checkpoint swaps in a fresh cache and writes the old one out to the
entry logs (ledger_storage.py). Not thread-safe: ledger storage guards it with its lock.
"""

from __future__ import annotations

from collections.abc import Iterable

from tally.bookie.journal_entries import JournalLocation
from tally.core.ids import LedgerId
from tally.core.protocol import EntryBytes

Stored = tuple[int, EntryBytes]
"""(CRC32C, entry bytes)."""


class _CachedLedger:
    """One ledger's entries in a write cache, and the highest id among them."""

    __slots__ = ("entries", "last")

    def __init__(self, last: int) -> None:
        self.entries: dict[int, Stored] = {}
        self.last = last


class WriteCache:
    """Entries added since the last checkpoint, by ledger; the newest add of an id wins.

    One dict look-up per add: a LedgerId hashes and compares in Python, per look-up."""

    __slots__ = ("_ledgers", "byte_count", "entry_count", "kept")

    def __init__(self) -> None:
        self._ledgers: dict[LedgerId, _CachedLedger] = {}
        self.entry_count = 0
        self.byte_count = 0
        self.kept: dict[tuple[LedgerId, int], JournalLocation] = {}
        """Where the journal holds the cached entries it keeps (journal_entries.py)."""

    def put(self, ledger_id: LedgerId, entry_id: int, stored: Stored) -> None:
        self.put_all(ledger_id, ((entry_id, stored),))

    def put_all(self, ledger_id: LedgerId, entries: Iterable[tuple[int, Stored]]) -> int:
        """`put` each (entry id, stored) of one ledger: a receive's adds, the ledger looked
        up once. Returns the bytes put."""
        cached = self._ledgers.get(ledger_id)
        put = 0
        for entry_id, stored in entries:
            if cached is None:
                cached = self._ledgers[ledger_id] = _CachedLedger(entry_id)
            elif entry_id > cached.last:
                cached.last = entry_id
            previous = cached.entries.get(entry_id)
            if previous is None:
                self.entry_count += 1
            else:
                self.byte_count -= len(previous[1])
                self.kept.pop((ledger_id, entry_id), None)
            cached.entries[entry_id] = stored
            put += len(stored[1])
        self.byte_count += put
        return put

    def get(self, ledger_id: LedgerId, entry_id: int) -> Stored | None:
        cached = self._ledgers.get(ledger_id)
        return None if cached is None else cached.entries.get(entry_id)

    def last_entry(self, ledger_id: LedgerId) -> int | None:
        cached = self._ledgers.get(ledger_id)
        return None if cached is None else cached.last

    def ledgers(self) -> list[LedgerId]:
        return sorted(self._ledgers)

    def entries(self, ledger_id: LedgerId) -> dict[int, Stored]:
        cached = self._ledgers.get(ledger_id)
        return {} if cached is None else cached.entries

    def drop_ledger(self, ledger_id: LedgerId) -> None:
        cached = self._ledgers.pop(ledger_id, None)
        if cached is not None:
            self.entry_count -= len(cached.entries)
            self.byte_count -= sum(len(data) for _, data in cached.entries.values())
            for entry_id in cached.entries:
                self.kept.pop((ledger_id, entry_id), None)

    def drop_entries(self, ledger_id: LedgerId, entry_ids: Iterable[int]) -> None:
        cached = self._ledgers.get(ledger_id)
        if cached is None:
            return
        for entry_id in entry_ids:
            dropped = cached.entries.pop(entry_id, None)
            if dropped is not None:
                self.entry_count -= 1
                self.byte_count -= len(dropped[1])
                self.kept.pop((ledger_id, entry_id), None)
        if cached.entries:
            cached.last = max(cached.entries)
        else:
            del self._ledgers[ledger_id]

    def absorb(self, newer: WriteCache) -> None:
        """Take in `newer`'s entries over these (to put back a cache a checkpoint failed on)."""
        for ledger_id, cached in newer._ledgers.items():
            self.put_all(ledger_id, cached.entries.items())
        self.kept.update(newer.kept)
