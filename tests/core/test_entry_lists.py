"""GET_LIST_OF_ENTRIES_OF_LEDGERS: bounded requests, replies that fit a frame and answer a
prefix, and replies that cannot be matched to their question refused."""

from __future__ import annotations

import struct

import pytest

from tally.core.availability import EntryAvailability
from tally.core.errors import BadRequest, MalformedData, NoSuchLedger
from tally.core.ids import LedgerId
from tally.core.protocol import (
    MAX_LEDGERS_PER_LIST,
    REQUEST_HEADER_SIZE,
    RESPONSE_HEADER_SIZE,
    GetListOfEntriesOfLedgersRequest,
    GetListOfEntriesOfLedgersResponse,
    LedgerEntries,
    RequestReader,
    ResponseReader,
    answer_records,
    answered_prefix,
)
from tally.core.protocol.entry_lists import decode_entry_records

LEDGERS = tuple(LedgerId(1, n) for n in range(10))
HELD = EntryAvailability.span(0, 3).to_bytes()


@pytest.mark.parametrize("count", [0, MAX_LEDGERS_PER_LIST + 1])
def test_a_request_names_one_to_the_most_ledgers(count: int) -> None:
    ledgers = tuple(LedgerId(0, n) for n in range(count))
    with pytest.raises(BadRequest, match=f"{count} ledgers"):
        GetListOfEntriesOfLedgersRequest(1, ledgers).encode()
    widest = GetListOfEntriesOfLedgersRequest(1, ledgers[:MAX_LEDGERS_PER_LIST] or LEDGERS[:1])
    (decoded,) = RequestReader().feed(widest.encode())
    assert decoded == widest


@pytest.mark.parametrize("body", [b"", b"x" * 17, b"\0" * 16 * (MAX_LEDGERS_PER_LIST + 1)])
def test_a_request_body_of_no_ledger_a_cut_one_or_too_many_is_malformed(body: bytes) -> None:
    frame = GetListOfEntriesOfLedgersRequest(3, LEDGERS[:1]).encode()
    head = frame[4 : 4 + REQUEST_HEADER_SIZE]
    with pytest.raises(MalformedData, match="ledger ids"):
        RequestReader(max_frame_size=1 << 20).feed(
            struct.pack(">I", len(head) + len(body)) + head + body
        )


def test_a_reply_answers_the_prefix_that_fits_its_frame() -> None:
    answers = [LedgerEntries(ledger_id, HELD) for ledger_id in LEDGERS]
    size = answers[0].record_size
    budget = RESPONSE_HEADER_SIZE + 3 * size + size // 2
    read: list[LedgerId] = []

    def lazily() -> object:
        for answer in answers:
            read.append(answer.ledger_id)
            yield answer

    records = answer_records(lazily(), budget)  # type: ignore[arg-type]
    assert records == tuple(answers[:3])
    assert read == list(LEDGERS[:4])  # the one that did not fit, and no further
    frame = GetListOfEntriesOfLedgersResponse(5, records).encode(budget)
    assert len(frame) - 4 <= budget
    assert answered_prefix(LEDGERS, records) == records
    assert answer_records(answers) == tuple(answers)


def test_a_record_too_large_for_any_frame_is_answered_as_an_error() -> None:
    large = LedgerEntries(LEDGERS[0], b"\0" * 500)
    (record,) = answer_records([large, LedgerEntries(LEDGERS[1], HELD)], budget=300)
    assert record.ledger_id == LEDGERS[0]
    assert isinstance(record.error(), BadRequest)
    assert "over a frame of 300" in str(record.error())


def test_errors_come_back_as_their_type_and_answers_as_their_bytes() -> None:
    records = (
        LedgerEntries(LEDGERS[0], HELD),
        LedgerEntries.failed(LEDGERS[1], NoSuchLedger("not here")),
    )
    (decoded,) = ResponseReader().feed(GetListOfEntriesOfLedgersResponse(8, records).encode())
    assert isinstance(decoded, GetListOfEntriesOfLedgersResponse)
    answered, failed = decoded.records
    assert answered.error() is None
    assert answered.availability == HELD
    error = failed.error()
    assert isinstance(error, NoSuchLedger)
    assert str(error) == "not here"


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (LedgerEntries(LEDGERS[0], HELD, code=7), "carries no availability"),
        (LedgerEntries(LEDGERS[0], HELD, message="why"), "carries no message"),
        (LedgerEntries(LEDGERS[0], code=1 << 31), "not an i32"),
    ],
)
def test_records_a_reader_would_not_take_are_refused(record: LedgerEntries, reason: str) -> None:
    with pytest.raises(BadRequest, match=reason):
        GetListOfEntriesOfLedgersResponse(1, (record,)).encode()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (struct.pack(">QQiI", 1, 0, 0, 5) + b"abc", "declares 5 bytes"),
        (struct.pack(">QQi", 1, 0, 0), "is cut"),
        (struct.pack(">QQiI", 1, 0, 7, 2) + b"\xff\xfe", "not UTF-8"),
    ],
)
def test_cut_or_undecodable_records_are_malformed(body: bytes, reason: str) -> None:
    with pytest.raises(MalformedData, match=reason):
        decode_entry_records(memoryview(body))


@pytest.mark.parametrize(
    ("records", "reason"),
    [
        ((), "a reply of 0 records"),
        (tuple(LedgerEntries(ledger_id, HELD) for ledger_id in LEDGERS[:4]), "of 4 records"),
        ((LedgerEntries(LEDGERS[1], HELD),), "record 0 of the reply is of ledger"),
    ],
)
def test_a_reply_that_is_not_a_prefix_of_the_question_is_refused(
    records: tuple[LedgerEntries, ...], reason: str
) -> None:
    with pytest.raises(MalformedData, match=reason):
        answered_prefix(LEDGERS[:3], records)
