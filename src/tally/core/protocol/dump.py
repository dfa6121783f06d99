"""The availability dump: every ledger a bookie holds with its availability, as records
packed into a stream of frames one frame at a time, and read back from a frame's body."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tally.core.availability import EntryAvailability
from tally.core.errors import BadRequest, MalformedData
from tally.core.ids import LedgerId
from tally.core.protocol.wire import (
    MAX_FRAME_SIZE,
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
        if type(request_id) is not int or not 0 <= request_id <= U64:
            raise BadRequest(f"an availability dump's request id {request_id!r} is not a u64")
        self._request_id = request_id
        self._budget = budget
        self._parts: list[bytes] = []
        self._size = RESPONSE_HEADER_SIZE
        self._finished = False

    def add(self, record: LedgerAvailability) -> bytes | None:
        self._check_open()
        parts = record_parts(record)
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
