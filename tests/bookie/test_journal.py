"""The bookie's journal, on real files with real fdatasync: round trips, group commit,
torn tails, damage, rollover, release, disk full, and SIGKILL during a write load."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
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
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.bookie import journal as journal_module
from tally.bookie.direct_io import aligned_up
from tally.bookie.journal import Journal, out_of_space
from tally.bookie.journal_files import journal_files
from tally.bookie.journal_format import FRAME_SIZE, HEADER_SIZE, JournalMark, file_name
from tally.chaos.disks import FilesystemRefused, fill, small_filesystem
from tally.core.digest import crc32c
from tally.core.errors import BadRequest, IllegalOperation, MalformedData, WriteFailed
from tests.support.async_tests import run

SMALL = {"preallocate_size": 4096}
"""Small preallocation, so that copying a journal for each damage case stays cheap."""
REPO = Path(__file__).resolve().parents[2]


async def write_journal(directory: Path, records: list[bytes], **options: Any) -> list[JournalMark]:
    """Replay what is there, start, append `records` in order, close: their marks."""
    journal = Journal(directory, **options)
    for _ in journal.replay():
        pass
    await journal.start()
    marks = await asyncio.gather(*[journal.append_nowait(record) for record in records])
    await journal.close()
    return list(marks)


def replayed(directory: Path, start: JournalMark | None = None) -> list[tuple[JournalMark, bytes]]:
    return list(Journal(directory).replay(start))


def numbered(count: int, size: int = 40) -> list[bytes]:
    return [i.to_bytes(4, "big") * (size // 4) for i in range(count)]


# -- marks and round trips -------------------------------------------------------------


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_mark_bytes_round_trip(file_id: int, offset: int) -> None:
    mark = JournalMark(file_id, offset)
    assert JournalMark.from_bytes(mark.to_bytes()) == mark


@pytest.mark.parametrize("size", [0, 15, 17])
def test_mark_of_wrong_size_is_refused(size: int) -> None:
    with pytest.raises(MalformedData, match="16 bytes"):
        JournalMark.from_bytes(bytes(size))


def test_marks_order_like_the_journal() -> None:
    assert JournalMark(1, 2**40) < JournalMark(2, HEADER_SIZE) < JournalMark(2, HEADER_SIZE + 1)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=40), st.booleans())
def test_append_then_replay_returns_every_record_and_its_mark(
    tmp_path_factory: pytest.TempPathFactory, records: list[bytes], direct_io: bool
) -> None:
    directory = tmp_path_factory.mktemp("journal")
    marks = run(write_journal(directory, records, direct_io=direct_io, **SMALL))
    assert replayed(directory) == list(zip(marks, records, strict=True))
    ends = [HEADER_SIZE, *(mark.offset for mark in marks)]
    sizes = [b - a for a, b in itertools.pairwise(ends)]
    assert sizes == [len(record) + FRAME_SIZE for record in records]


def test_a_records_two_parts_and_the_crc_its_caller_checked_replay_as_one(
    tmp_path: Path,
) -> None:
    """`append_then` takes the body's CRC32C from a caller that has just checked it; with a
    wrong one the record reads as damage, never as a record with other bytes."""

    async def scenario() -> list[tuple[JournalMark | None, Exception | None]]:
        journal = Journal(tmp_path, **SMALL)
        await journal.start()
        answers: list[tuple[JournalMark | None, Exception | None]] = []
        for head, body, crc in [
            (b"head", b"body" * 1000, crc32c(b"body" * 1000)),
            (b"", b"no head", None),
            (b"wrong", b"checksum", crc32c(b"checksum") ^ 1),
        ]:
            journal.append_then(head, body, lambda *answer: answers.append(answer), crc)
        await journal.close()
        return answers

    answers = run(scenario())
    assert [error for _, error in answers] == [None] * 3
    assert [record for _, record in replayed(tmp_path)] == [b"head" + b"body" * 1000, b"no head"]

    async def long_head() -> None:
        journal = Journal(tmp_path / "long", **SMALL)
        await journal.start()
        try:
            journal.append_then(bytes(70_000), b"", lambda *_: None)
        finally:
            await journal.close()

    with pytest.raises(BadRequest, match="head 70000"):
        run(long_head())


def test_records_appended_together_are_answered_once_when_the_last_is_durable(
    tmp_path: Path,
) -> None:
    """`append_all_then`: the records of one call span several batches here; its callback
    is called once, with the last one's mark, after the batches before it are durable."""
    bodies = numbered(50, 400)

    async def scenario() -> list[tuple[JournalMark | None, Exception | None]]:
        journal = Journal(tmp_path, max_batch_bytes=4096, **SMALL)
        await journal.start()
        answers: list[tuple[JournalMark | None, Exception | None]] = []
        await journal.append(b"before")
        journal.append_all_then(
            [(b"h%d" % i, body, None) for i, body in enumerate(bodies)],
            lambda *answer: answers.append(answer),
        )
        await journal.append(b"after")
        with pytest.raises(BadRequest, match="at least one record"):
            journal.append_all_then([], lambda *answer: answers.append(answer))
        await journal.close()
        return answers

    answers = run(scenario())
    records = replayed(tmp_path)
    assert [record for _, record in records] == [
        b"before",
        *(b"h%d" % i + body for i, body in enumerate(bodies)),
        b"after",
    ]
    assert answers == [(records[-2][0], None)]
    # Over four batches' worth of bytes: the staging sealed several batches on the way.
    assert records[-2][0].offset - records[0][0].offset > 4 * 4096


def test_records_appended_together_fail_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_path: str
) -> None:
    real = os.pwrite

    def broken(*args: Any) -> Any:
        if b"doomed" in bytes(args[1]):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(*args)

    monkeypatch.setattr(os, "pwrite", broken)

    async def scenario() -> list[tuple[JournalMark | None, Exception | None]]:
        journal = Journal(tmp_path, direct_io=False, **SMALL)
        await journal.start()
        await journal.append(b"one")
        answers: list[tuple[JournalMark | None, Exception | None]] = []
        done = asyncio.get_running_loop().create_future()

        def answered(*answer: Any) -> None:
            answers.append(answer)
            done.set_result(None)

        journal.append_all_then([(b"", b"doomed %d" % i, None) for i in range(3)], answered)
        await done
        with pytest.raises(WriteFailed):
            journal.append_all_then([(b"", b"later", None)], answered)
        await journal.close()
        return answers

    ((mark, error),) = run(scenario())
    assert mark is None
    assert isinstance(error, WriteFailed)
    assert getattr(error.__cause__, "errno", None) == errno.EIO


def test_replay_from_a_mark_returns_only_what_follows_it(tmp_path: Path) -> None:
    records = numbered(30, 200)
    marks = run(write_journal(tmp_path, records, file_size=2000, max_batch_bytes=500, **SMALL))
    assert len({mark.file_id for mark in marks}) > 3, "the records should span several files"
    for k, mark in enumerate(marks):
        assert [record for _, record in replayed(tmp_path, mark)] == records[k + 1 :]
    first = JournalMark(marks[0].file_id, HEADER_SIZE)
    assert [record for _, record in replayed(tmp_path, first)] == records


@pytest.mark.parametrize("direct_io", [True, False])
def test_large_and_empty_records(tmp_path: Path, direct_io: bool) -> None:
    """Records larger than the direct writes' buffer go out in several writes."""
    records = [b"", os.urandom(3 << 20), b"", b"x", os.urandom(9 << 20), b"y" * 5000]
    run(write_journal(tmp_path, records, max_batch_bytes=64 << 10, direct_io=direct_io))
    assert [record for _, record in replayed(tmp_path)] == records
    (_, path), *others = journal_files(tmp_path)
    assert not others
    end = replayed(tmp_path)[-1][0].offset
    assert not any(path.read_bytes()[end:]), "only zeros after the records"


# -- group commit ----------------------------------------------------------------------


@pytest.mark.parametrize("direct_io", [True, False])
def test_concurrent_appends_are_batched_and_acknowledged_after_their_fdatasync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_io: bool
) -> None:
    """Every acknowledgement comes after a write covering the record and a later fdatasync."""
    events: list[tuple[str, int]] = []
    real_pwrite, real_fdatasync = os.pwrite, os.fdatasync

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        written = real_pwrite(fd, data, offset)
        events.append(("write", offset + written))
        return written

    def fdatasync(fd: int) -> None:
        events.append(("sync-start", 0))
        real_fdatasync(fd)
        events.append(("sync", 0))

    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    count = 3000

    async def scenario() -> Journal:
        journal = Journal(tmp_path, direct_io=direct_io)
        await journal.start()
        appenders = [journal.append(record) for record in numbered(count, 100)]
        futures = [asyncio.ensure_future(appender) for appender in appenders]
        for future in futures:
            future.add_done_callback(lambda done: events.append(("ack", done.result().offset)))
        await asyncio.gather(*futures)
        await journal.close()
        return journal

    journal = run(scenario())
    written = covered = synced = 0
    acks = 0
    for kind, value in events:
        if kind == "write":
            written = max(written, value)
        elif kind == "sync-start":
            covered = written  # a write that ends while the sync runs is not covered by it
        elif kind == "sync":
            synced = covered
        else:
            acks += 1
            assert value <= synced, f"record ending at {value} acknowledged before its fdatasync"
    assert acks == count
    assert journal.stats.records == count
    assert 1 <= journal.stats.batches < count / 10, journal.stats
    assert journal.stats.batches == sum(kind == "sync" for kind, _ in events)
    assert len(journal.stats.recent_fdatasync_seconds) == journal.stats.batches
    assert journal.stats.fdatasync_quantile(0.99) >= journal.stats.fdatasync_quantile(0.5) > 0


def test_a_batch_closes_at_the_record_that_reaches_max_batch_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ends: list[list[int]] = []
    real_write_batch = Journal._write_batch

    def write_batch(journal: Journal, batch: Any) -> Any:
        ends.append(list(batch.ends))
        return real_write_batch(journal, batch)

    monkeypatch.setattr(Journal, "_write_batch", write_batch)
    records = [*numbered(55, 92), os.urandom(5000), *numbered(50, 92)]
    run(write_journal(tmp_path, records, max_batch_bytes=1000))
    all_ends = [end for batch in ends for end in batch]
    sizes = iter(later - earlier for earlier, later in itertools.pairwise([HEADER_SIZE, *all_ends]))
    batches = [[next(sizes) for _ in batch] for batch in ends]
    assert [size for batch in batches for size in batch] == [
        len(record) + FRAME_SIZE for record in records
    ]
    small = 92 + FRAME_SIZE
    assert batches[:5] == [[small] * 10] * 5
    assert batches[5] == [small] * 5 + [5000 + FRAME_SIZE]
    assert all(sum(batch[:-1]) < 1000 for batch in batches), batches
    assert [record for _, record in replayed(tmp_path)] == records


def test_an_idle_journal_syncs_a_small_batch_on_the_loop_and_anything_else_on_its_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lone small records are written and synced by the event loop's thread once the
    recent fdatasyncs were quick (no hop to the writer threads and back); the first ones,
    a large batch, and any after a slow fdatasync, by the journal's threads, until enough
    quick ones again. Each is durable and answered either way. (Quick: at most 0.2 s here,
    which a real fdatasync on this disk never comes near; slow: one that sleeps 0.25 s.)"""
    monkeypatch.setattr(journal_module, "SYNC_HERE_MAX_SECONDS", 0.2)
    monkeypatch.setattr(journal_module, "QUICK_SYNCS_BEFORE_SYNC_HERE", 3)
    real = os.fdatasync
    synced_on: list[str] = []
    slow = threading.Event()

    def recording(fd: int) -> None:
        synced_on.append(threading.current_thread().name)
        if slow.is_set():
            slow.clear()
            time.sleep(0.25)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)

    async def scenario() -> list[JournalMark]:
        journal = Journal(tmp_path)
        await journal.start()
        here = threading.current_thread().name

        async def lone(record: bytes) -> str:
            marks.append(await journal.append(record))
            return synced_on[-1]

        marks: list[JournalMark] = []
        first = [await lone(b"first %d" % n) for n in range(3)]
        assert here not in first, "until 3 quick syncs, on the threads"
        assert await lone(b"lone and small") == here
        assert await lone(b"x" * (64 << 10)) != here, "a large batch goes to the threads"
        assert await lone(b"small again") == here
        slow.set()
        assert await lone(b"small, its sync slow") == here
        after = [await lone(b"after the slow one %d" % n) for n in range(4)]
        assert here not in after[:3], "after a slow sync, on the threads until 3 quick ones"
        assert after[3] == here
        await journal.close()
        return marks

    marks = run(scenario())
    assert [mark for mark, _ in replayed(tmp_path)] == marks


@pytest.fixture(params=["threads", "loop"])
def sync_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test with every batch on the journal's threads, or an idle journal's small
    batches on the event loop (as soon as it starts)."""
    if request.param == "threads":
        monkeypatch.setattr(journal_module, "SYNC_HERE_MAX_BYTES", 0)
    else:
        monkeypatch.setattr(journal_module, "QUICK_SYNCS_BEFORE_SYNC_HERE", 0)
        monkeypatch.setattr(journal_module, "SYNC_HERE_MAX_SECONDS", 60.0)
    return str(request.param)


def test_short_writes_are_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pwrite may write less than asked (a signal, a nearly full disk): the rest follows."""
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: bytes | memoryview, offset: int) -> int:
        with memoryview(data) as view:
            return real_pwrite(fd, view[: max(1, len(view) // 2)], offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    records = [*numbered(2000, 60), b"", os.urandom(70_000)]
    marks = run(write_journal(tmp_path, records, direct_io=False, **SMALL))
    assert replayed(tmp_path) == list(zip(marks, records, strict=True))


def test_max_batch_delay_holds_a_lone_record_but_not_a_full_batch(tmp_path: Path) -> None:
    async def scenario() -> tuple[float, float]:
        journal = Journal(tmp_path, max_batch_delay=0.2, max_batch_bytes=10 * (1000 + FRAME_SIZE))
        await journal.start()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await journal.append(b"alone")
        lone = loop.time() - started
        journal.max_batch_delay = 30.0
        started = loop.time()
        await asyncio.gather(*[journal.append_nowait(bytes(1000)) for _ in range(10)])
        full = loop.time() - started
        await journal.close()
        return lone, full

    lone, full = run(scenario())
    assert lone >= 0.19
    assert full < 10, "a batch that reached max_batch_bytes waited for the delay"


def test_close_writes_what_is_queued_and_a_cancelled_wait_still_writes(tmp_path: Path) -> None:
    async def scenario() -> list[JournalMark]:
        journal = Journal(tmp_path)
        await journal.start()
        waiting = asyncio.ensure_future(journal.append(b"cancelled"))
        await asyncio.sleep(0)
        waiting.cancel()
        futures = [journal.append_nowait(record) for record in numbered(100)]
        await journal.close()
        assert journal.queued_bytes == 0
        with pytest.raises(IllegalOperation):
            journal.append_nowait(b"late")
        return [future.result() for future in futures]

    marks = run(scenario())
    assert [mark for mark, _ in replayed(tmp_path)][1:] == marks
    assert replayed(tmp_path)[0][1] == b"cancelled"


def test_calls_out_of_order_are_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        journal = Journal(tmp_path)
        with pytest.raises(IllegalOperation):
            journal.append_nowait(b"x")
        with pytest.raises(IllegalOperation):
            journal.last_mark()
        await journal.start()
        assert journal.last_mark() == JournalMark(1, HEADER_SIZE)
        with pytest.raises(IllegalOperation):
            journal.replay()
        with pytest.raises(IllegalOperation):
            await journal.start()
        await journal.close()
        await journal.close()

    run(scenario())


@pytest.mark.parametrize(
    "options",
    [
        {"file_size": HEADER_SIZE},
        {"preallocate_size": 0},
        {"max_batch_bytes": 0},
        {"max_batch_delay": -1},
    ],
)
def test_bad_options_are_refused(tmp_path: Path, options: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        Journal(tmp_path, **options)


# -- files: restart, rollover, release, foreign files ------------------------------------


def test_every_start_writes_a_new_file_and_replay_sees_all_of_them(tmp_path: Path) -> None:
    first = run(write_journal(tmp_path, [b"a", b"b"]))
    second = run(write_journal(tmp_path, [b"c"]))
    assert [mark.file_id for mark in first] == [1, 1]
    assert [mark.file_id for mark in second] == [2]
    assert [name for _, name in journal_files(tmp_path)] == [
        tmp_path / file_name(1),
        tmp_path / file_name(2),
    ]
    assert [record for _, record in replayed(tmp_path)] == [b"a", b"b", b"c"]


def open_files_under(directory: Path) -> list[str]:
    """Paths under `directory` that this process holds open."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(directory)):
                found.append(target)
    return found


def test_files_roll_over_before_exceeding_file_size(tmp_path: Path) -> None:
    records = numbered(100, 96)
    marks = run(
        write_journal(
            tmp_path, [*records, os.urandom(3000)], file_size=1024, max_batch_bytes=500, **SMALL
        )
    )
    files = journal_files(tmp_path)
    assert len(files) > 10
    assert not open_files_under(tmp_path), "every rolled-away file is closed once synced"
    assert [file_id for file_id, _ in files] == sorted({mark.file_id for mark in marks})
    for file_id, path in files[:-1]:
        assert path.stat().st_size <= aligned_up(1024), "records within, then a padded block"
        assert max(mark.offset for mark in marks if mark.file_id == file_id) <= 1024
    assert marks[-1].offset == HEADER_SIZE + FRAME_SIZE + 3000, "a record too big for a file"
    assert [mark for mark, _ in replayed(tmp_path)] == marks


def test_release_before_deletes_only_whole_files_before_the_mark(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[JournalMark], list[Path], list[Path]]:
        journal = Journal(tmp_path, file_size=1024, **SMALL)
        await journal.start()
        marks = [await journal.append(record) for record in numbered(40, 96)]
        checkpoint = marks[20]
        released = journal.release_before(checkpoint)
        beyond = journal.release_before(JournalMark(10**6, HEADER_SIZE))
        await journal.close()
        return marks, released, beyond

    marks, released, beyond = run(scenario())
    checkpoint = marks[20]
    assert released == [tmp_path / file_name(i) for i in range(1, checkpoint.file_id)]
    current = marks[-1].file_id
    assert beyond == [tmp_path / file_name(i) for i in range(checkpoint.file_id, current)]
    assert [file_id for file_id, _ in journal_files(tmp_path)] == [current]
    assert [mark for mark, _ in replayed(tmp_path, JournalMark(current, HEADER_SIZE))] == [
        mark for mark in marks if mark.file_id == current
    ]


def test_foreign_and_stray_files_are_refused(tmp_path: Path) -> None:
    run(write_journal(tmp_path, [b"a"]))
    (tmp_path / "VERSION").write_text("a cookie lives here too")
    foreign = tmp_path / file_name(7)
    foreign.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(MalformedData, match="not a tally journal file"):
        replayed(tmp_path)
    with pytest.raises(MalformedData, match="not a tally journal file"):
        run(Journal(tmp_path).start())
    foreign.unlink()
    (tmp_path / "notes.txn").write_text("hello")
    with pytest.raises(MalformedData, match="not a journal file name"):
        replayed(tmp_path)


def test_a_file_under_another_files_name_is_refused(tmp_path: Path) -> None:
    run(write_journal(tmp_path, [b"a"]))
    (tmp_path / file_name(1)).rename(tmp_path / file_name(2))
    with pytest.raises(MalformedData, match="header says journal file 0000000000000001"):
        replayed(tmp_path)


def test_a_missing_file_is_an_error_not_a_gap(tmp_path: Path) -> None:
    for record in (b"a", b"b", b"c"):
        run(write_journal(tmp_path, [record]))
    (tmp_path / file_name(2)).unlink()
    with pytest.raises(MalformedData, match="a journal file is missing"):
        replayed(tmp_path)
    with pytest.raises(MalformedData, match="checkpoint mark"):
        replayed(tmp_path, JournalMark(2, HEADER_SIZE))
    assert [record for _, record in replayed(tmp_path, JournalMark(3, HEADER_SIZE))] == [b"c"]


def test_stale_temporary_file_of_an_interrupted_start_is_removed(tmp_path: Path) -> None:
    run(write_journal(tmp_path, [b"a"]))
    stale = tmp_path / (file_name(2) + ".tmp")
    stale.write_bytes(b"half a header")
    run(write_journal(tmp_path, [b"b"]))
    assert not stale.exists()
    assert [record for _, record in replayed(tmp_path)] == [b"a", b"b"]


# -- torn tails and damage ----------------------------------------------------------------


def damaged_copies(
    source: Path, target: Path, begin: int, end: int
) -> Iterator[tuple[str, int, Path]]:
    """Copies of the journal `source` whose single file is cut, flipped or zeroed at each
    offset in [begin, end)."""
    (_, original), *_ = journal_files(source)
    data = original.read_bytes()
    for offset in range(begin, end):
        for how in ("cut", "flip", "zero"):
            copy = target / f"{how}-{offset}"
            shutil.copytree(source, copy)
            path = copy / original.name
            if how == "cut":
                path.write_bytes(data[:offset])
            elif how == "flip":
                path.write_bytes(data[:offset] + bytes([data[offset] ^ 0x5A]) + data[offset + 1 :])
            else:
                path.write_bytes(data[:offset] + bytes(len(data) - offset))
            yield f"{how} at {offset}", offset, copy


def replayed_with_damage(
    directory: Path, start: JournalMark | None = None
) -> tuple[list[tuple[JournalMark, bytes]], list[tuple[int, int]]]:
    """The records replayed and the (start, end) of each stretch the replay found damaged."""
    journal = Journal(directory)
    records = list(journal.replay(start))
    return records, [(damage.start, damage.end) for damage in journal.damage]


def destroyed(how: str, offset: int, marks: list[JournalMark]) -> list[bool]:
    """Which of the records ending at `marks` (one file) a cut, flip or zero at `offset` hit."""
    starts = [HEADER_SIZE] + [mark.offset for mark in marks[:-1]]
    if how == "flip":
        return [start <= offset < mark.offset for start, mark in zip(starts, marks, strict=True)]
    return [mark.offset > offset for mark in marks]


def merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def test_damage_anywhere_in_the_last_file_is_a_torn_tail_or_skipped_damage(
    tmp_path: Path,
) -> None:
    """Cut, flip or zero the last file at any offset: records that nothing valid follows are
    a torn tail, dropped quietly; a bad record with valid records after it is damage,
    reported, and the records after it are replayed. A damaged header is refused. A restart
    then carries on, and the damage is found again where it was."""
    source = tmp_path / "source"
    # No zero byte in the last record: zeroing a byte must change it, or the case is moot.
    records = [b"one", b"", b"three", bytes(random.Random(37).randrange(1, 256) for _ in range(37))]
    marks = run(write_journal(source, records, **SMALL))
    starts = [HEADER_SIZE] + [mark.offset for mark in marks[:-1]]
    for case, offset, copy in damaged_copies(source, tmp_path, 0, marks[-1].offset):
        if offset < HEADER_SIZE:
            with pytest.raises(MalformedData, match=file_name(1)):
                replayed(copy)
            continue
        hit = destroyed(case.split()[0], offset, marks)
        kept = [
            (mark, record)
            for mark, record, gone in zip(marks, records, hit, strict=True)
            if not gone
        ]
        last_kept = max((i for i, gone in enumerate(hit) if not gone), default=-1)
        damage = merged(
            [(starts[i], marks[i].offset) for i, gone in enumerate(hit) if gone and i < last_kept]
        )
        found, found_damage = replayed_with_damage(copy)
        assert found == kept, case
        assert merged(found_damage) == damage, case
        run(write_journal(copy, [b"after"]))
        found, found_damage = replayed_with_damage(copy)
        assert [record for _, record in found] == [r for _, r in kept] + [b"after"], case
        assert merged(found_damage) == damage, case


def test_damage_before_the_recorded_end_of_an_older_file_is_reported_and_skipped(
    tmp_path: Path,
) -> None:
    """An older file's records are acknowledged up to the end its successor recorded: a cut,
    a flip or zeros anywhere before it are damage, reported, and every record not hit is
    replayed, the next file's too."""
    source = tmp_path / "source"
    records = [b"one", b"two", b"three"]
    marks = run(write_journal(source, records, **SMALL))
    run(write_journal(source, [b"next file"], **SMALL))
    original = source / file_name(1)
    data = original.read_bytes()
    starts = [HEADER_SIZE] + [mark.offset for mark in marks[:-1]]
    for offset in range(HEADER_SIZE, marks[-1].offset):
        for how, damaged in (
            ("flip", data[:offset] + bytes([data[offset] ^ 0x01]) + data[offset + 1 :]),
            ("cut", data[:offset]),
            ("zero", data[:offset] + bytes(len(data) - offset)),
        ):
            original.write_bytes(damaged)
            hit = destroyed(how, offset, marks)
            found, found_damage = replayed_with_damage(source)
            expected = [r for r, gone in zip(records, hit, strict=True) if not gone]
            assert [record for _, record in found] == [*expected, b"next file"], (how, offset)
            assert merged(found_damage) == merged(
                [(starts[i], marks[i].offset) for i, gone in enumerate(hit) if gone]
            ), (how, offset)
    original.write_bytes(data)
    assert replayed_with_damage(source) == (
        [(mark, record) for mark, record in zip(marks, records, strict=True)]
        + [(JournalMark(2, HEADER_SIZE + FRAME_SIZE + len(b"next file")), b"next file")],
        [],
    )


def test_a_torn_tail_left_behind_in_an_older_file_is_not_mistaken_for_damage(
    tmp_path: Path,
) -> None:
    records = [b"kept", b"torn record"]
    marks = run(write_journal(tmp_path, records, **SMALL))
    path = tmp_path / file_name(1)
    data = bytearray(path.read_bytes())
    data[marks[0].offset + FRAME_SIZE] ^= 0xFF
    path.write_bytes(bytes(data))
    run(write_journal(tmp_path, [b"second start"], **SMALL))
    run(write_journal(tmp_path, [b"third start"], **SMALL))
    expected = [b"kept", b"second start", b"third start"]
    assert [record for _, record in replayed(tmp_path)] == expected
    assert [record for _, record in replayed(tmp_path, marks[0])] == expected[1:]


# -- write errors -------------------------------------------------------------------------


@contextlib.contextmanager
def tiny_filesystem(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A 1 MiB tmpfs at `directory` when this process may mount one; otherwise a plain
    directory whose posix_fallocate fails with ENOSPC past 1 MiB. Yields which it is."""
    with contextlib.ExitStack() as mounted:
        try:
            mounted.enter_context(small_filesystem(directory, 1 << 20, kind="tmpfs"))
        except FilesystemRefused:
            real = os.posix_fallocate

            def posix_fallocate(fd: int, offset: int, length: int) -> None:
                if offset + length > 1 << 20:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                real(fd, offset, length)

            monkeypatch.setattr(os, "posix_fallocate", posix_fallocate)
            yield "simulated"
            return
        yield "tmpfs"


def test_disk_full_fails_the_batch_and_every_later_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "tiny"
    with tiny_filesystem(directory, monkeypatch) as kind:
        if kind == "tmpfs":
            space = os.statvfs(directory)
            assert space.f_blocks * space.f_frsize == 1 << 20

        async def scenario() -> tuple[list[bytes], BaseException]:
            journal = Journal(directory, preallocate_size=64 << 10)
            await journal.start()
            acknowledged = []
            for number in range(1000):
                record = number.to_bytes(4, "big") * 4096
                try:
                    await journal.append(record)
                except WriteFailed as e:
                    failure: BaseException = e
                    break
                acknowledged.append(record)
            else:
                raise AssertionError("16 MiB fitted on a 1 MiB disk")
            with pytest.raises(WriteFailed, match="No space left"):
                await journal.append(b"after the failure")
            await journal.close()
            return acknowledged, failure

        acknowledged, failure = run(scenario())
        assert isinstance(failure.__cause__, OSError)
        assert failure.__cause__.errno == errno.ENOSPC
        assert "offset" in str(failure)
        assert 10 < len(acknowledged) < 64
        assert [record for _, record in replayed(directory)] == acknowledged


@pytest.mark.parametrize(
    ("failing", "direct_io"), [("pwrite", False), ("pwrite", True), ("fdatasync", True)]
)
def test_an_io_error_fails_the_whole_batch_and_the_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str, direct_io: bool, sync_path: str
) -> None:
    real = getattr(os, failing)
    armed = threading.Event()

    def broken(*args: Any) -> Any:
        if armed.is_set():
            time.sleep(0.05)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(*args)

    monkeypatch.setattr(os, failing, broken)

    async def scenario() -> list[BaseException | None]:
        journal = Journal(tmp_path, direct_io=direct_io)
        await journal.start()
        await journal.append(b"one")
        await journal.append(b"two")
        armed.set()
        futures = [journal.append_nowait(b"in the failing batch")]
        await asyncio.sleep(0.01)
        futures += [journal.append_nowait(b"queued behind it") for _ in range(5)]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        late = journal.append_nowait(b"late")
        assert late.done()
        await journal.close()
        return [*outcomes, late.exception()]

    outcomes = run(scenario())
    assert all(isinstance(outcome, WriteFailed) for outcome in outcomes), outcomes
    causes = {getattr(outcome.__cause__, "errno", None) for outcome in outcomes if outcome}
    assert causes == {errno.EIO}


def test_a_resume_after_a_failed_fdatasync_waits_for_the_batch_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch A's fdatasync fails while the writer writes batch B: resume() must not open
    the new file (whose header ends the failed one's records) before B is answered, failed,
    or a sync of B after the resume could acknowledge records replay never reads."""
    monkeypatch.setattr(journal_module, "SYNC_HERE_MAX_BYTES", 0)
    real_pwrite, real_fdatasync = os.pwrite, os.fdatasync
    fail_next_sync = threading.Event()

    def slow_pwrite(fd: int, data: Any, offset: int) -> int:
        if b"slow-A" in bytes(data):
            time.sleep(0.2)  # B is queued meanwhile: the writer takes it next
        elif b"slow-B" in bytes(data):
            time.sleep(0.6)  # A's failure reaches the loop while B is written
        return real_pwrite(fd, data, offset)

    def failing_fdatasync(fd: int) -> None:
        if fail_next_sync.is_set():
            fail_next_sync.clear()
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "pwrite", slow_pwrite)
    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    b_answered_at_open: list[bool] = []

    async def scenario() -> None:
        journal = Journal(tmp_path, direct_io=False)
        await journal.start()
        await journal.append(b"one")
        fail_next_sync.set()
        a = journal.append_nowait(b"slow-A")
        await asyncio.sleep(0.05)
        b = journal.append_nowait(b"slow-B")
        with pytest.raises(WriteFailed):
            await a
        real_open = journal._open

        def open_after_b() -> tuple[int, bytes]:
            b_answered_at_open.append(b.done())
            return real_open()

        monkeypatch.setattr(journal, "_open", open_after_b)
        await journal.resume()
        with pytest.raises(WriteFailed):
            await b
        assert await journal.append(b"after the resume")
        await journal.close()

    run(scenario())
    assert b_answered_at_open == [True]
    records = [record for _, record in replayed(tmp_path)]
    assert records == [b"one", b"after the resume"]


# -- resuming after a failure ------------------------------------------------------------


def record_numbered(number: int, size: int = 16 << 10) -> bytes:
    return number.to_bytes(4, "big") * (size // 4)


async def append_until_failure(journal: Journal, first: int, limit: int = 1000) -> list[bytes]:
    """Append numbered records one at a time until one fails; those acknowledged."""
    acknowledged = []
    for number in range(first, first + limit):
        try:
            await journal.append(record_numbered(number))
        except WriteFailed:
            return acknowledged
        acknowledged.append(record_numbered(number))
    raise AssertionError(f"{limit} records fitted")


def test_a_full_journal_resumes_in_a_new_file_once_there_is_room(tmp_path: Path) -> None:
    """On a real ext4 file system: the journal runs out of room, cannot resume while the
    disk is full, resumes in a new file once room appears, and replay reads every
    acknowledged record of both files and finds no damage."""
    with small_filesystem(tmp_path / "disk", 16 << 20) as disk:
        directory = disk / "journal"

        async def scenario() -> list[bytes]:
            journal = Journal(directory, file_size=4 << 20, preallocate_size=256 << 10)
            await journal.start()
            acknowledged = [record_numbered(n) for n in range(8)]
            for record in acknowledged:
                await journal.append(record)
            filler = fill(disk, leave=64 << 10)
            acknowledged += await append_until_failure(journal, 8)
            failure = journal.failure
            assert failure is not None
            assert out_of_space(failure), failure
            with pytest.raises(WriteFailed, match="No space left"):
                await journal.append(b"while failed")
            with pytest.raises(WriteFailed, match="cannot write a new journal file"):
                await journal.resume()
            assert journal.failure is failure
            assert journal.stats.write_failures == 2
            filler.unlink()
            await journal.resume()
            assert journal.failure is None
            assert journal.last_mark() == JournalMark(2, HEADER_SIZE)
            for number in range(1000, 1008):
                await journal.append(record_numbered(number))
                acknowledged.append(record_numbered(number))
            await journal.close()
            return acknowledged

        acknowledged = run(scenario())
        assert [file_id for file_id, _ in journal_files(directory)] == [1, 2]
        journal = Journal(directory)
        assert [record for _, record in journal.replay()] == acknowledged
        assert journal.damage == []


@pytest.mark.parametrize("failing", ["pwrite", "fdatasync", "posix_fallocate"])
def test_replay_stops_at_the_last_durable_record_of_a_failed_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    """Whatever the failed write left in the old file (half a batch, a whole batch that
    was never synced) lies past the end the new file's header records: neither replayed
    nor taken for damage."""
    real = getattr(os, failing)
    armed = threading.Event()

    def fails_once(*args: Any) -> Any:
        if not armed.is_set():
            return real(*args)
        armed.clear()
        if failing == "pwrite":  # a torn write: half the batch lands
            fd, data, offset = args
            real(fd, bytes(data[: len(data) // 2]), offset)
        elif failing == "fdatasync":  # the whole batch landed, but was not synced
            real(*args)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, failing, fails_once)

    async def scenario() -> list[bytes]:
        journal = Journal(tmp_path, direct_io=False, preallocate_size=4096)
        await journal.start()
        acknowledged = numbered(5, size=3000)
        for record in acknowledged:
            await journal.append(record)
        armed.set()
        lost = await asyncio.gather(
            *[journal.append_nowait(b"never acknowledged" * 300) for _ in range(3)],
            return_exceptions=True,
        )
        assert all(isinstance(outcome, WriteFailed) for outcome in lost), lost
        with pytest.raises(IllegalOperation):
            await Journal(tmp_path / "other").resume()
        await journal.resume()
        after = numbered(3, size=5000)
        for record in after:
            await journal.append(record)
        await journal.close()
        return acknowledged + after

    acknowledged = run(scenario())
    journal = Journal(tmp_path)
    assert [record for _, record in journal.replay()] == acknowledged
    assert journal.damage == []


def test_a_start_on_a_full_disk_leaves_the_journal_failed_until_a_file_fits(
    tmp_path: Path,
) -> None:
    with small_filesystem(tmp_path / "disk", 16 << 20) as disk:
        directory = disk / "journal"
        before = run(write_journal(directory, numbered(4), preallocate_size=256 << 10))
        filler = fill(disk, leave=64 << 10)
        failures: list[WriteFailed] = []

        async def scenario() -> None:
            journal = Journal(directory, preallocate_size=256 << 10, on_failure=failures.append)
            assert len(list(journal.replay())) == 4
            await journal.start()
            assert failures
            assert failures[0] is journal.failure
            assert out_of_space(failures[0])
            assert journal.last_mark() == before[-1]  # where a checkpoint may put its mark
            with pytest.raises(WriteFailed, match="cannot write a new journal file"):
                await journal.append(b"refused")
            filler.unlink()
            await journal.resume()
            await journal.append(b"after the start")
            await journal.close()

        run(scenario())
        records = [record for _, record in replayed(directory)]
        assert records == [*numbered(4), b"after the start"]


# -- crash safety, for real ---------------------------------------------------------------


def crash_record(round_number: int, number: int) -> bytes:
    """The record `number` of a crash round: its numbers, then bytes only it has."""
    size = 70_000 if number % 997 == 0 else 10 + (number * 7919) % 400
    head = round_number.to_bytes(2, "big") + number.to_bytes(8, "big")
    return head + bytes((number + i) % 251 for i in range(size))


def crash_child(directory: str, round_number: int) -> None:
    """Replay, start, then append numbered records as fast as possible, printing each
    number once acknowledged, until killed. Small files: rollovers happen under the load."""

    async def load() -> None:
        journal = Journal(Path(directory), file_size=1 << 20, preallocate_size=256 << 10)
        print("replaying", flush=True)
        for _ in journal.replay():
            pass
        await journal.start()
        print("ready", flush=True)
        counter = 0

        async def appender() -> None:
            nonlocal counter
            while True:
                first, counter = counter, counter + 64
                numbers = range(first, first + 64)
                await asyncio.gather(
                    *[journal.append_nowait(crash_record(round_number, n)) for n in numbers]
                )
                sys.stdout.write("".join(f"{n}\n" for n in numbers))
                sys.stdout.flush()

        await asyncio.gather(*[appender() for _ in range(4)])

    asyncio.run(load())


def kill_during_load(directory: Path, round_number: int, after: str, delay: float) -> list[int]:
    """Run a crash child and SIGKILL it `delay` seconds after it prints `after` ("replaying"
    or "ready"): the numbers it had acknowledged."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from tests.bookie.test_journal import crash_child; "
            "crash_child(sys.argv[1], int(sys.argv[2]))",
            str(directory),
            str(round_number),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reached = threading.Event()

    def read() -> None:
        for line in child.stdout or ():
            lines.append(line)
            if line == f"{after}\n":
                reached.set()
        reached.set()

    reader = threading.Thread(target=read)
    reader.start()
    try:
        assert reached.wait(30), f"the crash child never printed {after!r}"
        time.sleep(delay)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        reader.join()
    return [int(line) for line in lines if line.endswith("\n") and line.strip().isdigit()]


def test_sigkill_during_a_write_load_loses_no_acknowledged_record(tmp_path: Path) -> None:
    """Seven rounds on one directory, each killed at a random moment: mostly under load,
    every third one during its replay or start (file creation, torn tail left before)."""
    seed = int.from_bytes(os.urandom(4), "big")
    chance = random.Random(seed)
    acknowledged: dict[int, list[int]] = {}
    for round_number in range(7):
        if round_number % 3 == 2:
            moment = ("replaying", chance.uniform(0, 0.05))
        else:
            moment = ("ready", chance.uniform(0.05, 0.8))
        acknowledged[round_number] = kill_during_load(tmp_path, round_number, *moment)
    by_round: dict[int, list[int]] = {}
    for _, record in replayed(tmp_path):
        found_round = int.from_bytes(record[:2], "big")
        number = int.from_bytes(record[2:10], "big")
        assert record == crash_record(found_round, number), (seed, found_round, number)
        by_round.setdefault(found_round, []).append(number)
    assert list(by_round) == sorted(by_round), seed
    for done, numbers in acknowledged.items():
        kept = by_round.get(done, [])
        assert kept == list(range(len(kept))), (seed, done)
        if numbers:
            assert len(kept) > max(numbers), (seed, done, len(kept), max(numbers))
    assert sum(map(len, acknowledged.values())) > 1000, "the load acknowledged too little"
