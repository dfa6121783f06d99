"""Entry logs: interleaved, append-only files that hold the bytes of every ledger's entries.

Entries of all ledgers go into one log at a time, in the order ledger storage appends them
(sorted by ledger and entry at each checkpoint, for read locality). A log is never written
again once another one is current, nor after a restart: a log whose tail a crash tore is
left as it is, and nothing the index points to lies in the torn part, because the index is
written only after the log was fdatasync'ed.

Files: `<directory>/<log id as 8 hex digits>.log`, ids increasing. File header (20 bytes,
big-endian): magic `TALLYELG`, uint32 format version, uint32 log id, uint32 CRC32C of the
16 bytes before it. Then records, back to back:

    uint32 length of the entry bytes, uint32 CRC32C of the entry bytes,
    uint64 ledger scope, uint64 ledger id, int64 entry id, entry bytes

The CRC32C is the one the client computed and sent with the ADD (end-to-end checksum), so
bit rot is found by reading the log alone, without the ledger's password. A read is given
the location the index holds and the ledger and entry it expects; it checks every header
field against them and the bytes against the CRC. Any disagreement or short read is
`EntryCorrupt` (the record is there, but bad), an I/O error `EntryUnreadable` (its parent),
each naming the file, the offset, the ledger and the entry: the index says the entry exists,
so "no such entry" would be a lie that lets recovery truncate a ledger.

Writes are buffered: `append` only adds to a buffer in memory (no system call per entry),
`flush` writes it and fdatasyncs. The writes skip the page cache (O_DIRECT, direct_io.py,
as BookKeeper's DirectEntryLogger): the entries are read back rarely, and the page cache's
copy, pages and writeback were the bookie's biggest cost per 64 KiB entry. The last block
of a flush is padded with zeros and written again by the next one; the padding after the
last record of a file is not a record (`scan` ends there). Where the file system refuses
O_DIRECT, or with `direct_io=False`, flush writes the entries' own buffers with `pwritev`
and lets the page cache drop the pages it completed (page_cache.py). Reads (`pread`
through the page cache, which the kernel keeps coherent with direct writes) of
checkpointed entries then come from the disk. Reads of records still in the buffer are
served from it. Threads: one writer thread appends and flushes (the checkpoint); `read`
may be called from any thread at the same time. A short lock guards the buffer and the
table of open files; no I/O is done while it is held.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from tally.bookie.direct_io import ALIGNMENT, DirectAppender, enable_direct
from tally.bookie.page_cache import drop_written
from tally.bookie.read_handles import ReadHandles
from tally.core.digest import crc32c
from tally.core.errors import (
    BadRequest,
    EntryCorrupt,
    EntryUnreadable,
    IllegalOperation,
    WriteFailed,
)
from tally.core.ids import LedgerId
from tally.core.protocol import EntryBytes
from tally.failpoints import failpoint

MAGIC = b"TALLYELG"
FORMAT_VERSION = 1
_FILE_HEADER_FIELDS = struct.Struct(">8sII")
_U32 = struct.Struct(">I")
FILE_HEADER_SIZE = _FILE_HEADER_FIELDS.size + _U32.size
RECORD_HEADER = struct.Struct(">IIQQq")
RECORD_HEADER_SIZE = RECORD_HEADER.size

DEFAULT_LOG_SIZE_LIMIT = 1 << 30
"""BookKeeper's logSizeLimit (1 GiB): the log rolls before a record would take it past this."""
MAX_LOG_ID = 2**32 - 1
MAX_ENTRY_SIZE = 2**32 - 1 - RECORD_HEADER_SIZE
"""A location's size is a uint32 and covers the record header too."""
_SCAN_CHUNK = 1 << 20
_IOV_MAX = os.sysconf("SC_IOV_MAX")

_FILE_NAME = re.compile(r"([0-9a-f]{8})\.log")

log = logging.getLogger(__name__)


class Location(NamedTuple):
    """Where a record lies: its log, the offset of its header and its whole size."""

    log_id: int
    offset: int
    size: int


class LogRecord(NamedTuple):
    """A record as `scan` finds it."""

    location: Location
    ledger_id: LedgerId
    entry_id: int
    crc32c: int
    data: bytes


def log_file_name(log_id: int) -> str:
    return f"{log_id:08x}.log"


def _file_header(log_id: int) -> bytes:
    fields = _FILE_HEADER_FIELDS.pack(MAGIC, FORMAT_VERSION, log_id)
    return fields + _U32.pack(crc32c(fields))


def _header_problem(raw: bytes, log_id: int) -> str | None:
    """Why `raw` is not the file header of log `log_id`, if it is not."""
    if len(raw) < FILE_HEADER_SIZE:
        return f"file header cut: {len(raw)} of {FILE_HEADER_SIZE} bytes"
    if raw[:FILE_HEADER_SIZE] != _file_header(log_id):
        magic, version, found_id = _FILE_HEADER_FIELDS.unpack_from(raw)
        return (
            f"bad file header (magic {magic!r}, version {version}, log id {found_id}; "
            f"expected {MAGIC!r}, {FORMAT_VERSION}, {log_id}, and a matching CRC32C)"
        )
    return None


def _is_padding(rest: bytes, offset: int, file_size: int) -> bool:
    """Whether `rest`, the file from `offset` on, is the zeros that pad a direct write's last
    block: nothing but zeros, up to the end of that block, which is the end of the file."""
    padded = file_size % ALIGNMENT == 0 and file_size - offset == len(rest) < ALIGNMENT
    return padded and not any(rest)


class EntryLog:
    """The entry logs of one directory: a current log to append to, older ones to read."""

    def __init__(
        self, directory: Path, *, size_limit: int = DEFAULT_LOG_SIZE_LIMIT, direct_io: bool = True
    ) -> None:
        if size_limit <= FILE_HEADER_SIZE:
            raise BadRequest(f"entry log size limit {size_limit} must exceed {FILE_HEADER_SIZE}")
        self.directory = directory
        self.size_limit = size_limit
        self.direct_io = direct_io
        try:
            directory.mkdir(parents=True, exist_ok=True)
            existing = self._scan_directory()
        except OSError as error:
            raise WriteFailed(f"cannot use entry log directory {directory}: {error}") from error
        self._next_log_id = max(existing, default=-1) + 1
        self._lock = threading.Lock()
        # Writer state (changed by the writer thread, under the lock).
        self._current: int | None = None
        self._writer_fd = -1
        self._appender: DirectAppender | None = None
        self._written = 0
        """Bytes of the current log already in its file (pwrite'd)."""
        self._end = 0
        """Bytes of the current log including the buffered ones: where the next record goes."""
        self._pending: list[bytes] = []
        """The buffered bytes, in file order: referenced, not copied (entries are `bytes`)."""
        self._pending_records: dict[int, tuple[bytes, bytes]] = {}
        """Header and entry bytes of each buffered record, by offset, for reads."""
        self._needs_directory_sync = False
        self._handles = ReadHandles(self._open_for_reading)
        self._closed = False

    # -- writing (one writer thread) --------------------------------------------------

    @property
    def current_log_id(self) -> int | None:
        """The log appends go to; None before the first append and after a failed write."""
        return self._current

    def append(self, ledger_id: LedgerId, entry_id: int, crc: int, data: EntryBytes) -> Location:
        """Buffer a record and say where it will be; durable only after `flush`."""
        if not 0 <= entry_id < 2**63:
            raise BadRequest(f"entry id {entry_id} of ledger {ledger_id} is outside 0..2^63-1")
        if not 0 <= crc < 2**32:
            raise BadRequest(f"CRC32C {crc} of entry {entry_id} of ledger {ledger_id} is not a u32")
        if not data:
            raise BadRequest(
                f"entry {entry_id} of ledger {ledger_id} is empty; an entry holds at least its "
                "header, and an empty record could not be told from padding"
            )
        if len(data) > MAX_ENTRY_SIZE:
            raise BadRequest(
                f"entry {entry_id} of ledger {ledger_id} has {len(data)} bytes; "
                f"an entry log record holds at most {MAX_ENTRY_SIZE}"
            )
        data = bytes(data)
        size = RECORD_HEADER_SIZE + len(data)
        if self._current is None or (
            self._end + size > self.size_limit and self._end > FILE_HEADER_SIZE
        ):
            self._roll()
        header = RECORD_HEADER.pack(len(data), crc, ledger_id.scope, ledger_id.id, entry_id)
        current = self._current
        assert current is not None
        with self._lock:
            offset = self._end
            self._pending += (header, data) if data else (header,)
            self._pending_records[offset] = (header, data)
            self._end = offset + size
        return Location(current, offset, size)

    def flush(self) -> None:
        """Write the buffer and fdatasync the current log: every appended record is durable.

        On failure the buffered records are dropped and the next append starts a new log,
        because after a failed write or fdatasync the file's state is unknown. The caller
        appends those records again (the checkpoint keeps them until it succeeds).
        """
        current = self._current
        if current is None:
            return
        path = self.directory / log_file_name(current)
        try:
            failpoint("entry_log.write")
            if self._appender is not None:
                self._appender.append(self._pending)
            else:
                self._write_all(self._writer_fd, self._pending, self._written)
            os.fdatasync(self._writer_fd)
            if self._needs_directory_sync:
                self._sync_directory()
                self._needs_directory_sync = False
        except OSError as error:
            self._leave_current()
            raise WriteFailed(
                f"entry log {path}: write or fdatasync failed at offset {self._written}: {error}"
            ) from error
        if self._appender is None:
            drop_written(self._writer_fd, self._written, self._end)
        with self._lock:
            self._written = self._end
            self._pending = []
            self._pending_records = {}

    def _roll(self) -> None:
        if self._current is not None:
            self.flush()
            self._leave_current()
        if self._next_log_id > MAX_LOG_ID:
            raise WriteFailed(f"entry log ids are exhausted in {self.directory}")
        log_id = self._next_log_id
        path = self.directory / log_file_name(log_id)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise WriteFailed(f"cannot create entry log {path}: {error}") from error
        self._next_log_id += 1
        appender = self._direct_appender(fd, path)
        with self._lock:
            self._current, self._writer_fd, self._appender = log_id, fd, appender
            self._written, self._end = 0, FILE_HEADER_SIZE
            self._pending = [_file_header(log_id)]
        self._needs_directory_sync = True

    def _direct_appender(self, fd: int, path: Path) -> DirectAppender | None:
        if not self.direct_io:
            return None
        try:
            direct = enable_direct(fd)
        except OSError as error:
            os.close(fd)
            raise WriteFailed(f"cannot open entry log {path} for direct writes: {error}") from error
        if not direct:
            log.info(
                "entry logs in %s: the file system refuses O_DIRECT; writing through the "
                "page cache",
                self.directory,
            )
            self.direct_io = False
            return None
        return DirectAppender(fd, 0)

    @staticmethod
    def _write_all(fd: int, buffers: list[bytes], offset: int) -> None:
        """pwritev every buffer from `offset`: a system call per IOV_MAX buffers, no copy."""
        parts: list[bytes | memoryview] = list(buffers)
        start = 0
        while start < len(parts):
            written = os.pwritev(fd, parts[start : start + _IOV_MAX], offset)
            offset += written
            while start < len(parts) and written >= len(parts[start]):
                written -= len(parts[start])
                start += 1
            if written:
                parts[start] = memoryview(parts[start])[written:]

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _leave_current(self) -> None:
        """Stop writing the current log; whatever is still buffered is dropped."""
        with self._lock:
            self._pending = []
            self._pending_records = {}
            self._current = None
        self._close_writer()

    def _close_writer(self) -> None:
        if self._appender is not None:
            self._appender.close()
            self._appender = None
        if self._writer_fd >= 0:
            # The data was fdatasync'ed or abandoned: a failing close loses nothing.
            with contextlib.suppress(OSError):
                os.close(self._writer_fd)
            self._writer_fd = -1

    # -- reading (any thread) ---------------------------------------------------------

    def read(self, location: Location, ledger_id: LedgerId, entry_id: int) -> tuple[int, bytes]:
        """The (CRC32C, bytes) of the entry at `location`, checked to be that entry, intact.

        EntryCorrupt if the record there fails its check (`check`), EntryUnreadable if it
        cannot be read."""
        log_id, offset, size = location
        if not 0 <= log_id <= MAX_LOG_ID or offset < FILE_HEADER_SIZE or size < RECORD_HEADER_SIZE:
            raise EntryUnreadable(
                f"entry {entry_id} of ledger {ledger_id}: impossible location {tuple(location)}"
            )
        with self._lock:
            raw = self._from_buffer(location)
        if raw is None:
            raw = self._pread(location, ledger_id, entry_id)
        crc, data = self.check(raw, location, ledger_id, entry_id)
        return crc, bytes(data)  # (bytes already: raw is)

    def read_cached(
        self, location: Location, ledger_id: LedgerId, entry_id: int
    ) -> tuple[int, bytes] | None:
        """`read`'s answer if it needs no wait for the disk (the record is buffered here or
        in the page cache); None otherwise, and for any record `read` would refuse, which
        `read` is then left to refuse as it does."""
        with self._lock:
            raw = self._from_buffer(location)
        if raw is None:
            try:
                raw = self._handles.pread_cached(location.log_id, location.size, location.offset)
            except OSError:
                return None
            if raw is None:
                return None
        try:
            crc, data = self.check(raw, location, ledger_id, entry_id)
        except EntryUnreadable:
            return None
        return crc, bytes(data)

    def check(
        self, raw: bytes | memoryview, location: Location, ledger_id: LedgerId, entry_id: int
    ) -> tuple[int, bytes | memoryview]:
        """The (CRC32C, bytes) of the record `raw` read at `location`, if it is the whole
        record of that entry (its header names the ledger, the entry and the size that the
        location says) and its bytes match their CRC32C; EntryCorrupt saying what is wrong
        otherwise."""
        size = location.size
        if len(raw) < size:
            raise EntryCorrupt(
                f"{self._where(location, ledger_id, entry_id)}: short read, "
                f"{len(raw)} of {size} bytes"
            )
        length, crc, scope, ledger, entry = RECORD_HEADER.unpack_from(raw)
        if (
            length != size - RECORD_HEADER_SIZE
            or entry != entry_id
            or ledger != ledger_id.id
            or scope != ledger_id.scope
        ):
            raise EntryCorrupt(
                f"{self._where(location, ledger_id, entry_id)}: the record header says "
                f"{length} bytes of entry {entry} of ledger {LedgerId(scope, ledger)}, "
                f"expected {size - RECORD_HEADER_SIZE} bytes"
            )
        data = raw[RECORD_HEADER_SIZE:size]
        actual = crc32c(data)
        if actual != crc:
            raise EntryCorrupt(
                f"{self._where(location, ledger_id, entry_id)}: CRC32C of the {length} bytes "
                f"is 0x{actual:08x}, stored 0x{crc:08x}: the bytes are corrupt"
            )
        return crc, data

    def readable_end(self, log_id: int) -> int | None:
        """Where the bytes a reader may read of log `log_id` end (None: no such log): its
        size, or what is flushed of the log being written."""
        with self._lock:
            if log_id == self._current:
                return self._written
        try:
            return os.stat(self.directory / log_file_name(log_id)).st_size
        except FileNotFoundError:
            return None

    def read_span(self, log_id: int, offset: int, into: memoryview) -> int | None:
        """Read log `log_id` from `offset` into `into` past the page cache (what it held of
        those bytes is dropped): for the scrubber, which reads every record once, into
        buffers it reuses. The count read (fewer if the log is shorter); None if part of
        them is still in the write buffer; EntryUnreadable if they cannot be read."""
        size = len(into)
        with self._lock:
            if log_id == self._current and offset + size > self._written:
                return None
        path = self.directory / log_file_name(log_id)
        try:
            return self._handles.scan_into(log_id, into, offset)
        except EntryUnreadable as error:
            raise EntryUnreadable(f"entry log {path}: {error}") from error
        except OSError as error:
            raise EntryUnreadable(
                f"entry log {path}: read of {size} bytes at offset {offset} failed: {error}"
            ) from error

    def _where(self, location: Location, ledger_id: LedgerId, entry_id: int) -> str:
        path = self.directory / log_file_name(location.log_id)
        return (
            f"entry {entry_id} of ledger {ledger_id} in entry log {path} "
            f"at offset {location.offset}"
        )

    def _from_buffer(self, location: Location) -> bytes | None:
        """The record's bytes if they are still in the write buffer (call under the lock)."""
        if location.log_id != self._current or location.offset < self._written:
            return None
        record = self._pending_records.get(location.offset)
        return b"" if record is None else record[0] + record[1]

    def _pread(self, location: Location, ledger_id: LedgerId, entry_id: int) -> bytes:
        try:
            failpoint("entry_log.read")
            return self._handles.pread(location.log_id, location.size, location.offset)
        except EntryUnreadable as error:
            raise EntryUnreadable(
                f"{self._where(location, ledger_id, entry_id)}: {error}"
            ) from error
        except OSError as error:
            raise EntryUnreadable(
                f"{self._where(location, ledger_id, entry_id)}: read failed: {error}"
            ) from error

    def _open_for_reading(self, log_id: int) -> int:
        """An fd of the log, its file header checked; EntryUnreadable saying why not."""
        try:
            fd = os.open(self.directory / log_file_name(log_id), os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            raise EntryUnreadable(f"cannot open the log: {error}") from error
        try:
            problem = _header_problem(os.pread(fd, FILE_HEADER_SIZE, 0), log_id)
        except OSError as error:
            problem = f"cannot read the file header: {error}"
        if problem is not None:
            os.close(fd)
            raise EntryUnreadable(problem)
        return fd

    def scan(self, log_id: int) -> Iterator[LogRecord]:
        """Every record written to the file of log `log_id`, in file order, each verified.

        For rebuilding an index and for garbage collection, which check each record against
        the index. A record that is cut or fails its CRC32C raises EntryUnreadable naming the
        file and offset (after the good records before it were yielded): the caller decides
        whether that is a crash's torn tail (end of the last log) or damage. Records still
        in the write buffer are not in the file yet and are not scanned.
        """
        path = self.directory / log_file_name(log_id)
        try:
            with open(path, "rb", buffering=_SCAN_CHUNK) as file:
                problem = _header_problem(file.read(FILE_HEADER_SIZE), log_id)
                if problem is not None:
                    raise EntryUnreadable(f"entry log {path}: {problem}")
                offset = FILE_HEADER_SIZE
                file_size = os.fstat(file.fileno()).st_size
                while header := file.read(RECORD_HEADER_SIZE):
                    where = f"entry log {path}: record at offset {offset}"
                    if not any(header):
                        if _is_padding(header + file.read(), offset, file_size):
                            return
                        raise EntryUnreadable(f"{where} is zeroed")
                    if len(header) < RECORD_HEADER_SIZE:
                        raise EntryUnreadable(f"{where} is cut inside its header")
                    length, crc, scope, ledger, entry = RECORD_HEADER.unpack(header)
                    data = file.read(length)
                    if len(data) < length:
                        raise EntryUnreadable(f"{where} is cut: {len(data)} of {length} bytes")
                    if crc32c(data) != crc or entry < 0:
                        raise EntryUnreadable(
                            f"{where} (entry {entry} of ledger {LedgerId(scope, ledger)}, "
                            f"{length} bytes) is corrupt: its CRC32C or entry id is wrong"
                        )
                    size = RECORD_HEADER_SIZE + length
                    yield LogRecord(
                        Location(log_id, offset, size), LedgerId(scope, ledger), entry, crc, data
                    )
                    offset += size
        except OSError as error:
            raise EntryUnreadable(f"entry log {path}: cannot scan: {error}") from error

    # -- housekeeping ---------------------------------------------------------------

    def log_ids(self) -> list[int]:
        """The ids of the logs in the directory, ascending (the current one once flushed)."""
        try:
            return sorted(self._scan_directory())
        except OSError as error:
            raise EntryUnreadable(f"cannot list entry logs in {self.directory}: {error}") from error

    def _scan_directory(self) -> list[int]:
        return [
            int(match.group(1), 16)
            for name in os.listdir(self.directory)
            if (match := _FILE_NAME.fullmatch(name))
        ]

    def delete_log(self, log_id: int) -> None:
        """Remove a log file (garbage collection, once nothing the index holds is in it)."""
        if log_id == self._current:
            raise IllegalOperation(f"entry log {log_id} is the current log; it cannot be deleted")
        self._handles.retire(log_id)
        path = self.directory / log_file_name(log_id)
        try:
            path.unlink()
        except OSError as error:
            if error.errno != errno.ENOENT:
                raise WriteFailed(f"cannot delete entry log {path}: {error}") from error

    def close(self) -> None:
        """Flush what is buffered and close every file. Reads must have stopped."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._close_writer()
            self._handles.close()
