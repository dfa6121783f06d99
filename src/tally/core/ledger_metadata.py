"""Ledger metadata: the immutable record of a ledger's state, quorums and segments.

The metadata never holds the ledger id: the store keeps it under the id's path, as
BookKeeper does, so the id is only passed in to name the ledger in error messages.

Every change is a method returning new metadata, so a compare-and-set loop can retry a
transition on whatever version it read; a transition that would break an invariant
(truncating a ledger, rewriting a segment that holds entries, reopening a closed ledger)
is refused rather than repaired.

Serialized form (big-endian)::

    header  b"TLYM" | uint16 format version
            | uint32 body length | uint32 CRC32C of the body     (version 1 header)
    body    uint8 state | uint8 digest type | uint16 E | uint16 WQ | uint16 AQ
            | int64 last entry id | int64 length | int64 ctime (ms)
            | 32 bytes master key    | uint8 n + n bytes creator token
            | uint32 segments, each: int64 first entry id, E x (uint8 n + n bytes UTF-8 bookie id)
            | uint32 custom fields, each: uint16 n + n bytes UTF-8 key, uint32 m + m bytes value,
              keys strictly increasing
            | uint8 flags (0x01 archived, 0x02 deletion follows,         (version 2 on)
                           0x04 undelete time follows)                  (version 3 on)
            | deletion: int64 time (ms) | int64 violations (-1: not checked)
              | uint16 n + n bytes UTF-8 reason | uint16 m + m bytes UTF-8 check detail
            | undelete: int64 time (ms)

Only the magic and the version are fixed forever: the version is checked before anything
else, so a later version may change the rest. A later version appends its new fields to the
end of the body and bumps the version; its reader reads the fields of the version it is
given and defaults the newer ones, while this reader refuses it with an explicit message
instead of silently dropping fields on its next write. A record is written in the lowest
version that holds its fields (version 3 only for a ledger once undeleted), so a tally one
version older reads every other record. The store itself has no checksum and a flipped byte
in a bookie id would silently redirect reads, hence the CRC32C.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import enum
import hmac
import struct
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from tally.core.digest import MASTER_KEY_SIZE, DigestType, crc32c, master_key
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
from tally.core.schedule import check_quorums, write_set

MAGIC = b"TLYM"
FORMAT_VERSION = 3

INT64_MAX = (1 << 63) - 1
MAX_ENSEMBLE_SIZE = 0xFFFF
MAX_BOOKIE_ID_BYTES = 0xFF
MAX_CREATOR_TOKEN_BYTES = 0xFF
MAX_CUSTOM_KEY_BYTES = 0xFFFF
MAX_CUSTOM_VALUE_BYTES = 0xFFFF_FFFF
MAX_DELETION_TEXT_BYTES = 0xFFFF

_PREFIX = struct.Struct(">4sH")
_HEADER_V1 = struct.Struct(">II")
_FIXED_V1 = struct.Struct(f">BBHHHqqq{MASTER_KEY_SIZE}s")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_DELETION = struct.Struct(">qq")
_ARCHIVED = 0x01
_HAS_DELETION = 0x02
_HAS_UNDELETE = 0x04


class LedgerState(enum.IntEnum):
    """A ledger's life: OPEN -> IN_RECOVERY -> CLOSED, or OPEN -> CLOSED (BookKeeper's numbers),
    then CLOSED -> DELETED (soft delete, BP-31), which `undelete` takes back to CLOSED."""

    OPEN = 1
    IN_RECOVERY = 2
    CLOSED = 3
    DELETED = 4


def _check_int(name: str, value: object, low: int, high: int = INT64_MAX) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise BadRequest(f"{name} {value} is outside {low}..{high}")
    return value


def _check_text(name: str, value: object, max_bytes: int) -> str:
    """A non-empty string whose UTF-8 form fits its length prefix."""
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a str, not {type(value).__name__}")
    if not value:
        raise BadRequest(f"{name} is empty")
    try:
        size = len(value.encode())
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{name} {value!r} is not valid Unicode: {exc.reason}") from None
    if size > max_bytes:
        raise BadRequest(f"{name} {value!r} is {size} bytes in UTF-8; at most {max_bytes}")
    return value


def _check_bookie_id(value: object) -> None:
    bookie = _check_text("bookie id", value, MAX_BOOKIE_ID_BYTES)
    if not bookie.isprintable():
        raise BadRequest(f"bookie id {bookie!r} contains unprintable characters")


@dataclasses.dataclass(frozen=True, slots=True)
class Segment:
    """A run of entries, from `first_entry_id` on, written to one ensemble (a fragment)."""

    first_entry_id: int
    ensemble: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_int("segment first entry id", self.first_entry_id, 0)
        if not isinstance(self.ensemble, tuple):
            raise BadRequest(
                f"an ensemble is a tuple of bookie ids, not {type(self.ensemble).__name__}"
            )
        if not self.ensemble:
            raise BadRequest(f"segment at entry {self.first_entry_id} has an empty ensemble")
        for bookie in self.ensemble:
            _check_bookie_id(bookie)
        if len(set(self.ensemble)) != len(self.ensemble):
            twice = sorted({b for b in self.ensemble if self.ensemble.count(b) > 1})
            raise BadRequest(
                f"segment at entry {self.first_entry_id} names bookie(s) {twice} more than once;"
                " each copy must be on a different bookie"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class Deletion:
    """When and why a ledger was soft-deleted, and what the durability check found then."""

    time_ms: int
    reason: str
    violations: int = -1
    """Entries the check found on fewer than WQ bookies; -1 when it was not checked."""
    detail: str = ""
    """The check's verdict in a sentence, for the tombstone and the operator."""

    def __post_init__(self) -> None:
        _check_int("deletion time (ms)", self.time_ms, 0)
        _check_int("deletion violations", self.violations, -1)
        _check_text("deletion reason", self.reason, MAX_DELETION_TEXT_BYTES)
        if self.detail:
            _check_text("deletion check detail", self.detail, MAX_DELETION_TEXT_BYTES)

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_ms": self.time_ms,
            "reason": self.reason,
            "violations": self.violations,
            "detail": self.detail,
        }


@contextlib.contextmanager
def _refused_as_transition(action: str) -> Iterator[None]:
    """Report an argument that breaks an invariant as a refused transition, naming it."""
    try:
        yield
    except InvalidMetadataTransition:
        raise
    except BadRequest as exc:
        raise InvalidMetadataTransition(f"{action}: {exc}") from exc


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LedgerMetadata:
    """One version of a ledger's metadata; construction refuses any inconsistent record.

    OPEN and IN_RECOVERY ledgers have no end yet: last_entry_id is -1 and length 0.
    A DELETED ledger keeps the end it was closed at, and says when and why in `deletion`.
    A CLOSED ledger's last segment may start at last_entry_id + 1 and so hold no entries:
    BookKeeper closes so when the writer changed ensemble at LAC + 1 and nothing after the
    LAC was acknowledged. That segment's bookies may still hold unacknowledged entries, so
    they stay on record for deletion and audits to reach.
    """

    state: LedgerState
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    segments: tuple[Segment, ...]
    digest_type: DigestType
    master_key: bytes
    """The bookies' key of the ledger, `digest.master_key(password)`: checks a reader's
    password early, and lets auto-recovery repair the ledger (see `digest.LedgerKeys`)."""
    ctime_ms: int
    creator_token: bytes
    last_entry_id: int = -1
    length: int = 0
    custom_metadata: Mapping[str, bytes] = dataclasses.field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )
    archived: bool = False
    """Set by an archiver once it copied the ledger elsewhere (BP-31's archival bit); a
    cluster with `delete_requires_archival` deletes only archived ledgers."""
    deletion: Deletion | None = None
    undeleted_ms: int = 0
    """When the ledger was last undeleted (0: never), after its deletion's time even when
    clocks disagree: orders the copies bookies keep of a delete and an undelete
    (core/metadata_copies.py)."""

    def __post_init__(self) -> None:
        if not isinstance(self.state, LedgerState):
            raise BadRequest(f"state must be a LedgerState, not {self.state!r}")
        if not isinstance(self.digest_type, DigestType):
            raise BadRequest(f"digest type must be a DigestType, not {self.digest_type!r}")
        for name in ("ensemble_size", "write_quorum", "ack_quorum"):
            _check_int(name.replace("_", " "), getattr(self, name), 0, MAX_ENSEMBLE_SIZE)
        check_quorums(self.ensemble_size, self.write_quorum, self.ack_quorum)
        self._check_segments()
        self._check_end()
        hashed = self.master_key
        if not isinstance(hashed, bytes) or len(hashed) != MASTER_KEY_SIZE:
            raise BadRequest(f"master key must be {MASTER_KEY_SIZE} bytes")
        _check_int("ctime (ms)", self.ctime_ms, 0)
        if not isinstance(self.creator_token, bytes):
            raise BadRequest(
                f"creator token must be bytes, not {type(self.creator_token).__name__}"
            )
        if len(self.creator_token) > MAX_CREATOR_TOKEN_BYTES:
            raise BadRequest(
                f"creator token is {len(self.creator_token)} bytes; at most "
                f"{MAX_CREATOR_TOKEN_BYTES}"
            )
        object.__setattr__(self, "custom_metadata", _frozen_custom(self.custom_metadata))
        if not isinstance(self.archived, bool):
            raise BadRequest(f"archived must be a bool, not {type(self.archived).__name__}")
        if (self.state is LedgerState.DELETED) != (self.deletion is not None):
            raise BadRequest(
                f"a {self.state.name} ledger "
                + ("needs" if self.state is LedgerState.DELETED else "cannot have")
                + " a deletion record"
            )
        if self.deletion is not None and not isinstance(self.deletion, Deletion):
            raise BadRequest(f"deletion must be a Deletion, not {type(self.deletion).__name__}")
        _check_int("undelete time (ms)", self.undeleted_ms, 0)
        if self.undeleted_ms and not self.has_end:
            raise BadRequest(f"an {self.state.name} ledger cannot have been undeleted")

    def _check_segments(self) -> None:
        if not isinstance(self.segments, tuple) or not self.segments:
            raise BadRequest("a ledger needs a non-empty tuple of segments")
        previous = -1
        for segment in self.segments:
            if not isinstance(segment, Segment):
                raise BadRequest(f"segments must be Segment, not {type(segment).__name__}")
            if segment.first_entry_id <= previous:
                raise BadRequest(
                    f"segment first entry ids must strictly increase: "
                    f"{segment.first_entry_id} follows {previous}"
                )
            if len(segment.ensemble) != self.ensemble_size:
                raise BadRequest(
                    f"segment at entry {segment.first_entry_id} has {len(segment.ensemble)} "
                    f"bookies; the ensemble size is {self.ensemble_size}"
                )
            previous = segment.first_entry_id
        if self.segments[0].first_entry_id != 0:
            raise BadRequest(
                f"the first segment starts at entry {self.segments[0].first_entry_id}, not 0"
            )

    def _check_end(self) -> None:
        _check_int("last entry id", self.last_entry_id, -1)
        _check_int("length", self.length, 0)
        if not self.has_end:
            if (self.last_entry_id, self.length) != (-1, 0):
                raise BadRequest(
                    f"an {self.state.name} ledger has no end yet (last entry -1, length 0), "
                    f"got last entry {self.last_entry_id}, length {self.length}"
                )
            return
        if self.last_entry_id == -1 and self.length != 0:
            raise BadRequest(
                f"an empty {self.state.name.lower()} ledger has length 0, not {self.length}"
            )
        last_first = self.segments[-1].first_entry_id
        if last_first > self.last_entry_id + 1:
            raise BadRequest(
                f"closed at last entry {self.last_entry_id}, but the last segment starts at "
                f"entry {last_first}: entries before it were acknowledged"
            )

    @classmethod
    def create(
        cls,
        *,
        ensemble: tuple[str, ...],
        write_quorum: int,
        ack_quorum: int,
        digest_type: DigestType,
        password: bytes,
        ctime_ms: int,
        creator_token: bytes,
        custom_metadata: Mapping[str, bytes] | None = None,
    ) -> LedgerMetadata:
        """The metadata of a new OPEN ledger; only the password's hash is kept."""
        if not isinstance(password, bytes):
            raise BadRequest(f"password must be bytes, not {type(password).__name__}")
        first = Segment(0, ensemble)
        return cls(
            state=LedgerState.OPEN,
            ensemble_size=len(first.ensemble),
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            segments=(first,),
            digest_type=digest_type,
            master_key=master_key(password),
            ctime_ms=ctime_ms,
            creator_token=creator_token,
            custom_metadata=custom_metadata if custom_metadata is not None else {},
        )

    # Queries

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def has_end(self) -> bool:
        """Whether the last entry is fixed: CLOSED, or DELETED (which was CLOSED)."""
        return self.state in (LedgerState.CLOSED, LedgerState.DELETED)

    def ensemble_at(self, entry_id: int) -> tuple[str, ...]:
        """The ensemble that `entry_id` was (or will be) written to."""
        _check_int("entry id", entry_id, 0)
        if self.has_end and entry_id > self.last_entry_id:
            raise BadRequest(
                f"entry {entry_id} is past the end of the closed ledger "
                f"(last entry {self.last_entry_id})"
            )
        firsts = [segment.first_entry_id for segment in self.segments]
        return self.segments[bisect.bisect_right(firsts, entry_id) - 1].ensemble

    def segment_bounds(self) -> tuple[tuple[int, int | None], ...]:
        """(first, last) entry id of each segment; last is None while the ledger has no end.

        A last below first marks a closed ledger's empty trailing segment.
        """
        ends: list[int | None] = [s.first_entry_id - 1 for s in self.segments[1:]]
        ends.append(self.last_entry_id if self.has_end else None)
        return tuple(
            (segment.first_entry_id, end) for segment, end in zip(self.segments, ends, strict=True)
        )

    def segments_with_bounds(self) -> tuple[tuple[Segment, int, int | None], ...]:
        """Each segment with its first and last entry id, as `segment_bounds` gives them."""
        return tuple(
            (segment, first, last)
            for segment, (first, last) in zip(self.segments, self.segment_bounds(), strict=True)
        )

    def write_set_bookies(self, entry_id: int) -> tuple[str, ...]:
        """The bookies that store `entry_id`, in the order writes and reads use."""
        ensemble = self.ensemble_at(entry_id)
        return tuple(
            ensemble[p] for p in write_set(entry_id, self.ensemble_size, self.write_quorum)
        )

    def bookies(self) -> frozenset[str]:
        """Every bookie that any segment names: those that may hold the ledger's entries."""
        return frozenset(bookie for segment in self.segments for bookie in segment.ensemble)

    def check_password(self, password: bytes, ledger_id: LedgerId | None = None) -> None:
        """Refuse a wrong password before any bookie is asked, in constant time."""
        if not isinstance(password, bytes):
            raise BadRequest(f"password must be bytes, not {type(password).__name__}")
        if not hmac.compare_digest(master_key(password), self.master_key):
            raise Unauthorized(f"wrong password for {_ledger_name(ledger_id)}")

    # Transitions

    def with_ensemble_change(
        self, first_entry_id: int, new_ensemble: tuple[str, ...], *, recovering: bool = False
    ) -> LedgerMetadata:
        """The writer's new ensemble from `first_entry_id` (its LAC + 1) on; or, with
        `recovering`, the recovery's, which replaces a bookie that fails its re-writes as
        BookKeeper's recovery does (the fenced writer can no longer change the ensemble).

        At the last segment's own first entry the segment never held an entry, so the new
        ensemble replaces it; earlier would rewrite acknowledged entries' placement.
        """
        action = f"ensemble change at entry {first_entry_id}"
        self._refuse_deleted(action)
        if self.state is LedgerState.CLOSED:
            raise LedgerClosed(f"{action} refused: the ledger is closed")
        if self.state is LedgerState.IN_RECOVERY and not recovering:
            raise LedgerFenced(f"{action} refused: the ledger is being recovered")
        if self.state is LedgerState.OPEN and recovering:
            raise InvalidMetadataTransition(
                f"recovery's {action} refused: the ledger is not in recovery"
            )
        with _refused_as_transition(action):
            new_segment = Segment(first_entry_id, new_ensemble)
            last_first = self.segments[-1].first_entry_id
            if first_entry_id < last_first:
                raise InvalidMetadataTransition(
                    f"{action} refused: the last segment starts at entry {last_first}"
                )
            kept = self.segments[:-1] if first_entry_id == last_first else self.segments
            return dataclasses.replace(self, segments=(*kept, new_segment))

    def replace_bookie(self, segment_index: int, old: str, new: str) -> LedgerMetadata:
        """`new` takes `old`'s position in a bounded segment, after re-replicating its copies.

        The open last segment of an unclosed ledger is refused: its writer (or recovery)
        still owns it and changes it only through an ensemble change or the close.
        """
        action = f"replacing bookie {old!r} by {new!r} in segment {segment_index}"
        with _refused_as_transition(action):
            _check_int("segment index", segment_index, 0, len(self.segments) - 1)
            if segment_index == len(self.segments) - 1 and not self.is_closed:
                raise InvalidMetadataTransition(
                    f"{action} refused: it is the open last segment of an {self.state.name} ledger"
                )
            segment = self.segments[segment_index]
            if new == old:
                raise InvalidMetadataTransition(f"{action} refused: a bookie cannot replace itself")
            if old not in segment.ensemble:
                raise InvalidMetadataTransition(
                    f"{action} refused: {old!r} is not in its ensemble {list(segment.ensemble)}"
                )
            ensemble = tuple(new if bookie == old else bookie for bookie in segment.ensemble)
            segments = list(self.segments)
            segments[segment_index] = Segment(segment.first_entry_id, ensemble)
            return dataclasses.replace(self, segments=tuple(segments))

    def start_recovery(self) -> LedgerMetadata:
        """OPEN -> IN_RECOVERY; again on IN_RECOVERY, so a failed recovery can be retried."""
        self._refuse_deleted("recovery")
        if self.state is LedgerState.CLOSED:
            raise LedgerClosed(
                f"cannot recover a closed ledger (last entry {self.last_entry_id}, "
                f"length {self.length})"
            )
        if self.state is LedgerState.IN_RECOVERY:
            return self
        return dataclasses.replace(self, state=LedgerState.IN_RECOVERY)

    def close(self, last_entry_id: int, length: int) -> LedgerMetadata:
        """Fix the end of the ledger; closing again at the same end is a no-op."""
        self._refuse_deleted(f"closing at last entry {last_entry_id}")
        if self.is_closed:
            if (last_entry_id, length) == (self.last_entry_id, self.length):
                return self
            raise LedgerClosed(
                f"ledger already closed at last entry {self.last_entry_id}, length "
                f"{self.length}; refusing to close it at last entry {last_entry_id}, "
                f"length {length}"
            )
        with _refused_as_transition(f"closing at last entry {last_entry_id}, length {length}"):
            return dataclasses.replace(
                self, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length
            )

    def with_archived(self) -> LedgerMetadata:
        """The archival bit set: only on a CLOSED ledger, the one whose content is final."""
        if self.archived:
            return self
        if self.state is not LedgerState.CLOSED:
            raise InvalidMetadataTransition(
                f"setting the archival bit refused: the ledger is {self.state.name}, and only "
                "a CLOSED ledger's content is final"
            )
        return dataclasses.replace(self, archived=True)

    def deleted(self, deletion: Deletion) -> LedgerMetadata:
        """CLOSED -> DELETED (soft delete); deleting a DELETED ledger again changes nothing.
        A deletion is timed after the last undelete, whatever the deleting client's clock."""
        if self.state is LedgerState.DELETED:
            return self
        if self.state is not LedgerState.CLOSED:
            raise InvalidMetadataTransition(
                f"deleting an {self.state.name} ledger refused: close or recover it first"
            )
        if self.undeleted_ms and deletion.time_ms <= self.undeleted_ms:
            deletion = dataclasses.replace(deletion, time_ms=self.undeleted_ms + 1)
        return dataclasses.replace(self, state=LedgerState.DELETED, deletion=deletion)

    def undeleted(self, now_ms: int) -> LedgerMetadata:
        """DELETED -> CLOSED, everything else as it was before the delete, and the undelete
        timed after the deletion whatever the undeleting client's clock."""
        if self.state is not LedgerState.DELETED:
            raise InvalidMetadataTransition(
                f"undelete refused: the ledger is {self.state.name}, not DELETED"
            )
        assert self.deletion is not None
        return dataclasses.replace(
            self,
            state=LedgerState.CLOSED,
            deletion=None,
            undeleted_ms=max(now_ms, self.deletion.time_ms + 1),
        )

    def _refuse_deleted(self, action: str) -> None:
        if self.state is LedgerState.DELETED:
            raise LedgerDeleted(f"{action} refused: the ledger was deleted")

    def with_custom_metadata(self, custom_metadata: Mapping[str, bytes]) -> LedgerMetadata:
        """The same ledger with its custom metadata replaced as a whole."""
        with _refused_as_transition("replacing the custom metadata"):
            return dataclasses.replace(self, custom_metadata=custom_metadata)

    # Views and serialization

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle (process pools, Spark workers) through the validated binary form."""
        return (LedgerMetadata.from_bytes, (self.to_bytes(),))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view for people and tools; bytes are hex.

        The master key is left out: it opens the ledger on its bookies, and would let anyone
        who can read the view test password guesses offline.
        """
        return {
            "state": self.state.name,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "digest_type": self.digest_type.name,
            "ctime_ms": self.ctime_ms,
            "creator_token": self.creator_token.hex(),
            "custom_metadata": {key: value.hex() for key, value in self.custom_metadata.items()},
            "archived": self.archived,
            "deletion": None if self.deletion is None else self.deletion.to_dict(),
            "undeleted_ms": self.undeleted_ms,
            "segments": [
                {"first_entry_id": first, "last_entry_id": last, "ensemble": list(s.ensemble)}
                for s, (first, last) in zip(self.segments, self.segment_bounds(), strict=True)
            ],
        }

    def to_bytes(self) -> bytes:
        """Header, then the CRC32C-protected body, in the lowest version that holds it."""
        parts = [
            _FIXED_V1.pack(
                self.state,
                self.digest_type,
                self.ensemble_size,
                self.write_quorum,
                self.ack_quorum,
                self.last_entry_id,
                self.length,
                self.ctime_ms,
                self.master_key,
            ),
            _U8.pack(len(self.creator_token)),
            self.creator_token,
            _U32.pack(len(self.segments)),
        ]
        for segment in self.segments:
            parts.append(_I64.pack(segment.first_entry_id))
            for bookie in segment.ensemble:
                encoded = bookie.encode()
                parts += (_U8.pack(len(encoded)), encoded)
        parts.append(_U32.pack(len(self.custom_metadata)))
        for key, value in self.custom_metadata.items():
            encoded = key.encode()
            parts += (_U16.pack(len(encoded)), encoded, _U32.pack(len(value)), value)
        deletion = self.deletion
        flags = (
            (_ARCHIVED if self.archived else 0)
            | (_HAS_DELETION if deletion else 0)
            | (_HAS_UNDELETE if self.undeleted_ms else 0)
        )
        parts.append(_U8.pack(flags))
        if deletion is not None:
            parts.append(_DELETION.pack(deletion.time_ms, deletion.violations))
            for text in (deletion.reason, deletion.detail):
                encoded = text.encode()
                parts += (_U16.pack(len(encoded)), encoded)
        if self.undeleted_ms:
            parts.append(_I64.pack(self.undeleted_ms))
        body = b"".join(parts)
        version = FORMAT_VERSION if self.undeleted_ms else 2
        return _PREFIX.pack(MAGIC, version) + _HEADER_V1.pack(len(body), crc32c(body)) + body

    @classmethod
    def from_bytes(
        cls, data: bytes | bytearray | memoryview, ledger_id: LedgerId | None = None
    ) -> LedgerMetadata:
        """Decode any format version up to FORMAT_VERSION; anything else is MalformedData."""
        try:
            return _decode(bytes(data))
        except BadRequest as exc:
            raise MalformedData(f"{_ledger_name(ledger_id)} metadata: {exc}") from None


def _ledger_name(ledger_id: LedgerId | None) -> str:
    return "the ledger" if ledger_id is None else f"ledger {ledger_id}"


def _frozen_custom(custom: object) -> Mapping[str, bytes]:
    """A read-only, key-sorted copy, so equal metadata also serializes identically."""
    if not isinstance(custom, Mapping):
        raise BadRequest(f"custom metadata must be a mapping, not {type(custom).__name__}")
    for key, value in custom.items():
        _check_text("custom metadata key", key, MAX_CUSTOM_KEY_BYTES)
        if not isinstance(value, bytes):
            raise BadRequest(f"custom metadata {key!r} must be bytes, not {type(value).__name__}")
        if len(value) > MAX_CUSTOM_VALUE_BYTES:
            raise BadRequest(f"custom metadata {key!r} is longer than {MAX_CUSTOM_VALUE_BYTES}")
    return MappingProxyType(dict(sorted(custom.items())))


class _Reader:
    """Reads fields off the bytes, refusing to run past the end."""

    def __init__(self, data: bytes, offset: int) -> None:
        self.data = data
        self.offset = offset

    def take(self, size: int, what: str) -> bytes:
        left = len(self.data) - self.offset
        if size > left:
            raise MalformedData(
                f"truncated at byte {self.offset}: {what} needs {size} bytes, {left} left"
            )
        self.offset += size
        return self.data[self.offset - size : self.offset]

    def unpack(self, layout: struct.Struct, what: str) -> tuple[Any, ...]:
        return layout.unpack(self.take(layout.size, what))

    def sized(self, length: struct.Struct, what: str) -> bytes:
        (size,) = self.unpack(length, f"length of {what}")
        return self.take(size, what)

    def text(self, length: struct.Struct, what: str) -> str:
        at = self.offset
        raw = self.sized(length, what)
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise MalformedData(f"{what} at byte {at} is not UTF-8: {exc.reason}") from None


def _decode(data: bytes) -> LedgerMetadata:
    reader = _Reader(data, 0)
    magic, version = reader.unpack(_PREFIX, "format header")
    if magic != MAGIC:
        raise MalformedData(f"not tally ledger metadata: starts with {magic!r}, not {MAGIC!r}")
    if version > FORMAT_VERSION:
        raise MalformedData(
            f"metadata format version {version} is newer than this tally understands "
            f"(max {FORMAT_VERSION}); upgrade tally"
        )
    if version < 1:
        raise MalformedData(f"unknown metadata format version {version}")
    body_size, stored_crc = reader.unpack(_HEADER_V1, "header")
    actual = len(data) - reader.offset
    if actual < body_size:
        raise MalformedData(f"truncated: the body is {actual} bytes, the header says {body_size}")
    if actual > body_size:
        raise MalformedData(
            f"{actual - body_size} bytes of trailing garbage after the {body_size}-byte body"
        )
    computed_crc = crc32c(data[reader.offset :])
    if computed_crc != stored_crc:
        raise MalformedData(
            f"body checksum mismatch: stored CRC32C {stored_crc:#010x}, "
            f"computed {computed_crc:#010x}"
        )
    metadata = _read_body(reader, version)
    if reader.offset != len(data):
        raise MalformedData(
            f"{len(data) - reader.offset} unread bytes at the end of the body, "
            f"from byte {reader.offset}"
        )
    return metadata


def _read_body(reader: _Reader, version: int) -> LedgerMetadata:
    state, digest, ensemble_size, write_quorum, ack_quorum, last_entry_id, length, ctime_ms, pwd = (
        reader.unpack(_FIXED_V1, "fixed fields")
    )
    try:
        state, digest = LedgerState(state), DigestType(digest)
    except ValueError as exc:
        raise MalformedData(f"fixed fields: {exc}") from None
    creator_token = reader.sized(_U8, "creator token")
    (segment_count,) = reader.unpack(_U32, "segment count")
    segments = []
    for index in range(segment_count):
        (first_entry_id,) = reader.unpack(_I64, f"first entry id of segment {index}")
        ensemble = tuple(
            reader.text(_U8, f"bookie {position} of segment {index}")
            for position in range(ensemble_size)
        )
        segments.append(Segment(first_entry_id, ensemble))
    (custom_count,) = reader.unpack(_U32, "custom metadata count")
    custom: dict[str, bytes] = {}
    previous: str | None = None
    for index in range(custom_count):
        key = reader.text(_U16, f"custom metadata key {index}")
        if previous is not None and key <= previous:
            raise MalformedData(
                f"custom metadata key {key!r} follows {previous!r}: keys must strictly increase"
            )
        custom[key] = reader.sized(_U32, f"custom metadata value {key!r}")
        previous = key
    archived, deletion, undeleted_ms = (
        (False, None, 0) if version < 2 else _read_flagged_fields(reader, version)
    )
    return LedgerMetadata(
        state=state,
        ensemble_size=ensemble_size,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        segments=tuple(segments),
        digest_type=digest,
        master_key=pwd,
        ctime_ms=ctime_ms,
        creator_token=creator_token,
        last_entry_id=last_entry_id,
        length=length,
        custom_metadata=custom,
        archived=archived,
        deletion=deletion,
        undeleted_ms=undeleted_ms,
    )


def _read_flagged_fields(reader: _Reader, version: int) -> tuple[bool, Deletion | None, int]:
    (flags,) = reader.unpack(_U8, "flags")
    known = _ARCHIVED | _HAS_DELETION | (_HAS_UNDELETE if version >= 3 else 0)
    if flags & ~known:
        raise MalformedData(f"unknown flags 0x{flags:02x} in format version {version}")
    deletion = None
    if flags & _HAS_DELETION:
        time_ms, violations = reader.unpack(_DELETION, "deletion")
        reason = reader.text(_U16, "deletion reason")
        detail = reader.text(_U16, "deletion check detail")
        deletion = Deletion(time_ms, reason, violations, detail)
    undeleted_ms = 0
    if flags & _HAS_UNDELETE:
        (undeleted_ms,) = reader.unpack(_I64, "undelete time")
        if undeleted_ms <= 0:
            raise MalformedData(f"undelete time {undeleted_ms}: flagged, so after 1970")
    elif version >= 3:  # each record is written in the lowest version that holds it
        raise MalformedData(f"format version {version} without an undelete time")
    return bool(flags & _ARCHIVED), deletion, undeleted_ms
