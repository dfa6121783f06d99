"""The bytes of one entry as bookies store and serve them: formats V1 and V2 (BP-34).

V1 is BookKeeper's classic layout and can only name scope-0 ledgers below 2^63; V2 adds
a flags byte (format version and digest type) and the ledger scope. Their first byte
tells them apart: V1 starts with the top byte of a ledger id below 2^63 (top bit clear),
V2 with flags whose top bit is always set. The digest covers the header and the payload,
so a bookie or a reader detects corruption of any byte it serves.

V1 cannot say which digest it carries, so decoding takes the digest type from the caller
(the ledger metadata records it); a V2 entry that names another type is refused. Without
the metadata (a metadata recovery), `stored_digest_type` tells a V1 entry's CRC digest by
checking which one matches.
"""

from __future__ import annotations

import enum
import hmac
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Final, NamedTuple, TypeGuard

from tally.core.digest import DigestType, compute, crc32c
from tally.core.errors import BadDigest, BadRequest, MalformedData
from tally.core.ids import LedgerId

INT64_MAX: Final = (1 << 63) - 1
MAX_ENTRY_SIZE: Final = 5 * 1024 * 1024
"""Default largest entry `decode_entry` accepts, digest and header included (BookKeeper's
default frame limit), so oversized input is refused before any hashing."""

_V1_HEADER = struct.Struct(">Qqqq")  # ledger id, entry id, LAC, length
_V2_HEADER = struct.Struct(">BQQqqq")  # flags, scope, ledger id, entry id, LAC, length
_V2_FLAG = 0x80
_V2_VERSION = 2


class EntryFormat(enum.Enum):
    V1 = 1
    V2 = 2


_HEADER_SIZES = {EntryFormat.V1: _V1_HEADER.size, EntryFormat.V2: _V2_HEADER.size}


class EntryHeader(NamedTuple):
    """The fields before the digest; `digest_type` is None for V1, which does not carry it.
    A tuple: a bookie peeks one on every add."""

    format: EntryFormat
    ledger_id: LedgerId
    entry_id: int
    last_add_confirmed: int
    length: int
    digest_type: DigestType | None


@dataclass(frozen=True, slots=True)
class Entry:
    """A decoded entry whose digest matched. `length` is the ledger's total length in
    bytes up to and including this entry, as in BookKeeper, not the payload's size."""

    ledger_id: LedgerId
    entry_id: int
    last_add_confirmed: int
    length: int
    payload: bytes
    digest_type: DigestType
    format: EntryFormat


Buffer = bytes | bytearray | memoryview


def header_size(format: EntryFormat) -> int:
    """Bytes before the digest: 32 for V1, 41 for V2."""
    return _HEADER_SIZES[format]


def encode_entry(
    ledger_id: LedgerId,
    entry_id: int,
    last_add_confirmed: int,
    length: int,
    payload: Buffer,
    digest_type: DigestType,
    key: bytes = b"",
    format: EntryFormat | None = None,
) -> bytes:
    """The entry's bytes: header, digest of header and payload, then the payload.

    `key` is `digest.mac_key(password)`, derived once per ledger; only HMAC uses it.
    Without `format`, V1 for classic ids (scope 0, id < 2^63) and V2 otherwise.
    """
    encoder = EntryEncoder(ledger_id, digest_type, key, format)
    return encoder.encode(entry_id, last_add_confirmed, length, payload)


class EntryEncoder:
    """`encode_entry` for one ledger's entries: what they share (the ledger, its digest
    type and key, the format) is checked once, as a writer encodes every entry."""

    __slots__ = ("_digest_type", "_key", "_ledger_id", "_pack_header")

    def __init__(
        self,
        ledger_id: LedgerId,
        digest_type: DigestType,
        key: bytes = b"",
        format: EntryFormat | None = None,
    ) -> None:
        if not isinstance(ledger_id, LedgerId):
            raise BadRequest(f"ledger id must be a LedgerId, not {type(ledger_id).__name__}")
        digest_type = DigestType.parse(digest_type)
        _check_key(digest_type, key)
        fits_v1 = ledger_id.scope == 0 and ledger_id.id <= INT64_MAX
        if format is None:
            format = EntryFormat.V1 if fits_v1 else EntryFormat.V2
        self._pack_header: Callable[[int, int, int], bytes]
        if format is EntryFormat.V1:
            if not fits_v1:
                raise BadRequest(
                    f"ledger {ledger_id.qualified_name} cannot be written in entry format V1, "
                    "which holds only scope 0 and ids below 2^63"
                )
            self._pack_header = partial(_V1_HEADER.pack, ledger_id.id)
        elif format is EntryFormat.V2:
            flags = _V2_FLAG | _V2_VERSION << 4 | digest_type
            self._pack_header = partial(_V2_HEADER.pack, flags, ledger_id.scope, ledger_id.id)
        else:
            raise BadRequest(f"unknown entry format {format!r}")
        self._ledger_id = ledger_id
        self._digest_type = digest_type
        self._key = key

    def encode(self, entry_id: int, last_add_confirmed: int, length: int, payload: Buffer) -> bytes:
        body = payload if isinstance(payload, bytes) else _as_view(payload, "payload")
        if not (
            type(entry_id) is int
            and type(last_add_confirmed) is int
            and type(length) is int
            and 0 <= entry_id <= INT64_MAX
            and -1 <= last_add_confirmed <= INT64_MAX
            and len(body) <= length <= INT64_MAX
        ):
            self._refuse(entry_id, last_add_confirmed, length, body)
        header = self._pack_header(entry_id, last_add_confirmed, length)
        return b"".join((header, compute(self._digest_type, self._key, header, body), body))

    def _refuse(
        self, entry_id: int, last_add_confirmed: int, length: int, body: bytes | memoryview
    ) -> None:
        _check_field("entry id", entry_id, 0)
        _check_field("last add confirmed", last_add_confirmed, -1)
        _check_field("length", length, 0)
        raise BadRequest(
            f"length {length} of ledger {self._ledger_id} entry {entry_id} is less than its "
            f"payload ({len(body)} bytes); length is the ledger's total up to and including "
            "the entry"
        )


def peek_header(data: Buffer) -> EntryHeader:
    """Read the header WITHOUT checking the digest.

    For a bookie, which indexes entries of ledgers whose password it does not know;
    nothing read here is trustworthy until `decode_entry` has verified the digest.
    """
    # Bytes and flat byte views (a writer's entry, a bookie's slice of its arena) are read
    # as they are: another view costs more than the rest of the peek, on every add.
    view: bytes | memoryview = (
        data if type(data) is bytes or _flat(data) else _as_view(data, "entry")
    )
    if not view:
        raise MalformedData("empty entry: no header")
    if view[0] & _V2_FLAG:
        return _peek_v2(view)
    if len(view) < _V1_HEADER.size:
        raise MalformedData(_short("V1", len(view), _V1_HEADER.size))
    ledger, entry_id, lac, length = _V1_HEADER.unpack_from(view)
    return _header(EntryFormat.V1, LedgerId(0, ledger), entry_id, lac, length, None)


def decode_entry(
    data: Buffer,
    digest_type: DigestType,
    key: bytes = b"",
    max_size: int = MAX_ENTRY_SIZE,
) -> Entry:
    """Decode and verify an entry of a ledger that uses `digest_type` (from its metadata).

    Raises MalformedData for bytes that are not an entry (too short, over `max_size`,
    unknown version or digest type, impossible field values) and BadDigest when the
    digest does not match or names another type than the ledger's.
    """
    digest_type = DigestType.parse(digest_type)
    head = verify_entry(data, digest_type, key, max_size)
    return verified_entry(data, head, digest_type)


def verify_entry(data: Buffer, digest_type: DigestType, key: bytes, max_size: int) -> EntryHeader:
    """`decode_entry`'s checks, without copying the payload out: the header of an entry
    whose digest matched (for a copy that is passed on as it is, such as a repair's)."""
    digest_type = DigestType.parse(digest_type)
    _check_key(digest_type, key)
    view = _as_view(data, "entry")
    if len(view) > max_size:
        raise MalformedData(f"entry of {len(view)} bytes exceeds the limit of {max_size} bytes")
    head = peek_header(view)
    if head.digest_type not in (None, digest_type):
        raise BadDigest(
            f"{_where(head)} carries a {head.digest_type.name} digest but the ledger uses "
            f"{digest_type.name}"
        )
    digest_end = header_size(head.format) + digest_type.size
    if len(view) < digest_end:
        raise MalformedData(
            f"{_where(head)} ({head.format.name}) is {len(view)} bytes; header and "
            f"{digest_type.name} digest need {digest_end}"
        )
    if not _digest_matches(view, head.format, digest_type, key):
        raise BadDigest(
            f"{digest_type.name} digest mismatch in {_where(head)} ({head.format.name})"
        )
    if head.length < len(view) - digest_end:
        raise MalformedData(
            f"{_where(head)} has length {head.length}, less than its own payload of "
            f"{len(view) - digest_end} bytes"
        )
    return head


def verified_entry(data: Buffer, head: EntryHeader, digest_type: DigestType) -> Entry:
    """The entry `data` whose header `verify_entry` returned, its payload copied out."""
    digest_end = header_size(head.format) + digest_type.size
    return Entry(
        ledger_id=head.ledger_id,
        entry_id=head.entry_id,
        last_add_confirmed=head.last_add_confirmed,
        length=head.length,
        payload=bytes(_as_view(data, "entry")[digest_end:]),
        digest_type=digest_type,
        format=head.format,
    )


def _where(head: EntryHeader) -> str:
    return f"ledger {head.ledger_id} entry {head.entry_id}"


def stored_digest_type(data: Buffer) -> DigestType | None:
    """The digest type an entry was written with, as far as its bytes tell a bookie: what a
    metadata recovery gives a ledger of which no bookie holds a metadata copy.

    A V2 entry names it in its flags, and that name is the answer whether or not the digest
    matches: finding corrupt entries is the scrubber's job, not this one's. A V1 entry does
    not name it: CRC32C if a CRC32C digest of it matches, else CRC32 if a CRC32 one does,
    else None, for an HMAC digest needs the password and DUMMY has none, so neither can be
    told from a corrupt entry. MalformedData for bytes that are no entry (see `peek_header`).
    """
    view = _as_view(data, "entry")
    head = peek_header(view)
    if head.digest_type is not None:
        return head.digest_type
    for digest_type in (DigestType.CRC32C, DigestType.CRC32):
        if _digest_matches(view, EntryFormat.V1, digest_type, b""):
            return digest_type
    return None


def _digest_matches(
    view: memoryview, format: EntryFormat, digest_type: DigestType, key: bytes
) -> bool:
    """Whether the entry holds `digest_type`'s digest of its header and payload, computed as
    `encode_entry` computes it: one place for the check, so a decode and a guess agree."""
    header_end = header_size(format)
    digest_end = header_end + digest_type.size
    if len(view) < digest_end:
        return False
    expected = compute(digest_type, key, view[:header_end], view[digest_end:])
    return hmac.compare_digest(expected, view[header_end:digest_end])


def check_crc_digest(data: Buffer) -> None:
    """Raise BadDigest unless the entry's CRC digest matches it, where a bookie can tell.

    A bookie has no password for an HMAC digest, and a V1 entry does not say which digest
    it carries; a V2 entry with a CRC32 or CRC32C digest it can check, and so it refuses an
    entry corrupted at its source, after its writer digested it but before the frame's
    CRC32C was computed, which every copy would otherwise hold (seed 002's white-box test).
    It runs on every add: the flags byte alone decides, and the header is read in full
    only to say what did not match.
    """
    if not data:
        return
    checked = _CHECKED.get(data[0])
    if checked is None:
        return
    function, size = checked
    view = data if type(data) is memoryview else memoryview(data)
    digest_end = _V2_HEADER.size + size
    if len(view) < digest_end:
        raise MalformedData(f"a V2 entry of {len(view)} bytes; header and digest need {digest_end}")
    value = function(view[digest_end:], function(view[: _V2_HEADER.size], 0))
    if value.to_bytes(size, "big") != view[_V2_HEADER.size : digest_end]:
        head = _peek_v2(view)
        raise BadDigest(
            f"{head.digest_type} digest mismatch in ledger {head.ledger_id} entry "
            f"{head.entry_id}: its bytes changed after its writer digested them (at the "
            "writer, or on the way)"
        )


_CHECKED: dict[int, tuple[Callable[[Buffer, int], int], int]] = {
    _V2_FLAG | _V2_VERSION << 4 | DigestType.CRC32C: (crc32c, DigestType.CRC32C.size),
    _V2_FLAG | _V2_VERSION << 4 | DigestType.CRC32: (zlib.crc32, DigestType.CRC32.size),
}
"""V2 flags bytes whose digest a bookie checks: the CRC function and the digest's size."""


def _peek_v2(view: bytes | memoryview) -> EntryHeader:
    flags = view[0]
    version = flags >> 4 & 0x7
    if version != _V2_VERSION:
        raise MalformedData(
            f"entry flags 0x{flags:02x} name entry format version {version}; "
            f"only version {_V2_VERSION} is known"
        )
    if len(view) < _V2_HEADER.size:
        raise MalformedData(_short("V2", len(view), _V2_HEADER.size))
    _, scope, ledger, entry_id, lac, length = _V2_HEADER.unpack_from(view)
    ledger_id = LedgerId(scope, ledger)
    digest_type = _DIGEST_TYPES.get(flags & 0x0F)
    if digest_type is None:
        raise MalformedData(
            f"ledger {ledger_id} entry {entry_id}: flags 0x{flags:02x} name unknown "
            f"digest type {flags & 0x0F}"
        )
    return _header(EntryFormat.V2, ledger_id, entry_id, lac, length, digest_type)


def header_ids(data: bytes | memoryview, start: int, stop: int) -> tuple[int, int, int, int] | None:
    """(scope, ledger, entry id, LAC) of the entry in data[start:stop] if its header is one
    an encoder writes (V1, or V2 of a known version and digest type; possible values); None
    for anything else, whose fault `peek_header` names. A bookie's short way through ADDs."""
    if stop <= start:
        return None
    if data[start] & _V2_FLAG:
        if stop - start < _V2_HEADER.size:
            return None
        flags, scope, ledger, entry_id, lac, length = _V2_HEADER.unpack_from(data, start)
        if flags & 0xF0 != _V2_FLAG | _V2_VERSION << 4 or flags & 0x0F not in _DIGEST_TYPES:
            return None
    else:
        if stop - start < _V1_HEADER.size:
            return None
        scope = 0
        ledger, entry_id, lac, length = _V1_HEADER.unpack_from(data, start)
    if entry_id < 0 or lac < -1 or length < 0:
        return None
    return scope, ledger, entry_id, lac


_DIGEST_TYPES: Final = {member.value: member for member in DigestType}
"""Digest types by number: a lookup, where calling the enum costs a microsecond."""


def _header(
    format: EntryFormat,
    ledger_id: LedgerId,
    entry_id: int,
    lac: int,
    length: int,
    digest_type: DigestType | None,
) -> EntryHeader:
    """Refuse values no encoder writes, so garbage never passes as a header."""
    if entry_id < 0 or lac < -1 or length < 0:
        raise MalformedData(
            f"ledger {ledger_id} {format.name} header holds impossible values: "
            f"entry id {entry_id}, last add confirmed {lac}, length {length}"
        )
    return EntryHeader(format, ledger_id, entry_id, lac, length, digest_type)


def _flat(data: Buffer) -> TypeGuard[memoryview]:
    """Whether `data` is already the flat byte view `_as_view` would make (a bookie's
    entry, a slice of its receive arena, always is)."""
    return type(data) is memoryview and data.format == "B" and data.ndim == 1 and data.c_contiguous


def _as_view(data: Buffer, what: str) -> memoryview:
    """A flat byte view, so lengths count bytes whatever the buffer's item format."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise BadRequest(
            f"{what} must be bytes, bytearray or memoryview, not {type(data).__name__}"
        )
    view = memoryview(data)
    if not view.c_contiguous:
        raise BadRequest(f"{what} must be a contiguous buffer")
    return view.cast("B")


def _check_field(name: str, value: int, lowest: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{name} must be an int, not {type(value).__name__}")
    if not lowest <= value <= INT64_MAX:
        raise BadRequest(f"{name} {value} is outside {lowest}..2^63-1")


def _check_key(digest_type: DigestType, key: bytes) -> None:
    # An empty HMAC key would let anyone forge entries; it means the caller forgot mac_key.
    if digest_type is DigestType.HMAC and not key:
        raise BadRequest("HMAC digests need the ledger's key: pass digest.mac_key(password)")


def _short(format_name: str, size: int, needed: int) -> str:
    return f"entry of {size} bytes is cut short: a {format_name} header needs {needed}"
