"""Ledger metadata: validation, transitions, and the versioned binary form under corruption."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import pickle
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.digest import DigestType, crc32c, master_key
from tally.core.errors import (
    BadRequest,
    InvalidMetadataTransition,
    LedgerClosed,
    LedgerDeleted,
    LedgerFenced,
    MalformedData,
    Unauthorized,
)
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import (
    FORMAT_VERSION,
    INT64_MAX,
    Deletion,
    LedgerMetadata,
    LedgerState,
    Segment,
)

PASSWORD = b"open sesame"
E3 = ("bk1:3181", "bk2:3181", "bk3:3181")
TOKEN = bytes(range(16))
CTIME = 1_700_000_000_000


def open_ledger(
    ensemble: tuple[str, ...] = E3, custom: dict[str, bytes] | None = None
) -> LedgerMetadata:
    return LedgerMetadata.create(
        ensemble=ensemble,
        write_quorum=2,
        ack_quorum=2,
        digest_type=DigestType.CRC32C,
        password=PASSWORD,
        ctime_ms=CTIME,
        creator_token=TOKEN,
        custom_metadata=custom,
    )


def three_segments() -> LedgerMetadata:
    """OPEN, segments at 0, 10 and 25; bk9 replaced bk2 at 10, bk8 replaced bk1 at 25."""
    return (
        open_ledger()
        .with_ensemble_change(10, ("bk1:3181", "bk9:3181", "bk3:3181"))
        .with_ensemble_change(25, ("bk8:3181", "bk9:3181", "bk3:3181"))
    )


def fields(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "state": LedgerState.OPEN,
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 2,
        "segments": (Segment(0, E3),),
        "digest_type": DigestType.CRC32C,
        "master_key": master_key(PASSWORD),
        "ctime_ms": CTIME,
        "creator_token": TOKEN,
    }
    base.update(overrides)
    return base


# The documented version 1 layout, written independently of the encoder.


def v1_body(
    *,
    state: int = 1,
    digest: int = 3,
    e: int = 3,
    wq: int = 2,
    aq: int = 2,
    last: int = -1,
    length: int = 0,
    ctime: int = 5,
    pwd: bytes = bytes(32),
    token: bytes = b"tok",
    segments: tuple[tuple[int, tuple[str | bytes, ...]], ...] = ((0, ("a", "b", "c")),),
    custom: tuple[tuple[str | bytes, bytes], ...] = (),
) -> bytes:
    out = struct.pack(">BBHHHqqq", state, digest, e, wq, aq, last, length, ctime) + pwd
    out += bytes([len(token)]) + token + struct.pack(">I", len(segments))
    for first, ensemble in segments:
        out += struct.pack(">q", first)
        for bookie in ensemble:
            raw = bookie if isinstance(bookie, bytes) else bookie.encode()
            out += bytes([len(raw)]) + raw
    out += struct.pack(">I", len(custom))
    for key, value in custom:
        raw = key if isinstance(key, bytes) else key.encode()
        out += struct.pack(">H", len(raw)) + raw + struct.pack(">I", len(value)) + value
    return out


def seal(body: bytes, version: int = 1) -> bytes:
    return b"TLYM" + struct.pack(">HII", version, len(body), crc32c(body)) + body


# Random valid metadata.

bookie_ids = st.text(
    st.characters(categories=("L", "N", "P", "S")), min_size=1, max_size=12
).filter(lambda text: text.isprintable())


@st.composite
def metadatas(draw: st.DrawFn) -> LedgerMetadata:
    ensemble_size = draw(st.integers(1, 5))
    write_quorum = draw(st.integers(1, ensemble_size))
    ack_quorum = draw(st.integers(1, write_quorum))
    pool = draw(
        st.lists(bookie_ids, min_size=ensemble_size, max_size=ensemble_size + 3, unique=True)
    )
    gaps = draw(st.lists(st.integers(1, 1 << 40), max_size=4))
    firsts = list(itertools.accumulate([0, *gaps]))
    segments = tuple(
        Segment(first, tuple(draw(st.permutations(pool))[:ensemble_size])) for first in firsts
    )
    state = draw(st.sampled_from(LedgerState))
    last_entry_id, length = -1, 0
    has_end = state in (LedgerState.CLOSED, LedgerState.DELETED)
    if has_end:
        last_entry_id = firsts[-1] - 1 + draw(st.integers(0, 1 << 40))
        if last_entry_id >= 0:
            length = draw(st.integers(0, INT64_MAX))
    deletion = None
    if state is LedgerState.DELETED:
        deletion = Deletion(
            draw(st.integers(0, INT64_MAX)),
            draw(st.text(min_size=1, max_size=20).filter(_encodable)),
            draw(st.integers(-1, 1 << 40)),
            draw(st.text(max_size=40).filter(_encodable)),
        )
    return LedgerMetadata(
        state=state,
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        segments=segments,
        digest_type=draw(st.sampled_from(DigestType)),
        master_key=draw(st.binary(min_size=32, max_size=32)),
        ctime_ms=draw(st.integers(0, INT64_MAX)),
        creator_token=draw(st.binary(max_size=20)),
        last_entry_id=last_entry_id,
        length=length,
        custom_metadata=draw(
            st.dictionaries(st.text(min_size=1, max_size=8), st.binary(max_size=16), max_size=4)
        ),
        archived=state is not LedgerState.OPEN and draw(st.booleans()),
        deletion=deletion,
        undeleted_ms=draw(st.integers(0, INT64_MAX)) if has_end else 0,
    )


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# Construction


def test_create_builds_an_open_ledger_keeping_the_master_key_not_the_password() -> None:
    metadata = open_ledger(custom={"app": b"pulsar"})
    assert metadata.state is LedgerState.OPEN
    assert (metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum) == (3, 2, 2)
    assert metadata.segments == (Segment(0, E3),)
    assert (metadata.last_entry_id, metadata.length) == (-1, 0)
    assert metadata.master_key == master_key(PASSWORD) != PASSWORD
    assert PASSWORD not in metadata.to_bytes()
    assert dict(metadata.custom_metadata) == {"app": b"pulsar"}


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"write_quorum": 4}, "E=3 WQ=4 AQ=2"),
        ({"ack_quorum": 3}, "E=3 WQ=2 AQ=3"),
        ({"ack_quorum": 0}, "AQ=0"),
        ({"ensemble_size": 2}, "has 3 bookies; the ensemble size is 2"),
        ({"write_quorum": True}, "write quorum must be an int"),
        ({"state": 1}, "state must be a LedgerState"),
        ({"digest_type": 3}, "digest type must be a DigestType"),
        ({"segments": ()}, "non-empty tuple of segments"),
        ({"segments": [Segment(0, E3)]}, "non-empty tuple of segments"),
        ({"segments": ((0, E3),)}, "segments must be Segment"),
        ({"segments": (Segment(1, E3),)}, "first segment starts at entry 1, not 0"),
        ({"segments": (Segment(0, E3), Segment(0, E3))}, "0 follows 0"),
        ({"segments": (Segment(0, E3), Segment(9, E3), Segment(4, E3))}, "4 follows 9"),
        ({"segments": (Segment(0, E3), Segment(5, E3[:2]))}, "segment at entry 5 has 2 bookies"),
        ({"last_entry_id": 4}, "OPEN ledger has no end yet"),
        ({"length": 10}, "OPEN ledger has no end yet"),
        ({"state": LedgerState.IN_RECOVERY, "last_entry_id": 0}, "IN_RECOVERY ledger"),
        ({"state": LedgerState.CLOSED, "last_entry_id": -2}, "last entry id -2 is outside"),
        ({"state": LedgerState.CLOSED, "last_entry_id": 3, "length": -1}, "length -1"),
        ({"state": LedgerState.CLOSED, "length": 5}, "empty closed ledger has length 0"),
        (
            {
                "state": LedgerState.CLOSED,
                "last_entry_id": 8,
                "segments": (Segment(0, E3), Segment(10, E3)),
            },
            "closed at last entry 8, but the last segment starts at entry 10",
        ),
        ({"master_key": b"short"}, "master key must be 32 bytes"),
        ({"master_key": "x" * 32}, "master key must be 32 bytes"),
        ({"ctime_ms": -1}, "ctime"),
        ({"ctime_ms": 1.5}, "ctime .* must be an int"),
        ({"creator_token": "token"}, "creator token must be bytes"),
        ({"creator_token": bytes(256)}, "creator token is 256 bytes"),
        ({"custom_metadata": [("a", b"b")]}, "custom metadata must be a mapping"),
        ({"custom_metadata": {"": b"x"}}, "custom metadata key is empty"),
        ({"custom_metadata": {1: b"x"}}, "custom metadata key must be a str"),
        ({"custom_metadata": {"k": "text"}}, "custom metadata 'k' must be bytes"),
        ({"custom_metadata": {"\ud800": b"x"}}, "not valid Unicode"),
    ],
)
def test_construction_refuses_inconsistent_metadata(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(BadRequest, match=match):
        LedgerMetadata(**fields(**overrides))


@pytest.mark.parametrize(
    ("first", "ensemble", "match"),
    [
        (-1, E3, "first entry id -1"),
        (0, (), "empty ensemble"),
        (0, list(E3), "tuple of bookie ids, not list"),
        (0, "bk1", "tuple of bookie ids, not str"),
        (0, ("a", "b", "a"), r"\['a'\] more than once"),
        (0, ("a", ""), "bookie id is empty"),
        (0, ("a", 7), "bookie id must be a str"),
        (0, ("a", "b\n"), "unprintable"),
        (0, ("a", "x" * 256), "256 bytes in UTF-8; at most 255"),
        (INT64_MAX + 1, E3, "outside"),
    ],
)
def test_segment_refuses_bad_ensembles(first: int, ensemble: Any, match: str) -> None:
    with pytest.raises(BadRequest, match=match):
        Segment(first, ensemble)


def test_any_printable_name_is_a_bookie_id() -> None:
    assert Segment(0, ("bookie-1", "10.0.0.2:3181", "böökie")).ensemble[2] == "böökie"


def test_closed_metadata_may_end_with_an_empty_segment() -> None:
    segments = (Segment(0, E3), Segment(10, ("x", "y", "z")))
    metadata = LedgerMetadata(
        **fields(state=LedgerState.CLOSED, last_entry_id=9, length=90, segments=segments)
    )
    assert metadata.segment_bounds() == ((0, 9), (10, 9))


def test_metadata_is_frozen_and_hashable() -> None:
    custom = {"b": b"2", "a": b"1"}
    metadata = open_ledger(custom=custom)
    custom["c"] = b"3"
    assert list(metadata.custom_metadata) == ["a", "b"]
    with pytest.raises(TypeError):
        metadata.custom_metadata["c"] = b"3"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        metadata.state = LedgerState.CLOSED  # type: ignore[misc]
    same = open_ledger(custom={"a": b"1", "b": b"2"})
    assert same == metadata
    assert hash(same) == hash(metadata)
    assert len({metadata, same, open_ledger()}) == 2
    assert open_ledger(custom={"a": b"other"}) != open_ledger(custom={"a": b"1"})


# Queries


def test_ensemble_at_follows_the_segments() -> None:
    metadata = three_segments()
    assert metadata.ensemble_at(0) == E3
    assert metadata.ensemble_at(9) == E3
    assert metadata.ensemble_at(10) == ("bk1:3181", "bk9:3181", "bk3:3181")
    assert metadata.ensemble_at(24) == ("bk1:3181", "bk9:3181", "bk3:3181")
    assert metadata.ensemble_at(25) == ("bk8:3181", "bk9:3181", "bk3:3181")
    assert metadata.ensemble_at(10**12) == ("bk8:3181", "bk9:3181", "bk3:3181")
    with pytest.raises(BadRequest, match="entry id -1"):
        metadata.ensemble_at(-1)


def test_ensemble_at_refuses_entries_past_the_end_of_a_closed_ledger() -> None:
    closed = three_segments().close(30, 3100)
    assert closed.ensemble_at(30) == ("bk8:3181", "bk9:3181", "bk3:3181")
    with pytest.raises(BadRequest, match=r"entry 31 is past the end .*\(last entry 30\)"):
        closed.ensemble_at(31)


def test_segment_bounds_leave_the_open_last_segment_unbounded() -> None:
    metadata = three_segments()
    assert metadata.segment_bounds() == ((0, 9), (10, 24), (25, None))
    assert metadata.start_recovery().segment_bounds()[-1] == (25, None)
    assert metadata.close(40, 1).segment_bounds() == ((0, 9), (10, 24), (25, 40))
    assert open_ledger().close(-1, 0).segment_bounds() == ((0, -1),)


@given(metadatas(), st.data())
def test_write_set_bookies_follow_the_segment_and_the_schedule(
    metadata: LedgerMetadata, data: st.DataObject
) -> None:
    last = metadata.last_entry_id if metadata.has_end else 200
    if last < 0:
        return
    entry_id = data.draw(st.integers(0, last))
    ensemble = metadata.ensemble_at(entry_id)
    e, wq = metadata.ensemble_size, metadata.write_quorum
    assert metadata.write_set_bookies(entry_id) == tuple(
        ensemble[(entry_id + k) % e] for k in range(wq)
    )


@given(metadatas())
def test_segments_with_bounds_pair_each_segment_with_its_bounds(metadata: LedgerMetadata) -> None:
    paired = metadata.segments_with_bounds()
    assert [segment for segment, _, _ in paired] == list(metadata.segments)
    assert [(first, last) for _, first, last in paired] == list(metadata.segment_bounds())


def test_bookies_are_those_of_every_segment() -> None:
    assert three_segments().bookies() == frozenset(
        {"bk1:3181", "bk2:3181", "bk3:3181", "bk8:3181", "bk9:3181"}
    )
    assert open_ledger().bookies() == frozenset(E3)


def test_check_password() -> None:
    metadata = open_ledger()
    metadata.check_password(PASSWORD)
    with pytest.raises(Unauthorized, match="wrong password for the ledger"):
        metadata.check_password(b"open sesame!")
    with pytest.raises(Unauthorized, match="wrong password for ledger 42"):
        metadata.check_password(b"", LedgerId.classic(42))
    with pytest.raises(BadRequest, match="password must be bytes"):
        metadata.check_password("open sesame")  # type: ignore[arg-type]


# Transitions


def test_ensemble_change_appends_a_segment_and_keeps_the_original() -> None:
    original = open_ledger()
    changed = original.with_ensemble_change(7, ("bk1:3181", "bk4:3181", "bk3:3181"))
    assert changed.segments == (Segment(0, E3), Segment(7, ("bk1:3181", "bk4:3181", "bk3:3181")))
    assert original.segments == (Segment(0, E3),)
    assert changed.state is LedgerState.OPEN


def test_ensemble_change_at_the_last_segments_start_replaces_it() -> None:
    metadata = three_segments().with_ensemble_change(25, ("bk7:3181", "bk9:3181", "bk3:3181"))
    assert [s.first_entry_id for s in metadata.segments] == [0, 10, 25]
    assert metadata.segments[-1].ensemble == ("bk7:3181", "bk9:3181", "bk3:3181")
    assert "bk8:3181" not in metadata.bookies()
    replaced_first = open_ledger().with_ensemble_change(0, ("x", "y", "z"))
    assert replaced_first.segments == (Segment(0, ("x", "y", "z")),)


@pytest.mark.parametrize(
    ("first", "ensemble", "match"),
    [
        (24, ("a", "b", "c"), "ensemble change at entry 24 refused: the last segment starts at"),
        (0, ("a", "b", "c"), "the last segment starts at entry 25"),
        (-1, ("a", "b", "c"), "first entry id -1"),
        (30, ("a", "b"), "segment at entry 30 has 2 bookies; the ensemble size is 3"),
        (30, ("a", "b", "a"), "more than once"),
        (30, ("a", "b", ""), "bookie id is empty"),
    ],
)
def test_ensemble_change_refuses_invalid_changes(
    first: int, ensemble: tuple[str, ...], match: str
) -> None:
    metadata = three_segments()
    with pytest.raises(InvalidMetadataTransition, match=match):
        metadata.with_ensemble_change(first, ensemble)


def test_ensemble_change_is_refused_once_recovery_or_close_has_begun() -> None:
    with pytest.raises(LedgerFenced, match="being recovered"):
        open_ledger().start_recovery().with_ensemble_change(5, ("a", "b", "c"))
    with pytest.raises(InvalidMetadataTransition, match="not in recovery"):
        open_ledger().with_ensemble_change(5, ("a", "b", "c"), recovering=True)
    recovered = (
        open_ledger().start_recovery().with_ensemble_change(5, ("a", "b", "c"), recovering=True)
    )
    assert recovered.state is LedgerState.IN_RECOVERY
    assert recovered.segments[-1] == Segment(5, ("a", "b", "c"))
    with pytest.raises(LedgerClosed, match="closed"):
        open_ledger().close(4, 40).with_ensemble_change(5, ("a", "b", "c"))


def test_replace_bookie_keeps_the_position() -> None:
    closed = three_segments().close(30, 300)
    repaired = closed.replace_bookie(1, "bk9:3181", "bk5:3181")
    assert repaired.segments[1] == Segment(10, ("bk1:3181", "bk5:3181", "bk3:3181"))
    assert repaired.segments[0] == closed.segments[0]
    assert repaired.segments[2] == closed.segments[2]
    assert (repaired.state, repaired.last_entry_id, repaired.length) == (
        LedgerState.CLOSED,
        30,
        300,
    )
    last = closed.replace_bookie(2, "bk3:3181", "bk5:3181")
    assert last.segments[2].ensemble == ("bk8:3181", "bk9:3181", "bk5:3181")


def test_replace_bookie_works_on_bounded_segments_of_unclosed_ledgers() -> None:
    for metadata in (three_segments(), three_segments().start_recovery()):
        repaired = metadata.replace_bookie(0, "bk2:3181", "bk5:3181")
        assert repaired.segments[0].ensemble == ("bk1:3181", "bk5:3181", "bk3:3181")
        assert repaired.state is metadata.state


@pytest.mark.parametrize(
    ("index", "old", "new", "match"),
    [
        (3, "bk1:3181", "bk5:3181", "segment index 3 is outside 0..2"),
        (-1, "bk1:3181", "bk5:3181", "segment index -1"),
        (0, "bk8:3181", "bk5:3181", "'bk8:3181' is not in its ensemble"),
        (0, "bk1:3181", "bk3:3181", "more than once"),
        (0, "bk1:3181", "bk1:3181", "a bookie cannot replace itself"),
        (0, "bk1:3181", "", "bookie id is empty"),
    ],
)
def test_replace_bookie_refuses_invalid_replacements(
    index: int, old: str, new: str, match: str
) -> None:
    with pytest.raises(InvalidMetadataTransition, match=match):
        three_segments().close(30, 300).replace_bookie(index, old, new)


def test_replace_bookie_refuses_the_open_last_segment() -> None:
    for metadata in (three_segments(), three_segments().start_recovery()):
        with pytest.raises(InvalidMetadataTransition, match="open last segment"):
            metadata.replace_bookie(2, "bk3:3181", "bk5:3181")


def test_start_recovery() -> None:
    recovering = three_segments().start_recovery()
    assert recovering.state is LedgerState.IN_RECOVERY
    assert recovering.segments == three_segments().segments
    assert recovering.start_recovery() is recovering
    with pytest.raises(LedgerClosed, match="last entry 30, length 300"):
        three_segments().close(30, 300).start_recovery()


@pytest.mark.parametrize("recover_first", [False, True])
def test_close(recover_first: bool) -> None:
    metadata = three_segments()
    if recover_first:
        metadata = metadata.start_recovery()
    closed = metadata.close(30, 300)
    assert (closed.state, closed.last_entry_id, closed.length) == (LedgerState.CLOSED, 30, 300)
    assert closed.segments == metadata.segments
    assert closed.is_closed
    assert not metadata.is_closed


def test_closing_again_at_the_same_end_is_a_no_op() -> None:
    closed = three_segments().close(30, 300)
    assert closed.close(30, 300) is closed


@pytest.mark.parametrize(("last", "length"), [(31, 300), (30, 301), (-1, 0)])
def test_closing_at_another_end_names_both(last: int, length: int) -> None:
    closed = three_segments().close(30, 300)
    with pytest.raises(LedgerClosed) as raised:
        closed.close(last, length)
    message = str(raised.value)
    assert "last entry 30, length 300" in message
    assert f"last entry {last}, length {length}" in message


def test_close_may_leave_an_empty_trailing_segment() -> None:
    closed = three_segments().close(24, 250)
    assert closed.segment_bounds()[-1] == (25, 24)
    assert closed.ensemble_at(24) == ("bk1:3181", "bk9:3181", "bk3:3181")
    assert "bk8:3181" in closed.bookies()


@pytest.mark.parametrize(
    ("last", "length", "match"),
    [
        (23, 240, "last entry 23, but the last segment starts at entry 25"),
        (-2, 0, "last entry id -2 is outside"),
        (30, -5, "length -5 is outside"),
        (INT64_MAX + 1, 0, "outside"),
    ],
)
def test_close_refuses_impossible_ends(last: int, length: int, match: str) -> None:
    with pytest.raises(InvalidMetadataTransition, match=match):
        three_segments().close(last, length)


def test_close_of_an_empty_ledger() -> None:
    empty = open_ledger().close(-1, 0)
    assert (empty.last_entry_id, empty.length) == (-1, 0)
    with pytest.raises(InvalidMetadataTransition, match="empty closed ledger has length 0"):
        open_ledger().close(-1, 3)


def test_with_custom_metadata_replaces_it_in_any_state() -> None:
    for metadata in (open_ledger(custom={"old": b"1"}), open_ledger().close(5, 50)):
        updated = metadata.with_custom_metadata({"new": b"2"})
        assert dict(updated.custom_metadata) == {"new": b"2"}
        assert updated.state is metadata.state
    with pytest.raises(InvalidMetadataTransition, match="custom metadata 'k' must be bytes"):
        open_ledger().with_custom_metadata({"k": "v"})  # type: ignore[dict-item]


# Serialization


def test_bytes_follow_the_documented_layout() -> None:
    metadata = LedgerMetadata(
        state=LedgerState.CLOSED,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        segments=(Segment(0, ("a", "b", "c")), Segment(7, ("a", "ü", "c"))),
        digest_type=DigestType.HMAC,
        master_key=bytes(range(32)),
        ctime_ms=123,
        creator_token=b"\x01\x02",
        last_entry_id=9,
        length=1000,
        custom_metadata={"z": b"last", "k": b""},
    )
    fields: dict[str, Any] = {
        "digest": 2,
        "wq": 3,
        "last": 9,
        "length": 1000,
        "ctime": 123,
        "pwd": bytes(range(32)),
        "token": b"\x01\x02",
        "segments": ((0, ("a", "b", "c")), (7, ("a", "ü", "c"))),
        "custom": (("k", b""), ("z", b"last")),
    }
    expected = seal(v1_body(state=3, **fields))
    assert LedgerMetadata.from_bytes(expected) == metadata
    assert expected[:6] == b"TLYM\x00\x01"
    # Version 2 appends the flags (0x01 archived, 0x02 a deletion follows) and the deletion.
    body = expected[14:]
    assert metadata.to_bytes() == seal(body + b"\x00", version=2)
    deleted = metadata.with_archived().deleted(Deletion(77, "trim", 3, "ok"))
    assert deleted.to_bytes() == seal(
        v1_body(state=4, **fields)
        + b"\x03"
        + struct.pack(">qq", 77, 3)
        + b"\x00\x04trim\x00\x02ok",
        version=2,
    )
    assert LedgerMetadata.from_bytes(deleted.to_bytes()) == deleted
    # Version 3 adds 0x04, an undelete time follows; written only for a ledger undeleted.
    undeleted = deleted.undeleted(now_ms=5_000)
    assert undeleted.to_bytes() == seal(
        v1_body(state=3, **fields) + b"\x05" + struct.pack(">q", 5_000), version=3
    )
    assert LedgerMetadata.from_bytes(undeleted.to_bytes()) == undeleted


@settings(max_examples=300, deadline=None)
@given(metadatas())
def test_round_trip(metadata: LedgerMetadata) -> None:
    data = metadata.to_bytes()
    decoded = LedgerMetadata.from_bytes(data)
    assert decoded == metadata
    assert decoded.to_bytes() == data
    assert LedgerMetadata.from_bytes(bytearray(data)) == metadata
    assert LedgerMetadata.from_bytes(memoryview(data)) == metadata


def representative() -> LedgerMetadata:
    return three_segments().with_custom_metadata({"app": b"\x00\xff", "ns": b"tenant"}).close(30, 9)


@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_flipping_any_byte_is_detected(mask: int) -> None:
    data = representative().to_bytes()
    for position in range(len(data)):
        corrupt = bytearray(data)
        corrupt[position] ^= mask
        with pytest.raises(MalformedData):
            LedgerMetadata.from_bytes(bytes(corrupt))


@settings(max_examples=200, deadline=None)
@given(metadatas(), st.data())
def test_flipping_any_byte_of_any_metadata_is_detected(
    metadata: LedgerMetadata, data: st.DataObject
) -> None:
    encoded = bytearray(metadata.to_bytes())
    position = data.draw(st.integers(0, len(encoded) - 1))
    encoded[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(MalformedData):
        LedgerMetadata.from_bytes(bytes(encoded))


def test_cutting_anywhere_is_detected() -> None:
    data = representative().to_bytes()
    for size in range(len(data)):
        with pytest.raises(MalformedData, match="truncated"):
            LedgerMetadata.from_bytes(data[:size])


@settings(max_examples=100, deadline=None)
@given(metadatas(), st.data())
def test_cutting_any_metadata_is_detected(metadata: LedgerMetadata, data: st.DataObject) -> None:
    encoded = metadata.to_bytes()
    size = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(MalformedData, match="truncated"):
        LedgerMetadata.from_bytes(encoded[:size])


def test_trailing_garbage_is_refused() -> None:
    with pytest.raises(MalformedData, match="1 bytes of trailing garbage after the"):
        LedgerMetadata.from_bytes(representative().to_bytes() + b"\x00")


def test_garbage_inside_a_checksummed_body_is_refused() -> None:
    with pytest.raises(MalformedData, match="2 unread bytes at the end of the body"):
        LedgerMetadata.from_bytes(seal(v1_body() + b"\x00\x00"))


@pytest.mark.parametrize("version", [4, 7, 0xFFFF])
def test_newer_versions_are_refused_with_a_clear_message(version: int) -> None:
    data = seal(v1_body(), version=version)
    with pytest.raises(MalformedData) as raised:
        LedgerMetadata.from_bytes(data, ledger_id=LedgerId.classic(42))
    assert str(raised.value) == (
        f"ledger 42 metadata: metadata format version {version} is newer than this tally "
        f"understands (max {FORMAT_VERSION}); upgrade tally"
    )


def test_newer_versions_are_refused_before_their_header_is_read() -> None:
    with pytest.raises(MalformedData, match="version 4 is newer"):
        LedgerMetadata.from_bytes(b"TLYM\x00\x04")


def test_version_zero_and_foreign_data_are_refused() -> None:
    with pytest.raises(MalformedData, match="unknown metadata format version 0"):
        LedgerMetadata.from_bytes(seal(v1_body(), version=0))
    with pytest.raises(MalformedData, match="not tally ledger metadata: starts with b'JSON'"):
        LedgerMetadata.from_bytes(b'JSON{"state": "OPEN"}')


def test_errors_name_the_ledger_when_given() -> None:
    qualified = LedgerId(7, 9)
    with pytest.raises(MalformedData, match=f"^ledger {qualified.qualified_name} metadata: "):
        LedgerMetadata.from_bytes(b"", ledger_id=qualified)
    with pytest.raises(MalformedData, match=r"^the ledger metadata: truncated at byte 0"):
        LedgerMetadata.from_bytes(b"")


def test_checksum_mismatch_names_both_values() -> None:
    data = bytearray(representative().to_bytes())
    data[-1] ^= 0x10
    with pytest.raises(MalformedData, match="body checksum mismatch: stored CRC32C 0x"):
        LedgerMetadata.from_bytes(bytes(data))


def test_a_valid_body_decodes() -> None:
    decoded = LedgerMetadata.from_bytes(seal(v1_body(custom=(("a", b"1"), ("b", b"")))))
    assert decoded.segments == (Segment(0, ("a", "b", "c")),)
    assert dict(decoded.custom_metadata) == {"a": b"1", "b": b""}


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (v1_body(state=0), "0 is not a valid LedgerState"),
        (v1_body(state=5), "5 is not a valid LedgerState"),
        (v1_body(digest=0), "0 is not a valid DigestType"),
        (v1_body(wq=4), "E=3 WQ=4 AQ=2"),
        (v1_body(aq=0), "AQ=0"),
        (v1_body(e=0, segments=((0, ()),)), "empty ensemble"),
        (v1_body(last=5), "OPEN ledger has no end yet"),
        (v1_body(state=3, last=-2), "last entry id -2"),
        (v1_body(state=3, length=7), "empty closed ledger has length 0"),
        (v1_body(state=3, last=3, length=-1), "length -1"),
        (v1_body(ctime=-1), "ctime"),
        (v1_body(segments=()), "non-empty tuple of segments"),
        (v1_body(segments=((1, ("a", "b", "c")),)), "first segment starts at entry 1"),
        (v1_body(segments=((0, ("a", "b", "c")), (0, ("a", "b", "c")))), "0 follows 0"),
        (v1_body(segments=((0, ("a", "b", "a")),)), "more than once"),
        (v1_body(segments=((0, ("a", "", "c")),)), "bookie id is empty"),
        (v1_body(segments=((0, ("a", "b\x00", "c")),)), "unprintable"),
        (v1_body(segments=((0, ("a", b"\xff", "c")),)), "bookie 1 of segment 0 .* not UTF-8"),
        (v1_body(custom=(("b", b""), ("a", b""))), "'a' follows 'b': keys must strictly increase"),
        (v1_body(custom=(("a", b""), ("a", b""))), "'a' follows 'a'"),
        (v1_body(custom=(("", b""),)), "custom metadata key is empty"),
        (v1_body(custom=((b"\xc3", b""),)), "custom metadata key 0 .* not UTF-8"),
    ],
)
def test_checksummed_but_invalid_values_are_refused(body: bytes, match: str) -> None:
    with pytest.raises(MalformedData, match=match):
        LedgerMetadata.from_bytes(seal(body), ledger_id=LedgerId.classic(3))


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (v1_body()[:-4] + struct.pack(">I", 2), "truncated at byte .* custom metadata key 0"),
        (v1_body()[:68] + struct.pack(">I", 9) + v1_body()[72:], "first entry id of segment 1"),
        (v1_body(token=b"")[:64] + b"\xff", "truncated at byte 79: creator token needs 255"),
    ],
)
def test_counts_and_lengths_beyond_the_body_are_refused(body: bytes, match: str) -> None:
    with pytest.raises(MalformedData, match=match):
        LedgerMetadata.from_bytes(seal(body))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_exactly_or_are_refused(data: bytes) -> None:
    for candidate in (data, b"TLYM\x00\x01" + data, seal(data)):
        try:
            metadata = LedgerMetadata.from_bytes(candidate)
        except MalformedData:
            continue
        assert metadata.to_bytes() == candidate


@settings(max_examples=200, deadline=None)
@given(metadatas(), st.data())
def test_resealed_mutations_decode_exactly_or_are_refused(
    metadata: LedgerMetadata, data: st.DataObject
) -> None:
    """With the checksum recomputed, the body parser itself must catch the damage."""
    body = bytearray(metadata.to_bytes()[14:])
    position = data.draw(st.integers(0, len(body) - 1))
    body[position] ^= data.draw(st.integers(1, 255))
    resealed = seal(bytes(body))
    try:
        decoded = LedgerMetadata.from_bytes(resealed)
    except MalformedData:
        return
    assert decoded.to_bytes() == resealed


@settings(max_examples=50, deadline=None)
@given(metadatas())
def test_pickle_and_copies_keep_the_metadata(metadata: LedgerMetadata) -> None:
    assert pickle.loads(pickle.dumps(metadata)) == metadata
    assert copy.deepcopy(metadata) == metadata
    assert copy.copy(metadata) == metadata


# The JSON view


def test_to_dict() -> None:
    view = representative().to_dict()
    assert view == {
        "state": "CLOSED",
        "ensemble_size": 3,
        "write_quorum": 2,
        "ack_quorum": 2,
        "last_entry_id": 30,
        "length": 9,
        "digest_type": "CRC32C",
        "ctime_ms": CTIME,
        "creator_token": TOKEN.hex(),
        "custom_metadata": {"app": "00ff", "ns": b"tenant".hex()},
        "archived": False,
        "deletion": None,
        "undeleted_ms": 0,
        "segments": [
            {"first_entry_id": 0, "last_entry_id": 9, "ensemble": list(E3)},
            {
                "first_entry_id": 10,
                "last_entry_id": 24,
                "ensemble": ["bk1:3181", "bk9:3181", "bk3:3181"],
            },
            {
                "first_entry_id": 25,
                "last_entry_id": 30,
                "ensemble": ["bk8:3181", "bk9:3181", "bk3:3181"],
            },
        ],
    }
    text = json.dumps(view)
    assert master_key(PASSWORD).hex() not in text
    assert "password" not in text


def test_to_dict_of_an_open_ledger_has_an_unbounded_last_segment() -> None:
    view = open_ledger().to_dict()
    assert view["state"] == "OPEN"
    assert view["segments"] == [{"first_entry_id": 0, "last_entry_id": None, "ensemble": list(E3)}]
    assert json.loads(json.dumps(view)) == view


# The delete lifecycle (BP-31)


def closed_ledger() -> LedgerMetadata:
    return open_ledger().close(30, 300)


def test_delete_then_undelete_gives_back_the_same_closed_ledger() -> None:
    closed = closed_ledger().with_archived()
    deleted = closed.deleted(Deletion(1_000, "retention", 0, "all copies there"))
    assert deleted.state is LedgerState.DELETED
    assert deleted.has_end
    assert not deleted.is_closed
    assert deleted.deleted(Deletion(2_000, "again")) is deleted
    assert deleted.ensemble_at(30) == E3
    assert deleted.to_dict()["deletion"] == {
        "time_ms": 1_000,
        "reason": "retention",
        "violations": 0,
        "detail": "all copies there",
    }
    undeleted = deleted.undeleted(now_ms=5_000)
    assert undeleted == dataclasses.replace(closed, undeleted_ms=5_000)
    assert undeleted.to_dict()["undeleted_ms"] == 5_000


def test_a_delete_and_an_undelete_are_timed_in_their_order_whatever_the_clocks() -> None:
    deleted = closed_ledger().deleted(Deletion(9_000, "retention"))
    undeleted = deleted.undeleted(now_ms=4_000)  # the undeleting client's clock is behind
    assert undeleted.undeleted_ms == 9_001
    deleted_again = undeleted.deleted(Deletion(2_000, "again"))
    assert deleted_again.deletion is not None
    assert deleted_again.deletion.time_ms == 9_002
    assert deleted_again.undeleted(now_ms=20_000).undeleted_ms == 20_000


def test_only_a_ledger_with_an_end_has_an_undelete_time() -> None:
    with pytest.raises(BadRequest, match="an OPEN ledger cannot have been undeleted"):
        dataclasses.replace(open_ledger(), undeleted_ms=1)


@pytest.mark.parametrize("state", [LedgerState.OPEN, LedgerState.IN_RECOVERY])
def test_only_a_closed_ledger_can_be_deleted_or_archived(state: LedgerState) -> None:
    metadata = open_ledger() if state is LedgerState.OPEN else open_ledger().start_recovery()
    with pytest.raises(InvalidMetadataTransition, match=f"deleting an {state.name} ledger"):
        metadata.deleted(Deletion(1, "x"))
    with pytest.raises(InvalidMetadataTransition, match="only a CLOSED ledger"):
        metadata.with_archived()
    with pytest.raises(InvalidMetadataTransition, match="not DELETED"):
        metadata.undeleted(now_ms=1)


def test_a_deleted_ledger_refuses_every_other_transition() -> None:
    deleted = closed_ledger().deleted(Deletion(1, "x"))
    with pytest.raises(LedgerDeleted):
        deleted.start_recovery()
    with pytest.raises(LedgerDeleted):
        deleted.close(30, 300)
    with pytest.raises(LedgerDeleted):
        deleted.with_ensemble_change(31, ("bk7:3181", "bk2:3181", "bk3:3181"))
    with pytest.raises(InvalidMetadataTransition, match="only a CLOSED ledger"):
        deleted.with_archived()


def test_state_and_deletion_record_must_agree() -> None:
    with pytest.raises(BadRequest, match="a DELETED ledger needs a deletion record"):
        dataclasses.replace(closed_ledger(), state=LedgerState.DELETED)
    with pytest.raises(BadRequest, match="a CLOSED ledger cannot have a deletion record"):
        dataclasses.replace(closed_ledger(), deletion=Deletion(1, "x"))
    with pytest.raises(BadRequest, match="deletion reason is empty"):
        Deletion(1, "")


def test_version_1_metadata_reads_as_not_archived_and_not_deleted() -> None:
    decoded = LedgerMetadata.from_bytes(seal(v1_body()))
    assert (decoded.archived, decoded.deletion) == (False, None)


def test_unknown_flags_are_refused() -> None:
    body = closed_ledger().to_bytes()[14:]
    with pytest.raises(MalformedData, match="unknown flags 0x04 in format version 2"):
        LedgerMetadata.from_bytes(seal(body[:-1] + b"\x04", version=2))
    with pytest.raises(MalformedData, match="unknown flags 0x08 in format version 3"):
        LedgerMetadata.from_bytes(seal(body[:-1] + b"\x08", version=3))
    with pytest.raises(MalformedData, match="format version 3 without an undelete time"):
        LedgerMetadata.from_bytes(seal(body, version=3))


def test_a_flagged_undelete_time_must_be_after_1970() -> None:
    body = closed_ledger().to_bytes()[14:]
    with pytest.raises(MalformedData, match="undelete time 0: flagged"):
        LedgerMetadata.from_bytes(seal(body[:-1] + b"\x04" + bytes(8), version=3))
