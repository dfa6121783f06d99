"""GET_LIST_OF_ENTRIES_OF_LEDGERS: what a bookie holds of many ledgers, in one request and one
reply, so that the replicas check asks each bookie once per page of ledgers rather than once
per ledger (issue 21).

The request's body lists 1..MAX_LEDGERS_PER_LIST ledgers (scope u64, ledger u64 each). The
reply answers a prefix of them, in the order asked, as records (scope u64, ledger u64,
status i32, length u32, then the availability encoding when the status is 0, else the
error's message in UTF-8), as many as fit the frame: the asker asks again for the rest
(`answered_prefix`). A record that alone would not fit a frame is answered as a BadRequest
record instead, so every reply answers at least one ledger.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from tally.core.errors import BadRequest, MalformedData, TallyError, from_code
from tally.core.ids import LedgerId
from tally.core.protocol.wire import I32, MAX_FRAME_SIZE, RESPONSE_HEADER_SIZE, U32, U64

MAX_LEDGERS_PER_LIST: Final = 128
"""Ledgers one request may name: the bookie looks them up in one turn of its event loop
(a few milliseconds at most; an AVAILABILITY_DUMP yields every 64 ledgers)."""

_LEDGER = struct.Struct(">QQ")
_RECORD = struct.Struct(">QQiI")


@dataclass(frozen=True, slots=True)
class LedgerEntries:
    """One ledger's answer: its availability encoding (`code` 0), or the error the bookie met
    looking it up (`code` and `message`, as an ErrorResponse carries them)."""

    ledger_id: LedgerId
    availability: bytes = b""
    code: int = 0
    message: str = ""

    @classmethod
    def failed(cls, ledger_id: LedgerId, error: TallyError) -> LedgerEntries:
        return cls(ledger_id, code=error.code, message=str(error))

    def error(self) -> TallyError | None:
        """The bookie's error for this ledger, rebuilt by code; None when it answered."""
        return from_code(self.code, self.message) if self.code else None

    @property
    def record_size(self) -> int:
        return _RECORD.size + len(self._payload)

    @property
    def _payload(self) -> bytes:
        return self.message.encode() if self.code else self.availability


def encode_ledger_ids(ledger_ids: Sequence[LedgerId], message: object) -> bytes:
    """A request's body; BadRequest for what a reader would refuse."""
    if not 1 <= len(ledger_ids) <= MAX_LEDGERS_PER_LIST:
        raise BadRequest(
            f"{type(message).__name__}: {len(ledger_ids)} ledgers, expected "
            f"1..{MAX_LEDGERS_PER_LIST}"
        )
    for ledger_id in ledger_ids:
        if not isinstance(ledger_id, LedgerId):
            raise BadRequest(f"{type(message).__name__}: {ledger_id!r} is not a LedgerId")
    return b"".join(_LEDGER.pack(ledger_id.scope, ledger_id.id) for ledger_id in ledger_ids)


def decode_ledger_ids(body: memoryview) -> tuple[LedgerId, ...]:
    count, rest = divmod(len(body), _LEDGER.size)
    if rest or not 1 <= count <= MAX_LEDGERS_PER_LIST:
        raise MalformedData(
            f"body of {len(body)} bytes, expected 1..{MAX_LEDGERS_PER_LIST} ledger ids of "
            f"{_LEDGER.size} bytes"
        )
    return tuple(LedgerId(scope, ledger) for scope, ledger in _LEDGER.iter_unpack(body))


def record_parts(record: LedgerEntries) -> tuple[bytes, bytes]:
    """A record's header and payload, refusing what would not decode back."""
    if not isinstance(record, LedgerEntries) or not isinstance(record.ledger_id, LedgerId):
        raise BadRequest(f"a list record must be a LedgerEntries of a LedgerId: {record!r}")
    if type(record.code) is not int or not -I32 - 1 <= record.code <= I32:
        raise BadRequest(f"status {record.code!r} of ledger {record.ledger_id} is not an i32")
    if record.code and record.availability:
        raise BadRequest(f"ledger {record.ledger_id}: an error record carries no availability")
    if not record.code and record.message:
        raise BadRequest(f"ledger {record.ledger_id}: an answered record carries no message")
    payload = record._payload
    if type(payload) is not bytes or len(payload) > U32:
        raise BadRequest(f"availability of ledger {record.ledger_id} must be bytes under 4 GiB")
    ledger_id = record.ledger_id
    if not (0 <= ledger_id.scope <= U64 and 0 <= ledger_id.id <= U64):
        raise BadRequest(f"ledger {ledger_id} is outside the wire's u64 ids")
    return _RECORD.pack(ledger_id.scope, ledger_id.id, record.code, len(payload)), payload


def decode_entry_records(body: memoryview) -> tuple[LedgerEntries, ...]:
    """The records of a reply's body; MalformedData if one is cut or is not UTF-8."""
    records = []
    pos, end = 0, len(body)
    while pos < end:
        if end - pos < _RECORD.size:
            raise MalformedData(f"list record at body offset {pos} is cut: {end - pos} bytes")
        scope, ledger, code, length = _RECORD.unpack_from(body, pos)
        start = pos + _RECORD.size
        pos = start + length
        if pos > end:
            raise MalformedData(
                f"list record of ledger {LedgerId(scope, ledger)} declares {length} bytes, "
                f"only {end - start} follow"
            )
        ledger_id = LedgerId(scope, ledger)
        if not code:
            records.append(LedgerEntries(ledger_id, bytes(body[start:pos])))
            continue
        try:
            message = str(body[start:pos], "utf-8")
        except UnicodeDecodeError as error:
            raise MalformedData(
                f"ledger {ledger_id}: error message is not UTF-8: {error}"
            ) from None
        records.append(LedgerEntries(ledger_id, code=code, message=message))
    return tuple(records)


def answer_records(
    answers: Iterable[LedgerEntries], budget: int = MAX_FRAME_SIZE
) -> tuple[LedgerEntries, ...]:
    """The records of one reply: `answers`, read lazily, while they fit a frame of `budget`
    bytes; the first, if it alone does not fit, as a BadRequest record."""
    records: list[LedgerEntries] = []
    size = RESPONSE_HEADER_SIZE
    for record in answers:
        if size + record.record_size <= budget:
            records.append(record)
            size += record.record_size
            continue
        if not records:
            error = BadRequest(
                f"the availability of ledger {record.ledger_id} takes {record.record_size} "
                f"bytes, over a frame of {budget}"
            )
            records.append(LedgerEntries.failed(record.ledger_id, error))
        break
    return tuple(records)


def answered_prefix(
    asked: Sequence[LedgerId], records: tuple[LedgerEntries, ...]
) -> tuple[LedgerEntries, ...]:
    """`records` if they answer a non-empty prefix of `asked`, in order; else MalformedData
    (the reply cannot be matched to the question, so none of it is taken)."""
    if not records or len(records) > len(asked):
        raise MalformedData(f"a reply of {len(records)} records to a list of {len(asked)} ledgers")
    for position, (ledger_id, record) in enumerate(zip(asked, records, strict=False)):
        if record.ledger_id != ledger_id:
            raise MalformedData(
                f"record {position} of the reply is of ledger {record.ledger_id}, "
                f"{ledger_id} was asked"
            )
    return records
