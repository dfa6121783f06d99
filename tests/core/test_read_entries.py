"""READ_ENTRIES: bounded requests with ascending entry ids, replies that answer a prefix
within a byte budget and a frame, and frames an encoder would not write refused."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.core.errors import BadRequest, MalformedData
from tally.core.ids import LedgerId
from tally.core.protocol import (
    MAX_ENTRIES_PER_READ,
    REQUEST_HEADER_SIZE,
    RESPONSE_HEADER_SIZE,
    ReadEntriesRequest,
    ReadEntriesResponse,
    RequestReader,
    ResponseReader,
    answer_entries,
)
from tally.core.protocol.read_entries import check_answered

LEDGER = LedgerId(2, 9)


@given(
    st.lists(st.integers(0, (1 << 63) - 1), min_size=1, max_size=MAX_ENTRIES_PER_READ, unique=True),
    st.integers(1, (1 << 32) - 1),
)
def test_a_request_round_trips(entry_ids: list[int], max_bytes: int) -> None:
    request = ReadEntriesRequest(5, LEDGER, tuple(sorted(entry_ids)), max_bytes)
    (decoded,) = RequestReader().feed(request.encode())
    assert decoded == request
    assert decoded.entry_id == min(entry_ids)


@pytest.mark.parametrize(
    ("entry_ids", "max_bytes", "why"),
    [
        ((), 10, "0 entries"),
        (tuple(range(MAX_ENTRIES_PER_READ + 1)), 10, f"{MAX_ENTRIES_PER_READ + 1} entries"),
        ((3, 3), 10, "ascending"),
        ((4, 2), 10, "ascending"),
        ((-1, 2), 10, "ascending"),
        ((1, 2), 0, "max_bytes"),
        ((1, 2), 1 << 32, "max_bytes"),
    ],
)
def test_a_request_the_reader_would_refuse_is_not_encoded(
    entry_ids: tuple[int, ...], max_bytes: int, why: str
) -> None:
    with pytest.raises(BadRequest, match=why):
        ReadEntriesRequest(1, LEDGER, entry_ids, max_bytes).encode()


def _request_frame(head_entry_id: int, body: bytes) -> bytes:
    head = ReadEntriesRequest(3, LEDGER, (head_entry_id,), 10).encode()[4 : 4 + REQUEST_HEADER_SIZE]
    return struct.pack(">I", len(head) + len(body)) + head + body


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"", "budget"),
        (struct.pack(">I", 10), "budget"),
        (struct.pack(">I", 10) + b"\0" * 7, "budget"),
        (struct.pack(">I", 10) + b"\0" * 8 * (MAX_ENTRIES_PER_READ + 1), "budget"),
        (struct.pack(">IQ", 0, 4), "max_bytes is 0"),
        (struct.pack(">IQ", 10, 5), "header names 4"),
        (struct.pack(">IQQ", 10, 4, 4), "ascending"),
        (struct.pack(">IQQ", 10, 4, 1 << 63), "ascending"),
    ],
)
def test_a_request_body_that_is_cut_unordered_or_disagrees_with_its_header_is_malformed(
    body: bytes, why: str
) -> None:
    with pytest.raises(MalformedData, match=why):
        RequestReader().feed(_request_frame(4, body))


def test_a_reply_round_trips_and_answers_at_least_one_entry() -> None:
    reply = ReadEntriesResponse(8, LEDGER, 4, (b"first", b"", b"x" * 70_000))
    (decoded,) = ResponseReader().feed(reply.encode())
    assert decoded == reply
    with pytest.raises(BadRequest, match="answers no entry"):
        ReadEntriesResponse(8, LEDGER, 4, ()).encode()


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"", "at least one entry"),
        (b"\0\0\0", "cut"),
        (struct.pack(">I", 5) + b"abcd", "declares 5 bytes, only 4 follow"),
        (struct.pack(">I", 1) + b"a" + struct.pack(">I", 9), "declares 9 bytes"),
    ],
)
def test_a_reply_body_that_is_cut_or_empty_is_malformed(body: bytes, why: str) -> None:
    frame = ReadEntriesResponse(8, LEDGER, 4, (b"a",)).encode()
    head = frame[4 : 4 + RESPONSE_HEADER_SIZE]
    with pytest.raises(MalformedData, match=why):
        ResponseReader().feed(struct.pack(">I", len(head) + len(body)) + head + body)


def test_a_reply_takes_entries_lazily_until_it_holds_its_budget() -> None:
    read: list[int] = []

    def entries() -> Iterator[bytes]:
        for number in range(10):
            read.append(number)
            yield bytes([number]) * 100

    answered = answer_entries(entries(), 250)
    assert answered == [bytes([n]) * 100 for n in range(3)]  # 300 bytes: the third reaches it
    assert read == [0, 1, 2], "no entry past the budget is read"


def test_a_reply_stops_before_the_entry_that_would_not_fit_its_frame() -> None:
    entries = [b"a" * 100, b"b" * 100, b"c" * 100]
    budget = RESPONSE_HEADER_SIZE + 2 * (4 + 100) + 50
    assert answer_entries(iter(entries), 1 << 20, budget) == entries[:2]
    with pytest.raises(BadRequest, match="read it alone"):
        answer_entries(iter([b"d" * 500]), 1 << 20, budget)


@pytest.mark.parametrize(
    ("asked", "answered", "ok"), [(3, 1, True), (3, 3, True), (3, 0, False), (3, 4, False)]
)
def test_a_reply_is_taken_only_if_it_can_answer_the_question(
    asked: int, answered: int, ok: bool
) -> None:
    if ok:
        check_answered(asked, answered)
    else:
        with pytest.raises(MalformedData, match=f"{answered} entries to a read of {asked}"):
            check_answered(asked, answered)
