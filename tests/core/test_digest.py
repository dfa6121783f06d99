from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.digest import (
    DigestType,
    LedgerKeys,
    compute,
    crc32c,
    mac_key,
    master_key,
)
from tally.core.errors import BadRequest

CHECK_INPUT = b"123456789"  # the standard CRC check string


def test_numbers_are_bookkeepers() -> None:
    assert {t.name: t.value for t in DigestType} == {
        "CRC32": 1,
        "HMAC": 2,
        "CRC32C": 3,
        "DUMMY": 4,
    }


def test_crc32_check_value_as_a_bookkeeper_long() -> None:
    assert compute(DigestType.CRC32, b"", CHECK_INPUT) == (0xCBF43926).to_bytes(8, "big")


def test_crc32c_check_value() -> None:
    assert crc32c(CHECK_INPUT) == 0xE3069283
    assert compute(DigestType.CRC32C, b"", CHECK_INPUT) == bytes.fromhex("e3069283")


def test_crc32c_chains_and_reads_memoryviews() -> None:
    assert crc32c(b"6789", crc32c(b"12345")) == 0xE3069283
    assert crc32c(memoryview(CHECK_INPUT)) == 0xE3069283


def test_crc32c_reads_bytearrays() -> None:
    assert crc32c(bytearray(CHECK_INPUT)) == 0xE3069283


def test_hmac_is_hmac_sha256_keyed_with_the_given_key() -> None:
    # RFC 4231, test case 2, fed in two chunks.
    digest = compute(DigestType.HMAC, b"Jefe", b"what do ya want ", b"for nothing?")
    assert digest.hex() == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"


def test_hmac_differs_by_password() -> None:
    data = b"entry bytes"
    first = compute(DigestType.HMAC, mac_key(b"alpha"), data)
    assert first == compute(DigestType.HMAC, mac_key(b"alpha"), data)
    assert first != compute(DigestType.HMAC, mac_key(b"beta"), data)
    assert first != compute(DigestType.HMAC, mac_key(b""), data)
    assert first == hmac.new(mac_key(b"alpha"), data, hashlib.sha256).digest()


def test_password_derivations_are_distinct_and_never_the_password() -> None:
    password = b"alpha"
    derived = {mac_key(password), master_key(password)}
    assert len(derived) == 2
    assert LedgerKeys.of_password(password) == LedgerKeys(master_key(password), mac_key(password))
    assert all(len(value) == 32 and password not in value for value in derived)
    assert mac_key(b"alpha") != mac_key(b"beta")


@pytest.mark.parametrize("digest_type", [DigestType.CRC32, DigestType.CRC32C, DigestType.DUMMY])
def test_non_mac_digests_ignore_the_key(digest_type: DigestType) -> None:
    assert compute(digest_type, b"one", b"data") == compute(digest_type, b"two", b"data")


def test_dummy_is_empty() -> None:
    assert compute(DigestType.DUMMY, b"", b"anything") == b""


@settings(max_examples=100)
@given(
    chunks=st.lists(st.binary(max_size=100), max_size=5),
    digest_type=st.sampled_from(list(DigestType)),
)
def test_chunks_digest_as_their_concatenation(chunks: list[bytes], digest_type: DigestType) -> None:
    key = mac_key(b"k")
    whole = compute(digest_type, key, b"".join(chunks))
    assert compute(digest_type, key, *chunks) == whole
    assert compute(digest_type, key, *[memoryview(chunk) for chunk in chunks]) == whole
    assert len(whole) == digest_type.size


@pytest.mark.parametrize("digest_type", [DigestType.CRC32, DigestType.CRC32C, DigestType.HMAC])
def test_one_bit_changes_the_digest(digest_type: DigestType) -> None:
    key = mac_key(b"k")
    flipped = b"\x00" * 63 + b"\x01"
    assert compute(digest_type, key, bytes(64)) != compute(digest_type, key, flipped)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (DigestType.CRC32C, DigestType.CRC32C),
        ("crc32c", DigestType.CRC32C),
        (" HMAC ", DigestType.HMAC),
        ("Dummy", DigestType.DUMMY),
        (1, DigestType.CRC32),
        (3, DigestType.CRC32C),
    ],
)
def test_parse_accepts_members_names_and_numbers(
    value: DigestType | str | int, expected: DigestType
) -> None:
    assert DigestType.parse(value) is expected


@pytest.mark.parametrize("value", ["crc64", "", 0, 5, -1, True, None, 3.0])
def test_parse_refuses_anything_else(value: object) -> None:
    with pytest.raises(BadRequest, match="unknown digest type"):
        DigestType.parse(value)  # type: ignore[arg-type]
