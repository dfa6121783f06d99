from __future__ import annotations

import array
import itertools
import re
import struct
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core import errors
from tally.core.availability import EntryAvailability
from tally.core.digest import DigestType, crc32c, master_key
from tally.core.entry_format import INT64_MAX, encode_entry
from tally.core.errors import BadDigest, BadRequest, MalformedData
from tally.core.ids import UINT64_MAX, LedgerId
from tally.core.protocol import (
    ADD_HEAD_SIZE,
    KEEP_IN_PLACE,
    MASTER_KEY_SIZE,
    MAX_FRAME_SIZE,
    REQUEST_HEADER_SIZE,
    RESPONSE_HEADER_SIZE,
    VERSION,
    AddRequest,
    AddResponse,
    AvailabilityDumpEncoder,
    AvailabilityDumpRequest,
    AvailabilityDumpResponse,
    ErrorResponse,
    Flags,
    FrameReader,
    GetListOfEntriesOfLedgerRequest,
    GetListOfEntriesOfLedgerResponse,
    GetListOfEntriesOfLedgersRequest,
    GetListOfEntriesOfLedgersResponse,
    LedgerAvailability,
    LedgerEntries,
    LedgerInfo,
    LedgerInfoRequest,
    LedgerInfoResponse,
    MetadataCopyRequest,
    MetadataCopyResponse,
    Operation,
    PreparedAdd,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    RequestReader,
    Response,
    ResponseReader,
    StateRecord,
    WriteLacRequest,
    WriteLacResponse,
    encode_availability_dump,
)
from tally.core.protocol.decoding import decode_add
from tally.core.protocol.dump import state_record_parts
from tally.core.receive_arenas import MIN_RECEIVE, ReceiveArenas

KEY = master_key(b"secret")
LEDGER = LedgerId(0, 7)
WIDE = LedgerId(0xDEAD_BEEF_0000_0001, 0xFFFF_FFFF_FFFF_FFFE)
EXTREME_HALVES = [0, 1, INT64_MAX, INT64_MAX + 1, UINT64_MAX]
PREFIX = 4
"""A frame's length prefix, which its length does not count."""

halves = st.one_of(st.sampled_from(EXTREME_HALVES), st.integers(0, UINT64_MAX))
ledger_ids = st.builds(LedgerId, halves, halves)
request_ids = st.one_of(st.sampled_from([0, 1, UINT64_MAX]), st.integers(0, UINT64_MAX))
entry_ids = st.one_of(st.sampled_from([0, 1, INT64_MAX]), st.integers(0, INT64_MAX))
lacs = st.one_of(st.sampled_from([-1, 0, INT64_MAX]), st.integers(-1, INT64_MAX))
u64s = st.one_of(st.sampled_from([0, UINT64_MAX]), st.integers(0, UINT64_MAX))
keys = st.binary(min_size=MASTER_KEY_SIZE, max_size=MASTER_KEY_SIZE)
blobs = st.binary(max_size=200)


def entry_of(ledger_id: LedgerId = LEDGER, entry_id: int = 3, payload: bytes = b"payload") -> bytes:
    return encode_entry(ledger_id, entry_id, entry_id - 1, 1000 + len(payload), payload, "crc32c")


def add_of(ledger_id: LedgerId = LEDGER, entry_id: int = 3, request_id: int = 9) -> AddRequest:
    return AddRequest.for_entry(request_id, entry_of(ledger_id, entry_id), KEY)


entries = st.builds(entry_of, ledger_ids, entry_ids, blobs)

requests: st.SearchStrategy[Request] = st.one_of(
    st.builds(AddRequest.for_entry, request_ids, entries, keys, st.booleans()),
    st.builds(
        ReadRequest,
        request_ids,
        ledger_ids,
        st.one_of(st.just(-1), entry_ids),
        st.one_of(st.none(), keys),
    ),
    st.builds(ReadLacRequest, request_ids, ledger_ids),
    st.builds(WriteLacRequest, request_ids, ledger_ids, keys, lacs),
    st.builds(GetListOfEntriesOfLedgerRequest, request_ids, ledger_ids),
    st.builds(
        GetListOfEntriesOfLedgersRequest,
        request_ids,
        st.lists(ledger_ids, min_size=1, max_size=5).map(tuple),
    ),
    st.builds(AvailabilityDumpRequest, request_ids, st.booleans()),
    st.builds(LedgerInfoRequest, request_ids, ledger_ids),
    st.builds(MetadataCopyRequest, request_ids, ledger_ids, keys, blobs.filter(bool)),
)

records = st.builds(LedgerAvailability, ledger_ids, blobs)
list_records = st.one_of(
    st.builds(LedgerEntries, ledger_ids, blobs),
    st.builds(
        LedgerEntries,
        ledger_ids,
        code=st.integers(-(2**31), 2**31 - 1).filter(bool),
        message=st.text(max_size=40),
    ),
)
state_records = st.one_of(
    st.builds(StateRecord.cookie_of, blobs),
    st.builds(
        StateRecord.held,
        ledger_ids,
        blobs,
        fenced=st.booleans(),
        last_add_confirmed=lacs,
        master_key=st.one_of(st.none(), keys),
        metadata_copy=st.one_of(st.none(), blobs),
        digest_type=st.one_of(st.none(), st.sampled_from(DigestType)),
        in_limbo=st.booleans(),
    ),
    st.builds(StateRecord.deleted, ledger_ids, st.integers(0, INT64_MAX)),
)


@st.composite
def error_responses(draw: st.DrawFn) -> ErrorResponse:
    operation = draw(st.sampled_from(Operation))
    ledger_id = LedgerId(0, 0)
    if operation not in (Operation.AVAILABILITY_DUMP, Operation.GET_LIST_OF_ENTRIES_OF_LEDGERS):
        ledger_id = draw(ledger_ids)
    entry_id = 0
    if operation is Operation.ADD:
        entry_id = draw(entry_ids)
    elif operation is Operation.READ:
        entry_id = draw(st.one_of(st.just(-1), entry_ids))
    code = draw(st.integers(-(2**31), 2**31 - 1).filter(bool))
    return ErrorResponse(
        operation, draw(request_ids), ledger_id, entry_id, code, draw(st.text(max_size=80))
    )


responses: st.SearchStrategy[Response] = st.one_of(
    st.builds(AddResponse, request_ids, ledger_ids, entry_ids),
    st.builds(ReadResponse, request_ids, ledger_ids, st.one_of(st.just(-1), entry_ids), blobs),
    st.builds(ReadLacResponse, request_ids, ledger_ids, lacs),
    st.builds(WriteLacResponse, request_ids, ledger_ids),
    st.builds(GetListOfEntriesOfLedgerResponse, request_ids, ledger_ids, blobs),
    st.builds(
        GetListOfEntriesOfLedgersResponse,
        request_ids,
        st.lists(list_records, max_size=4).map(tuple),
    ),
    st.builds(
        AvailabilityDumpResponse,
        request_ids,
        st.lists(records, max_size=4).map(tuple),
        st.booleans(),
    ),
    st.builds(
        AvailabilityDumpResponse,
        request_ids,
        st.lists(state_records, max_size=4).map(tuple),
        st.booleans(),
        st.just(True),
    ),
    st.builds(
        LedgerInfoResponse,
        request_ids,
        ledger_ids,
        st.builds(LedgerInfo, st.booleans(), lacs, u64s, u64s),
    ),
    st.builds(MetadataCopyResponse, request_ids, ledger_ids),
    error_responses(),
)

SAMPLE_REQUESTS: list[Request] = [
    add_of(),
    AddRequest.for_entry(1, entry_of(WIDE, INT64_MAX), KEY, recovery=True),
    ReadRequest(2, LEDGER, -1),
    ReadRequest(3, WIDE, 5, KEY),
    ReadLacRequest(4, WIDE),
    WriteLacRequest(5, LEDGER, KEY, -1),
    GetListOfEntriesOfLedgerRequest(6, WIDE),
    GetListOfEntriesOfLedgersRequest(6, (WIDE, LEDGER)),
    AvailabilityDumpRequest(UINT64_MAX),
    AvailabilityDumpRequest(3, with_state=True),
    LedgerInfoRequest(0, LEDGER),
    MetadataCopyRequest(8, WIDE, KEY, b"metadata"),
]
SAMPLE_RESPONSES: list[Response] = [
    AddResponse(9, LEDGER, 3),
    ReadResponse(2, LEDGER, -1, entry_of()),
    ReadLacResponse(4, WIDE, 17),
    WriteLacResponse(5, LEDGER),
    GetListOfEntriesOfLedgerResponse(6, WIDE, EntryAvailability.span(0, 9).to_bytes()),
    GetListOfEntriesOfLedgersResponse(
        6,
        (
            LedgerEntries(WIDE, EntryAvailability.span(0, 9).to_bytes()),
            LedgerEntries.failed(LEDGER, errors.NoSuchLedger("unknown here")),
        ),
    ),
    AvailabilityDumpResponse(7, (LedgerAvailability(WIDE, b"abc"),), stream_end=False),
    AvailabilityDumpResponse(7, (), stream_end=True),
    AvailabilityDumpResponse(
        7,
        (
            StateRecord.cookie_of(b"cookie"),
            StateRecord.held(
                WIDE,
                EntryAvailability.span(0, 9).to_bytes(),
                fenced=True,
                last_add_confirmed=9,
                master_key=KEY,
                metadata_copy=b"metadata",
            ),
            StateRecord.held(
                LEDGER,
                EntryAvailability.span(0, 2).to_bytes(),
                fenced=False,
                last_add_confirmed=-1,
                master_key=KEY,
                metadata_copy=None,
                digest_type=DigestType.CRC32,
            ),
            StateRecord.deleted(LEDGER, 1_700_000_000_000),
        ),
        stream_end=True,
        with_state=True,
    ),
    LedgerInfoResponse(0, LEDGER, LedgerInfo(True, 41, 42, 4200)),
    MetadataCopyResponse(8, WIDE),
    ErrorResponse(Operation.READ, 3, WIDE, 5, errors.Unauthorized.code, "wrong key"),
]


def reader_for(message: Request | Response) -> RequestReader | ResponseReader:
    return RequestReader() if isinstance(message, Request) else ResponseReader()


def decode_one(frame: bytes, reader: FrameReader[Request] | FrameReader[Response]) -> object:
    messages = reader.feed(frame)
    assert len(messages) == 1
    assert reader.pending_bytes == 0
    return messages[0]


def header(
    operation: int,
    *,
    flags: int = 0,
    request_id: int = 9,
    ledger_id: LedgerId = LEDGER,
    entry_id: int = 0,
    version: int = VERSION,
) -> bytes:
    return struct.pack(
        ">BBHQQQq", version, operation, flags, request_id, ledger_id.scope, ledger_id.id, entry_id
    )


def request_frame(operation: int, body: bytes = b"", **fields: int | LedgerId) -> bytes:
    data = header(operation, **fields) + body  # type: ignore[arg-type]
    return struct.pack(">I", len(data)) + data


def response_frame(
    operation: int, body: bytes = b"", status: int = 0, **fields: int | LedgerId
) -> bytes:
    data = header(operation | 0x80, **fields) + struct.pack(">i", status) + body  # type: ignore[arg-type]
    return struct.pack(">I", len(data)) + data


# --- layout ---------------------------------------------------------------------------------


def test_header_sizes() -> None:
    assert REQUEST_HEADER_SIZE == 1 + 1 + 2 + 4 * 8
    assert RESPONSE_HEADER_SIZE == REQUEST_HEADER_SIZE + 4
    assert MAX_FRAME_SIZE == 5 * 1024 * 1024


def test_operation_and_flag_numbers_are_stable() -> None:
    assert {operation.name: int(operation) for operation in Operation} == {
        "ADD": 1,
        "READ": 2,
        "READ_LAC": 3,
        "WRITE_LAC": 4,
        "GET_LIST_OF_ENTRIES_OF_LEDGER": 5,
        "AVAILABILITY_DUMP": 6,
        "LEDGER_INFO": 7,
        "METADATA_COPY": 8,
        "GET_LIST_OF_ENTRIES_OF_LEDGERS": 9,
        "READ_ENTRIES": 10,
    }
    assert (Flags.DO_FENCING, Flags.RECOVERY_ADD, Flags.STREAM_END, Flags.WITH_STATE) == (
        1,
        2,
        4,
        8,
    )


def test_add_request_layout_is_byte_exact() -> None:
    entry = entry_of(WIDE, 5)
    request = AddRequest.for_entry(0x0102, entry, KEY, recovery=True)
    body = KEY + struct.pack(">I", crc32c(entry)) + entry
    expected = request_frame(
        Operation.ADD, body, flags=Flags.RECOVERY_ADD, request_id=0x0102, ledger_id=WIDE, entry_id=5
    )
    assert request.encode() == expected
    assert (request.ledger_id, request.entry_id) == (WIDE, 5)


@given(st.integers(0, UINT64_MAX), st.booleans())
def test_a_prepared_add_is_the_add_with_each_connection_s_request_id(
    request_id: int, recovery: bool
) -> None:
    """The frame a writer makes once per entry, completed per copy, is the ADD frame."""
    entry = entry_of(WIDE, 7)
    prepared = PreparedAdd.of(entry, KEY, recovery)
    expected = AddRequest.for_entry(request_id, entry, KEY, recovery).encode()
    assert prepared.head_for(request_id) + prepared.entry == expected
    assert prepared.frame_size == len(expected) - 4
    assert (prepared.operation, prepared.ledger_id, prepared.entry_id) == (Operation.ADD, WIDE, 7)
    if not recovery:  # a writer's own, made from the ids it encoded the entry with
        assert PreparedAdd.of_written(WIDE, 7, entry, KEY) == prepared


def test_a_prepared_add_over_the_frame_limit_is_refused() -> None:
    entry = entry_of(WIDE, 7)
    with pytest.raises(BadRequest):
        PreparedAdd.of(entry, KEY, max_frame_size=len(entry))
    large = bytes(MAX_FRAME_SIZE - ADD_HEAD_SIZE + 1)
    with pytest.raises(BadRequest, match="exceeds the limit"):
        PreparedAdd.of_written(WIDE, 7, large, KEY)
    assert PreparedAdd.of_written(WIDE, 7, large[:-1], KEY).frame_size == MAX_FRAME_SIZE


def test_request_layouts_are_byte_exact() -> None:
    lac = struct.pack(">q", -1)
    assert ReadRequest(9, LEDGER, -1).encode() == request_frame(Operation.READ, entry_id=-1)
    assert ReadRequest(9, LEDGER, 4, KEY).encode() == request_frame(
        Operation.READ, KEY, flags=Flags.DO_FENCING, entry_id=4
    )
    assert WriteLacRequest(9, LEDGER, KEY, -1).encode() == request_frame(
        Operation.WRITE_LAC, KEY + lac
    )
    assert AvailabilityDumpRequest(9).encode() == request_frame(
        Operation.AVAILABILITY_DUMP, ledger_id=LedgerId(0, 0)
    )
    assert LedgerInfoRequest(9, LEDGER).encode() == request_frame(Operation.LEDGER_INFO)
    assert GetListOfEntriesOfLedgersRequest(9, (WIDE, LEDGER)).encode() == request_frame(
        Operation.GET_LIST_OF_ENTRIES_OF_LEDGERS,
        struct.pack(">QQQQ", WIDE.scope, WIDE.id, LEDGER.scope, LEDGER.id),
        ledger_id=LedgerId(0, 0),
    )
    assert MetadataCopyRequest(9, LEDGER, KEY, b"copy").encode() == request_frame(
        Operation.METADATA_COPY, KEY + b"copy"
    )


def test_response_layouts_are_byte_exact() -> None:
    assert AddResponse(9, LEDGER, 3).encode() == response_frame(Operation.ADD, entry_id=3)
    assert ReadLacResponse(9, LEDGER, 300).encode() == response_frame(
        Operation.READ_LAC, struct.pack(">q", 300)
    )
    info = LedgerInfoResponse(9, LEDGER, LedgerInfo(True, -1, 2, 3))
    assert info.encode() == response_frame(Operation.LEDGER_INFO, struct.pack(">BqQQ", 1, -1, 2, 3))
    dump = AvailabilityDumpResponse(9, (LedgerAvailability(WIDE, b"xyz"),), stream_end=True)
    record = struct.pack(">QQI", WIDE.scope, WIDE.id, 3) + b"xyz"
    assert dump.encode() == response_frame(
        Operation.AVAILABILITY_DUMP, record, flags=Flags.STREAM_END, ledger_id=LedgerId(0, 0)
    )
    lists = GetListOfEntriesOfLedgersResponse(
        9, (LedgerEntries(WIDE, b"xyz"), LedgerEntries(LEDGER, code=7, message="é"))
    )
    assert lists.encode() == response_frame(
        Operation.GET_LIST_OF_ENTRIES_OF_LEDGERS,
        struct.pack(">QQiI", WIDE.scope, WIDE.id, 0, 3)
        + b"xyz"
        + struct.pack(">QQiI", LEDGER.scope, LEDGER.id, 7, 2)
        + "é".encode(),
        ledger_id=LedgerId(0, 0),
    )
    error = ErrorResponse(Operation.READ, 9, LEDGER, -1, 13, "no entry é")
    assert error.encode() == response_frame(
        Operation.READ, "no entry é".encode(), status=13, entry_id=-1
    )


# --- round trips ----------------------------------------------------------------------------


@settings(max_examples=150)
@given(requests)
def test_every_request_round_trips(request: Request) -> None:
    frame = request.encode()
    decoded = decode_one(frame, RequestReader())
    assert decoded == request
    assert type(decoded) is type(request)
    assert request.encode() == frame


@settings(max_examples=150)
@given(responses)
def test_every_response_round_trips(response: Response) -> None:
    frame = response.encode()
    decoded = decode_one(frame, ResponseReader())
    assert decoded == response
    assert type(decoded) is type(response)


def test_sample_messages_round_trip() -> None:
    for message in [*SAMPLE_REQUESTS, *SAMPLE_RESPONSES]:
        assert decode_one(message.encode(), reader_for(message)) == message


def test_a_fencing_read_carries_the_key() -> None:
    assert ReadRequest(1, LEDGER, 0, KEY).do_fencing
    assert not ReadRequest(1, LEDGER, 0).do_fencing


def test_only_a_dump_batch_without_stream_end_leaves_the_request_open() -> None:
    assert [response.final for response in SAMPLE_RESPONSES] == [
        True,
        True,
        True,
        True,
        True,
        True,
        False,
        True,
        True,
        True,
        True,
        True,
    ]


def test_availability_helpers_decode_what_a_bookie_sends() -> None:
    held = EntryAvailability.from_entries([0, 1, 3, 4, 6, 7])
    response = GetListOfEntriesOfLedgerResponse(1, LEDGER, held.to_bytes())
    assert response.entries() == held
    assert LedgerAvailability(LEDGER, held.to_bytes()).entries() == held
    with pytest.raises(MalformedData, match="truncated"):
        LedgerAvailability(LEDGER, b"\0" * 10).entries()


# --- chunking -------------------------------------------------------------------------------


STREAM_REQUESTS = b"".join(request.encode() for request in SAMPLE_REQUESTS)
STREAM_RESPONSES = b"".join(response.encode() for response in SAMPLE_RESPONSES)


@pytest.mark.parametrize(
    ("stream", "expected", "make"),
    [
        (STREAM_REQUESTS, SAMPLE_REQUESTS, RequestReader),
        (STREAM_RESPONSES, SAMPLE_RESPONSES, ResponseReader),
    ],
)
def test_a_stream_split_at_every_byte_gives_the_same_messages(
    stream: bytes, expected: list[object], make: type[RequestReader] | type[ResponseReader]
) -> None:
    for cut in range(len(stream) + 1):
        reader = make()
        first = reader.feed(stream[:cut])
        assert first == expected[: len(first)]
        assert reader.feed(stream[cut:]) == expected[len(first) :]
        assert reader.pending_bytes == 0
    reader = make()
    one_by_one = [
        message for byte in range(len(stream)) for message in reader.feed(stream[byte : byte + 1])
    ]
    assert one_by_one == expected


@settings(max_examples=60)
@given(st.lists(requests, min_size=1, max_size=6), st.data())
def test_random_chunkings_give_the_same_messages(batch: list[Request], data: st.DataObject) -> None:
    stream = b"".join(request.encode() for request in batch)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    reader = RequestReader()
    decoded = []
    for start, stop in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoded.extend(reader.feed(memoryview(stream)[start:stop]))
    assert decoded == batch
    assert reader.pending_bytes == 0


V1_HEADER = struct.Struct(">Qqqq")  # ledger, entry id, LAC, length
V2_HEADER = struct.Struct(">BQQqqq")  # flags, scope, ledger, entry id, LAC, length
V2_FLAGS = [0xA0 | digest.value for digest in DigestType]
WRONG_VALUES = {
    "first byte": st.one_of(st.integers(0xA0, 0xAF), st.integers(0, 255)),
    "entry id": st.one_of(st.sampled_from([-(2**63), -1]), st.integers(-(2**63), INT64_MAX)),
    "LAC": st.one_of(st.sampled_from([-(2**63), -2, -1]), st.integers(-(2**63), INT64_MAX)),
    "length": st.one_of(st.sampled_from([-(2**63), -1]), st.integers(-(2**63), INT64_MAX)),
    "named ledger": u64s,
}


@given(
    st.one_of(st.none(), st.sampled_from(V2_FLAGS)),
    st.tuples(u64s, u64s, entry_ids, lacs, entry_ids),
    st.one_of(st.none(), st.sampled_from(sorted(WRONG_VALUES))),
    st.data(),
)
def test_an_add_s_short_way_decodes_as_the_long_way_or_refuses_too(
    v2_flags: int | None,
    fields: tuple[int, int, int, int, int],
    wrong: str | None,
    data: st.DataObject,
) -> None:
    """An ADD whose entry's header (V1 if `v2_flags` is None) is well formed, or has one
    field set to any value: the bookie reader's short way and `decode_add` agree, on the
    request or the refusal."""
    scope, ledger, entry_id, lac, length = fields
    if v2_flags is None:
        scope, ledger = 0, ledger & INT64_MAX
    named = ledger
    value = data.draw(WRONG_VALUES[wrong], label=wrong) if wrong is not None else None
    entry_id = value if wrong == "entry id" else entry_id
    lac = value if wrong == "LAC" else lac
    length = value if wrong == "length" else length
    named = value if wrong == "named ledger" else named
    if v2_flags is None:
        head = V1_HEADER.pack(ledger, entry_id, lac, length)
    else:
        head = V2_HEADER.pack(v2_flags, scope, ledger, entry_id, lac, length)
    entry = bytearray(head + b"digest, payload")
    if wrong == "first byte":
        entry[0] = value
    assert_read_as_decode_add_reads(bytes(entry), LedgerId(scope, named), max(entry_id, 0))


@pytest.mark.parametrize(
    "header", [V1_HEADER.pack(7, 3, 2, 10), V2_HEADER.pack(0xA1, 0, 7, 3, 2, 10)]
)
def test_an_add_whose_entry_header_is_cut_short_is_refused_either_way(header: bytes) -> None:
    for size in range(len(header)):
        assert_read_as_decode_add_reads(header[:size], LedgerId(0, 7), 3)


def assert_read_as_decode_add_reads(entry: bytes, named: LedgerId, entry_id: int) -> None:
    """The reader decodes an ADD of `entry` (named so by its frame) as `decode_add` does, or
    refuses it for the same reason; followed by more bytes, as it is in a stream."""
    body = KEY + struct.pack(">I", crc32c(entry)) + entry
    frame = request_frame(Operation.ADD, body, ledger_id=named, entry_id=entry_id)
    following = ReadLacRequest(1, named).encode()
    try:
        expected = decode_add(9, named.scope, named.id, entry_id, 0, memoryview(body))
    except MalformedData as error:
        with pytest.raises(MalformedData, match=re.escape(str(error))):
            RequestReader().feed(frame + following)
        return
    assert RequestReader().feed(frame + following)[0] == expected


def test_a_cut_frame_stays_pending_until_complete() -> None:
    frame = add_of().encode()
    reader = RequestReader()
    for size in range(len(frame)):
        reader = RequestReader()
        assert reader.feed(frame[:size]) == []
        assert reader.pending_bytes == size  # end of stream here: a frame was cut short
    assert reader.feed(frame[-1:]) == [add_of()]
    assert reader.pending_bytes == 0


def test_the_unfinished_frame_size_is_known_once_its_prefix_is_in() -> None:
    """What a bookie charges to its receive budget: the frame begun, from its length prefix
    on, until it is complete; then the next one's."""
    first, second = add_of().encode(), ReadRequest(7, LEDGER, 3).encode()
    stream = first + second
    for cut in range(len(stream) + 1):
        reader = RequestReader()
        reader.feed(stream[:cut])
        frame, began = (first, cut) if cut < len(first) else (second, cut - len(first))
        expected = len(frame) - PREFIX if PREFIX <= began < len(frame) else 0
        assert reader.unfinished_frame_size == expected, cut


@settings(max_examples=60)
@given(st.lists(responses, min_size=1, max_size=5), st.data())
def test_a_cut_stream_yields_only_whole_frames(batch: list[Response], data: st.DataObject) -> None:
    frames = [response.encode() for response in batch]
    stream = b"".join(frames)
    cut = data.draw(st.integers(0, len(stream)))
    reader = ResponseReader()
    decoded = reader.feed(stream[:cut])
    whole = 0
    while whole < len(frames) and sum(map(len, frames[: whole + 1])) <= cut:
        whole += 1
    assert decoded == batch[:whole]
    assert reader.pending_bytes == cut - sum(map(len, frames[:whole]))


def test_the_reader_copies_what_it_keeps() -> None:
    frames = bytearray(add_of().encode() + ReadLacRequest(1, WIDE).encode())
    reader = RequestReader()
    first = reader.feed(frames[:-3])
    tail = bytearray(frames[-3:])
    frames[:] = bytes(len(frames))  # the caller reuses its buffer
    assert first == [add_of()]
    assert reader.feed(tail) == [ReadLacRequest(1, WIDE)]


def test_feed_takes_any_contiguous_byte_buffer() -> None:
    frame = ReadLacRequest(1, WIDE).encode() + bytes(2)  # two bytes of the next frame
    wide_items = array.array("H", frame)  # 2-byte items: lengths must count bytes
    for data in (frame, bytearray(frame), memoryview(frame), memoryview(wide_items)):
        reader = RequestReader()
        assert reader.feed(data) == [ReadLacRequest(1, WIDE)]
        assert reader.pending_bytes == 2


def test_feed_refuses_what_is_not_a_byte_buffer_without_failing_the_stream() -> None:
    reader = RequestReader()
    with pytest.raises(BadRequest, match="str"):
        reader.feed("abc")  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="contiguous"):
        reader.feed(memoryview(bytes(8))[::2])
    assert reader.feed(ReadLacRequest(1, WIDE).encode()) == [ReadLacRequest(1, WIDE)]


@pytest.mark.parametrize("size", [REQUEST_HEADER_SIZE - 1, 0, 1 << 32])
def test_reader_limits_are_checked(size: int) -> None:
    with pytest.raises(BadRequest, match="max frame size"):
        RequestReader(size)


# --- frames that cannot be taken --------------------------------------------------------------


def test_an_oversized_frame_is_refused_from_its_length_prefix_alone() -> None:
    reader = RequestReader(max_frame_size=1000)
    assert reader.feed(b"\x00\x00") == []
    with pytest.raises(MalformedData, match="frame of 1001 bytes exceeds the limit of 1000"):
        reader.feed(struct.pack(">I", 1001)[2:])
    with pytest.raises(MalformedData, match=f"frame of {2**32 - 1} bytes exceeds the limit"):
        ResponseReader().feed(b"\xff\xff\xff\xff")


def test_an_oversized_frame_after_good_ones_names_its_stream_offset() -> None:
    good = ReadLacRequest(1, WIDE).encode()
    reader = RequestReader()
    with pytest.raises(MalformedData, match=f"stream offset {2 * len(good)}"):
        reader.feed(good + good + struct.pack(">I", MAX_FRAME_SIZE + 1))


def test_a_frame_shorter_than_a_header_is_refused() -> None:
    with pytest.raises(MalformedData, match="shorter than the 36-byte request header"):
        RequestReader().feed(struct.pack(">I", 35))
    with pytest.raises(MalformedData, match="shorter than the 40-byte response header"):
        ResponseReader().feed(struct.pack(">I", 39))


def test_a_failed_reader_refuses_every_later_feed() -> None:
    reader = RequestReader()
    with pytest.raises(MalformedData):
        reader.feed(request_frame(Operation.READ_LAC, version=2))
    assert reader.pending_bytes == 0
    for data in (ReadLacRequest(1, WIDE).encode(), b""):
        with pytest.raises(
            MalformedData, match="unusable after an earlier error: protocol version"
        ):
            reader.feed(data)


# --- receiving into arenas ------------------------------------------------------------------


def receive(reader: FrameReader[Request], data: bytes, most: int = 1 << 30) -> list[Request]:
    """What a transport does: receive into `get_buffer()`, at most `most` bytes at a time."""
    decoded: list[Request] = []
    pos = 0
    while pos < len(data):
        room = reader.get_buffer()
        assert len(room) >= MIN_RECEIVE
        taken = min(len(room), most, len(data) - pos)
        room[:taken] = data[pos : pos + taken]
        del room
        pos += taken
        decoded += reader.buffer_updated(taken)
    return decoded


def large_add(entry_id: int, size: int = KEEP_IN_PLACE) -> AddRequest:
    payload = bytes([entry_id % 251]) * size
    return AddRequest.for_entry(entry_id, entry_of(LEDGER, entry_id, payload), KEY)


def test_a_large_entry_stays_a_view_of_the_arena_and_a_small_one_is_copied() -> None:
    large, small = large_add(1), add_of(entry_id=2)
    [got_large, got_small] = receive(RequestReader(), large.encode() + small.encode())
    assert type(got_large.entry) is memoryview  # type: ignore[attr-defined]
    assert type(got_small.entry) is bytes  # type: ignore[attr-defined]
    assert (got_large, got_small) == (large, small)
    got_large.verify_crc()  # type: ignore[attr-defined]


def test_large_entries_are_copied_in_an_arena_that_other_requests_mostly_filled() -> None:
    """Kept views hold their whole arena: a few kept bytes among many other requests would
    hold megabytes, so an entry stays in place only while kept entries are at least half of
    what its arena received."""
    reads = b"".join(ReadLacRequest(i, WIDE).encode() for i in range(600))  # 24,000 bytes
    first, second = large_add(1), large_add(2)
    reader = RequestReader()
    decoded = receive(reader, first.encode() + reads + second.encode())
    assert type(decoded[0].entry) is memoryview  # type: ignore[attr-defined]
    assert type(decoded[-1].entry) is bytes  # type: ignore[attr-defined]
    assert (decoded[0], decoded[-1]) == (first, second)
    # Nothing kept, an arena starts over: reads first, then an entry, copied the same way.
    reader = RequestReader()
    *_, after_reads = receive(reader, reads + second.encode())
    assert type(after_reads.entry) is bytes  # type: ignore[attr-defined]
    [again] = receive(reader, first.encode())
    assert type(again.entry) is memoryview  # type: ignore[attr-defined]


def test_an_entry_just_below_the_threshold_is_copied() -> None:
    payload_size = KEEP_IN_PLACE - len(entry_of(LEDGER, 1, b"")) - 1
    request = AddRequest.for_entry(1, entry_of(LEDGER, 1, b"x" * payload_size), KEY)
    assert len(request.entry) == KEEP_IN_PLACE - 1
    [got] = receive(RequestReader(), request.encode())
    assert type(got.entry) is bytes  # type: ignore[attr-defined]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from([10, KEEP_IN_PLACE, 3 * KEEP_IN_PLACE, 70_000]), max_size=40),
    st.lists(st.integers(1, 100_000), min_size=1, max_size=8),
    st.lists(st.booleans(), min_size=1, max_size=8),
)
def test_entries_kept_as_views_are_never_written_over(
    sizes: list[int], receive_sizes: list[int], drops: list[bool]
) -> None:
    """A small pool, so arenas are taken again as soon as they are free: whatever a message
    still holds must keep its bytes, however the stream was cut, while the messages let go
    free their arenas for reuse."""
    adds = [large_add(i, size) for i, size in enumerate(sizes)]
    stream = b"".join(add.encode() for add in adds)
    reader = RequestReader(arenas=ReceiveArenas(2 * MIN_RECEIVE, retained=2))
    held: list[Request] = []
    pos = step = 0
    while pos < len(stream):
        room = reader.get_buffer()
        taken = min(len(room), receive_sizes[step % len(receive_sizes)], len(stream) - pos)
        room[:taken] = stream[pos : pos + taken]
        del room
        pos += taken
        held += reader.buffer_updated(taken)
        if drops[step % len(drops)] and held:
            dropped = held.pop(0)
            assert dropped == adds[dropped.request_id]
        step += 1
    assert reader.pending_bytes == 0
    for request in held:
        assert request == adds[request.request_id]  # type: ignore[attr-defined]


class CountingArenas(ReceiveArenas):
    def __init__(self) -> None:
        super().__init__(2 * MIN_RECEIVE, retained=32)
        self.reused = 0

    def take(self, size: int) -> bytearray:
        arena = super().take(size)
        self.reused += arena[:4] != bytes(4)  # a fresh arena is zeros; a frame's prefix is not
        return arena


def test_arenas_are_reused_once_their_entries_are_let_go_and_kept_ones_stay_intact() -> None:
    adds = [large_add(i, 30_000) for i in range(60)]
    arenas = CountingArenas()
    reader = RequestReader(arenas=arenas)
    kept = receive(reader, b"".join(a.encode() for a in adds), 50_000)
    assert arenas.reused == 0  # every arena holds entries still
    assert kept == adds
    del kept[: len(kept) // 2]
    more = [large_add(i, 30_000) for i in range(60, 100)]
    kept += receive(reader, b"".join(a.encode() for a in more), 50_000)
    assert arenas.reused > 0
    assert kept == adds[30:] + more


def test_a_frame_larger_than_an_arena_is_received_in_one_piece() -> None:
    request = large_add(1, 3 * MIN_RECEIVE)
    frame = request.encode()
    reader = RequestReader(arenas=ReceiveArenas(2 * MIN_RECEIVE))
    assert receive(reader, frame[:100]) == []
    room = reader.get_buffer()
    assert len(room) >= len(frame) - 100  # the rest of the frame fits
    room[: len(frame) - 100] = frame[100:]
    del room
    assert reader.buffer_updated(len(frame) - 100) == [request]


def test_a_released_reader_gives_its_arena_back_and_can_still_receive() -> None:
    arenas = ReceiveArenas(2 * MIN_RECEIVE)
    reader = RequestReader(arenas=arenas)
    receive(reader, ReadLacRequest(1, WIDE).encode()[:5])
    reader.release()
    assert arenas.waiting == 1
    assert reader.pending_bytes == 0
    assert receive(reader, ReadLacRequest(2, WIDE).encode()) == [ReadLacRequest(2, WIDE)]
    assert arenas.waiting == 0  # the reader took it again


def test_receiving_more_than_the_room_offered_is_refused() -> None:
    reader = RequestReader()
    room = len(reader.get_buffer())
    with pytest.raises(BadRequest, match=f"{room + 1} bytes received into {room}"):
        reader.buffer_updated(room + 1)
    with pytest.raises(BadRequest, match="-1 bytes received"):
        reader.buffer_updated(-1)
    assert receive(reader, ReadLacRequest(1, WIDE).encode()) == [ReadLacRequest(1, WIDE)]


def test_a_malformed_frame_received_fails_the_reader_for_good() -> None:
    reader = RequestReader(max_frame_size=1000)
    with pytest.raises(MalformedData, match="frame of 1001 bytes exceeds the limit of 1000"):
        receive(reader, struct.pack(">I", 1001))
    with pytest.raises(MalformedData, match="unusable after an earlier error"):
        receive(reader, ReadLacRequest(1, WIDE).encode())


ADD_ENTRY = entry_of(LEDGER, 3)
ADD_BODY = KEY + struct.pack(">I", crc32c(ADD_ENTRY)) + ADD_ENTRY

MALFORMED_REQUESTS = {
    "unknown version": (request_frame(Operation.READ_LAC, version=0), "protocol version 0"),
    "unknown operation": (request_frame(0x42), "operation 66 is unknown"),
    "operation zero": (request_frame(0), "operation 0 is unknown"),
    "a response": (response_frame(Operation.ADD), "a response frame arrived where a request"),
    "fencing an add": (
        request_frame(Operation.ADD, ADD_BODY, flags=Flags.DO_FENCING, entry_id=3),
        r"ADD request 9: flags 0x0001 are not valid here \(allowed: RECOVERY_ADD\)",
    ),
    "recovery read": (
        request_frame(Operation.READ, flags=Flags.RECOVERY_ADD),
        "READ request 9: flags 0x0002",
    ),
    "stream end on a request": (
        request_frame(Operation.READ_LAC, flags=Flags.STREAM_END),
        "READ_LAC request 9: flags 0x0004",
    ),
    "undefined flag": (request_frame(Operation.LEDGER_INFO, flags=0x8000), "flags 0x8000"),
    "read before -1": (request_frame(Operation.READ, entry_id=-2), "entry id -2 is below -1"),
    "add at -1": (request_frame(Operation.ADD, ADD_BODY, entry_id=-1), "entry id -1 is below 0"),
    "entry on read lac": (
        request_frame(Operation.READ_LAC, entry_id=4),
        "READ_LAC names no entry, so the entry id must be 0, not 4",
    ),
    "ledger on a dump": (
        request_frame(Operation.AVAILABILITY_DUMP, ledger_id=LedgerId(0, 1)),
        "AVAILABILITY_DUMP names no ledger",
    ),
    "scope on a dump": (
        request_frame(Operation.AVAILABILITY_DUMP, ledger_id=LedgerId(1, 0)),
        "AVAILABILITY_DUMP names no ledger",
    ),
    "add without key": (
        request_frame(Operation.ADD, KEY[:20], entry_id=3),
        "body of 20 bytes is shorter than the 36 bytes of master key and CRC32C",
    ),
    "add of an empty entry": (
        request_frame(Operation.ADD, ADD_BODY[:36], entry_id=3),
        "ADD request 9: empty entry",
    ),
    "add of a cut entry": (
        request_frame(Operation.ADD, ADD_BODY[:50], entry_id=3),
        "ADD request 9: entry of 14 bytes is cut short",
    ),
    "add for another ledger": (
        request_frame(Operation.ADD, ADD_BODY, ledger_id=LedgerId(0, 8), entry_id=3),
        "the header names ledger 8 entry 3 but the entry is ledger 7 entry 3",
    ),
    "add for another scope": (
        request_frame(Operation.ADD, ADD_BODY, ledger_id=LedgerId(1, 7), entry_id=3),
        "but the entry is ledger 7 entry 3",
    ),
    "add for another entry": (
        request_frame(Operation.ADD, ADD_BODY, entry_id=4),
        "names ledger 7 entry 4 but the entry is ledger 7 entry 3",
    ),
    "read with a body": (request_frame(Operation.READ, b"x"), "body of 1 bytes, expected 0"),
    "fencing read without key": (
        request_frame(Operation.READ, KEY[:31], flags=Flags.DO_FENCING),
        "body of 31 bytes, expected 32 .a fencing read carries the master key",
    ),
    "write lac cut": (request_frame(Operation.WRITE_LAC, KEY), "body of 32 bytes, expected 40"),
    "metadata copy without a copy": (
        request_frame(Operation.METADATA_COPY, KEY),
        "expected more than 32 \\(master key and a metadata copy\\)",
    ),
    "write lac below -1": (
        request_frame(Operation.WRITE_LAC, KEY + struct.pack(">q", -2)),
        "LAC -2 is below -1",
    ),
    "read lac with a body": (request_frame(Operation.READ_LAC, b"\0"), "expected 0"),
    "list with a body": (
        request_frame(Operation.GET_LIST_OF_ENTRIES_OF_LEDGER, b"\0" * 8),
        "GET_LIST_OF_ENTRIES_OF_LEDGER request 9: body of 8 bytes, expected 0",
    ),
    "dump with a body": (
        request_frame(Operation.AVAILABILITY_DUMP, b"\0", ledger_id=LedgerId(0, 0)),
        "expected 0",
    ),
    "info with a body": (request_frame(Operation.LEDGER_INFO, b"\0"), "expected 0"),
}


@pytest.mark.parametrize(("frame", "reason"), MALFORMED_REQUESTS.values(), ids=MALFORMED_REQUESTS)
def test_malformed_requests_are_refused_with_the_reason(frame: bytes, reason: str) -> None:
    reader = RequestReader()
    with pytest.raises(MalformedData, match=reason):
        reader.feed(frame)
    with pytest.raises(MalformedData, match="unusable"):
        reader.feed(ReadLacRequest(1, WIDE).encode())


MALFORMED_RESPONSES = {
    "unknown version": (response_frame(Operation.ADD, version=9), "protocol version 9"),
    "unknown operation": (response_frame(0x7F), "operation 127 is unknown"),
    "a request": (
        WriteLacRequest(9, LEDGER, KEY, 5).encode(),
        "a request frame arrived where a response",
    ),
    "stream end on an add": (
        response_frame(Operation.ADD, flags=Flags.STREAM_END),
        r"ADD response 9: flags 0x0004 are not valid here \(allowed: NONE\)",
    ),
    "echoed fencing flag": (
        response_frame(Operation.READ, flags=Flags.DO_FENCING),
        "READ response 9: flags 0x0001",
    ),
    "stream end on a dump error": (
        response_frame(
            Operation.AVAILABILITY_DUMP,
            b"oops",
            status=9,
            flags=Flags.STREAM_END,
            ledger_id=LedgerId(0, 0),
        ),
        "AVAILABILITY_DUMP response 9: flags 0x0004",
    ),
    "entry on read lac": (response_frame(Operation.READ_LAC, entry_id=1), "names no entry"),
    "ledger on a dump": (response_frame(Operation.AVAILABILITY_DUMP), "names no ledger"),
    "add with a body": (response_frame(Operation.ADD, b"x"), "body of 1 bytes, expected 0"),
    "write lac with a body": (response_frame(Operation.WRITE_LAC, b"x"), "expected 0"),
    "read lac cut": (response_frame(Operation.READ_LAC, b"\0" * 7), "body of 7 bytes, expected 8"),
    "lac below -1": (response_frame(Operation.READ_LAC, struct.pack(">q", -5)), "LAC -5"),
    "info cut": (response_frame(Operation.LEDGER_INFO, b"\0" * 24), "expected 25"),
    "fenced is two": (
        response_frame(Operation.LEDGER_INFO, struct.pack(">BqQQ", 2, 0, 0, 0)),
        "fenced byte is 2",
    ),
    "info lac below -1": (
        response_frame(Operation.LEDGER_INFO, struct.pack(">BqQQ", 0, -3, 0, 0)),
        "LAC -3 is below -1",
    ),
    "dump record header cut": (
        response_frame(Operation.AVAILABILITY_DUMP, b"\0" * 19, ledger_id=LedgerId(0, 0)),
        "record at body offset 0 is cut: 19 bytes, its header needs 20",
    ),
    "dump record body cut": (
        response_frame(
            Operation.AVAILABILITY_DUMP,
            struct.pack(">QQI", 0, 5, 4) + b"abc",
            ledger_id=LedgerId(0, 0),
        ),
        "record at body offset 0 for ledger 5 declares 4 bytes of availability, only 3 follow",
    ),
    "error message not utf-8": (
        response_frame(Operation.READ, b"\xff\xfe", status=13),
        "READ response 9: error message is not UTF-8",
    ),
}


@pytest.mark.parametrize(("frame", "reason"), MALFORMED_RESPONSES.values(), ids=MALFORMED_RESPONSES)
def test_malformed_responses_are_refused_with_the_reason(frame: bytes, reason: str) -> None:
    reader = ResponseReader()
    with pytest.raises(MalformedData, match=reason):
        reader.feed(frame)
    with pytest.raises(MalformedData, match="unusable"):
        reader.feed(AddResponse(1, LEDGER, 0).encode())


@settings(max_examples=300)
@given(st.binary(max_size=120))
def test_garbage_is_refused_or_decoded_canonically(garbage: bytes) -> None:
    """Random bytes never raise anything but MalformedData, and whatever decodes is exactly
    what an encoder writes (so no bit of a frame is ignored)."""
    for reader in (RequestReader(max_frame_size=200), ResponseReader(max_frame_size=200)):
        try:
            messages = reader.feed(garbage)
        except MalformedData:
            continue
        consumed = len(garbage) - reader.pending_bytes
        assert b"".join(message.encode() for message in messages) == garbage[:consumed]


def frames_with_one_byte_flipped(frame: bytes) -> list[tuple[int, bytes]]:
    return [
        (position, frame[:position] + bytes([frame[position] ^ bit]) + frame[position + 1 :])
        for position in range(len(frame))
        for bit in (0x01, 0x80)
    ]


@pytest.mark.parametrize(
    "message", [*SAMPLE_REQUESTS, *SAMPLE_RESPONSES], ids=lambda message: type(message).__name__
)
def test_a_flipped_bit_is_refused_or_decodes_to_what_the_bytes_say(
    message: Request | Response,
) -> None:
    for _, corrupt in frames_with_one_byte_flipped(message.encode()):
        reader = reader_for(message)
        try:
            decoded = reader.feed(corrupt)
        except MalformedData:
            continue
        consumed = len(corrupt) - reader.pending_bytes
        assert b"".join(m.encode() for m in decoded) == corrupt[:consumed]
        assert message not in decoded


def test_a_flipped_bit_never_stores_a_wrong_entry() -> None:
    """Whatever is flipped in an ADD, the entry and its ids that pass the bookie's first
    checks (framing, then CRC) are the client's."""
    request = add_of(WIDE, 12, request_id=77)
    refused = 0
    for position, corrupt in frames_with_one_byte_flipped(request.encode()):
        try:
            decoded = RequestReader().feed(corrupt)
            if not decoded:
                continue  # the length prefix now asks for more: the bookie waits for it
            assert isinstance(decoded[0], AddRequest)
            decoded[0].verify_crc()
        except (MalformedData, BadDigest):
            refused += 1
            continue
        decoded = decoded[0]
        assert (decoded.entry, decoded.ledger_id, decoded.entry_id) == (
            request.entry,
            request.ledger_id,
            request.entry_id,
        ), f"byte {position}"
    assert refused > len(request.entry)


# --- the end-to-end checksum, errors --------------------------------------------------------


def test_a_crc_mismatch_is_bad_digest_naming_ledger_and_entry() -> None:
    entry = entry_of(WIDE, 12)
    request = AddRequest(5, entry, KEY, crc32c(entry) ^ 1)
    decoded = decode_one(request.encode(), RequestReader())  # the frame itself is well-formed
    assert isinstance(decoded, AddRequest)
    with pytest.raises(BadDigest, match=f"ledger {WIDE} entry 12 .request 5.") as caught:
        decoded.verify_crc()
    assert caught.value.code == errors.BadDigest.code


def test_a_corrupted_entry_fails_the_crc_after_framing() -> None:
    frame = bytearray(add_of().encode())
    frame[-1] ^= 0x10  # the last payload byte, after the client computed the CRC
    (decoded,) = RequestReader().feed(frame)
    assert isinstance(decoded, AddRequest)
    with pytest.raises(BadDigest, match="ledger 7 entry 3"):
        decoded.verify_crc()
    add_of().verify_crc()


@pytest.mark.parametrize("error_type", list(errors.wire_codes().values()))
def test_error_responses_carry_code_and_message_back_to_the_same_type(
    error_type: type[errors.TallyError],
) -> None:
    request = ReadRequest(4, WIDE, -1, KEY)
    answer = ErrorResponse.answering(request, error_type(f"ledger {WIDE}: no"))
    assert (answer.operation, answer.request_id, answer.ledger_id, answer.entry_id) == (
        Operation.READ,
        4,
        WIDE,
        -1,
    )
    decoded = decode_one(answer.encode(), ResponseReader())
    assert isinstance(decoded, ErrorResponse)
    assert decoded.code == error_type.code
    error = decoded.error()
    assert type(error) is error_type
    assert str(error) == f"ledger {WIDE}: no"


def test_an_error_answers_a_request_without_ledger_or_entry() -> None:
    answer = ErrorResponse.answering(AvailabilityDumpRequest(3), errors.TooManyRequests("busy"))
    decoded = decode_one(answer.encode(), ResponseReader())
    assert isinstance(decoded, ErrorResponse)
    assert decoded.final
    assert (decoded.ledger_id, decoded.entry_id) == (LedgerId(0, 0), 0)
    assert isinstance(decoded.error(), errors.TooManyRequests)


def test_an_unknown_error_code_stays_visible() -> None:
    frame = response_frame(Operation.ADD, b"from the future", status=4242, entry_id=1)
    decoded = decode_one(frame, ResponseReader())
    assert isinstance(decoded, ErrorResponse)
    assert "4242" in str(decoded.error())
    assert "from the future" in str(decoded.error())


# --- what encoders refuse -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: AddRequest.for_entry(1, entry_of(), KEY[:31]).encode(), "master key must be 32"),
        (lambda: ReadRequest(1, LEDGER, 0, b"k" * 33).encode(), "master key must be 32"),
        (lambda: WriteLacRequest(1, LEDGER, "k" * 32, 0).encode(), "master key"),  # type: ignore[arg-type]
        (lambda: WriteLacRequest(1, LEDGER, KEY, -2).encode(), "LAC -2 is outside"),
        (lambda: MetadataCopyRequest(1, LEDGER, KEY, b"").encode(), "non-empty bytes"),
        (lambda: MetadataCopyRequest(1, LEDGER, KEY[:8], b"x").encode(), "master key"),
        (lambda: AddRequest.for_entry(-1, entry_of(), KEY).encode(), "request id -1 is outside"),
        (lambda: AddRequest(1, entry_of(), KEY, 1 << 32).encode(), "crc32c 4294967296"),
        (lambda: ReadLacRequest(1 << 64, LEDGER).encode(), "request id"),
        (lambda: ReadRequest(1, LEDGER, -2).encode(), "entry id -2 is outside"),
        (lambda: ReadRequest(1, LEDGER, 1 << 63).encode(), "entry id"),
        (lambda: ReadRequest(1, 7, 0).encode(), "must be a LedgerId"),  # type: ignore[arg-type]
        (lambda: AddResponse(1, LEDGER, -1).encode(), "entry id -1 is below 0"),
        (lambda: ReadResponse(1, LEDGER, 0, bytearray(b"x")).encode(), "entry must be bytes"),  # type: ignore[arg-type]
        (lambda: ReadLacResponse(1, LEDGER, -2).encode(), "LAC -2"),
        (
            lambda: LedgerInfoResponse(1, LEDGER, LedgerInfo(1, 0, 0, 0)).encode(),  # type: ignore[arg-type]
            "fenced must be a bool",
        ),
        (
            lambda: LedgerInfoResponse(1, LEDGER, LedgerInfo(True, 0, -1, 0)).encode(),
            "entry count -1",
        ),
        (
            lambda: ErrorResponse(Operation.ADD, 1, LEDGER, 0, 0, "ok?").encode(),
            "status 0 means OK",
        ),
        (
            lambda: ErrorResponse(Operation.ADD, 1, LEDGER, 0, 1 << 31, "x").encode(),
            "code 2147483648",
        ),
        (lambda: ErrorResponse(99, 1, LEDGER, 0, 5, "x").encode(), "not an Operation"),  # type: ignore[arg-type]
        (
            lambda: ErrorResponse(Operation.AVAILABILITY_DUMP, 1, LEDGER, 0, 5, "x").encode(),
            "names no ledger",
        ),
        (
            lambda: AvailabilityDumpResponse(
                1,
                (LedgerAvailability(LEDGER, "x"),),
                stream_end=True,  # type: ignore[arg-type]
            ).encode(),
            "availability of ledger 7 must be bytes",
        ),
        (lambda: AddRequest(1, bytearray(entry_of()), KEY, 0), "entry must be bytes"),  # type: ignore[arg-type]
        (lambda: AddRequest(1, b"\x00" * 10, KEY, 0), "cut short"),
    ],
)
def test_encoders_refuse_what_a_reader_would_not_take(make: object, reason: str) -> None:
    with pytest.raises(BadRequest, match=reason):
        make()  # type: ignore[operator]


def test_encoders_respect_the_frame_limit() -> None:
    request = add_of()
    limit = len(request.encode()) - 4
    assert limit == len(request.entry) + 72  # the ADD overhead its docstring promises
    assert decode_one(request.encode(limit), RequestReader(limit)) == request
    with pytest.raises(
        BadRequest, match=f"frame of {limit} bytes exceeds the limit of {limit - 1}"
    ):
        request.encode(limit - 1)
    with pytest.raises(BadRequest, match="exceeds the limit of 100"):
        ReadResponse(1, LEDGER, 0, bytes(61)).encode(100)
    assert len(ReadResponse(1, LEDGER, 0, bytes(60)).encode(100)) == 104


# --- the availability dump ------------------------------------------------------------------


def decode_dump(frames: list[bytes], budget: int) -> list[AvailabilityDumpResponse]:
    reader = ResponseReader(max_frame_size=budget)
    batches = [batch for frame in frames for batch in reader.feed(frame)]
    assert all(isinstance(batch, AvailabilityDumpResponse) for batch in batches)
    return batches  # type: ignore[return-value]


@settings(max_examples=80)
@given(
    st.lists(st.builds(LedgerAvailability, ledger_ids, st.binary(max_size=90)), max_size=25),
    st.integers(RESPONSE_HEADER_SIZE + 20 + 90, 600),
    request_ids,
)
def test_the_dump_encoder_respects_its_budget_and_ends_the_stream_once(
    dump: list[LedgerAvailability], budget: int, request_id: int
) -> None:
    frames = list(encode_availability_dump(request_id, iter(dump), budget))
    assert all(len(frame) - 4 <= budget for frame in frames)
    batches = decode_dump(frames, budget)
    assert [batch.stream_end for batch in batches] == [False] * (len(batches) - 1) + [True]
    assert all(batch.request_id == request_id for batch in batches)
    assert [record for batch in batches for record in batch.records] == dump
    # a batch is only cut when the next record would not have fit
    for batch, following in itertools.pairwise(batches):
        used = RESPONSE_HEADER_SIZE + sum(record.record_size for record in batch.records)
        assert used + following.records[0].record_size > budget
    assert all(batch.records for batch in batches[:-1])


def test_an_empty_dump_is_one_empty_final_frame() -> None:
    (frame,) = encode_availability_dump(5, [])
    assert decode_dump([frame], MAX_FRAME_SIZE) == [AvailabilityDumpResponse(5, (), True)]


def test_the_dump_encoder_streams_as_records_come() -> None:
    encoder = AvailabilityDumpEncoder(8, budget=RESPONSE_HEADER_SIZE + 2 * (20 + 10))
    record = LedgerAvailability(LEDGER, bytes(10))
    assert encoder.add(record) is None
    assert encoder.add(record) is None
    full = encoder.add(record)
    assert full is not None
    assert decode_dump([full], MAX_FRAME_SIZE) == [
        AvailabilityDumpResponse(8, (record, record), stream_end=False)
    ]
    last = encoder.finish()
    assert decode_dump([last], MAX_FRAME_SIZE) == [AvailabilityDumpResponse(8, (record,), True)]
    with pytest.raises(BadRequest, match="finished"):
        encoder.add(record)
    with pytest.raises(BadRequest, match="finished"):
        encoder.finish()


def test_a_record_larger_than_the_budget_is_refused_naming_its_ledger() -> None:
    encoder = AvailabilityDumpEncoder(8, budget=200)
    kept = LedgerAvailability(LEDGER, bytes(10))
    assert encoder.add(kept) is None
    with pytest.raises(BadRequest, match=f"availability of ledger {WIDE} takes 161 bytes"):
        encoder.add(LedgerAvailability(WIDE, bytes(141)))
    with pytest.raises(BadRequest, match="must be a LedgerAvailability"):
        encoder.add((WIDE, b""))  # type: ignore[arg-type]
    assert decode_dump([encoder.finish()], 200) == [AvailabilityDumpResponse(8, (kept,), True)]


@pytest.mark.parametrize("budget", [RESPONSE_HEADER_SIZE + 19, 1 << 32])
def test_the_dump_budget_must_fit_a_record_and_a_frame(budget: int) -> None:
    with pytest.raises(BadRequest, match="budget"):
        AvailabilityDumpEncoder(1, budget)


@settings(max_examples=60)
@given(st.lists(state_records, max_size=20), st.integers(RESPONSE_HEADER_SIZE + 66 + 400, 2000))
def test_a_dump_with_state_streams_its_records_in_frames_flagged_so(
    dump: list[StateRecord], budget: int
) -> None:
    frames = list(encode_availability_dump(4, iter(dump), budget, with_state=True))
    batches = decode_dump(frames, budget)
    assert all(batch.with_state for batch in batches)
    assert [record for batch in batches for record in batch.records] == dump


def test_a_dump_takes_the_records_of_its_kind_only() -> None:
    plain = AvailabilityDumpEncoder(1)
    with pytest.raises(BadRequest, match="StateRecord does not belong"):
        plain.add(StateRecord.cookie_of(b"c"))
    with_state = AvailabilityDumpEncoder(1, with_state=True)
    with pytest.raises(BadRequest, match="LedgerAvailability does not belong"):
        with_state.add(LedgerAvailability(LEDGER, b""))
    with pytest.raises(BadRequest, match="master key"):
        with_state.add(
            StateRecord.held(
                LEDGER, b"", fenced=False, last_add_confirmed=-1, master_key=b"short",
                metadata_copy=None,
            )
        )  # fmt: skip
    with pytest.raises(BadRequest, match="digest type"):
        with_state.add(
            StateRecord.held(
                LEDGER, b"", fenced=False, last_add_confirmed=-1, master_key=None,
                metadata_copy=None, digest_type=3,  # type: ignore[arg-type]
            )
        )  # fmt: skip


@pytest.mark.parametrize("digest_type", [None, *DigestType])
def test_a_ledger_s_digest_type_is_the_upper_nibble_of_its_flags(
    digest_type: DigestType | None,
) -> None:
    """BookKeeper's number, as a V2 entry's flags hold it; 0 where its entries did not say."""
    record = StateRecord.held(
        LEDGER, b"", fenced=True, last_add_confirmed=-1, master_key=None, metadata_copy=None,
        digest_type=digest_type,
    )  # fmt: skip
    header, _, _ = state_record_parts(record)
    assert header[17] == (0 if digest_type is None else digest_type << 4) | 0x1


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (bytes(10), "is cut"),
        (bytes([3]) + bytes(65), "kind 3"),
        (bytes([2]) + bytes(16) + bytes([0x08]) + bytes(48), "fields its kind leaves zero"),
        (bytes([1]) + bytes(16) + bytes([0x50]) + bytes(48), "flags 0x50"),  # digest type 5
        (bytes([0]) + bytes(16) + bytes([0x30]) + bytes(48), "fields its kind leaves zero"),
        (bytes([1]) + bytes(57) + (5).to_bytes(4, "big") + bytes(4), "declares 5 bytes"),
    ],
)
def test_a_malformed_state_record_is_refused(body: bytes, problem: str) -> None:
    frame = response_frame(
        Operation.AVAILABILITY_DUMP,
        body,
        flags=Flags.WITH_STATE | Flags.STREAM_END,
        ledger_id=LedgerId(0, 0),
    )
    with pytest.raises(MalformedData, match=problem):
        ResponseReader().feed(frame)


def test_the_dump_request_id_is_checked_up_front() -> None:
    with pytest.raises(BadRequest, match="request id -1"):
        encode_availability_dump(-1, [])


@given(
    st.lists(st.tuples(st.sampled_from([WIDE, LedgerId(0, 7), LedgerId(3, 7)]), st.integers(0, 9)))
)
def test_add_answers_of_interleaved_ledgers_each_name_their_own(
    answers: list[tuple[LedgerId, int]],
) -> None:
    """The reader keeps the last ADD answer's ledger id to reuse: never for another."""
    batch = [AddResponse(i, ledger, entry) for i, (ledger, entry) in enumerate(answers)]
    decoded = ResponseReader().feed(b"".join(response.encode() for response in batch))
    assert decoded == batch


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda f: f[:6] + b"\x00\x01" + f[8:], "flags"),  # a flag an ADD answer cannot carry
        (lambda f: f[:32] + struct.pack(">q", -1) + f[40:], "below 0"),  # a negative entry id
        (lambda f: f[:4] + b"\x02" + f[5:], "version 2"),
        (lambda f: struct.pack(">I", len(f) - 4 + 2) + f[4:] + b"xx", "expected 0"),  # a body
    ],
)
def test_add_answers_out_of_shape_are_refused(
    change: Callable[[bytes], bytes], problem: str
) -> None:
    frame = AddResponse(1, WIDE, 3).encode()
    with pytest.raises(MalformedData, match=problem):
        ResponseReader().feed(change(frame))


@given(st.integers(0, UINT64_MAX), st.integers(0, INT64_MAX), st.booleans())
def test_a_bookie_s_add_answer_is_the_add_response_of_the_request(
    request_id: int, entry_id: int, recovery: bool
) -> None:
    """`AddResponse.answering` packs without checking again what the reader checked."""
    frame = AddRequest.for_entry(request_id, entry_of(WIDE, entry_id), KEY, recovery).encode()
    (request,) = RequestReader().feed(frame)
    assert isinstance(request, AddRequest)
    expected = AddResponse(request_id, WIDE, entry_id)
    assert AddResponse.answering(request) == expected.encode()
    assert ResponseReader().feed(AddResponse.answering(request)) == [expected]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda f: f[:6] + b"\x00\x01" + f[8:], "flags"),  # DO_FENCING: a read's flag
        (lambda f: f[:32] + struct.pack(">q", -1) + f[40:], "below 0"),  # a negative entry id
        (lambda f: f[:4] + b"\x02" + f[5:], "version 2"),
        (lambda f: f[:5] + b"\x81" + f[6:], "a response frame arrived"),
        (lambda f: f[:32] + struct.pack(">q", 6) + f[40:], "entry 6 but the entry is"),
    ],
)
def test_add_requests_out_of_shape_are_refused(
    change: Callable[[bytes], bytes], problem: str
) -> None:
    """The reader's short path for adds lets through only what its general checks would."""
    frame = AddRequest.for_entry(1, entry_of(WIDE, 5), KEY).encode()
    assert RequestReader().feed(frame)[0].entry_id == 5
    with pytest.raises(MalformedData, match=problem):
        RequestReader().feed(change(frame))
