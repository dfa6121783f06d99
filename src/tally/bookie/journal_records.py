"""What a bookie writes to its journal, and how a replay applies it to ledger storage.

Everything a bookie acknowledges must survive a crash until the next checkpoint has put it
in ledger storage: entries, the master key the first writer fixed, fences (a fence that a
restart forgot would let an old writer slip past recovery), explicit LACs and the ledgers'
metadata copies (kept for metadata recovery: core/metadata_copies.py). Each is one
journal record; replaying the journal after the last checkpoint re-applies them, and
every application is idempotent, so replaying twice is harmless.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tally.bookie.journal import Journal
from tally.bookie.journal_entries import ENTRY_HEAD, RecordType, kept_location
from tally.bookie.journal_format import Damage, JournalMark
from tally.bookie.ledger_directories import BookieStorage
from tally.core.digest import MASTER_KEY_SIZE
from tally.core.errors import BadDigest, BadRequest, MalformedData
from tally.core.ids import LedgerId
from tally.core.limbo import ledgers_to_limbo

_LEDGER = struct.Struct(">BQQ")  # type, scope, ledger
_MASTER_KEY = struct.Struct(f">BQQ{MASTER_KEY_SIZE}s")
_EXPLICIT_LAC = struct.Struct(">BQQq")


def entry_record(
    ledger_id: LedgerId, entry_id: int, last_add_confirmed: int, crc32c: int, entry: bytes
) -> bytes:
    return entry_record_head(ledger_id, entry_id, last_add_confirmed, crc32c) + entry


def entry_record_head(
    ledger_id: LedgerId, entry_id: int, last_add_confirmed: int, crc32c: int
) -> bytes:
    """An entry record without its entry bytes, which follow it: the bookie journals the two
    apart (`Journal.append_then`) rather than copy every entry into a record."""
    return ENTRY_HEAD.pack(
        RecordType.ENTRY, ledger_id.scope, ledger_id.id, entry_id, last_add_confirmed, crc32c
    )


def master_key_record(ledger_id: LedgerId, master_key: bytes) -> bytes:
    return _MASTER_KEY.pack(RecordType.MASTER_KEY, ledger_id.scope, ledger_id.id, master_key)


def fence_record(ledger_id: LedgerId) -> bytes:
    return _LEDGER.pack(RecordType.FENCE, ledger_id.scope, ledger_id.id)


def explicit_lac_record(ledger_id: LedgerId, last_add_confirmed: int) -> bytes:
    return _EXPLICIT_LAC.pack(
        RecordType.EXPLICIT_LAC, ledger_id.scope, ledger_id.id, last_add_confirmed
    )


def metadata_copy_record(ledger_id: LedgerId, copy: bytes) -> bytes:
    """The ledger's metadata copy (LedgerMetadata bytes) follows the ledger's id."""
    return _LEDGER.pack(RecordType.METADATA_COPY, ledger_id.scope, ledger_id.id) + copy


def apply(record: bytes, storage: BookieStorage, kept_at: JournalMark | None = None) -> LedgerId:
    """Re-apply one journal record to `storage` (at start-up, after the last checkpoint);
    returns the ledger it is about.

    With `kept_at`, the mark of the record's end, an entry of at least KEPT_ENTRY_SIZE
    bytes is left where the journal holds it (`LedgerStorage.keep_in_journal`).

    MalformedData for a record that does not decode, including one that decodes to what
    storage refuses: an entry record carries no length, so a cut one shows only as entry
    bytes that fail their CRC32C, and impossible ids are no record the bookie wrote.
    """
    if not record:
        raise MalformedData("empty journal record")
    kind = record[0]
    try:
        if kind == RecordType.ENTRY:
            _, scope, ledger, entry_id, lac, crc = ENTRY_HEAD.unpack_from(record)
            ledger_id = LedgerId(scope, ledger)
            data = memoryview(record)[ENTRY_HEAD.size :]
            storage.add_entry(ledger_id, entry_id, crc, data, lac)
            location = kept_location(kept_at, len(data), crc) if kept_at else None
            if location is not None:
                storage.keep_in_journal(ledger_id, entry_id, location)
        elif kind == RecordType.MASTER_KEY:
            _, scope, ledger, key = _MASTER_KEY.unpack(record)
            ledger_id = LedgerId(scope, ledger)
            storage.set_master_key(ledger_id, key)
        elif kind == RecordType.FENCE:
            _, scope, ledger = _LEDGER.unpack(record)
            ledger_id = LedgerId(scope, ledger)
            storage.set_fenced(ledger_id)
        elif kind == RecordType.EXPLICIT_LAC:
            _, scope, ledger, lac = _EXPLICIT_LAC.unpack(record)
            ledger_id = LedgerId(scope, ledger)
            storage.set_explicit_lac(ledger_id, lac)
        elif kind == RecordType.METADATA_COPY:
            _, scope, ledger = _LEDGER.unpack_from(record)
            ledger_id = LedgerId(scope, ledger)
            storage.set_metadata_copy(ledger_id, bytes(record[_LEDGER.size :]))
        else:
            raise MalformedData(f"journal record of unknown type {kind}")
    except struct.error as error:
        raise MalformedData(
            f"journal record of type {kind} has {len(record)} bytes: {error}"
        ) from None
    except MalformedData:
        raise
    except (BadDigest, BadRequest) as error:
        raise MalformedData(
            f"journal record of type {kind} ({len(record)} bytes) does not apply: {error}"
        ) from None
    return ledger_id


@dataclass(frozen=True, slots=True)
class Replayed:
    """What a replay applied, and what it found damaged."""

    records: int
    damage: list[Damage]
    limbo: set[LedgerId]
    """The ledgers that may have lost records to the damage: now in limbo (limbo.py)."""


def replay_into(journal: Journal, storage: BookieStorage, *, keeps_entries: bool) -> Replayed:
    """Re-apply the journal after the storage's last checkpoint (before `journal.start`);
    the ledgers that damage in it may have cost records go into limbo."""
    mark_bytes = storage.last_checkpoint_mark()
    start = JournalMark.from_bytes(mark_bytes) if mark_bytes else None
    count = 0
    ledgers_by_file: dict[int, set[LedgerId]] = {}
    for mark, record in journal.replay(start):
        ledger_id = apply(record, storage, mark if keeps_entries else None)
        ledgers_by_file.setdefault(mark.file_id, set()).add(ledger_id)
        count += 1
    damage = list(journal.damage)
    limbo: set[LedgerId] = set()
    if damage:
        limbo = set(
            ledgers_to_limbo({d.file_id for d in damage}, ledgers_by_file, storage.known_ledgers)
        )
        storage.enter_limbo(limbo)
    return Replayed(count, damage, limbo)
