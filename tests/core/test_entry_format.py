from __future__ import annotations

import array
import contextlib
import struct

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tally.core.digest import DigestType, compute, mac_key
from tally.core.entry_format import (
    INT64_MAX,
    MAX_ENTRY_SIZE,
    Entry,
    EntryFormat,
    check_crc_digest,
    decode_entry,
    encode_entry,
    header_size,
    peek_header,
    stored_digest_type,
    verified_entry,
    verify_entry,
)
from tally.core.errors import BadDigest, BadRequest, MalformedData
from tally.core.ids import UINT64_MAX, LedgerId

KEY = mac_key(b"secret")
CLASSIC = LedgerId(0, 7)
REAL_DIGESTS = [DigestType.CRC32, DigestType.CRC32C, DigestType.HMAC]
EXTREME_HALVES = [0, 1, INT64_MAX, INT64_MAX + 1, UINT64_MAX]

halves = st.one_of(st.sampled_from(EXTREME_HALVES), st.integers(0, UINT64_MAX))
ledger_ids = st.builds(LedgerId, halves, halves)
entry_ids = st.one_of(st.sampled_from([0, 1, INT64_MAX]), st.integers(0, INT64_MAX))
lacs = st.one_of(st.sampled_from([-1, 0, INT64_MAX]), st.integers(-1, INT64_MAX))
payloads = st.binary(max_size=300)
buffers = st.sampled_from([bytes, bytearray, memoryview])


def fits_v1(ledger_id: LedgerId) -> bool:
    return ledger_id.scope == 0 and ledger_id.id <= INT64_MAX


def sample(
    digest_type: DigestType,
    format: EntryFormat | None = None,
    ledger_id: LedgerId = CLASSIC,
    payload: bytes = bytes(range(40)),
) -> bytes:
    return encode_entry(ledger_id, 3, 2, 1000, payload, digest_type, KEY, format)


# --- layout ------------------------------------------------------------------------------


def test_header_sizes() -> None:
    assert header_size(EntryFormat.V1) == 32
    assert header_size(EntryFormat.V2) == 1 + 5 * 8


def test_v1_layout_is_byte_exact() -> None:
    data = encode_entry(LedgerId(0, 0x0102), 5, 4, 77, b"pay", DigestType.CRC32C)
    header = struct.pack(">Qqqq", 0x0102, 5, 4, 77)
    assert data == header + compute(DigestType.CRC32C, b"", header, b"pay") + b"pay"
    assert len(data) == 32 + 4 + 3


def test_v2_layout_is_byte_exact() -> None:
    ledger_id = LedgerId(0xAABB, 0x0102)
    data = encode_entry(ledger_id, 5, -1, 77, b"pay", DigestType.HMAC, KEY)
    header = struct.pack(">BQQqqq", 0xA2, 0xAABB, 0x0102, 5, -1, 77)
    assert data[0] == 0x80 | 2 << 4 | DigestType.HMAC
    assert data == header + compute(DigestType.HMAC, KEY, header, b"pay") + b"pay"


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_v2_flags_carry_version_2_and_the_digest_type(digest_type: DigestType) -> None:
    flags = sample(digest_type, EntryFormat.V2)[0]
    assert flags >> 7 == 1
    assert flags >> 4 & 0x7 == 2
    assert flags & 0x0F == digest_type


# --- round trips -------------------------------------------------------------------------


@settings(max_examples=300)
@given(
    ledger_id=ledger_ids,
    entry_id=entry_ids,
    lac=lacs,
    payload=payloads,
    extra_length=st.integers(0, 1 << 40),
    digest_type=st.sampled_from(list(DigestType)),
    forced=st.sampled_from([None, EntryFormat.V1, EntryFormat.V2]),
    buffer=buffers,
)
def test_round_trip(
    ledger_id: LedgerId,
    entry_id: int,
    lac: int,
    payload: bytes,
    extra_length: int,
    digest_type: DigestType,
    forced: EntryFormat | None,
    buffer: type[bytes] | type[bytearray] | type[memoryview],
) -> None:
    assume(forced is not EntryFormat.V1 or fits_v1(ledger_id))  # else refused, tested below
    length = len(payload) + extra_length
    data = encode_entry(ledger_id, entry_id, lac, length, payload, digest_type, KEY, forced)
    expected_format = forced or (EntryFormat.V1 if fits_v1(ledger_id) else EntryFormat.V2)

    entry = decode_entry(buffer(data), digest_type, KEY)

    assert entry == Entry(ledger_id, entry_id, lac, length, payload, digest_type, expected_format)
    assert type(entry.payload) is bytes
    assert len(data) == header_size(expected_format) + digest_type.size + len(payload)
    head = peek_header(buffer(data))
    assert (head.format, head.ledger_id, head.entry_id) == (expected_format, ledger_id, entry_id)
    assert (head.last_add_confirmed, head.length) == (lac, length)
    assert head.digest_type == (digest_type if expected_format is EntryFormat.V2 else None)


@pytest.mark.parametrize("buffer", [bytearray, memoryview])
def test_payload_may_be_any_buffer(buffer: type[bytearray] | type[memoryview]) -> None:
    for digest_type in DigestType:
        data = encode_entry(LedgerId(0, 1), 0, -1, 5, buffer(b"hello"), digest_type, KEY)
        assert data == encode_entry(LedgerId(0, 1), 0, -1, 5, b"hello", digest_type, KEY)


def test_payload_buffers_count_bytes_not_items() -> None:
    words = array.array("I", [1, 2, 3])  # 3 items, 12 bytes
    data = encode_entry(LedgerId(0, 1), 0, -1, 12, memoryview(words), DigestType.CRC32C)
    assert decode_entry(data, DigestType.CRC32C).payload == words.tobytes()
    with pytest.raises(BadRequest, match="less than its payload"):
        encode_entry(LedgerId(0, 1), 0, -1, 3, memoryview(words), DigestType.CRC32C)


# --- choosing the format: the top bit --------------------------------------------------


@pytest.mark.parametrize(
    ("ledger_id", "expected"),
    [
        (LedgerId(0, 0), EntryFormat.V1),
        (LedgerId(0, INT64_MAX), EntryFormat.V1),
        (LedgerId(0, INT64_MAX + 1), EntryFormat.V2),
        (LedgerId(0, UINT64_MAX), EntryFormat.V2),
        (LedgerId(1, 0), EntryFormat.V2),
        (LedgerId(UINT64_MAX, UINT64_MAX), EntryFormat.V2),
    ],
)
def test_encoder_picks_v1_only_for_classic_ids(ledger_id: LedgerId, expected: EntryFormat) -> None:
    data = sample(DigestType.CRC32C, ledger_id=ledger_id)
    assert peek_header(data).format is expected
    assert bool(data[0] & 0x80) == (expected is EntryFormat.V2)


def test_top_bit_decides_not_a_signed_comparison() -> None:
    # The seed's `flags <= 128` test reads a signed Java byte: every V2 flags byte is
    # negative there, and 0xA3 = 163 unsigned. Both readings must land on V2.
    data = sample(DigestType.CRC32C, EntryFormat.V2)
    assert data[0] == 0xA3
    assert struct.unpack(">b", data[:1])[0] < 0
    assert peek_header(data).format is EntryFormat.V2
    # The largest V1 first byte is 0x7f: the top byte of ledger id 2^63-1.
    v1 = sample(DigestType.CRC32C, ledger_id=LedgerId(0, INT64_MAX))
    assert v1[0] == 0x7F
    assert decode_entry(v1, DigestType.CRC32C, KEY).format is EntryFormat.V1


@pytest.mark.parametrize(
    "ledger_id", [LedgerId(1, 0), LedgerId(0, INT64_MAX + 1), LedgerId(0, UINT64_MAX)]
)
def test_forcing_v1_on_an_id_it_cannot_hold_is_refused(ledger_id: LedgerId) -> None:
    with pytest.raises(BadRequest, match="V1"):
        sample(DigestType.CRC32C, EntryFormat.V1, ledger_id=ledger_id)


def test_classic_id_may_be_forced_to_v2() -> None:
    data = sample(DigestType.CRC32, EntryFormat.V2)
    entry = decode_entry(data, DigestType.CRC32, KEY)
    assert (entry.format, entry.ledger_id) == (EntryFormat.V2, LedgerId(0, 7))


# --- corruption: flips and cuts --------------------------------------------------------


@pytest.mark.parametrize("format", list(EntryFormat))
@pytest.mark.parametrize("digest_type", REAL_DIGESTS)
def test_every_single_byte_flip_is_detected(format: EntryFormat, digest_type: DigestType) -> None:
    data = sample(digest_type, format)
    for position in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            corrupt = bytearray(data)
            corrupt[position] ^= mask
            with pytest.raises((BadDigest, MalformedData)):
                decode_entry(corrupt, digest_type, KEY)


@settings(max_examples=200)
@given(
    ledger_id=ledger_ids,
    payload=st.binary(max_size=64),
    digest_type=st.sampled_from(REAL_DIGESTS),
    where=st.integers(0, 10_000),
    mask=st.integers(1, 255),
)
def test_any_flip_of_any_entry_is_detected(
    ledger_id: LedgerId, payload: bytes, digest_type: DigestType, where: int, mask: int
) -> None:
    data = bytearray(sample(digest_type, ledger_id=ledger_id, payload=payload))
    data[where % len(data)] ^= mask
    with pytest.raises((BadDigest, MalformedData)):
        decode_entry(data, digest_type, KEY)


@pytest.mark.parametrize("format", list(EntryFormat))
@pytest.mark.parametrize("digest_type", REAL_DIGESTS)
def test_every_cut_is_rejected(format: EntryFormat, digest_type: DigestType) -> None:
    data = sample(digest_type, format)
    for size in range(len(data)):
        with pytest.raises((BadDigest, MalformedData)):
            decode_entry(data[:size], digest_type, KEY)


@pytest.mark.parametrize("format", list(EntryFormat))
def test_cuts_into_the_header_are_malformed_with_any_digest(format: EntryFormat) -> None:
    for digest_type in DigestType:
        data = sample(digest_type, format)
        for size in range(header_size(format) + digest_type.size):
            with pytest.raises(MalformedData):
                decode_entry(data[:size], digest_type, KEY)


def test_appended_bytes_are_detected() -> None:
    for digest_type in REAL_DIGESTS:
        with pytest.raises(BadDigest):
            decode_entry(sample(digest_type) + b"\x00", digest_type, KEY)


@pytest.mark.parametrize("format", list(EntryFormat))
def test_dummy_does_not_detect_payload_corruption(format: EntryFormat) -> None:
    # By definition: DUMMY carries no digest. This test exists so nobody believes otherwise.
    data = bytearray(sample(DigestType.DUMMY, format, payload=b"intact"))
    data[-1] ^= 0xFF
    corrupted = decode_entry(data, DigestType.DUMMY)
    assert corrupted.payload == b"intac" + bytes([ord("t") ^ 0xFF])
    assert decode_entry(data[:-2], DigestType.DUMMY).payload == b"inta"


def test_wrong_password_is_a_bad_digest_naming_ledger_and_entry() -> None:
    for format in EntryFormat:
        data = sample(DigestType.HMAC, format, ledger_id=LedgerId(0, 42))
        with pytest.raises(BadDigest, match=r"ledger 42 entry 3"):
            decode_entry(data, DigestType.HMAC, mac_key(b"not the secret"))
    scoped = sample(DigestType.HMAC, ledger_id=LedgerId(9, 42))
    with pytest.raises(BadDigest, match=LedgerId(9, 42).qualified_name):
        decode_entry(scoped, DigestType.HMAC, mac_key(b""))


def test_hmac_without_a_key_is_refused() -> None:
    with pytest.raises(BadRequest, match="mac_key"):
        encode_entry(LedgerId(0, 1), 0, -1, 0, b"", DigestType.HMAC)
    with pytest.raises(BadRequest, match="mac_key"):
        decode_entry(sample(DigestType.HMAC), DigestType.HMAC)


# --- digest type agreement ------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "expected"),
    [(w, e) for w in DigestType for e in DigestType if w is not e],
)
def test_v2_naming_another_digest_type_is_a_bad_digest(
    written: DigestType, expected: DigestType
) -> None:
    data = sample(written, EntryFormat.V2)
    with pytest.raises(BadDigest, match=f"carries a {written.name} digest"):
        decode_entry(data, expected, KEY)


@pytest.mark.parametrize("written", REAL_DIGESTS)
def test_v1_read_with_another_digest_type_never_decodes(written: DigestType) -> None:
    data = sample(written, EntryFormat.V1)
    for expected in REAL_DIGESTS:
        if expected is not written:
            with pytest.raises((BadDigest, MalformedData)):
                decode_entry(data, expected, KEY)
    # V1 does not name its digest, so DUMMY (which checks nothing) takes the digest for payload.
    assert decode_entry(data, DigestType.DUMMY).payload == data[32:]


# --- garbage ----------------------------------------------------------------------------


def v2_with_flags(flags: int) -> bytes:
    return struct.pack(">BQQqqq", flags, 1, 2, 3, 2, 10) + bytes(50)


@pytest.mark.parametrize("version", [0, 1, 3, 7])
def test_unknown_version_is_malformed_and_named(version: int) -> None:
    data = v2_with_flags(0x80 | version << 4 | DigestType.CRC32C)
    for read in (peek_header, lambda d: decode_entry(d, DigestType.CRC32C)):
        with pytest.raises(MalformedData, match=f"version {version}"):
            read(data)
    with pytest.raises(MalformedData, match=f"version {version}"):
        peek_header(data[:1])


@pytest.mark.parametrize("code", [0, 5, 9, 15])
def test_unknown_digest_type_in_flags_is_malformed(code: int) -> None:
    data = v2_with_flags(0x80 | 2 << 4 | code)
    with pytest.raises(MalformedData, match=f"unknown digest type {code}"):
        peek_header(data)
    with pytest.raises(MalformedData, match=f"unknown digest type {code}"):
        decode_entry(data, DigestType.CRC32, KEY)


def test_oversized_is_malformed_before_any_hashing() -> None:
    data = bytearray(sample(DigestType.CRC32C))
    data[-1] ^= 1  # a digest check would say BadDigest; the size check must come first
    with pytest.raises(MalformedData, match=f"{len(data)} bytes exceeds the limit of 50"):
        decode_entry(data, DigestType.CRC32C, max_size=50)
    big = encode_entry(
        LedgerId(0, 1), 0, -1, MAX_ENTRY_SIZE, bytes(MAX_ENTRY_SIZE), DigestType.DUMMY
    )
    with pytest.raises(MalformedData, match="exceeds the limit"):
        decode_entry(big, DigestType.DUMMY)
    assert decode_entry(big, DigestType.DUMMY, max_size=len(big)).length == MAX_ENTRY_SIZE


@pytest.mark.parametrize(
    ("entry_id", "lac", "length"),
    [(-1, -1, 0), (0, -2, 0), (0, -1, -1), (-(1 << 63), 0, 0)],
)
def test_impossible_header_values_are_malformed(entry_id: int, lac: int, length: int) -> None:
    v1 = struct.pack(">Qqqq", 1, entry_id, lac, length)
    v2 = struct.pack(">BQQqqq", 0xA4, 1, 1, entry_id, lac, length)
    for data in (v1, v2):
        with pytest.raises(MalformedData, match="impossible values"):
            peek_header(data)
        with pytest.raises(MalformedData, match="impossible values"):
            decode_entry(data, DigestType.DUMMY)


def test_length_shorter_than_the_payload_is_malformed() -> None:
    data = struct.pack(">Qqqq", 1, 0, -1, 2) + b"abc"  # DUMMY: no digest to catch it
    with pytest.raises(MalformedData, match="less than its own payload"):
        decode_entry(data, DigestType.DUMMY)


def test_empty_input_is_malformed() -> None:
    for read in (peek_header, lambda d: decode_entry(d, DigestType.CRC32C)):
        with pytest.raises(MalformedData, match="empty"):
            read(b"")


@settings(max_examples=300)
@given(data=st.binary(max_size=120), digest_type=st.sampled_from(REAL_DIGESTS))
def test_random_bytes_never_decode_and_fail_cleanly(data: bytes, digest_type: DigestType) -> None:
    with pytest.raises((BadDigest, MalformedData)):
        decode_entry(data, digest_type, KEY)


@settings(max_examples=300)
@given(data=st.binary(max_size=60))
def test_peek_header_fails_only_with_malformed_data(data: bytes) -> None:
    try:
        head = peek_header(data)
    except MalformedData:
        return
    assert len(data) >= header_size(head.format)
    assert head.entry_id >= 0
    assert head.last_add_confirmed >= -1
    assert head.length >= 0


def test_non_buffer_input_is_a_bad_request() -> None:
    with pytest.raises(BadRequest, match="not str"):
        peek_header("entry")  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="contiguous"):
        peek_header(memoryview(bytes(100))[::2])


# --- peek_header does not verify ------------------------------------------------------


@pytest.mark.parametrize("format", list(EntryFormat))
def test_peek_header_reads_without_the_key_or_a_valid_digest(format: EntryFormat) -> None:
    data = bytearray(sample(DigestType.HMAC, format, ledger_id=LedgerId(0, 9)))
    data[-1] ^= 0xFF
    head = peek_header(data)
    assert (head.ledger_id, head.entry_id, head.last_add_confirmed, head.length) == (
        LedgerId(0, 9),
        3,
        2,
        1000,
    )
    assert head.digest_type == (DigestType.HMAC if format is EntryFormat.V2 else None)
    with pytest.raises(BadDigest):
        decode_entry(data, DigestType.HMAC, KEY)


# --- encoder arguments ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry_id", "lac", "length", "message"),
    [
        (-1, -1, 10, "entry id -1"),
        (INT64_MAX + 1, -1, 10, "entry id"),
        (0, -2, 10, "last add confirmed -2"),
        (0, INT64_MAX + 1, 10, "last add confirmed"),
        (0, -1, -1, "length -1"),
        (0, -1, INT64_MAX + 1, "length"),
        (0, -1, 2, "less than its payload"),
        (True, -1, 10, "must be an int"),
    ],
)
def test_encoder_refuses_out_of_range_fields(
    entry_id: int, lac: int, length: int, message: str
) -> None:
    with pytest.raises(BadRequest, match=message):
        encode_entry(LedgerId(0, 1), entry_id, lac, length, b"abc", DigestType.CRC32C)


def test_encoder_refuses_a_plain_int_ledger_id() -> None:
    with pytest.raises(BadRequest, match="LedgerId"):
        encode_entry(1, 0, -1, 0, b"", DigestType.CRC32C)  # type: ignore[arg-type]


@settings(max_examples=50)
@given(
    payload=st.binary(min_size=1, max_size=300),
    digest=st.sampled_from([DigestType.CRC32, DigestType.CRC32C]),
    data=st.data(),
)
def test_a_bookie_checks_crc_digests_of_v2_entries(
    payload: bytes, digest: DigestType, data: st.DataObject
) -> None:
    ledger_id = LedgerId(0, 5)
    entry = encode_entry(ledger_id, 1, 0, len(payload), payload, digest, format=EntryFormat.V2)
    check_crc_digest(entry)
    where = data.draw(st.integers(0, len(entry) - 1))
    bit = data.draw(st.integers(0, 7))
    changed = bytearray(entry)
    changed[where] ^= 1 << bit
    try:
        check_crc_digest(changed)
    except (BadDigest, MalformedData):
        pass  # a flip in the header may make it no V2 entry, or an impossible one
    else:
        # Only a flip of the flags byte passes: into a V1 entry or one naming a digest the
        # bookie cannot check; a reader refuses either, as not the ledger's digest type.
        assert where == 0


def test_entries_a_bookie_cannot_check_pass_unchecked() -> None:
    ledger_id = LedgerId(0, 5)
    hmac_entry = bytearray(
        encode_entry(
            ledger_id, 1, 0, 3, b"abc", DigestType.HMAC, mac_key(b"pw"), format=EntryFormat.V2
        )
    )
    v1_entry = bytearray(encode_entry(ledger_id, 1, 0, 3, b"abc", DigestType.CRC32C))
    for entry in (hmac_entry, v1_entry):
        entry[-1] ^= 0x01
        check_crc_digest(entry)  # no password, or no digest type named: not the bookie's call
    short = encode_entry(ledger_id, 1, 0, 3, b"abc", DigestType.CRC32C, format=EntryFormat.V2)
    with pytest.raises(MalformedData):
        check_crc_digest(short[:43])


# --- the digest type an entry's bytes tell (a metadata recovery without copies) ----------

CHECKABLE = {DigestType.CRC32, DigestType.CRC32C}
"""The digest types a V1 entry's bytes tell: the others need the password, or have none."""


def told(digest_type: DigestType, format: EntryFormat) -> DigestType | None:
    """What `stored_digest_type` says of an intact entry."""
    if format is EntryFormat.V2 or digest_type in CHECKABLE:
        return digest_type
    return None


@settings(max_examples=300)
@given(
    ledger_id=ledger_ids,
    payload=payloads,
    digest_type=st.sampled_from(list(DigestType)),
    format=st.sampled_from(list(EntryFormat)),
    buffer=buffers,
)
def test_an_entry_tells_its_digest_type_by_name_v2_or_by_check_v1(
    ledger_id: LedgerId,
    payload: bytes,
    digest_type: DigestType,
    format: EntryFormat,
    buffer: type[bytes] | type[bytearray] | type[memoryview],
) -> None:
    assume(format is EntryFormat.V2 or fits_v1(ledger_id))
    data = encode_entry(ledger_id, 3, 2, len(payload), payload, digest_type, KEY, format)
    assert stored_digest_type(buffer(data)) == told(digest_type, format)


@settings(max_examples=300)
@given(
    payload=st.binary(min_size=1, max_size=300),
    digest_type=st.sampled_from(list(DigestType)),
    format=st.sampled_from(list(EntryFormat)),
    where=st.integers(0, 10_000),
    mask=st.integers(1, 255),
)
def test_a_corrupt_entry_tells_its_digest_type_only_if_v2_names_it(
    payload: bytes, digest_type: DigestType, format: EntryFormat, where: int, mask: int
) -> None:
    """Past the header: a V2 entry's flags still name the type (the scrubber finds the
    corruption); a V1 entry's CRC no longer matches, so it tells nothing."""
    data = bytearray(sample(digest_type, format, payload=payload))
    start = header_size(format)
    data[start + where % (len(data) - start)] ^= mask
    assert stored_digest_type(data) == (digest_type if format is EntryFormat.V2 else None)


@settings(max_examples=200)
@given(
    digest_type=st.sampled_from(sorted(CHECKABLE)),
    where=st.integers(1, header_size(EntryFormat.V1) - 1),
    mask=st.integers(1, 255),
)
def test_a_v1_entry_with_a_corrupt_header_tells_nothing(
    digest_type: DigestType, where: int, mask: int
) -> None:
    """The digest covers the header too; a header made impossible is no entry at all."""
    data = bytearray(sample(digest_type, EntryFormat.V1))
    data[where] ^= mask
    with contextlib.suppress(MalformedData):
        assert stored_digest_type(data) is None


def test_what_is_no_entry_tells_no_digest_type_but_malformed_data() -> None:
    with pytest.raises(MalformedData):
        stored_digest_type(b"")
    with pytest.raises(MalformedData):
        stored_digest_type(sample(DigestType.CRC32C, EntryFormat.V1)[:20])
    short = sample(DigestType.CRC32, EntryFormat.V1)[: header_size(EntryFormat.V1) + 3]
    assert stored_digest_type(short) is None  # a header, but no room for either CRC


@pytest.mark.parametrize("digest_type", list(DigestType))
def test_verify_entry_checks_as_decode_entry_does_without_the_payload(
    digest_type: DigestType,
) -> None:
    """A repair verifies a copy it passes on as it is: the same checks, the header only."""
    key = KEY if digest_type is DigestType.HMAC else b""
    data = encode_entry(LedgerId(1, 9), 5, 4, 1000, b"payload" * 10, digest_type, key)
    head = verify_entry(data, digest_type, key, MAX_ENTRY_SIZE)
    assert (head.ledger_id, head.entry_id, head.last_add_confirmed) == (LedgerId(1, 9), 5, 4)
    assert verified_entry(data, head, digest_type) == decode_entry(data, digest_type, key)
    if digest_type is DigestType.DUMMY:
        return
    corrupt = bytearray(data)
    corrupt[-1] ^= 1
    with pytest.raises(BadDigest, match="digest mismatch in ledger"):
        verify_entry(bytes(corrupt), digest_type, key, MAX_ENTRY_SIZE)
    with pytest.raises(MalformedData, match="exceeds the limit"):
        verify_entry(data, digest_type, key, len(data) - 1)
