"""The services' JSON records: deterministic bytes, and corruption always refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.errors import BadRequest, MalformedData
from tally.metadata import json_records

KIND = "test-record"
FIELDS = frozenset({"name", "count", "items", "port"})
SAMPLE = {"name": "bookie-1:3181", "count": 42, "items": ["/data/a", "/data/b"], "port": None}


def read(data: bytes) -> tuple[str, int, tuple[str, ...], int | None]:
    record = json_records.decode(data, KIND, FIELDS, "the sample")
    return (
        record.text("name"),
        record.integer("count"),
        record.texts("items"),
        record.optional_integer("port"),
    )


def test_round_trip_and_canonical_bytes() -> None:
    data = json_records.encode(KIND, SAMPLE)
    assert read(data) == ("bookie-1:3181", 42, ("/data/a", "/data/b"), None)
    assert json_records.encode(KIND, dict(reversed(SAMPLE.items()))) == data
    assert b" " not in data


@settings(max_examples=300)
@given(st.data())
def test_any_flipped_byte_is_refused(data: st.DataObject) -> None:
    encoded = bytearray(json_records.encode(KIND, SAMPLE))
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(MalformedData, match="the sample"):
        read(bytes(encoded))


def test_any_cut_is_refused() -> None:
    encoded = json_records.encode(KIND, SAMPLE)
    for length in range(len(encoded)):
        with pytest.raises(MalformedData, match="the sample"):
            read(encoded[:length])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "a JSON list"),
        (b"[" * 100_000, "not JSON"),
        (json_records.encode("other-kind", SAMPLE), "'other-kind' record"),
        (json_records.encode(KIND, {**SAMPLE, "extra": 1}), "unknown field"),
        (
            json_records.encode(KIND, {k: v for k, v in SAMPLE.items() if k != "count"}),
            "no 'count'",
        ),
        (json_records.encode(KIND, {**SAMPLE, "count": "42"}), "not an integer"),
        (json_records.encode(KIND, {**SAMPLE, "count": True}), "not an integer"),
        (json_records.encode(KIND, {**SAMPLE, "count": -1}), "below 0"),
        (json_records.encode(KIND, {**SAMPLE, "name": ""}), "empty"),
        (json_records.encode(KIND, {**SAMPLE, "items": ["a", 3]}), "non-string"),
        (b'{"kind":"test-record","format":1,"name":"x"}', "checksum"),
        (b" " * (json_records.MAX_RECORD_BYTES + 1), "too long"),
    ],
)
def test_malformed_records_say_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(MalformedData, match=message):
        read(data)


def test_a_newer_format_asks_for_an_upgrade(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_records, "FORMAT", 2)
    newer = json_records.encode(KIND, SAMPLE)
    monkeypatch.undo()
    with pytest.raises(MalformedData, match=r"format 2 is newer.*upgrade"):
        read(newer)


def test_a_string_that_is_not_unicode_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="not valid Unicode"):
        json_records.encode(KIND, {**SAMPLE, "name": "\udcff"})
    forged = b'{"kind":"test-record","format":1,"name":"\\udcff"}'
    with pytest.raises(MalformedData, match="invalid Unicode"):
        read(forged)
