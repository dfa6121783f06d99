"""Journal records: what the bookie journals, and how a replay re-applies it to storage."""

from __future__ import annotations

import asyncio
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.bookie import journal_records
from tally.bookie.journal import Journal
from tally.bookie.ledger_storage import LedgerStorage
from tally.core.digest import crc32c, master_key
from tally.core.errors import MalformedData, NoSuchLedger
from tally.core.ids import LedgerId
from tests.support.ledgers import rotating_ledger

KEY = master_key(b"records")
LEDGER = LedgerId(0, 42)
WIDE = LedgerId(2**64 - 1, 2**64 - 2)
PAYLOAD = b"an entry as the client encoded it"


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[LedgerStorage]:
    opened = LedgerStorage(tmp_path / "ledgers")
    yield opened
    opened.close()


def entry_record(ledger_id: LedgerId = LEDGER, entry_id: int = 3, lac: int = 2) -> bytes:
    return journal_records.entry_record(ledger_id, entry_id, lac, crc32c(PAYLOAD), PAYLOAD)


Check = Callable[[LedgerStorage], None]


def _entry_applied(storage: LedgerStorage) -> None:
    assert storage.get_entry(LEDGER, 3) == (crc32c(PAYLOAD), PAYLOAD)
    assert storage.last_add_confirmed(LEDGER) == 2


def _key_applied(storage: LedgerStorage) -> None:
    assert storage.master_key(LEDGER) == KEY


def _fence_applied(storage: LedgerStorage) -> None:
    assert storage.is_fenced(LEDGER)


def _lac_applied(storage: LedgerStorage) -> None:
    assert storage.last_add_confirmed(LEDGER) == 17


COPY = rotating_ledger(3, 2, 2, [5], None).to_bytes()


def _copy_applied(storage: LedgerStorage) -> None:
    assert storage.metadata_copy(LEDGER) == COPY


KINDS: dict[str, tuple[bytes, Check]] = {
    "entry": (entry_record(), _entry_applied),
    "master key": (journal_records.master_key_record(LEDGER, KEY), _key_applied),
    "fence": (journal_records.fence_record(LEDGER), _fence_applied),
    "explicit LAC": (journal_records.explicit_lac_record(LEDGER, 17), _lac_applied),
    "metadata copy": (journal_records.metadata_copy_record(LEDGER, COPY), _copy_applied),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_record_applies_to_storage_and_twice_changes_nothing(
    storage: LedgerStorage, kind: str
) -> None:
    record, applied = KINDS[kind]
    with pytest.raises(NoSuchLedger):
        storage.ledger_info(LEDGER)
    journal_records.apply(record, storage)
    applied(storage)
    before = storage.ledger_info(LEDGER)
    journal_records.apply(record, storage)
    applied(storage)
    assert storage.ledger_info(LEDGER) == before


def test_the_record_layouts_are_stable() -> None:
    """Journals outlive the code that wrote them: the bytes are a format."""
    ids = struct.pack(">QQ", LEDGER.scope, LEDGER.id)
    assert journal_records.fence_record(LEDGER) == b"\x03" + ids
    assert journal_records.master_key_record(LEDGER, KEY) == b"\x02" + ids + KEY
    assert journal_records.explicit_lac_record(LEDGER, 17) == b"\x04" + ids + struct.pack(">q", 17)
    assert journal_records.metadata_copy_record(LEDGER, COPY) == b"\x05" + ids + COPY
    assert entry_record() == (b"\x01" + ids + struct.pack(">qqI", 3, 2, crc32c(PAYLOAD)) + PAYLOAD)


@settings(max_examples=20, deadline=None)
@given(
    ledger_id=st.builds(LedgerId, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
    entry_id=st.integers(0, 2**63 - 1),
    lac=st.integers(-1, 2**63 - 1),
    explicit=st.integers(-1, 2**63 - 1),
    payload=st.binary(min_size=1, max_size=300),
)
def test_any_ledger_and_values_round_trip(
    ledger_id: LedgerId, entry_id: int, lac: int, explicit: int, payload: bytes
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        storage = LedgerStorage(Path(directory))
        try:
            for record in (
                journal_records.master_key_record(ledger_id, KEY),
                journal_records.entry_record(ledger_id, entry_id, lac, crc32c(payload), payload),
                journal_records.explicit_lac_record(ledger_id, explicit),
                journal_records.fence_record(ledger_id),
            ):
                journal_records.apply(record, storage)
            assert storage.get_entry(ledger_id, entry_id) == (crc32c(payload), payload)
            assert storage.master_key(ledger_id) == KEY
            assert storage.is_fenced(ledger_id)
            assert storage.last_add_confirmed(ledger_id) == max(lac, explicit)
        finally:
            storage.close()


def test_records_replayed_from_a_real_journal_rebuild_the_state(tmp_path: Path) -> None:
    written = [
        journal_records.master_key_record(WIDE, KEY),
        *(
            journal_records.entry_record(WIDE, i, i - 1, crc32c(b"%d" % i), b"%d" % i)
            for i in range(5)
        ),
        journal_records.explicit_lac_record(WIDE, 4),
        journal_records.fence_record(WIDE),
    ]

    async def journal_them() -> None:
        journal = Journal(tmp_path / "journal", preallocate_size=1 << 16)
        await journal.start()
        await asyncio.gather(*(journal.append(record) for record in written))
        await journal.close()

    asyncio.run(journal_them())
    replayed = [bytes(record) for _, record in Journal(tmp_path / "journal").replay()]
    assert replayed == written
    storage = LedgerStorage(tmp_path / "ledgers")
    try:
        for record in replayed:
            journal_records.apply(record, storage)
        assert [storage.get_entry(WIDE, i)[1] for i in range(5)] == [b"%d" % i for i in range(5)]
        assert storage.last_add_confirmed(WIDE) == 4
        assert storage.is_fenced(WIDE)
        assert storage.ledger_access(WIDE).master_key == KEY
    finally:
        storage.close()


# --- records that do not decode -------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_record_cut_anywhere_or_extended_is_malformed(storage: LedgerStorage, kind: str) -> None:
    record, _ = KINDS[kind]
    for cut in range(len(record)):
        with pytest.raises(MalformedData):
            journal_records.apply(record[:cut], storage)
    with pytest.raises(MalformedData):
        journal_records.apply(record + b"\x00", storage)
    with pytest.raises(NoSuchLedger):  # nothing of a refused record reached storage
        storage.ledger_info(LEDGER)


@pytest.mark.parametrize("kind", [0, 6, 0x7F, 0x80, 0xFF])
def test_an_unknown_record_type_is_malformed(storage: LedgerStorage, kind: int) -> None:
    with pytest.raises(MalformedData, match=f"unknown type {kind}"):
        journal_records.apply(bytes([kind]) + journal_records.fence_record(LEDGER)[1:], storage)


def test_impossible_values_are_malformed(storage: LedgerStorage) -> None:
    for record in (
        journal_records.entry_record(LEDGER, -3, 2, crc32c(PAYLOAD), PAYLOAD),
        journal_records.entry_record(LEDGER, 3, -2, crc32c(PAYLOAD), PAYLOAD),
        journal_records.explicit_lac_record(LEDGER, -5),
    ):
        with pytest.raises(MalformedData, match="does not apply"):
            journal_records.apply(record, storage)
    with pytest.raises(NoSuchLedger):
        storage.ledger_info(LEDGER)
