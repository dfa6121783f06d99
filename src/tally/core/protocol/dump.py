"""The availability dump: every ledger a bookie holds with its availability, as records
packed into a stream of frames one frame at a time, and read back from a frame's body.

A dump asked WITH_STATE (for a metadata recovery, issue 18) has other records, StateRecord:
first the bookie's cookie, then each ledger held with its availability, fenced flag, LAC,
master key and the copy of its metadata the bookie was given (or, without a copy, the digest
type its entries tell), then each ledger the bookie deleted under its tombstone and still
remembers. Every frame of such a dump is flagged WITH_STATE, so that its body is read as
what it is."""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tally.core.availability import EntryAvailability
from tally.core.digest import MASTER_KEY_SIZE, DigestType
from tally.core.errors import BadRequest, MalformedData
from tally.core.ids import LedgerId
from tally.core.protocol.wire import (
    MAX_FRAME_SIZE,
    NO_LEDGER,
    RESPONSE,
    RESPONSE_BIT,
    RESPONSE_HEADER_SIZE,
    U32,
    U64,
    VERSION,
    Flags,
    Operation,
)

_RECORD = struct.Struct(">QQI")


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


def record_parts(record: LedgerAvailability) -> tuple[bytes, bytes]:
    """A dump record's header and availability bytes, refusing what would not decode back."""
    if not isinstance(record, LedgerAvailability) or not isinstance(record.ledger_id, LedgerId):
        raise BadRequest(f"a dump record must be a LedgerAvailability of a LedgerId: {record!r}")
    data = record.availability
    if type(data) is not bytes:
        raise BadRequest(f"availability of ledger {record.ledger_id} must be bytes: {data!r}")
    if len(data) > U32:
        raise BadRequest(f"availability of ledger {record.ledger_id} is over 4 GiB")
    return _RECORD.pack(record.ledger_id.scope, record.ledger_id.id, len(data)), data


def decode_records(body: memoryview) -> tuple[LedgerAvailability, ...]:
    """The records of a dump frame's body; MalformedData if one is cut."""
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
    return tuple(records)


class StateKind(enum.IntEnum):
    """What a record of a dump WITH_STATE is about."""

    COOKIE = 0
    LEDGER = 1
    DELETED = 2


_STATE_RECORD = struct.Struct(">BQQBq32sII")
"""kind, scope, ledger, flags, LAC (LEDGER) or when it was deleted in ms (DELETED), master
key (zeros: none), availability length, then payload length: the metadata copy (LEDGER) or
the cookie (COOKIE)."""
_FENCED = 0x1
_HAS_MASTER_KEY = 0x2
_HAS_COPY = 0x4
_IN_LIMBO = 0x8
_DIGEST_SHIFT = 4
_DIGEST_MASK = 0xF0
"""The flags' upper nibble: the digest type's number (BookKeeper's, as in a V2 entry's flags),
0 where it is not known."""
_DIGEST_TYPES: dict[int, DigestType | None] = {0: None} | {
    digest_type << _DIGEST_SHIFT: digest_type for digest_type in DigestType
}
_LEDGER_FLAGS = _FENCED | _HAS_MASTER_KEY | _HAS_COPY | _IN_LIMBO | _DIGEST_MASK
_NO_KEY = bytes(MASTER_KEY_SIZE)


@dataclass(frozen=True, slots=True)
class StateRecord:
    """One record of a dump WITH_STATE; build it with `cookie_of`, `held` or `deleted`."""

    kind: StateKind
    ledger_id: LedgerId = NO_LEDGER
    availability: bytes = b""
    fenced: bool = False
    last_add_confirmed: int = -1
    master_key: bytes | None = None
    metadata_copy: bytes | None = None
    deleted_ms: int = 0
    cookie: bytes = b""
    digest_type: DigestType | None = None
    """The digest type the ledger's stored entries tell (`entry_format.stored_digest_type`),
    None where they do not or none was read."""
    in_limbo: bool = False
    """The bookie cannot tell an entry of it that it never had from one it lost (a failed
    ledger directory, a damaged journal): what it does not hold is unknown, not missing."""

    @classmethod
    def cookie_of(cls, cookie: bytes) -> StateRecord:
        return cls(StateKind.COOKIE, cookie=cookie)

    @classmethod
    def held(
        cls,
        ledger_id: LedgerId,
        availability: bytes,
        *,
        fenced: bool,
        last_add_confirmed: int,
        master_key: bytes | None,
        metadata_copy: bytes | None,
        digest_type: DigestType | None = None,
        in_limbo: bool = False,
    ) -> StateRecord:
        return cls(
            StateKind.LEDGER,
            ledger_id,
            availability,
            fenced,
            last_add_confirmed,
            master_key,
            metadata_copy,
            digest_type=digest_type,
            in_limbo=in_limbo,
        )

    @classmethod
    def deleted(cls, ledger_id: LedgerId, deleted_ms: int) -> StateRecord:
        return cls(StateKind.DELETED, ledger_id, deleted_ms=deleted_ms)

    @property
    def record_size(self) -> int:
        return _STATE_RECORD.size + len(self.availability) + len(self._payload)

    @property
    def _payload(self) -> bytes:
        if self.kind is StateKind.COOKIE:
            return self.cookie
        return self.metadata_copy or b""


def state_record_parts(record: StateRecord) -> tuple[bytes, bytes, bytes]:
    """A state record's header, availability and payload, refusing what would not decode
    back."""
    if not isinstance(record, StateRecord) or not isinstance(record.kind, StateKind):
        raise BadRequest(f"a dump WITH_STATE holds StateRecords: {record!r}")
    key = record.master_key
    if key is not None and (type(key) is not bytes or len(key) != MASTER_KEY_SIZE):
        raise BadRequest(f"master key of ledger {record.ledger_id} is not {MASTER_KEY_SIZE} bytes")
    digest_type = record.digest_type
    if digest_type is not None and not isinstance(digest_type, DigestType):
        raise BadRequest(f"digest type of ledger {record.ledger_id} is no DigestType")
    payload = record._payload
    for name, value in (("availability", record.availability), ("payload", payload)):
        if type(value) is not bytes or len(value) > U32:
            raise BadRequest(f"{name} of ledger {record.ledger_id} must be bytes under 4 GiB")
    number = record.deleted_ms if record.kind is StateKind.DELETED else record.last_add_confirmed
    flags = (
        (_FENCED if record.fenced else 0)
        | (_HAS_MASTER_KEY if key is not None else 0)
        | (_HAS_COPY if record.metadata_copy is not None else 0)
        | (_IN_LIMBO if record.in_limbo else 0)
        | (0 if digest_type is None else digest_type << _DIGEST_SHIFT)
    )
    header = _STATE_RECORD.pack(
        record.kind,
        record.ledger_id.scope,
        record.ledger_id.id,
        flags,
        number,
        key or _NO_KEY,
        len(record.availability),
        len(payload),
    )
    return header, record.availability, payload


def decode_state_records(body: memoryview) -> tuple[StateRecord, ...]:
    """The records of the body of a dump frame WITH_STATE; MalformedData if one is cut or
    holds what no encoder writes."""
    records = []
    pos, end = 0, len(body)
    while pos < end:
        if end - pos < _STATE_RECORD.size:
            raise MalformedData(
                f"state record at body offset {pos} is cut: {end - pos} bytes, its header "
                f"needs {_STATE_RECORD.size}"
            )
        kind, scope, ledger, flags, number, key, held, payload = _STATE_RECORD.unpack_from(
            body, pos
        )
        start = pos + _STATE_RECORD.size
        pos = start + held + payload
        if pos > end:
            raise MalformedData(
                f"state record of ledger {LedgerId(scope, ledger)} declares {held + payload} "
                f"bytes, only {end - start} follow"
            )
        ledger_id = LedgerId(scope, ledger)
        availability = bytes(body[start : start + held])
        data = bytes(body[start + held : pos])
        if kind == StateKind.COOKIE:
            record = StateRecord.cookie_of(data)
        elif kind == StateKind.DELETED:
            record = StateRecord.deleted(ledger_id, number)
        elif (
            kind == StateKind.LEDGER
            and not flags & ~_LEDGER_FLAGS
            and (flags & _DIGEST_MASK) in _DIGEST_TYPES
        ):
            record = StateRecord.held(
                ledger_id,
                availability,
                fenced=bool(flags & _FENCED),
                last_add_confirmed=number,
                master_key=key if flags & _HAS_MASTER_KEY else None,
                metadata_copy=data if flags & _HAS_COPY else None,
                digest_type=_DIGEST_TYPES[flags & _DIGEST_MASK],
                in_limbo=bool(flags & _IN_LIMBO),
            )
        else:
            raise MalformedData(f"state record of kind {kind}, flags 0x{flags:02x}: unknown")
        if b"".join(state_record_parts(record)) != body[pos - record.record_size : pos]:
            raise MalformedData(
                f"state record of ledger {ledger_id} ({record.kind.name}) holds fields its "
                "kind leaves zero"
            )
        records.append(record)
    return tuple(records)


DumpRecord = LedgerAvailability | StateRecord


def dump_record_parts(record: DumpRecord) -> tuple[bytes, ...]:
    return state_record_parts(record) if isinstance(record, StateRecord) else record_parts(record)


class AvailabilityDumpEncoder:
    """Packs a dump's records into frames of at most `budget` bytes (counted as a reader's
    limit is), so a bookie streams all its ledgers holding one frame at a time.

    `add` returns a full frame whenever the next record would not fit; `finish` returns the
    last frame, flagged STREAM_END (empty when nothing is left). A record too large for any
    frame raises BadRequest naming the ledger: the bookie answers with an ErrorResponse.
    """

    __slots__ = ("_budget", "_finished", "_flags", "_parts", "_request_id", "_size")

    def __init__(
        self, request_id: int, budget: int = MAX_FRAME_SIZE, *, with_state: bool = False
    ) -> None:
        smallest = RESPONSE_HEADER_SIZE + _RECORD.size
        if not smallest <= budget < 1 << 32:
            raise BadRequest(
                f"a dump frame budget of {budget} bytes is outside {smallest}..{(1 << 32) - 1}"
            )
        if type(request_id) is not int or not 0 <= request_id <= U64:
            raise BadRequest(f"an availability dump's request id {request_id!r} is not a u64")
        self._request_id = request_id
        self._budget = budget
        self._flags = Flags.WITH_STATE if with_state else Flags.NONE
        self._parts: list[bytes] = []
        self._size = RESPONSE_HEADER_SIZE
        self._finished = False

    def add(self, record: DumpRecord) -> bytes | None:
        self._check_open()
        if isinstance(record, StateRecord) != bool(self._flags & Flags.WITH_STATE):
            raise BadRequest(f"a {type(record).__name__} does not belong in this dump")
        parts = dump_record_parts(record)
        needed = record.record_size
        if RESPONSE_HEADER_SIZE + needed > self._budget:
            raise BadRequest(
                f"availability of ledger {record.ledger_id} takes {needed} bytes; with the "
                f"response header it does not fit a dump frame budget of {self._budget} bytes"
            )
        frame = None
        if self._size + needed > self._budget:
            frame = self._frame(self._flags)
        self._parts.extend(parts)
        self._size += needed
        return frame

    def finish(self) -> bytes:
        self._check_open()
        self._finished = True
        return self._frame(self._flags | Flags.STREAM_END)

    def _frame(self, flags: Flags) -> bytes:
        op = Operation.AVAILABILITY_DUMP | RESPONSE_BIT
        head = RESPONSE.pack(self._size, VERSION, op, flags, self._request_id, 0, 0, 0, 0)
        frame = b"".join((head, *self._parts))
        self._parts = []
        self._size = RESPONSE_HEADER_SIZE
        return frame

    def _check_open(self) -> None:
        if self._finished:
            raise BadRequest(f"the availability dump of request {self._request_id} is finished")


def encode_availability_dump(
    request_id: int,
    records: Iterable[DumpRecord],
    budget: int = MAX_FRAME_SIZE,
    *,
    with_state: bool = False,
) -> Iterator[bytes]:
    """Every frame answering a dump of `records`, read lazily (see AvailabilityDumpEncoder)."""
    encoder = AvailabilityDumpEncoder(request_id, budget, with_state=with_state)

    def frames() -> Iterator[bytes]:
        for record in records:
            frame = encoder.add(record)
            if frame is not None:
                yield frame
        yield encoder.finish()

    return frames()
