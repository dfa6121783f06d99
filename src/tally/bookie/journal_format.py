"""The journal's bytes on disk, as pure code over buffers: file headers, record frames, and
reading a file's records back, damage included.

A journal file is a 40-byte header, then records back to back, then zeros (preallocated
space). Header (big-endian): magic `TALLYJNL`, uint32 format version, uint64 file id,
uint64 id of the previous file (0 for none), uint64 end of the previous file's records,
uint32 CRC32C of the 36 bytes before it. The end of each file's records is recorded in its
successor's header, since the file being written when a crash happens ends in a torn tail.

Record: a 10-byte frame, then the payload. Frame: uint32 length of the payload, uint16
length of its head, uint32 CRC32C over the payload's body (what follows the head), then its
head, then the frame's first six bytes. The body comes first so that an entry's checksum,
which the bookie has just verified, is not computed again (`frame`'s `body_crc`). An empty
record's checksum is the CRC32C of six zero bytes, which is not zero: the zeros of
preallocated space never read as a record.

Reading back (`scan_records`). A record that fails its frame or checksum is either a torn
write at the tail of the last file or damage to records already acknowledged. The two are
told apart by what follows: the scan looks for the next valid record after the bad one
(`find_record`). Nothing valid after it in the last file is a torn tail, where the records
end. A valid record after it, or a bad record before the end its successor recorded, is
damage: the scan reports the stretch and goes on from the next valid record, since the
records after it were acknowledged too and must not be dropped with it (seed 003).
"""

from __future__ import annotations

import struct
from collections.abc import Generator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tally.core.digest import crc32c
from tally.core.errors import BadRequest, MalformedData

MAGIC = b"TALLYJNL"
FORMAT_VERSION = 2
_HEADER_FIELDS = struct.Struct(">8sIQQQ")
_U32 = struct.Struct(">I")
_FRAME = struct.Struct(">IHI")
_FRAME_SIZES = struct.Struct(">IH")
"""The frame's lengths, which its checksum covers after the payload."""
_MARK = struct.Struct(">QQ")
HEADER_SIZE = _HEADER_FIELDS.size + _U32.size
FRAME_SIZE = _FRAME.size
MAX_RECORD_SIZE = 2**32 - 1
MAX_HEAD_SIZE = 2**16 - 1

SCAN_CHUNK = 1 << 20
"""Bytes `find_record` examines at once (numpy arrays of a few times this size)."""


class JournalMark(NamedTuple):
    """A position in the journal: the end of a record, ordered like the journal.

    A checkpoint at a mark says that every record before it is safe in ledger storage.
    A named tuple rather than a dataclass: one is made for every acknowledged record.
    """

    file_id: int
    offset: int

    def to_bytes(self) -> bytes:
        return _MARK.pack(self.file_id, self.offset)

    @classmethod
    def from_bytes(cls, data: bytes) -> JournalMark:
        if len(data) != _MARK.size:
            raise MalformedData(f"a journal mark is {_MARK.size} bytes, got {len(data)}")
        file_id, offset = _MARK.unpack(data)
        return cls(file_id, offset)


@dataclass(frozen=True)
class FileHeader:
    file_id: int
    previous_file_id: int
    previous_end: int

    def to_bytes(self) -> bytes:
        fields = _HEADER_FIELDS.pack(
            MAGIC, FORMAT_VERSION, self.file_id, self.previous_file_id, self.previous_end
        )
        return fields + _U32.pack(crc32c(fields))

    @classmethod
    def from_bytes(cls, data: bytes, file_id: int, where: str) -> FileHeader:
        """The header at the start of `data`, refusing anything that is not journal file
        `file_id`; `where` names the file in the errors."""
        if len(data) < HEADER_SIZE:
            raise MalformedData(
                f"{where} is not a tally journal file: {len(data)} bytes, "
                f"shorter than the {HEADER_SIZE}-byte header"
            )
        magic, version, found_id, previous_file_id, previous_end = _HEADER_FIELDS.unpack_from(data)
        if magic != MAGIC:
            raise MalformedData(
                f"{where} is not a tally journal file: it starts with {magic!r}, not {MAGIC!r}"
            )
        (checksum,) = _U32.unpack_from(data, _HEADER_FIELDS.size)
        if checksum != crc32c(data[: _HEADER_FIELDS.size]):
            raise MalformedData(f"{where}: the journal file header fails its checksum")
        if version != FORMAT_VERSION:
            raise MalformedData(
                f"{where}: journal format version {version}; this tally reads {FORMAT_VERSION}"
            )
        if found_id != file_id:
            raise MalformedData(f"{where}: the header says journal file {found_id:016x}")
        return cls(file_id, previous_file_id, previous_end)


def file_name(file_id: int) -> str:
    return f"{file_id:016x}.txn"


def frame(head: bytes, body_size: int, body_crc: int) -> bytes:
    """The frame and head of a record whose body of `body_size` bytes has CRC32C `body_crc`:
    what precedes the body in the file."""
    size = len(head) + body_size
    if size > MAX_RECORD_SIZE or len(head) > MAX_HEAD_SIZE:
        raise BadRequest(
            f"journal record of {size} bytes (head {len(head)}) exceeds "
            f"{MAX_RECORD_SIZE} (head {MAX_HEAD_SIZE})"
        )
    sizes = _FRAME_SIZES.pack(size, len(head))
    return sizes + _U32.pack(crc32c(head + sizes, body_crc)) + head


@dataclass(frozen=True, slots=True)
class Damage:
    """A stretch of a journal file where acknowledged records were, and no valid one is."""

    file_id: int
    start: int
    end: int
    problem: str


@dataclass(frozen=True, slots=True)
class Scan:
    """How one file's records ended: where, whether at a torn write, and the damage found."""

    end: int
    torn: str | None
    """What was found at `end` in the last file, if it was not clean zeros."""
    damage: tuple[Damage, ...]


def record_at(view: memoryview, position: int, bound: int) -> tuple[int, bytes] | str:
    """The record at `position` if a valid one ends by `bound`: (its end, its payload);
    otherwise what is wrong there."""
    if bound - position < FRAME_SIZE:
        return f"a record frame cut short ({bound - position} bytes)"
    length, head_size, checksum = _FRAME.unpack_from(view, position)
    if length == head_size == checksum == 0:
        return "no record (zeros)"
    if head_size > length:
        return f"a record frame with a head of {head_size} bytes in {length}"
    stop = position + FRAME_SIZE + length
    if stop > bound:
        return f"a record of {length} bytes cut short at {bound}"
    # Copied first, in order, for the kernel's readahead (a CRC32C walks three parts of its
    # buffer at once), then checked in the copy. No slice of `view` outlives this call.
    payload = bytes(view[position + FRAME_SIZE : stop])
    parts = memoryview(payload)
    head_crc = crc32c(parts[:head_size], crc32c(parts[head_size:]))
    if crc32c(view[position : position + _FRAME_SIZES.size], head_crc) != checksum:
        return f"a record of {length} bytes failing its checksum"
    return stop, payload


def find_record(view: memoryview, start: int, bound: int) -> int | None:
    """The offset of the first valid record in [start, bound), or None.

    Every offset is a candidate, as a damaged frame says nothing of where the next record
    begins. numpy rules out the offsets whose frame cannot be a record's (all zeros, a head
    longer than the payload, a payload past `bound`); the few left are checked in full.
    """
    last = _last_nonzero(view, start, bound)
    if last is None:
        return None
    chunk_start = start
    while chunk_start <= last:
        chunk_stop = min(chunk_start + SCAN_CHUNK, last + 1, bound - FRAME_SIZE + 1)
        if chunk_stop <= chunk_start:
            return None
        for candidate in _plausible_frames(view, chunk_start, chunk_stop, bound):
            if not isinstance(record_at(view, candidate, bound), str):
                return candidate
        chunk_start = chunk_stop
    return None


def _plausible_frames(view: memoryview, start: int, stop: int, bound: int) -> list[int]:
    """The offsets in [start, stop) where a frame could begin a record that ends by `bound`."""
    count = stop - start
    b = np.frombuffer(view[start : stop + FRAME_SIZE - 1], dtype=np.uint8).astype(np.int64)
    at = [b[offset : count + offset] for offset in range(FRAME_SIZE)]
    length = at[0] << 24 | at[1] << 16 | at[2] << 8 | at[3]
    head = at[4] << 8 | at[5]
    checksum_nonzero = (at[6] | at[7] | at[8] | at[9]) != 0
    room = bound - FRAME_SIZE - np.arange(start, stop, dtype=np.int64)
    plausible = (
        (head <= length) & (length <= room) & ((length != 0) | (head != 0) | checksum_nonzero)
    )
    return [start + int(index) for index in np.flatnonzero(plausible)]


def _last_nonzero(view: memoryview, start: int, bound: int) -> int | None:
    """The offset of the last non-zero byte in [start, bound), scanning from the end."""
    stop = bound
    while stop > start:
        begin = max(start, stop - SCAN_CHUNK)
        found = np.flatnonzero(np.frombuffer(view[begin:stop], dtype=np.uint8))
        if found.size:
            return begin + int(found[-1])
        stop = begin
    return None


def scan_records(
    view: memoryview, file_id: int, begin: int, bound: int, *, end_recorded: bool
) -> Generator[tuple[JournalMark, bytes], None, Scan]:
    """Yield the valid records of one file's bytes from `begin` up to `bound`, each with the
    mark of its end; return how they ended (see the module docstring).

    `end_recorded`: `bound` is the end of the records that the next file's header recorded,
    so anything but a valid record before it is damage; otherwise `bound` is the size of
    the last file, whose records end at the first bad one that nothing valid follows.
    """
    position = begin
    damage: list[Damage] = []
    while position < bound:
        found = record_at(view, position, bound)
        if not isinstance(found, str):
            position, payload = found
            yield JournalMark(file_id, position), payload
            continue
        resume = find_record(view, position + 1, bound)
        if resume is None:
            if end_recorded:
                damage.append(Damage(file_id, position, bound, found))
                position = bound
                break
            torn = None if found == "no record (zeros)" else found
            return Scan(position, torn, tuple(damage))
        damage.append(Damage(file_id, position, resume, found))
        position = resume
    return Scan(position, None, tuple(damage))
