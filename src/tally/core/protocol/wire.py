"""The frame's fixed parts: version, operations, flags, header layouts, what a header may hold
for each operation, and building a frame around a body. Messages, decoders and readers share
them, so each layout is written once."""

from __future__ import annotations

import enum
import struct
from typing import Final, NamedTuple, Protocol, TypeAlias

from tally.core.digest import MASTER_KEY_SIZE
from tally.core.errors import BadRequest, MalformedData
from tally.core.ids import LedgerId

VERSION: Final = 1
EntryBytes: TypeAlias = bytes | memoryview
"""An entry's bytes: a large one stays a view of the arena it was received into (see
KEEP_IN_PLACE), which nobody writes to again while the view lives."""
MAX_FRAME_SIZE: Final = 5 * 1024 * 1024
"""Default largest frame, counted after the length prefix (BookKeeper's default)."""

LENGTH = struct.Struct(">I")
REQUEST = struct.Struct(">IBBHQQQq")  # length prefix, then the request header
RESPONSE = struct.Struct(">IBBHQQQqi")  # length prefix, then the response header
REQUEST_HEADER_SIZE: Final = REQUEST.size - LENGTH.size
RESPONSE_HEADER_SIZE: Final = RESPONSE.size - LENGTH.size
ADD = struct.Struct(">IBBHQQQq32sI")  # an ADD request frame up to its entry
REQUEST_ID = struct.Struct(">Q")
REQUEST_ID_OFFSET: Final = struct.calcsize(">IBBH")
"""Where a request frame's id is: after the length prefix, version, operation and flags."""
ADD_FIXED = struct.Struct(">32sI")  # the ADD body before the entry
KEY_AND_LAC = struct.Struct(">32sq")
LAC = struct.Struct(">q")
LEDGER_INFO = struct.Struct(">BqQQ")
RESPONSE_BIT = 0x80
NO_LEDGER = LedgerId(0, 0)
U32: Final = (1 << 32) - 1
U64: Final = (1 << 64) - 1
I32: Final = (1 << 31) - 1
I64: Final = (1 << 63) - 1


class Operation(enum.IntEnum):
    """The operation byte of a frame; numbers are stable."""

    ADD = 1
    READ = 2
    READ_LAC = 3
    WRITE_LAC = 4
    GET_LIST_OF_ENTRIES_OF_LEDGER = 5
    AVAILABILITY_DUMP = 6
    LEDGER_INFO = 7
    METADATA_COPY = 8
    GET_LIST_OF_ENTRIES_OF_LEDGERS = 9
    READ_ENTRIES = 10


ADD_RESPONSE: Final = int(Operation.ADD) | RESPONSE_BIT
"""The operation byte of an ADD's answer: what the short paths for adds look for."""


class Flags(enum.IntFlag):
    """Header flags. Messages expose them as fields (`recovery`, `master_key`, `stream_end`)."""

    NONE = 0
    DO_FENCING = 0x1
    RECOVERY_ADD = 0x2
    STREAM_END = 0x4
    WITH_STATE = 0x8
    """An availability dump of each ledger's state too, and of the bookie's cookie and
    deleted ledgers: what a metadata recovery needs (dump.py's StateRecord)."""


# Plain ints for the hot paths: IntFlag arithmetic, and even looking a member up on its
# class, cost more than the rest of a small frame.
NO_FLAGS: Final = int(Flags.NONE)
DO_FENCING: Final = int(Flags.DO_FENCING)
RECOVERY_ADD: Final = int(Flags.RECOVERY_ADD)
STREAM_END: Final = int(Flags.STREAM_END)
WITH_STATE: Final = int(Flags.WITH_STATE)


class _Rule(NamedTuple):
    """What a header may hold for an operation."""

    flags: int
    """The request flags the operation allows."""
    lowest_entry: int | None
    """The smallest entry id, or None when the operation names no entry (entry id 0)."""
    names_ledger: bool


RULES: Final = {
    Operation.ADD: _Rule(RECOVERY_ADD, 0, True),
    Operation.READ: _Rule(DO_FENCING, -1, True),
    Operation.READ_LAC: _Rule(0, None, True),
    Operation.WRITE_LAC: _Rule(0, None, True),
    Operation.GET_LIST_OF_ENTRIES_OF_LEDGER: _Rule(0, None, True),
    Operation.AVAILABILITY_DUMP: _Rule(WITH_STATE, None, False),
    Operation.LEDGER_INFO: _Rule(0, None, True),
    Operation.METADATA_COPY: _Rule(0, None, True),
    Operation.GET_LIST_OF_ENTRIES_OF_LEDGERS: _Rule(0, None, False),
    Operation.READ_ENTRIES: _Rule(0, 0, True),
}


class HeaderFields(Protocol):
    """What a frame's header is built from: every request and response has these."""

    @property
    def operation(self) -> Operation: ...
    @property
    def request_id(self) -> int: ...
    @property
    def ledger_id(self) -> LedgerId: ...
    @property
    def entry_id(self) -> int: ...


# --- reading a header -----------------------------------------------------------------------


def frame_operation(version: int, op_byte: int, response: bool) -> Operation:
    if version != VERSION:
        raise MalformedData(f"protocol version {version} is unknown (only {VERSION})")
    if bool(op_byte & RESPONSE_BIT) != response:
        sent = "response" if op_byte & RESPONSE_BIT else "request"
        expected = "response" if response else "request"
        raise MalformedData(f"a {sent} frame arrived where a {expected} was expected")
    operation = _OPERATIONS.get(op_byte & ~RESPONSE_BIT)
    if operation is None:
        raise MalformedData(f"operation {op_byte & ~RESPONSE_BIT} is unknown")
    return operation


_OPERATIONS: Final = {operation.value: operation for operation in Operation}


def check_header(
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
    rule = RULES[operation]
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


# --- building a frame -----------------------------------------------------------------------


def request_frame(message: HeaderFields, flags: int, body: bytes, max_frame_size: int) -> bytes:
    size = REQUEST_HEADER_SIZE + len(body)
    check_header_fields(message, size, max_frame_size)
    ledger_id = message.ledger_id
    return (
        REQUEST.pack(
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


def response_frame(
    message: HeaderFields, flags: int, body: EntryBytes, max_frame_size: int, status: int = 0
) -> bytes:
    size = RESPONSE_HEADER_SIZE + len(body)
    check_header_fields(message, size, max_frame_size)
    ledger_id = message.ledger_id
    return (
        RESPONSE.pack(
            size,
            VERSION,
            message.operation | RESPONSE_BIT,
            flags,
            message.request_id,
            ledger_id.scope,
            ledger_id.id,
            message.entry_id,
            status,
        )
        + body
    )


def check_header_fields(message: HeaderFields, size: int, max_frame_size: int) -> None:
    """Refuse, as BadRequest, a header that a reader would refuse as MalformedData."""
    if size > max_frame_size:
        raise BadRequest(
            f"{name(message)}: frame of {size} bytes exceeds the limit of {max_frame_size}"
        )
    check_int(message.request_id, 0, U64, "request id", message)
    ledger_id = message.ledger_id
    if not isinstance(ledger_id, LedgerId):
        raise BadRequest(f"{name(message)}: the ledger must be a LedgerId, not {ledger_id!r}")
    check_int(message.entry_id, -1, I64, "entry id", message)
    problem = _header_problem(message.operation, ledger_id.scope, ledger_id.id, message.entry_id)
    if problem is not None:
        raise BadRequest(f"{name(message)}: {problem}")


def check_master_key(key: object, message: object) -> None:
    if type(key) is not bytes or len(key) != MASTER_KEY_SIZE:
        raise BadRequest(
            f"{name(message)}: the master key must be {MASTER_KEY_SIZE} bytes "
            "(digest.master_key(password))"
        )


def check_int(value: object, low: int, high: int, what: str, message: object) -> None:
    if type(value) is not int or not low <= value <= high:
        raise BadRequest(f"{name(message)}: {what} {value!r} is outside {low}..{high}")


def as_bytes(data: object, what: str, message: object) -> bytes:
    if type(data) is not bytes:
        raise BadRequest(f"{name(message)}: the {what} must be bytes, not {type(data).__name__}")
    return data


def as_entry_bytes(data: object, message: object) -> EntryBytes:
    if type(data) is not bytes and type(data) is not memoryview:
        raise BadRequest(
            f"{name(message)}: the entry must be bytes or a memoryview, not {type(data).__name__}"
        )
    return data


def name(message: object) -> str:
    """How an error names a message: its type and request id."""
    return f"{type(message).__name__} {getattr(message, 'request_id', '?')}"
