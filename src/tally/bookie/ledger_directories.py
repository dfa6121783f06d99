"""Ledger storage over several ledger directories, one `LedgerStorage` each, and what the
bookie does when one of them fails.

Placement. A ledger goes to one directory when its first write arrives (an add, a fence, a
master key, an explicit LAC), chosen by `tally.core.ledger_dirs.choose_directory`, and
stays there: every call about it goes to that directory's storage. Apache BookKeeper picks
the directory by hash(ledger) % directories, so adding a directory moves ledgers away from
where their entries are; here the placement is recorded (ledger_placement.py, in the
journal directory) and adding a directory or restarting moves nothing (seed 003).

Checkpoints. Every directory checkpoints at the same journal mark, then the placements
made before the checkpoint began are recorded: a placement is never recorded before the
ledger is in its directory's index, and a ledger's placement is forgotten before the ledger
is deleted. At start-up a ledger found in an index but not in the record is placed where it
was found (a crash between the two writes), and the journal is replayed from the oldest
mark of the directories. The journal keeps the files that any directory's index points to.

Failure. An I/O error in a directory, or a probe of it (tally.core.ledger_dirs), fails the
directory. Its ledgers are then placed again at once, on the healthy directories, in limbo
(limbo.py): fenced, answering "unknown" (LedgerInLimbo) for every entry they do not hold
again yet, never NoSuchEntry nor NoSuchLedger, and refusing normal adds with WriteFailed so
that their writers change ensemble (a fence the failed disk held may be lost: no normal add
is taken for them again). Entries of theirs still in the failed directory's write cache
are lost with the rest of the disk: acknowledged, they have other copies. The bookie then
marks those ledgers under-replicated, naming itself, and a replication worker copies their
entries back onto it from the other copies (a FILL: the ensembles do not change, only that
disk's data moves); each leaves limbo once whole. The failed directory is recorded as
failed, its storage closed, and it stays out of service across restarts until an operator
replaces the disk (`tally shell cookie update`). With no healthy directory left, ledgers
stay where they are: the failed directory's storage stays open for reads (a file system
turned read-only still reads) and refuses writes (WriteFailed), and the bookie, read-only,
does not start again until an operator brings a directory back.

Threads: as LedgerStorage's. `_lock` guards the placements and the directories' states;
`_maintenance` keeps checkpoints and deletes apart, as each storage's does.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import os
import re
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple, TypeVar

from tally.bookie.compactor import GcReport, GcSettings
from tally.bookie.entry_log import DEFAULT_LOG_SIZE_LIMIT
from tally.bookie.index import DeletedLedger
from tally.bookie.journal_entries import JournalEntries, JournalLocation
from tally.bookie.journal_format import JournalMark
from tally.bookie.ledger_dir_health import described, errno_of, probe_directory
from tally.bookie.ledger_placement import PlacementRecord
from tally.bookie.ledger_storage import (
    DEFAULT_AVAILABILITY_BATCH,
    CorruptEntry,
    LedgerStorage,
    LedgerStorageStats,
    NewEntryT,
    OnCorrupt,
)
from tally.bookie.storage_totals import combined, summed
from tally.core.admission import LedgerAccess
from tally.core.availability import EntryAvailability
from tally.core.errors import (
    EntryUnreadable,
    IllegalOperation,
    NoSuchLedger,
    TallyError,
    WriteFailed,
)
from tally.core.ids import LedgerId
from tally.core.ledger_dirs import (
    DirectoryHealth,
    DirectoryView,
    ProbeResult,
    choose_directory,
)
from tally.core.protocol import EntryBytes, LedgerInfo

log = logging.getLogger(__name__)

T = TypeVar("T")

PROBE_REQUEST_SPACING = 1.0
"""Seconds between two probes asked for by unclear errors (a run of corrupt reads)."""

_NEW_LEDGER = LedgerAccess()
_LOST_LEDGER = LedgerAccess(lost=True)

DirectoryFailed = Callable[[str, str, list[LedgerId]], None]
"""(directory, reason, ledgers placed again in limbo): told from the thread that saw it."""


class LedgerDirectory(NamedTuple):
    """One configured ledger directory, as the bookie reports it."""

    name: str
    failed: bool
    reason: str
    """Why it failed ("" if it did not)."""
    ledgers: int
    """Ledgers placed on it."""


class _Directory:
    """One ledger directory: its storage while in service, its health, what placement knows."""

    def __init__(self, path: Path, storage: LedgerStorage | None, health: DirectoryHealth):
        self.path = path
        self.name = str(path.resolve())
        """As the cookie and the placement record name it."""
        self.storage = storage
        """Open: in service, or failed and still serving reads."""
        self.writable = None if health.failed else storage
        """The storage while the directory is in service: what the add path looks at."""
        self.health = health
        self.device = os.stat(path).st_dev if storage is not None else -1
        self.ledgers = 0
        self.free_bytes = 0
        self.full = False
        self.closed_stats: LedgerStorageStats | None = None
        """A failed directory's counters as they were when its storage closed."""

    def view(self) -> DirectoryView:
        return DirectoryView(self.health.failed, self.full, self.free_bytes, self.ledgers)


class LedgerDirectories:
    """The bookie's ledger storage over `directories`, with the placement record in
    `journal_dir`. `keeps_entries(directory)` says whether a directory's storage reads
    entries kept in the journal (keep_large_entries_in_journal)."""

    def __init__(
        self,
        directories: Sequence[Path],
        journal_dir: Path,
        *,
        keeps_entries: Callable[[Path], bool] = lambda directory: False,
        log_size_limit: int = DEFAULT_LOG_SIZE_LIMIT,
        direct_io: bool = True,
        gc: GcSettings | None = None,
        on_corrupt: OnCorrupt | None = None,
        on_failure: DirectoryFailed = lambda directory, reason, ledgers: None,
        on_unclear_error: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`on_corrupt` is every storage's (LedgerStorage); `on_failure` hears of a
        directory that failed; `on_unclear_error` of an error on the event loop that asks
        for a probe (the bookie probes in its disk check)."""
        self._journal_file = re.compile(re.escape(str(journal_dir)) + r"/[0-9a-f]{16}\.txn")
        """Names a journal file in an error (an entry kept there is read from it)."""
        self._on_failure = on_failure
        self._on_unclear_error = on_unclear_error
        self._probe_requested = -PROBE_REQUEST_SPACING
        self._clock = clock
        self._lock = threading.Lock()
        self._maintenance = threading.Lock()
        self._record = PlacementRecord(journal_dir)
        self._dirs: list[_Directory] = []
        self._placement: dict[LedgerId, _Directory] = {}
        self._unsaved: dict[LedgerId, _Directory] = {}
        """Placements made since the last checkpoint began: recorded after the next one."""
        self.lost_at_start: list[LedgerId] = []
        """Ledgers found lost at start-up (a failed directory, or one replaced empty)."""
        self.keeps_entries = False
        """Whether a directory in service reads entries kept in the journal."""
        try:
            failed = self._record.failed_directories()
            for path in directories:
                name = str(path.resolve())
                if name in failed:
                    health = DirectoryHealth().fail(failed[name], clock())
                    self._dirs.append(_Directory(path, None, health))
                    continue
                keeps = keeps_entries(path)
                self.keeps_entries |= keeps
                storage = LedgerStorage(
                    path,
                    log_size_limit=log_size_limit,
                    direct_io=direct_io,
                    journal_entries=(
                        JournalEntries(journal_dir, direct_io=direct_io) if keeps else None
                    ),
                    gc=gc,
                    on_corrupt=on_corrupt,
                )
                self._dirs.append(_Directory(path, storage, DirectoryHealth()))
            if not self._in_service():
                raise IllegalOperation(
                    "every ledger directory of this bookie is recorded as failed ("
                    + "; ".join(f"{name}: {why}" for name, why in failed.items())
                    + "): replace a disk and run `tally shell cookie update` to bring its "
                    "directory back empty, or check it and run that with --force to bring "
                    "it back with its data"
                )
            self.refresh_usage(1.0)
            self._reconcile(failed)
        except BaseException:
            self.close()
            raise

    # -- start-up ---------------------------------------------------------------------

    def _reconcile(self, failed: dict[str, str]) -> None:
        """Bring the record and the indexes together (see the module docstring)."""
        by_name = {d.name: d for d in self._dirs}
        recorded = self._record.placements()
        indexed: dict[_Directory, set[LedgerId]] = {}
        found: dict[LedgerId, str] = {}
        for directory in self._in_service():
            assert directory.storage is not None
            indexed[directory] = directory.storage.known_ledgers()
            for ledger_id in indexed[directory]:
                owner = recorded.get(ledger_id) or found.get(ledger_id)
                if owner is None:
                    found[ledger_id] = directory.name
                elif owner != directory.name:
                    log.warning(
                        "ledger %s is in the index of %s but placed on %s: that copy is "
                        "neither served nor deleted",
                        ledger_id.qualified_name,
                        directory.name,
                        owner,
                    )
        if found:
            self._record.place(found)
            log.info("%d ledgers found in the ledger directories placed where found", len(found))
        lost: dict[_Directory, list[LedgerId]] = defaultdict(list)
        for ledger_id, name in {**recorded, **found}.items():
            placed_on = by_name.get(name)
            if placed_on is not None and placed_on in indexed:
                self._placement[ledger_id] = placed_on
                placed_on.ledgers += 1
                if ledger_id not in indexed[placed_on]:
                    lost[placed_on].append(ledger_id)  # lost with the data of a replaced disk
                continue
            target = self._choose()  # placed on a failed or dropped directory: lost there
            assert target is not None, "a directory is in service"
            self._placement[ledger_id] = target
            target.ledgers += 1
            self._unsaved[ledger_id] = target
            lost[target].append(ledger_id)
        for directory, ledger_ids in lost.items():
            assert directory.storage is not None
            directory.storage.enter_limbo(ledger_ids)
            self.lost_at_start += ledger_ids
        if self.lost_at_start:
            log.error(
                "%d ledgers lost their data here with a failed or replaced ledger directory: "
                "in limbo until repaired from their other copies",
                len(self.lost_at_start),
            )
        for name in failed.keys() - by_name.keys():
            self._record.clear_failed(name)  # replaced by another path: its ledgers moved

    # -- placement ----------------------------------------------------------------------

    def _in_service(self) -> list[_Directory]:
        return [d for d in self._dirs if d.storage is not None and not d.health.failed]

    def _open(self) -> list[LedgerStorage]:
        return [d.storage for d in self._dirs if d.storage is not None]

    def _choose(self) -> _Directory | None:
        """A directory for a ledger being placed (call under `_lock`, or at start-up)."""
        chosen = choose_directory([d.view() for d in self._dirs])
        return None if chosen is None else self._dirs[chosen]

    def _writing(self, ledger_id: LedgerId) -> LedgerStorage:
        """The storage to write the ledger to, placing the ledger if it is new.

        A placement is looked up without the lock (a dict read is atomic), as the add path
        does it for every entry; placing takes it."""
        directory = self._placement.get(ledger_id)
        if directory is None:
            with self._lock:
                directory = self._placement.get(ledger_id) or self._place(ledger_id)
        return directory.writable or self._usable(directory, ledger_id, reading=False)

    def _place(self, ledger_id: LedgerId) -> _Directory:
        """Place a new ledger (call under `_lock`)."""
        directory = self._choose()
        if directory is None:
            raise WriteFailed("every ledger directory of this bookie failed")
        self._placement[ledger_id] = directory
        self._unsaved[ledger_id] = directory
        directory.ledgers += 1
        return directory

    def _reading(self, ledger_id: LedgerId) -> tuple[_Directory, LedgerStorage]:
        directory = self._placement.get(ledger_id)
        if directory is None:
            raise NoSuchLedger(f"ledger {ledger_id} is unknown to this bookie")
        return directory, self._usable(directory, ledger_id, reading=True)

    @staticmethod
    def _usable(directory: _Directory, ledger_id: LedgerId, *, reading: bool) -> LedgerStorage:
        """The directory's storage; a failed one's only to read, while it is open (its
        ledgers had nowhere else to go)."""
        storage = directory.storage
        if storage is None or (directory.health.failed and not reading):
            error = EntryUnreadable if reading else WriteFailed
            raise error(
                f"ledger {ledger_id}: its ledger directory {directory.name} failed "
                f"({directory.health.reason}) and no other is in service"
            )
        return storage

    def directory_of(self, ledger_id: LedgerId) -> str | None:
        """The directory the ledger is placed on (None: not placed)."""
        with self._lock:
            directory = self._placement.get(ledger_id)
        return None if directory is None else directory.name

    # -- writes (event loop) -----------------------------------------------------------

    def keep_in_journal(
        self, ledger_id: LedgerId, entry_id: int, location: JournalLocation
    ) -> None:
        with self._lock:
            directory = self._placement.get(ledger_id)
        if directory is not None and directory.storage is not None:
            directory.storage.keep_in_journal(ledger_id, entry_id, location)

    def kept_journal_files(self) -> frozenset[int]:
        """Those of every open storage (a failed one that still serves reads included)."""
        kept: frozenset[int] = frozenset()
        for storage in self._open():
            kept |= storage.kept_journal_files()
        return kept

    def add_entry(
        self,
        ledger_id: LedgerId,
        entry_id: int,
        crc32c: int,
        data: EntryBytes,
        last_add_confirmed: int,
    ) -> None:
        directory = self._placement.get(ledger_id)  # inline `_writing`: once per add
        storage = directory.writable if directory is not None else None
        (storage or self._writing(ledger_id)).add_entry(
            ledger_id, entry_id, crc32c, data, last_add_confirmed
        )

    def add_entries(
        self,
        ledger_id: LedgerId,
        entries: Sequence[NewEntryT],
        refused: Callable[[NewEntryT, TallyError], None],
    ) -> list[NewEntryT]:
        directory = self._placement.get(ledger_id)
        storage = directory.writable if directory is not None else None
        return (storage or self._writing(ledger_id)).add_entries(ledger_id, entries, refused)

    def set_master_key(self, ledger_id: LedgerId, master_key: bytes) -> None:
        self._writing(ledger_id).set_master_key(ledger_id, master_key)

    def set_fenced(self, ledger_id: LedgerId) -> bool:
        return self._writing(ledger_id).set_fenced(ledger_id)

    def set_explicit_lac(self, ledger_id: LedgerId, last_add_confirmed: int) -> None:
        self._writing(ledger_id).set_explicit_lac(ledger_id, last_add_confirmed)

    def set_metadata_copy(self, ledger_id: LedgerId, copy: bytes) -> bool:
        return self._writing(ledger_id).set_metadata_copy(ledger_id, copy)

    def metadata_copy(self, ledger_id: LedgerId) -> bytes | None:
        return self._read(ledger_id, LedgerStorage.metadata_copy)

    def enter_limbo(self, ledger_ids: Iterable[LedgerId]) -> None:
        by_storage: dict[LedgerStorage, list[LedgerId]] = defaultdict(list)
        for ledger_id in ledger_ids:
            by_storage[self._writing(ledger_id)].append(ledger_id)
        for storage, placed in by_storage.items():
            storage.enter_limbo(placed)

    def leave_limbo(self, ledger_id: LedgerId) -> None:
        _, storage = self._reading(ledger_id)
        storage.leave_limbo(ledger_id)

    def limbo_ledgers(self) -> frozenset[LedgerId]:
        found: frozenset[LedgerId] = frozenset()
        for directory in self._in_service():
            assert directory.storage is not None
            found |= directory.storage.limbo_ledgers()
        return found

    def known_ledgers(self) -> set[LedgerId]:
        with self._lock:
            known = {ledger for ledger, d in self._placement.items() if d.health.failed}
        for directory in self._in_service():
            assert directory.storage is not None
            known |= directory.storage.known_ledgers()
        return known

    # -- reads (event loop) ------------------------------------------------------------

    def get_entry(self, ledger_id: LedgerId, entry_id: int) -> tuple[int, EntryBytes]:
        directory, storage = self._reading(ledger_id)
        try:
            return storage.get_entry(ledger_id, entry_id)
        except EntryUnreadable as error:
            self._disk_error(directory, error)
            raise

    def cached_entry(self, ledger_id: LedgerId, entry_id: int) -> tuple[int, EntryBytes] | None:
        return self._reading(ledger_id)[1].cached_entry(ledger_id, entry_id)

    def holds_intact(self, ledger_id: LedgerId, entry_id: int, crc32c: int) -> bool:
        """As LedgerStorage's: in the ledger's directory (False in a failed one)."""
        directory = self._placement.get(ledger_id)
        storage = directory.writable if directory is not None else None
        return storage is not None and storage.holds_intact(ledger_id, entry_id, crc32c)

    def ledger_access(self, ledger_id: LedgerId) -> LedgerAccess:
        """As LedgerStorage's, `lost` for a ledger whose directory failed (the add path's
        look-up: no lock for the placement, whose reads are atomic)."""
        directory = self._placement.get(ledger_id)
        if directory is None:
            return _NEW_LEDGER
        storage = directory.writable
        if storage is None:
            return _LOST_LEDGER
        return storage.ledger_access(ledger_id)

    def master_key(self, ledger_id: LedgerId) -> bytes | None:
        return self._read(ledger_id, LedgerStorage.master_key)

    def is_fenced(self, ledger_id: LedgerId) -> bool:
        return self._read(ledger_id, LedgerStorage.is_fenced)

    def last_add_confirmed(self, ledger_id: LedgerId) -> int:
        return self._read(ledger_id, LedgerStorage.last_add_confirmed)

    def ledger_info(self, ledger_id: LedgerId) -> LedgerInfo:
        return self._read(ledger_id, LedgerStorage.ledger_info)

    def availability(self, ledger_id: LedgerId) -> EntryAvailability:
        return self._read(ledger_id, LedgerStorage.availability)

    def _read(self, ledger_id: LedgerId, read: Callable[[LedgerStorage, LedgerId], T]) -> T:
        directory, storage = self._reading(ledger_id)
        try:
            return read(storage, ledger_id)
        except EntryUnreadable as error:
            self._disk_error(directory, error)
            raise

    def iter_availability(
        self, batch_ledgers: int = DEFAULT_AVAILABILITY_BATCH
    ) -> Iterator[tuple[LedgerId, EntryAvailability]]:
        """AVAILABILITY_DUMP over every open storage, ascending; a ledger is listed from the
        directory it is placed on only."""
        owners = [(d, d.storage) for d in self._dirs if d.storage is not None]
        walks = [
            _tagged(index, storage.iter_availability(batch_ledgers))
            for index, (_, storage) in enumerate(owners)
        ]
        for ledger_id, index, held in heapq.merge(*walks, key=lambda item: (item[0], item[1])):
            with self._lock:
                placed = self._placement.get(ledger_id)
            if placed is owners[index][0]:
                yield ledger_id, held

    def corrupt_entries(self, ledger_id: LedgerId | None = None) -> list[CorruptEntry]:
        """As LedgerStorage's: of the ledger's directory, or of every open storage."""
        if ledger_id is not None:
            directory = self._placement.get(ledger_id)
            storage = directory.storage if directory is not None else None
            return [] if storage is None else storage.corrupt_entries(ledger_id)
        found: list[CorruptEntry] = []
        for storage in self._open():
            found += storage.corrupt_entries()
        return sorted(found, key=lambda corrupt: (corrupt.ledger_id, corrupt.entry_id))

    def last_checkpoint_mark(self) -> bytes | None:
        """The oldest mark of the directories in service: replay the journal from there."""
        marks = []
        for directory in self._in_service():
            assert directory.storage is not None
            mark = directory.storage.last_checkpoint_mark()
            if mark is not None:
                marks.append(JournalMark.from_bytes(mark))
        return min(marks).to_bytes() if marks else None

    def stats(self) -> LedgerStorageStats:
        found = []
        for directory in self._dirs:
            if directory.closed_stats is not None:
                found.append(directory.closed_stats)
            elif directory.storage is not None:
                found.append(directory.storage.stats())
        return found[0] if len(found) == 1 else summed(found)

    # -- maintenance (worker threads) --------------------------------------------------

    def checkpoint(self, journal_mark: bytes) -> None:
        """Checkpoint every directory in service at `journal_mark`, then record the
        placements made before. A directory that fails meanwhile is left out (its ledgers
        are placed again, in limbo); any other error is raised once every directory had
        its turn, and the journal must then keep its files."""
        with self._maintenance:
            with self._lock:
                unsaved = dict(self._unsaved)
            problems: list[TallyError | OSError] = []
            done: set[_Directory] = set()
            for directory in self._in_service():
                assert directory.storage is not None
                try:
                    directory.storage.checkpoint(journal_mark)
                    done.add(directory)
                except (WriteFailed, EntryUnreadable, OSError) as error:
                    self._disk_error(directory, error, probe_now=True)
                    if not directory.health.failed:
                        problems.append(error)
            saving = {ledger: d for ledger, d in unsaved.items() if d in done}
            if saving:
                self._record.place({ledger: d.name for ledger, d in saving.items()})
                with self._lock:
                    for ledger_id, directory in saving.items():
                        if self._unsaved.get(ledger_id) is directory:
                            del self._unsaved[ledger_id]
            if problems:
                raise problems[0]
            if not self._in_service():
                raise WriteFailed("every ledger directory of this bookie failed")

    def delete_ledger(self, ledger_id: LedgerId, tombstone: DeletedLedger | None = None) -> None:
        """As LedgerStorage's; the placement is forgotten first (see the module docstring)."""
        with self._maintenance:
            directory, storage = self._reading(ledger_id)
            self._record.forget([ledger_id])
            try:
                storage.delete_ledger(ledger_id, tombstone)
            except NoSuchLedger:
                pass
            except (WriteFailed, EntryUnreadable, OSError) as error:
                self._disk_error(directory, error, probe_now=True)
                raise
            with self._lock:
                if self._placement.get(ledger_id) is directory:
                    del self._placement[ledger_id]
                    directory.ledgers -= 1
                self._unsaved.pop(ledger_id, None)

    def deleted_ledgers(self) -> dict[LedgerId, DeletedLedger]:
        """As LedgerStorage's, over every open storage."""
        found: dict[LedgerId, DeletedLedger] = {}
        for storage in self._open():
            found.update(storage.deleted_ledgers())
        return found

    def forget_deleted(self, obeyed_before: float) -> int:
        """As LedgerStorage's, in every writable storage."""
        return sum(d.storage.forget_deleted(obeyed_before) for d in self._in_service() if d.storage)

    def forget_entries(self, ledger_id: LedgerId, entry_ids: Iterable[int]) -> int:
        with self._maintenance:
            directory, storage = self._reading(ledger_id)
            try:
                return storage.forget_entries(ledger_id, entry_ids)
            except (WriteFailed, EntryUnreadable, OSError) as error:
                self._disk_error(directory, error, probe_now=True)
                raise

    def collect_garbage(
        self, now: float, *, force_major: bool = False, force_minor: bool = False
    ) -> GcReport:
        """Each directory in service in turn (LedgerStorage.collect_garbage)."""
        reports = []
        for directory in self._in_service():
            assert directory.storage is not None
            try:
                reports.append(
                    directory.storage.collect_garbage(
                        now, force_major=force_major, force_minor=force_minor
                    )
                )
            except (WriteFailed, EntryUnreadable, OSError) as error:
                self._disk_error(directory, error, probe_now=True)
                if not directory.health.failed:
                    raise
        if not reports:
            raise WriteFailed("every ledger directory of this bookie failed")
        return reports[0] if len(reports) == 1 else combined(reports)

    # -- directories' health -----------------------------------------------------------

    def _disk_error(
        self, directory: _Directory, error: Exception, *, probe_now: bool = False
    ) -> None:
        """Judge an error seen in `directory` (any thread). An error about the journal's
        files (an entry kept there) is the journal's, not the directory's."""
        if self._journal_file.search(described(error)):
            return
        with self._lock:
            health, probe = directory.health.on_error(errno_of(error), str(error), self._clock())
        if health.failed:
            self._fail(directory, health)
        elif probe and probe_now:
            self.probe(directory.name)
        elif probe and time.monotonic() - self._probe_requested >= PROBE_REQUEST_SPACING:
            self._probe_requested = time.monotonic()
            self._on_unclear_error()

    def probe(self, name: str) -> None:
        """Probe a directory in service (blocking I/O: a worker thread); fail it if the
        probe says so."""
        directory = self._named(name)
        if directory.storage is None or directory.health.failed:
            return
        result = probe_directory(directory.path, directory.device)
        self._probed(directory, result)

    def probe_unfinished(self, name: str, seconds: float) -> None:
        """A probe of the directory did not finish within `seconds`."""
        directory = self._named(name)
        self._probed(
            directory,
            ProbeResult(directory.device, None, error=f"for {seconds:g}s", finished=False),
        )

    def _probed(self, directory: _Directory, result: ProbeResult) -> None:
        with self._lock:
            health = directory.health.on_probe(result, self._clock())
        if health.failed:
            self._fail(directory, health)

    def _fail(self, directory: _Directory, health: DirectoryHealth) -> None:
        """Take the directory out of service and place its ledgers again, in limbo, at once
        (a reader then finds them in limbo, never unknown to the bookie)."""
        with self._lock:
            if directory.health.failed:
                return
            directory.health = health
            directory.writable = None
            moved = [ledger for ledger, d in self._placement.items() if d is directory]
            targets: dict[_Directory, list[LedgerId]] = defaultdict(list)
            for ledger_id in moved:
                target = self._choose()
                if target is None:
                    break  # nowhere to go: they stay, answering errors
                targets[target].append(ledger_id)
                target.ledgers += 1
                directory.ledgers -= 1
                self._placement[ledger_id] = target
                self._unsaved[ledger_id] = target
            for target, ledger_ids in targets.items():
                assert target.storage is not None
                target.storage.enter_limbo(ledger_ids)
            placed = [ledger for ledger_ids in targets.values() for ledger in ledger_ids]
        log.error(
            "ledger directory %s failed: %s; %d of its ledgers placed again on %s, in limbo "
            "until repaired from their other copies",
            directory.name,
            health.reason,
            len(placed),
            ", ".join(sorted(t.name for t in targets)) or "no directory (none in service)",
        )
        try:
            self._record.mark_failed(directory.name, health.reason, int(self._clock() * 1000))
        except WriteFailed as error:
            log.error("cannot record that %s failed: %s", directory.name, error)
        self._on_failure(directory.name, health.reason, placed)

    def close_failed(self) -> None:
        """Close the storages of the failed directories whose ledgers went elsewhere (a
        worker thread; once nothing calls them any more: the event loop routes nothing
        there since they failed)."""
        for directory in self._dirs:
            storage = directory.storage
            if storage is None or not directory.health.failed or directory.ledgers:
                continue
            directory.closed_stats = dataclasses.replace(
                storage.stats(), cache_entries=0, cache_bytes=0
            )
            directory.storage = None
            try:
                storage.close()
            except (TallyError, OSError) as error:
                log.warning("closing failed ledger directory %s: %s", directory.name, error)

    def storages(self) -> list[tuple[str, Path, LedgerStorage]]:
        """(directory, path, storage) of each directory in service: for what runs over
        one directory's storage at a time (the scrubber)."""
        with self._lock:
            return [(d.name, d.path, d.storage) for d in self._in_service() if d.storage]

    def failed_directories(self) -> dict[str, str]:
        """Each failed directory with why it failed."""
        with self._lock:
            return {d.name: d.health.reason for d in self._dirs if d.health.failed}

    def directories(self) -> list[LedgerDirectory]:
        with self._lock:
            return [
                LedgerDirectory(d.name, d.health.failed, d.health.reason, d.ledgers)
                for d in self._dirs
            ]

    def refresh_usage(self, usage_threshold: float) -> float:
        """Measure the disks of the directories in service; the fullest one's used fraction
        (0.0 if none is in service). At `usage_threshold`, a directory takes new ledgers
        only if every other is as full."""
        fullest = 0.0
        for directory in self._in_service():
            try:
                usage = shutil.disk_usage(directory.path)
            except OSError as error:
                self._disk_error(directory, error)
                continue
            used = usage.used / usage.total if usage.total else 0.0
            with self._lock:
                directory.free_bytes = usage.free
                directory.full = used >= usage_threshold
            fullest = max(fullest, used)
        return fullest

    def _named(self, name: str) -> _Directory:
        return next(d for d in self._dirs if d.name == name)

    def close(self) -> None:
        """Close the files; no checkpoint (the bookie checkpoints first, with its mark).
        A failed directory's storage may fail to close: that is logged."""
        problem: TallyError | OSError | None = None
        for directory in self._dirs:
            storage, directory.storage, directory.writable = directory.storage, None, None
            if storage is None:
                continue
            try:
                storage.close()
            except (TallyError, OSError) as error:
                if not directory.health.failed:
                    problem = problem or error
                log.warning("closing ledger directory %s: %s", directory.name, error)
        self._record.close()
        if problem is not None:
            raise problem


BookieStorage = LedgerStorage | LedgerDirectories
"""What the bookie's parts (requests, replay, garbage collection, limbo) work on: the
storage of one directory (tests and tools), or the bookie's directories."""


def _tagged(
    index: int, walk: Iterator[tuple[LedgerId, EntryAvailability]]
) -> Iterator[tuple[LedgerId, int, EntryAvailability]]:
    for ledger_id, held in walk:
        yield ledger_id, index, held
