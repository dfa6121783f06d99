"""Entry digests and the keys derived from a ledger's password.

The digest types and their numbers are Apache BookKeeper's (CRC32 = 1, HMAC = 2,
CRC32C = 3, DUMMY = 4), so a number read from metadata or from an entry's flags means the
same thing in both systems. HMAC here is HMAC-SHA256. DUMMY verifies nothing: it exists
for benchmarks and for callers that checksum their own payloads.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import zlib
from dataclasses import dataclass
from typing import Protocol

import crc32c as crc32c_library

from tally.core.errors import BadRequest


class DigestType(enum.IntEnum):
    CRC32 = 1
    HMAC = 2
    CRC32C = 3
    DUMMY = 4

    @property
    def size(self) -> int:
        """Bytes the digest takes in an entry (CRC32 is 8, as a BookKeeper long)."""
        return _SIZES[self]

    @classmethod
    def parse(cls, value: DigestType | str | int) -> DigestType:
        """Accept a member, its name in any case ("crc32c") or its number."""
        if isinstance(value, DigestType):
            return value
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        names = ", ".join(member.name.lower() for member in cls)
        raise BadRequest(f"unknown digest type {value!r}; expected one of {names}")


MASTER_KEY_SIZE = 32
"""Bytes of a ledger's master key (a SHA-256): what bookies check adds and fences against."""

_SIZES = {DigestType.CRC32: 8, DigestType.HMAC: 32, DigestType.CRC32C: 4, DigestType.DUMMY: 0}


class _Crc32c(Protocol):
    def __call__(self, data: bytes | bytearray | memoryview, start: int = 0, /) -> int: ...


crc32c: _Crc32c = crc32c_library.crc32c
"""crc32c(data, start=0): CRC32C (Castagnoli), hardware-accelerated; `start` chains over
several buffers. Any contiguous buffer is taken as it is: the bookie checks entries in
place, in the buffer they were received into. The library's own function, not a wrapper:
the scrubber calls it for every record, and a wrapper's call costs a third of a 4 KiB
record's CRC."""


def mac_key(password: bytes) -> bytes:
    """The HMAC key of a ledger: derived, so the password itself never keys anything."""
    return hashlib.sha256(b"mac" + password).digest()


def master_key(password: bytes) -> bytes:
    """What a bookie keeps to recognise a ledger's writer, without knowing the password."""
    return hashlib.sha256(b"ledger" + password).digest()


@dataclass(frozen=True, slots=True)
class LedgerKeys:
    """What reading, fencing and copying a ledger's entries take.

    The master key opens the ledger on its bookies (adds, fencing reads); the ledger
    metadata keeps it, so auto-recovery can repair any ledger without its password, as
    BookKeeper keeps the password itself in the metadata for the same reason. The MAC key,
    from the password alone, stays with the ledger's users: whoever can read the metadata
    still cannot forge an HMAC digest.
    """

    master_key: bytes
    mac_key: bytes

    @classmethod
    def of_password(cls, password: bytes) -> LedgerKeys:
        return cls(master_key(password), mac_key(password))

    @classmethod
    def for_maintenance(
        cls, digest_type: DigestType, ledger_master_key: bytes, password: bytes | None
    ) -> LedgerKeys | None:
        """The keys that recovery or repair of a ledger needs, from its metadata's master key;
        an HMAC ledger needs its password too (None without it)."""
        if digest_type is not DigestType.HMAC:
            return cls(ledger_master_key, mac_key(b""))  # the MAC key goes unused
        return None if password is None else cls.of_password(password)


def compute(digest_type: DigestType, key: bytes, *chunks: bytes | memoryview) -> bytes:
    """The digest of the concatenated `chunks`, `digest_type.size` bytes long.

    `key` is `mac_key(password)`; the CRC types ignore it.
    """
    if digest_type is DigestType.CRC32C:
        value = 0
        for chunk in chunks:
            value = crc32c(chunk, value)
        return value.to_bytes(4, "big")
    if digest_type is DigestType.CRC32:
        value = 0
        for chunk in chunks:
            value = zlib.crc32(chunk, value)
        return value.to_bytes(8, "big")
    if digest_type is DigestType.HMAC:
        mac = hmac.new(key, digestmod=hashlib.sha256)
        for chunk in chunks:
            mac.update(chunk)
        return mac.digest()
    return b""
