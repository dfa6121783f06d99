"""Garbage collection of a bookie's files: entry logs, and journal files that hold entries
kept in place, deleted once no live entry is left in them, compacted when few are.

Accounting. The index keeps, for every such file, the bytes each ledger has in it
(BookKeeper's EntryLogMetadata, in the `usage` column family): a checkpoint adds the bytes
it indexes there and takes off those of the entries its re-adds replace, in the same batch
as the locations; `forget_entries` takes off what it drops; compaction moves the counts
with the entries. A deleted ledger's counts are dead from the moment the ledger is gone
from the index. The counts can only be too high (a count is only made by adding bytes the
same batch points at), and a file is deleted only when every ledger with a count in it is
gone from the index, never because its counts say zero. Files written before counts were
kept (listed at the first start with this code) are counted once, by scanning the file and
checking each record against the index.

Which files. Entry logs but the current one (the only one still written); journal files
in the kept set before the last checkpoint's mark (every kept entry of such a file is
indexed by then). The decision, per file, is `tally.core.compaction.plan_gc`'s.

Deletion. An entry log goes once the index is synced; a journal file leaves the kept set,
and the journal's next release (after the next checkpoint) deletes it.

Compaction copies a file's live records into the current entry log, each checked against
the index first (the index still points at exactly this record), in chunks: under
`maintenance` (ledger storage's lock, which checkpoints also take) a chunk is appended and
fdatasync'ed, then the index points each entry at its copy in one batch, only where it
still points at the original: a concurrent re-add or delete wins. The lock is let go
between chunks, so checkpoints wait for one chunk at most; adds and reads never wait for
it. Once the whole file is copied the index is synced, and only then is the file deleted.
A SIGKILL at any moment leaves every live entry where the index points: at the original
until the batch that moves it, at a durable copy after. A read that looked the location up
before a move and finds the file gone looks it up again (ledger_storage.py).

A scan that stops at a damaged record (an entry log's records cannot be told apart past
it) is followed by a copy of what the index still points to in the file, each entry read
where it points and checked as a read checks it; a copy that fails is reported corrupt
(ledger storage marks it) and stays, with the file, until a good copy is written over it.
Compaction never copies a record that fails its check. A file whose damage is garbage (a
rotten copy replaced since) is thus compacted away like any other.

Runs are bounded in time (the rest is done by the next runs: the compaction stays due until
one finishes) and in rate (`compaction_rate_bytes`, a token bucket).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tally.bookie.entry_log import EntryLog, Location, log_file_name
from tally.bookie.index import FileKey, Index, UsageKey
from tally.bookie.journal_entries import (
    ENTRY_HEAD,
    KEPT_ENTRY_SIZE,
    JournalEntries,
    JournalLocation,
    RecordType,
    kept_location,
)
from tally.bookie.journal_files import read_records
from tally.bookie.journal_format import JournalMark, Scan, file_name
from tally.core.compaction import (
    CompactionKind,
    CompactionPolicy,
    CompactionTimes,
    DiskSpace,
    FileKind,
    FileUsage,
    plan_gc,
)
from tally.core.errors import (
    EntryCorrupt,
    EntryUnreadable,
    IllegalOperation,
    MalformedData,
    WriteFailed,
)
from tally.core.ids import LedgerId
from tally.core.replication import TokenBucket
from tally.failpoints import failpoint

log = logging.getLogger(__name__)

T = TypeVar("T")

CHUNK_BYTES = 4 << 20
"""Bytes of records copied per hold of the maintenance lock (and per fdatasync)."""
CHUNK_RECORDS = 8192
"""... and records, which bound the index look-ups made under it."""
YIELD_AFTER = 0.0005
"""Seconds of compaction work between two chances for the bookie's other threads to take
the GIL."""


@dataclass(frozen=True, slots=True)
class GcSettings:
    """The bookie's settings for garbage collection (BookieConfig has them by name)."""

    policy: CompactionPolicy = field(default_factory=CompactionPolicy)
    rate_bytes: int = 0
    """Bytes per second that compaction copies at most; 0: as fast as it can."""
    minor_max_time: float = 600.0
    """Seconds one run spends on a minor compaction at most; 0: no bound."""
    major_max_time: float = 600.0


@dataclass(frozen=True, slots=True)
class GcReport:
    """What one garbage collection run did (`LedgerStorage.collect_garbage`)."""

    now: float
    """The wall-clock time the run was given."""
    seconds: float
    compaction: CompactionKind
    finished: bool
    """Whether the compaction (if any) got through every file it chose."""
    suspended: str | None
    deleted_entry_logs: tuple[int, ...]
    released_journal_files: tuple[int, ...]
    """Left the kept set for having no live entry: the journal deletes them at its next
    release."""
    compacted_entry_logs: tuple[int, ...]
    compacted_journal_files: tuple[int, ...]
    reclaimed_bytes: int
    """On-disk bytes of the files deleted or released."""
    moved_entries: int
    moved_bytes: int
    compaction_seconds: float
    """The time spent compacting (copying, syncing, deleting)."""
    files: tuple[FileUsage, ...]
    """Every file looked at, with its live bytes as counted when the run began."""
    failures: tuple[str, ...]
    """Files left alone, and why."""

    @property
    def compaction_bytes_per_second(self) -> float:
        """Live bytes moved per second of compaction."""
        return self.moved_bytes / self.compaction_seconds if self.compaction_seconds > 0 else 0.0


@dataclass(slots=True)
class GcStats:
    """Totals since the storage was opened, for the bookie's metrics."""

    runs: int = 0
    deleted_entry_logs: int = 0
    released_journal_files: int = 0
    compacted_entry_logs: dict[str, int] = field(default_factory=lambda: {"minor": 0, "major": 0})
    compacted_journal_files: dict[str, int] = field(
        default_factory=lambda: {"minor": 0, "major": 0}
    )
    reclaimed_deletion_bytes: int = 0
    reclaimed_compaction_bytes: int = 0
    moved_entries: int = 0
    moved_bytes: int = 0
    last_compaction_bytes_per_second: float = 0.0
    last_files: tuple[FileUsage, ...] = ()

    def copy(self) -> GcStats:
        return GcStats(
            self.runs,
            self.deleted_entry_logs,
            self.released_journal_files,
            dict(self.compacted_entry_logs),
            dict(self.compacted_journal_files),
            self.reclaimed_deletion_bytes,
            self.reclaimed_compaction_bytes,
            self.moved_entries,
            self.moved_bytes,
            self.last_compaction_bytes_per_second,
            self.last_files,
        )


def usage_of(location: Location | JournalLocation) -> tuple[FileKind, int, int]:
    """The file an entry lies in and the bytes its record counts there."""
    if isinstance(location, JournalLocation):
        return FileKind.JOURNAL, location.file_id, ENTRY_HEAD.size + location.size
    return FileKind.ENTRY_LOG, location.log_id, location.size


def disk_space_of(directory: Path) -> Callable[[], DiskSpace]:
    def measure() -> DiskSpace:
        usage = shutil.disk_usage(directory)
        return DiskSpace(usage.total, usage.free)

    return measure


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """The files a run may touch, taken under the maintenance lock."""

    log_horizon: int
    """Entry logs below this id are no longer written (the current one is this)."""
    logs: frozenset[int]
    journal_horizon: int
    """Kept journal files below this id hold no entry that a checkpoint has yet to index."""
    kept: frozenset[int]


@dataclass(slots=True)
class _Record:
    """A live record to copy: the entry, its bytes, and where the index had it."""

    ledger_id: LedgerId
    entry_id: int
    crc32c: int
    data: bytes
    origin: Location | JournalLocation


@dataclass(slots=True)
class _Run:
    """What a run has done so far."""

    deleted: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    compacted: dict[FileKind, list[int]] = field(
        default_factory=lambda: {FileKind.ENTRY_LOG: [], FileKind.JOURNAL: []}
    )
    reclaimed_deletion: int = 0
    reclaimed_compaction: int = 0
    moved_entries: int = 0
    moved_bytes: int = 0
    compaction_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)


class _Stopped(Exception):
    """The storage is closing: the run stops where it is."""


class Compactor:
    """Garbage collection of one ledger storage's files; ledger storage owns one.

    `run` is called from one worker thread at a time (a second call waits); everything it
    changes in the index it changes holding `maintenance`, as checkpoints do.
    """

    def __init__(
        self,
        index: Index,
        entry_log: EntryLog,
        journal: JournalEntries | None,
        maintenance: threading.Lock,
        kept_files: Callable[[], frozenset[int]],
        drop_kept_files: Callable[[frozenset[int]], None],
        found_corrupt: Callable[[LedgerId, int, Location | JournalLocation, str], None],
        settings: GcSettings,
        *,
        disk_space: Callable[[], DiskSpace],
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`drop_kept_files(ids)`: take the files out of the kept set, in the index (a
        batch, not synced) and in memory; called holding `maintenance`.
        `found_corrupt(ledger, entry, location, problem)`: a live entry's copy at `location`
        failed its check (ledger storage marks it)."""
        self._index = index
        self._log = entry_log
        self._journal = journal
        self._maintenance = maintenance
        self._kept_files = kept_files
        self._drop_kept_files = drop_kept_files
        self._found_corrupt = found_corrupt
        self.settings = settings
        self._disk_space = disk_space
        self._clock = clock
        self._sleep = sleep
        self._running = threading.Lock()
        self._stopping = threading.Event()
        self._stats = GcStats()
        self._stats_lock = threading.Lock()
        self._bucket: TokenBucket | None = None
        unaccounted = index.unaccounted_files()
        if unaccounted is None:
            # The first start that counts usage: what is on disk now was never counted.
            unaccounted = {(FileKind.ENTRY_LOG, log_id) for log_id in entry_log.log_ids()}
            unaccounted |= {(FileKind.JOURNAL, file_id) for file_id in kept_files()}
            batch = index.batch()
            batch.put_unaccounted_files(unaccounted)
            index.write(batch)
            index.sync()
        self._unaccounted = unaccounted
        """Files to count by a scan before anything is decided about them."""

    def stats(self) -> GcStats:
        with self._stats_lock:
            return self._stats.copy()

    def stop(self) -> None:
        """Make a running (and any later) run stop at its next step: the storage closes."""
        self._stopping.set()

    # -- a run --------------------------------------------------------------------------

    def run(self, now: float, *, force_major: bool = False, force_minor: bool = False) -> GcReport:
        """Delete the files with no live entry and compact those that are due; see the
        module docstring. `now` is wall-clock seconds (the compaction intervals').

        IllegalOperation if the storage closes meanwhile: the run stops where it is.
        """
        with self._running:
            try:
                return self._run(now, force_major, force_minor)
            except _Stopped:
                raise IllegalOperation(
                    "ledger storage is closing: garbage collection stopped"
                ) from None

    def _run(self, now: float, force_major: bool, force_minor: bool) -> GcReport:
        started = self._clock()
        snapshot = self._snapshot()
        done = _Run()
        longest = max(self.settings.minor_max_time, self.settings.major_max_time)
        for file in sorted(self._unaccounted, key=_file_order):
            if longest > 0 and self._clock() - started >= longest:
                break  # the next run counts the rest
            if self._candidate(file, snapshot):
                self._account(file)
        usages, ledgers = self._usages(snapshot)
        times = self._times(now)
        plan = plan_gc(
            usages,
            self.settings.policy,
            times,
            now,
            self._disk_space(),
            force_major=force_major,
            force_minor=force_minor,
        )
        if plan.suspended:
            log.warning("garbage collection: %s", plan.suspended)
        if plan.delete:
            self._index.sync()  # the deletes that made them dead are durable
        for usage in plan.delete:
            self._delete(usage, done)
        compaction_started = self._clock()
        finished = self._compact_all(plan.compact, plan.compaction, ledgers, done)
        done.compaction_seconds = self._clock() - compaction_started
        for usage in plan.no_room:
            done.failures.append(
                f"{_describe(usage)} not compacted: its {usage.live_bytes} live bytes would "
                "not fit on the ledger disk now"
            )
        if plan.compaction is not CompactionKind.NONE and finished:
            self._put_times(times.after(plan.compaction, now))
        report = GcReport(
            now=now,
            seconds=self._clock() - started,
            compaction=plan.compaction,
            finished=finished,
            suspended=plan.suspended,
            deleted_entry_logs=tuple(done.deleted),
            released_journal_files=tuple(done.released),
            compacted_entry_logs=tuple(done.compacted[FileKind.ENTRY_LOG]),
            compacted_journal_files=tuple(done.compacted[FileKind.JOURNAL]),
            reclaimed_bytes=done.reclaimed_deletion + done.reclaimed_compaction,
            moved_entries=done.moved_entries,
            moved_bytes=done.moved_bytes,
            compaction_seconds=done.compaction_seconds,
            files=tuple(usages),
            failures=tuple(done.failures),
        )
        self._count(report, done)
        return report

    def _times(self, now: float) -> CompactionTimes:
        """The last compactions' times; the first run ever starts the intervals."""
        times = self._index.compaction_times()
        if times is None:
            times = CompactionTimes(now, now)
            self._put_times(times)
        return times

    def _put_times(self, times: CompactionTimes) -> None:
        with self._maintenance:
            self._check_running()
            batch = self._index.batch()
            batch.put_compaction_times(times)
            self._index.write(batch)

    def _snapshot(self) -> _Snapshot:
        with self._maintenance:
            self._check_running()
            logs = frozenset(self._log.log_ids())
            current = self._log.current_log_id
            horizon = current if current is not None else max(logs, default=-1) + 1
            mark = self._index.journal_mark() if self._journal is not None else None
            kept = self._kept_files() if mark is not None else frozenset()
        journal_horizon = JournalMark.from_bytes(mark).file_id if mark is not None else 0
        return _Snapshot(horizon, logs, journal_horizon, kept)

    @staticmethod
    def _candidate(file: FileKey, snapshot: _Snapshot) -> bool:
        kind, file_id = file
        if kind is FileKind.ENTRY_LOG:
            return file_id < snapshot.log_horizon and file_id in snapshot.logs
        return file_id < snapshot.journal_horizon and file_id in snapshot.kept

    def _check_running(self) -> None:
        if self._stopping.is_set():
            raise _Stopped

    # -- counting -------------------------------------------------------------------------

    def _usages(
        self, snapshot: _Snapshot
    ) -> tuple[list[FileUsage], dict[FileKey, dict[LedgerId, int]]]:
        """Every candidate file's usage, with the live ledgers' counts of each; counts of
        ledgers gone from the index, and of files gone, are dropped from the index."""
        alive: dict[LedgerId, bool] = {}
        counted: dict[FileKey, dict[LedgerId, int]] = defaultdict(dict)
        stale: list[UsageKey] = []
        gone_files: set[FileKey] = set()
        for kind, file_id, ledger_id, size in self._index.usages():
            file = (kind, file_id)
            if not self._candidate(file, snapshot):
                if self._gone(file, snapshot):
                    gone_files.add(file)
                continue
            if file in self._unaccounted:
                continue
            live = alive.get(ledger_id)
            if live is None:
                live = alive[ledger_id] = self._in_index(ledger_id)
            if live:
                counted[file][ledger_id] = size
            else:
                stale.append((kind, file_id, ledger_id))
        if stale or gone_files:
            with self._maintenance:
                self._check_running()
                batch = self._index.batch()
                for kind, file_id, ledger_id in stale:
                    batch.delete_usage(kind, file_id, ledger_id)
                for kind, file_id in gone_files:
                    batch.delete_file_usage(kind, file_id)
                self._index.write(batch)
        files = [(FileKind.ENTRY_LOG, log_id) for log_id in sorted(snapshot.logs)]
        files += [(FileKind.JOURNAL, file_id) for file_id in sorted(snapshot.kept)]
        usages = []
        ledgers = {}
        for file in files:
            if not self._candidate(file, snapshot) or file in self._unaccounted:
                continue
            live_ledgers = counted.get(file, {})
            ledgers[file] = live_ledgers
            usages.append(
                FileUsage(
                    file[0],
                    file[1],
                    self._size(file),
                    sum(live_ledgers.values()),
                    len(live_ledgers),
                )
            )
        return usages, ledgers

    @staticmethod
    def _gone(file: FileKey, snapshot: _Snapshot) -> bool:
        """Whether counts of `file` outlived it (a run stopped between the file's deletion
        and theirs); only files that no checkpoint will write again qualify."""
        kind, file_id = file
        if kind is FileKind.ENTRY_LOG:
            return file_id < snapshot.log_horizon and file_id not in snapshot.logs
        return file_id < snapshot.journal_horizon and file_id not in snapshot.kept

    def _in_index(self, ledger_id: LedgerId) -> bool:
        """Whether the index still has the ledger: a state or any entry."""
        index = self._index
        return index.ledger_data(ledger_id) is not None or index.last_entry(ledger_id) is not None

    def _size(self, file: FileKey) -> int:
        try:
            return self._path(file).stat().st_size
        except FileNotFoundError:
            return 0

    def _path(self, file: FileKey) -> Path:
        kind, file_id = file
        if kind is FileKind.ENTRY_LOG:
            return self._log.directory / log_file_name(file_id)
        assert self._journal is not None
        return self._journal.directory / file_name(file_id)

    def _account(self, file: FileKey) -> None:
        """Count a file written before counts were kept: its records the index points to."""
        counts: dict[LedgerId, int] = defaultdict(int)
        try:
            complete = True
            for record in yielding(self._records(file)):
                if self._index.location(record.ledger_id, record.entry_id) == record.origin:
                    counts[record.ledger_id] += usage_of(record.origin)[2]
        except (EntryUnreadable, MalformedData, OSError) as error:
            complete = False
            problem = str(error)
        if not complete:
            # What lies past the damage is unknown: ask the whole index what it points to.
            log.warning(
                "garbage collection: %s cannot be read through (%s); counting what the index "
                "points to in it instead",
                self._path(file),
                problem,
            )
            counts = defaultdict(int)
            for ledger_id, _, location in self._index.all_locations():
                kind, file_id, size = usage_of(location)
                if (kind, file_id) == file:
                    counts[ledger_id] += size
        with self._maintenance:
            self._check_running()
            batch = self._index.batch()
            batch.delete_file_usage(*file)
            for ledger_id, size in counts.items():
                batch.put_usage(file[0], file[1], ledger_id, size)
            self._unaccounted = self._unaccounted - {file}
            batch.put_unaccounted_files(self._unaccounted)
            self._index.write(batch)
        log.info(
            "garbage collection: counted %s, written before usage was kept: %d ledgers, %d "
            "live bytes",
            self._path(file),
            len(counts),
            sum(counts.values()),
        )

    def _records(self, file: FileKey) -> Iterator[_Record]:
        """The file's entry records, each with the location the index would hold for it;
        raises if the file cannot be read to its end."""
        kind, file_id = file
        if kind is FileKind.ENTRY_LOG:
            for record in self._log.scan(file_id):
                yield _Record(
                    record.ledger_id, record.entry_id, record.crc32c, record.data, record.location
                )
            return
        path = self._path(file)
        records = read_records(path, file_id)
        while True:
            try:
                mark, payload = next(records)
            except StopIteration as ended:
                scan: Scan = ended.value
                if scan.damage or scan.torn:
                    raise MalformedData(
                        f"journal file {path} is damaged at offset "
                        f"{(scan.damage[0].start if scan.damage else scan.end)}"
                    ) from None
                return
            if payload[0] != RecordType.ENTRY or len(payload) - ENTRY_HEAD.size < KEPT_ENTRY_SIZE:
                continue
            _, scope, ledger, entry_id, _, crc = ENTRY_HEAD.unpack_from(payload)
            data = payload[ENTRY_HEAD.size :]
            location = kept_location(mark, len(data), crc)
            assert location is not None
            yield _Record(LedgerId(scope, ledger), entry_id, crc, data, location)

    # -- deletion -------------------------------------------------------------------------

    def _delete(self, usage: FileUsage, done: _Run) -> None:
        """Delete (or release) a file in which no ledger of the index has entries."""
        file = (usage.kind, usage.file_id)
        path = self._path(file)
        with self._maintenance:
            self._check_running()
            self._remove(file)
        if usage.kind is FileKind.ENTRY_LOG:
            done.deleted.append(usage.file_id)
            log.info(
                "garbage collection: deleted entry log %s (%d bytes): no ledger with entries "
                "in it is in the index any more",
                path,
                usage.total_bytes,
            )
        else:
            done.released.append(usage.file_id)
            log.info(
                "garbage collection: journal file %s (%d bytes) no longer holds an entry of a "
                "ledger in the index; the journal deletes it at its next release",
                path,
                usage.total_bytes,
            )
        done.reclaimed_deletion += usage.total_bytes

    def _remove(self, file: FileKey) -> None:
        """Delete an entry log or release a journal file, and drop its counts (holding
        `maintenance`, after the index was synced without a pointer into the file)."""
        kind, file_id = file
        if kind is FileKind.ENTRY_LOG:
            self._log.delete_log(file_id)
            batch = self._index.batch()
            batch.delete_file_usage(kind, file_id)
            self._index.write(batch)
        else:
            assert self._journal is not None
            self._drop_kept_files(frozenset({file_id}))
            self._journal.retire(file_id)

    # -- compaction -----------------------------------------------------------------------

    def _compact_all(
        self,
        files: tuple[FileUsage, ...],
        kind: CompactionKind,
        ledgers: dict[FileKey, dict[LedgerId, int]],
        done: _Run,
    ) -> bool:
        """Compact `files` in order until the run's time is up; whether all were done."""
        if not files:
            return True
        settings = self.settings
        limit = settings.major_max_time if kind is CompactionKind.MAJOR else settings.minor_max_time
        deadline = self._clock() + limit if limit > 0 else float("inf")
        if settings.rate_bytes > 0 and (
            self._bucket is None or self._bucket.rate != settings.rate_bytes
        ):
            self._bucket = TokenBucket(settings.rate_bytes, CHUNK_BYTES, self._clock())
        for usage in files:
            if self._clock() >= deadline:
                return False
            if not self._compact(usage, kind, ledgers[usage.kind, usage.file_id], deadline, done):
                return False
        return True

    def _compact(
        self,
        usage: FileUsage,
        kind: CompactionKind,
        ledgers: dict[LedgerId, int],
        deadline: float,
        done: _Run,
    ) -> bool:
        """Copy the file's live records away and delete it; False if the time ran out first
        (what was copied stays copied; the file stays until a later run finishes it)."""
        file = (usage.kind, usage.file_id)
        path = self._path(file)
        chunk: list[_Record] = []
        chunk_bytes = 0
        moved_before = done.moved_bytes
        problem = None
        try:
            for record in yielding(self._records(file)):
                if self._index.location(record.ledger_id, record.entry_id) != record.origin:
                    continue
                chunk.append(record)
                chunk_bytes += len(record.data)
                if chunk_bytes >= CHUNK_BYTES or len(chunk) >= CHUNK_RECORDS:
                    self._move(chunk, done)
                    chunk, chunk_bytes = [], 0
                    if self._clock() >= deadline:
                        log.info(
                            "garbage collection: %s compaction of %s stopped for this run "
                            "(its time is up) after moving %d bytes",
                            kind.value,
                            path,
                            done.moved_bytes - moved_before,
                        )
                        return False
        except (EntryUnreadable, MalformedData, OSError) as error:
            problem = str(error)
        self._move(chunk, done)
        if problem is not None:
            self._move_rest(file, ledgers, done)
        if problem is not None and self._points_into(file, ledgers):
            done.failures.append(
                f"{path} kept: it cannot be read through ({problem}), and the index still "
                "points to entries in it"
            )
            log.error("garbage collection: %s", done.failures[-1])
            return True
        self._index.sync()
        _failpoint("compaction.before_remove")
        with self._maintenance:
            self._check_running()
            self._remove(file)
        done.compacted[usage.kind].append(usage.file_id)
        done.reclaimed_compaction += usage.total_bytes
        log.info(
            "garbage collection: %s compaction of %s (%d bytes, %.0f%% live as counted): "
            "moved %d bytes of live entries into the entry logs, %s",
            kind.value,
            path,
            usage.total_bytes,
            100 * usage.live_fraction,
            done.moved_bytes - moved_before,
            "deleted it"
            if usage.kind is FileKind.ENTRY_LOG
            else "the journal deletes it at its next release",
        )
        return True

    def _move(self, records: list[_Record], done: _Run) -> None:
        """Copy records into the current entry log, durably, then point the index at each
        copy where it still points at the original."""
        if not records:
            return
        size = sum(len(record.data) for record in records)
        if self._bucket is not None:
            self._sleep(self._bucket.reserve(size, self._clock()))
        with self._maintenance:
            self._check_running()
            copies = [
                self._log.append(record.ledger_id, record.entry_id, record.crc32c, record.data)
                for record in yielding(records)
            ]
            self._log.flush()
            _failpoint("compaction.after_copy")
            batch = self._index.batch()
            deltas: dict[UsageKey, int] = defaultdict(int)
            for record, copy in yielding(zip(records, copies, strict=True)):
                if self._index.location(record.ledger_id, record.entry_id) != record.origin:
                    continue  # re-added or deleted meanwhile: the copy is garbage
                batch.put_location(record.ledger_id, record.entry_id, copy)
                for location, sign in ((copy, 1), (record.origin, -1)):
                    kind, file_id, counted = usage_of(location)
                    deltas[kind, file_id, record.ledger_id] += sign * counted
                done.moved_entries += 1
                done.moved_bytes += len(record.data)
            self._index.add_usage(batch, deltas)
            self._index.write(batch)

    def _move_rest(self, file: FileKey, ledgers: dict[LedgerId, int], done: _Run) -> None:
        """Copy what the index still points to in a file whose scan stopped at damage (a
        rotten record, which may be garbage since a good copy was written over it): each
        entry read where the index points and checked, as a read does. A copy that fails
        stays where it is, with the file, and is reported corrupt."""
        chunk: list[_Record] = []
        size = 0
        for ledger_id in ledgers:
            for entry_id, location in yielding(self._index.ledger_locations(ledger_id)):
                if usage_of(location)[:2] != file:
                    continue
                try:
                    crc, data = self._read(location, ledger_id, entry_id)
                except EntryCorrupt as error:
                    self._found_corrupt(ledger_id, entry_id, location, str(error))
                    continue
                except EntryUnreadable:
                    continue
                chunk.append(_Record(ledger_id, entry_id, crc, data, location))
                size += len(data)
                if size >= CHUNK_BYTES or len(chunk) >= CHUNK_RECORDS:
                    self._move(chunk, done)
                    chunk, size = [], 0
        self._move(chunk, done)

    def _read(
        self, location: Location | JournalLocation, ledger_id: LedgerId, entry_id: int
    ) -> tuple[int, bytes]:
        if isinstance(location, JournalLocation):
            assert self._journal is not None, "kept journal files are read through it"
            return self._journal.read(location, ledger_id, entry_id)
        return self._log.read(location, ledger_id, entry_id)

    def _points_into(self, file: FileKey, ledgers: dict[LedgerId, int]) -> bool:
        """Whether the index points to an entry in `file` (its ledgers as counted)."""
        for ledger_id in ledgers:
            for _, location in self._index.ledger_locations(ledger_id):
                kind, file_id, _ = usage_of(location)
                if (kind, file_id) == file:
                    return True
        return False

    # -- totals -------------------------------------------------------------------------

    def _count(self, report: GcReport, done: _Run) -> None:
        kind = report.compaction.value
        with self._stats_lock:
            stats = self._stats
            stats.runs += 1
            stats.deleted_entry_logs += len(report.deleted_entry_logs)
            stats.released_journal_files += len(report.released_journal_files)
            if report.compaction is not CompactionKind.NONE:
                stats.compacted_entry_logs[kind] += len(report.compacted_entry_logs)
                stats.compacted_journal_files[kind] += len(report.compacted_journal_files)
                stats.last_compaction_bytes_per_second = report.compaction_bytes_per_second
            stats.reclaimed_deletion_bytes += done.reclaimed_deletion
            stats.reclaimed_compaction_bytes += done.reclaimed_compaction
            stats.moved_entries += report.moved_entries
            stats.moved_bytes += report.moved_bytes
            stats.last_files = report.files


def _failpoint(name: str) -> None:
    """A failpoint between two of compaction's writes: its error stands for the next
    write's, a WriteFailed."""
    try:
        failpoint(name)
    except OSError as error:
        raise WriteFailed(f"garbage collection: {error}") from error


def yielding(items: Iterable[T], after: float = YIELD_AFTER) -> Iterator[T]:
    """`items`, letting go of the GIL after each `after` seconds of work on them. The
    event loop's thread and the journal's threads otherwise wait for it up to the
    interpreter's switch interval (5 ms) at each of an add's hand-overs while compaction (or
    the scrubber) runs Python loops; letting go after every few records costs the compaction
    a third of its speed on a busy machine, where each `sleep(0)` gives the CPU away."""
    last = time.perf_counter()
    for count, item in enumerate(items, 1):
        if count % 16 == 0 and time.perf_counter() - last >= after:
            time.sleep(0)
            last = time.perf_counter()
        yield item


def _file_order(file: FileKey) -> tuple[str, int]:
    return file[0].value, file[1]


def _describe(usage: FileUsage) -> str:
    what = "entry log" if usage.kind is FileKind.ENTRY_LOG else "journal file"
    return f"{what} {usage.file_id}"
