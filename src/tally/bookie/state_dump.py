"""What a bookie holds that a metadata recovery needs (issue 18), as the records of a dump
WITH_STATE: its cookie, each ledger it holds with its availability, fenced flag, LAC, master
key and metadata copy, then each ledger it deleted under a tombstone and still remembers.
A ledger without a metadata copy also gets the digest type its first readable entry tells,
since nothing else records it; the entries of a ledger with one are not read (the copy names
its digest type), which keeps the dump cheap. A ledger in limbo (its directory failed,
or the journal was damaged) is flagged: what the bookie does not hold of it is unknown.

The same records answer a running bookie's dump and make the offline export of a stopped
one's files, so that both say the same of the same files."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from tally.bookie.ledger_directories import BookieStorage
from tally.core.availability import EntryAvailability
from tally.core.digest import DigestType
from tally.core.entry_format import stored_digest_type
from tally.core.errors import NoSuchLedger, TallyError
from tally.core.ids import LedgerId
from tally.core.protocol import StateRecord

DIGEST_READS = 3
"""Entries read at most to learn a ledger's digest type: the first held that reads and is an
entry tells it; a corrupt or unreadable one is passed over for the next."""


def state_records(storage: BookieStorage, cookie: bytes) -> Iterator[StateRecord]:
    """The records, lazily: ledgers ascending, read one at a time (bounded memory)."""
    yield StateRecord.cookie_of(cookie)
    limbo = storage.limbo_ledgers()
    for ledger_id, held in storage.iter_availability():
        try:
            info = storage.ledger_info(ledger_id)
            master_key = storage.master_key(ledger_id)
            copy = storage.metadata_copy(ledger_id)
        except NoSuchLedger:
            continue  # deleted meanwhile
        told = None if copy is not None else _entries_digest_type(storage, ledger_id, held)
        yield StateRecord.held(
            ledger_id,
            held.to_bytes(),
            fenced=info.fenced,
            last_add_confirmed=info.last_add_confirmed,
            master_key=master_key,
            metadata_copy=copy,
            digest_type=told,
            in_limbo=ledger_id in limbo,
        )
    for ledger_id, deleted in sorted(storage.deleted_ledgers().items()):
        yield StateRecord.deleted(ledger_id, deleted.deleted_ms)


def _entries_digest_type(
    storage: BookieStorage, ledger_id: LedgerId, held: EntryAvailability
) -> DigestType | None:
    """The digest type the ledger's stored entries tell (`stored_digest_type`), from the
    first of them that reads; None if none of the first `DIGEST_READS` does, or it does not
    tell (a V1 entry of an HMAC or DUMMY ledger)."""
    for entry_id in itertools.islice(held, DIGEST_READS):
        try:
            _, data = storage.get_entry(ledger_id, entry_id)
            return stored_digest_type(data)
        except TallyError:
            continue  # corrupt, unreadable, no entry at all, or gone meanwhile
    return None
