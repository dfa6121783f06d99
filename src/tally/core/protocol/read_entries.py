"""READ_ENTRIES: several entries of one ledger in one request and one reply, so that a repair
reads a bookie's copies a batch at a time rather than one request per entry (issue 21; the
batched read of BookKeeper's BP-62, but over a list of entry ids, since a striped ledger's
bookie holds every E-th entry, not a range).

The request names the ledger and its first entry id in the header; its body is a byte budget
(u32) and the entry ids asked, ascending (u64 each, 1..MAX_ENTRIES_PER_READ, the first being
the header's). The reply answers a prefix of them, in the order asked, as records (length
u32, the entry as stored): the bookie stops once it has `max_bytes`, at the frame's size, or
before the first entry it cannot serve, which the asker then reads alone to hear why. When
the first entry cannot be served, the reply is that entry's ErrorResponse. So every reply
answers at least one entry, and an entry left out is never an answer about it: not missing,
only not answered here.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Sequence
from typing import Final

from tally.core.errors import BadRequest, MalformedData
from tally.core.protocol.wire import I64, MAX_FRAME_SIZE, RESPONSE_HEADER_SIZE, U32

MAX_ENTRIES_PER_READ: Final = 256
"""Entries one request may ask for: the bookie reads them in one turn of its event loop, so
the asker keeps a batch to a few milliseconds of disk reads with `max_bytes`."""

_BUDGET = struct.Struct(">I")
_ENTRY_ID = struct.Struct(">Q")
_LENGTH = struct.Struct(">I")


def encode_entry_ids(entry_ids: Sequence[int], max_bytes: int, message: object) -> bytes:
    """A request's body; BadRequest for what a reader would refuse."""
    what = type(message).__name__
    if not 1 <= len(entry_ids) <= MAX_ENTRIES_PER_READ:
        raise BadRequest(f"{what}: {len(entry_ids)} entries, expected 1..{MAX_ENTRIES_PER_READ}")
    if type(max_bytes) is not int or not 1 <= max_bytes <= U32:
        raise BadRequest(f"{what}: max_bytes {max_bytes!r} is outside 1..{U32}")
    previous = -1
    for entry_id in entry_ids:
        if type(entry_id) is not int or not previous < entry_id <= I64:
            raise BadRequest(
                f"{what}: entry ids must be ascending in 0..{I64}: {entry_id!r} after {previous}"
            )
        previous = entry_id
    return _BUDGET.pack(max_bytes) + b"".join(_ENTRY_ID.pack(entry_id) for entry_id in entry_ids)


def decode_entry_ids(first_entry_id: int, body: memoryview) -> tuple[tuple[int, ...], int]:
    """(entry ids, max_bytes) of a request's body whose header named `first_entry_id`."""
    count, rest = divmod(len(body) - _BUDGET.size, _ENTRY_ID.size)
    if rest or not 1 <= count <= MAX_ENTRIES_PER_READ:
        raise MalformedData(
            f"body of {len(body)} bytes, expected a budget of {_BUDGET.size} and "
            f"1..{MAX_ENTRIES_PER_READ} entry ids of {_ENTRY_ID.size} bytes"
        )
    (max_bytes,) = _BUDGET.unpack_from(body)
    if not max_bytes:
        raise MalformedData("max_bytes is 0")
    entry_ids = tuple(entry_id for (entry_id,) in _ENTRY_ID.iter_unpack(body[_BUDGET.size :]))
    if entry_ids[0] != first_entry_id:
        raise MalformedData(
            f"the first entry id asked is {entry_ids[0]}, the header names {first_entry_id}"
        )
    for before, after in itertools.pairwise(entry_ids):
        if not before < after <= I64:
            raise MalformedData(f"entry ids must be ascending in 0..{I64}: {after} after {before}")
    return entry_ids, max_bytes


def encode_entries(entries: Sequence[bytes | memoryview]) -> bytes:
    """A reply's body: each entry after its length."""
    parts: list[bytes | memoryview] = []
    for entry in entries:
        if type(entry) is not bytes and type(entry) is not memoryview:
            raise BadRequest(f"an entry must be bytes or a memoryview, not {type(entry).__name__}")
        parts.append(_LENGTH.pack(len(entry)))
        parts.append(entry)
    return b"".join(parts)


def decode_entries(body: memoryview) -> tuple[bytes, ...]:
    """The entries of a reply's body; MalformedData if one is cut or there are none."""
    entries: list[bytes] = []
    pos, end = 0, len(body)
    while pos < end:
        if end - pos < _LENGTH.size:
            raise MalformedData(f"entry record at body offset {pos} is cut: {end - pos} bytes")
        (length,) = _LENGTH.unpack_from(body, pos)
        start = pos + _LENGTH.size
        pos = start + length
        if pos > end:
            raise MalformedData(
                f"entry record {len(entries)} declares {length} bytes, only {end - start} follow"
            )
        entries.append(bytes(body[start:pos]))
    if not entries:
        raise MalformedData("a READ_ENTRIES reply answers at least one entry")
    return tuple(entries)


def answer_entries(
    read: Iterable[bytes | memoryview], max_bytes: int, budget: int = MAX_FRAME_SIZE
) -> list[bytes | memoryview]:
    """The entries of one reply: `read`, taken lazily, until they hold `max_bytes` or the
    next would not fit a frame of `budget` bytes (whose read is then wasted, once a batch);
    BadRequest if the first alone does not fit."""
    entries: list[bytes | memoryview] = []
    size = RESPONSE_HEADER_SIZE
    held = 0
    for entry in read:
        record = _LENGTH.size + len(entry)
        if size + record > budget:
            if not entries:
                raise BadRequest(
                    f"an entry of {len(entry)} bytes is over a reply frame of {budget}; "
                    "read it alone"
                )
            break
        entries.append(entry)
        size += record
        held += len(entry)
        if held >= max_bytes:
            break
    return entries


def check_answered(asked: int, answered: int) -> None:
    """MalformedData unless a reply of `answered` entries may answer `asked` (1..asked)."""
    if not 1 <= answered <= asked:
        raise MalformedData(f"a reply of {answered} entries to a read of {asked}")
