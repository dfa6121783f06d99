"""The bookie wire protocol as a sans-I/O codec: messages to frames, bytes to messages.

The asyncio bookie and client only move bytes. A `RequestReader` (bookie side) or a
`ResponseReader` (client side) is fed whatever arrived, split anywhere, and returns the
complete messages; `message.encode()` returns the bytes to send. Nothing here does I/O, so
every framing rule is tested byte by byte without a socket.

A frame is a uint32 length of what follows (at most the reader's `max_frame_size`), a fixed
header and the operation's body, all big-endian:

    request header, 36 bytes   version u8, operation u8, flags u16, request id u64,
                               ledger scope u64, ledger id u64, entry id i64
    response header, 40 bytes  the same, then status i32: 0, or the TallyError's wire code

The operation byte's top bit marks a response, and each direction has its own reader, so a
frame sent the wrong way is refused rather than misparsed. A response echoes its request's
operation, request id, ledger and entry; its flags are its own (only STREAM_END exists).
Fields an operation does not use are zero, and a reader refuses anything an encoder would
not write: a frame that decodes re-encodes to exactly its own bytes.

    operation                       request body                    OK response body
    ADD                             master key, crc32c u32, entry   -
    READ (entry, or -1: the last)   master key iff DO_FENCING       the entry as stored
    READ_LAC                        -                               LAC i64
    WRITE_LAC                       master key, LAC i64             -
    GET_LIST_OF_ENTRIES_OF_LEDGER   -                               availability encoding
    AVAILABILITY_DUMP (no ledger)   -                               records, over many frames
    LEDGER_INFO                     -                               fenced u8, LAC i64,
                                                                    entry count u64, bytes u64

An error response's body is the error's message in UTF-8. A dump answers with one or more
frames of records (scope u64, ledger u64, length u32, availability encoding); the last one
has STREAM_END.

A reader raises MalformedData for any frame it cannot take (too large, cut below a header,
unknown version or operation, flags or ids the operation does not allow, a body of the
wrong size, an ADD whose header disagrees with its entry) and stays failed, since the stream
position is lost: the connection must close. A CRC mismatch leaves the stream intact; the
bookie answers it with an ErrorResponse (BadDigest).

Readers receive into arenas (receive_arenas.py) and decode each frame where it lies; an
ADD's entry of KEEP_IN_PLACE bytes or more stays there as a memoryview rather than being
copied out.
"""

from __future__ import annotations

import enum
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import ClassVar, Final, Generic, NamedTuple, TypeAlias, TypeVar

from tally.core.availability import EntryAvailability
from tally.core.digest import MASTER_KEY_SIZE, crc32c
from tally.core.entry_format import peek_header
from tally.core.errors import BadDigest, BadRequest, MalformedData, TallyError, from_code
from tally.core.ids import LedgerId
from tally.core.receive_arenas import MIN_RECEIVE, ReceiveArenas

VERSION: Final = 1
EntryBytes: TypeAlias = bytes | memoryview
"""An entry's bytes: a large one stays a view of the arena it was received into (see
KEEP_IN_PLACE), which nobody writes to again while the view lives."""
MAX_FRAME_SIZE: Final = 5 * 1024 * 1024
"""Default largest frame, counted after the length prefix (BookKeeper's default)."""

_LENGTH = struct.Struct(">I")
_REQUEST = struct.Struct(">IBBHQQQq")  # length prefix, then the request header
_RESPONSE = struct.Struct(">IBBHQQQqi")  # length prefix, then the response header
REQUEST_HEADER_SIZE: Final = _REQUEST.size - _LENGTH.size
RESPONSE_HEADER_SIZE: Final = _RESPONSE.size - _LENGTH.size
_ADD = struct.Struct(">IBBHQQQq32sI")  # an ADD request frame up to its entry
_ADD_FIXED = struct.Struct(">32sI")  # the ADD body before the entry
_KEY_AND_LAC = struct.Struct(">32sq")
_LAC = struct.Struct(">q")
_LEDGER_INFO = struct.Struct(">BqQQ")
_RECORD = struct.Struct(">QQI")
_RESPONSE_BIT = 0x80
_NO_LEDGER = LedgerId(0, 0)
_U32: Final = (1 << 32) - 1
_U64: Final = (1 << 64) - 1
_I32: Final = (1 << 31) - 1
_I64: Final = (1 << 63) - 1


class Operation(enum.IntEnum):
    """The operation byte of a frame; numbers are stable."""

    ADD = 1
    READ = 2
    READ_LAC = 3
    WRITE_LAC = 4
    GET_LIST_OF_ENTRIES_OF_LEDGER = 5
    AVAILABILITY_DUMP = 6
    LEDGER_INFO = 7


class Flags(enum.IntFlag):
    """Header flags. Messages expose them as fields (`recovery`, `master_key`, `stream_end`)."""

    NONE = 0
    DO_FENCING = 0x1
    RECOVERY_ADD = 0x2
    STREAM_END = 0x4


# Plain ints for the hot paths: IntFlag arithmetic, and even looking a member up on its
# class (0.3 us in Python 3.11), cost more than the rest of a small frame.
_NO_FLAGS: Final = int(Flags.NONE)
_DO_FENCING: Final = int(Flags.DO_FENCING)
_RECOVERY_ADD: Final = int(Flags.RECOVERY_ADD)
_STREAM_END: Final = int(Flags.STREAM_END)


class _Rule(NamedTuple):
    """What a header may hold for an operation."""

    flags: int
    """The request flags the operation allows."""
    lowest_entry: int | None
    """The smallest entry id, or None when the operation names no entry (entry id 0)."""
    names_ledger: bool


_RULES: Final = {
    Operation.ADD: _Rule(_RECOVERY_ADD, 0, True),
    Operation.READ: _Rule(_DO_FENCING, -1, True),
    Operation.READ_LAC: _Rule(0, None, True),
    Operation.WRITE_LAC: _Rule(0, None, True),
    Operation.GET_LIST_OF_ENTRIES_OF_LEDGER: _Rule(0, None, True),
    Operation.AVAILABILITY_DUMP: _Rule(0, None, False),
    Operation.LEDGER_INFO: _Rule(0, None, True),
}


# --- requests -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Store one entry. The ledger and entry ids are read from the entry itself, so a request
    cannot name other ids than the bytes it carries.

    `crc32c` is the client's CRC32C of `entry`; build with `for_entry` to compute it. The
    bookie checks it before it journals anything (end-to-end checksum; `verify_crc` is
    that check). The frame adds 72 bytes to the entry, so entries up to
    `max_frame_size - 72` fit.
    """

    operation: ClassVar[Operation] = Operation.ADD
    request_id: int
    entry: EntryBytes
    master_key: bytes
    crc32c: int
    recovery: bool = False
    """RECOVERY_ADD: a recovering client re-replicates; allowed on a fenced ledger."""
    ledger_id: LedgerId = field(init=False)
    entry_id: int = field(init=False)
    last_add_confirmed: int = field(init=False)
    """The LAC the writer piggy-backed on the entry."""

    def __post_init__(self) -> None:
        if type(self.entry) is not bytes and type(self.entry) is not memoryview:
            raise BadRequest(
                f"an ADD's entry must be bytes or a memoryview, not {type(self.entry).__name__}"
            )
        head = peek_header(self.entry)
        object.__setattr__(self, "ledger_id", head.ledger_id)
        object.__setattr__(self, "entry_id", head.entry_id)
        object.__setattr__(self, "last_add_confirmed", head.last_add_confirmed)

    @classmethod
    def for_entry(
        cls, request_id: int, entry: bytes, master_key: bytes, recovery: bool = False
    ) -> AddRequest:
        """The client's way in: an ADD of the encoded `entry` with its CRC32C computed."""
        return cls(request_id, entry, master_key, crc32c(entry), recovery)

    def verify_crc(self) -> None:
        """Raise BadDigest unless the entry's bytes have the CRC32C the client computed."""
        actual = crc32c(self.entry)
        if actual != self.crc32c:
            raise BadDigest(
                f"ADD of ledger {self.ledger_id} entry {self.entry_id} (request "
                f"{self.request_id}): the {len(self.entry)} entry bytes have CRC32C "
                f"0x{actual:08x}, the client sent 0x{self.crc32c:08x}"
            )

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        size = _ADD.size - _LENGTH.size + len(self.entry)
        _check_header_fields(self, size, max_frame_size)
        _check_master_key(self.master_key, self)
        _check_int(self.crc32c, 0, _U32, "crc32c", self)
        ledger_id = self.ledger_id
        head = _ADD.pack(
            size,
            VERSION,
            self.operation,
            _RECOVERY_ADD if self.recovery else 0,
            self.request_id,
            ledger_id.scope,
            ledger_id.id,
            self.entry_id,
            self.master_key,
            self.crc32c,
        )
        return head + self.entry


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """Read one entry; entry id -1 asks for the last entry the bookie has (its LAC entry).

    With a `master_key` it is a fencing read (DO_FENCING): the bookie fences the ledger
    first, after checking the key against the one the ledger's first add fixed.
    """

    operation: ClassVar[Operation] = Operation.READ
    request_id: int
    ledger_id: LedgerId
    entry_id: int
    master_key: bytes | None = None

    @property
    def do_fencing(self) -> bool:
        return self.master_key is not None

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        if self.master_key is None:
            return _request_frame(self, _NO_FLAGS, b"", max_frame_size)
        _check_master_key(self.master_key, self)
        return _request_frame(self, _DO_FENCING, self.master_key, max_frame_size)


@dataclass(frozen=True, slots=True)
class _LedgerQuery:
    """A request that names one ledger and carries no body; subclasses set the operation."""

    operation: ClassVar[Operation]
    request_id: int
    ledger_id: LedgerId
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        return _request_frame(self, _NO_FLAGS, b"", max_frame_size)


@dataclass(frozen=True, slots=True)
class ReadLacRequest(_LedgerQuery):
    """Ask for the LAC the bookie knows: the larger of the explicit and the piggy-backed one."""

    operation: ClassVar[Operation] = Operation.READ_LAC


@dataclass(frozen=True, slots=True)
class WriteLacRequest:
    """Tell the bookie the ledger's LAC explicitly (the writer's key proves who says so)."""

    operation: ClassVar[Operation] = Operation.WRITE_LAC
    request_id: int
    ledger_id: LedgerId
    master_key: bytes
    last_add_confirmed: int
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        _check_master_key(self.master_key, self)
        _check_int(self.last_add_confirmed, -1, _I64, "LAC", self)
        body = _KEY_AND_LAC.pack(self.master_key, self.last_add_confirmed)
        return _request_frame(self, _NO_FLAGS, body, max_frame_size)


@dataclass(frozen=True, slots=True)
class GetListOfEntriesOfLedgerRequest(_LedgerQuery):
    """Ask which entries of a ledger the bookie's index has (BP-34), as availability bytes."""

    operation: ClassVar[Operation] = Operation.GET_LIST_OF_ENTRIES_OF_LEDGER


@dataclass(frozen=True, slots=True)
class AvailabilityDumpRequest:
    """Ask for every ledger the bookie holds with its availability (the audit's input)."""

    operation: ClassVar[Operation] = Operation.AVAILABILITY_DUMP
    request_id: int
    ledger_id: LedgerId = field(default=_NO_LEDGER, init=False)
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        return _request_frame(self, _NO_FLAGS, b"", max_frame_size)


@dataclass(frozen=True, slots=True)
class LedgerInfoRequest(_LedgerQuery):
    """Ask what the bookie knows of one ledger: fenced, LAC, entries and bytes stored."""

    operation: ClassVar[Operation] = Operation.LEDGER_INFO


Request: TypeAlias = (
    AddRequest
    | ReadRequest
    | ReadLacRequest
    | WriteLacRequest
    | GetListOfEntriesOfLedgerRequest
    | AvailabilityDumpRequest
    | LedgerInfoRequest
)


# --- responses ------------------------------------------------------------------------------


class _Response:
    """What every response shares: whether it is the last frame answering its request."""

    __slots__ = ()

    @property
    def final(self) -> bool:
        """True unless more frames with the same request id follow (a dump's batches)."""
        return True


@dataclass(frozen=True, slots=True)
class AddResponse(_Response):
    """The entry is durable on this bookie (journaled and synced)."""

    operation: ClassVar[Operation] = Operation.ADD
    request_id: int
    ledger_id: LedgerId
    entry_id: int

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        return _response_frame(self, _NO_FLAGS, b"", max_frame_size)


@dataclass(frozen=True, slots=True)
class ReadResponse(_Response):
    """The entry's bytes as the bookie stored them; the reader checks their digest.

    `entry_id` echoes the request, so it is -1 for a read of the last entry: the entry's own
    header says which entry it is.
    """

    operation: ClassVar[Operation] = Operation.READ
    request_id: int
    ledger_id: LedgerId
    entry_id: int
    entry: EntryBytes

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        return _response_frame(self, _NO_FLAGS, _as_entry_bytes(self.entry, self), max_frame_size)


@dataclass(frozen=True, slots=True)
class ReadLacResponse(_Response):
    operation: ClassVar[Operation] = Operation.READ_LAC
    request_id: int
    ledger_id: LedgerId
    last_add_confirmed: int
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        _check_int(self.last_add_confirmed, -1, _I64, "LAC", self)
        body = _LAC.pack(self.last_add_confirmed)
        return _response_frame(self, _NO_FLAGS, body, max_frame_size)


@dataclass(frozen=True, slots=True)
class WriteLacResponse(_Response):
    operation: ClassVar[Operation] = Operation.WRITE_LAC
    request_id: int
    ledger_id: LedgerId
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        return _response_frame(self, _NO_FLAGS, b"", max_frame_size)


@dataclass(frozen=True, slots=True)
class GetListOfEntriesOfLedgerResponse(_Response):
    """The entries the bookie's index has, in the BP-34 encoding (carried, not decoded)."""

    operation: ClassVar[Operation] = Operation.GET_LIST_OF_ENTRIES_OF_LEDGER
    request_id: int
    ledger_id: LedgerId
    availability: bytes
    entry_id: int = field(default=0, init=False)

    def entries(self) -> EntryAvailability:
        """Decode the availability; MalformedData if the bookie sent a bad encoding."""
        return EntryAvailability.from_bytes(self.availability)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        body = _as_bytes(self.availability, "availability", self)
        return _response_frame(self, _NO_FLAGS, body, max_frame_size)


@dataclass(frozen=True, slots=True)
class LedgerAvailability:
    """One record of an availability dump: a ledger and the encoding of its entries."""

    ledger_id: LedgerId
    availability: bytes

    @property
    def record_size(self) -> int:
        """Bytes this record takes in a dump frame."""
        return _RECORD.size + len(self.availability)

    def entries(self) -> EntryAvailability:
        """Decode the availability; MalformedData if the bookie sent a bad encoding."""
        return EntryAvailability.from_bytes(self.availability)


@dataclass(frozen=True, slots=True)
class AvailabilityDumpResponse(_Response):
    """One batch of a dump; `stream_end` marks the last (possibly empty) batch."""

    operation: ClassVar[Operation] = Operation.AVAILABILITY_DUMP
    request_id: int
    records: tuple[LedgerAvailability, ...]
    stream_end: bool
    ledger_id: LedgerId = field(default=_NO_LEDGER, init=False)
    entry_id: int = field(default=0, init=False)

    @property
    def final(self) -> bool:
        return self.stream_end

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        parts = [part for record in self.records for part in _record_parts(record)]
        flags = Flags.STREAM_END if self.stream_end else Flags.NONE
        return _response_frame(self, flags, b"".join(parts), max_frame_size)


@dataclass(frozen=True, slots=True)
class LedgerInfo:
    """What a bookie knows of one ledger. `byte_count` counts the entries' stored bytes."""

    fenced: bool
    last_add_confirmed: int
    entry_count: int
    byte_count: int


@dataclass(frozen=True, slots=True)
class LedgerInfoResponse(_Response):
    operation: ClassVar[Operation] = Operation.LEDGER_INFO
    request_id: int
    ledger_id: LedgerId
    info: LedgerInfo
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        info = self.info
        if type(info.fenced) is not bool:
            raise BadRequest(f"{_name(self)}: fenced must be a bool, not {info.fenced!r}")
        _check_int(info.last_add_confirmed, -1, _I64, "LAC", self)
        _check_int(info.entry_count, 0, _U64, "entry count", self)
        _check_int(info.byte_count, 0, _U64, "byte count", self)
        body = _LEDGER_INFO.pack(
            info.fenced, info.last_add_confirmed, info.entry_count, info.byte_count
        )
        return _response_frame(self, _NO_FLAGS, body, max_frame_size)


@dataclass(frozen=True, slots=True)
class ErrorResponse(_Response):
    """A request failed; `error()` is the TallyError the bookie raised, rebuilt by code."""

    operation: Operation
    request_id: int
    ledger_id: LedgerId
    entry_id: int
    code: int
    message: str

    @classmethod
    def answering(cls, request: Request, error: TallyError) -> ErrorResponse:
        """The bookie's answer to `request` that failed with `error`."""
        return cls(
            request.operation,
            request.request_id,
            request.ledger_id,
            request.entry_id,
            error.code,
            str(error),
        )

    def error(self) -> TallyError:
        return from_code(self.code, self.message)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        if not isinstance(self.operation, Operation):
            raise BadRequest(f"{_name(self)}: {self.operation!r} is not an Operation")
        if self.code == 0:
            raise BadRequest(f"{_name(self)}: status 0 means OK; an error needs its code")
        _check_int(self.code, -_I32 - 1, _I32, "code", self)
        if type(self.message) is not str:
            raise BadRequest(f"{_name(self)}: the message must be a str, not {self.message!r}")
        body = self.message.encode("utf-8", "backslashreplace")
        return _response_frame(self, _NO_FLAGS, body, max_frame_size, self.code)


Response: TypeAlias = (
    AddResponse
    | ReadResponse
    | ReadLacResponse
    | WriteLacResponse
    | GetListOfEntriesOfLedgerResponse
    | AvailabilityDumpResponse
    | LedgerInfoResponse
    | ErrorResponse
)


class AvailabilityDumpEncoder:
    """Packs a dump's records into frames of at most `budget` bytes (counted as a reader's
    limit is), so a bookie streams all its ledgers holding one frame at a time.

    `add` returns a full frame whenever the next record would not fit; `finish` returns the
    last frame, flagged STREAM_END (empty when nothing is left). A record too large for any
    frame raises BadRequest naming the ledger: the bookie answers with an ErrorResponse.
    """

    __slots__ = ("_budget", "_finished", "_parts", "_request_id", "_size")

    def __init__(self, request_id: int, budget: int = MAX_FRAME_SIZE) -> None:
        smallest = RESPONSE_HEADER_SIZE + _RECORD.size
        if not smallest <= budget < 1 << 32:
            raise BadRequest(
                f"a dump frame budget of {budget} bytes is outside {smallest}..{(1 << 32) - 1}"
            )
        if type(request_id) is not int or not 0 <= request_id <= _U64:
            raise BadRequest(f"an availability dump's request id {request_id!r} is not a u64")
        self._request_id = request_id
        self._budget = budget
        self._parts: list[bytes] = []
        self._size = RESPONSE_HEADER_SIZE
        self._finished = False

    def add(self, record: LedgerAvailability) -> bytes | None:
        self._check_open()
        parts = _record_parts(record)
        needed = record.record_size
        if RESPONSE_HEADER_SIZE + needed > self._budget:
            raise BadRequest(
                f"availability of ledger {record.ledger_id} takes {needed} bytes; with the "
                f"response header it does not fit a dump frame budget of {self._budget} bytes"
            )
        frame = None
        if self._size + needed > self._budget:
            frame = self._frame(Flags.NONE)
        self._parts.extend(parts)
        self._size += needed
        return frame

    def finish(self) -> bytes:
        self._check_open()
        self._finished = True
        return self._frame(Flags.STREAM_END)

    def _frame(self, flags: Flags) -> bytes:
        op = Operation.AVAILABILITY_DUMP | _RESPONSE_BIT
        head = _RESPONSE.pack(self._size, VERSION, op, flags, self._request_id, 0, 0, 0, 0)
        frame = b"".join((head, *self._parts))
        self._parts = []
        self._size = RESPONSE_HEADER_SIZE
        return frame

    def _check_open(self) -> None:
        if self._finished:
            raise BadRequest(f"the availability dump of request {self._request_id} is finished")


def encode_availability_dump(
    request_id: int, records: Iterable[LedgerAvailability], budget: int = MAX_FRAME_SIZE
) -> Iterator[bytes]:
    """Every frame answering a dump of `records`, read lazily (see AvailabilityDumpEncoder)."""
    encoder = AvailabilityDumpEncoder(request_id, budget)

    def frames() -> Iterator[bytes]:
        for record in records:
            frame = encoder.add(record)
            if frame is not None:
                yield frame
        yield encoder.finish()

    return frames()


# --- readers --------------------------------------------------------------------------------

_Message = TypeVar("_Message")
_Buffer: TypeAlias = bytes | bytearray | memoryview


KEEP_IN_PLACE: Final = 8 << 10
"""An ADD's entry at least this long stays a view of the bytes it arrived in: copying 64 KiB
out was a sixth of a bookie's time per add. Shorter ones are copied, so that they do not
keep a megabyte arena alive for a few bytes; so are long ones in an arena that other
requests filled more than half of (`FrameReader._may_keep`)."""


class FrameReader(ABC, Generic[_Message]):
    """Turns a byte stream, received in chunks split anywhere, into messages.

    The bytes are received into an arena (`get_buffer`, then `buffer_updated` with how many
    arrived; or `feed`, which copies them in) and each frame is decoded where it lies, so a
    large entry can stay there as a view instead of being copied out: such a view keeps its
    arena alive, and the reader then starts a new arena rather than reuse it. A frame never
    spans two arenas: the part of one already received moves to the next. A frame's length
    is checked as soon as its prefix is complete, so at most one frame (`max_frame_size`)
    and a receive's worth more are ever buffered.
    """

    __slots__ = (
        "_arena",
        "_arenas",
        "_end",
        "_failure",
        "_kept_bytes",
        "_max_frame_size",
        "_offset",
        "_start",
    )

    _kind: ClassVar[str]
    _header_size: ClassVar[int]

    def __init__(
        self, max_frame_size: int = MAX_FRAME_SIZE, arenas: ReceiveArenas | None = None
    ) -> None:
        if not self._header_size <= max_frame_size < 1 << 32:
            raise BadRequest(
                f"max frame size {max_frame_size} is outside "
                f"{self._header_size}..{(1 << 32) - 1} (the {self._kind} header to 2^32-1)"
            )
        self._max_frame_size = max_frame_size
        self._arenas = ReceiveArenas() if arenas is None else arenas
        self._arena = memoryview(self._arenas.take(self._arenas.arena_size))
        self._start = 0
        """Where the first frame not yet decoded begins in the arena."""
        self._end = 0
        """Where the received bytes end in the arena."""
        self._kept_bytes = 0
        """Bytes of the arena that decoded messages hold views of."""
        self._offset = 0
        self._failure: str | None = None

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame; non-zero at end of stream means it was cut short."""
        return self._end - self._start

    def get_buffer(self) -> memoryview:
        """Where to receive the next bytes: at least MIN_RECEIVE of room, and room for the
        whole of the frame begun, so that it lies in one piece."""
        arena, start, end = self._arena, self._start, self._end
        needed = MIN_RECEIVE
        if end - start >= _LENGTH.size:
            frame_size = _LENGTH.size + _LENGTH.unpack_from(arena, start)[0]
            if frame_size <= _LENGTH.size + self._max_frame_size:
                needed = max(needed, frame_size - (end - start))
        if len(arena) - end < needed:
            self._move_to_new_arena(needed)
        return self._arena[self._end :]

    def _move_to_new_arena(self, needed: int) -> None:
        pending = self._end - self._start
        size = max(self._arenas.arena_size, pending + needed)
        old = self._arena
        if self._kept_bytes or size > len(old):
            self._arena = memoryview(self._arenas.take(size))
            self._kept_bytes = 0
            self._arena[:pending] = old[self._start : self._end]
            self._arenas.give_back(old.obj)  # type: ignore[arg-type]
        else:
            self._arena[:pending] = old[self._start : self._end]
        self._start, self._end = 0, pending

    def release(self) -> None:
        """Give the arena back to the pool: the stream is over (views of it may live on)."""
        arena = self._arena.obj
        self._arena = memoryview(bytearray())
        self._start = self._end = self._kept_bytes = 0
        self._arenas.give_back(arena)  # type: ignore[arg-type]

    def buffer_updated(self, nbytes: int) -> list[_Message]:
        """The messages completed by the `nbytes` just received into `get_buffer()`, in order.

        Raises MalformedData for a frame that cannot be taken; the reader then refuses every
        later call, since the stream position is lost.
        """
        if self._failure is not None:
            raise MalformedData(
                f"the {self._kind} stream is unusable after an earlier error: {self._failure}"
            )
        if not 0 <= nbytes <= len(self._arena) - self._end:
            raise BadRequest(f"{nbytes} bytes received into {len(self._arena) - self._end}")
        self._end += nbytes
        try:
            return self._decode_complete()
        except MalformedData as error:
            self._failure = f"{error} (frame at stream offset {self._offset})"
            self._start = self._end
            raise MalformedData(self._failure) from None

    def feed(self, data: _Buffer) -> list[_Message]:
        """The messages completed by `data` (copied in; the caller may reuse its buffer)."""
        view = _byte_view(data)
        messages: list[_Message] = []
        pos = 0
        while True:
            room = self.get_buffer()
            taken = min(len(room), len(view) - pos)
            room[:taken] = view[pos : pos + taken]
            pos += taken
            messages += self.buffer_updated(taken)
            if pos == len(view):
                return messages

    def _decode_complete(self) -> list[_Message]:
        messages: list[_Message] = []
        arena, pos, end = self._arena, self._start, self._end
        while end - pos >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(arena, pos)
            self._check_length(length)
            stop = pos + _LENGTH.size + length
            if stop > end:
                break
            messages.append(self._decode(arena, pos + _LENGTH.size, stop))
            self._offset += stop - pos
            pos = stop
        if pos == end and not self._kept_bytes:
            pos = end = self._end = 0
        self._start = pos
        return messages

    def _may_keep(self, size: int, stop: int) -> bool:
        """Whether `size` bytes ending at `stop` in the arena may stay a view of it: only
        while kept bytes are at least half of what the arena has received, so that a stream
        of other requests cannot have a few kept bytes hold whole arenas alive."""
        if 2 * (self._kept_bytes + size) < stop:
            return False
        self._kept_bytes += size
        return True

    def _check_length(self, length: int) -> None:
        if length > self._max_frame_size:
            raise MalformedData(
                f"frame of {length} bytes exceeds the limit of {self._max_frame_size}"
            )
        if length < self._header_size:
            raise MalformedData(
                f"frame of {length} bytes is shorter than the {self._header_size}-byte "
                f"{self._kind} header"
            )

    @abstractmethod
    def _decode(self, view: memoryview, start: int, stop: int) -> _Message:
        """The message of the frame in view[start:stop] (after its length prefix)."""


class RequestReader(FrameReader[Request]):
    """The bookie's side: decodes requests."""

    __slots__ = ()
    _kind = "request"
    _header_size = REQUEST_HEADER_SIZE

    def _decode(self, view: memoryview, start: int, stop: int) -> Request:
        _, version, op_byte, flags, request_id, scope, ledger, entry_id = _REQUEST.unpack_from(
            view, start - _LENGTH.size
        )
        operation = _operation(version, op_byte, response=False)
        try:
            _check_header(operation, flags, _RULES[operation].flags, scope, ledger, entry_id)
            body = view[start + REQUEST_HEADER_SIZE : stop]
            request = _REQUEST_DECODERS[operation](request_id, scope, ledger, entry_id, flags, body)
            if isinstance(request, AddRequest) and type(request.entry) is memoryview:
                return self._kept_or_copied(request, stop)
            return request
        except MalformedData as error:
            raise MalformedData(f"{operation.name} request {request_id}: {error}") from None

    def _kept_or_copied(self, request: AddRequest, stop: int) -> AddRequest:
        if self._may_keep(len(request.entry), stop):
            return request
        return replace(request, entry=bytes(request.entry))


class ResponseReader(FrameReader[Response]):
    """The client's side: decodes responses, errors as ErrorResponse."""

    __slots__ = ()
    _kind = "response"
    _header_size = RESPONSE_HEADER_SIZE

    def _decode(self, view: memoryview, start: int, stop: int) -> Response:
        _, version, op_byte, flags, request_id, scope, ledger, entry_id, status = (
            _RESPONSE.unpack_from(view, start - _LENGTH.size)
        )
        operation = _operation(version, op_byte, response=True)
        try:
            # A response's only flag ends a dump's stream; an error ends any request anyway.
            allowed = _STREAM_END if operation == _AVAILABILITY_DUMP else 0
            _check_header(operation, flags, allowed if not status else 0, scope, ledger, entry_id)
            ledger_id = LedgerId(scope, ledger)
            body = view[start + RESPONSE_HEADER_SIZE : stop]
            if status:
                message = _utf8(body)
                return ErrorResponse(operation, request_id, ledger_id, entry_id, status, message)
            return _RESPONSE_DECODERS[operation](request_id, ledger_id, entry_id, flags, body)
        except MalformedData as error:
            raise MalformedData(f"{operation.name} response {request_id}: {error}") from None


# --- decoding bodies ------------------------------------------------------------------------


def _decode_add(
    request_id: int, scope: int, ledger: int, entry_id: int, flags: int, body: memoryview
) -> AddRequest:
    if len(body) < _ADD_FIXED.size:
        raise MalformedData(
            f"body of {len(body)} bytes is shorter than the {_ADD_FIXED.size} bytes of master "
            "key and CRC32C before the entry"
        )
    master_key, crc = _ADD_FIXED.unpack_from(body)
    entry = body[_ADD_FIXED.size :]
    request = AddRequest(
        request_id,
        entry if len(entry) >= KEEP_IN_PLACE else bytes(entry),
        master_key,
        crc,
        bool(flags & _RECOVERY_ADD),
    )
    named = request.ledger_id
    if named.scope != scope or named.id != ledger or request.entry_id != entry_id:
        raise MalformedData(
            f"the header names ledger {LedgerId(scope, ledger)} entry {entry_id} but the entry "
            f"is ledger {named} entry {request.entry_id}"
        )
    return request


def _decode_read(
    request_id: int, scope: int, ledger: int, entry_id: int, flags: int, body: memoryview
) -> ReadRequest:
    if flags & _DO_FENCING:
        _expect_size(body, MASTER_KEY_SIZE, "a fencing read carries the master key")
        return ReadRequest(request_id, LedgerId(scope, ledger), entry_id, bytes(body))
    _expect_size(body, 0, "a read without DO_FENCING carries nothing")
    return ReadRequest(request_id, LedgerId(scope, ledger), entry_id)


def _decode_write_lac(
    request_id: int, scope: int, ledger: int, entry_id: int, flags: int, body: memoryview
) -> WriteLacRequest:
    _expect_size(body, _KEY_AND_LAC.size, "master key and LAC")
    master_key, lac = _KEY_AND_LAC.unpack_from(body)
    _check_wire_lac(lac)
    return WriteLacRequest(request_id, LedgerId(scope, ledger), master_key, lac)


def _empty_request(
    make: Callable[[int, LedgerId], Request],
) -> Callable[[int, int, int, int, int, memoryview], Request]:
    def decode(
        request_id: int, scope: int, ledger: int, entry_id: int, flags: int, body: memoryview
    ) -> Request:
        _expect_size(body, 0, "this request carries nothing")
        return make(request_id, LedgerId(scope, ledger))

    return decode


_REQUEST_DECODERS: Final[dict[int, Callable[[int, int, int, int, int, memoryview], Request]]] = {
    Operation.ADD: _decode_add,
    Operation.READ: _decode_read,
    Operation.READ_LAC: _empty_request(ReadLacRequest),
    Operation.WRITE_LAC: _decode_write_lac,
    Operation.GET_LIST_OF_ENTRIES_OF_LEDGER: _empty_request(GetListOfEntriesOfLedgerRequest),
    Operation.AVAILABILITY_DUMP: _empty_request(
        lambda request_id, _: AvailabilityDumpRequest(request_id)
    ),
    Operation.LEDGER_INFO: _empty_request(LedgerInfoRequest),
}


def _decode_read_lac_response(
    request_id: int, ledger_id: LedgerId, entry_id: int, flags: int, body: memoryview
) -> Response:
    _expect_size(body, _LAC.size, "the LAC")
    (lac,) = _LAC.unpack_from(body)
    _check_wire_lac(lac)
    return ReadLacResponse(request_id, ledger_id, lac)


def _decode_dump_response(
    request_id: int, ledger_id: LedgerId, entry_id: int, flags: int, body: memoryview
) -> Response:
    records = []
    pos, end = 0, len(body)
    while pos < end:
        if end - pos < _RECORD.size:
            raise MalformedData(
                f"record at body offset {pos} is cut: {end - pos} bytes, its header needs "
                f"{_RECORD.size}"
            )
        scope, ledger, length = _RECORD.unpack_from(body, pos)
        start = pos + _RECORD.size
        if end - start < length:
            raise MalformedData(
                f"record at body offset {pos} for ledger {LedgerId(scope, ledger)} declares "
                f"{length} bytes of availability, only {end - start} follow"
            )
        pos = start + length
        records.append(LedgerAvailability(LedgerId(scope, ledger), bytes(body[start:pos])))
    return AvailabilityDumpResponse(request_id, tuple(records), bool(flags & _STREAM_END))


def _decode_ledger_info_response(
    request_id: int, ledger_id: LedgerId, entry_id: int, flags: int, body: memoryview
) -> Response:
    _expect_size(body, _LEDGER_INFO.size, "fenced, LAC, entry count and bytes")
    fenced, lac, entry_count, byte_count = _LEDGER_INFO.unpack_from(body)
    if fenced > 1:
        raise MalformedData(f"fenced byte is {fenced}; only 0 and 1 are defined")
    _check_wire_lac(lac)
    info = LedgerInfo(bool(fenced), lac, entry_count, byte_count)
    return LedgerInfoResponse(request_id, ledger_id, info)


def _empty_response(
    make: Callable[[int, LedgerId, int], Response],
) -> Callable[[int, LedgerId, int, int, memoryview], Response]:
    def decode(
        request_id: int, ledger_id: LedgerId, entry_id: int, flags: int, body: memoryview
    ) -> Response:
        _expect_size(body, 0, "this response carries nothing")
        return make(request_id, ledger_id, entry_id)

    return decode


def _bytes_response(
    make: Callable[[int, LedgerId, int, bytes], Response],
) -> Callable[[int, LedgerId, int, int, memoryview], Response]:
    def decode(
        request_id: int, ledger_id: LedgerId, entry_id: int, flags: int, body: memoryview
    ) -> Response:
        return make(request_id, ledger_id, entry_id, bytes(body))

    return decode


_RESPONSE_DECODERS: Final[dict[int, Callable[[int, LedgerId, int, int, memoryview], Response]]] = {
    Operation.ADD: _empty_response(AddResponse),
    Operation.READ: _bytes_response(ReadResponse),
    Operation.READ_LAC: _decode_read_lac_response,
    Operation.WRITE_LAC: _empty_response(
        lambda request_id, ledger_id, _: WriteLacResponse(request_id, ledger_id)
    ),
    Operation.GET_LIST_OF_ENTRIES_OF_LEDGER: _bytes_response(
        lambda request_id, ledger_id, _, data: GetListOfEntriesOfLedgerResponse(
            request_id, ledger_id, data
        )
    ),
    Operation.AVAILABILITY_DUMP: _decode_dump_response,
    Operation.LEDGER_INFO: _decode_ledger_info_response,
}


def _operation(version: int, op_byte: int, response: bool) -> Operation:
    if version != VERSION:
        raise MalformedData(f"protocol version {version} is unknown (only {VERSION})")
    if bool(op_byte & _RESPONSE_BIT) != response:
        sent = "response" if op_byte & _RESPONSE_BIT else "request"
        expected = "response" if response else "request"
        raise MalformedData(f"a {sent} frame arrived where a {expected} was expected")
    operation = _OPERATIONS.get(op_byte & ~_RESPONSE_BIT)
    if operation is None:
        raise MalformedData(f"operation {op_byte & ~_RESPONSE_BIT} is unknown")
    return operation


_OPERATIONS: Final = {operation.value: operation for operation in Operation}
_AVAILABILITY_DUMP: Final = int(Operation.AVAILABILITY_DUMP)


def _check_header(
    operation: Operation, flags: int, allowed: int, scope: int, ledger: int, entry_id: int
) -> None:
    if flags & ~allowed:
        raise MalformedData(
            f"flags 0x{flags:04x} are not valid here (allowed: {Flags(allowed).name})"
        )
    problem = _header_problem(operation, scope, ledger, entry_id)
    if problem is not None:
        raise MalformedData(problem)


def _header_problem(operation: Operation, scope: int, ledger: int, entry_id: int) -> str | None:
    """Why these ids cannot be in a header of `operation`, if they cannot."""
    rule = _RULES[operation]
    if rule.lowest_entry is None:
        if entry_id != 0:
            return f"{operation.name} names no entry, so the entry id must be 0, not {entry_id}"
    elif entry_id < rule.lowest_entry:
        return f"entry id {entry_id} is below {rule.lowest_entry}"
    if not rule.names_ledger and (scope or ledger):
        return (
            f"{operation.name} names no ledger, so the ledger must be 0, "
            f"not {LedgerId(scope, ledger)}"
        )
    return None


def _expect_size(body: memoryview, size: int, what: str) -> None:
    if len(body) != size:
        raise MalformedData(f"body of {len(body)} bytes, expected {size} ({what})")


def _check_wire_lac(lac: int) -> None:
    if lac < -1:
        raise MalformedData(f"LAC {lac} is below -1")


def _utf8(body: memoryview) -> str:
    try:
        return str(body, "utf-8")
    except UnicodeDecodeError as error:
        raise MalformedData(
            f"error message is not UTF-8: {error.reason} at {error.start}"
        ) from None


def _byte_view(data: _Buffer) -> memoryview:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise BadRequest(f"feed takes bytes, bytearray or memoryview, not {type(data).__name__}")
    view = memoryview(data)
    if not view.c_contiguous:
        raise BadRequest("feed takes a contiguous buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


# --- encoding helpers -----------------------------------------------------------------------


def _request_frame(
    message: Request | _LedgerQuery, flags: int, body: bytes, max_frame_size: int
) -> bytes:
    size = REQUEST_HEADER_SIZE + len(body)
    _check_header_fields(message, size, max_frame_size)
    ledger_id = message.ledger_id
    return (
        _REQUEST.pack(
            size,
            VERSION,
            message.operation,
            flags,
            message.request_id,
            ledger_id.scope,
            ledger_id.id,
            message.entry_id,
        )
        + body
    )


def _response_frame(
    message: Response, flags: int, body: EntryBytes, max_frame_size: int, status: int = 0
) -> bytes:
    size = RESPONSE_HEADER_SIZE + len(body)
    _check_header_fields(message, size, max_frame_size)
    ledger_id = message.ledger_id
    return (
        _RESPONSE.pack(
            size,
            VERSION,
            message.operation | _RESPONSE_BIT,
            flags,
            message.request_id,
            ledger_id.scope,
            ledger_id.id,
            message.entry_id,
            status,
        )
        + body
    )


def _record_parts(record: LedgerAvailability) -> tuple[bytes, bytes]:
    """A dump record's header and availability bytes, refusing what would not decode back."""
    if not isinstance(record, LedgerAvailability) or not isinstance(record.ledger_id, LedgerId):
        raise BadRequest(f"a dump record must be a LedgerAvailability of a LedgerId: {record!r}")
    data = record.availability
    if type(data) is not bytes:
        raise BadRequest(f"availability of ledger {record.ledger_id} must be bytes: {data!r}")
    if len(data) > _U32:
        raise BadRequest(f"availability of ledger {record.ledger_id} is over 4 GiB")
    return _RECORD.pack(record.ledger_id.scope, record.ledger_id.id, len(data)), data


def _check_header_fields(
    message: Request | Response | _LedgerQuery, size: int, max_frame_size: int
) -> None:
    """Refuse, as BadRequest, a header that a reader would refuse as MalformedData."""
    if size > max_frame_size:
        raise BadRequest(
            f"{_name(message)}: frame of {size} bytes exceeds the limit of {max_frame_size}"
        )
    _check_int(message.request_id, 0, _U64, "request id", message)
    ledger_id = message.ledger_id
    if not isinstance(ledger_id, LedgerId):
        raise BadRequest(f"{_name(message)}: the ledger must be a LedgerId, not {ledger_id!r}")
    _check_int(message.entry_id, -1, _I64, "entry id", message)
    problem = _header_problem(message.operation, ledger_id.scope, ledger_id.id, message.entry_id)
    if problem is not None:
        raise BadRequest(f"{_name(message)}: {problem}")


def _check_master_key(key: object, message: object) -> None:
    if type(key) is not bytes or len(key) != MASTER_KEY_SIZE:
        raise BadRequest(
            f"{_name(message)}: the master key must be {MASTER_KEY_SIZE} bytes "
            "(digest.master_key(password))"
        )


def _check_int(value: object, low: int, high: int, what: str, message: object) -> None:
    if type(value) is not int or not low <= value <= high:
        raise BadRequest(f"{_name(message)}: {what} {value!r} is outside {low}..{high}")


def _as_bytes(data: object, what: str, message: object) -> bytes:
    if type(data) is not bytes:
        raise BadRequest(f"{_name(message)}: the {what} must be bytes, not {type(data).__name__}")
    return data


def _as_entry_bytes(data: object, message: object) -> EntryBytes:
    if type(data) is not bytes and type(data) is not memoryview:
        raise BadRequest(
            f"{_name(message)}: the entry must be bytes or a memoryview, not {type(data).__name__}"
        )
    return data


def _name(message: object) -> str:
    """How an error names a message: its type and request id."""
    return f"{type(message).__name__} {getattr(message, 'request_id', '?')}"
