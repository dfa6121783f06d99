"""The bookie's scrubber: every entry its index holds read back from disk and checked, a step
at a time, so that bit rot is found before a read or a recovery needs the copy.

Nothing else looks at the bytes: the index says an entry is there, the replicas check and
the audit compare indexes, and a rotten copy shows only when it is read (EntryCorrupt).

A pass reads the files, not the index, so that it reads each disk sequentially: the entry
logs in id order, then the journal files that keep entries (kept_location), the one of the
last checkpoint's mark up to the mark (the records after it are not indexed yet). The files
are those of when the pass started (the log being written up to what is flushed when the
pass reaches it): later ones are the next pass's, so a pass under a write load ends.

A step reads the next stretch of the current file (large reads, past the page cache; at
full speed the next stretch is read by a thread while this one is checked) and parses its
records; each record whose entry the index points at, exactly there, is checked as a read
checks it: its header names the ledger, the entry and the size the index holds (true by
the look-up), and its bytes match their stored CRC32C, the client's, end to end. Records
the index does not point at are garbage (replaced, deleted, moved by compaction): skipped.
For small entries Python's cost per record is the pass's speed, so records are checked a
batch at a time: their lengths walked, each CRC32C taken, the headers compared as arrays,
and the index read once per run of consecutive entries of one ledger (a checkpoint writes
each ledger's entries together), not once per record. Journal files are parsed as replay
parses them.

The index and the file must agree both ways: every entry the index places in a file must
be found there. The index counts, per file, the bytes of each ledger's entries in it (the
`usage` counts, compactor.py), never too few; a file read through gives each ledger's bytes
found. Where a ledger still in the index has more counted than found (a record whose header
or length rotted, so that the parse missed it or lost its way, or an index entry pointing
at no record), each of its entries that the index places in the file and the scan did not
find is read where the index points and checked (in a file still written, those before
where the scan got to). The files written before usage was counted are read without that
check.

A record that fails is not called corrupt yet: ledger storage (`settle`) looks the entry up
again, under its lock. If the index no longer points at that record, the entry was moved by
compaction (which checked the bytes it copied), replaced by a re-add (checked on arrival)
or deleted since it was looked up: not corrupt. Only a copy that still fails where the
index still points is marked corrupt (ledger storage keeps the marks). A record that
passes while marked corrupt is unmarked.

Each step writes the pass under way and where it reached to the index; a restart goes on
from there (what was found in that file is in memory only: its counts are not compared). A
complete pass is kept (the last `KEPT_PASSES`), durably, with its figures: the next is due
an interval after it ended (tally.core.scrub decides when, and at what rate;
scrubber_service.py runs the steps).

Threads: `step` runs in a worker thread, one at a time (with its read-ahead thread);
reads, adds, checkpoints and compaction go on meanwhile (it takes no lock of ledger
storage but the short one, in `settle`). `stop` (the storage closing) waits for a step
under way to end at its next read.
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import itertools
import logging
import mmap
import os
import struct
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tally.bookie.compactor import yielding
from tally.bookie.direct_io import ALIGNMENT
from tally.bookie.entry_log import (
    FILE_HEADER_SIZE,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    EntryLog,
    Location,
    log_file_name,
)
from tally.bookie.index import FileKey, Index, ScrubProgress
from tally.bookie.journal_entries import (
    ENTRY_HEAD,
    KEPT_ENTRY_SIZE,
    JournalEntries,
    JournalLocation,
    RecordType,
    kept_location,
)
from tally.bookie.journal_format import HEADER_SIZE, JournalMark, file_name, scan_records
from tally.bookie.page_cache import drop_range
from tally.core.compaction import FileKind
from tally.core.digest import crc32c
from tally.core.errors import EntryCorrupt, EntryUnreadable, IllegalOperation
from tally.core.ids import LedgerId
from tally.core.scrub import ScrubPass, ScrubTrigger

log = logging.getLogger(__name__)

KEPT_PASSES = 16
"""Complete passes the index keeps, for `tally shell scrub`."""
YIELD_AFTER = 0.002
"""Seconds of checking between two chances for the bookie's other threads to take the GIL
(compactor.yielding): longer than compaction's, since a scheduled step is shorter than
this (the rate bounds it) and a pass at full speed is an operator's choice, whose speed
each `sleep(0)` costs on a busy machine."""
READ_BYTES = 4 << 20
"""Bytes of an entry log read at once at most (a larger record is read in pieces)."""


IntArray = npt.NDArray[np.int64]


class Verdict(enum.Enum):
    """What a copy turned out to be, once ledger storage looked the entry up again."""

    HEALTHY = "healthy"
    """Moved, replaced or deleted since: the copy the index points to now is not this one."""
    CORRUPT = "corrupt"
    """Marked corrupt (now, or it already was)."""
    UNREADABLE = "unreadable"


Settle = Callable[[LedgerId, int, Location | JournalLocation, bool, str], Verdict]
"""settle(ledger, entry, location, corrupt, problem): a copy at `location` failed, corrupt
(its check) or not (an I/O error), for `problem`; ledger storage says what it is."""
Verified = Callable[[LedgerId, int, Location | JournalLocation], None]
"""verified(ledger, entry, location): the copy at `location` passed its check."""


@dataclass(frozen=True, slots=True)
class ScrubStep:
    """What one step did, and the pass it belongs to afterwards (complete if it ended)."""

    scrub: ScrubPass
    bytes: int
    entries: int
    corrupt: int
    unreadable: int


@dataclass(slots=True)
class ScrubStats:
    """Totals since the storage was opened, for the bookie's metrics."""

    bytes: int = 0
    entries: int = 0
    corrupt: int = 0
    """Copies found corrupt by the scrubber (each time a pass finds one)."""
    unreadable: int = 0
    passes: int = 0
    last_complete: float | None = None
    """When the last complete pass ended (kept across restarts)."""

    def copy(self) -> ScrubStats:
        return ScrubStats(
            self.bytes,
            self.entries,
            self.corrupt,
            self.unreadable,
            self.passes,
            self.last_complete,
        )


@dataclass(slots=True)
class _Tally:
    """What a step did so far."""

    bytes: int = 0
    entries: int = 0
    corrupt: int = 0
    unreadable: int = 0


@dataclass(slots=True)
class _Found:
    """The entries the scan of one file found where the index places them: their bytes by
    ledger, and their ids as runs (a checkpoint writes each ledger's entries together).
    Ledgers are keyed by (scope, id): a LedgerId's hash is slower, and this is per record."""

    bytes: dict[tuple[int, int], int] = field(default_factory=lambda: defaultdict(int))
    runs: dict[tuple[int, int], list[list[int]]] = field(default_factory=dict)

    def add(self, scope: int, ledger: int, entry_id: int, size: int) -> None:
        self.add_run(scope, ledger, entry_id, entry_id, size)

    def add_run(self, scope: int, ledger: int, first: int, last: int, size: int) -> None:
        """Entries `first` to `last` of a ledger, of `size` bytes in all."""
        key = (scope, ledger)
        self.bytes[key] += size
        runs = self.runs.get(key)
        if runs is None:
            self.runs[key] = [[first, last]]
        elif runs[-1][1] + 1 == first:
            runs[-1][1] = last
        else:
            runs.append([first, last])

    def bytes_of(self, ledger_id: LedgerId) -> int:
        return self.bytes.get((ledger_id.scope, ledger_id.id), 0)

    def has(self, ledger_id: LedgerId) -> Callable[[int], bool]:
        """Whether the scan found an entry of the ledger (sorted once, then bisected)."""
        runs = sorted(self.runs.get((ledger_id.scope, ledger_id.id), ()))
        starts = [run[0] for run in runs]

        def found(entry_id: int) -> bool:
            at = bisect.bisect_right(starts, entry_id) - 1
            return at >= 0 and runs[at][1] >= entry_id

        return found


class _LogReads:
    """The reads of a pass over one entry log, each from where the parse got to: the next
    stretch is read by another thread while the records of this one are checked, so that a
    pass at full speed takes the longer of the reads and the checks, not their sum (the read
    lets go of the GIL). The read ahead outlives the step that asked for it: a pass at full
    speed is steps back to back.

    Reads go into two buffers in turn, kept for the pass: a new buffer of megabytes costs a
    page fault per page, and the unparsed end of the last read is copied in front of the
    next one's bytes (into its headroom) rather than both into a third buffer."""

    def __init__(
        self, entry_log: EntryLog, log_id: int, reader: ThreadPoolExecutor, buffers: _Buffers
    ) -> None:
        self._log = entry_log
        self.log_id = log_id
        self._reader = reader
        self._buffers = buffers
        self._ahead: tuple[int, Future[int | None], int] | None = None
        """(where it reads from, the read, the buffer it reads into)."""
        self._last: tuple[int, memoryview, int] = (0, memoryview(b""), 0)
        """(where the last read's bytes begin, the bytes, the buffer they are in)."""

    def read(self, position: int, want: int, ahead_to: int) -> tuple[memoryview, int]:
        """The log's bytes from `position`, `want` of them or more, and the next up to
        `ahead_to` read meanwhile; and how many of them were not returned before (the rest
        is the end of the last read, not parsed yet). EntryUnreadable if they cannot be
        read. The bytes are valid until the next call."""
        last_at, last, into = self._last
        ahead = self._ahead
        raw: memoryview | None = None
        if (
            ahead is not None
            and ahead[0] == last_at + len(last)
            and last_at <= position <= ahead[0]  # not past a long record read on its own
            and ahead[0] - position <= HEADROOM
        ):
            at, pending, into = ahead
            self._ahead = None
            read = pending.result() or 0
            buffer = self._buffers[into]
            begin = HEADROOM - (at - position)
            buffer[begin:HEADROOM] = last[position - last_at :]
            raw = buffer[begin : HEADROOM + read]
        else:
            self.settle()
        if raw is None:
            into = 1 - into
            span = self._log.read_span(
                self.log_id, position, self._buffers[into][HEADROOM : HEADROOM + want]
            )
            assert span is not None, "read up to what is flushed"
            read = span
            raw = self._buffers[into][HEADROOM : HEADROOM + read]
        self._last = (position, raw, into)
        after = position + len(raw)
        if len(raw) >= want and after < ahead_to:
            other = 1 - into
            size = min(ahead_to - after, READ_BYTES)
            target = self._buffers[other][HEADROOM : HEADROOM + size]
            self._ahead = (
                after,
                self._reader.submit(self._log.read_span, self.log_id, after, target),
                other,
            )
        return raw, read

    def settle(self) -> None:
        """Wait for the read ahead, if any, and drop it: the buffers are this thread's again
        (another log's reads take them next)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            with contextlib.suppress(EntryUnreadable):
                ahead[1].result()


_Buffers = tuple[memoryview, memoryview]
HEADROOM = 1 << 20
"""Bytes in front of each read buffer for the unparsed end of the last read (a record cut
by the read's end; one longer than this is read anew)."""


class _Stopped(Exception):
    """The storage is closing: the step stops where it is."""


class Scrubber:
    """The scrub passes over one ledger storage's files; ledger storage owns one."""

    def __init__(
        self,
        index: Index,
        entry_log: EntryLog,
        journal: JournalEntries | None,
        kept_files: Callable[[], frozenset[int]],
        settle: Settle,
        verified: Verified,
        any_marked: Callable[[], bool],
        pass_ended: Callable[[], None],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`kept_files()`: the journal files the index points into; `verified` is told of
        each copy that passed while `any_marked()` (some copy is marked corrupt);
        `pass_ended` is called when a pass is complete, before its step returns."""
        self._index = index
        self._log = entry_log
        self._journal = journal
        self._kept_files = kept_files
        self._settle = settle
        self._verified = verified
        self._any_marked = any_marked
        self._pass_ended = pass_ended
        self._clock = clock
        self._running = threading.Lock()
        self._stopping = threading.Event()
        self._progress = index.scrub_progress()
        self._found = _Found()
        self._found_all = self._progress is None or self._progress.offset <= 0
        """Whether `_found` holds what the scan found in its file from the start: not in a
        file a restart resumed in the middle of, whose counts are then not compared."""
        self._passes = index.scrub_passes()
        self._stats = ScrubStats(last_complete=self._passes[-1].ended if self._passes else None)
        self._stats_lock = threading.Lock()
        self._read_ahead: ThreadPoolExecutor | None = None
        self._buffers: _Buffers | None = None
        self._reads: _LogReads | None = None
        """The reads of the entry log the pass is in, kept from one step to the next."""

    # -- the state ------------------------------------------------------------------------

    def current(self) -> ScrubPass | None:
        """The pass under way, if any."""
        progress = self._progress
        return None if progress is None else progress.current

    def passes(self) -> list[ScrubPass]:
        """The last complete passes, oldest first."""
        return list(self._passes)

    def stats(self) -> ScrubStats:
        with self._stats_lock:
            return self._stats.copy()

    def stop(self) -> None:
        """Stop a step under way at its next read and wait for it; refuse any later one."""
        self._stopping.set()
        with self._running:
            if self._read_ahead is not None:
                self._read_ahead.shutdown()

    # -- a step ---------------------------------------------------------------------------

    def step(self, budget: int, *, full_speed: bool = False) -> ScrubStep:
        """Read and check about `budget` bytes of the next file of the pass under way, or of
        a new pass; `full_speed` marks it an operator's. A step ends at the end of a file.

        IllegalOperation if the storage is closing."""
        with self._running:
            if self._stopping.is_set():
                raise IllegalOperation("ledger storage is closing: no scrubbing")
            progress = self._progress
            if progress is None:
                progress = self._new_pass(full_speed)
            elif full_speed:
                progress = progress.at(
                    progress.current.at_full_speed(), progress.file, progress.offset
                )
            done = _Tally()
            file = self._next_file(progress)
            offset = progress.offset if file == progress.file else 0
            if file is not None and file != progress.file:
                self._found = _Found()
                self._found_all = True
                self._drop_reads()
            try:
                if file is None:
                    ended = True
                else:
                    offset, ended = self._read_file(
                        file, offset, max(1, budget), done, full_speed=full_speed
                    )
            except _Stopped:
                raise IllegalOperation("ledger storage is closing: scrubbing stopped") from None
            scrub = progress.current.plus(
                bytes_read=done.bytes,
                entries=done.entries,
                corrupt=done.corrupt,
                unreadable=done.unreadable,
            )
            complete = file is None
            batch = self._index.batch()
            if complete:
                scrub = scrub.finished(self._clock())
                self._passes = [*self._passes[-(KEPT_PASSES - 1) :], scrub]
                batch.put_scrub_passes(self._passes)
                batch.put_scrub_progress(None)
                self._progress = None
            else:
                assert file is not None
                # A file read through is left behind: the next step looks for the one after.
                self._progress = progress.at(scrub, file, -1 if ended else offset)
                batch.put_scrub_progress(self._progress)
            self._index.write(batch)
            if complete or done.corrupt:
                self._index.sync()  # a pass's record, and the marks, survive a crash
            self._count(done, scrub)
            if complete:
                self._pass_ended()
                log.info(
                    "scrub pass (%s) complete in %.0f s: %d entries, %d bytes read, %d "
                    "corrupt, %d unreadable",
                    scrub.trigger.value,
                    (scrub.ended or scrub.started) - scrub.started,
                    scrub.entries,
                    scrub.bytes,
                    scrub.corrupt,
                    scrub.unreadable,
                )
            return ScrubStep(scrub, done.bytes, done.entries, done.corrupt, done.unreadable)

    def _count(self, done: _Tally, scrub: ScrubPass) -> None:
        with self._stats_lock:
            stats = self._stats
            stats.bytes += done.bytes
            stats.entries += done.entries
            stats.corrupt += done.corrupt
            stats.unreadable += done.unreadable
            if scrub.ended is not None:
                stats.passes += 1
                stats.last_complete = scrub.ended

    def _new_pass(self, full_speed: bool) -> ScrubProgress:
        """A pass starting now: over the entry logs and kept journal files there are now."""
        trigger = ScrubTrigger.OPERATOR if full_speed else ScrubTrigger.SCHEDULE
        last_log = max(self._log.log_ids(), default=-1)
        mark = self._index.journal_mark() if self._journal is not None else None
        last_journal_file = JournalMark.from_bytes(mark).file_id if mark is not None else -1
        return ScrubProgress(
            ScrubPass(self._clock(), trigger), None, 0, last_log, last_journal_file
        )

    def _next_file(self, progress: ScrubProgress) -> FileKey | None:
        """The file the pass reads now: the one it reached if it is not read through (its
        offset is not -1), else the next one, in the order of the module docstring, up to
        the last ones of when the pass started (a pass under a steady write load ends)."""
        reached = progress.file
        if reached is not None and progress.offset >= 0:
            if reached[0] is FileKind.ENTRY_LOG and reached[1] in self._log.log_ids():
                return reached
            if reached[0] is FileKind.JOURNAL and reached[1] in self._kept_files():
                return reached
        kind, after = reached if reached is not None else (FileKind.ENTRY_LOG, -1)
        if kind is FileKind.ENTRY_LOG:
            logs = [log_id for log_id in self._log.log_ids() if after < log_id <= progress.last_log]
            if logs:
                return FileKind.ENTRY_LOG, min(logs)
            after = -1
        if self._journal is None:
            return None
        kept = [f for f in self._kept_files() if after < f <= progress.last_journal_file]
        return (FileKind.JOURNAL, min(kept)) if kept else None

    def _read_file(
        self, file: FileKey, offset: int, budget: int, done: _Tally, *, full_speed: bool
    ) -> tuple[int, bool]:
        """Read about `budget` bytes of `file` from `offset`; where it got to, and whether
        the file is read through (then its counts were compared, see the docstring)."""
        kind, file_id = file
        if kind is FileKind.ENTRY_LOG:
            offset, ended, gone = self._read_log(file_id, offset, budget, done, full_speed)
        else:
            offset, ended, gone = self._read_journal_file(file_id, offset, budget, done)
        if ended and not gone and self._found_all:
            self._compare_counts(file, offset, done)
        return offset, ended

    # -- entry logs -------------------------------------------------------------------------

    def _read_log(
        self, log_id: int, offset: int, budget: int, done: _Tally, full_speed: bool
    ) -> tuple[int, bool, bool]:
        """(where the step got to, whether the log is read through, whether it is gone)."""
        end = self._log.readable_end(log_id)
        if end is None:
            return offset, True, True  # deleted meanwhile (compacted): nothing to check
        position = max(offset, FILE_HEADER_SIZE)
        stop = min(end, position + budget)
        reads = self._reads
        if reads is None or reads.log_id != log_id:
            self._drop_reads()
            reads = self._reads = _LogReads(self._log, log_id, *self._reader())
        ahead_to = end if full_speed else stop  # a scheduled step reads nothing past its own
        while position < stop:
            if self._stopping.is_set():
                raise _Stopped
            want = min(end - position, READ_BYTES, max(stop - position, RECORD_HEADER_SIZE))
            try:
                raw, fresh = reads.read(position, want, ahead_to)
            except EntryUnreadable as error:
                log.warning("scrub: %s; what the index places in it is read alone", error)
                return end, True, False
            done.bytes += fresh
            if len(raw) < min(want, RECORD_HEADER_SIZE):
                return end, True, False  # shorter than it was: what it lost, the counts find
            parsed, damaged = self._records(log_id, position, raw, end, done)
            if parsed == 0 and not damaged and end - position < RECORD_HEADER_SIZE:
                damaged = True  # not even a record's header left: padding, or damage
            if damaged:
                position += parsed
                try:
                    padded = self._padding(log_id, position, end)
                except EntryUnreadable:
                    if self._log.readable_end(log_id) is None:
                        return position, True, True  # compacted meanwhile: its entries moved
                    raise
                if not padded:
                    log.warning(
                        "scrub: entry log %s: no record can be parsed at offset %d; the "
                        "entries the index places past it are read one by one",
                        self._log.directory / log_file_name(log_id),
                        position,
                    )
                return end, True, False  # what lies past the damage: the counts find it
            if parsed == 0:  # the record goes on past this read
                parsed = self._long_record(log_id, position, raw, done)
            position += parsed
        return position, position >= end, False

    def _drop_reads(self) -> None:
        """Let go of the last log's reads, once its read ahead no longer fills a buffer."""
        if self._reads is not None:
            self._reads.settle()
            self._reads = None

    def _reader(self) -> tuple[ThreadPoolExecutor, _Buffers]:
        """The thread that reads the next stretch of an entry log while a step checks the
        last one, and the two buffers the reads take turns in (made at the first step)."""
        if self._read_ahead is None:
            self._read_ahead = ThreadPoolExecutor(1, thread_name_prefix="scrub-read")
            self._buffers = (
                memoryview(bytearray(HEADROOM + READ_BYTES)),
                memoryview(bytearray(HEADROOM + READ_BYTES)),
            )
        assert self._buffers is not None
        return self._read_ahead, self._buffers

    def _padding(self, log_id: int, position: int, end: int) -> bool:
        """Whether the log's bytes from `position` are the zeros that pad its last block."""
        rest = end - position
        if not 0 < rest < ALIGNMENT or end % ALIGNMENT:
            return False
        raw = bytearray(rest)
        return self._log.read_span(log_id, position, memoryview(raw)) == rest and not any(raw)

    def _long_record(self, log_id: int, position: int, raw: memoryview, done: _Tally) -> int:
        """Check the record at `position` whose bytes go on past `raw`, its first bytes
        (whole header included), reading the rest a piece at a time; its size."""
        length, crc, scope, ledger, entry_id = RECORD_HEADER.unpack_from(raw)
        ledger_id = LedgerId(scope, ledger)
        size: int = RECORD_HEADER_SIZE + length
        location = Location(log_id, position, size)
        if not self._index.points_at(ledger_id, entry_id, location):
            return size  # garbage: not read
        actual = crc32c(raw[RECORD_HEADER_SIZE:])
        read = len(raw)
        piece = memoryview(bytearray(min(size - read, READ_BYTES)))
        while read < size:
            if self._stopping.is_set():
                raise _Stopped
            count = self._log.read_span(log_id, position + read, piece[: size - read])
            if not count:
                break  # cut short: the CRC32C says so
            done.bytes += count
            actual = crc32c(piece[:count], actual)
            read += count
        self._checked(ledger_id, entry_id, location, read == size and actual == crc, done)
        return size

    def _records(
        self, log_id: int, base: int, raw: memoryview, end: int, done: _Tally
    ) -> tuple[int, bool]:
        """Check the whole records of `raw`, read at `base` of a log whose readable bytes
        end at `end`; (bytes parsed, whether the parse met damage and stopped).

        Small entries make this the pass's cost, so it does per record only what must be
        done one record at a time in Python, walking the lengths and taking each CRC32C;
        the headers are then compared as arrays, and the index is asked once per run of
        intact records of consecutive entries of one ledger (a checkpoint writes each
        ledger's entries together). A record that fails its CRC32C, and every record while
        some copy is marked corrupt, is looked up alone."""
        at = 0
        last_yield = time.perf_counter()
        while True:
            starts, parsed, damaged = _walk(raw, at, base, end)
            if starts:
                parsed, damaged = self._batch(log_id, base, raw, starts, parsed, damaged, done)
            if damaged or len(starts) < WALK_RECORDS:
                return parsed, damaged
            at = parsed
            if time.perf_counter() - last_yield >= YIELD_AFTER:  # as `yielding` does
                time.sleep(0)
                last_yield = time.perf_counter()

    def _batch(
        self,
        log_id: int,
        base: int,
        raw: memoryview,
        starts: list[int],
        parsed: int,
        damaged: bool,
        done: _Tally,
    ) -> tuple[int, bool]:
        """Check the records of `raw` at `starts`, which `_walk` found up to `parsed`
        (`damaged` if it stopped at damage); where the parse got to, and whether damage
        stopped it (a header may turn out to have rotted past its length)."""
        heads = _headers(raw, starts)
        entry_ids = heads["entry_id"]
        if (entry_ids < 0).any():
            bad = int(np.argmax(entry_ids < 0))
            starts, heads, parsed, damaged = starts[:bad], heads[:bad], starts[bad], True
            entry_ids = heads["entry_id"]
        sizes = heads["length"].astype(np.int64) + RECORD_HEADER_SIZE
        actual = [
            crc32c(raw[at + RECORD_HEADER_SIZE : at + size])
            for at, size in zip(starts, sizes.tolist(), strict=True)
        ]
        intact = np.array(actual, dtype=np.uint32) == heads["crc"]
        offsets = np.array(starts, dtype=np.int64) + base
        if self._any_marked():
            alone = np.arange(len(starts))
        else:
            for first, stop in _runs(heads, intact):
                self._run_found(log_id, heads[first], offsets[first:stop], sizes[first:stop], done)
            alone = np.flatnonzero(~intact)
        for n in alone.tolist():
            ledger_id = LedgerId(int(heads["scope"][n]), int(heads["ledger"][n]))
            entry_id = int(entry_ids[n])
            location = Location(log_id, int(offsets[n]), int(sizes[n]))
            if self._index.points_at(ledger_id, entry_id, location):
                self._checked(ledger_id, entry_id, location, bool(intact[n]), done)
        return parsed, damaged

    def _run_found(
        self, log_id: int, head: np.void, offsets: IntArray, sizes: IntArray, done: _Tally
    ) -> None:
        """Count the records of a run (intact, consecutive entries of one ledger from
        `head`'s) that the index places where they are as found; the others are garbage
        (replaced, deleted or moved)."""
        scope, ledger, first = int(head["scope"]), int(head["ledger"]), int(head["entry_id"])
        count = len(offsets)
        stored = self._index.entry_log_run(scope, ledger, first, count) if count > 1 else None
        if stored is not None:
            here = (
                (stored["log_id"] == log_id)
                & (stored["offset"] == offsets)
                & (stored["size"] == sizes)
            )
        else:  # one record, or some entry of the run is not in an entry log: one at a time
            ledger_id = LedgerId(scope, ledger)
            here = np.array(
                [
                    self._index.points_at(ledger_id, first + n, Location(log_id, offset, size))
                    for n, (offset, size) in enumerate(
                        zip(offsets.tolist(), sizes.tolist(), strict=True)
                    )
                ],
                dtype=bool,
            )
        if here.all():
            self._found.add_run(scope, ledger, first, first + count - 1, int(sizes.sum()))
            done.entries += count
            return
        for n in np.flatnonzero(here).tolist():
            self._found.add(scope, ledger, first + n, int(sizes[n]))
            done.entries += 1

    def _checked(
        self,
        ledger_id: LedgerId,
        entry_id: int,
        location: Location | JournalLocation,
        intact: bool,
        done: _Tally,
    ) -> None:
        """A record the index points at was checked: `intact` or not."""
        size = location.size + (ENTRY_HEAD.size if isinstance(location, JournalLocation) else 0)
        self._found.add(ledger_id.scope, ledger_id.id, entry_id, size)
        done.entries += 1
        if intact:
            self._verified(ledger_id, entry_id, location)
            return
        problem = f"{_describe(location)}: its bytes do not match their CRC32C"
        self._judge(ledger_id, entry_id, location, EntryCorrupt(problem), done)

    # -- journal files ------------------------------------------------------------------------

    def _read_journal_file(
        self, file_id: int, offset: int, budget: int, done: _Tally
    ) -> tuple[int, bool, bool]:
        """Parse a kept journal file from `offset` (a record's end) for about `budget` bytes,
        checking the kept entries the index points at: (where the step got to, whether the
        file is read through, whether it is gone). The file of the last checkpoint's mark
        is read up to the mark (the records after it are not indexed yet)."""
        assert self._journal is not None
        path = self._journal.directory / file_name(file_id)
        mark_bytes = self._index.journal_mark()
        mark = JournalMark.from_bytes(mark_bytes) if mark_bytes is not None else None
        try:
            with path.open("rb") as file:
                size = os.fstat(file.fileno()).st_size
                if mark is not None and mark.file_id == file_id:
                    size = min(size, mark.offset)
                begin = max(offset, HEADER_SIZE)
                if begin >= size:
                    return size, True, False
                with (
                    mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
                    memoryview(mapped) as view,
                ):
                    mapped.madvise(mmap.MADV_SEQUENTIAL)
                    records = scan_records(view, file_id, begin, size, end_recorded=False)
                    position = self._journal_records(records, begin, size, budget, done)
                drop_range(file.fileno(), begin, position)
        except FileNotFoundError:
            return offset, True, True  # released: nothing the index points to is in it
        done.bytes += position - begin
        return position, position >= size, False

    def _journal_records(
        self,
        records: Generator[tuple[JournalMark, bytes], None, object],
        begin: int,
        size: int,
        budget: int,
        done: _Tally,
    ) -> int:
        """Check the kept entries among `records` that the index points at, until `budget`
        bytes from `begin` are parsed; where the parse got to (`size`: the end)."""
        index = self._index
        position = begin
        payload: bytes | memoryview = b""
        try:
            for mark, payload in yielding(records, YIELD_AFTER):
                position = mark.offset
                if self._stopping.is_set():
                    raise _Stopped
                length = len(payload) - ENTRY_HEAD.size
                if payload[0] == RecordType.ENTRY and length >= KEPT_ENTRY_SIZE:
                    _, scope, ledger, entry_id, _, crc = ENTRY_HEAD.unpack_from(payload)
                    ledger_id = LedgerId(scope, ledger)
                    location = kept_location(mark, length, crc)
                    if location is not None and index.points_at(ledger_id, entry_id, location):
                        intact = crc32c(payload[ENTRY_HEAD.size :]) == crc
                        self._checked(ledger_id, entry_id, location, intact, done)
                if position - begin >= budget:
                    return position
            return size  # parsed to its end (damage is skipped past, a torn tail ends it)
        finally:
            del payload  # no view of the mapped file may outlive it
            records.close()

    # -- both ways --------------------------------------------------------------------------

    def _compare_counts(self, file: FileKey, covered: int, done: _Tally) -> None:
        """Check, one at a time, the entries the index places in the file read through (up
        to `covered`: a file still written may have grown since) that its scan did not
        find, for each ledger with more bytes counted than found there."""
        found = self._found
        for ledger_id, counted in sorted(self._index.file_usage(*file).items()):
            if counted <= found.bytes_of(ledger_id):
                continue
            seen = found.has(ledger_id)
            for entry_id, location in yielding(
                self._index.ledger_locations(ledger_id), YIELD_AFTER
            ):
                if _file_of(location) != file or location.offset >= covered or seen(entry_id):
                    continue
                if self._stopping.is_set():
                    raise _Stopped
                self._check_alone(ledger_id, entry_id, location, done)

    def _check_alone(
        self,
        ledger_id: LedgerId,
        entry_id: int,
        location: Location | JournalLocation,
        done: _Tally,
    ) -> None:
        done.entries += 1
        done.bytes += location.size
        try:
            if isinstance(location, JournalLocation):
                if self._journal is None:
                    raise EntryUnreadable(
                        f"entry {entry_id} of ledger {ledger_id} is kept in journal file "
                        f"{location.file_id}, and this storage was opened without the journal"
                    )
                self._journal.read(location, ledger_id, entry_id)
            else:
                self._log.read(location, ledger_id, entry_id)
        except EntryUnreadable as error:
            if self._judge(ledger_id, entry_id, location, error, done) is Verdict.UNREADABLE:
                log.error("scrub: %s", error)
            return
        self._verified(ledger_id, entry_id, location)

    def _judge(
        self,
        ledger_id: LedgerId,
        entry_id: int,
        location: Location | JournalLocation,
        error: EntryUnreadable,
        done: _Tally,
    ) -> Verdict:
        corrupt = isinstance(error, EntryCorrupt)
        verdict = self._settle(ledger_id, entry_id, location, corrupt, str(error))
        if verdict is Verdict.CORRUPT:
            done.corrupt += 1
        elif verdict is Verdict.UNREADABLE:
            done.unreadable += 1
        return verdict


_LENGTH = struct.Struct(">I")
WALK_RECORDS = 1024
"""Records checked together: enough to make the arrays pay, few enough to let go of the
GIL between them (YIELD_AFTER)."""
HEADER_DTYPE = np.dtype(
    [("length", ">u4"), ("crc", ">u4"), ("scope", ">u8"), ("ledger", ">u8"), ("entry_id", ">i8")]
)
"""An entry log record's header (RECORD_HEADER), for arrays of them."""
assert HEADER_DTYPE.itemsize == RECORD_HEADER_SIZE


def _walk(raw: memoryview, at: int, base: int, end: int) -> tuple[list[int], int, bool]:
    """Where the next whole records of `raw` from `at` start (WALK_RECORDS at most), by
    their lengths alone (`raw` was read at `base` of a log whose readable bytes end at
    `end`); where the walk got to, and whether it met a length that cannot be (damage)."""
    starts: list[int] = []
    append, length_at = starts.append, _LENGTH.unpack_from
    whole = len(raw) - RECORD_HEADER_SIZE
    while at <= whole and len(starts) < WALK_RECORDS:
        (length,) = length_at(raw, at)
        following = at + RECORD_HEADER_SIZE + length
        if length == 0 or base + following > end:
            return starts, at, True
        if following > len(raw):
            break
        append(at)
        at = following
    return starts, at, False


def _headers(raw: memoryview, starts: list[int]) -> npt.NDArray[np.void]:
    """The headers of the records at `starts` of `raw`, as an array of HEADER_DTYPE."""
    columns = np.arange(RECORD_HEADER_SIZE, dtype=np.int64)
    rows = np.array(starts, dtype=np.int64)[:, None] + columns
    heads: npt.NDArray[np.void] = np.frombuffer(raw, dtype=np.uint8)[rows].view(HEADER_DTYPE)
    return heads.ravel()


def _runs(heads: npt.NDArray[np.void], intact: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    """The runs of intact records of consecutive entries of one ledger, as (first, stop)
    positions in `heads`."""
    scope, ledger, entry_id = heads["scope"], heads["ledger"], heads["entry_id"]
    joins = (
        (scope[1:] == scope[:-1])
        & (ledger[1:] == ledger[:-1])
        & (entry_id[1:] == entry_id[:-1] + 1)
        & intact[1:]
        & intact[:-1]
    )
    breaks = np.flatnonzero(~joins) + 1
    bounds = [0, *breaks.tolist(), len(heads)]
    return [(first, stop) for first, stop in itertools.pairwise(bounds) if intact[first]]


def _file_of(location: Location | JournalLocation) -> FileKey:
    if isinstance(location, JournalLocation):
        return FileKind.JOURNAL, location.file_id
    return FileKind.ENTRY_LOG, location.log_id


def _describe(location: Location | JournalLocation) -> str:
    if isinstance(location, JournalLocation):
        return f"journal file {location.file_id:016x} at offset {location.offset}"
    return f"entry log {location.log_id:08x} at offset {location.offset}"
