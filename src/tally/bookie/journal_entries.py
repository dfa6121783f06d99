"""Entries read back from the journal file that holds them.

A bookie with its journal and ledger directories on one disk would write every large entry
twice to that disk: into the journal before the acknowledgement, then into an entry log at
the checkpoint. The disk's bandwidth is then halved (measured: docs/benchmarks.md). So an
entry of at least `KEPT_ENTRY_SIZE` bytes stays where the journal wrote it: the checkpoint
indexes its place in the journal file instead of copying it, and that file is kept for as
long as the index points into it. Smaller entries are still copied into entry logs, sorted
by ledger, where reading a ledger back finds its entries together.

The index holds a `JournalLocation` (file, offset and size of the entry's bytes, and the
CRC32C the client sent with it). In the file the bytes follow the head of their journal
record (`ENTRY_HEAD`: ledger, entry, LAC, CRC32C); a read takes both and checks the head
against the ledger, entry and CRC32C expected and the bytes against the CRC32C. A mismatch
or short read is `EntryCorrupt`, an I/O error `EntryUnreadable` (its parent), never "no
such entry" (seed 003).

The journal writes with O_DIRECT, so its pages are not cached, and a buffered read of a kept
entry costs the kernel a fresh page-cache allocation for every page: about 100 µs of CPU per
64 KiB here, most of a repair source's work (docs/benchmarks.md, issue 21). So the reads are
O_DIRECT too, of the aligned blocks around the record, into a reused buffer per thread:
about 40 µs.
"""

from __future__ import annotations

import enum
import errno
import mmap
import os
import struct
import threading
from pathlib import Path
from typing import NamedTuple

from tally.bookie.direct_io import aligned_down, aligned_up, enable_direct
from tally.bookie.journal_format import JournalMark, file_name
from tally.bookie.read_handles import ReadHandles
from tally.core.digest import crc32c
from tally.core.errors import EntryCorrupt, EntryUnreadable
from tally.core.ids import LedgerId


class RecordType(enum.IntEnum):
    """The kinds of journal record a bookie writes (records.py)."""

    ENTRY = 1
    MASTER_KEY = 2
    FENCE = 3
    EXPLICIT_LAC = 4
    METADATA_COPY = 5


ENTRY_HEAD = struct.Struct(">BQQqqI")
"""An entry record's head: type, ledger scope and id, entry id, piggy-backed LAC, CRC32C of
the entry bytes, which follow it."""

KEPT_ENTRY_SIZE = 16 << 10
"""Entries of at least this many bytes stay in the journal (when the bookie keeps entries
there). Below it, an entry costs the disk little to copy, and entry logs sorted by ledger
serve reads of a ledger's many small entries with fewer seeks."""


class JournalLocation(NamedTuple):
    """Where an entry's bytes lie in the journal (after its record's head), and their CRC32C."""

    file_id: int
    offset: int
    size: int
    crc32c: int


def kept_location(end: JournalMark, size: int, crc: int) -> JournalLocation | None:
    """Where the entry record ending at `end` holds its `size` bytes with CRC32C `crc`, if
    the entry is large enough to stay there (KEPT_ENTRY_SIZE); None if it is copied."""
    if size < KEPT_ENTRY_SIZE:
        return None
    return JournalLocation(end.file_id, end.offset - size, size, crc)


class JournalEntries:
    """Reads of the entries kept in the journal files of `directory` (any thread)."""

    def __init__(self, directory: Path, *, direct_io: bool = True) -> None:
        self.directory = directory
        self._direct_io = direct_io
        """Read with O_DIRECT where the file system allows it (buffered where it refuses:
        the aligned reads are the same)."""
        self._handles = ReadHandles(self._open)
        self._buffers = threading.local()

    def _open(self, file_id: int) -> int:
        fd = os.open(self.directory / file_name(file_id), os.O_RDONLY | os.O_CLOEXEC)
        if self._direct_io:
            try:
                enable_direct(fd)
            except OSError:
                os.close(fd)
                raise
        return fd

    def read(
        self, location: JournalLocation, ledger_id: LedgerId, entry_id: int
    ) -> tuple[int, bytes]:
        """The (CRC32C, bytes) of the entry at `location`, checked to be that entry, intact:
        EntryCorrupt if it fails its check (`check`), EntryUnreadable if it cannot be read."""
        file_id, offset, size, _ = location
        start, length = offset - ENTRY_HEAD.size, ENTRY_HEAD.size + size
        if not self._direct_io:
            try:
                raw = self._handles.pread(file_id, length, start)
            except OSError as error:
                raise self._unreadable(location, ledger_id, entry_id, error) from error
            crc, data = self.check(raw, location, ledger_id, entry_id)
            return crc, bytes(data)  # (bytes already: raw is)
        first = aligned_down(start)
        span = aligned_up(start + length) - first
        with memoryview(self._buffer(span)) as view:
            try:
                read = self._handles.pread_into(file_id, view[:span], first)
            except OSError as error:
                if error.errno == errno.EINVAL:
                    raise  # a misaligned O_DIRECT read: this code's error, not the disk's
                raise self._unreadable(location, ledger_id, entry_id, error) from error
            end = max(start - first, min(read, start - first + length))
            with view[start - first : end] as record:
                crc, data = self.check(record, location, ledger_id, entry_id)
                return crc, bytes(data)

    def _buffer(self, size: int) -> mmap.mmap:
        """This thread's page-aligned read buffer, of at least `size` bytes."""
        buffer: mmap.mmap | None = getattr(self._buffers, "buffer", None)
        if buffer is None or len(buffer) < size:
            buffer = self._buffers.buffer = mmap.mmap(-1, aligned_up(size))
        return buffer

    def _unreadable(
        self, location: JournalLocation, ledger_id: LedgerId, entry_id: int, error: OSError
    ) -> EntryUnreadable:
        return EntryUnreadable(
            f"{self._where(location, ledger_id, entry_id)}: read failed: {error}"
        )

    def check(
        self,
        raw: bytes | memoryview,
        location: JournalLocation,
        ledger_id: LedgerId,
        entry_id: int,
    ) -> tuple[int, bytes | memoryview]:
        """The (CRC32C, bytes) of the entry record `raw` (its head, then the entry) read at
        `location`, if the head names the ledger, the entry and the CRC32C that the index
        holds and the bytes match that CRC32C; EntryCorrupt saying what is wrong otherwise."""
        _, _, size, crc = location
        if len(raw) < ENTRY_HEAD.size + size:
            raise EntryCorrupt(
                f"{self._where(location, ledger_id, entry_id)}: short read, "
                f"{len(raw)} of {ENTRY_HEAD.size + size} bytes"
            )
        kind, scope, ledger, entry, _, head_crc = ENTRY_HEAD.unpack_from(raw)
        if (kind, scope, ledger, entry, head_crc) != (
            RecordType.ENTRY,
            ledger_id.scope,
            ledger_id.id,
            entry_id,
            crc,
        ):
            raise EntryCorrupt(
                f"{self._where(location, ledger_id, entry_id)}: the journal record there is "
                f"of type {kind}, entry {entry} of ledger "
                f"{LedgerId(scope, ledger)}, CRC32C 0x{head_crc:08x}; the index says 0x{crc:08x}"
            )
        data = raw[ENTRY_HEAD.size : ENTRY_HEAD.size + size]
        actual = crc32c(data)
        if actual != crc:
            raise EntryCorrupt(
                f"{self._where(location, ledger_id, entry_id)}: CRC32C of the {size} bytes "
                f"is 0x{actual:08x}, stored 0x{crc:08x}: "
                "the bytes are corrupt"
            )
        return crc, data

    def _where(self, location: JournalLocation, ledger_id: LedgerId, entry_id: int) -> str:
        return (
            f"entry {entry_id} of ledger {ledger_id} in journal file "
            f"{self.directory / file_name(location.file_id)} at offset {location.offset}"
        )

    def retire(self, file_id: int) -> None:
        """The index no longer points into the file and the journal may delete it: stop
        reading it (a read that raced the change reads the index again)."""
        self._handles.retire(file_id)

    def close(self) -> None:
        self._handles.close()
