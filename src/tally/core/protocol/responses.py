"""The responses a bookie answers with, each encoding itself into one frame (a dump's is one
frame of its stream, see dump.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, TypeAlias

from tally.core.availability import EntryAvailability
from tally.core.errors import BadRequest, TallyError, from_code
from tally.core.ids import LedgerId
from tally.core.protocol.dump import LedgerAvailability, StateRecord, dump_record_parts
from tally.core.protocol.entry_lists import LedgerEntries, record_parts
from tally.core.protocol.read_entries import encode_entries
from tally.core.protocol.requests import AddRequest, Request
from tally.core.protocol.wire import (
    ADD_RESPONSE,
    I32,
    I64,
    LAC,
    LEDGER_INFO,
    MAX_FRAME_SIZE,
    NO_FLAGS,
    NO_LEDGER,
    RESPONSE,
    RESPONSE_HEADER_SIZE,
    U64,
    VERSION,
    EntryBytes,
    Flags,
    Operation,
    as_bytes,
    as_entry_bytes,
    check_int,
    name,
    response_frame,
)


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
        return response_frame(self, NO_FLAGS, b"", max_frame_size)

    @staticmethod
    def answering(request: AddRequest) -> bytes:
        """The frame of the OK answer to a decoded `request`, packed as it is: a request
        the reader decoded has ids a header may hold, which `encode` would check again (a
        bookie answers every add so)."""
        ledger_id = request.ledger_id
        return RESPONSE.pack(
            RESPONSE_HEADER_SIZE,
            VERSION,
            ADD_RESPONSE,
            NO_FLAGS,
            request.request_id,
            ledger_id.scope,
            ledger_id.id,
            request.entry_id,
            0,
        )


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
        return response_frame(self, NO_FLAGS, as_entry_bytes(self.entry, self), max_frame_size)


@dataclass(frozen=True, slots=True)
class ReadEntriesResponse(_Response):
    """A prefix of the entries a READ_ENTRIES asked, in its order, as the bookie stored
    them; `entry_id` echoes the first asked. The reader checks each entry's digest."""

    operation: ClassVar[Operation] = Operation.READ_ENTRIES
    request_id: int
    ledger_id: LedgerId
    entry_id: int
    entries: tuple[EntryBytes, ...]

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        if not self.entries:
            raise BadRequest(f"{type(self).__name__} {self.request_id}: answers no entry")
        return response_frame(self, NO_FLAGS, encode_entries(self.entries), max_frame_size)


@dataclass(frozen=True, slots=True)
class ReadLacResponse(_Response):
    operation: ClassVar[Operation] = Operation.READ_LAC
    request_id: int
    ledger_id: LedgerId
    last_add_confirmed: int
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        check_int(self.last_add_confirmed, -1, I64, "LAC", self)
        body = LAC.pack(self.last_add_confirmed)
        return response_frame(self, NO_FLAGS, body, max_frame_size)


@dataclass(frozen=True, slots=True)
class WriteLacResponse(_Response):
    operation: ClassVar[Operation] = Operation.WRITE_LAC
    request_id: int
    ledger_id: LedgerId
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        return response_frame(self, NO_FLAGS, b"", max_frame_size)


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
        body = as_bytes(self.availability, "availability", self)
        return response_frame(self, NO_FLAGS, body, max_frame_size)


@dataclass(frozen=True, slots=True)
class GetListOfEntriesOfLedgersResponse(_Response):
    """What the bookie holds of a prefix of the ledgers asked, in their order (entry_lists.py)."""

    operation: ClassVar[Operation] = Operation.GET_LIST_OF_ENTRIES_OF_LEDGERS
    request_id: int
    records: tuple[LedgerEntries, ...]
    ledger_id: LedgerId = field(default=NO_LEDGER, init=False)
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        body = b"".join(part for record in self.records for part in record_parts(record))
        return response_frame(self, NO_FLAGS, body, max_frame_size)


@dataclass(frozen=True, slots=True)
class AvailabilityDumpResponse(_Response):
    """One batch of a dump; `stream_end` marks the last (possibly empty) batch."""

    operation: ClassVar[Operation] = Operation.AVAILABILITY_DUMP
    request_id: int
    records: tuple[LedgerAvailability, ...] | tuple[StateRecord, ...]
    stream_end: bool
    with_state: bool = False
    ledger_id: LedgerId = field(default=NO_LEDGER, init=False)
    entry_id: int = field(default=0, init=False)

    @property
    def final(self) -> bool:
        return self.stream_end

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        parts = [part for record in self.records for part in dump_record_parts(record)]
        flags = (Flags.STREAM_END if self.stream_end else Flags.NONE) | (
            Flags.WITH_STATE if self.with_state else Flags.NONE
        )
        return response_frame(self, flags, b"".join(parts), max_frame_size)


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
            raise BadRequest(f"{name(self)}: fenced must be a bool, not {info.fenced!r}")
        check_int(info.last_add_confirmed, -1, I64, "LAC", self)
        check_int(info.entry_count, 0, U64, "entry count", self)
        check_int(info.byte_count, 0, U64, "byte count", self)
        body = LEDGER_INFO.pack(
            info.fenced, info.last_add_confirmed, info.entry_count, info.byte_count
        )
        return response_frame(self, NO_FLAGS, body, max_frame_size)


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
            raise BadRequest(f"{name(self)}: {self.operation!r} is not an Operation")
        if self.code == 0:
            raise BadRequest(f"{name(self)}: status 0 means OK; an error needs its code")
        check_int(self.code, -I32 - 1, I32, "code", self)
        if type(self.message) is not str:
            raise BadRequest(f"{name(self)}: the message must be a str, not {self.message!r}")
        body = self.message.encode("utf-8", "backslashreplace")
        return response_frame(self, NO_FLAGS, body, max_frame_size, self.code)


@dataclass(frozen=True, slots=True)
class MetadataCopyResponse(_Response):
    operation: ClassVar[Operation] = Operation.METADATA_COPY
    request_id: int
    ledger_id: LedgerId
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        return response_frame(self, NO_FLAGS, b"", max_frame_size)


Response: TypeAlias = (
    AddResponse
    | ReadResponse
    | ReadEntriesResponse
    | ReadLacResponse
    | WriteLacResponse
    | GetListOfEntriesOfLedgerResponse
    | GetListOfEntriesOfLedgersResponse
    | AvailabilityDumpResponse
    | LedgerInfoResponse
    | MetadataCopyResponse
    | ErrorResponse
)
