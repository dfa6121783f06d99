"""The bookie wire protocol as a sans-I/O codec: messages to frames, bytes to messages.

The asyncio bookie and client only move bytes. A `RequestReader` (bookie side) or a
`ResponseReader` (client side) is fed whatever arrived, split anywhere, and returns the
complete messages; `message.encode()` returns the bytes to send. Nothing here does I/O, so
every framing rule is tested byte by byte without a socket.

A frame is a uint32 length of what follows (at most the reader's `max_frame_size`), a fixed
header and the operation's body, all big-endian:

    request header, 36 bytes   version u8, operation u8, flags u16, request id u64,
                               ledger scope u64, ledger id u64, entry id i64
    response header, 40 bytes  the same, then status i32: 0, or the TallyError's wire code

The operation byte's top bit marks a response, and each direction has its own reader, so a
frame sent the wrong way is refused rather than misparsed. A response echoes its request's
operation, request id, ledger and entry; its flags are its own (STREAM_END, and WITH_STATE
on a dump). Fields an operation does not use are zero, and a reader refuses anything an
encoder would not write: a frame that decodes re-encodes to exactly its own bytes.

    operation                       request body                    OK response body
    ADD                             master key, crc32c u32, entry   -
    READ (entry, or -1: the last)   master key iff DO_FENCING       the entry as stored
    READ_LAC                        -                               LAC i64
    WRITE_LAC                       master key, LAC i64             -
    GET_LIST_OF_ENTRIES_OF_LEDGER   -                               availability encoding
    AVAILABILITY_DUMP (no ledger;   -                               records, over many frames
      WITH_STATE: and state)
    LEDGER_INFO                     -                               fenced u8, LAC i64,
                                                                    entry count u64, bytes u64
    METADATA_COPY                   master key, ledger metadata     -
    GET_LIST_OF_ENTRIES_OF_LEDGERS  ledger ids (scope u64,          records of a prefix of them
      (no ledger)                   ledger u64), 1..128             (entry_lists.py)
    READ_ENTRIES (the first         max bytes u32, entry ids u64,   a prefix of them: length
      entry id asked)               ascending, 1..256               u32, entry (read_entries.py)

An error response's body is the error's message in UTF-8. A dump answers with one or more
frames of records (scope u64, ledger u64, length u32, availability encoding); the last one
has STREAM_END. A dump asked WITH_STATE answers with frames flagged WITH_STATE, whose
records also carry each ledger's state, the cookie and the deleted ledgers (dump.py).

A reader raises MalformedData for any frame it cannot take (too large, cut below a header,
unknown version or operation, flags or ids the operation does not allow, a body of the
wrong size, an ADD whose header disagrees with its entry) and stays failed, since the stream
position is lost: the connection must close. A CRC mismatch leaves the stream intact; the
bookie answers it with an ErrorResponse (BadDigest).

Readers receive into arenas (receive_arenas.py) and decode each frame where it lies; an
ADD's entry of KEEP_IN_PLACE bytes or more stays there as a memoryview rather than being
copied out.

The modules: wire.py (version, operations, flags, header layouts and rules, building a
frame), requests.py and responses.py (the messages and their encoding), dump.py (the
availability dump's records and stream), decoding.py (each operation's body decoders) and
readers.py (the frame readers).
"""

from __future__ import annotations

from tally.core.digest import MASTER_KEY_SIZE
from tally.core.protocol.decoding import KEEP_IN_PLACE
from tally.core.protocol.dump import (
    AvailabilityDumpEncoder,
    LedgerAvailability,
    StateKind,
    StateRecord,
    encode_availability_dump,
)
from tally.core.protocol.entry_lists import (
    MAX_LEDGERS_PER_LIST,
    LedgerEntries,
    answer_records,
    answered_prefix,
)
from tally.core.protocol.read_entries import MAX_ENTRIES_PER_READ, answer_entries
from tally.core.protocol.readers import FrameReader, RequestReader, ResponseReader
from tally.core.protocol.requests import (
    ADD_HEAD_SIZE,
    AddRequest,
    AvailabilityDumpRequest,
    GetListOfEntriesOfLedgerRequest,
    GetListOfEntriesOfLedgersRequest,
    LedgerInfoRequest,
    MetadataCopyRequest,
    PreparedAdd,
    ReadEntriesRequest,
    ReadLacRequest,
    ReadRequest,
    Request,
    WriteLacRequest,
)
from tally.core.protocol.responses import (
    AddResponse,
    AvailabilityDumpResponse,
    ErrorResponse,
    GetListOfEntriesOfLedgerResponse,
    GetListOfEntriesOfLedgersResponse,
    LedgerInfo,
    LedgerInfoResponse,
    MetadataCopyResponse,
    ReadEntriesResponse,
    ReadLacResponse,
    ReadResponse,
    Response,
    WriteLacResponse,
)
from tally.core.protocol.wire import (
    MAX_FRAME_SIZE,
    REQUEST_HEADER_SIZE,
    RESPONSE_HEADER_SIZE,
    VERSION,
    EntryBytes,
    Flags,
    Operation,
)

__all__ = [
    "ADD_HEAD_SIZE",
    "KEEP_IN_PLACE",
    "MASTER_KEY_SIZE",
    "MAX_ENTRIES_PER_READ",
    "MAX_FRAME_SIZE",
    "MAX_LEDGERS_PER_LIST",
    "REQUEST_HEADER_SIZE",
    "RESPONSE_HEADER_SIZE",
    "VERSION",
    "AddRequest",
    "AddResponse",
    "AvailabilityDumpEncoder",
    "AvailabilityDumpRequest",
    "AvailabilityDumpResponse",
    "EntryBytes",
    "ErrorResponse",
    "Flags",
    "FrameReader",
    "GetListOfEntriesOfLedgerRequest",
    "GetListOfEntriesOfLedgerResponse",
    "GetListOfEntriesOfLedgersRequest",
    "GetListOfEntriesOfLedgersResponse",
    "LedgerAvailability",
    "LedgerEntries",
    "LedgerInfo",
    "LedgerInfoRequest",
    "LedgerInfoResponse",
    "MetadataCopyRequest",
    "MetadataCopyResponse",
    "Operation",
    "PreparedAdd",
    "ReadEntriesRequest",
    "ReadEntriesResponse",
    "ReadLacRequest",
    "ReadLacResponse",
    "ReadRequest",
    "ReadResponse",
    "Request",
    "RequestReader",
    "Response",
    "ResponseReader",
    "StateKind",
    "StateRecord",
    "WriteLacRequest",
    "WriteLacResponse",
    "answer_entries",
    "answer_records",
    "answered_prefix",
    "encode_availability_dump",
]
