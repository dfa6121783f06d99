"""What a bookie holds that a metadata recovery needs (issue 18), as the records of a dump
WITH_STATE: its cookie, each ledger it holds with its availability, fenced flag, LAC, master
key and metadata copy, then each ledger it deleted under a tombstone and still remembers.

The same records answer a running bookie's dump and make the offline export of a stopped
one's files, so that both say the same of the same files."""

from __future__ import annotations

from collections.abc import Iterator

from tally.bookie.ledger_directories import BookieStorage
from tally.core.errors import NoSuchLedger
from tally.core.protocol import StateRecord


def state_records(storage: BookieStorage, cookie: bytes) -> Iterator[StateRecord]:
    """The records, lazily: ledgers ascending, read one at a time (bounded memory)."""
    yield StateRecord.cookie_of(cookie)
    for ledger_id, held in storage.iter_availability():
        try:
            info = storage.ledger_info(ledger_id)
            master_key = storage.master_key(ledger_id)
            copy = storage.metadata_copy(ledger_id)
        except NoSuchLedger:
            continue  # deleted meanwhile
        yield StateRecord.held(
            ledger_id,
            held.to_bytes(),
            fenced=info.fenced,
            last_add_confirmed=info.last_add_confirmed,
            master_key=master_key,
            metadata_copy=copy,
        )
    for ledger_id, deleted in sorted(storage.deleted_ledgers().items()):
        yield StateRecord.deleted(ledger_id, deleted.deleted_ms)
