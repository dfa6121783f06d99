"""The journal's on-disk format on bytes alone: frames, headers, and how a scan of a file's
records tells a torn tail from damage."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.bookie.journal_format import (
    FRAME_SIZE,
    HEADER_SIZE,
    SCAN_CHUNK,
    Damage,
    FileHeader,
    JournalMark,
    Scan,
    find_record,
    frame,
    record_at,
    scan_records,
)
from tally.core.digest import crc32c
from tally.core.errors import BadRequest, MalformedData

FILE_ID = 7


def record_bytes(payload: bytes, head_size: int = 0) -> bytes:
    head, body = payload[:head_size], payload[head_size:]
    return frame(head, len(body), crc32c(body)) + body


def image(payloads: list[bytes], zeros: int = 4096) -> tuple[bytearray, list[int]]:
    """A journal file: header, the records, preallocated zeros; and where each record ends."""
    data = bytearray(FileHeader(FILE_ID, 0, 0).to_bytes())
    ends = []
    for index, payload in enumerate(payloads):
        data += record_bytes(payload, head_size=min(len(payload), index % 5))
        ends.append(len(data))
    data += bytes(zeros)
    return data, ends


def scan(data: bytes, *, end: int | None = None) -> tuple[list[tuple[JournalMark, bytes]], Scan]:
    view = memoryview(bytes(data))
    records: Generator[tuple[JournalMark, bytes], None, Scan] = scan_records(
        view, FILE_ID, HEADER_SIZE, len(data) if end is None else end, end_recorded=end is not None
    )
    found = []
    while True:
        try:
            found.append(next(records))
        except StopIteration as done:
            return found, done.value


payload_lists = st.lists(st.binary(max_size=300), min_size=1, max_size=12)


@given(payload_lists)
def test_every_record_reads_back_with_the_mark_of_its_end(payloads: list[bytes]) -> None:
    data, ends = image(payloads)
    found, result = scan(data)
    assert found == [(JournalMark(FILE_ID, end), p) for end, p in zip(ends, payloads, strict=True)]
    assert result == Scan(ends[-1], None, ())
    recorded, result = scan(data, end=ends[-1])
    assert recorded == found
    assert result == Scan(ends[-1], None, ())


@settings(max_examples=200)
@given(payload_lists, st.data())
def test_a_flipped_byte_is_a_torn_tail_at_the_end_and_damage_before_it(
    payloads: list[bytes], data_strategy: st.DataObject
) -> None:
    data, ends = image(payloads)
    starts = [HEADER_SIZE, *ends[:-1]]
    offset = data_strategy.draw(st.integers(HEADER_SIZE, ends[-1] - 1))
    data[offset] ^= data_strategy.draw(st.integers(1, 255))
    hit = next(i for i, end in enumerate(ends) if offset < end)
    found, result = scan(data)
    others = [
        (JournalMark(FILE_ID, end), p)
        for i, (end, p) in enumerate(zip(ends, payloads, strict=True))
        if i != hit
    ]
    if hit == len(payloads) - 1:
        assert found == others
        assert result.end == starts[hit]
        assert result.torn is not None
        assert result.damage == ()
    else:
        assert found == others
        assert result.damage == (Damage(FILE_ID, starts[hit], ends[hit], result.damage[0].problem),)
        assert result.end == ends[-1]
        assert result.torn is None
    # With its end recorded by a successor, the last record's damage is damage too.
    found, result = scan(data, end=ends[-1])
    assert found == others
    assert [(d.start, d.end) for d in result.damage] == [(starts[hit], ends[hit])]


def test_zeros_after_the_records_are_a_clean_end_and_zeros_before_a_record_are_damage() -> None:
    data, ends = image([b"a", b"b", b"c"])
    start_of_b = ends[0]
    data[start_of_b : ends[1]] = bytes(ends[1] - start_of_b)
    found, result = scan(data)
    assert [p for _, p in found] == [b"a", b"c"]
    assert [(d.start, d.end, d.problem) for d in result.damage] == [
        (start_of_b, ends[1], "no record (zeros)")
    ]
    data[start_of_b:] = bytes(len(data) - start_of_b)
    found, result = scan(data)
    assert [p for _, p in found] == [b"a"]
    assert result == Scan(start_of_b, None, ())


def test_a_file_cut_inside_a_frame_is_a_torn_tail() -> None:
    data, ends = image([b"kept", b"cut"], zeros=0)
    found, result = scan(data[: ends[0] + 4])
    assert [p for _, p in found] == [b"kept"]
    assert result.end == ends[0]
    assert result.torn == "a record frame cut short (4 bytes)"


def test_find_record_skips_garbage_and_zeros_to_the_next_valid_frame() -> None:
    record = record_bytes(b"the next record", head_size=3)
    garbage = os.urandom(5000)
    data = memoryview(garbage + bytes(3000) + record + bytes(100))
    assert find_record(data, 0, len(data)) == 8000
    assert find_record(data, 8001, len(data)) is None
    assert find_record(memoryview(bytes(10 * SCAN_CHUNK)), 0, 10 * SCAN_CHUNK) is None
    # A record that would end past the bound is no record.
    assert find_record(data, 0, 8000 + len(record) - 1) is None


def test_find_record_crosses_its_chunks() -> None:
    record = record_bytes(b"x" * 50)
    at = SCAN_CHUNK - 3  # the frame straddles the first chunk's end
    data = memoryview(os.urandom(at) + record + os.urandom(SCAN_CHUNK))
    assert find_record(data, 0, len(data)) == at
    assert not isinstance(record_at(data, at, len(data)), str)


def test_headers_round_trip_and_refuse_what_is_not_theirs() -> None:
    header = FileHeader(5, 4, 1234)
    raw = header.to_bytes()
    assert len(raw) == HEADER_SIZE
    assert FileHeader.from_bytes(raw, 5, "f") == header
    with pytest.raises(MalformedData, match="header says journal file"):
        FileHeader.from_bytes(raw, 6, "f")
    with pytest.raises(MalformedData, match="fails its checksum"):
        FileHeader.from_bytes(raw[:-1] + bytes([raw[-1] ^ 1]), 5, "f")
    with pytest.raises(MalformedData, match="shorter than"):
        FileHeader.from_bytes(raw[:10], 5, "f")


def test_frames_refuse_oversized_heads() -> None:
    with pytest.raises(BadRequest):
        frame(bytes(2**16), 0, 0)
    assert len(frame(b"", 0, crc32c(b""))) == FRAME_SIZE
