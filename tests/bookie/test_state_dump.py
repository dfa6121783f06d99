"""What a bookie's dump WITH_STATE says of a ledger without a metadata copy (issue 18): the
digest type its first readable entry tells, read from real storage; nothing for a ledger
with a copy, which names it. And a ledger in limbo, flagged."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tally.bookie.entry_log import RECORD_HEADER_SIZE
from tally.bookie.ledger_storage import LedgerStorage
from tally.bookie.state_dump import DIGEST_READS, state_records
from tally.core.digest import DigestType, crc32c, mac_key
from tally.core.entry_format import EntryFormat, encode_entry
from tally.core.ids import LedgerId
from tally.core.protocol import StateKind
from tests.bookie.test_scrubber import flip_entry, opened
from tests.support.ledgers import rotating_ledger

MASTER_KEY = bytes(range(32))
ENTRIES = 5
CASES = list(itertools.product(DigestType, EntryFormat))


def told(digest_type: DigestType, format: EntryFormat) -> DigestType | None:
    """V2 names its digest type; of V1, a bookie can check CRC32C and CRC32 only."""
    checkable = digest_type in (DigestType.CRC32C, DigestType.CRC32)
    return digest_type if format is EntryFormat.V2 or checkable else None


def store(
    storage: LedgerStorage,
    ledger_id: LedgerId,
    digest_type: DigestType = DigestType.CRC32,
    format: EntryFormat = EntryFormat.V1,
) -> None:
    storage.set_master_key(ledger_id, MASTER_KEY)
    length = 0
    for entry_id in range(ENTRIES):
        payload = b"entry %d of %s " % (entry_id, ledger_id.qualified_name.encode()) * 20
        length += len(payload)
        raw = encode_entry(
            ledger_id, entry_id, entry_id - 1, length, payload, digest_type, mac_key(b"pw"), format
        )
        storage.add_entry(ledger_id, entry_id, crc32c(raw), raw, entry_id - 1)


def digest_types(storage: LedgerStorage) -> dict[LedgerId, DigestType | None]:
    return {
        record.ledger_id: record.digest_type
        for record in state_records(storage, b"cookie")
        if record.kind is StateKind.LEDGER
    }


def test_a_ledger_without_a_copy_gets_the_digest_type_its_entries_tell(tmp_path: Path) -> None:
    storage = opened(tmp_path / "bookie")
    try:
        ledgers = {LedgerId(0, number): case for number, case in enumerate(CASES, start=1)}
        for ledger_id, (digest_type, format) in ledgers.items():
            store(storage, ledger_id, digest_type, format)
        storage.checkpoint(b"mark")
        assert digest_types(storage) == {
            ledger_id: told(*case) for ledger_id, case in ledgers.items()
        }
    finally:
        storage.close()


def test_a_ledger_with_a_copy_is_not_read(tmp_path: Path) -> None:
    storage = opened(tmp_path / "bookie")
    try:
        ledger_id = LedgerId(0, 1)
        store(storage, ledger_id)
        storage.set_metadata_copy(ledger_id, rotating_ledger(1, 1, 1, [], None).to_bytes())
        reads = storage.stats().entries_read
        assert digest_types(storage) == {ledger_id: None}
        assert storage.stats().entries_read == reads
    finally:
        storage.close()


@pytest.mark.parametrize(
    ("corrupt", "expected"),
    [(1, DigestType.CRC32), (DIGEST_READS, None)],
    ids=["the next entry tells", "too many corrupt: unknown"],
)
def test_corrupt_entries_are_passed_over_for_the_next(
    tmp_path: Path, corrupt: int, expected: DigestType | None
) -> None:
    ledger_id = LedgerId(0, 1)
    storage = opened(tmp_path / "bookie")
    store(storage, ledger_id)
    storage.checkpoint(b"mark")
    storage.close()
    storage = opened(tmp_path / "bookie")
    try:
        for entry_id in range(corrupt):
            flip_entry(storage, ledger_id, entry_id, within=RECORD_HEADER_SIZE + 50)
        assert digest_types(storage) == {ledger_id: expected}
    finally:
        storage.close()


def test_a_ledger_in_limbo_is_flagged(tmp_path: Path) -> None:
    """Its directory failed, or the journal was damaged: what the bookie lacks of it is
    unknown to a metadata recovery, not lost."""
    storage = opened(tmp_path / "bookie")
    try:
        kept, doubtful = LedgerId(0, 1), LedgerId(0, 2)
        store(storage, kept)
        store(storage, doubtful)
        storage.enter_limbo([doubtful])
        flagged = {
            record.ledger_id: record.in_limbo
            for record in state_records(storage, b"cookie")
            if record.kind is StateKind.LEDGER
        }
        assert flagged == {kept: False, doubtful: True}
    finally:
        storage.close()
