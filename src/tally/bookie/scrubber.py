"""The bookie's scrubber: every entry its index holds read back from disk and checked, a step
at a time, so that bit rot is found before a read or a recovery needs the copy.

Nothing else looks at the bytes: the index says an entry is there, the replicas check and
the audit compare indexes, and a rotten copy shows only when it is read (EntryCorrupt).

A pass walks the index in key order (ledger, entry), a step at a time (`step`): the next
entries, up to a byte budget, whose locations are sorted by file and offset and read in
spans (records less than `GAP` bytes apart together, up to `SPAN_BYTES` at once, past the
page cache): a checkpoint writes each ledger's entries together and sorted, so a step reads
its files about sequentially. Each record is checked as a read checks it
(`EntryLog.check`, `JournalEntries.check`): its header names the ledger, the entry and the
size the index holds, and its bytes match their stored CRC32C, the client's, end to end. A
span that cannot be read is read again record by record.

A record that fails is not called corrupt yet: ledger storage (`settle`) looks the entry up
again, under its lock. If the index no longer points at that record, the entry was moved by
compaction (which checked the bytes it copied), replaced by a re-add (checked on arrival)
or deleted since the step looked it up: not corrupt. Only a copy that still fails where the
index still points is marked corrupt (ledger_storage.py has the marks). A record that
passes while marked corrupt is unmarked.

Each step writes the pass under way and the last entry it checked to the index; a restart
goes on from there. A complete pass is kept (the last `KEPT_PASSES`), durably, with its
figures: the next is due an interval after it ended (tally.core.scrub decides when, and at
what rate; scrubber_service.py runs the steps).

Threads: `step` runs in a worker thread, one at a time; reads, adds and checkpoints go on
meanwhile (it takes no lock of ledger storage but the short one, in `settle`). `stop` (the
storage closing) waits for a step under way to end at its next record.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from tally.bookie.compactor import yielding
from tally.bookie.entry_log import EntryLog, Location
from tally.bookie.index import Index, ScrubProgress
from tally.bookie.journal_entries import ENTRY_HEAD, JournalEntries, JournalLocation
from tally.core.errors import EntryCorrupt, EntryUnreadable, IllegalOperation
from tally.core.ids import LedgerId
from tally.core.scrub import ScrubPass, ScrubTrigger

log = logging.getLogger(__name__)

KEPT_PASSES = 16
"""Complete passes the index keeps, for `tally shell scrub`."""
STEP_ENTRIES = 16384
"""Entries one step checks at most, which bounds its index walk."""
GAP = 256 << 10
"""Bytes between two records read through rather than skipped with a second read."""
SPAN_BYTES = 4 << 20
"""Bytes read at once at most."""


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


_Item = tuple[LedgerId, int, Location | JournalLocation]
_Record = tuple[int, int, LedgerId, int, Location | JournalLocation]
"""An entry to check: where its record begins and ends in its file, its ids and location."""


@dataclass(slots=True)
class _Tally:
    bytes: int = 0
    corrupt: int = 0
    unreadable: int = 0


class _Stopped(Exception):
    """The storage is closing: the step stops where it is."""


class Scrubber:
    """The scrub passes over one ledger storage's entries; ledger storage owns one."""

    def __init__(
        self,
        index: Index,
        entry_log: EntryLog,
        journal: JournalEntries | None,
        settle: Settle,
        verified: Verified,
        pass_ended: Callable[[], None],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`pass_ended` is called when a pass is complete, before its step returns."""
        self._index = index
        self._log = entry_log
        self._journal = journal
        self._settle = settle
        self._verified = verified
        self._pass_ended = pass_ended
        self._clock = clock
        self._running = threading.Lock()
        self._stopping = threading.Event()
        self._progress = index.scrub_progress()
        self._passes = index.scrub_passes()
        self._stats = ScrubStats(last_complete=self._passes[-1].ended if self._passes else None)
        self._stats_lock = threading.Lock()

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
        """Stop a step under way at its next record and wait for it; refuse any later one."""
        self._stopping.set()
        with self._running:
            pass

    # -- a step ---------------------------------------------------------------------------

    def step(self, budget: int, *, full_speed: bool = False) -> ScrubStep:
        """Check the next entries, about `budget` bytes of them (at least one entry), of
        the pass under way, or of a new one; `full_speed` marks it an operator's.

        IllegalOperation if the storage is closing."""
        with self._running:
            if self._stopping.is_set():
                raise IllegalOperation("ledger storage is closing: no scrubbing")
            progress = self._progress
            if progress is None:
                trigger = ScrubTrigger.OPERATOR if full_speed else ScrubTrigger.SCHEDULE
                progress = ScrubProgress(ScrubPass(self._clock(), trigger), None)
            elif full_speed:
                progress = ScrubProgress(progress.current.at_full_speed(), progress.after)
            items, exhausted = self._index.locations_after(
                progress.after, STEP_ENTRIES, max(1, budget)
            )
            try:
                done = self._check(items)
            except _Stopped:
                raise IllegalOperation("ledger storage is closing: scrubbing stopped") from None
            scrub = progress.current.plus(
                bytes_read=done.bytes,
                entries=len(items),
                corrupt=done.corrupt,
                unreadable=done.unreadable,
            )
            batch = self._index.batch()
            if exhausted:
                scrub = scrub.finished(self._clock())
                self._passes = [*self._passes[-(KEPT_PASSES - 1) :], scrub]
                batch.put_scrub_passes(self._passes)
                batch.put_scrub_progress(None)
                self._progress = None
            else:
                after = (items[-1][0], items[-1][1]) if items else progress.after
                self._progress = ScrubProgress(scrub, after)
                batch.put_scrub_progress(self._progress)
            self._index.write(batch)
            if exhausted or done.corrupt:
                self._index.sync()  # a pass's record, and the marks, survive a crash
            self._count(done, len(items), scrub)
            if exhausted:
                self._pass_ended()
                log.info(
                    "scrub pass (%s) complete in %.0f s: %d entries, %d bytes checked, %d "
                    "corrupt, %d unreadable",
                    scrub.trigger.value,
                    (scrub.ended or scrub.started) - scrub.started,
                    scrub.entries,
                    scrub.bytes,
                    scrub.corrupt,
                    scrub.unreadable,
                )
            return ScrubStep(scrub, done.bytes, len(items), done.corrupt, done.unreadable)

    def _count(self, done: _Tally, entries: int, scrub: ScrubPass) -> None:
        with self._stats_lock:
            stats = self._stats
            stats.bytes += done.bytes
            stats.entries += entries
            stats.corrupt += done.corrupt
            stats.unreadable += done.unreadable
            if scrub.ended is not None:
                stats.passes += 1
                stats.last_complete = scrub.ended

    def _check(self, items: list[_Item]) -> _Tally:
        """Read and check the entries, a span of their files at a time."""
        done = _Tally()
        by_file: dict[tuple[bool, int], list[_Record]] = defaultdict(list)
        head = ENTRY_HEAD.size
        for ledger_id, entry_id, location in items:
            offset, end = location.offset, location.offset + location.size
            if type(location) is JournalLocation:
                by_file[True, location.file_id].append(
                    (offset - head, end, ledger_id, entry_id, location)
                )
            else:
                by_file[False, location[0]].append((offset, end, ledger_id, entry_id, location))
        for (in_journal, file_id), records in sorted(by_file.items()):
            records.sort(key=_first)
            for span in _spans(records):
                if self._stopping.is_set():
                    raise _Stopped
                self._check_span(in_journal, file_id, span, done)
        return done

    def _check_span(
        self, in_journal: bool, file_id: int, span: list[_Record], done: _Tally
    ) -> None:
        start = span[0][0]
        size = span[-1][1] - start
        raw: bytes | None = None
        try:
            if not in_journal:
                raw = self._log.read_span(file_id, start, size)
            elif self._journal is not None:
                raw = self._journal.read_span(file_id, start, size)
        except EntryUnreadable:
            raw = None  # read again record by record: which of them cannot be read
        if raw is None:
            for _, _, ledger_id, entry_id, location in yielding(span):
                self._check_alone(ledger_id, entry_id, location, done)
            return
        done.bytes += len(raw)
        check = self._journal.check if in_journal and self._journal else self._log.check
        verified = self._verified
        with memoryview(raw) as view:
            for first, end, ledger_id, entry_id, location in yielding(span):
                record = view[first - start : end - start]
                try:
                    check(record, location, ledger_id, entry_id)  # type: ignore[arg-type]
                except EntryCorrupt as error:
                    self._judge(ledger_id, entry_id, location, error, done)
                    continue
                finally:
                    record.release()
                verified(ledger_id, entry_id, location)

    def _check_alone(
        self,
        ledger_id: LedgerId,
        entry_id: int,
        location: Location | JournalLocation,
        done: _Tally,
    ) -> None:
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
        finally:
            done.bytes += location.size + (
                ENTRY_HEAD.size if type(location) is JournalLocation else 0
            )
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


def _first(record: _Record) -> int:
    return record[0]


def _spans(records: Iterable[_Record]) -> Iterator[list[_Record]]:
    """The records of one file, by offset, in runs read at once."""
    span: list[_Record] = []
    span_start = span_end = 0
    for record in records:
        start, end = record[0], record[1]
        if span and (start - span_end > GAP or end - span_start > SPAN_BYTES or start < span_end):
            yield span
            span = []
        if not span:
            span_start = start
        span.append(record)
        span_end = end
    if span:
        yield span
