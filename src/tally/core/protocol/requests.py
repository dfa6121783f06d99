"""The requests a client sends a bookie, each encoding itself into one frame."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Final, NamedTuple, TypeAlias

from tally.core.digest import crc32c
from tally.core.entry_format import peek_header
from tally.core.errors import BadDigest, BadRequest
from tally.core.ids import LedgerId
from tally.core.protocol.entry_lists import encode_ledger_ids
from tally.core.protocol.read_entries import encode_entry_ids
from tally.core.protocol.wire import (
    ADD,
    DO_FENCING,
    I64,
    KEY_AND_LAC,
    LENGTH,
    MAX_FRAME_SIZE,
    NO_FLAGS,
    NO_LEDGER,
    RECOVERY_ADD,
    REQUEST_ID,
    REQUEST_ID_OFFSET,
    U32,
    VERSION,
    WITH_STATE,
    EntryBytes,
    Operation,
    check_header_fields,
    check_int,
    check_master_key,
    name,
    request_frame,
)

ADD_HEAD_SIZE: Final = ADD.size - LENGTH.size
"""The bytes an ADD frame's length counts besides its entry (72)."""


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Store one entry. The ledger and entry ids are read from the entry itself, so a request
    cannot name other ids than the bytes it carries.

    `crc32c` is the client's CRC32C of `entry`; build with `for_entry` to compute it. The
    bookie checks it before it journals anything (end-to-end checksum; `verify_crc` is
    that check). The frame adds 72 bytes to the entry, so entries up to
    `max_frame_size - 72` fit.
    """

    operation: ClassVar[Operation] = Operation.ADD
    request_id: int
    entry: EntryBytes
    master_key: bytes
    crc32c: int
    recovery: bool = False
    """RECOVERY_ADD: a recovering client re-replicates; allowed on a fenced ledger."""
    ledger_id: LedgerId = field(init=False)
    entry_id: int = field(init=False)
    last_add_confirmed: int = field(init=False)
    """The LAC the writer piggy-backed on the entry."""

    def __post_init__(self) -> None:
        if type(self.entry) is not bytes and type(self.entry) is not memoryview:
            raise BadRequest(
                f"an ADD's entry must be bytes or a memoryview, not {type(self.entry).__name__}"
            )
        head = peek_header(self.entry)
        object.__setattr__(self, "ledger_id", head.ledger_id)
        object.__setattr__(self, "entry_id", head.entry_id)
        object.__setattr__(self, "last_add_confirmed", head.last_add_confirmed)

    @classmethod
    def decoded(
        cls,
        request_id: int,
        entry: EntryBytes,
        master_key: bytes,
        crc32c: int,
        recovery: bool,
        ids: tuple[LedgerId, int, int],
    ) -> AddRequest:
        """An ADD whose entry's header a reader has just read: `ids` (its ledger id, entry
        id and LAC), which the frame's header named too. Not peeked at again."""
        request = object.__new__(cls)
        set_field = object.__setattr__  # frozen: as the dataclass's own __init__ does
        set_field(request, "request_id", request_id)
        set_field(request, "entry", entry)
        set_field(request, "master_key", master_key)
        set_field(request, "crc32c", crc32c)
        set_field(request, "recovery", recovery)
        set_field(request, "ledger_id", ids[0])
        set_field(request, "entry_id", ids[1])
        set_field(request, "last_add_confirmed", ids[2])
        return request

    @classmethod
    def for_entry(
        cls, request_id: int, entry: bytes, master_key: bytes, recovery: bool = False
    ) -> AddRequest:
        """The client's way in: an ADD of the encoded `entry` with its CRC32C computed."""
        return cls(request_id, entry, master_key, crc32c(entry), recovery)

    def verify_crc(self) -> None:
        """Raise BadDigest unless the entry's bytes have the CRC32C the client computed."""
        actual = crc32c(self.entry)
        if actual != self.crc32c:
            raise BadDigest(
                f"ADD of ledger {self.ledger_id} entry {self.entry_id} (request "
                f"{self.request_id}): the {len(self.entry)} entry bytes have CRC32C "
                f"0x{actual:08x}, the client sent 0x{self.crc32c:08x}"
            )

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        return self.head(max_frame_size) + self.entry

    def head(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        """The frame up to its entry: the entry's bytes follow it on the wire."""
        size = ADD_HEAD_SIZE + len(self.entry)
        check_header_fields(self, size, max_frame_size)
        check_master_key(self.master_key, self)
        check_int(self.crc32c, 0, U32, "crc32c", self)
        return _add_head(
            size,
            self.recovery,
            self.request_id,
            self.ledger_id,
            self.entry_id,
            self.master_key,
            self.crc32c,
        )


def _add_head(
    size: int,
    recovery: bool,
    request_id: int,
    ledger_id: LedgerId,
    entry_id: int,
    master_key: bytes,
    crc: int,
) -> bytes:
    """An ADD frame's head, its fields already checked."""
    flags = RECOVERY_ADD if recovery else 0
    scope, ledger = ledger_id.scope, ledger_id.id
    return ADD.pack(
        size, VERSION, Operation.ADD, flags, request_id, scope, ledger, entry_id, master_key, crc
    )


class PreparedAdd(NamedTuple):
    """One entry's ADD made once for all its copies: its CRC32C taken, its header packed
    once (request id 0); each connection writes `head_for` its own request id, then the
    entry's bytes, shared. Its operation and ids are what a connection matches the answer
    against. A tuple, as a writer makes one per entry."""

    ledger_id: LedgerId
    entry_id: int
    head: bytes
    entry: EntryBytes
    frame_size: int
    """The frame's length prefix: what a connection's frame limit applies to."""
    operation: Operation = Operation.ADD
    """A field rather than a property: a connection reads it for every answer."""

    @classmethod
    def of(
        cls,
        entry: bytes,
        master_key: bytes,
        recovery: bool = False,
        max_frame_size: int = MAX_FRAME_SIZE,
    ) -> PreparedAdd:
        """The ADD of any encoded entry, its ids read from it and every field checked."""
        request = AddRequest.for_entry(0, entry, master_key, recovery)
        head = request.head(max_frame_size)
        size = ADD_HEAD_SIZE + len(request.entry)
        return cls(request.ledger_id, request.entry_id, head, request.entry, size)

    @classmethod
    def of_written(
        cls, ledger_id: LedgerId, entry_id: int, entry: bytes, master_key: bytes
    ) -> PreparedAdd:
        """A writer's ADD of the entry it has just encoded with these ids, under a master
        key it checked once for the ledger: nothing to read back, only the CRC32C to take
        and the frame's size to hold to MAX_FRAME_SIZE."""
        size = ADD_HEAD_SIZE + len(entry)
        if size > MAX_FRAME_SIZE:
            raise BadRequest(
                f"ledger {ledger_id} entry {entry_id}: a frame of {size} bytes exceeds the "
                f"limit of {MAX_FRAME_SIZE}"
            )
        head = _add_head(size, False, 0, ledger_id, entry_id, master_key, crc32c(entry))
        return cls(ledger_id, entry_id, head, entry, size)

    def head_for(self, request_id: int) -> bytearray:
        head = bytearray(self.head)
        REQUEST_ID.pack_into(head, REQUEST_ID_OFFSET, request_id)
        return head


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """Read one entry; entry id -1 asks for the last entry the bookie has (its LAC entry).

    With a `master_key` it is a fencing read (DO_FENCING): the bookie fences the ledger
    first, after checking the key against the one the ledger's first add fixed.
    """

    operation: ClassVar[Operation] = Operation.READ
    request_id: int
    ledger_id: LedgerId
    entry_id: int
    master_key: bytes | None = None

    @property
    def do_fencing(self) -> bool:
        return self.master_key is not None

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        if self.master_key is None:
            return request_frame(self, NO_FLAGS, b"", max_frame_size)
        check_master_key(self.master_key, self)
        return request_frame(self, DO_FENCING, self.master_key, max_frame_size)


@dataclass(frozen=True, slots=True)
class _LedgerQuery:
    """A request that names one ledger and carries no body; subclasses set the operation."""

    operation: ClassVar[Operation]
    request_id: int
    ledger_id: LedgerId
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        return request_frame(self, NO_FLAGS, b"", max_frame_size)


@dataclass(frozen=True, slots=True)
class ReadLacRequest(_LedgerQuery):
    """Ask for the LAC the bookie knows: the larger of the explicit and the piggy-backed one."""

    operation: ClassVar[Operation] = Operation.READ_LAC


@dataclass(frozen=True, slots=True)
class WriteLacRequest:
    """Tell the bookie the ledger's LAC explicitly (the writer's key proves who says so)."""

    operation: ClassVar[Operation] = Operation.WRITE_LAC
    request_id: int
    ledger_id: LedgerId
    master_key: bytes
    last_add_confirmed: int
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        check_master_key(self.master_key, self)
        check_int(self.last_add_confirmed, -1, I64, "LAC", self)
        body = KEY_AND_LAC.pack(self.master_key, self.last_add_confirmed)
        return request_frame(self, NO_FLAGS, body, max_frame_size)


@dataclass(frozen=True, slots=True)
class GetListOfEntriesOfLedgerRequest(_LedgerQuery):
    """Ask which entries of a ledger the bookie's index has (BP-34), as availability bytes."""

    operation: ClassVar[Operation] = Operation.GET_LIST_OF_ENTRIES_OF_LEDGER


@dataclass(frozen=True, slots=True)
class AvailabilityDumpRequest:
    """Ask for every ledger the bookie holds with its availability (the audit's input);
    `with_state`: with each ledger's state, the cookie and the deleted ledgers too (a
    metadata recovery's input, dump.py)."""

    operation: ClassVar[Operation] = Operation.AVAILABILITY_DUMP
    request_id: int
    with_state: bool = False
    ledger_id: LedgerId = field(default=NO_LEDGER, init=False)
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        flags = WITH_STATE if self.with_state else NO_FLAGS
        return request_frame(self, flags, b"", max_frame_size)


@dataclass(frozen=True, slots=True)
class GetListOfEntriesOfLedgersRequest:
    """Ask which entries of each of `ledger_ids` the bookie's index has, in one request
    (entry_lists.py): the replicas check's question, batched."""

    operation: ClassVar[Operation] = Operation.GET_LIST_OF_ENTRIES_OF_LEDGERS
    request_id: int
    ledger_ids: tuple[LedgerId, ...]
    ledger_id: LedgerId = field(default=NO_LEDGER, init=False)
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        body = encode_ledger_ids(self.ledger_ids, self)
        return request_frame(self, NO_FLAGS, body, max_frame_size)


@dataclass(frozen=True, slots=True)
class ReadEntriesRequest:
    """Read several entries of one ledger at once (read_entries.py): a repair's reads. The
    bookie answers a prefix of `entry_ids`, stopping once it holds `max_bytes`."""

    operation: ClassVar[Operation] = Operation.READ_ENTRIES
    request_id: int
    ledger_id: LedgerId
    entry_ids: tuple[int, ...]
    max_bytes: int

    @property
    def entry_id(self) -> int:
        """The first entry asked: the one the header names, and an error answers for."""
        return self.entry_ids[0] if self.entry_ids else 0

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        body = encode_entry_ids(self.entry_ids, self.max_bytes, self)
        return request_frame(self, NO_FLAGS, body, max_frame_size)


@dataclass(frozen=True, slots=True)
class LedgerInfoRequest(_LedgerQuery):
    """Ask what the bookie knows of one ledger: fenced, LAC, entries and bytes stored."""

    operation: ClassVar[Operation] = Operation.LEDGER_INFO


@dataclass(frozen=True, slots=True)
class MetadataCopyRequest:
    """Give the bookie a copy of the ledger's metadata (LedgerMetadata.to_bytes) as of the
    latest segment it is part of, kept for metadata recovery (issue 18); the writer's key
    proves who says so."""

    operation: ClassVar[Operation] = Operation.METADATA_COPY
    request_id: int
    ledger_id: LedgerId
    master_key: bytes
    metadata: bytes
    entry_id: int = field(default=0, init=False)

    def encode(self, max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
        check_master_key(self.master_key, self)
        if not isinstance(self.metadata, bytes) or not self.metadata:
            raise BadRequest(f"{name(self)}: the metadata copy must be non-empty bytes")
        return request_frame(self, NO_FLAGS, self.master_key + self.metadata, max_frame_size)


Request: TypeAlias = (
    AddRequest
    | ReadRequest
    | ReadLacRequest
    | WriteLacRequest
    | GetListOfEntriesOfLedgerRequest
    | GetListOfEntriesOfLedgersRequest
    | ReadEntriesRequest
    | AvailabilityDumpRequest
    | LedgerInfoRequest
    | MetadataCopyRequest
)
