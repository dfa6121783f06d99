"""Ledger storage: a write cache, interleaved entry logs and an index, as BookKeeper's
DbLedgerStorage arranges them.

Adds go into an in-memory write cache; durability is the journal's job until a checkpoint.
`checkpoint(mark)` (in a worker thread) swaps in a fresh cache, so adds continue, appends
the old one's entries to the entry log sorted by (ledger, entry), fdatasyncs the log, then
writes the locations, the changed ledger states and the journal mark in one index batch and
syncs the index's WAL. Once it returns, every journal record before `mark` is in storage
and the journal may let its files go. After a crash the bookie replays the journal from
`last_checkpoint_mark()`: every write operation here is idempotent.

Re-adding an entry replaces it (last write wins), as in BookKeeper. Recovery and the
replication worker re-add entries a bookie may already hold; the bytes can differ only in
what the writer wraps around the payload (a recovery client piggy-backs its own LAC), both
copies are valid and checksummed end to end, and only a replacing re-add can repair a copy
that rotted on disk. So the newest verified copy wins.

Reads: the write caches first, then the index and the entry log. An entry the index holds
but whose bytes cannot be read is `EntryUnreadable`, never `NoSuchEntry` (seed 003).
`NoSuchLedger` only when nothing is known of the ledger.

Corrupt copies. A copy whose bytes fail their check (CRC32C, or a record naming another
entry), found by a read, the scrubber (scrubber.py) or compaction, is marked corrupt in
the index (`corrupt` family), not dropped: the index keeps the entry, and reads answer
`EntryCorrupt` (an EntryUnreadable) without reading it again. A mark holds while the index
points at the copy it names: the checkpoint that indexes a copy written over it (a re-add:
the replication worker's, with a copy it verified) ends it in the same batch; the entries
waiting for that are left out of `availability`. `corrupt_entries` lists the marks;
`on_corrupt` hears of new ones.

Limbo (BookKeeper's BP-46). A ledger whose journal records may have been lost (the bookie
found its journal damaged at start-up) is in limbo: the bookie cannot tell an entry it never
received from one it acknowledged and lost, so it answers `LedgerInLimbo` (unknown) where it
would answer NoSuchEntry, and the ledger is fenced, since a lost record may have been a
fence. The bookie takes a ledger out of limbo once it holds every entry the ledger's closed
metadata gives it (limbo.py); the set is kept in the index, written by the checkpoints.

Threads. The bookie calls everything from its event loop thread except `checkpoint`,
`delete_ledger` and `forget_entries`, which it runs in one worker thread (they hold
`_maintenance` for their whole run, so they never overlap), and `collect_garbage`, which
runs in a thread of its own and holds `_maintenance` a bounded chunk at a time
(compactor.py). One short lock, `_lock`, guards the caches and the ledger states: an add
holds it for a few dict operations; a checkpoint for the swap, for encoding the changed
states, and for the index write plus the drop of the old cache, so a reader sees an entry
either in a cache or in the index, never in neither. rocksdict holds the GIL during that
write anyway, so the lock costs the event loop nothing more. The entry log append, its
fdatasync and the index sync run without it. Called on the event loop, the maintenance
calls would block it for up to a checkpoint.

Memory: the write caches, and the state (a few hundred bytes) of every ledger touched since
start-up. An AVAILABILITY_DUMP holds one ledger's entry ids at a time.

A directory with entry logs but no index is refused at start-up: an empty index would
answer NoSuchEntry for every entry the bookie ever acknowledged.

Garbage collection (compactor.py) deletes the files that hold no live entry and compacts
sparse ones; the index counts each ledger's bytes in each file for it, and the checkpoints,
`forget_entries` and the compaction keep those counts in the batches that move entries.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar

import numpy as np

from tally.bookie.compactor import (
    Compactor,
    GcReport,
    GcSettings,
    GcStats,
    disk_space_of,
    usage_of,
)
from tally.bookie.entry_log import (
    DEFAULT_LOG_SIZE_LIMIT,
    RECORD_HEADER_SIZE,
    EntryLog,
    Location,
)
from tally.bookie.index import (
    CorruptMark,
    DeletedLedger,
    FoundBy,
    Index,
    IndexBatch,
    Int64Array,
    LedgerData,
    UsageKey,
)
from tally.bookie.journal_entries import JournalEntries, JournalLocation
from tally.bookie.scrubber import Scrubber, ScrubStats, ScrubStep, Verdict
from tally.bookie.write_cache import Stored, WriteCache
from tally.core.admission import LedgerAccess
from tally.core.availability import EntryAvailability
from tally.core.compaction import DiskSpace
from tally.core.digest import MASTER_KEY_SIZE
from tally.core.digest import crc32c as compute_crc32c
from tally.core.errors import (
    BadDigest,
    BadRequest,
    EntryCorrupt,
    EntryUnreadable,
    IllegalOperation,
    LedgerInLimbo,
    MalformedData,
    NoSuchEntry,
    NoSuchLedger,
    TallyError,
    Unauthorized,
    WriteFailed,
)
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.metadata_copies import supersedes
from tally.core.protocol import KEEP_IN_PLACE, EntryBytes, LedgerInfo
from tally.core.scrub import ScrubPass
from tally.failpoints import failpoint

log = logging.getLogger(__name__)


class NewEntry(Protocol):
    """An entry to add as `add_entries` takes it (an ADD request is one)."""

    @property
    def entry_id(self) -> int: ...
    @property
    def crc32c(self) -> int: ...
    @property
    def entry(self) -> EntryBytes: ...
    @property
    def last_add_confirmed(self) -> int: ...


NewEntryT = TypeVar("NewEntryT", bound=NewEntry)

LAST_ENTRY = -1
"""The entry id that reads the highest entry the bookie holds (BookKeeper's LAST_ADD_CONFIRMED
read, which answers with the last entry stored)."""
MAX_ENTRY_ID = 2**63 - 1
DEFAULT_AVAILABILITY_BATCH = 1000
MOVED_READS = 4
"""Reads of an entry that compaction keeps moving away between look-up and read, before
EntryUnreadable (each move takes a compaction of the file it went to)."""


@dataclass(frozen=True, slots=True)
class LedgerStorageStats:
    """Counters for the bookie's metrics, since the storage was opened."""

    entries_added: int
    bytes_added: int
    entries_read: int
    read_errors: int
    cache_entries: int
    cache_bytes: int
    checkpoints: int
    entries_checkpointed: int
    entries_kept_in_journal: int
    """Of those, indexed where the journal holds them rather than copied."""
    kept_journal_files: int
    last_checkpoint_seconds: float
    checkpoint_seconds_total: float
    gc: GcStats
    scrub: ScrubStats
    corrupt_entries: int
    """Entries marked corrupt now (a good copy written over one ends its mark)."""
    corrupt_marked: dict[FoundBy, int]
    """Marks made since the storage was opened, by who found the copy corrupt."""


@dataclass(slots=True)
class _Counters:
    entries_added: int = 0
    bytes_added: int = 0
    entries_read: int = 0
    read_errors: int = 0
    checkpoints: int = 0
    entries_checkpointed: int = 0
    entries_kept_in_journal: int = 0
    last_checkpoint_seconds: float = 0.0
    checkpoint_seconds_total: float = 0.0
    corrupt_marked: dict[FoundBy, int] = field(default_factory=lambda: dict.fromkeys(FoundBy, 0))


@dataclass(frozen=True, slots=True)
class CorruptEntry:
    """An entry whose copy on this bookie is marked corrupt, with its mark."""

    ledger_id: LedgerId
    entry_id: int
    mark: CorruptMark


OnCorrupt = Callable[[LedgerId, list[int]], None]
"""Hears of entries of a ledger newly marked corrupt, from the thread that found them."""


class LedgerStorage:
    """The bookie's ledger storage in `directory` (entry logs in `logs/`, index in `index/`)."""

    def __init__(
        self,
        directory: Path,
        *,
        log_size_limit: int = DEFAULT_LOG_SIZE_LIMIT,
        direct_io: bool = True,
        journal_entries: JournalEntries | None = None,
        gc: GcSettings | None = None,
        disk_space: Callable[[], DiskSpace] | None = None,
        on_corrupt: OnCorrupt | None = None,
    ) -> None:
        """`journal_entries`: where to read the entries that `keep_in_journal` leaves in the
        journal; without it, every entry is copied into the entry logs. `gc`: garbage
        collection's settings; `disk_space` measures the ledger disk for it. `on_corrupt`
        hears of every entry newly marked corrupt (by a read, on the reading thread; by the
        scrubber, after its step, on its thread)."""
        self.directory = directory
        self._log = EntryLog(directory / "logs", size_limit=log_size_limit, direct_io=direct_io)
        if not (directory / "index").exists() and self._log.log_ids():
            # The index is created before any log: its absence means it was lost, and an
            # empty one would answer NoSuchEntry for every entry the bookie acknowledged.
            raise IllegalOperation(
                f"{directory} holds entry logs but no index; refusing to start with an empty "
                "index (restore it, or decommission this bookie's data)"
            )
        self._index = Index(directory / "index")
        self._journal = journal_entries
        self._kept_files = self._index.kept_journal_files()
        """Journal files holding entries the index points to: the journal keeps them."""
        self._lock = threading.Lock()
        self._maintenance = threading.Lock()
        self._cache = WriteCache()
        self._flushing: WriteCache | None = None
        """The cache a running checkpoint is writing out; still served to readers."""
        self._states: dict[LedgerId, LedgerData] = {}
        """Every ledger touched since start-up (loaded on first use, never evicted)."""
        self._dirty: set[LedgerId] = set()
        """Ledgers whose state changed since the last checkpoint took its snapshot, besides
        the ledgers in the write cache, whose states every checkpoint writes anyway."""
        self._copies: dict[LedgerId, bytes] = {}
        """Metadata copies given since the last checkpoint began, written by the next."""
        self._limbo = self._index.limbo_ledgers()
        self._limbo_changed = False
        """Whether `_limbo` changed since the last checkpoint took its snapshot."""
        self._counters = _Counters()
        self._marks = {
            (ledger_id, entry_id): mark for ledger_id, entry_id, mark in self._index.corrupt_marks()
        }
        """Every corrupt mark (few: a copy is marked when found bad, until one replaces it)."""
        self._on_corrupt = on_corrupt
        self._scrub_found: list[tuple[LedgerId, int]] = []
        """Marked by the step of the scrubber under way (its thread's only)."""
        self._scrubber = Scrubber(
            self._index,
            self._log,
            journal_entries,
            self.kept_journal_files,
            self._settle,
            self._verified,
            lambda: bool(self._marks),
            self._drop_stale_marks,
        )
        self._compactor = Compactor(
            self._index,
            self._log,
            journal_entries,
            self._maintenance,
            self.kept_journal_files,
            self._drop_kept_files,
            self._compaction_found_corrupt,
            gc or GcSettings(),
            disk_space=disk_space or disk_space_of(directory),
        )

    # -- writes (event loop) --------------------------------------------------------

    def keep_in_journal(
        self, ledger_id: LedgerId, entry_id: int, location: JournalLocation
    ) -> None:
        """Let the entry's checkpoint index its durable journal record at `location` rather
        than copy it into an entry log. Ignored if the cache holds other bytes for it by now
        (another CRC32C or size: a re-add of the same bytes may keep either record)."""
        if self._journal is None:
            return
        with self._lock:
            stored = self._cache.get(ledger_id, entry_id)
            if stored is not None and (stored[0], len(stored[1])) == (
                location.crc32c,
                location.size,
            ):
                self._cache.kept[ledger_id, entry_id] = location

    def kept_journal_files(self) -> frozenset[int]:
        """The journal files that the index points into, which must not be deleted."""
        with self._lock:
            return frozenset(self._kept_files)

    def add_entry(
        self,
        ledger_id: LedgerId,
        entry_id: int,
        crc32c: int,
        data: EntryBytes,
        last_add_confirmed: int,
    ) -> None:
        """Store an entry (in the write cache) and the LAC its writer piggy-backed on it.

        `crc32c` is the client's CRC32C of `data`; a mismatch is BadDigest, so call this
        before journaling the add. `data` is kept as it is (bytes, or a view nobody writes
        to again), except a view shorter than KEEP_IN_PLACE, which is copied rather than
        keep a larger buffer alive for a few bytes (a replayed journal record, say).

        An add replaces the copy held (see the module docstring); the checkpoint that
        indexes the new copy ends the old one's corrupt mark, if it had one.
        """
        stored = _checked(ledger_id, entry_id, crc32c, data, last_add_confirmed)
        with self._lock:
            self._store(self._touch(ledger_id), ledger_id, [(entry_id, stored)], last_add_confirmed)

    def add_entries(
        self,
        ledger_id: LedgerId,
        entries: Sequence[NewEntryT],
        refused: Callable[[NewEntryT, TallyError], None],
    ) -> list[NewEntryT]:
        """`add_entry` for a run of one ledger's entries (the adds of one receive), under
        one lock: returns those stored; each one refused is told to `refused` instead, once
        the others are stored (if storing raises, none has been told anything). A run whose
        every entry is refused leaves no trace, not even the ledger."""
        checked: list[NewEntryT] = []
        stores: list[tuple[int, Stored]] = []
        refusals: list[tuple[NewEntryT, TallyError]] = []
        lac = -1
        for entry in entries:
            entry_id, entry_lac = entry.entry_id, entry.last_add_confirmed
            try:
                stored = _checked(ledger_id, entry_id, entry.crc32c, entry.entry, entry_lac)
            except TallyError as error:
                refusals.append((entry, error))
            else:
                checked.append(entry)
                stores.append((entry_id, stored))
                if entry_lac > lac:
                    lac = entry_lac
        if checked:
            with self._lock:
                self._store(self._touch(ledger_id), ledger_id, stores, lac)
        for entry, refusal in refusals:
            refused(entry, refusal)
        return checked

    def _store(
        self,
        state: LedgerData,
        ledger_id: LedgerId,
        entries: list[tuple[int, Stored]],
        last_add_confirmed: int,
    ) -> None:
        """Put checked (entry id, stored) of one ledger into the write cache, the highest LAC
        they carry piggybacked (call under `_lock`)."""
        if last_add_confirmed > state.piggyback_lac:
            state.piggyback_lac = last_add_confirmed
        # Not marked dirty: the next checkpoint writes the state of every ledger in the
        # cache it flushes, and this one is in it from here on.
        self._counters.bytes_added += self._cache.put_all(ledger_id, entries)
        self._counters.entries_added += len(entries)

    def set_master_key(self, ledger_id: LedgerId, master_key: bytes) -> None:
        """Record the ledger's master key; the first one stays, a different one is refused."""
        if not isinstance(master_key, bytes) or len(master_key) != MASTER_KEY_SIZE:
            raise BadRequest(
                f"ledger {ledger_id}: a master key is {MASTER_KEY_SIZE} bytes, "
                f"got {len(master_key) if isinstance(master_key, bytes) else master_key!r}"
            )
        with self._lock:
            state = self._touch(ledger_id)
            if state.master_key is None:
                state.master_key = master_key
                self._dirty.add(ledger_id)
            elif state.master_key != master_key:
                raise Unauthorized(f"ledger {ledger_id}: the master key does not match")

    def set_fenced(self, ledger_id: LedgerId) -> bool:
        """Fence the ledger, known or not (a fencing read records the fence either way).

        Returns whether it was fenced already. Durable at the next checkpoint: the bookie
        journals the fence before answering.
        """
        with self._lock:
            state = self._touch(ledger_id)
            was_fenced = state.fenced
            if not was_fenced:
                state.fenced = True
                self._dirty.add(ledger_id)
            return was_fenced

    def set_explicit_lac(self, ledger_id: LedgerId, last_add_confirmed: int) -> None:
        """Record an explicit LAC (WRITE_LAC); the highest one seen is kept."""
        _check_lac(last_add_confirmed, ledger_id)
        with self._lock:
            state = self._touch(ledger_id)
            if last_add_confirmed > state.explicit_lac:
                state.explicit_lac = last_add_confirmed
                self._dirty.add(ledger_id)

    def set_metadata_copy(self, ledger_id: LedgerId, copy: bytes) -> bool:
        """Keep `copy` (LedgerMetadata bytes) as the ledger's metadata copy if it is more
        advanced than the one held (`tally.core.metadata_copies`); whether it was kept.
        Durable at the next checkpoint (the bookie journals it first). BadRequest if it
        does not decode."""
        try:
            offered = LedgerMetadata.from_bytes(copy, ledger_id)
        except MalformedData as error:
            raise BadRequest(str(error)) from None
        with self._lock:
            held_bytes = self._copies.get(ledger_id)
        if held_bytes is None:
            held_bytes = self._index.metadata_copy(ledger_id)
        held = None
        if held_bytes is not None:
            try:
                held = LedgerMetadata.from_bytes(held_bytes, ledger_id)
            except MalformedData as error:
                log.error("ledger %s: the metadata copy held is replaced: %s", ledger_id, error)
        if not supersedes(offered, held):
            return False
        with self._lock:
            self._touch(ledger_id)
            self._copies[ledger_id] = bytes(copy)
        return True

    def metadata_copy(self, ledger_id: LedgerId) -> bytes | None:
        """The ledger's metadata copy kept here (None: none was given)."""
        with self._lock:
            pending = self._copies.get(ledger_id)
        return pending if pending is not None else self._index.metadata_copy(ledger_id)

    def enter_limbo(self, ledger_ids: Iterable[LedgerId]) -> None:
        """Put the ledgers in limbo, fenced (see the module docstring); durable at the next
        checkpoint, which a start-up that calls this replays to again until then."""
        with self._lock:
            for ledger_id in ledger_ids:
                state = self._touch(ledger_id)
                if not state.fenced:
                    state.fenced = True
                    self._dirty.add(ledger_id)
                self._limbo.add(ledger_id)
                self._limbo_changed = True

    def leave_limbo(self, ledger_id: LedgerId) -> None:
        """The ledger is whole again on this bookie: negatives are true again."""
        with self._lock:
            if ledger_id in self._limbo:
                self._limbo.discard(ledger_id)
                self._limbo_changed = True

    def limbo_ledgers(self) -> frozenset[LedgerId]:
        with self._lock:
            return frozenset(self._limbo)

    def known_ledgers(self) -> set[LedgerId]:
        """Every ledger the index or the memory has a state for."""
        with self._lock:
            in_memory = set(self._states)
        return in_memory.union(self._index.ledgers())

    # -- reads (event loop) ---------------------------------------------------------

    def get_entry(self, ledger_id: LedgerId, entry_id: int) -> tuple[int, EntryBytes]:
        """(CRC32C, bytes) of the entry; LAST_ENTRY (-1) reads the highest one held."""
        _check_ledger_id(ledger_id)
        if entry_id == LAST_ENTRY:
            entry_id = self._last_entry(ledger_id)
        else:
            _check_entry_id(entry_id, ledger_id)
        stored = self._from_memory(ledger_id, entry_id, counted=True)
        if stored is not None:
            return stored
        try:
            location = self._index.location(ledger_id, entry_id)
            for attempt in range(MOVED_READS):
                if location is None:
                    break
                self._refuse_marked(ledger_id, entry_id, location)
                try:
                    return self._read(location, ledger_id, entry_id)
                except EntryUnreadable as error:
                    # Garbage collection may have moved the entry and deleted its file since
                    # the look-up: the index then says where it is now (or that it is gone).
                    moved = self._index.location(ledger_id, entry_id)
                    if moved == location and isinstance(error, EntryCorrupt):
                        _, new = self._mark_corrupt(
                            ledger_id, entry_id, location, FoundBy.READ, str(error)
                        )
                        if new:
                            self._report([(ledger_id, entry_id)])
                    if moved == location or attempt == MOVED_READS - 1:
                        raise
                    location = moved
        except EntryUnreadable:
            with self._lock:
                self._counters.read_errors += 1
            raise
        self._check_negative(ledger_id, f"entry {entry_id} of ledger {ledger_id}")
        raise NoSuchEntry(f"entry {entry_id} of ledger {ledger_id} is not on this bookie")

    def cached_entry(self, ledger_id: LedgerId, entry_id: int) -> tuple[int, EntryBytes] | None:
        """`get_entry`'s answer if it needs no wait for a disk: the entry in memory (the
        write cache, or the cache a checkpoint is writing out), or in an entry log's pages
        in the page cache; None otherwise, and for anything but an intact copy held (an
        absence, a mark, an error), which `get_entry` is left to answer."""
        _check_ledger_id(ledger_id)
        _check_entry_id(entry_id, ledger_id)
        stored = self._from_memory(ledger_id, entry_id, counted=False)
        if stored is not None:
            return stored
        try:
            location = self._index.location(ledger_id, entry_id)
        except EntryUnreadable:
            return None
        if not isinstance(location, Location) or (ledger_id, entry_id) in self._marks:
            return None
        stored = self._log.read_cached(location, ledger_id, entry_id)
        if stored is not None:
            with self._lock:
                self._counters.entries_read += 1
        return stored

    def _from_memory(
        self, ledger_id: LedgerId, entry_id: int, *, counted: bool
    ) -> tuple[int, EntryBytes] | None:
        """The entry from the caches; a read is counted if `counted` or it was found (a
        miss is then counted by the read from disk that follows)."""
        with self._lock:
            stored = self._cache.get(ledger_id, entry_id)
            if stored is None and self._flushing is not None:
                stored = self._flushing.get(ledger_id, entry_id)
            if counted or stored is not None:
                self._counters.entries_read += 1
        return stored

    def holds_intact(self, ledger_id: LedgerId, entry_id: int, crc32c: int) -> bool:
        """Whether a recovery add of the entry, of this CRC32C, may be acknowledged without
        writing it: a checkpointed copy is held, not marked corrupt, and reads back intact
        with the same CRC32C. A repair writes over a bad copy (marked, or found bad by this
        read, which marks it) and over nothing else. A copy still in the write cache is not
        looked at (its add may not be durable yet), nor one of other bytes (a recovering
        client writes what it read with its own LAC): the add goes on, as any add."""
        _check_entry_id(entry_id, ledger_id)
        with self._lock:
            cached = self._cache.get(ledger_id, entry_id) is not None or (
                self._flushing is not None and self._flushing.get(ledger_id, entry_id) is not None
            )
        if cached:
            return False
        try:
            held, _ = self.get_entry(ledger_id, entry_id)
        except (EntryUnreadable, LedgerInLimbo, NoSuchEntry, NoSuchLedger):
            return False
        return held == crc32c  # else other bytes: a recovering client's own LAC, say

    def _refuse_marked(
        self, ledger_id: LedgerId, entry_id: int, location: Location | JournalLocation
    ) -> None:
        """EntryCorrupt if the copy at `location` is marked corrupt: not read again."""
        if not self._marks:
            return
        with self._lock:
            mark = self._marks.get((ledger_id, entry_id))
        if mark is not None and mark.location == location:
            raise EntryCorrupt(
                f"entry {entry_id} of ledger {ledger_id}: this bookie's copy "
                f"({_describe(location)}) was found corrupt by the {mark.found_by.value} at "
                f"{_timestamp(mark.found_at)}; it is kept, marked, until a good copy is "
                "written over it"
            )

    def _read(
        self, location: Location | JournalLocation, ledger_id: LedgerId, entry_id: int
    ) -> tuple[int, bytes]:
        if isinstance(location, Location):
            return self._log.read(location, ledger_id, entry_id)
        if self._journal is None:
            raise EntryUnreadable(
                f"entry {entry_id} of ledger {ledger_id} is kept in journal file "
                f"{location.file_id}, and this storage was opened without the journal"
            )
        return self._journal.read(location, ledger_id, entry_id)

    def _last_entry(self, ledger_id: LedgerId) -> int:
        with self._lock:
            cached = [
                last
                for cache in (self._cache, self._flushing)
                if cache is not None and (last := cache.last_entry(ledger_id)) is not None
            ]
        indexed = self._index.last_entry(ledger_id)
        highest = max([*cached, -1 if indexed is None else indexed])
        if highest >= 0:
            return highest
        self._check_negative(ledger_id, f"the last entry of ledger {ledger_id}")
        raise NoSuchEntry(f"ledger {ledger_id} has no entries on this bookie")

    def _check_negative(self, ledger_id: LedgerId, what: str) -> None:
        """Before answering NoSuchEntry: NoSuchLedger if the ledger is unknown, and
        LedgerInLimbo if this bookie may have lost what was asked for."""
        with self._lock:
            known = self._find(ledger_id) is not None
            in_limbo = ledger_id in self._limbo
        if in_limbo:
            raise LedgerInLimbo(
                f"{what} is not on this bookie, which may have lost it (ledger in limbo after "
                "journal damage): unknown until the ledger is repaired"
            )
        if not known:
            raise NoSuchLedger(f"ledger {ledger_id} is unknown to this bookie")

    def ledger_access(self, ledger_id: LedgerId) -> LedgerAccess:
        """Master key, fence and limbo, for the admission rules: the add path's one look-up.

        An unknown ledger has no key and no fence yet (the request may be its first). A
        ledger in limbo is `lost`: its normal adds are refused as a failed write (its writer
        changes ensemble), not as fenced (its writer would stop), though it is fenced too."""
        with self._lock:
            state = self._find(ledger_id)
            if state is None:
                return LedgerAccess(lost=ledger_id in self._limbo)
            return LedgerAccess(
                master_key=state.master_key, fenced=state.fenced, lost=ledger_id in self._limbo
            )

    def master_key(self, ledger_id: LedgerId) -> bytes | None:
        """The ledger's master key (None if the ledger is only known from a fence)."""
        return self._snapshot(ledger_id).master_key

    def is_fenced(self, ledger_id: LedgerId) -> bool:
        return self._snapshot(ledger_id).fenced

    def last_add_confirmed(self, ledger_id: LedgerId) -> int:
        """max(piggy-backed LACs of the adds, explicit LAC); -1 if the ledger has seen none."""
        return self._snapshot(ledger_id).last_add_confirmed

    def ledger_info(self, ledger_id: LedgerId) -> LedgerInfo:
        """LEDGER_INFO: fenced, LAC, and the entries and entry bytes the bookie holds."""
        with self._lock:
            state = self._find(ledger_id)
            if state is None:
                raise NoSuchLedger(f"ledger {ledger_id} is unknown to this bookie")
            sizes = {
                entry_id: len(data)
                for cache in (self._flushing, self._cache)
                if cache is not None
                for entry_id, (_, data) in cache.entries(ledger_id).items()
            }
            # Under the lock: a checkpoint finishing meanwhile would move cached entries
            # into the index and the counts, and they would be counted twice or not at all.
            entry_count, byte_count = state.entry_count, state.byte_count
            for entry_id, size in sizes.items():
                entry_count, byte_count, _ = self._counted(
                    ledger_id, entry_id, size, state.last_entry, entry_count, byte_count
                )
            return LedgerInfo(state.fenced, state.last_add_confirmed, entry_count, byte_count)

    def availability(self, ledger_id: LedgerId) -> EntryAvailability:
        """GET_LIST_OF_ENTRIES_OF_LEDGER: the entries the index and the write caches hold,
        but those whose copy here is marked corrupt: what this bookie can serve, so that
        every check that asks (replicas check, audit, repair plan) sees them as lacking."""
        _check_ledger_id(ledger_id)
        with self._lock:
            cached = [
                np.fromiter(cache.entries(ledger_id), dtype=np.int64)
                for cache in (self._cache, self._flushing)
                if cache is not None
            ]
        indexed = self._index.entries_of(ledger_id)
        if not indexed.size and not any(ids.size for ids in cached) and not self._known(ledger_id):
            raise NoSuchLedger(f"ledger {ledger_id} is unknown to this bookie")
        held = EntryAvailability.from_entries(_merged(indexed, *cached))
        if not self._marks:
            return held
        corrupt = [entry.entry_id for entry in self.corrupt_entries(ledger_id)]
        return held.difference(EntryAvailability.from_entries(corrupt)) if corrupt else held

    def iter_availability(
        self, batch_ledgers: int = DEFAULT_AVAILABILITY_BATCH
    ) -> Iterator[tuple[LedgerId, EntryAvailability]]:
        """AVAILABILITY_DUMP: every ledger with its availability, ascending, in bounded memory.

        The index is read `batch_ledgers` ledger ids at a time, and entry ids one ledger at
        a time. Ledgers deleted during the walk are left out; ledgers added during it may
        or may not appear.
        """
        if batch_ledgers < 1:
            raise BadRequest(f"batch_ledgers must be at least 1, got {batch_ledgers}")
        with self._lock:
            in_memory = sorted(self._states)
        after: LedgerId | None = None
        while True:
            batch = []
            for ledger_id in self._index.ledgers(after):
                batch.append(ledger_id)
                if len(batch) == batch_ledgers:
                    break
            exhausted = len(batch) < batch_ledgers
            lo = 0 if after is None else bisect.bisect_right(in_memory, after)
            hi = len(in_memory) if exhausted else bisect.bisect_right(in_memory, batch[-1])
            for ledger_id in sorted({*batch, *in_memory[lo:hi]}):
                try:
                    yield ledger_id, self.availability(ledger_id)
                except NoSuchLedger:
                    continue
            if exhausted:
                return
            after = batch[-1]

    def last_checkpoint_mark(self) -> bytes | None:
        """The journal mark of the last checkpoint: replay the journal from here at start-up."""
        return self._index.journal_mark()

    def stats(self) -> LedgerStorageStats:
        with self._lock:
            counters = self._counters
            caches = [cache for cache in (self._cache, self._flushing) if cache is not None]
            return LedgerStorageStats(
                entries_added=counters.entries_added,
                bytes_added=counters.bytes_added,
                entries_read=counters.entries_read,
                read_errors=counters.read_errors,
                cache_entries=sum(cache.entry_count for cache in caches),
                cache_bytes=sum(cache.byte_count for cache in caches),
                checkpoints=counters.checkpoints,
                entries_checkpointed=counters.entries_checkpointed,
                entries_kept_in_journal=counters.entries_kept_in_journal,
                kept_journal_files=len(self._kept_files),
                last_checkpoint_seconds=counters.last_checkpoint_seconds,
                checkpoint_seconds_total=counters.checkpoint_seconds_total,
                gc=self._compactor.stats(),
                scrub=self._scrubber.stats(),
                corrupt_entries=len(self._marks),
                corrupt_marked=dict(counters.corrupt_marked),
            )

    # -- corrupt copies and scrubbing --------------------------------------------------

    def corrupt_entries(self, ledger_id: LedgerId | None = None) -> list[CorruptEntry]:
        """The entries (of `ledger_id`, or of every ledger) whose copy here is marked
        corrupt and not yet replaced, by ledger and entry: what a repair writes over (an
        add). A re-add waiting in the write cache counts as
        replaced: its checkpoint ends the mark."""
        with self._lock:
            marked = sorted(
                (key, mark)
                for key, mark in self._marks.items()
                if (ledger_id is None or key[0] == ledger_id) and not self._cached(*key)
            )
        return [
            CorruptEntry(marked_ledger, entry_id, mark)
            for (marked_ledger, entry_id), mark in marked
            if self._index.location(marked_ledger, entry_id) == mark.location
        ]

    def scrub(self, budget: int, *, full_speed: bool = False) -> ScrubStep:
        """One step of the scrub pass under way, or of a new one: about `budget` bytes of
        the files read back and their entries checked (scrubber.py). Call from a worker
        thread, one at a time. The entries found corrupt are marked, then reported to
        `on_corrupt`.

        IllegalOperation if the storage is closing; WriteFailed if the index cannot be
        written (the step's marks may be lost: the next pass finds them again)."""
        step = self._scrubber.step(budget, full_speed=full_speed)
        found, self._scrub_found = self._scrub_found, []
        self._report(found)
        return step

    def scrub_passes(self) -> tuple[ScrubPass | None, list[ScrubPass]]:
        """The scrub pass under way (None if none) and the last complete ones, oldest first."""
        return self._scrubber.current(), self._scrubber.passes()

    def _cached(self, ledger_id: LedgerId, entry_id: int) -> bool:
        """Whether a write cache holds a copy of the entry (call under `_lock`)."""
        return self._cache.get(ledger_id, entry_id) is not None or (
            self._flushing is not None and self._flushing.get(ledger_id, entry_id) is not None
        )

    def _mark_corrupt(
        self,
        ledger_id: LedgerId,
        entry_id: int,
        location: Location | JournalLocation,
        found_by: FoundBy,
        problem: str,
    ) -> tuple[Verdict, bool]:
        """Mark the copy at `location`, found corrupt, if the index still points at it and
        no newer copy waits in a write cache; the verdict, and whether the mark is new."""
        key = (ledger_id, entry_id)
        with self._lock:
            if self._cached(ledger_id, entry_id):
                return Verdict.HEALTHY, False
            if self._index.location(ledger_id, entry_id) != location:
                return Verdict.HEALTHY, False
            mark = self._marks.get(key)
            if mark is not None and mark.location == location:
                return Verdict.CORRUPT, False
            mark = CorruptMark(location, time.time(), found_by)
            batch = self._index.batch()
            batch.put_corrupt(ledger_id, entry_id, mark)
            self._index.write(batch)
            self._marks[key] = mark
            self._counters.corrupt_marked[found_by] += 1
        log.error(
            "entry %d of ledger %s is corrupt on this bookie (found by the %s): %s. Marked "
            "and kept; reads answer EntryCorrupt until a good copy is written over it",
            entry_id,
            ledger_id,
            found_by.value,
            problem,
        )
        return Verdict.CORRUPT, True

    def _settle(
        self,
        ledger_id: LedgerId,
        entry_id: int,
        location: Location | JournalLocation,
        corrupt: bool,
        problem: str,
    ) -> Verdict:
        """The scrubber's copy at `location` failed its check (`corrupt`) or could not be
        read: what it is, the entry looked up again (scrubber.Settle)."""
        if corrupt:
            verdict, new = self._mark_corrupt(
                ledger_id, entry_id, location, FoundBy.SCRUBBER, problem
            )
            if new:
                self._scrub_found.append((ledger_id, entry_id))
            return verdict
        with self._lock:
            if self._cached(ledger_id, entry_id):
                return Verdict.HEALTHY
        if self._index.location(ledger_id, entry_id) != location:
            return Verdict.HEALTHY
        return Verdict.UNREADABLE

    def _compaction_found_corrupt(
        self,
        ledger_id: LedgerId,
        entry_id: int,
        location: Location | JournalLocation,
        problem: str,
    ) -> None:
        _, new = self._mark_corrupt(ledger_id, entry_id, location, FoundBy.COMPACTION, problem)
        if new:
            self._report([(ledger_id, entry_id)])

    def _verified(
        self, ledger_id: LedgerId, entry_id: int, location: Location | JournalLocation
    ) -> None:
        """The copy at `location` passed the scrubber's check: a mark on it goes."""
        if not self._marks:
            return
        key = (ledger_id, entry_id)
        with self._lock:
            mark = self._marks.get(key)
            if mark is None or mark.location != location:
                return
            batch = self._index.batch()
            batch.delete_corrupt(ledger_id, entry_id)
            self._index.write(batch)
            del self._marks[key]
        log.warning(
            "entry %d of ledger %s, marked corrupt by the %s at %s, checks out now (%s): its "
            "mark is removed",
            entry_id,
            ledger_id,
            mark.found_by.value,
            _timestamp(mark.found_at),
            _describe(location),
        )

    def _drop_stale_marks(self) -> None:
        """Remove the marks of copies the index no longer points to (a compaction moved a
        copy that had been found bad and checked out when copied, say): at the end of each
        scrub pass."""
        with self._lock:
            stale = [
                key
                for key, mark in self._marks.items()
                if self._index.location(*key) != mark.location
            ]
            if not stale:
                return
            batch = self._index.batch()
            for ledger_id, entry_id in stale:
                batch.delete_corrupt(ledger_id, entry_id)
            self._index.write(batch)
            for key in stale:
                del self._marks[key]

    def _report(self, found: list[tuple[LedgerId, int]]) -> None:
        """Tell `on_corrupt` of newly marked entries, a ledger at a time."""
        if not found or self._on_corrupt is None:
            return
        by_ledger: dict[LedgerId, list[int]] = defaultdict(list)
        for ledger_id, entry_id in found:
            by_ledger[ledger_id].append(entry_id)
        for ledger_id, entry_ids in sorted(by_ledger.items()):
            self._on_corrupt(ledger_id, sorted(entry_ids))

    # -- maintenance (one worker thread) --------------------------------------------

    def checkpoint(self, journal_mark: bytes) -> None:
        """Make everything added so far durable in storage, with `journal_mark` beside it.

        Take the mark after every add it covers has been passed to `add_entry` (add to
        storage before or while journaling, as BookKeeper does). On an error (WriteFailed)
        nothing is lost: the entries stay in the write cache for the next attempt, and the
        previous mark stays the durable one.
        """
        with self._maintenance:
            started = time.monotonic()
            with self._lock:
                flushing, self._flushing = self._cache, self._cache
                self._cache = WriteCache()
                dirty, self._dirty = self._dirty, set()
                copies, self._copies = self._copies, {}
                limbo = frozenset(self._limbo) if self._limbo_changed else None
                self._limbo_changed = False
            try:
                batch = self._index.batch()
                totals = self._append_entries(flushing, batch)
                self._failpoint("checkpoint.after_flush")
                with self._lock:
                    for ledger_id in sorted(dirty | totals.keys()):
                        state = self._states[ledger_id]
                        if ledger_id in totals:
                            state = _with_totals(state.copy(), totals[ledger_id])
                        batch.put_ledger_data(ledger_id, state)
                    for ledger_id, copy in copies.items():
                        batch.put_metadata_copy(ledger_id, copy)
                    batch.put_journal_mark(journal_mark)
                    if limbo is not None:
                        batch.put_limbo_ledgers(limbo)
                    # A copy written over a corrupt one ends its mark, in the same batch.
                    replaced = [key for key in self._marks if flushing.get(*key) is not None]
                    for ledger_id, entry_id in replaced:
                        batch.delete_corrupt(ledger_id, entry_id)
                    self._index.write(batch)
                    for ledger_id, ledger_totals in totals.items():
                        _with_totals(self._states[ledger_id], ledger_totals)
                    for key in replaced:
                        del self._marks[key]
                    self._flushing = None
            except BaseException:
                with self._lock:
                    if self._flushing is not None:
                        flushing.absorb(self._cache)
                        self._cache, self._flushing = flushing, None
                    self._dirty |= dirty
                    self._copies = {**copies, **self._copies}
                    self._limbo_changed |= limbo is not None
                raise
            self._failpoint("checkpoint.before_mark")
            self._index.sync()
            elapsed = time.monotonic() - started
            with self._lock:
                self._counters.checkpoints += 1
                self._counters.entries_checkpointed += flushing.entry_count
                self._counters.entries_kept_in_journal += len(flushing.kept)
                self._counters.last_checkpoint_seconds = elapsed
                self._counters.checkpoint_seconds_total += elapsed

    def _failpoint(self, name: str) -> None:
        """A failpoint between two of the checkpoint's writes: its error stands for the
        next write's, a WriteFailed."""
        try:
            failpoint(name)
        except OSError as error:
            raise WriteFailed(f"checkpoint of {self.directory}: {error}") from error

    def _append_entries(self, cache: WriteCache, batch: IndexBatch) -> dict[LedgerId, _Totals]:
        """Append the cache to the entry log, sorted, and fdatasync it; put the locations.

        Returns each ledger's totals for its state. Only maintenance (one at a time) changes
        a state's totals, so they are read here without the lock.
        """
        totals = {}
        kept = cache.kept
        kept_files = {location.file_id for location in kept.values()}
        usage: dict[UsageKey, int] = defaultdict(int)
        for ledger_id in cache.ledgers():
            state = self._states[ledger_id]
            bound, count, size = state.last_entry, state.entry_count, state.byte_count
            entries = cache.entries(ledger_id)
            entry_ids = sorted(entries)
            # The bytes of a run of entries in one file are summed before they are counted:
            # a count per entry, keyed by an enum and the ledger, is a large part of the cost.
            run_kind, run_file, run_bytes = None, 0, 0
            for entry_id in entry_ids:
                crc, data = entries[entry_id]
                location = (kept.get((ledger_id, entry_id)) if kept else None) or self._log.append(
                    ledger_id, entry_id, crc, data
                )
                batch.put_location(ledger_id, entry_id, location)
                kind, file_id, counted = usage_of(location)
                if kind is not run_kind or file_id != run_file:
                    if run_kind is not None:
                        usage[run_kind, run_file, ledger_id] += run_bytes
                    run_kind, run_file, run_bytes = kind, file_id, 0
                run_bytes += counted
                count, size, replaced = self._counted(
                    ledger_id, entry_id, len(data), bound, count, size
                )
                if replaced is not None:
                    kind, file_id, counted = usage_of(replaced)
                    usage[kind, file_id, ledger_id] -= counted
            if run_kind is not None:
                usage[run_kind, run_file, ledger_id] += run_bytes
            totals[ledger_id] = _Totals(max(bound, entry_ids[-1]), count, size)
        self._log.flush()
        self._index.add_usage(batch, usage)
        if not kept_files <= self._kept_files:
            with self._lock:
                self._kept_files |= kept_files
            batch.put_kept_journal_files(self._kept_files)
        return totals

    def _counted(
        self, ledger_id: LedgerId, entry_id: int, size: int, bound: int, count: int, total: int
    ) -> tuple[int, int, Location | JournalLocation | None]:
        """(count, bytes) after storing `size` bytes as the entry: new, or replacing one;
        and the location of the one it replaces.

        Entries above `bound` (the highest ever indexed) are new without a lookup. A location
        the index cannot read is counted as replaced with its size unknown, so that the
        re-add that repairs it still goes through.
        """
        if entry_id > bound:
            return count + 1, total + size, None
        try:
            previous = self._index.location(ledger_id, entry_id)
        except EntryUnreadable:
            return count, total + size, None
        if previous is None:
            return count + 1, total + size, None
        return count, total + size - _entry_size(previous), previous

    def delete_ledger(self, ledger_id: LedgerId, tombstone: DeletedLedger | None = None) -> None:
        """Forget the ledger: entries (index and caches) and state. Call from a worker thread.
        `tombstone`: it is deleted because its tombstone says so, which the index remembers
        (`deleted_ledgers`), so that a metadata recovery never brings it back.

        Its bytes stay in the entry logs (and kept journal files) until `collect_garbage`
        deletes or compacts them. Durable on return. A journal replay from an older mark may
        bring back adds made before the delete; garbage collection deletes such a ledger
        again.
        """
        with self._maintenance:
            with self._lock:
                if self._find(ledger_id) is None:
                    raise NoSuchLedger(f"ledger {ledger_id} is unknown to this bookie")
                batch = self._index.batch()
                batch.delete_ledger(ledger_id)
                if tombstone is not None:
                    batch.put_deleted(ledger_id, tombstone)
                if ledger_id in self._limbo:
                    self._limbo.discard(ledger_id)
                    batch.put_limbo_ledgers(self._limbo)
                self._index.write(batch)
                for key in [key for key in self._marks if key[0] == ledger_id]:
                    del self._marks[key]
                self._cache.drop_ledger(ledger_id)
                self._states.pop(ledger_id, None)
                self._dirty.discard(ledger_id)
                self._copies.pop(ledger_id, None)
            self._index.sync()

    def deleted_ledgers(self) -> dict[LedgerId, DeletedLedger]:
        """The ledgers deleted here under a tombstone, still remembered."""
        return self._index.deleted_ledgers()

    def forget_deleted(self, obeyed_before: float) -> int:
        """Let go of the deleted ledgers obeyed before `obeyed_before` (seconds since the
        epoch: the tombstone retention is over); how many. Call from a worker thread."""
        old = [
            ledger_id
            for ledger_id, deleted in self._index.deleted_ledgers().items()
            if deleted.obeyed < obeyed_before
        ]
        if old:
            batch = self._index.batch()
            for ledger_id in old:
                batch.forget_deleted(ledger_id)
            self._index.write(batch)
        return len(old)

    def forget_entries(self, ledger_id: LedgerId, entry_ids: Iterable[int]) -> int:
        """Operator and test tool: make the bookie lose these entries (index and caches).

        It simulates lost entries for the auto-recovery tests and lets an operator drop
        entries known to be bad so that re-replication restores them. The ledger's state
        stays. Returns how many of the entries were held. Call from a worker thread.
        """
        wanted = sorted({_check_entry_id(entry_id, ledger_id) for entry_id in entry_ids})
        with self._maintenance:
            with self._lock:
                state = self._find(ledger_id)
                if state is None:
                    raise NoSuchLedger(f"ledger {ledger_id} is unknown to this bookie")
                cached = set(self._cache.entries(ledger_id)).intersection(wanted)
                self._cache.drop_entries(ledger_id, cached)
                batch = self._index.batch()
                count, size = state.entry_count, state.byte_count
                forgotten = set(cached)
                usage: dict[UsageKey, int] = defaultdict(int)
                for entry_id in wanted:
                    location = self._index.location(ledger_id, entry_id)
                    if (ledger_id, entry_id) in self._marks:
                        batch.delete_corrupt(ledger_id, entry_id)
                    if location is not None:
                        batch.delete_entry(ledger_id, entry_id)
                        count, size = count - 1, size - _entry_size(location)
                        forgotten.add(entry_id)
                        kind, file_id, counted = usage_of(location)
                        usage[kind, file_id, ledger_id] -= counted
                updated = state.copy()
                updated.entry_count, updated.byte_count = count, size
                batch.put_ledger_data(ledger_id, updated)
                self._index.add_usage(batch, usage)
                self._index.write(batch)
                for entry_id in wanted:
                    self._marks.pop((ledger_id, entry_id), None)
                state.entry_count, state.byte_count = count, size
            self._index.sync()
            return len(forgotten)

    def collect_garbage(
        self, now: float, *, force_major: bool = False, force_minor: bool = False
    ) -> GcReport:
        """Delete the entry logs (and release the kept journal files) that hold no entry of
        a ledger still in the index, and compact the sparse ones when a compaction is due
        (or forced): see compactor.py. `now` is wall-clock seconds.

        Call from a worker thread (not the one that checkpoints); a second call waits for
        the first. Reads, adds and checkpoints go on meanwhile. WriteFailed if an entry log
        or the index cannot be written: nothing is lost, the run stops there.
        """
        return self._compactor.run(now, force_major=force_major, force_minor=force_minor)

    def _drop_kept_files(self, file_ids: frozenset[int]) -> None:
        """Take journal files out of the kept set (garbage collection, holding
        `_maintenance`): the index first, then the memory that the journal's release reads."""
        with self._lock:
            remaining = self._kept_files - file_ids
        batch = self._index.batch()
        batch.put_kept_journal_files(remaining)
        self._index.write(batch)
        with self._lock:
            self._kept_files -= file_ids

    def close(self) -> None:
        """Close the files. No checkpoint: the bookie checkpoints first, with its mark. A
        garbage collection or a scrub step still running stops at its next step."""
        self._compactor.stop()
        self._scrubber.stop()
        with self._maintenance:
            try:
                self._log.close()
                if self._journal is not None:
                    self._journal.close()
            finally:
                self._index.close()

    # -- states ---------------------------------------------------------------------

    def _find(self, ledger_id: LedgerId) -> LedgerData | None:
        """The ledger's state, loaded from the index on first use (call under `_lock`).

        Loading under the lock keeps a delete from racing a load back into memory.
        """
        state = self._states.get(ledger_id)
        if state is None:
            _check_ledger_id(ledger_id)
            state = self._index.ledger_data(ledger_id)
            if state is not None:
                self._states[ledger_id] = state
        return state

    def _touch(self, ledger_id: LedgerId) -> LedgerData:
        """The ledger's state, created if the ledger is new (call under `_lock`)."""
        state = self._find(ledger_id)
        if state is None:
            state = self._states[ledger_id] = LedgerData()
            self._dirty.add(ledger_id)
        return state

    def _snapshot(self, ledger_id: LedgerId) -> LedgerData:
        with self._lock:
            state = self._find(ledger_id)
            if state is None:
                raise NoSuchLedger(f"ledger {ledger_id} is unknown to this bookie")
            return state.copy()

    def _known(self, ledger_id: LedgerId) -> bool:
        with self._lock:
            return self._find(ledger_id) is not None


class _Totals(NamedTuple):
    """What a checkpoint changes in a ledger's state besides what the adds changed."""

    last_entry: int
    entry_count: int
    byte_count: int


def _with_totals(state: LedgerData, totals: _Totals) -> LedgerData:
    state.last_entry, state.entry_count, state.byte_count = totals
    return state


def _merged(*sorted_ids: Int64Array) -> Int64Array:
    """The union of entry id arrays, ascending (the index's is sorted, the caches' not)."""
    present = [ids for ids in sorted_ids if ids.size]
    if len(present) == 1 and present[0] is sorted_ids[0]:
        return present[0]
    return np.unique(np.concatenate(present)) if present else np.empty(0, dtype=np.int64)


def _check_ledger_id(ledger_id: LedgerId) -> None:
    if not isinstance(ledger_id, LedgerId):
        raise BadRequest(f"a ledger id must be a LedgerId, not {type(ledger_id).__name__}")


_INTEGERS = (int, np.integer)


def _checked(
    ledger_id: LedgerId, entry_id: int, crc32c: int, data: EntryBytes, last_add_confirmed: int
) -> Stored:
    """An entry's (CRC32C, bytes) as the write cache keeps them, once its ids, its size and
    the client's CRC32C of it check out (see `LedgerStorage.add_entry`)."""
    if not (
        type(entry_id) is int
        and 0 <= entry_id <= MAX_ENTRY_ID
        and -1 <= last_add_confirmed <= MAX_ENTRY_ID
    ):  # the checks below, called only to say what is wrong: every add passes here
        _check_entry_id(entry_id, ledger_id)
        _check_lac(last_add_confirmed, ledger_id)
    if not data:
        raise BadRequest(f"entry {entry_id} of ledger {ledger_id} is empty")
    stored = data if type(data) is bytes or len(data) >= KEEP_IN_PLACE else bytes(data)
    actual = compute_crc32c(stored)
    if actual != crc32c:
        raise BadDigest(
            f"entry {entry_id} of ledger {ledger_id}: CRC32C of the {len(stored)} bytes is "
            f"0x{actual:08x}, the client sent 0x{crc32c & 0xFFFFFFFF:08x}"
        )
    return crc32c, stored


def _check_entry_id(entry_id: int, ledger_id: LedgerId) -> int:
    if isinstance(entry_id, bool) or not isinstance(entry_id, _INTEGERS):
        raise BadRequest(f"ledger {ledger_id}: an entry id is an int, not {entry_id!r}")
    if not 0 <= entry_id <= MAX_ENTRY_ID:
        raise BadRequest(f"ledger {ledger_id}: entry id {entry_id} is outside 0..{MAX_ENTRY_ID}")
    return int(entry_id)


def _check_lac(last_add_confirmed: int, ledger_id: LedgerId) -> None:
    if not -1 <= last_add_confirmed <= MAX_ENTRY_ID:
        raise BadRequest(
            f"ledger {ledger_id}: LAC {last_add_confirmed} is outside -1..{MAX_ENTRY_ID}"
        )


def _entry_size(location: Location | JournalLocation) -> int:
    """The entry's own bytes at `location` (an entry log's size counts its record header)."""
    if isinstance(location, JournalLocation):
        return location.size
    return location.size - RECORD_HEADER_SIZE


def _describe(location: Location | JournalLocation) -> str:
    if isinstance(location, JournalLocation):
        return f"journal file {location.file_id:016x} at offset {location.offset}"
    return f"entry log {location.log_id:08x} at offset {location.offset}"


def _timestamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
