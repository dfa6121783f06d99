"""The body of each operation's frame read back into its message, one decoder per operation
and direction, refusing any body an encoder would not write."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeAlias

from tally.core.digest import MASTER_KEY_SIZE
from tally.core.errors import MalformedData
from tally.core.ids import LedgerId
from tally.core.protocol.dump import decode_records, decode_state_records
from tally.core.protocol.entry_lists import decode_entry_records, decode_ledger_ids
from tally.core.protocol.read_entries import decode_entries, decode_entry_ids
from tally.core.protocol.requests import (
    AddRequest,
    AvailabilityDumpRequest,
    GetListOfEntriesOfLedgerRequest,
    GetListOfEntriesOfLedgersRequest,
    LedgerInfoRequest,
    MetadataCopyRequest,
    ReadEntriesRequest,
    ReadLacRequest,
    ReadRequest,
    Request,
    WriteLacRequest,
)
from tally.core.protocol.responses import (
    AddResponse,
    AvailabilityDumpResponse,
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
    ADD_FIXED,
    DO_FENCING,
    KEY_AND_LAC,
    LAC,
    LEDGER_INFO,
    RECOVERY_ADD,
    STREAM_END,
    WITH_STATE,
    Operation,
)

KEEP_IN_PLACE: Final = 8 << 10
"""An ADD's entry at least this long stays a view of the bytes it arrived in: copying large
entries out is a large part of a bookie's time per add. Shorter ones are copied, so that they do not
keep a megabyte arena alive for a few bytes; so are long ones in an arena that other
requests filled more than half of (`FrameReader._may_keep`)."""


def decode_add(
    request_id: int, scope: int, ledger: int, entry_id: int, flags: int, body: memoryview
) -> AddRequest:
    if len(body) < ADD_FIXED.size:
        raise MalformedData(
            f"body of {len(body)} bytes is shorter than the {ADD_FIXED.size} bytes of master "
            "key and CRC32C before the entry"
        )
    master_key, crc = ADD_FIXED.unpack_from(body)
    entry = body[ADD_FIXED.size :]
    request = AddRequest(
        request_id,
        entry if len(entry) >= KEEP_IN_PLACE else bytes(entry),
        master_key,
        crc,
        bool(flags & RECOVERY_ADD),
    )
    named = request.ledger_id
    if named.scope != scope or named.id != ledger or request.entry_id != entry_id:
        raise MalformedData(
            f"the header names ledger {LedgerId(scope, ledger)} entry {entry_id} but the entry "
            f"is ledger {named} entry {request.entry_id}"
        )
    return request


def _decode_read(
    request_id: int, scope: int, ledger: int, entry_id: int, flags: int, body: memoryview
) -> ReadRequest:
    if flags & DO_FENCING:
        _expect_size(body, MASTER_KEY_SIZE, "a fencing read carries the master key")
        return ReadRequest(request_id, LedgerId(scope, ledger), entry_id, bytes(body))
    _expect_size(body, 0, "a read without DO_FENCING carries nothing")
    return ReadRequest(request_id, LedgerId(scope, ledger), entry_id)


def _decode_write_lac(
    request_id: int, scope: int, ledger: int, entry_id: int, flags: int, body: memoryview
) -> WriteLacRequest:
    _expect_size(body, KEY_AND_LAC.size, "master key and LAC")
    master_key, lac = KEY_AND_LAC.unpack_from(body)
    _check_wire_lac(lac)
    return WriteLacRequest(request_id, LedgerId(scope, ledger), master_key, lac)


def _decode_metadata_copy(
    request_id: int, scope: int, ledger: int, entry_id: int, flags: int, body: memoryview
) -> MetadataCopyRequest:
    if len(body) <= MASTER_KEY_SIZE:
        raise MalformedData(
            f"body of {len(body)} bytes, expected more than {MASTER_KEY_SIZE} (master key and "
            "a metadata copy)"
        )
    return MetadataCopyRequest(
        request_id,
        LedgerId(scope, ledger),
        bytes(body[:MASTER_KEY_SIZE]),
        bytes(body[MASTER_KEY_SIZE:]),
    )


def _decode_dump_request(
    request_id: int, scope: int, ledger: int, entry_id: int, flags: int, body: memoryview
) -> Request:
    _expect_size(body, 0, "this request carries nothing")
    return AvailabilityDumpRequest(request_id, bool(flags & WITH_STATE))


def _decode_lists_request(
    request_id: int, scope: int, ledger: int, entry_id: int, flags: int, body: memoryview
) -> Request:
    return GetListOfEntriesOfLedgersRequest(request_id, decode_ledger_ids(body))


def _decode_read_entries_request(
    request_id: int, scope: int, ledger: int, entry_id: int, flags: int, body: memoryview
) -> Request:
    entry_ids, max_bytes = decode_entry_ids(entry_id, body)
    return ReadEntriesRequest(request_id, LedgerId(scope, ledger), entry_ids, max_bytes)


def _empty_request(
    make: Callable[[int, LedgerId], Request],
) -> Callable[[int, int, int, int, int, memoryview], Request]:
    def decode(
        request_id: int, scope: int, ledger: int, entry_id: int, flags: int, body: memoryview
    ) -> Request:
        _expect_size(body, 0, "this request carries nothing")
        return make(request_id, LedgerId(scope, ledger))

    return decode


RequestDecoder: TypeAlias = Callable[[int, int, int, int, int, memoryview], Request]
"""(request id, scope, ledger, entry id, flags, body) -> the request, its header checked."""

REQUEST_DECODERS: Final[dict[int, RequestDecoder]] = {
    Operation.ADD: decode_add,
    Operation.READ: _decode_read,
    Operation.READ_LAC: _empty_request(ReadLacRequest),
    Operation.WRITE_LAC: _decode_write_lac,
    Operation.GET_LIST_OF_ENTRIES_OF_LEDGER: _empty_request(GetListOfEntriesOfLedgerRequest),
    Operation.AVAILABILITY_DUMP: _decode_dump_request,
    Operation.LEDGER_INFO: _empty_request(LedgerInfoRequest),
    Operation.METADATA_COPY: _decode_metadata_copy,
    Operation.GET_LIST_OF_ENTRIES_OF_LEDGERS: _decode_lists_request,
    Operation.READ_ENTRIES: _decode_read_entries_request,
}


def _decode_read_lac_response(
    request_id: int, ledger_id: LedgerId, entry_id: int, flags: int, body: memoryview
) -> Response:
    _expect_size(body, LAC.size, "the LAC")
    (lac,) = LAC.unpack_from(body)
    _check_wire_lac(lac)
    return ReadLacResponse(request_id, ledger_id, lac)


def _decode_dump_response(
    request_id: int, ledger_id: LedgerId, entry_id: int, flags: int, body: memoryview
) -> Response:
    end = bool(flags & STREAM_END)
    if flags & WITH_STATE:
        return AvailabilityDumpResponse(request_id, decode_state_records(body), end, True)
    return AvailabilityDumpResponse(request_id, decode_records(body), end)


def _decode_ledger_info_response(
    request_id: int, ledger_id: LedgerId, entry_id: int, flags: int, body: memoryview
) -> Response:
    _expect_size(body, LEDGER_INFO.size, "fenced, LAC, entry count and bytes")
    fenced, lac, entry_count, byte_count = LEDGER_INFO.unpack_from(body)
    if fenced > 1:
        raise MalformedData(f"fenced byte is {fenced}; only 0 and 1 are defined")
    _check_wire_lac(lac)
    info = LedgerInfo(bool(fenced), lac, entry_count, byte_count)
    return LedgerInfoResponse(request_id, ledger_id, info)


def _empty_response(
    make: Callable[[int, LedgerId, int], Response],
) -> Callable[[int, LedgerId, int, int, memoryview], Response]:
    def decode(
        request_id: int, ledger_id: LedgerId, entry_id: int, flags: int, body: memoryview
    ) -> Response:
        _expect_size(body, 0, "this response carries nothing")
        return make(request_id, ledger_id, entry_id)

    return decode


def _bytes_response(
    make: Callable[[int, LedgerId, int, bytes], Response],
) -> Callable[[int, LedgerId, int, int, memoryview], Response]:
    def decode(
        request_id: int, ledger_id: LedgerId, entry_id: int, flags: int, body: memoryview
    ) -> Response:
        return make(request_id, ledger_id, entry_id, bytes(body))

    return decode


RESPONSE_DECODERS: Final[dict[int, Callable[[int, LedgerId, int, int, memoryview], Response]]] = {
    Operation.ADD: _empty_response(AddResponse),
    Operation.READ: _bytes_response(ReadResponse),
    Operation.READ_LAC: _decode_read_lac_response,
    Operation.WRITE_LAC: _empty_response(
        lambda request_id, ledger_id, _: WriteLacResponse(request_id, ledger_id)
    ),
    Operation.GET_LIST_OF_ENTRIES_OF_LEDGER: _bytes_response(
        lambda request_id, ledger_id, _, data: GetListOfEntriesOfLedgerResponse(
            request_id, ledger_id, data
        )
    ),
    Operation.AVAILABILITY_DUMP: _decode_dump_response,
    Operation.LEDGER_INFO: _decode_ledger_info_response,
    Operation.METADATA_COPY: _empty_response(
        lambda request_id, ledger_id, _: MetadataCopyResponse(request_id, ledger_id)
    ),
    Operation.GET_LIST_OF_ENTRIES_OF_LEDGERS: (
        lambda request_id, ledger_id, entry_id, flags, body: GetListOfEntriesOfLedgersResponse(
            request_id, decode_entry_records(body)
        )
    ),
    Operation.READ_ENTRIES: (
        lambda request_id, ledger_id, entry_id, flags, body: ReadEntriesResponse(
            request_id, ledger_id, entry_id, decode_entries(body)
        )
    ),
}


def _expect_size(body: memoryview, size: int, what: str) -> None:
    if len(body) != size:
        raise MalformedData(f"body of {len(body)} bytes, expected {size} ({what})")


def _check_wire_lac(lac: int) -> None:
    if lac < -1:
        raise MalformedData(f"LAC {lac} is below -1")


def utf8(body: memoryview) -> str:
    try:
        return str(body, "utf-8")
    except UnicodeDecodeError as error:
        raise MalformedData(
            f"error message is not UTF-8: {error.reason} at {error.start}"
        ) from None
