"""The entry index and per-ledger state, in RocksDB (rocksdict), as docs/index-engine.md chose.

Column families, all in raw mode, keys big-endian so that byte order is numeric order:

    default   (scope u64, ledger u64, entry id u64)  ->  (log id u32, offset u64, size u32)
                                                         in an entry log, or (journal file id
                                                         u64, offset u64, size u32, CRC32C
                                                         u32) in the journal (24 bytes)
    ledgers   (scope u64, ledger u64)                ->  LedgerData, 74 bytes
    usage     (file kind u8, file id u64,            ->  bytes u64 of the ledger's entries in
               scope u64, ledger u64)                    that entry log (kind 1) or journal
                                                         file (2) that the index points to
                                                         (an over-estimate; compactor.py)
    corrupt   (scope u64, ledger u64, entry id u64)  ->  when its copy was found corrupt (f64
                                                         seconds), by whom (u8: 1 scrubber,
                                                         2 read, 3 compaction), and the
                                                         location found corrupt, as `default`
                                                         packs it (CorruptMark)
    copies    (scope u64, ledger u64)                ->  the copy of the ledger's metadata
                                                         the bookie was given (LedgerMetadata
                                                         bytes; core/metadata_copies.py)
    deleted   (scope u64, ledger u64)                ->  a tombstone this bookie obeyed: when
                                                         the ledger was deleted (u64 ms) and
                                                         when the bookie did so (f64 seconds),
                                                         kept for `tombstone_retention`, so a
                                                         metadata recovery never revives it
    meta      b"journal_mark"                        ->  the journal mark of the last checkpoint
              b"kept_journal_files"                  ->  ids (u64 each) of the journal files
                                                         that hold indexed entries
              b"limbo_ledgers"                       ->  (scope u64, ledger u64) of each
                                                         ledger in limbo (ledger_storage.py)
              b"unaccounted_files"                   ->  (kind u64, file id u64) of each file
                                                         written before `usage` was kept
              b"compaction_times"                    ->  when the last minor and major
                                                         compactions finished, f64 seconds
              b"scrub_passes"                        ->  the last complete scrub passes
                                                         (ScrubPass each, oldest first)
              b"scrub_progress"                      ->  the pass under way, the file it
                                                         reached and where, the last files
                                                         it reads (scrubber.py)

Everything a checkpoint changes goes into one WriteBatch, so the locations, the ledger
states and the journal mark become visible, and survive a crash, together. Batches are
written unsynced with the write-ahead log on; `sync` (flush_wal with fsync) makes all of
them durable at once: a few ms, with the GIL released. Never a sync=True write, which
would fsync holding the GIL.

Errors: a failed or corrupt read is `EntryUnreadable` (an index that cannot be read must
never be taken for an index without the entry), a failed write is `WriteFailed`.
"""

from __future__ import annotations

import enum
import math
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Self, cast

import numpy as np
import numpy.typing as npt
import rocksdict

from tally.bookie.entry_log import Location
from tally.bookie.journal_entries import JournalLocation
from tally.core.compaction import CompactionTimes, FileKind
from tally.core.digest import MASTER_KEY_SIZE
from tally.core.errors import (
    BadRequest,
    EntryUnreadable,
    IllegalOperation,
    TallyError,
    WriteFailed,
)
from tally.core.ids import LedgerId
from tally.core.scrub import ScrubPass, ScrubTrigger
from tally.failpoints import failpoint

Int64Array = npt.NDArray[np.int64]
LOCATION_DTYPE = np.dtype([("log_id", ">u4"), ("offset", ">u8"), ("size", ">u4")])
"""An entry log location as the index stores it (`_LOCATION`), for arrays of them."""
LocationArray = npt.NDArray[np.void]

_ENTRY_KEY = struct.Struct(">QQQ")
_LEDGER_KEY = struct.Struct(">QQ")
_LOCATION = struct.Struct(">IQI")
_JOURNAL_LOCATION = struct.Struct(">QQII")
_FILE_ID = struct.Struct(">Q")
_USAGE_KEY = struct.Struct(">BQQQ")
_USAGE_FILE = struct.Struct(">BQ")
_USAGE = struct.Struct(">Q")
_UNACCOUNTED = struct.Struct(">QQ")
_TIMES = struct.Struct(">dd")
_MARK = struct.Struct(">dB")
_SCRUB_PASS = struct.Struct(">ddBQQQQ")
_SCRUB_CURSOR = struct.Struct(">BQqQQ")
"""Kind and id of the file reached (0: none yet), where in it, and the last entry log and
journal file, each plus one (0: none)."""
_TRIGGERS = {ScrubTrigger.SCHEDULE: 1, ScrubTrigger.OPERATOR: 2}
_TRIGGERS_BY_CODE = {code: trigger for trigger, code in _TRIGGERS.items()}
_FILE_KINDS = {FileKind.ENTRY_LOG: 1, FileKind.JOURNAL: 2}
_KINDS_BY_CODE = {code: kind for kind, code in _FILE_KINDS.items()}
_STATE = struct.Struct(">BB32sqqqQQ")
_STATE_VERSION = 1
_FENCED = 0x01
_HAS_MASTER_KEY = 0x02
_LEDGERS = "ledgers"
_META = "meta"
_USAGE_FAMILY = "usage"
_CORRUPT = "corrupt"
_COPIES = "copies"
_DELETED = "deleted"
_FAMILIES = (_LEDGERS, _META, _USAGE_FAMILY, _CORRUPT, _COPIES, _DELETED)
_DELETED_RECORD = struct.Struct(">Qd")
_JOURNAL_MARK = b"journal_mark"
_KEPT_JOURNAL_FILES = b"kept_journal_files"
_LIMBO_LEDGERS = b"limbo_ledgers"
_UNACCOUNTED_FILES = b"unaccounted_files"
_COMPACTION_TIMES = b"compaction_times"
_SCRUB_PASSES = b"scrub_passes"
_SCRUB_PROGRESS = b"scrub_progress"
_PAST_EVERY_KEY = b"\xff" * (_ENTRY_KEY.size + 1)
_SCAN_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class DeletedLedger:
    """A ledger this bookie deleted because its tombstone said so."""

    deleted_ms: int
    """When the ledger was deleted (the tombstone's time), ms since the epoch."""
    obeyed: float
    """When this bookie deleted it, seconds since the epoch: its record is kept from then
    for `tombstone_retention`."""


@dataclass(slots=True)
class LedgerData:
    """What a bookie keeps of a ledger besides its entries (BookKeeper's name for the row
    of DbLedgerStorage's ledger index); not to be confused with a ledger's LedgerState.

    Mutable on purpose: ledger storage updates it on every add (the piggy-backed LAC), under
    its lock. `last_entry` is the highest entry id ever indexed (-1: none), an upper bound
    after entries were forgotten: a checkpoint counts an entry above it as new without an
    index lookup. `entry_count` and `byte_count` (entry bytes) describe the index exactly.
    """

    master_key: bytes | None = None
    fenced: bool = False
    explicit_lac: int = -1
    piggyback_lac: int = -1
    last_entry: int = -1
    entry_count: int = 0
    byte_count: int = 0

    @property
    def last_add_confirmed(self) -> int:
        """The highest LAC seen, piggy-backed on an add or set explicitly (-1: none)."""
        return max(self.explicit_lac, self.piggyback_lac)

    def copy(self) -> LedgerData:
        return replace(self)

    def to_bytes(self) -> bytes:
        flags = (_FENCED if self.fenced else 0) | (_HAS_MASTER_KEY if self.master_key else 0)
        return _STATE.pack(
            _STATE_VERSION,
            flags,
            self.master_key or bytes(MASTER_KEY_SIZE),
            self.explicit_lac,
            self.piggyback_lac,
            self.last_entry,
            self.entry_count,
            self.byte_count,
        )

    @classmethod
    def from_bytes(cls, raw: bytes, ledger_id: LedgerId) -> Self:
        """Decode a stored state; anything else is EntryUnreadable (the index is damaged)."""
        where = f"index: state of ledger {ledger_id}"
        if len(raw) != _STATE.size:
            raise EntryUnreadable(f"{where} has {len(raw)} bytes, not {_STATE.size}")
        version, flags, key, explicit, piggyback, last, count, size = _STATE.unpack(raw)
        if version != _STATE_VERSION:
            raise EntryUnreadable(f"{where} has unknown version {version}")
        if flags & ~(_FENCED | _HAS_MASTER_KEY):
            raise EntryUnreadable(f"{where} has unknown flags 0x{flags:02x}")
        if not flags & _HAS_MASTER_KEY and key.count(0) != MASTER_KEY_SIZE:
            raise EntryUnreadable(f"{where} has master key bytes but no master key flag")
        if min(explicit, piggyback, last) < -1:
            raise EntryUnreadable(
                f"{where} has impossible ids: explicit LAC {explicit}, "
                f"piggy-backed LAC {piggyback}, last entry {last}"
            )
        return cls(
            key if flags & _HAS_MASTER_KEY else None,
            bool(flags & _FENCED),
            explicit,
            piggyback,
            last,
            count,
            size,
        )


class FoundBy(enum.Enum):
    """Who found an entry's stored copy corrupt."""

    SCRUBBER = "scrubber"
    READ = "read"
    """A read of the entry on the bookie."""
    COMPACTION = "compaction"


_FOUND_BY = {FoundBy.SCRUBBER: 1, FoundBy.READ: 2, FoundBy.COMPACTION: 3}
_FOUND_BY_CODE = {code: found_by for found_by, code in _FOUND_BY.items()}


@dataclass(frozen=True, slots=True)
class CorruptMark:
    """The copy of an entry at `location` failed its check. In force while the index points
    at that location: a copy written over it since (a re-add, a repair) ends it."""

    location: Location | JournalLocation
    found_at: float
    """Wall-clock seconds."""
    found_by: FoundBy

    def to_bytes(self) -> bytes:
        return _MARK.pack(self.found_at, _FOUND_BY[self.found_by]) + _packed_location(self.location)

    @classmethod
    def from_bytes(cls, raw: bytes, ledger_id: LedgerId, entry_id: int) -> Self:
        if len(raw) < _MARK.size or raw[8] not in _FOUND_BY_CODE:
            raise EntryUnreadable(
                f"index: the corrupt mark of entry {entry_id} of ledger {ledger_id} does not "
                "decode: the index is damaged"
            )
        found_at, found_by = _MARK.unpack_from(raw)
        location = _location(raw[_MARK.size :], ledger_id, entry_id)
        return cls(location, found_at, _FOUND_BY_CODE[found_by])


@dataclass(frozen=True, slots=True)
class ScrubProgress:
    """The scrub pass under way, the file it reached (None: none yet) and where in it (-1:
    read through); and the last entry log and journal file it reads (-1: none), those of
    when it started: files written since wait for the next pass."""

    current: ScrubPass
    file: FileKey | None
    offset: int
    last_log: int
    last_journal_file: int

    def at(self, current: ScrubPass, file: FileKey | None, offset: int) -> ScrubProgress:
        return replace(self, current=current, file=file, offset=offset)


def _ledger_key(ledger_id: LedgerId) -> bytes:
    return _LEDGER_KEY.pack(ledger_id.scope, ledger_id.id)


def _entry_range(ledger_id: LedgerId) -> tuple[bytes, bytes]:
    """[lo, hi) of the ledger's entry keys."""
    following = (ledger_id.scope << 64 | ledger_id.id) + 1
    hi = (
        _ENTRY_KEY.pack(following >> 64, following & (2**64 - 1), 0)
        if following < 2**128
        else _PAST_EVERY_KEY
    )
    return _ENTRY_KEY.pack(ledger_id.scope, ledger_id.id, 0), hi


FileKey = tuple[FileKind, int]
"""A file that garbage collection looks after: its kind and id."""

UsageKey = tuple[FileKind, int, LedgerId]
"""A ledger's bytes in one file."""


def _usage_key(kind: FileKind, file_id: int, ledger_id: LedgerId) -> bytes:
    return _USAGE_KEY.pack(_FILE_KINDS[kind], file_id, ledger_id.scope, ledger_id.id)


def _file_range(kind: FileKind, file_id: int) -> tuple[bytes, bytes]:
    """[lo, hi) of the file's usage keys."""
    lo = _USAGE_FILE.pack(_FILE_KINDS[kind], file_id)
    return lo, lo + b"\xff" * (_USAGE_KEY.size - _USAGE_FILE.size) + b"\xff"


def _bounded(upper: bytes) -> rocksdict.ReadOptions:
    options = rocksdict.ReadOptions()
    options.set_iterate_upper_bound(upper)
    return options


def _unpacked(raw: bytes, layout: struct.Struct, what: str) -> list[tuple[int, ...]]:
    if len(raw) % layout.size:
        raise EntryUnreadable(
            f"index: the {what} take {len(raw)} bytes, not a multiple of {layout.size}: "
            "the index is damaged"
        )
    return list(layout.iter_unpack(raw))


def _packed_location(location: Location | JournalLocation) -> bytes:
    if isinstance(location, JournalLocation):
        return _JOURNAL_LOCATION.pack(*location)
    return _LOCATION.pack(*location)


def _packed_pass(scrub: ScrubPass) -> bytes:
    ended = math.nan if scrub.ended is None else scrub.ended
    return _SCRUB_PASS.pack(
        scrub.started,
        ended,
        _TRIGGERS[scrub.trigger],
        scrub.bytes,
        scrub.entries,
        scrub.corrupt,
        scrub.unreadable,
    )


def _unpacked_pass(fields: tuple[int | float, ...]) -> ScrubPass:
    started, ended, trigger, size, entries, corrupt, unreadable = fields
    if trigger not in _TRIGGERS_BY_CODE:
        raise EntryUnreadable(f"index: a scrub pass has unknown trigger {trigger}")
    return ScrubPass(
        float(started),
        _TRIGGERS_BY_CODE[int(trigger)],
        None if math.isnan(ended) else float(ended),
        int(size),
        int(entries),
        int(corrupt),
        int(unreadable),
    )


def _location(raw: bytes, ledger_id: LedgerId, entry_id: int) -> Location | JournalLocation:
    if len(raw) == _LOCATION.size:
        return Location._make(_LOCATION.unpack(raw))
    if len(raw) == _JOURNAL_LOCATION.size:
        return JournalLocation._make(_JOURNAL_LOCATION.unpack(raw))
    raise EntryUnreadable(
        f"index: location of entry {entry_id} of ledger {ledger_id} has {len(raw)} bytes, "
        f"not {_LOCATION.size} or {_JOURNAL_LOCATION.size}: the index is damaged"
    )


class IndexBatch:
    """Index changes that become visible and durable together (one RocksDB WriteBatch)."""

    def __init__(self, index: Index) -> None:
        self._batch = rocksdict.WriteBatch(raw_mode=True)
        self._index = index
        """Its column family handles are looked up when used: a batch must not keep them,
        or the DB would stay locked after `close`."""

    def __len__(self) -> int:
        return self._batch.len()

    def put_location(
        self, ledger_id: LedgerId, entry_id: int, location: Location | JournalLocation
    ) -> None:
        key = _ENTRY_KEY.pack(ledger_id.scope, ledger_id.id, entry_id)
        self._batch.put(key, _packed_location(location))

    def delete_entry(self, ledger_id: LedgerId, entry_id: int) -> None:
        self._batch.delete(_ENTRY_KEY.pack(ledger_id.scope, ledger_id.id, entry_id))

    def put_ledger_data(self, ledger_id: LedgerId, state: LedgerData) -> None:
        self._batch.put(_ledger_key(ledger_id), state.to_bytes(), self._index._ledgers_handle)

    def delete_ledger(self, ledger_id: LedgerId) -> None:
        """Every entry of the ledger (one range tombstone), its corrupt marks, its state and
        its metadata copy."""
        self._batch.delete_range(*_entry_range(ledger_id))
        self._batch.delete_range(*_entry_range(ledger_id), self._corrupt)
        self._batch.delete(_ledger_key(ledger_id), self._index._ledgers_handle)
        self._batch.delete(_ledger_key(ledger_id), self._copies)

    def put_metadata_copy(self, ledger_id: LedgerId, copy: bytes) -> None:
        self._batch.put(_ledger_key(ledger_id), copy, self._copies)

    def put_deleted(self, ledger_id: LedgerId, deleted: DeletedLedger) -> None:
        record = _DELETED_RECORD.pack(deleted.deleted_ms, deleted.obeyed)
        self._batch.put(_ledger_key(ledger_id), record, self._deleted)

    def forget_deleted(self, ledger_id: LedgerId) -> None:
        self._batch.delete(_ledger_key(ledger_id), self._deleted)

    @property
    def _deleted(self) -> rocksdict.ColumnFamily:
        handle = self._index._deleted_handle
        assert handle is not None, "a writable index has every family"
        return handle

    @property
    def _copies(self) -> rocksdict.ColumnFamily:
        handle = self._index._copies_handle
        assert handle is not None, "a writable index has every family"
        return handle

    def put_corrupt(self, ledger_id: LedgerId, entry_id: int, mark: CorruptMark) -> None:
        key = _ENTRY_KEY.pack(ledger_id.scope, ledger_id.id, entry_id)
        self._batch.put(key, mark.to_bytes(), self._corrupt)

    def delete_corrupt(self, ledger_id: LedgerId, entry_id: int) -> None:
        self._batch.delete(_ENTRY_KEY.pack(ledger_id.scope, ledger_id.id, entry_id), self._corrupt)

    @property
    def _corrupt(self) -> rocksdict.ColumnFamily:
        handle = self._index._corrupt_handle
        assert handle is not None, "a writable index has every family"
        return handle

    def put_scrub_passes(self, passes: Iterable[ScrubPass]) -> None:
        packed = b"".join(_packed_pass(scrub) for scrub in passes)
        self._batch.put(_SCRUB_PASSES, packed, self._index._meta_handle)

    def put_scrub_progress(self, progress: ScrubProgress | None) -> None:
        """The pass under way; None: no pass is."""
        if progress is None:
            self._batch.delete(_SCRUB_PROGRESS, self._index._meta_handle)
            return
        file = progress.file
        kind, file_id = (_FILE_KINDS[file[0]], file[1]) if file is not None else (0, 0)
        cursor = _SCRUB_CURSOR.pack(
            kind, file_id, progress.offset, progress.last_log + 1, progress.last_journal_file + 1
        )
        self._batch.put(
            _SCRUB_PROGRESS, _packed_pass(progress.current) + cursor, self._index._meta_handle
        )

    def put_journal_mark(self, mark: bytes) -> None:
        self._batch.put(_JOURNAL_MARK, bytes(mark), self._index._meta_handle)

    def put_kept_journal_files(self, file_ids: Iterable[int]) -> None:
        packed = b"".join(_FILE_ID.pack(file_id) for file_id in sorted(file_ids))
        self._batch.put(_KEPT_JOURNAL_FILES, packed, self._index._meta_handle)

    def put_limbo_ledgers(self, ledger_ids: Iterable[LedgerId]) -> None:
        packed = b"".join(_ledger_key(ledger_id) for ledger_id in sorted(ledger_ids))
        self._batch.put(_LIMBO_LEDGERS, packed, self._index._meta_handle)

    def put_usage(self, kind: FileKind, file_id: int, ledger_id: LedgerId, size: int) -> None:
        self._batch.put(_usage_key(kind, file_id, ledger_id), _USAGE.pack(size), self._usage)

    def delete_usage(self, kind: FileKind, file_id: int, ledger_id: LedgerId) -> None:
        self._batch.delete(_usage_key(kind, file_id, ledger_id), self._usage)

    def delete_file_usage(self, kind: FileKind, file_id: int) -> None:
        """Every ledger's usage of the file (one range tombstone)."""
        self._batch.delete_range(*_file_range(kind, file_id), self._usage)

    @property
    def _usage(self) -> rocksdict.ColumnFamily:
        handle = self._index._usage_handle
        assert handle is not None, "a writable index has every family"
        return handle

    def put_unaccounted_files(self, files: Iterable[FileKey]) -> None:
        packed = b"".join(
            _UNACCOUNTED.pack(_FILE_KINDS[kind], file_id)
            for kind, file_id in sorted(files, key=lambda file: (_FILE_KINDS[file[0]], file[1]))
        )
        self._batch.put(_UNACCOUNTED_FILES, packed, self._index._meta_handle)

    def put_compaction_times(self, times: CompactionTimes) -> None:
        packed = _TIMES.pack(times.last_minor, times.last_major)
        self._batch.put(_COMPACTION_TIMES, packed, self._index._meta_handle)


class Index:
    """The bookie's index; `open_read_only` gives admin tools a view of a live one.

    Thread-safe as RocksDB is: reads from any thread beside one writer. A read-only
    instance sees the index as it was when opened.
    """

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        self.read_only = read_only
        self._closed = False
        options = rocksdict.Options(raw_mode=True)
        try:
            if read_only:
                if not (path / "CURRENT").is_file():
                    raise BadRequest(f"there is no index at {path}")
                access = rocksdict.AccessType.read_only(False)
                # An index written before a family existed is read without it (as empty).
                names = set(rocksdict.Rdict.list_cf(str(path), options)).intersection(_FAMILIES)
            else:
                path.mkdir(parents=True, exist_ok=True)
                options.create_if_missing(True)
                options.create_missing_column_families(True)
                access = rocksdict.AccessType.read_write()
                names = set(_FAMILIES)
            families = {name: rocksdict.Options(raw_mode=True) for name in sorted(names)}
            self._db = rocksdict.Rdict(str(path), options, families, access)
            self._ledgers_db = self._db.get_column_family(_LEDGERS)
            self._meta_db = self._db.get_column_family(_META)
            self._usage_db = (
                self._db.get_column_family(_USAGE_FAMILY) if _USAGE_FAMILY in names else None
            )
            self._ledgers_handle = self._db.get_column_family_handle(_LEDGERS)
            self._meta_handle = self._db.get_column_family_handle(_META)
            self._usage_handle = (
                self._db.get_column_family_handle(_USAGE_FAMILY) if _USAGE_FAMILY in names else None
            )
            self._corrupt_db = self._db.get_column_family(_CORRUPT) if _CORRUPT in names else None
            self._corrupt_handle = (
                self._db.get_column_family_handle(_CORRUPT) if _CORRUPT in names else None
            )
            self._copies_db = self._db.get_column_family(_COPIES) if _COPIES in names else None
            self._copies_handle = (
                self._db.get_column_family_handle(_COPIES) if _COPIES in names else None
            )
            self._deleted_db = self._db.get_column_family(_DELETED) if _DELETED in names else None
            self._deleted_handle = (
                self._db.get_column_family_handle(_DELETED) if _DELETED in names else None
            )
        except TallyError:
            raise
        except Exception as error:
            failure = EntryUnreadable if read_only else WriteFailed
            raise failure(f"cannot open the index at {path}: {error}") from error

    @classmethod
    def open_read_only(cls, path: Path) -> Index:
        """Open without writing or locking: works while the bookie has the index open."""
        return cls(path, read_only=True)

    # -- reads ----------------------------------------------------------------------

    def location(self, ledger_id: LedgerId, entry_id: int) -> Location | JournalLocation | None:
        key = _ENTRY_KEY.pack(ledger_id.scope, ledger_id.id, entry_id)
        try:
            raw = self._db.get(key)
        except Exception as error:
            raise EntryUnreadable(
                f"index: cannot read the location of entry {entry_id} of ledger {ledger_id}: "
                f"{error}"
            ) from error
        return None if raw is None else _location(raw, ledger_id, entry_id)

    def points_at(
        self, ledger_id: LedgerId, entry_id: int, location: Location | JournalLocation
    ) -> bool:
        """Whether the index holds the entry exactly at `location` (the scrubber asks this
        of every record it reads: the stored bytes are compared, not decoded)."""
        return self._stored(ledger_id.scope, ledger_id.id, entry_id) == _packed_location(location)

    def entry_log_run(
        self, scope: int, ledger: int, first: int, count: int
    ) -> LocationArray | None:
        """Where the index places entries `first` to `first + count - 1` of a ledger, if it
        holds every one of them in an entry log (else None): the scrubber's question for a
        run of records of one ledger, asked in one ordered read of the keys (a look-up per
        record costs it more than the record's check)."""
        lo = _ENTRY_KEY.pack(scope, ledger, first)
        hi = _ENTRY_KEY.pack(scope, ledger, first + count)
        try:
            keys = cast(Iterator[bytes], self._db.keys(from_key=lo, read_opt=_bounded(hi)))
            held = len(b"".join(islice(keys, count))) // _ENTRY_KEY.size
            values = cast(Iterator[bytes], self._db.values(from_key=lo, read_opt=_bounded(hi)))
            raw = b"".join(islice(values, count))
        except Exception as error:
            raise EntryUnreadable(
                f"index: cannot read the locations of entries {first} to {first + count - 1} "
                f"of ledger {LedgerId(scope, ledger)}: {error}"
            ) from error
        if held != count or len(raw) != count * _LOCATION.size:
            return None  # an entry missing, or one kept in a journal file
        return np.frombuffer(raw, dtype=LOCATION_DTYPE)

    def _stored(self, scope: int, ledger: int, entry_id: int) -> bytes | None:
        try:
            return cast(bytes | None, self._db.get(_ENTRY_KEY.pack(scope, ledger, entry_id)))
        except Exception as error:
            raise EntryUnreadable(
                f"index: cannot read the location of entry {entry_id} of ledger "
                f"{LedgerId(scope, ledger)}: {error}"
            ) from error

    def last_entry(self, ledger_id: LedgerId) -> int | None:
        """The highest entry id the index holds for the ledger."""
        prefix = _ledger_key(ledger_id)
        try:
            cursor = self._db.iter()
            cursor.seek_for_prev(prefix + b"\xff" * 8)
            key = cursor.key() if cursor.valid() else None
        except Exception as error:
            raise EntryUnreadable(f"index: cannot scan ledger {ledger_id}: {error}") from error
        if key is None or key[: len(prefix)] != prefix:
            return None
        return int(_ENTRY_KEY.unpack(key)[2])

    def entries_of(self, ledger_id: LedgerId) -> Int64Array:
        """The ledger's entry ids, ascending: an ordered prefix scan, for EntryAvailability."""
        lo, hi = _entry_range(ledger_id)
        chunks = []
        try:
            keys = cast(Iterator[bytes], self._db.keys(from_key=lo, read_opt=_bounded(hi)))
            while chunk := b"".join(islice(keys, _SCAN_CHUNK)):
                chunks.append(np.frombuffer(chunk, dtype=">u8")[2::3].astype(np.int64))
        except Exception as error:
            raise EntryUnreadable(f"index: cannot scan ledger {ledger_id}: {error}") from error
        return np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)

    def ledgers(self, after: LedgerId | None = None) -> Iterator[LedgerId]:
        """Every ledger with a state, ascending, starting after `after`."""
        start = None if after is None else _ledger_key(after) + b"\x00"
        try:
            for key in cast(Iterator[bytes], self._ledgers_db.keys(from_key=start)):
                yield LedgerId(*_LEDGER_KEY.unpack(key))
        except TallyError:
            raise
        except Exception as error:
            raise EntryUnreadable(f"index: cannot list ledgers: {error}") from error

    def ledger_data(self, ledger_id: LedgerId) -> LedgerData | None:
        key = _ledger_key(ledger_id)
        try:
            raw = self._ledgers_db.get(key)
        except Exception as error:
            raise EntryUnreadable(
                f"index: cannot read the state of ledger {ledger_id}: {error}"
            ) from error
        return None if raw is None else LedgerData.from_bytes(raw, ledger_id)

    def metadata_copy(self, ledger_id: LedgerId) -> bytes | None:
        """The copy of the ledger's metadata kept here, as given (None: none)."""
        if self._copies_db is None:
            return None
        try:
            return cast(bytes | None, self._copies_db.get(_ledger_key(ledger_id)))
        except Exception as error:
            raise EntryUnreadable(
                f"index: cannot read the metadata copy of ledger {ledger_id}: {error}"
            ) from error

    def deleted_ledgers(self) -> dict[LedgerId, DeletedLedger]:
        """The tombstones this bookie obeyed and still remembers, by ledger id."""
        if self._deleted_db is None:
            return {}
        found = {}
        try:
            for key, value in cast(Iterator[tuple[bytes, bytes]], self._deleted_db.items()):
                scope, ledger = _LEDGER_KEY.unpack(key)
                deleted_ms, obeyed = _DELETED_RECORD.unpack(value)
                found[LedgerId(scope, ledger)] = DeletedLedger(deleted_ms, obeyed)
        except Exception as error:
            raise EntryUnreadable(f"index: cannot read the deleted ledgers: {error}") from error
        return found

    def kept_journal_files(self) -> set[int]:
        """The journal files that hold entries the index points to (see journal_entries)."""
        return {
            file_id
            for (file_id,) in self._packed(_KEPT_JOURNAL_FILES, _FILE_ID, "kept journal files")
        }

    def limbo_ledgers(self) -> set[LedgerId]:
        """The ledgers in limbo: their entries may have been lost (see ledger_storage)."""
        return {
            LedgerId(*key) for key in self._packed(_LIMBO_LEDGERS, _LEDGER_KEY, "limbo ledgers")
        }

    def _packed(self, key: bytes, layout: struct.Struct, what: str) -> list[tuple[int, ...]]:
        """The fixed-size records packed under meta `key` (none if it is absent)."""
        raw = self._meta(key, what)
        return [] if raw is None else _unpacked(raw, layout, what)

    def _meta(self, key: bytes, what: str) -> bytes | None:
        try:
            raw = self._meta_db.get(key)
        except Exception as error:
            raise EntryUnreadable(f"index: cannot read the {what}: {error}") from error
        return None if raw is None else bytes(raw)

    def usage(self, kind: FileKind, file_id: int, ledger_id: LedgerId) -> int | None:
        """The bytes the ledger has in the file, as counted (None: no count)."""
        if self._usage_db is None:
            return None
        try:
            raw = self._usage_db.get(_usage_key(kind, file_id, ledger_id))
        except Exception as error:
            raise EntryUnreadable(
                f"index: cannot read the usage of {kind.value} {file_id}: {error}"
            ) from error
        return None if raw is None else int(_USAGE.unpack(raw)[0])

    def usages(self) -> Iterator[tuple[FileKind, int, LedgerId, int]]:
        """Every (file kind, file id, ledger, bytes) counted, by file."""
        if self._usage_db is None:
            return
        try:
            for key, value in cast(Iterator[tuple[bytes, bytes]], self._usage_db.items()):
                code, file_id, scope, ledger = _USAGE_KEY.unpack(key)
                yield (
                    _KINDS_BY_CODE[code],
                    file_id,
                    LedgerId(scope, ledger),
                    _USAGE.unpack(value)[0],
                )
        except TallyError:
            raise
        except Exception as error:
            raise EntryUnreadable(f"index: cannot list the usage of files: {error}") from error

    def add_usage(self, batch: IndexBatch, deltas: Mapping[UsageKey, int]) -> None:
        """Put each count plus its delta into `batch`, never below 0. A count is made by a
        positive delta only: a file without counts is one that was never counted."""
        for (kind, file_id, ledger_id), delta in deltas.items():
            current = self.usage(kind, file_id, ledger_id)
            if current is None and delta <= 0:
                continue
            batch.put_usage(kind, file_id, ledger_id, max(0, (current or 0) + delta))

    def unaccounted_files(self) -> set[FileKey] | None:
        """The files written before usage was counted; None if it never was (an index of an
        earlier version, or a new one)."""
        what = "unaccounted files"
        raw = self._meta(_UNACCOUNTED_FILES, what)
        if raw is None:
            return None
        return {
            (_KINDS_BY_CODE[code], file_id) for code, file_id in _unpacked(raw, _UNACCOUNTED, what)
        }

    def compaction_times(self) -> CompactionTimes | None:
        what = "compaction times"
        raw = self._meta(_COMPACTION_TIMES, what)
        if raw is None:
            return None
        if len(raw) != _TIMES.size:
            raise EntryUnreadable(f"index: the {what} take {len(raw)} bytes, not {_TIMES.size}")
        return CompactionTimes(*_TIMES.unpack(raw))

    def ledger_locations(
        self, ledger_id: LedgerId
    ) -> Iterator[tuple[int, Location | JournalLocation]]:
        """The ledger's (entry id, location) pairs, ascending."""
        lo, hi = _entry_range(ledger_id)
        try:
            items = cast(
                Iterator[tuple[bytes, bytes]], self._db.items(from_key=lo, read_opt=_bounded(hi))
            )
            for key, value in items:
                entry_id = _ENTRY_KEY.unpack(key)[2]
                yield entry_id, _location(value, ledger_id, entry_id)
        except TallyError:
            raise
        except Exception as error:
            raise EntryUnreadable(f"index: cannot scan ledger {ledger_id}: {error}") from error

    def all_locations(self) -> Iterator[tuple[LedgerId, int, Location | JournalLocation]]:
        """Every (ledger, entry id, location), in key order: a walk of the whole index."""
        try:
            for key, value in cast(Iterator[tuple[bytes, bytes]], self._db.items()):
                scope, ledger, entry_id = _ENTRY_KEY.unpack(key)
                ledger_id = LedgerId(scope, ledger)
                yield ledger_id, entry_id, _location(value, ledger_id, entry_id)
        except TallyError:
            raise
        except Exception as error:
            raise EntryUnreadable(f"index: cannot walk the locations: {error}") from error

    def file_usage(self, kind: FileKind, file_id: int) -> dict[LedgerId, int]:
        """The bytes counted of each ledger in one file (`usage`)."""
        if self._usage_db is None:
            return {}
        lo, hi = _file_range(kind, file_id)
        try:
            items = cast(
                Iterator[tuple[bytes, bytes]],
                self._usage_db.items(from_key=lo, read_opt=_bounded(hi)),
            )
            return {
                LedgerId(*_USAGE_KEY.unpack(key)[2:]): _USAGE.unpack(value)[0]
                for key, value in items
            }
        except Exception as error:
            raise EntryUnreadable(
                f"index: cannot read the usage of {kind.value} {file_id}: {error}"
            ) from error

    def corrupt_marks(self) -> Iterator[tuple[LedgerId, int, CorruptMark]]:
        """Every entry marked corrupt, with its mark, in key order."""
        if self._corrupt_db is None:
            return
        try:
            for key, value in cast(Iterator[tuple[bytes, bytes]], self._corrupt_db.items()):
                scope, ledger, entry_id = _ENTRY_KEY.unpack(key)
                ledger_id = LedgerId(scope, ledger)
                yield ledger_id, entry_id, CorruptMark.from_bytes(value, ledger_id, entry_id)
        except TallyError:
            raise
        except Exception as error:
            raise EntryUnreadable(f"index: cannot list the corrupt marks: {error}") from error

    def scrub_passes(self) -> list[ScrubPass]:
        """The last complete scrub passes, oldest first."""
        return [
            _unpacked_pass(fields)
            for fields in self._packed(_SCRUB_PASSES, _SCRUB_PASS, "scrub passes")
        ]

    def scrub_progress(self) -> ScrubProgress | None:
        what = "scrub progress"
        raw = self._meta(_SCRUB_PROGRESS, what)
        if raw is None:
            return None
        if len(raw) != _SCRUB_PASS.size + _SCRUB_CURSOR.size:
            raise EntryUnreadable(f"index: the {what} takes {len(raw)} bytes: it is damaged")
        current = _unpacked_pass(_SCRUB_PASS.unpack_from(raw))
        kind, file_id, offset, last_log, last_journal = _SCRUB_CURSOR.unpack_from(
            raw, _SCRUB_PASS.size
        )
        if kind and kind not in _KINDS_BY_CODE:
            raise EntryUnreadable(f"index: the {what} names an unknown kind of file {kind}")
        file = (_KINDS_BY_CODE[kind], file_id) if kind else None
        return ScrubProgress(current, file, offset, last_log - 1, last_journal - 1)

    def journal_mark(self) -> bytes | None:
        """The journal mark of the last checkpoint written, if any."""
        return self._meta(_JOURNAL_MARK, "journal mark")

    # -- writes ---------------------------------------------------------------------

    def batch(self) -> IndexBatch:
        self._writable()
        return IndexBatch(self)

    def write(self, batch: IndexBatch) -> None:
        """Apply a batch atomically, unsynced (durable at the next `sync`)."""
        self._writable()
        try:
            failpoint("index.batch")
            self._db.write(batch._batch)
        except Exception as error:
            raise WriteFailed(f"index {self.path}: batch write failed: {error}") from error

    def sync(self) -> None:
        """Make every batch written so far durable (fsync of the write-ahead log)."""
        self._writable()
        try:
            self._db.flush_wal(True)
        except Exception as error:
            raise WriteFailed(f"index {self.path}: syncing the WAL failed: {error}") from error

    def _writable(self) -> None:
        if self._closed:
            raise IllegalOperation(f"index {self.path} is closed")
        if self.read_only:
            raise IllegalOperation(f"index {self.path} is open read-only")

    def close(self) -> None:
        """Close the DB. Its lock goes only when every handle to it is gone, hence the dels."""
        if self._closed:
            return
        self._closed = True
        del self._ledgers_handle, self._meta_handle, self._usage_handle, self._corrupt_handle
        del self._copies_handle, self._deleted_handle
        try:
            self._ledgers_db.close()
            self._meta_db.close()
            for family in (self._usage_db, self._corrupt_db, self._copies_db, self._deleted_db):
                if family is not None:
                    family.close()
            self._db.close()
        except Exception as error:
            raise WriteFailed(f"index {self.path}: close failed: {error}") from error
