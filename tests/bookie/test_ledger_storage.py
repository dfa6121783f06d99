"""Ledger storage: the write cache, checkpoints, per-ledger state, and what survives a crash."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from tally.bookie.ledger_storage import LAST_ENTRY, LedgerStorage
from tally.core.availability import EntryAvailability
from tally.core.digest import crc32c
from tally.core.errors import (
    BadDigest,
    BadRequest,
    EntryUnreadable,
    IllegalOperation,
    LedgerInLimbo,
    NoSuchEntry,
    NoSuchLedger,
    TallyError,
    Unauthorized,
    WriteFailed,
)
from tally.core.ids import LedgerId
from tally.core.protocol import KEEP_IN_PLACE, LedgerInfo

L1 = LedgerId(0, 1)
L2 = LedgerId(5, 2)
KEY = bytes(range(32))


def body(ledger_id: LedgerId, entry_id: int, version: int = 0) -> bytes:
    """Deterministic entry bytes; sizes vary with the entry id, from 1 byte (an entry holds
    at least its header: ledger storage refuses empty ones)."""
    stamp = f"{ledger_id.qualified_name}/{entry_id}/{version};".encode()
    return (stamp * (entry_id % 37 + 1))[: (entry_id * 13 + version * 7) % 300 + 1]


def add(
    storage: LedgerStorage, ledger_id: LedgerId, entry_id: int, lac: int = -1, version: int = 0
) -> bytes:
    data = body(ledger_id, entry_id, version)
    storage.add_entry(ledger_id, entry_id, crc32c(data), data, lac)
    return data


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[LedgerStorage]:
    opened = LedgerStorage(tmp_path / "bookie", log_size_limit=16 << 10)
    yield opened
    opened.close()


def reopen(storage: LedgerStorage) -> LedgerStorage:
    storage.close()
    return LedgerStorage(storage.directory, log_size_limit=16 << 10)


def test_entries_read_back_from_the_cache_after_a_checkpoint_and_after_reopen(
    storage: LedgerStorage,
) -> None:
    written = {
        (ledger_id, e): add(storage, ledger_id, e) for ledger_id in (L1, L2) for e in range(60)
    }
    assert storage.last_checkpoint_mark() is None
    for (ledger_id, entry_id), data in written.items():
        assert storage.get_entry(ledger_id, entry_id) == (crc32c(data), data)
    storage.checkpoint(b"mark-1")
    assert storage.stats().cache_entries == 0
    for (ledger_id, entry_id), data in written.items():
        assert storage.get_entry(ledger_id, entry_id) == (crc32c(data), data)
    storage = reopen(storage)
    assert storage.last_checkpoint_mark() == b"mark-1"
    for (ledger_id, entry_id), data in written.items():
        assert storage.get_entry(ledger_id, entry_id) == (crc32c(data), data)
    assert storage.ledger_info(L1) == LedgerInfo(
        False, -1, 60, sum(len(body(L1, e)) for e in range(60))
    )
    storage.close()


def test_a_lost_index_is_refused_rather_than_started_empty(storage: LedgerStorage) -> None:
    add(storage, L1, 0)
    storage.checkpoint(b"m")
    storage.close()
    shutil.rmtree(storage.directory / "index")
    with pytest.raises(IllegalOperation, match="entry logs but no index"):
        LedgerStorage(storage.directory)
    assert not (storage.directory / "index").exists()


def test_a_short_view_is_copied_and_a_long_one_kept(storage: LedgerStorage) -> None:
    """A view keeps its whole buffer alive; a short entry is not worth that."""
    short, long = b"s" * (KEEP_IN_PLACE - 1), b"l" * KEEP_IN_PLACE
    buffer = bytearray(b"head" + short + long)
    storage.add_entry(L1, 0, crc32c(short), memoryview(buffer)[4 : 4 + len(short)], -1)
    storage.add_entry(L1, 1, crc32c(long), memoryview(buffer)[4 + len(short) :], 0)
    stored_short, stored_long = storage.get_entry(L1, 0)[1], storage.get_entry(L1, 1)[1]
    assert type(stored_short) is bytes
    assert stored_short == short
    assert type(stored_long) is memoryview
    assert stored_long.obj is buffer


def test_an_add_whose_crc_does_not_match_is_refused(storage: LedgerStorage) -> None:
    with pytest.raises(BadDigest, match="client sent 0x00000001"):
        storage.add_entry(L1, 0, 1, b"abc", -1)
    with pytest.raises(NoSuchLedger):
        storage.get_entry(L1, 0)


class NewEntry(NamedTuple):
    entry_id: int
    crc32c: int
    entry: bytes
    last_add_confirmed: int


def test_a_run_of_adds_stores_the_good_and_tells_each_refusal_once_they_are_stored(
    storage: LedgerStorage,
) -> None:
    good = [NewEntry(e, crc32c(body(L1, e)), body(L1, e), e - 1) for e in range(3)]
    bad = NewEntry(3, crc32c(body(L1, 3)) ^ 1, body(L1, 3), 2)
    told: list[tuple[int, str, bool]] = []

    def refused(entry: NewEntry, error: TallyError) -> None:
        stored_then = storage.get_entry(L1, 2) == (good[2].crc32c, good[2].entry)
        told.append((entry.entry_id, type(error).__name__, stored_then))

    assert storage.add_entries(L1, [good[0], bad, good[1], good[2]], refused) == good
    assert told == [(3, "BadDigest", True)]  # told after the good ones were stored
    for entry in good:
        assert storage.get_entry(L1, entry.entry_id) == (entry.crc32c, entry.entry)
    assert storage.last_add_confirmed(L1) == 1


def test_a_run_counts_each_add_and_piggybacks_its_highest_lac(storage: LedgerStorage) -> None:
    """Not the last LAC of the run: adds of one receive may come out of order."""
    run = [NewEntry(e, crc32c(body(L1, e)), body(L1, e), lac) for e, lac in [(6, 5), (4, 3)]]
    before = storage.stats()
    assert storage.add_entries(L1, run, lambda entry, error: None) == run
    after = storage.stats()
    assert after.entries_added - before.entries_added == 2
    assert after.bytes_added - before.bytes_added == sum(len(entry.entry) for entry in run)
    assert storage.last_add_confirmed(L1) == 5


def test_a_run_whose_every_add_is_refused_leaves_no_ledger(storage: LedgerStorage) -> None:
    bad = [NewEntry(e, crc32c(body(L2, e)) ^ 1, body(L2, e), e - 1) for e in range(2)]
    told: list[int] = []
    assert storage.add_entries(L2, bad, lambda entry, _: told.append(entry.entry_id)) == []
    assert told == [0, 1]
    with pytest.raises(NoSuchLedger):
        storage.availability(L2)
    storage.checkpoint(b"m")
    reopened = reopen(storage)
    try:
        with pytest.raises(NoSuchLedger):
            reopened.availability(L2)
    finally:
        reopened.close()


def test_bit_rot_on_disk_is_entry_unreadable(storage: LedgerStorage) -> None:
    data = add(storage, L1, 40)
    add(storage, L1, 41)
    storage.checkpoint(b"m")
    [log] = (storage.directory / "logs").glob("*.log")
    raw = log.read_bytes()
    at = raw.index(data) + 7
    with open(log, "r+b") as file:
        file.seek(at)
        file.write(bytes([raw[at] ^ 0x10]))
    with pytest.raises(EntryUnreadable, match="CRC32C") as raised:
        storage.get_entry(L1, 40)
    assert not isinstance(raised.value, NoSuchEntry)
    assert storage.get_entry(L1, 41)[1] == body(L1, 41)
    assert storage.stats().read_errors == 1
    # a replacing re-add (the replication worker's repair) makes it readable again
    add(storage, L1, 40)
    storage.checkpoint(b"m2")
    assert storage.get_entry(L1, 40)[1] == data


def test_a_lost_log_file_is_entry_unreadable_never_no_such_entry(
    storage: LedgerStorage,
) -> None:
    for entry_id in range(5):
        add(storage, L1, entry_id)
    storage.checkpoint(b"m")
    storage = reopen(storage)
    for log in (storage.directory / "logs").glob("*.log"):
        log.unlink()
    for entry_id in (0, 4, LAST_ENTRY):
        with pytest.raises(EntryUnreadable, match="cannot open the log"):
            storage.get_entry(L1, entry_id)
    with pytest.raises(NoSuchEntry):
        storage.get_entry(L1, 5)
    assert len(storage.availability(L1)) == 5, "availability comes from the index"
    storage.close()


def test_no_such_ledger_and_no_such_entry(storage: LedgerStorage) -> None:
    for entry_id in (0, LAST_ENTRY):
        with pytest.raises(NoSuchLedger):
            storage.get_entry(L1, entry_id)
    for query in (
        storage.ledger_info,
        storage.availability,
        storage.is_fenced,
        storage.master_key,
        storage.last_add_confirmed,
    ):
        with pytest.raises(NoSuchLedger):
            query(L1)
    storage.set_master_key(L1, KEY)
    with pytest.raises(NoSuchEntry):
        storage.get_entry(L1, 0)
    with pytest.raises(NoSuchEntry, match="no entries"):
        storage.get_entry(L1, LAST_ENTRY)
    add(storage, L1, 3)
    with pytest.raises(NoSuchEntry):
        storage.get_entry(L1, 2)
    storage.checkpoint(b"m")
    with pytest.raises(NoSuchEntry):
        storage.get_entry(L1, 4)
    for bad in (-2, 2**63, True):
        with pytest.raises(BadRequest):
            storage.get_entry(L1, bad)
    with pytest.raises(BadRequest, match="LAC -2"):
        storage.add_entry(L1, 0, 0, b"x", -2)
    for bad in (-1, 2**63, True):
        with pytest.raises(BadRequest, match="entry id"):
            storage.add_entry(L1, bad, 0, b"x", 0)
    with pytest.raises(BadRequest, match="empty"):
        storage.add_entry(L1, 0, 0, b"", 0)
    with pytest.raises(BadRequest, match="LedgerId"):
        storage.get_entry(1, 0)  # type: ignore[arg-type]


def test_reading_the_last_entry(storage: LedgerStorage) -> None:
    add(storage, L1, 5)
    assert storage.get_entry(L1, LAST_ENTRY)[1] == body(L1, 5)
    storage.checkpoint(b"m")
    add(storage, L1, 3)
    assert storage.get_entry(L1, LAST_ENTRY)[1] == body(L1, 5), "indexed 5 beats cached 3"
    add(storage, L1, 9)
    assert storage.get_entry(L1, LAST_ENTRY)[1] == body(L1, 9)
    storage.checkpoint(b"m")
    assert storage.get_entry(L1, LAST_ENTRY)[1] == body(L1, 9)


def test_master_key_rules(storage: LedgerStorage) -> None:
    storage.set_master_key(L1, KEY)
    storage.set_master_key(L1, KEY)
    with pytest.raises(Unauthorized, match="master key"):
        storage.set_master_key(L1, bytes(32))
    for bad in (b"short", bytearray(KEY)):
        with pytest.raises(BadRequest, match="32 bytes"):
            storage.set_master_key(L2, bad)  # type: ignore[arg-type]
    storage.checkpoint(b"m")
    storage = reopen(storage)
    assert storage.master_key(L1) == KEY
    with pytest.raises(Unauthorized):
        storage.set_master_key(L1, b"\x01" * 32)
    storage.close()


def test_fencing_an_unknown_ledger_records_the_fence(storage: LedgerStorage) -> None:
    assert storage.set_fenced(L2) is False
    assert storage.set_fenced(L2) is True
    assert storage.is_fenced(L2)
    assert storage.master_key(L2) is None
    assert storage.ledger_info(L2) == LedgerInfo(True, -1, 0, 0)
    assert storage.availability(L2) == EntryAvailability.empty()
    storage.set_master_key(L2, KEY)
    storage.checkpoint(b"m")
    storage = reopen(storage)
    assert storage.is_fenced(L2)
    assert storage.set_fenced(L2) is True
    assert storage.master_key(L2) == KEY
    assert not storage.set_fenced(L1)
    storage.close()


def test_lac_is_the_max_of_piggybacked_and_explicit(storage: LedgerStorage) -> None:
    add(storage, L1, 0, lac=-1)
    assert storage.last_add_confirmed(L1) == -1
    add(storage, L1, 5, lac=3)
    add(storage, L1, 4, lac=2)
    assert storage.last_add_confirmed(L1) == 3
    storage.set_explicit_lac(L1, 7)
    storage.set_explicit_lac(L1, 6)
    assert storage.last_add_confirmed(L1) == 7
    add(storage, L1, 10, lac=9)
    assert storage.last_add_confirmed(L1) == 9
    storage.checkpoint(b"m")
    storage.set_explicit_lac(L2, 4)
    assert storage.last_add_confirmed(L2) == 4
    storage.checkpoint(b"m")
    storage = reopen(storage)
    assert storage.last_add_confirmed(L1) == 9
    assert storage.ledger_info(L1).last_add_confirmed == 9
    assert storage.last_add_confirmed(L2) == 4
    storage.close()


def test_a_re_add_replaces_and_is_counted_once(storage: LedgerStorage) -> None:
    add(storage, L1, 20)
    add(storage, L1, 20)
    new = add(storage, L1, 20, version=1)
    assert storage.get_entry(L1, 20)[1] == new
    assert storage.ledger_info(L1) == LedgerInfo(False, -1, 1, len(new))
    storage.checkpoint(b"m")
    newer = add(storage, L1, 20, version=22)
    assert len(newer) != len(new)
    assert storage.ledger_info(L1) == LedgerInfo(False, -1, 1, len(newer)), "cache over index"
    storage.checkpoint(b"m")
    assert storage.get_entry(L1, 20)[1] == newer
    assert storage.ledger_info(L1) == LedgerInfo(False, -1, 1, len(newer))
    add(storage, L1, 2)  # below the highest indexed entry: counted after an index lookup
    storage.checkpoint(b"m")
    assert storage.ledger_info(L1) == LedgerInfo(False, -1, 2, len(newer) + len(body(L1, 2)))
    assert storage.stats().entries_added == 5


def test_availability_merges_index_and_cache_and_forgotten_entries_are_missing(
    storage: LedgerStorage,
) -> None:
    for entry_id in range(0, 30, 3):
        add(storage, L1, entry_id)
    storage.checkpoint(b"m")
    for entry_id in range(1, 30, 3):
        add(storage, L1, entry_id)
    add(storage, L1, 0)
    expected = sorted({*range(0, 30, 3), *range(1, 30, 3)})
    assert list(storage.availability(L1)) == expected
    forgotten = storage.forget_entries(L1, [0, 1, 3, 99])
    assert forgotten == 3, "0 (cache and index), 1 (cache), 3 (index); 99 was never held"
    expected = [e for e in expected if e not in (0, 1, 3)]
    assert list(storage.availability(L1)) == expected
    for entry_id in (0, 1, 3):
        with pytest.raises(NoSuchEntry):
            storage.get_entry(L1, entry_id)
    assert storage.ledger_info(L1).entry_count == len(expected)
    storage.checkpoint(b"m")
    storage = reopen(storage)
    assert list(storage.availability(L1)) == expected
    info = storage.ledger_info(L1)
    assert info.entry_count == len(expected)
    assert info.byte_count == sum(len(body(L1, e)) for e in expected)
    with pytest.raises(NoSuchLedger):
        storage.forget_entries(L2, [1])
    storage.close()


def test_a_ledger_in_limbo_never_answers_no_such_entry_and_stays_there_across_a_reopen(
    storage: LedgerStorage,
) -> None:
    held = {e: add(storage, L1, e) for e in (0, 2)}
    storage.enter_limbo([L1, L2])
    assert storage.limbo_ledgers() == {L1, L2}
    # a repair's add of an entry a ledger in limbo lacks is written, not refused
    assert not storage.holds_intact(L1, 1, crc32c(body(L1, 1)))
    assert not storage.holds_intact(L2, 0, 0)
    assert storage.is_fenced(L1)
    assert storage.is_fenced(L2), "a ledger the bookie knew nothing of is fenced all the same"
    for _ in range(2):
        for entry_id, data in held.items():
            assert storage.get_entry(L1, entry_id) == (crc32c(data), data)
        for entry_id in (1, 3, 10**6):
            with pytest.raises(LedgerInLimbo):
                storage.get_entry(L1, entry_id)
        with pytest.raises(LedgerInLimbo):
            storage.get_entry(L2, 0)
        with pytest.raises(LedgerInLimbo):
            storage.get_entry(L2, LAST_ENTRY)
        assert storage.get_entry(L1, LAST_ENTRY)[1] == held[2]
        assert storage.availability(L1) == EntryAvailability.from_entries([0, 2])
        assert storage.availability(L2) == EntryAvailability.empty()
        storage.checkpoint(b"mark")
        storage = reopen(storage)
        assert storage.limbo_ledgers() == {L1, L2}
        assert storage.is_fenced(L1)
        # a normal add is refused as a failed write (its writer changes ensemble), across
        # a restart too, not as fenced (its writer would stop)
        assert storage.ledger_access(L1).lost
        assert storage.ledger_access(L2).lost
    storage.leave_limbo(L1)
    assert not storage.ledger_access(L1).lost
    assert storage.ledger_access(L1).fenced
    with pytest.raises(NoSuchEntry):
        storage.get_entry(L1, 1)
    storage.checkpoint(b"mark")
    storage = reopen(storage)
    assert storage.limbo_ledgers() == {L2}
    storage.delete_ledger(L2)
    assert storage.limbo_ledgers() == frozenset()
    storage = reopen(storage)
    assert storage.limbo_ledgers() == frozenset()
    with pytest.raises(NoSuchLedger):
        storage.get_entry(L2, 0)
    storage.close()


def test_limbo_is_written_again_after_a_failed_checkpoint(
    storage: LedgerStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage.enter_limbo([L1])
    original = storage._index.write

    def failing(batch: object) -> None:
        raise WriteFailed("disk gone")

    monkeypatch.setattr(storage._index, "write", failing)
    with pytest.raises(WriteFailed):
        storage.checkpoint(b"mark-1")
    monkeypatch.setattr(storage._index, "write", original)
    storage.checkpoint(b"mark-2")
    storage = reopen(storage)
    assert storage.limbo_ledgers() == {L1}
    storage.close()


def test_delete_ledger(storage: LedgerStorage) -> None:
    for entry_id in range(10):
        add(storage, L1, entry_id)
        add(storage, L2, entry_id)
    storage.set_fenced(L1)
    storage.checkpoint(b"m")
    add(storage, L1, 10)
    storage.delete_ledger(L1)
    for query in (storage.ledger_info, storage.availability, storage.is_fenced):
        with pytest.raises(NoSuchLedger):
            query(L1)
    with pytest.raises(NoSuchLedger):
        storage.get_entry(L1, 3)
    with pytest.raises(NoSuchLedger):
        storage.delete_ledger(L1)
    assert len(storage.availability(L2)) == 10
    storage.checkpoint(b"m")
    storage = reopen(storage)
    with pytest.raises(NoSuchLedger):
        storage.get_entry(L1, 10)
    assert [ledger_id for ledger_id, _ in storage.iter_availability()] == [L2]
    add(storage, L1, 4)  # a new add makes a new ledger
    assert list(storage.availability(L1)) == [4]
    assert not storage.is_fenced(L1)
    storage.close()


def test_iter_availability_walks_every_ledger_in_order_in_batches(storage: LedgerStorage) -> None:
    ledgers = [LedgerId(scope, number) for scope in (0, 3) for number in range(1, 8)]
    expected = {}
    for position, ledger_id in enumerate(ledgers):
        entry_ids = list(range(position % 4, 40, 1 + position % 3))
        for entry_id in entry_ids:
            add(storage, ledger_id, entry_id)
        expected[ledger_id] = EntryAvailability.from_entries(entry_ids)
        if position == 6:
            storage.checkpoint(b"m")
    storage.set_fenced(LedgerId(1, 1))
    expected[LedgerId(1, 1)] = EntryAvailability.empty()
    for batch_ledgers in (1, 2, 5, 1000):
        walked = list(storage.iter_availability(batch_ledgers=batch_ledgers))
        assert [ledger_id for ledger_id, _ in walked] == sorted(expected)
        assert dict(walked) == expected
    storage.checkpoint(b"m")
    storage = reopen(storage)
    assert dict(storage.iter_availability(batch_ledgers=3)) == expected
    with pytest.raises(BadRequest):
        next(storage.iter_availability(batch_ledgers=0))
    storage.close()


def test_replaying_everything_again_changes_nothing(storage: LedgerStorage) -> None:
    def replay() -> None:
        storage.set_master_key(L1, KEY)
        for entry_id in range(25):
            add(storage, L1, entry_id, lac=max(-1, entry_id - 2))
        storage.set_explicit_lac(L1, 23)
        storage.set_fenced(L2)
        add(storage, L2, 0, lac=-1)

    replay()
    storage.checkpoint(b"first")
    before = (storage.ledger_info(L1), storage.ledger_info(L2), storage.availability(L1))
    storage = reopen(storage)
    replay()
    assert (storage.ledger_info(L1), storage.ledger_info(L2), storage.availability(L1)) == before
    storage.checkpoint(b"second")
    storage = reopen(storage)
    assert (storage.ledger_info(L1), storage.ledger_info(L2), storage.availability(L1)) == before
    assert storage.last_checkpoint_mark() == b"second"
    storage.close()


def test_a_failed_checkpoint_loses_nothing(
    storage: LedgerStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(storage, L1, 0)
    storage.checkpoint(b"good")
    for entry_id in range(1, 20):
        add(storage, L1, entry_id, lac=entry_id - 1)

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(os, "fdatasync", failing)
        with pytest.raises(WriteFailed, match="Input/output error"):
            storage.checkpoint(b"bad")
        add(storage, L1, 5, version=1)  # a newer copy arrives meanwhile
    assert storage.last_checkpoint_mark() == b"good"
    assert storage.stats().cache_entries == 19
    assert storage.get_entry(L1, 5)[1] == body(L1, 5, version=1)
    assert storage.get_entry(L1, 7)[1] == body(L1, 7)
    storage.checkpoint(b"retry")
    storage = reopen(storage)
    assert storage.last_checkpoint_mark() == b"retry"
    assert list(storage.availability(L1)) == list(range(20))
    assert storage.get_entry(L1, 5)[1] == body(L1, 5, version=1)
    expected_bytes = sum(len(body(L1, e)) for e in range(20) if e != 5) + len(body(L1, 5, 1))
    assert storage.ledger_info(L1) == LedgerInfo(False, 18, 20, expected_bytes)
    storage.close()


def test_stats(storage: LedgerStorage) -> None:
    sizes = [len(add(storage, L1, entry_id)) for entry_id in range(10)]
    storage.get_entry(L1, 3)
    stats = storage.stats()
    assert (stats.entries_added, stats.bytes_added) == (10, sum(sizes))
    assert (stats.cache_entries, stats.cache_bytes) == (10, sum(sizes))
    assert stats.entries_read == 1
    storage.checkpoint(b"m")
    stats = storage.stats()
    assert (stats.checkpoints, stats.entries_checkpointed, stats.cache_entries) == (1, 10, 0)
    assert 0 < stats.last_checkpoint_seconds <= stats.checkpoint_seconds_total


@pytest.mark.parametrize("seed", [1, 2])
def test_checkpoints_in_a_thread_while_adds_and_reads_go_on(tmp_path: Path, seed: int) -> None:
    storage = LedgerStorage(tmp_path, log_size_limit=64 << 10)
    model: dict[tuple[LedgerId, int], bytes] = {}
    stop = threading.Event()
    errors: list[BaseException] = []
    marks = 0

    def checkpointer() -> None:
        nonlocal marks
        try:
            while not stop.is_set():
                marks += 1
                storage.checkpoint(marks.to_bytes(4, "big"))
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    thread = threading.Thread(target=checkpointer)
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # many more thread switches: races show up
    thread.start()
    rng = random.Random(seed)
    ledgers = [LedgerId(rng.randrange(3), rng.randrange(1, 50)) for _ in range(6)]
    next_entry = dict.fromkeys(ledgers, 0)
    try:
        for step in range(15000):
            ledger_id = rng.choice(ledgers)
            action = rng.random()
            if action < 0.55:
                entry_id = next_entry[ledger_id]
                next_entry[ledger_id] += 1
                model[ledger_id, entry_id] = add(storage, ledger_id, entry_id, entry_id - 1)
            elif action < 0.65 and next_entry[ledger_id]:
                entry_id = rng.randrange(next_entry[ledger_id])
                version = rng.randrange(5)
                model[ledger_id, entry_id] = add(storage, ledger_id, entry_id, version=version)
            elif action < 0.98 and next_entry[ledger_id]:
                recent = rng.random() < 0.7  # most likely in a cache a checkpoint is moving
                entry_id = next_entry[ledger_id] - 1 - rng.randrange(min(next_entry[ledger_id], 30))
                if not recent:
                    entry_id = rng.randrange(next_entry[ledger_id])
                data = model[ledger_id, entry_id]
                assert storage.get_entry(ledger_id, entry_id) == (crc32c(data), data)
            elif next_entry[ledger_id]:
                assert len(storage.availability(ledger_id)) == next_entry[ledger_id]
                assert storage.ledger_info(ledger_id).entry_count == next_entry[ledger_id]
            if step % 500 == 0:
                time.sleep(0.001)  # let the checkpoint thread through now and then
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switch_interval)
    assert not errors, errors
    assert marks > 3
    storage.checkpoint(b"last")
    storage.close()
    storage = LedgerStorage(tmp_path)
    for (ledger_id, entry_id), data in model.items():
        assert storage.get_entry(ledger_id, entry_id) == (crc32c(data), data)
    for ledger_id, count in next_entry.items():
        if count:
            info = storage.ledger_info(ledger_id)
            assert info.entry_count == count
            assert info.byte_count == sum(
                len(data) for (owner, _), data in model.items() if owner == ledger_id
            )
    storage.close()


# -- crash: a child process checkpoints in a loop and is SIGKILLed --------------------

CRASH_LEDGERS = [LedgerId(0, 3), LedgerId(2, 1), LedgerId(0, 9)]
CRASH_ROUND = 60


def round_entries(round_number: int) -> Iterator[tuple[LedgerId, int]]:
    """What the child adds before checkpoint `round_number` (1, 2, ...)."""
    for ledger_id in CRASH_LEDGERS:
        for entry_id in range((round_number - 1) * CRASH_ROUND, round_number * CRASH_ROUND):
            yield ledger_id, entry_id


def crash_child(directory: Path) -> None:
    storage = LedgerStorage(directory, log_size_limit=32 << 10)
    round_number = 1
    while True:
        for ledger_id, entry_id in round_entries(round_number):
            add(storage, ledger_id, entry_id, lac=entry_id - 1)
        storage.checkpoint(round_number.to_bytes(8, "big"))
        print(round_number, flush=True)
        round_number += 1


def test_sigkill_mid_checkpoint_loop_reopens_consistent(tmp_path: Path) -> None:
    rng = random.Random(7)
    for attempt in range(2):
        directory = tmp_path / str(attempt)
        child = subprocess.Popen(
            [sys.executable, __file__, str(directory)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        reported = 0
        while reported < 4:
            line = child.stdout.readline()
            assert line, f"the child ended early with {child.wait()}"
            reported = int(line)
        time.sleep(rng.uniform(0, 0.05))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()

        storage = LedgerStorage(directory)
        mark = storage.last_checkpoint_mark()
        assert mark is not None
        done = int.from_bytes(mark, "big")
        assert done >= reported
        expected: dict[LedgerId, list[int]] = {ledger_id: [] for ledger_id in CRASH_LEDGERS}
        for round_number in range(1, done + 1):
            for ledger_id, entry_id in round_entries(round_number):
                expected[ledger_id].append(entry_id)
        for ledger_id, entry_ids in expected.items():
            assert list(storage.availability(ledger_id)) == entry_ids, "exactly the checkpoints"
            for entry_id in entry_ids:
                data = body(ledger_id, entry_id)
                assert storage.get_entry(ledger_id, entry_id) == (crc32c(data), data)
            info = storage.ledger_info(ledger_id)
            assert info.entry_count == len(entry_ids)
            assert info.last_add_confirmed == entry_ids[-1] - 1
        storage.close()


if __name__ == "__main__":
    crash_child(Path(sys.argv[1]))


def test_the_most_advanced_metadata_copy_is_kept_across_a_reopen_and_goes_with_a_delete(
    storage: LedgerStorage,
) -> None:
    from tests.support.ledgers import rotating_ledger  # this file also runs as a script

    opened = rotating_ledger(3, 2, 2, [], None).to_bytes()
    changed = rotating_ledger(3, 2, 2, [4], None).to_bytes()
    closed = rotating_ledger(3, 2, 2, [4], 9).to_bytes()
    assert storage.set_metadata_copy(L1, opened)
    assert storage.metadata_copy(L1) == opened
    storage.checkpoint(b"mark")
    assert storage.set_metadata_copy(L1, closed)
    assert not storage.set_metadata_copy(L1, changed), "an older copy arriving late"
    assert storage.metadata_copy(L1) == closed
    storage.checkpoint(b"mark")
    storage = reopen(storage)
    assert storage.metadata_copy(L1) == closed
    assert not storage.set_metadata_copy(L1, changed)
    assert storage.ledger_info(L1).entry_count == 0, "known from its copy alone"
    with pytest.raises(BadRequest, match="metadata"):
        storage.set_metadata_copy(L2, b"not metadata")
    assert storage.metadata_copy(L2) is None
    storage.delete_ledger(L1)
    storage = reopen(storage)
    assert storage.metadata_copy(L1) is None


def test_a_ledger_deleted_under_its_tombstone_is_remembered_until_forgotten(
    storage: LedgerStorage,
) -> None:
    from tally.bookie.index import DeletedLedger  # this file also runs as a script

    for ledger_id in (L1, L2):
        add(storage, ledger_id, 0)
    storage.checkpoint(b"m")
    storage.delete_ledger(L1, DeletedLedger(5_000, 100.0))
    storage.delete_ledger(L2)  # not under a tombstone (over-replication, an operator)
    storage = reopen(storage)
    assert storage.deleted_ledgers() == {L1: DeletedLedger(5_000, 100.0)}
    assert storage.forget_deleted(100.0) == 0
    assert storage.forget_deleted(100.5) == 1
    storage = reopen(storage)
    assert storage.deleted_ledgers() == {}
    storage.close()


def test_a_metadata_copy_is_written_again_after_a_failed_checkpoint(
    storage: LedgerStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.ledgers import rotating_ledger  # this file also runs as a script

    copy = rotating_ledger(3, 2, 2, [], None).to_bytes()
    storage.set_metadata_copy(L1, copy)

    def failing(batch: object) -> None:
        raise WriteFailed("disk gone")

    with monkeypatch.context() as patched:
        patched.setattr(storage._index, "write", failing)
        with pytest.raises(WriteFailed):
            storage.checkpoint(b"mark")
    storage.checkpoint(b"mark")
    storage = reopen(storage)
    assert storage.metadata_copy(L1) == copy


def test_an_entry_is_answered_without_waiting_only_from_memory_or_the_page_cache(
    storage: LedgerStorage,
) -> None:
    """`cached_entry` is what the event loop may answer with (no disk wait): the write
    cache, or an entry log's pages the page cache holds; None sends the read to a thread."""
    from tests.support.page_cache import drop_page_cache  # (a child runs this file alone)

    data = add(storage, L1, 0)
    assert storage.cached_entry(L1, 0) == (crc32c(data), data)
    storage.checkpoint(b"mark-1")
    drop_page_cache(storage.directory)
    assert storage.cached_entry(L1, 0) is None
    assert storage.get_entry(L1, 0) == (crc32c(data), data)  # waits for the disk
    assert storage.cached_entry(L1, 0) == (crc32c(data), data)  # its pages now cached
    assert storage.cached_entry(L1, 1) is None
    with pytest.raises(NoSuchEntry):
        storage.get_entry(L1, 1)


def test_a_corrupt_copy_is_never_answered_without_waiting(storage: LedgerStorage) -> None:
    """A cached page whose record fails its check is left to `get_entry`, which refuses it
    and marks it; a marked copy is not read without waiting either, even if it reads back
    intact (it stays marked until a repair writes over it)."""
    data = add(storage, L1, 0, version=3)
    storage.checkpoint(b"mark-1")
    (log,) = [p for p in storage.directory.rglob("*.log") if data in p.read_bytes()]
    content = bytearray(log.read_bytes())
    content[content.index(data)] ^= 0x01
    log.write_bytes(bytes(content))  # through the page cache: its pages now hold the flip
    assert storage.cached_entry(L1, 0) is None
    with pytest.raises(EntryUnreadable):
        storage.get_entry(L1, 0)
    content[content.index(data[1:]) - 1] ^= 0x01
    log.write_bytes(bytes(content))  # mended behind the bookie's back: still marked
    assert storage.cached_entry(L1, 0) is None
    with pytest.raises(EntryUnreadable, match="found corrupt"):
        storage.get_entry(L1, 0)
