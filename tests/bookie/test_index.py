"""The RocksDB index: locations, ordered scans, ledger states, range deletes, read-only opens."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rocksdict
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.bookie.entry_log import Location
from tally.bookie.index import CorruptMark, FoundBy, Index, LedgerData, ScrubProgress
from tally.bookie.journal_entries import JournalLocation
from tally.core.compaction import CompactionTimes, FileKind
from tally.core.errors import BadRequest, EntryUnreadable, IllegalOperation, WriteFailed
from tally.core.ids import UINT64_MAX, LedgerId
from tally.core.scrub import ScrubPass, ScrubTrigger
from tests.support.raw_index import index_families

MAX_ENTRY = 2**63 - 1
EDGE_LEDGERS = [
    LedgerId(0, 0),
    LedgerId(0, 1),
    LedgerId(0, UINT64_MAX),
    LedgerId(1, 0),
    LedgerId(UINT64_MAX, UINT64_MAX - 1),
    LedgerId(UINT64_MAX, UINT64_MAX),
]


def location_of(ledger_id: LedgerId, entry_id: int) -> Location:
    """A location that is a function of its key, so every read back can be checked."""
    return Location((ledger_id.id + entry_id) % 2**32, (ledger_id.scope ^ entry_id) % 2**64, 99)


def put(index: Index, entries: dict[LedgerId, list[int]]) -> None:
    batch = index.batch()
    for ledger_id, entry_ids in entries.items():
        batch.put_ledger_data(ledger_id, LedgerData(entry_count=len(entry_ids)))
        for entry_id in entry_ids:
            batch.put_location(ledger_id, entry_id, location_of(ledger_id, entry_id))
    index.write(batch)


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    opened = Index(tmp_path / "index")
    yield opened
    opened.close()


def test_locations_round_trip_at_the_edges_of_every_id(index: Index) -> None:
    entries = {ledger_id: [0, 1, 2, MAX_ENTRY - 1, MAX_ENTRY] for ledger_id in EDGE_LEDGERS}
    put(index, entries)
    for ledger_id, entry_ids in entries.items():
        for entry_id in entry_ids:
            assert index.location(ledger_id, entry_id) == location_of(ledger_id, entry_id)
        assert index.location(ledger_id, 3) is None
        assert index.last_entry(ledger_id) == MAX_ENTRY
        ids = index.entries_of(ledger_id)
        assert ids.dtype == np.int64
        assert ids.tolist() == entry_ids
    assert index.location(LedgerId(0, 2), 0) is None
    assert index.last_entry(LedgerId(0, 2)) is None
    assert index.entries_of(LedgerId(0, 2)).size == 0
    assert list(index.ledgers()) == EDGE_LEDGERS
    assert list(index.ledgers(after=LedgerId(0, 1))) == EDGE_LEDGERS[2:]
    assert list(index.ledgers(after=EDGE_LEDGERS[-1])) == []


def test_entries_of_a_big_ledger_comes_back_sorted_in_chunks(index: Index) -> None:
    ledger_id = LedgerId(0, 9)
    wanted = list(range(0, 300_000, 3))
    batch = index.batch()
    for entry_id in reversed(wanted):
        batch.put_location(ledger_id, entry_id, Location(1, 2, 3))
    batch.put_location(LedgerId(0, 10), 1, Location(1, 2, 3))
    batch.put_location(LedgerId(0, 8), 10**6, Location(1, 2, 3))
    index.write(batch)
    assert np.array_equal(index.entries_of(ledger_id), np.array(wanted, dtype=np.int64))
    assert index.last_entry(ledger_id) == wanted[-1]


def test_delete_ledger_removes_its_entries_and_state_and_nothing_else(index: Index) -> None:
    entries = {ledger_id: [0, 5, MAX_ENTRY] for ledger_id in EDGE_LEDGERS}
    put(index, entries)
    for doomed in (EDGE_LEDGERS[2], EDGE_LEDGERS[-1], EDGE_LEDGERS[0]):
        batch = index.batch()
        batch.delete_ledger(doomed)
        index.write(batch)
        del entries[doomed]
        assert index.entries_of(doomed).size == 0
        assert index.ledger_data(doomed) is None
        assert index.location(doomed, 5) is None
        for ledger_id, entry_ids in entries.items():
            assert index.entries_of(ledger_id).tolist() == entry_ids
            assert index.ledger_data(ledger_id) == LedgerData(entry_count=3)
        assert list(index.ledgers()) == sorted(entries)


def test_delete_entry(index: Index) -> None:
    ledger_id = LedgerId(0, 4)
    put(index, {ledger_id: [1, 2, 3]})
    batch = index.batch()
    batch.delete_entry(ledger_id, 2)
    batch.delete_entry(ledger_id, 7)
    index.write(batch)
    assert index.entries_of(ledger_id).tolist() == [1, 3]


@settings(max_examples=200)
@given(
    st.builds(
        LedgerData,
        master_key=st.none() | st.binary(min_size=32, max_size=32).filter(any),
        fenced=st.booleans(),
        explicit_lac=st.integers(-1, MAX_ENTRY),
        piggyback_lac=st.integers(-1, MAX_ENTRY),
        last_entry=st.integers(-1, MAX_ENTRY),
        entry_count=st.integers(0, UINT64_MAX),
        byte_count=st.integers(0, UINT64_MAX),
    )
)
def test_ledger_state_round_trips(state: LedgerData) -> None:
    raw = state.to_bytes()
    assert len(raw) == 74
    assert LedgerData.from_bytes(raw, LedgerId(0, 1)) == state
    assert state.last_add_confirmed == max(state.explicit_lac, state.piggyback_lac)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (LedgerData().to_bytes()[:-1], "73 bytes"),
        (b"\x02" + LedgerData().to_bytes()[1:], "version 2"),
        (b"\x01\x04" + LedgerData().to_bytes()[2:], "flags 0x04"),
        (
            LedgerData().to_bytes()[:2] + b"\x01" + LedgerData().to_bytes()[3:],
            "no master key flag",
        ),
        (LedgerData().to_bytes()[:34] + (-2).to_bytes(8, "big", signed=True) + bytes(32), "-2"),
    ],
)
def test_a_damaged_ledger_state_is_unreadable(raw: bytes, reason: str) -> None:
    with pytest.raises(EntryUnreadable, match=reason):
        LedgerData.from_bytes(raw, LedgerId(0, 1))


def test_damaged_values_in_the_db_are_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "index"
    Index(path).close()
    raw = rocksdict.Rdict(
        str(path),
        rocksdict.Options(raw_mode=True),
        index_families(path.parent),
    )
    key = (0).to_bytes(8, "big") + (7).to_bytes(8, "big")
    raw[key + (3).to_bytes(8, "big")] = b"short"
    raw.get_column_family("ledgers")[key] = b"garbage"
    raw.get_column_family("meta")[b"kept_journal_files"] = b"odd"
    raw.close()
    del raw
    index = Index(path)
    with pytest.raises(EntryUnreadable, match="location of entry 3 of ledger 7 has 5 bytes"):
        index.location(LedgerId(0, 7), 3)
    with pytest.raises(EntryUnreadable, match="kept journal files take 3 bytes"):
        index.kept_journal_files()
    with pytest.raises(EntryUnreadable, match="state of ledger 7 has 7 bytes"):
        index.ledger_data(LedgerId(0, 7))
    index.close()


def test_journal_mark_and_state_survive_reopen_after_sync(tmp_path: Path) -> None:
    path = tmp_path / "index"
    index = Index(path)
    assert index.journal_mark() is None
    batch = index.batch()
    state = LedgerData(master_key=b"k" * 32, fenced=True, explicit_lac=4, last_entry=9)
    batch.put_ledger_data(LedgerId(2, 3), state)
    batch.put_location(LedgerId(2, 3), 9, Location(1, 20, 300))
    batch.put_location(LedgerId(2, 3), 10, JournalLocation(2**64 - 1, 2**63, 2**32 - 1, 0xFFFFFFFF))
    batch.put_journal_mark(b"\x00mark\xff")
    batch.put_kept_journal_files({5, 2**64 - 1, 3})
    assert len(batch) == 5
    index.write(batch)
    index.sync()
    index.close()
    index.close()  # closing twice is harmless
    with pytest.raises(IllegalOperation, match="closed"):
        index.batch()

    reopened = Index(path)
    assert reopened.journal_mark() == b"\x00mark\xff"
    assert reopened.ledger_data(LedgerId(2, 3)) == state
    assert reopened.location(LedgerId(2, 3), 9) == Location(1, 20, 300)
    assert reopened.location(LedgerId(2, 3), 10) == JournalLocation(
        2**64 - 1, 2**63, 2**32 - 1, 0xFFFFFFFF
    )
    assert reopened.kept_journal_files() == {3, 5, 2**64 - 1}
    reopened.close()


def test_read_only_open_beside_the_live_writer(index: Index, tmp_path: Path) -> None:
    put(index, {LedgerId(0, 1): [1, 2, 3]})
    index.sync()
    reader = Index.open_read_only(index.path)
    assert reader.entries_of(LedgerId(0, 1)).tolist() == [1, 2, 3]
    assert list(reader.ledgers()) == [LedgerId(0, 1)]
    with pytest.raises(IllegalOperation, match="read-only"):
        reader.batch()
    put(index, {LedgerId(0, 2): [7]})
    assert reader.entries_of(LedgerId(0, 2)).size == 0, "a read-only open is a snapshot"
    reader.close()
    # and from another process, as an admin tool would
    code = (
        "import sys; from pathlib import Path; from tally.bookie.index import Index; "
        "from tally.core.ids import LedgerId; "
        "i = Index.open_read_only(Path(sys.argv[1])); "
        "print(i.entries_of(LedgerId(0, 1)).tolist(), i.entries_of(LedgerId(0, 2)).tolist())"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(index.path)], capture_output=True, text=True, check=True
    )
    assert done.stdout.split("\n")[0] == "[1, 2, 3] [7]"
    with pytest.raises(BadRequest, match="no index"):
        Index.open_read_only(tmp_path / "nowhere")


def test_a_second_writer_is_refused(index: Index) -> None:
    with pytest.raises(WriteFailed, match="cannot open the index"):
        Index(index.path)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.integers(0, 3), st.integers(0, 40)),
            st.tuples(st.just("delete"), st.integers(0, 3), st.integers(0, 40)),
            st.tuples(st.just("drop"), st.integers(0, 3), st.just(0)),
        ),
        max_size=60,
    )
)
def test_the_index_agrees_with_a_model(
    tmp_path_factory: pytest.TempPathFactory, operations: list[tuple[str, int, int]]
) -> None:
    index = Index(tmp_path_factory.mktemp("model"))
    model: dict[LedgerId, set[int]] = {}
    for step, (operation, ledger, entry_id) in enumerate(operations):
        ledger_id = LedgerId(ledger % 2, ledger)
        batch = index.batch()
        if operation == "put":
            batch.put_location(ledger_id, entry_id, location_of(ledger_id, entry_id))
            batch.put_ledger_data(ledger_id, LedgerData())
            model.setdefault(ledger_id, set()).add(entry_id)
        elif operation == "delete":
            batch.delete_entry(ledger_id, entry_id)
            model.get(ledger_id, set()).discard(entry_id)
        else:
            batch.delete_ledger(ledger_id)
            model.pop(ledger_id, None)
        index.write(batch)
        if step % 7 == 0:
            for known, entry_ids in model.items():
                assert index.entries_of(known).tolist() == sorted(entry_ids)
    assert list(index.ledgers()) == sorted(model)
    for ledger_id, entry_ids in model.items():
        assert index.entries_of(ledger_id).tolist() == sorted(entry_ids)
        assert index.last_entry(ledger_id) == (max(entry_ids) if entry_ids else None)
        for entry_id in entry_ids:
            assert index.location(ledger_id, entry_id) == location_of(ledger_id, entry_id)
    index.close()


def test_usage_counts_by_file_and_ledger(tmp_path: Path) -> None:
    path = tmp_path / "index"
    index = Index(path)
    assert index.unaccounted_files() is None
    assert index.compaction_times() is None
    log, journal = FileKind.ENTRY_LOG, FileKind.JOURNAL
    high = LedgerId(UINT64_MAX, UINT64_MAX)
    batch = index.batch()
    batch.put_usage(log, 3, LedgerId(0, 1), 100)
    batch.put_usage(log, 3, high, 7)
    batch.put_usage(log, 2**32 - 1, LedgerId(0, 1), 5)
    batch.put_usage(journal, 3, LedgerId(0, 1), 40)
    batch.put_unaccounted_files({(journal, 9), (log, 2)})
    batch.put_compaction_times(CompactionTimes(1.5, 2.5))
    index.write(batch)
    batch = index.batch()
    index.add_usage(
        batch,
        {
            (log, 3, LedgerId(0, 1)): -30,
            (log, 3, high): -10,  # never below 0
            (log, 4, LedgerId(0, 1)): -5,  # a decrement makes no count
            (log, 5, LedgerId(0, 2)): 8,
        },
    )
    index.write(batch)
    assert list(index.usages()) == [
        (log, 3, LedgerId(0, 1), 70),
        (log, 3, high, 0),
        (log, 5, LedgerId(0, 2), 8),
        (log, 2**32 - 1, LedgerId(0, 1), 5),
        (journal, 3, LedgerId(0, 1), 40),
    ]
    assert index.usage(log, 4, LedgerId(0, 1)) is None
    assert index.file_usage(log, 3) == {LedgerId(0, 1): 70, high: 0}
    assert index.file_usage(journal, 3) == {LedgerId(0, 1): 40}
    assert index.file_usage(log, 4) == {}
    batch = index.batch()
    batch.delete_file_usage(log, 3)
    batch.delete_usage(journal, 3, LedgerId(0, 1))
    index.write(batch)
    index.sync()
    index.close()
    index = Index(path)
    assert list(index.usages()) == [
        (log, 5, LedgerId(0, 2), 8),
        (log, 2**32 - 1, LedgerId(0, 1), 5),
    ]
    assert index.unaccounted_files() == {(journal, 9), (log, 2)}
    assert index.compaction_times() == CompactionTimes(1.5, 2.5)
    index.close()


def test_locations_of_a_ledger_and_of_the_whole_index(index: Index) -> None:
    entries = {LedgerId(0, 1): [0, 5, 9], LedgerId(3, 1): [2], LedgerId(0, 2): [1, 2]}
    put(index, entries)
    assert list(index.ledger_locations(LedgerId(0, 1))) == [
        (entry_id, location_of(LedgerId(0, 1), entry_id)) for entry_id in (0, 5, 9)
    ]
    assert list(index.ledger_locations(LedgerId(0, 3))) == []
    assert list(index.all_locations()) == [
        (ledger_id, entry_id, location_of(ledger_id, entry_id))
        for ledger_id in sorted(entries)
        for entry_id in entries[ledger_id]
    ]


def test_a_read_only_open_of_an_index_from_before_usage_was_counted(tmp_path: Path) -> None:
    path = tmp_path / "index"
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    raw = rocksdict.Rdict(
        str(path), options, {name: rocksdict.Options(raw_mode=True) for name in ("ledgers", "meta")}
    )
    raw.close()
    del raw
    reader = Index.open_read_only(path)
    assert list(reader.usages()) == []
    assert reader.usage(FileKind.ENTRY_LOG, 0, LedgerId(0, 1)) is None
    assert list(reader.corrupt_marks()) == []
    reader.close()
    writer = Index(path)  # the writer adds the family
    batch = writer.batch()
    batch.put_usage(FileKind.ENTRY_LOG, 0, LedgerId(0, 1), 9)
    writer.write(batch)
    writer.close()
    reader = Index.open_read_only(path)
    assert list(reader.usages()) == [(FileKind.ENTRY_LOG, 0, LedgerId(0, 1), 9)]
    reader.close()


def test_corrupt_marks_and_scrub_records_survive_a_reopen_and_go_with_their_ledger(
    tmp_path: Path,
) -> None:
    path = tmp_path / "index"
    index = Index(path)
    put(index, {LedgerId(0, 1): [0, 1, 2], LedgerId(0, 2): [0]})
    marks = {
        (LedgerId(0, 1), 1): CorruptMark(Location(3, 40, 99), 1234.5, FoundBy.SCRUBBER),
        (LedgerId(0, 1), 2): CorruptMark(
            JournalLocation(2**64 - 1, 7, 9, 0xFFFFFFFF), 1.0, FoundBy.READ
        ),
        (LedgerId(0, 2), 0): CorruptMark(Location(0, 20, 30), 2.0, FoundBy.COMPACTION),
    }
    done = ScrubPass(10.0, ScrubTrigger.SCHEDULE).plus(
        bytes_read=2**40, entries=7, corrupt=1, unreadable=2
    )
    passes = [done.finished(20.0), done.at_full_speed().finished(30.0)]
    progress = ScrubProgress(
        ScrubPass(40.0, ScrubTrigger.SCHEDULE), (FileKind.JOURNAL, 2**64 - 1), -1, 2**32 - 1, -1
    )
    batch = index.batch()
    for (ledger_id, entry_id), mark in marks.items():
        batch.put_corrupt(ledger_id, entry_id, mark)
    batch.put_scrub_passes(passes)
    batch.put_scrub_progress(progress)
    index.write(batch)
    index.sync()
    index.close()
    index = Index(path)
    assert {
        (ledger_id, entry_id): mark for ledger_id, entry_id, mark in index.corrupt_marks()
    } == marks
    assert index.scrub_passes() == passes
    assert index.scrub_progress() == progress
    batch = index.batch()
    batch.delete_ledger(LedgerId(0, 1))
    batch.put_scrub_progress(progress.at(progress.current, (FileKind.ENTRY_LOG, 3), 4096))
    index.write(batch)
    assert [(ledger_id, entry_id) for ledger_id, entry_id, _ in index.corrupt_marks()] == [
        (LedgerId(0, 2), 0)
    ]
    assert index.scrub_progress() == progress.at(progress.current, (FileKind.ENTRY_LOG, 3), 4096)
    batch = index.batch()
    batch.delete_corrupt(LedgerId(0, 2), 0)
    batch.put_scrub_progress(None)
    index.write(batch)
    assert list(index.corrupt_marks()) == []
    assert index.scrub_progress() is None
    index.close()
