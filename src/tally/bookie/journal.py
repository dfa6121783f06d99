"""The bookie's journal: a write-ahead log of opaque records, acknowledged once on disk.

Whatever a bookie accepts (entries, fence marks, master keys, explicit LACs, encoded by the
bookie) is appended here first and answered only after the batch that holds it has been
fdatasync'ed. Ledger storage is written lazily; after a restart `replay` hands back every
record since the last checkpoint, and `release_before` lets go of the files a checkpoint
made redundant.

Files (journal_files.py): every `start()` writes a new file, as does a rollover when the
next batch would take the current file past `file_size`. No file is written again after a
restart, so a tail torn by a crash is never written over or after. The bytes of files and
records, and how replay tells a torn tail from damage, are journal_format.py's. Replay reads
every file but the last up to the end of its records that its successor's header recorded,
and the last one up to its first bad record that no valid record follows (a torn write).
Damage, a bad stretch before that, is logged and listed in `damage`, and replay goes on
after it: the bookie cannot know which records it lost, so it treats the ledgers of that
file as in limbo (limbo.py) rather than forget the records after the damage. A torn write
and a disk that corrupted the last acknowledged records look the same; nothing short of a
second copy can tell them apart, which is what the other bookies of the write quorum are.

Write failures. A failed write, fdatasync, preallocation or new file fails its batch, and
every record queued behind it, with WriteFailed: nothing after the last durable record is
acknowledged, and the journal takes no record until `resume()` writes a new file (the
bookie is read-only meanwhile). The failed file is never written again, since what follows
its last durable record may be a torn or unsynced write; the new file's header records
where those durable records end, so replay reads the failed file up to there and takes the
rest for the torn tail it is. A `start()` whose new file cannot be written (a full disk)
leaves the journal failed in the same way instead of raising: the bookie serves reads and
tries again.

Preallocation: `posix_fallocate` reserves the file `preallocate_size` at a time ahead of
the writes, so every record lands inside the file's size: fdatasync has no size change to
commit, where appending to a growing file makes every fdatasync also commit the inode
(bench/bench_journal.py measures both). On ext4 fdatasync still records that the extents
it wrote are no longer unwritten. Zero-filling instead, as BookKeeper does, writes every
byte twice under load; ahead of a low rate's records it saves 20-40 us of a lone record's
330, but lets a power loss keep a later batch over a lost earlier one, which replay would
take for damage (docs/benchmarks.md): not done.

Writes skip the page cache (O_DIRECT from aligned buffers): only a replay reads the journal
again, and the page cache's copy, pages and writeback cost a large record more than its
share of the disk does. Where the file system refuses O_DIRECT, or with `direct_io=False`, the
same buffers are written through the page cache and the pages a batch completed are dropped
once synced (page_cache.py). A batch that ends inside a disk block leaves that block
zero-padded and writes it again, same bytes first, with the next batch: replay takes the
zeros for the end of the records, as it does preallocated space.

Group commit: as a record is appended, the event loop's thread frames and checksums it and
copies it into the staging buffers (journal_staging.py), which also decide where each record
lands and when a file rolls over; a batch closes at the record that brings it to
`max_batch_bytes`. The journal's writer thread writes one batch after the other; its sync
thread fdatasyncs whatever has been written since its last fdatasync and answers those
batches with one `call_soon_threadsafe` (BookKeeper's journal and force-write threads).
While one batch is synced the next is written, and while that is written the next is staged,
taken by the writer itself once done: batches grow with the load and add no latency when
idle. A record may be appended in two parts (`append_then`: the bookie's record header and
the entry), copied once, straight into the staging buffer; and its waiter may be a plain
callback, called from the batch's completion, since a future per record, with the loop
callback its result schedules, is a large part of an add's cost. `max_batch_delay`
(BookKeeper's journalMaxGroupWaitMSec) can make a batch wait for company; it defaults to 0,
since the adaptive batching needs no wait (see the benchmark).

An idle journal (no batch being written or synced) writes and fdatasyncs a small batch
(`SYNC_HERE_MAX_BYTES`) on the event loop's own thread, in the same order and with the same
failure handling, while the recent fdatasyncs were all quick (`SYNC_HERE_MAX_SECONDS`). At a
low rate every add is such a batch, and the two thread hops (to the writer, back to the
loop) cost more than the sync: about a quarter of a bookie's CPU per add paced at 1,000
adds/s, and 0.1 ms of its latency (docs/benchmarks.md, issue 21). The loop is blocked for
that sync (0.1-0.2 ms here): a disk stall that starts during one blocks the loop once, for
the stall, and sends the batches after it to the threads. Under load, batches are in flight
and go to the threads as before, as they do while the journal closes and while a failpoint
is enabled (a test's `delay` or error is then met where it always was).
"""

from __future__ import annotations

import asyncio
import enum
import errno
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, TypeAlias

from tally.bookie.direct_io import aligned_up, enable_direct
from tally.bookie.journal_files import (
    OpenFile,
    create_file,
    journal_files,
    pwrite_all,
    records_end,
    release_files,
    remove_temporaries,
    replay_files,
)
from tally.bookie.journal_format import HEADER_SIZE, Damage, FileHeader, JournalMark, frame
from tally.bookie.journal_staging import JournalStage, StagedBuffer
from tally.bookie.page_cache import drop_written
from tally.core.digest import crc32c
from tally.core.errors import BadRequest, IllegalOperation, WriteFailed
from tally.failpoints import active as failpoints_active
from tally.failpoints import failpoint

log = logging.getLogger(__name__)

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The errors of a file system out of room (or quota), which room cures."""
DEFAULT_FILE_SIZE = 2 << 30
"""BookKeeper's journalMaxSizeMB (2048)."""
DEFAULT_PREALLOCATE_SIZE = 16 << 20
"""BookKeeper's journalPreAllocSizeMB (16)."""
DEFAULT_MAX_BATCH_BYTES = 1 << 20
"""A batch closes at the record that brings it to this size. BookKeeper's
journalBufferedWritesThreshold is 512 KiB, but that bounds its write buffer, not its fsync
group, which its force-write thread makes larger. Here one batch is one fdatasync, and large
records get much closer to the disk's raw rate with 1 MiB batches than with 512 KiB ones
(bench/bench_journal.py; docs/benchmarks.md)."""
RECENT_FDATASYNCS = 1024
"""fdatasync latencies kept for the metrics."""
SYNC_HERE_MAX_BYTES = 8 << 10
"""An idle journal writes and syncs a batch up to this size on the event loop itself (see
the module docstring)."""
SYNC_HERE_MAX_SECONDS = 0.002
"""... once the last QUICK_SYNCS_BEFORE_SYNC_HERE fdatasyncs each took at most this long:
one slower sync sends the batches back to the writer threads until that many quick ones
again, so that a disk that stalls blocks the loop once at most, not for every add."""
QUICK_SYNCS_BEFORE_SYNC_HERE = 8


Done: TypeAlias = Callable[["JournalMark | None", Exception | None], None]
"""`append_then`'s callback: (the record's mark, None) once it is durable, else (None, the
WriteFailed)."""
JournalRecord: TypeAlias = tuple[bytes, "bytes | memoryview", "int | None"]
"""A record for `append_all_then`: its head, its body, and the body's CRC32C if known."""
OnFailure: TypeAlias = Callable[[WriteFailed], None]
"""Told, on the event loop, when the journal stops taking records (before any waiter)."""


def out_of_space(error: BaseException) -> bool:
    """Whether the journal failed for want of room (its WriteFailed's cause)."""
    cause = error.__cause__ if isinstance(error, WriteFailed) else error
    return isinstance(cause, OSError) and cause.errno in NO_SPACE


@dataclass
class JournalStats:
    """Counters of the write path for the bookie's metrics, kept by whichever thread writes
    or syncs a batch (the journal's threads, or the loop for an idle journal's small one)."""

    records: int = 0
    batches: int = 0
    bytes_written: int = 0
    files_created: int = 0
    write_failures: int = 0
    """Failures that stopped the journal, and failed attempts to resume it."""
    last_fdatasync_seconds: float = 0.0
    recent_fdatasync_seconds: deque[float] = field(
        default_factory=lambda: deque(maxlen=RECENT_FDATASYNCS)
    )

    def fdatasync_quantile(self, q: float) -> float:
        """The `q` quantile (0..1) of the recent fdatasync latencies, in seconds; 0 if none."""
        recent = sorted(self.recent_fdatasync_seconds)
        if not recent:
            return 0.0
        return recent[min(len(recent) - 1, int(q * len(recent)))]


_Waiter: TypeAlias = asyncio.Future[JournalMark] | Done | None
"""Whoever waits for a record: None for the records of `append_all_then` but its last."""
_Batch: TypeAlias = StagedBuffer[_Waiter]


class _Written(NamedTuple):
    """A batch the writer thread wrote, for the sync thread to fdatasync and answer."""

    waiters: list[_Waiter]
    file: OpenFile
    ends: list[int]
    start: int
    end: int
    """The file range written."""


class _Retired(NamedTuple):
    """A file the writer rolled away from: closed once what was written to it is synced."""

    file: OpenFile


class _WriteError(NamedTuple):
    """A batch whose write failed: answered with the error, in its turn."""

    waiters: list[_Waiter]
    error: WriteFailed


@dataclass(frozen=True, slots=True)
class _WriterStopped:
    """The answer to a batch whose write failed: the writer stopped there, leaving
    `_in_flight` set, which only this answer clears."""

    error: WriteFailed


_Outcome: TypeAlias = tuple[int, list[int]] | Exception | _WriterStopped
"""A batch's answer: (file id, the end of each record), or the error that lost it (a failed
fdatasync's, or the write's own, after which the writer stopped)."""


class _State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


_RUNNING = _State.RUNNING
"""For the append path: looking a member up on its Enum class is slow for a hot path."""


class Journal:
    """The write-ahead journal of one bookie directory. See the module docstring.

    Use: `replay()` at start-up (synchronously, before serving), then `await start()`,
    then `append`/`append_nowait` from the event loop's thread only, and `await close()`.
    A journal object runs once. After a write error every pending and later append fails with
    `WriteFailed` (its `__cause__` is the OSError), `on_failure` is told, and the bookie turns
    read-only; `await resume()` writes a new file and takes records again.
    """

    def __init__(
        self,
        directory: Path,
        *,
        file_size: int = DEFAULT_FILE_SIZE,
        preallocate_size: int = DEFAULT_PREALLOCATE_SIZE,
        max_batch_delay: float = 0.0,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        fsync: bool = True,
        direct_io: bool = True,
        on_failure: OnFailure | None = None,
    ) -> None:
        if file_size <= HEADER_SIZE:
            raise BadRequest(f"journal file_size {file_size} must exceed the header")
        if preallocate_size <= 0 or max_batch_bytes <= 0 or max_batch_delay < 0:
            raise BadRequest(
                f"journal sizes must be positive and the delay not negative: preallocate_size "
                f"{preallocate_size}, max_batch_bytes {max_batch_bytes}, "
                f"max_batch_delay {max_batch_delay}"
            )
        self.directory = Path(directory)
        self.file_size = file_size
        self.preallocate_size = preallocate_size
        self.max_batch_delay = max_batch_delay
        self.max_batch_bytes = max_batch_bytes
        self.fsync = fsync
        self.direct_io = direct_io
        self._on_failure = on_failure
        self.stats = JournalStats()
        self._state = _State.NEW
        self._failure: WriteFailed | None = None
        # What replay learnt: where the last file's records end, the newest id in use.
        self._tail: JournalMark | None = None
        self.damage: list[Damage] = []
        """What the last replay found damaged (journal_format.Damage), in journal order."""
        self._highest_file_id = 0
        self._last_mark = JournalMark(0, 0)
        # The journal thread's file, and where the records end of the file that the next
        # new file follows (None: look on disk).
        self._file: OpenFile | None = None
        self._predecessor: JournalMark | None = None
        # The queue: two parts per record (its head and the rest), its size with the
        # frame, and who waits for it.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._syncer: ThreadPoolExecutor | None = None
        self._written: list[_Written | _Retired | _WriteError] = []
        """What the writer thread handed to the sync thread, in order (under `_sync_lock`)."""
        self._sync_lock = threading.Lock()
        self._sync_failure: WriteFailed | None = None
        self._syncing = False
        """Whether a thread is syncing and answering items (under `_sync_lock`)."""
        self._pending_sync = 0
        """Batches written but not yet answered (under the queue lock)."""
        self._quick_syncs = 0
        """fdatasyncs in a row that took at most SYNC_HERE_MAX_SECONDS (`_may_sync_here`)."""
        self._stage: JournalStage[_Waiter] | None = None
        """Records appended and not yet written (under the queue lock); made by start()."""
        self._first_queued_at = 0.0
        self._flush_handle: asyncio.Handle | None = None
        self._flush_is_timer = False
        self._in_flight = False
        self._queue_lock = threading.Lock()
        """Guards the stage and `_in_flight`: the journal thread takes its next batch itself."""
        self._drained: asyncio.Future[None] | None = None
        self._closed: asyncio.Future[None] | None = None

    # -- start-up ------------------------------------------------------------------------

    def replay(self, start: JournalMark | None = None) -> Iterator[tuple[JournalMark, bytes]]:
        """Every record after `start` (all records if None) with the mark of its end, in order.

        Synchronous, for start-up before `start()`. Raises `MalformedData` for a foreign
        file or a missing file. Damage, a stretch without valid records where records were
        acknowledged, is logged and listed in `damage` once the iteration is over; the
        records after it are replayed. Stops at the end of the last file's records (logging
        a torn tail).
        """
        if self._state is not _State.NEW:
            raise IllegalOperation("journal replay must come before start()")
        return self._replay(start)

    def _replay(self, start: JournalMark | None) -> Iterator[tuple[JournalMark, bytes]]:
        if start is not None:
            self._highest_file_id = max(self._highest_file_id, start.file_id)
        self.damage = []
        end = yield from replay_files(self.directory, start)
        self.damage = list(end.damage)
        self._tail = end.tail

    async def start(self) -> None:
        """Write a new journal file (never append to an old, possibly torn one).

        A file system that refuses the file (full, failing) leaves the journal started but
        failed, as after a write error, rather than raising: see `resume()`.
        """
        if self._state is not _State.NEW or self._executor is not None:
            raise IllegalOperation(f"journal start() in state {self._state.value}")
        self._loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tally-journal")
        self._syncer = ThreadPoolExecutor(1, thread_name_prefix="tally-journal-sync")
        try:
            file_id, header = await self._loop.run_in_executor(self._executor, self._open)
        except OSError as error:
            # Every record replayed lies before the end of the last file, which a checkpoint
            # may therefore mark (JournalMark(0, 0): no file at all).
            self._last_mark = self._predecessor or JournalMark(0, 0)
            self._state = _State.RUNNING
            self._fail(self._new_file_failed(error), [])
            return
        except BaseException:
            self._executor.shutdown(wait=False)
            self._syncer.shutdown(wait=False)
            raise
        self._started(file_id, header)

    def _started(self, file_id: int, header: bytes) -> None:
        """Take records into the new file `file_id`, whose header is `header`."""
        self._last_mark = JournalMark(file_id, HEADER_SIZE)
        if self._stage is not None:
            self._stage.close()
        self._stage = JournalStage(
            file_id,
            header,
            file_size=self.file_size,
            batch_bytes=self.max_batch_bytes,
            new_file_header=lambda *fields: FileHeader(*fields).to_bytes(),
        )
        self._state = _State.RUNNING

    def _open(self) -> tuple[int, bytes]:
        """Journal thread: write the new file, then let go of the one it follows (if a
        failed one is open); returns its id and header."""
        if self._predecessor is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            remove_temporaries(self.directory)
            self._predecessor = self._last_file_end()
        previous = self._predecessor
        file_id = max(previous.file_id, self._highest_file_id) + 1
        header = FileHeader(file_id, *previous).to_bytes()
        created = self._create(file_id, header)
        if self._file is not None:
            self._file.close()
        self._file = created
        self._predecessor = None
        return file_id, header

    def _last_file_end(self) -> JournalMark:
        """Journal thread: where the records of the directory's last file end ((0, 0): no
        file), as replay found it or read through."""
        files = journal_files(self.directory)
        if not files:
            return JournalMark(0, 0)
        last_id, last_path = files[-1]
        if self._tail is not None and self._tail.file_id == last_id:
            return self._tail
        return JournalMark(last_id, records_end(last_path, last_id))

    def _create(self, file_id: int, header: bytes) -> OpenFile:
        """A new file, durable with its header and first chunk before it gets its name."""
        allocated = min(self.preallocate_size, self.file_size)
        path, fd = create_file(self.directory, file_id, header, allocated, fsync=self.fsync)
        try:
            direct = self._direct(fd)
        except BaseException:
            os.close(fd)
            raise
        self.stats.files_created += 1
        return OpenFile(file_id, path, fd, max(allocated, HEADER_SIZE), direct)

    def _direct(self, fd: int) -> bool:
        """Whether `fd` is now written with O_DIRECT (not if so configured, or refused)."""
        if self.direct_io and not enable_direct(fd):
            log.info(
                "journal %s: the file system refuses O_DIRECT; writing through the page cache",
                self.directory,
            )
            self.direct_io = False
        return self.direct_io

    async def resume(self) -> None:
        """After a failure: write a new file and take records again; raises WriteFailed
        (and stays failed) if the new file cannot be written either.

        Waits until every batch in flight has been answered, then writes a file whose
        header records the end of the last durable record of the failed one: replay reads
        no further there, where the failed write may have left anything.
        """
        if self._state is not _RUNNING or self._failure is None:
            raise IllegalOperation(f"journal resume() in state {self._state.value}, not failed")
        assert self._loop is not None
        assert self._executor is not None
        await self._answered()
        if self._state is not _RUNNING:
            raise IllegalOperation(f"journal resume() in state {self._state.value}")
        failed = self._file
        if failed is not None:
            durable = self._last_mark
            end = durable.offset if durable.file_id == failed.file_id else HEADER_SIZE
            self._predecessor = JournalMark(failed.file_id, end)
        try:
            file_id, header = await self._loop.run_in_executor(self._executor, self._open)
        except OSError as error:
            self.stats.write_failures += 1
            raise self._new_file_failed(error) from error
        if self._state is not _RUNNING:  # closed meanwhile: the new file was closed with it
            return
        self._started(file_id, header)
        self._failure = self._sync_failure = None
        log.info(
            "journal %s: writing again, in the new file %s, after the failure",
            self.directory,
            self._file.path if self._file is not None else file_id,
        )

    def _new_file_failed(self, error: OSError) -> WriteFailed:
        failure = WriteFailed(f"journal {self.directory}: cannot write a new journal file: {error}")
        failure.__cause__ = error
        return failure

    @property
    def failure(self) -> WriteFailed | None:
        """Why the journal takes no records (None while it does)."""
        return self._failure

    # -- appends -------------------------------------------------------------------------

    async def append(self, record: bytes) -> JournalMark:
        """Journal `record`; returns its mark once the batch holding it is on disk.

        Cancelling the wait does not withdraw the record: it is written all the same.
        """
        return await self.append_nowait(record)

    def append_nowait(self, record: bytes) -> asyncio.Future[JournalMark]:
        """Queue `record` and return the future of its mark: no coroutine per record."""
        loop = self._running_loop()
        future: asyncio.Future[JournalMark] = loop.create_future()
        if self._failure is not None:
            future.set_exception(self._write_failed())
            return future
        self._enqueue(loop, ((b"", record, None),), future)
        return future

    def append_then(
        self, head: bytes, body: bytes | memoryview, done: Done, body_crc: int | None = None
    ) -> None:
        """Journal the record `head + body`; call `done(mark, None)` with its mark once it is
        durable, or `done(None, error)` with the WriteFailed that lost it. `body_crc` is the
        CRC32C of `body` if the caller has just checked it (computed here if None).

        The parts are written as they are, never joined, and `done` is called from the
        batch's completion on the event loop (it must not raise): the add path's way in.
        Raises WriteFailed at once if the journal has already failed.
        """
        self.append_all_then(((head, body, body_crc),), done)

    def append_all_then(self, records: Sequence[JournalRecord], done: Done) -> None:
        """Journal each (head, body, body's CRC32C or None) as `append_then` does one, in
        order; `done` is called once, with the last record's mark, when all are durable (a
        record is never durable before those journaled ahead of it): the way in for the
        adds of one receive, which are answered together."""
        if not records:
            raise BadRequest("append_all_then takes at least one record: `done` waits on the last")
        loop = self._running_loop()
        if self._failure is not None:
            raise self._write_failed()
        self._enqueue(loop, records, done)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._state is not _RUNNING or self._loop is None:
            raise IllegalOperation(f"journal append in state {self._state.value}")
        return self._loop

    def _enqueue(
        self,
        loop: asyncio.AbstractEventLoop,
        records: Sequence[JournalRecord],
        waiter: asyncio.Future[JournalMark] | Done,
    ) -> None:
        framed = [
            (frame(head, len(body), crc32c(body) if crc is None else crc), body)
            for head, body, crc in records
        ]
        stage = self._stage
        assert stage is not None
        if not stage.queued_bytes and self.max_batch_delay:
            self._first_queued_at = loop.time()
        with self._queue_lock:
            stage.add_all(framed, waiter, None)
            if self._in_flight:
                return
        if self._flush_handle is None:
            self._schedule_flush()
        elif self._flush_is_timer and stage.queued_bytes >= self.max_batch_bytes:
            self._flush_handle.cancel()
            self._schedule_flush()

    @property
    def queued_bytes(self) -> int:
        """Bytes waiting for the next batch (a measure of backlog, for back-pressure)."""
        return 0 if self._stage is None else self._stage.queued_bytes

    def last_mark(self) -> JournalMark:
        """The end of the last durable record (the new file's header end before any)."""
        if self._state is _State.NEW:
            raise IllegalOperation("journal last_mark() before start()")
        return self._last_mark

    def _schedule_flush(self) -> None:
        assert self._loop is not None
        wait = self._waits_for_company()
        if wait:
            due = self._first_queued_at + self.max_batch_delay
            self._flush_handle = self._loop.call_at(due, self._flush)
        else:
            self._flush_handle = self._loop.call_soon(self._flush)
        self._flush_is_timer = wait

    def _waits_for_company(self) -> bool:
        """Whether the queue waits `max_batch_delay` for more records before it is written."""
        return (
            self.max_batch_delay > 0
            and self._state is _RUNNING
            and self.queued_bytes < self.max_batch_bytes
        )

    def _flush(self) -> None:
        """Hand the queue (up to `max_batch_bytes` of it) to the journal thread, if idle."""
        self._flush_handle = None
        with self._queue_lock:
            if self._in_flight:
                return
            batch = self._take_batch()
            if batch is None:
                return
            self._in_flight = True
            here = self._may_sync_here(batch)
        if here:
            self._write_and_sync_here(batch)
            return
        assert self._executor is not None
        self._executor.submit(self._run_batches, batch)

    def _may_sync_here(self, batch: _Batch) -> bool:
        """Whether the loop may write and sync `batch` itself: nothing else is being
        written or synced, it is small, needs no new file or preallocation, and the recent
        fdatasyncs were quick. Call under the queue lock."""
        f = self._file
        return (
            self._pending_sync == 0
            and self._state is _RUNNING
            and self._failure is None
            and self._quick_syncs >= QUICK_SYNCS_BEFORE_SYNC_HERE
            and f is not None
            and batch.previous is None
            and batch.staged <= SYNC_HERE_MAX_BYTES
            and batch.start + aligned_up(batch.filled) <= f.allocated
            and not failpoints_active()
        )

    def _write_and_sync_here(self, batch: _Batch) -> None:
        """`_run_batches` and `_sync_written` for one batch, on the event loop: written,
        synced and answered before this returns."""
        try:
            written: _Written | _WriteError = self._write_batch(batch)
        except WriteFailed as error:
            written = _WriteError(batch.waiters, error)
        with self._queue_lock:
            assert self._stage is not None
            self._stage.give_back(batch)
            self._pending_sync += 1
            if isinstance(written, _Written):
                self._in_flight = False
            # A failed write leaves `_in_flight` set: its answer (_WriterStopped) clears it.
        self._sync_items([written], answer=self._batches_done)

    def _take_batch(self) -> _Batch | None:
        """The next batch off the stage, or None (empty); call under the queue lock."""
        return None if self._stage is None else self._stage.take()

    def _run_batches(self, batch: _Batch) -> None:
        """Journal thread: write batches while records are queued, handing each to the sync
        thread, which fdatasyncs what was written and answers it.

        The writer takes its next batch itself as soon as one is written (handed over by the
        event loop instead, it stands idle for part of the time under a heavy load), and
        writes it while the sync thread flushes the one before, so that a write and an
        fdatasync overlap instead of following each other.
        """
        while True:
            try:
                written: _Written | _WriteError = self._write_batch(batch)
            except WriteFailed as error:
                written = _WriteError(batch.waiters, error)
            following = None
            with self._queue_lock:
                assert self._stage is not None
                self._stage.give_back(batch)
                self._pending_sync += 1
                if isinstance(written, _Written):
                    if not self._waits_for_company():
                        following = self._take_batch()
                    self._in_flight = following is not None
                # A failed write leaves `_in_flight` set: its answer (_WriterStopped) clears it.
            self._hand_to_syncer(written, last=following is None)
            if following is None:
                return
            batch = following

    def _hand_to_syncer(self, item: _Written | _Retired | _WriteError, last: bool = False) -> None:
        """Queue `item` for the sync thread; or, for the `last` batch before the writer
        goes idle, when the sync thread has nothing queued or running, sync it right here:
        at a low rate every batch is such a one, and the hop to the other thread would add
        to each add's latency."""
        with self._sync_lock:
            self._written.append(item)
            inline = last and len(self._written) == 1 and not self._syncing
        if inline:
            self._sync_written()
            return
        assert self._syncer is not None
        self._syncer.submit(self._sync_written)

    def _write_batch(self, batch: _Batch) -> _Written:
        f = self._file
        assert f is not None
        try:
            if batch.previous is not None:
                f = self._roll(f, batch)
            failpoint("journal.write")
            with batch.padded() as data:
                end = batch.start + len(data)
                if end > f.allocated:
                    target = max(end, min(f.allocated + self.preallocate_size, self.file_size))
                    os.posix_fallocate(f.fd, f.allocated, target - f.allocated)
                    f.allocated = target
                pwrite_all(f.fd, data, batch.start)
        except OSError as e:
            raise WriteFailed(
                f"journal {f.path}: writing {len(batch.waiters)} records ({batch.staged} bytes) "
                f"at offset {batch.start} failed: {e}"
            ) from e
        self.stats.records += len(batch.waiters)
        self.stats.bytes_written += batch.staged
        return _Written(batch.waiters, f, batch.ends, batch.start, end)

    def _roll(self, old: OpenFile, batch: _Batch) -> OpenFile:
        """Create the file that `batch` begins (its header is staged) and retire `old`."""
        self._file = self._create(batch.file_id, bytes(batch.memory[:HEADER_SIZE]))
        self._hand_to_syncer(_Retired(old))
        return self._file

    def _sync_written(self) -> None:
        """Sync thread: fdatasync every file written to since the last call, close the files
        retired before that, and answer the batches in order, in one loop callback."""
        with self._sync_lock:
            items, self._written = self._written, []
            if not items:
                return
            self._syncing = True
        try:
            self._sync_items(items)
        finally:
            with self._sync_lock:
                self._syncing = False

    def _sync_items(
        self,
        items: list[_Written | _Retired | _WriteError],
        answer: Callable[[list[tuple[list[_Waiter], _Outcome]]], None] | None = None,
    ) -> None:
        """fdatasync the files `items` wrote to and answer them, through the loop's
        `_batches_done` (`answer`, called here on the loop; by default from another thread)."""
        failure = self._sync_failure
        if failure is None:
            try:
                self._fdatasync(
                    {id(i.file): i.file for i in items if not isinstance(i, _WriteError)}
                )
            except OSError as error:
                failure = self._sync_failure = WriteFailed(
                    f"journal {self.directory}: fdatasync failed: {error}"
                )
                failure.__cause__ = error
        answers: list[tuple[list[_Waiter], _Outcome]] = []
        for item in items:
            if isinstance(item, _Retired):
                continue
            if isinstance(item, _WriteError):
                failure = self._sync_failure = self._sync_failure or item.error
                answers.append((item.waiters, _WriterStopped(item.error)))
            elif failure is not None:
                answers.append((item.waiters, failure))
            else:
                answers.append((item.waiters, (item.file.file_id, item.ends)))
        if answer is not None:
            answer(answers)
        else:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._batches_done, answers)
        for item in items:
            if isinstance(item, _Written) and failure is None and not item.file.direct:
                # Once the answer is on its way: only a replay reads the journal again.
                drop_written(item.file.fd, item.start, item.end)
        for item in items:
            if isinstance(item, _Retired):
                item.file.close()

    def _fdatasync(self, files: dict[int, OpenFile]) -> None:
        if not self.fsync or not files:
            return
        started = time.perf_counter()
        failpoint("journal.fdatasync")
        for f in files.values():
            os.fdatasync(f.fd)
        elapsed = time.perf_counter() - started
        # One thread at a time: the sync thread, or the loop when nothing else is in flight.
        self._quick_syncs = self._quick_syncs + 1 if elapsed <= SYNC_HERE_MAX_SECONDS else 0
        self.stats.batches += 1
        self.stats.last_fdatasync_seconds = elapsed
        self.stats.recent_fdatasync_seconds.append(elapsed)

    def _batches_done(self, answers: list[tuple[list[_Waiter], _Outcome]]) -> None:
        with self._queue_lock:
            self._pending_sync -= len(answers)
        for waiters, outcome in answers:
            self._batch_done(waiters, outcome)

    def _batch_done(self, waiters: list[_Waiter], outcome: _Outcome) -> None:
        if isinstance(outcome, _WriterStopped):
            self._in_flight = False
            outcome = outcome.error
        # A failed fdatasync leaves `_in_flight` to the writer, which may still be writing
        # the next batch: it clears it once the failure has emptied the queue. Cleared here,
        # a resume() could go on before that batch is answered, and a sync thread that took
        # it after the resume would sync and acknowledge records beyond the end that the
        # new file's header gives the failed one, which replay never reads.
        if isinstance(outcome, Exception):
            if self._failure is None:
                self._fail(outcome, waiters)
            else:
                self._fail_waiters(waiters)
        elif waiters:  # none for a batch that holds only the start of a long record
            file_id, ends = outcome
            self._last_mark = JournalMark(file_id, ends[-1])
            for waiter, end in zip(waiters, ends, strict=True):
                if waiter is None:
                    continue
                if isinstance(waiter, asyncio.Future):
                    if not waiter.done():
                        waiter.set_result(JournalMark(file_id, end))
                else:
                    _call(waiter, JournalMark(file_id, end), None)
        if self._in_flight or self._pending_sync:
            return
        if self.queued_bytes:
            if self._flush_handle is None:
                self._schedule_flush()
        elif self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _fail(self, error: Exception, waiters: list[_Waiter]) -> None:
        if isinstance(error, WriteFailed):
            self._failure = error
        else:
            self._failure = WriteFailed(f"journal {self.directory}: write failed: {error!r}")
            self._failure.__cause__ = error
        self.stats.write_failures += 1
        log.error("%s; the journal takes no records until it can write a new file", self._failure)
        with self._queue_lock:
            waiting = waiters + (self._stage.discard() if self._stage is not None else [])
        if self._on_failure is not None:
            try:
                self._on_failure(self._failure)
            except Exception:
                log.exception("journal: the failure callback failed")
        self._fail_waiters(waiting)

    def _fail_waiters(self, waiters: list[_Waiter]) -> None:
        for waiter in waiters:
            if waiter is None:
                continue
            if isinstance(waiter, asyncio.Future):
                if not waiter.done():
                    waiter.set_exception(self._write_failed())
            else:
                _call(waiter, None, self._write_failed())

    def _write_failed(self) -> WriteFailed:
        """A fresh error per future (a shared one would collect every awaiter's traceback)."""
        assert self._failure is not None
        error = WriteFailed(str(self._failure))
        error.__cause__ = self._failure.__cause__
        return error

    # -- shutdown and checkpoints --------------------------------------------------------

    async def close(self) -> None:
        """Write what is queued, wait for it to be on disk, and stop."""
        if self._state is _State.NEW:
            self._state = _State.CLOSED
            return
        if self._closed is None:
            self._closed = asyncio.ensure_future(self._shut_down())
        await asyncio.shield(self._closed)

    async def _shut_down(self) -> None:
        assert self._loop is not None
        assert self._executor is not None
        self._state = _State.CLOSING
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush()
        await self._answered()
        await self._loop.run_in_executor(self._executor, self._close_file)
        self._executor.shutdown(wait=True)
        assert self._syncer is not None
        self._syncer.shutdown(wait=True)
        self._state = _State.CLOSED

    async def _answered(self) -> None:
        """Until every batch handed to the journal thread has been answered."""
        assert self._loop is not None
        if self._in_flight or self._pending_sync:
            if self._drained is None or self._drained.done():
                self._drained = self._loop.create_future()
            await asyncio.shield(self._drained)

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._stage is not None:
            self._stage.close()

    def release_before(self, mark: JournalMark, keep: Collection[int] = ()) -> list[Path]:
        """Delete the files wholly before `mark` (a checkpoint's) but those whose ids are in
        `keep` (ledger storage still reads entries there); returns those deleted.

        Blocking (unlink, directory fsync): call it from the checkpoint's thread. The file
        being written is never deleted, whatever the mark.
        """
        limit = mark.file_id
        if self._state is not _State.NEW:
            limit = min(limit, self._last_mark.file_id)
        return release_files(self.directory, limit, keep, fsync=self.fsync)


def _call(done: Done, mark: JournalMark | None, error: Exception | None) -> None:
    """Run an `append_then` callback; one that raises must not keep the rest unanswered."""
    try:
        done(mark, error)
    except Exception:
        log.exception("journal: a record's callback failed")
