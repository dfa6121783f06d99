"""BookieConnection against a fake bookie (tests/support/fake_bookie.py) in the test's own
event loop."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tally.client.bookie_connection import STREAM_BACKLOG, BookieConnection
from tally.core.availability import EntryAvailability
from tally.core.digest import DigestType, master_key
from tally.core.entry_format import encode_entry
from tally.core.errors import (
    BadDigest,
    BadRequest,
    BookieUnavailable,
    EntryUnreadable,
    LedgerFenced,
    NoSuchEntry,
    NoSuchLedger,
    TallyError,
    Timeout,
    TooManyRequests,
    Unauthorized,
    WriteOnReadOnlyBookie,
)
from tally.core.ids import LedgerId
from tally.core.protocol import (
    AddRequest,
    AddResponse,
    ErrorResponse,
    LedgerAvailability,
    LedgerInfo,
    PreparedAdd,
    ReadLacRequest,
    ReadRequest,
    ReadResponse,
    Request,
    WriteLacResponse,
    encode_availability_dump,
)
from tests.support.fake_bookie import FakeBookie, FakeConnection, fake_bookie
from tests.support.polling import until

DEADLINE = 15.0
KEY = master_key(b"secret")
LEDGER = LedgerId(0, 7)
WIDE = LedgerId(0xDEAD_BEEF, 0x1234)


def entry(ledger: LedgerId, entry_id: int, payload: bytes = b"payload") -> bytes:
    length = len(payload) + entry_id
    return encode_entry(ledger, entry_id, entry_id - 1, length, payload, DigestType.CRC32C)


@asynccontextmanager
async def connected(**options: Any) -> AsyncIterator[tuple[FakeBookie, BookieConnection]]:
    async with fake_bookie() as bookie:
        connection = await BookieConnection.connect(bookie.address, **options)
        try:
            yield bookie, connection
        finally:
            await connection.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- requests and answers -------------------------------------------------------------------


async def test_add_then_read_back_each_entry_and_the_last() -> None:
    async with connected() as (bookie, connection):
        entries = [entry(WIDE, i, bytes([i]) * i) for i in range(5)]
        for data in entries:
            await connection.add(data, KEY)
        assert bookie.entries[WIDE] == dict(enumerate(entries))
        assert [await connection.read(WIDE, i) for i in range(5)] == entries
        assert await connection.read(WIDE, -1) == entries[-1]
        assert all(isinstance(r, AddRequest) and r.master_key == KEY for r in bookie.received[:5])


async def test_add_nowait_resolves_to_none_and_sends_the_crc_and_recovery_flag() -> None:
    async with connected() as (bookie, connection):
        data = entry(LEDGER, 0)
        future = connection.add_nowait(data, KEY, recovery=True)
        await future
        assert future.result() is None
        (request,) = bookie.received
        assert isinstance(request, AddRequest)
        assert request.recovery
        assert request.entry == data
        request.verify_crc()


async def test_lac_ledger_info_and_list_of_entries() -> None:
    async with connected() as (bookie, connection):
        assert await connection.read_lac(LEDGER) == -1
        await connection.write_lac(LEDGER, KEY, 41)
        assert bookie.lacs[LEDGER] == 41
        assert await connection.read_lac(LEDGER) == 41
        for i in (0, 1, 2, 5):
            await connection.add(entry(LEDGER, i), KEY)
        assert list(await connection.get_list_of_entries(LEDGER)) == [0, 1, 2, 5]
        info = await connection.ledger_info(LEDGER)
        sizes = sum(len(entry(LEDGER, i)) for i in (0, 1, 2, 5))
        assert info == LedgerInfo(False, 41, 4, sizes)


async def test_fencing_read_carries_the_key_and_fences() -> None:
    async with connected() as (bookie, connection):
        await connection.add(entry(LEDGER, 0), KEY)
        assert await connection.read(LEDGER, 0, fencing_key=KEY) == entry(LEDGER, 0)
        read = bookie.received[-1]
        assert isinstance(read, ReadRequest)
        assert read.master_key == KEY
        with pytest.raises(LedgerFenced):
            await connection.add(entry(LEDGER, 1), KEY)
        await connection.add(entry(LEDGER, 1), KEY, recovery=True)
        assert (await connection.ledger_info(LEDGER)).fenced


async def test_pipelined_adds_resolve_in_the_order_the_bookie_answers() -> None:
    async with connected() as (bookie, connection):
        bookie.hold = True
        futures = [connection.add_nowait(entry(LEDGER, i), KEY) for i in range(60)]
        await until(lambda: len(bookie.held) == 60)
        order = list(range(60))
        random.Random(7).shuffle(order)
        answered: set[int] = set()
        for start in range(0, 60, 15):
            chunk = [bookie.held[i][1].entry_id for i in order[start : start + 15]]
            bookie.release(order[start : start + 15])
            await asyncio.gather(*(futures[i] for i in chunk))
            answered.update(chunk)
            assert {i for i, f in enumerate(futures) if f.done()} == answered


def inside_receive() -> bool:
    """Whether the caller runs inside the connection's receive callback."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "buffer_updated":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class Answers:
    """What an `add_prepared`'s AddAnswers was told (an entry, its error, whether inside the
    receive callback), and the entry ids of each `acknowledged` call."""

    def __init__(self) -> None:
        self.told: list[tuple[int, Exception | None, bool]] = []
        self.calls: list[list[int]] = []

    def acknowledged(self, entry_ids: list[int]) -> None:
        self.calls.append(list(entry_ids))
        receiving = inside_receive()
        self.told += [(entry_id, None, receiving) for entry_id in entry_ids]

    def failed(self, entry_id: int, error: Exception) -> None:
        self.told.append((entry_id, error, inside_receive()))


async def test_a_prepared_add_is_acknowledged_inside_the_receive_its_error_a_turn_later() -> None:
    async with connected() as (bookie, connection):
        answers = Answers()
        bookie.hold = True
        for i in range(4):
            connection.add_prepared(PreparedAdd.of(entry(LEDGER, i), KEY), answers)
        await until(lambda: len(bookie.held) == 4)
        bookie.release([2, 0])
        await until(lambda: len(answers.told) == 2)
        assert answers.told == [(2, None, True), (0, None, True)]
        bookie.errors[LEDGER] = LedgerFenced("fenced")
        bookie.hold = False
        connection.add_prepared(PreparedAdd.of(entry(LEDGER, 4), KEY), answers)
        await until(lambda: len(answers.told) == 3)
        entry_id, error, receiving = answers.told[2]
        assert (entry_id, type(error), receiving) == (4, LedgerFenced, False)
        bookie.disconnect()
        await until(lambda: len(answers.told) == 5)
        assert sorted((e, type(x), r) for e, x, r in answers.told[3:]) == [
            (1, BookieUnavailable, False),
            (3, BookieUnavailable, False),
        ]
        told = len(answers.told)
        connection.add_prepared(PreparedAdd.of(entry(LEDGER, 5), KEY), answers)
        assert len(answers.told) == told  # never before add_prepared returns
        await until(lambda: len(answers.told) == told + 1)
        entry_id, error, _ = answers.told[-1]
        assert entry_id == 5
        assert isinstance(error, BookieUnavailable)


async def test_a_failing_acknowledgement_callback_does_not_lose_the_other_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The acks of one receive go to the writer together; when its callback raises, each is
    told again alone, so that only the answer it fails on is lost."""
    connection = by_hand()

    class FailingOnOne(Answers):
        def acknowledged(self, entry_ids: list[int]) -> None:
            if 1 in entry_ids:
                raise RuntimeError("a bug in the writer")
            super().acknowledged(entry_ids)

    answers = FailingOnOne()
    for entry_id in range(3):
        connection.add_prepared(PreparedAdd.of(entry(LEDGER, entry_id), KEY), answers)
    receive(connection, b"".join(add_answer(i, i) for i in range(3)))
    assert answers.calls == [[0], [2]]
    assert not connection.closed
    assert "acknowledgement callback failed" in caplog.text


class Transport(asyncio.Transport):
    """A transport that keeps what is written: the connection driven by hand, so that a
    test decides which answers arrive in one receive."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def receive(connection: BookieConnection, data: bytes) -> None:
    """`data` arriving in one receive."""
    buffer = connection.get_buffer(len(data))
    buffer[: len(data)] = data
    connection.buffer_updated(len(data))


def add_answer(request_id: int, entry_id: int) -> bytes:
    return AddResponse(request_id, LEDGER, entry_id).encode()


def by_hand() -> BookieConnection:
    connection = BookieConnection("127.0.0.1:1", asyncio.get_running_loop(), 30.0, 1 << 20)
    connection.connection_made(Transport())
    return connection


async def test_the_acks_of_one_receive_reach_each_writer_together_in_their_order() -> None:
    connection = by_hand()
    first, second = Answers(), Answers()
    for entry_id, answers in enumerate([first, first, second, second, first]):
        connection.add_prepared(PreparedAdd.of(entry(LEDGER, entry_id), KEY), answers)
    order = [(1, 1), (0, 0), (2, 2), (3, 3), (4, 4)]  # (request id, entry id)
    receive(connection, b"".join(add_answer(*answer) for answer in order))
    assert first.calls == [[1, 0], [4]]
    assert second.calls == [[2, 3]]
    assert all(receiving for _, _, receiving in first.told + second.told)


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(add_answer(999, 0), id="never sent"),
        pytest.param(add_answer(1, 7), id="another entry"),
    ],
)
async def test_acks_received_ahead_of_a_bad_answer_are_told_before_it_closes(bad: bytes) -> None:
    """An answer that cannot be trusted ends the connection; the acks of the same receive
    ahead of it were taken from the pending table, and are told, not lost."""
    connection = by_hand()
    answers = Answers()
    for entry_id in range(2):
        connection.add_prepared(PreparedAdd.of(entry(LEDGER, entry_id), KEY), answers)
    receive(connection, add_answer(0, 0) + bad)
    assert connection.closed
    assert answers.calls == [[0]]
    await until(lambda: len(answers.told) == 2)
    entry_id, error, _ = answers.told[1]
    assert entry_id == 1
    assert isinstance(error, BookieUnavailable)


async def test_acks_taken_before_a_writer_closes_the_connection_are_still_told() -> None:
    """A writer's acknowledged may close the connection: the answer already taken from the
    pending table is acknowledged, the later ones fail as unavailable."""
    connection = by_hand()

    class Closing(Answers):
        def acknowledged(self, entry_ids: list[int]) -> None:
            super().acknowledged(entry_ids)
            connection.connection_lost(ConnectionResetError("closed by a callback"))

    closing, other = Closing(), Answers()
    for entry_id, answers in enumerate([closing, other, closing]):
        connection.add_prepared(PreparedAdd.of(entry(LEDGER, entry_id), KEY), answers)
    receive(connection, b"".join(add_answer(i, i) for i in range(3)))
    assert closing.calls == [[0]]
    assert other.calls == [[1]]
    await until(lambda: len(closing.told) == 2)
    entry_id, error, _ = closing.told[1]
    assert entry_id == 2
    assert isinstance(error, BookieUnavailable)


async def test_request_ids_count_up_per_connection() -> None:
    async with connected() as (bookie, connection):
        await asyncio.gather(*(connection.read_lac(LEDGER) for _ in range(5)))
        other = await BookieConnection.connect(bookie.address)
        try:
            await other.read_lac(LEDGER)
        finally:
            await other.close()
        assert [r.request_id for r in bookie.received] == [0, 1, 2, 3, 4, 0]


@pytest.mark.parametrize(
    "error",
    [
        NoSuchLedger,
        NoSuchEntry,
        LedgerFenced,
        Unauthorized,
        BadDigest,
        EntryUnreadable,
        WriteOnReadOnlyBookie,
        TooManyRequests,
    ],
)
async def test_error_responses_raise_the_bookies_typed_error(error: type[TallyError]) -> None:
    async with connected() as (bookie, connection):
        message = f"ledger {LEDGER}: the bookie says {error.__name__} (é)"
        bookie.errors[LEDGER] = error(message)
        calls = [
            connection.add_nowait(entry(LEDGER, 0), KEY),
            connection.read(LEDGER, 0),
            connection.read_lac(LEDGER),
            connection.write_lac(LEDGER, KEY, 3),
            connection.get_list_of_entries(LEDGER),
            connection.ledger_info(LEDGER),
        ]
        for call in calls:
            with pytest.raises(error) as raised:
                await call
            assert type(raised.value) is error
            assert str(raised.value) == message
        assert await connection.read_lac(LedgerId(0, 8)) == -1


async def test_bad_arguments_raise_bad_request_and_send_nothing() -> None:
    async with connected() as (bookie, connection):
        with pytest.raises(BadRequest, match="master key"):
            connection.add_nowait(entry(LEDGER, 0), b"short")
        with pytest.raises(BadRequest):
            connection.add_nowait(b"not an entry", KEY)
        with pytest.raises(BadRequest):
            await connection.read(LEDGER, -2)
        with pytest.raises(BadRequest):
            await connection.read(LEDGER, 0, fencing_key=b"short")
        with pytest.raises(BadRequest):
            await connection.write_lac(LEDGER, KEY, -2)
        assert await connection.read_lac(LEDGER) == -1
        assert len(bookie.received) == 1


async def test_frames_over_the_size_limit() -> None:
    async with connected(max_frame_size=1024) as (bookie, connection):
        with pytest.raises(BadRequest, match="exceeds"):
            connection.add_nowait(entry(LEDGER, 0, bytes(2000)), KEY)
        # A writer's ADD, made once for connections of any limit, is refused by this one.
        with pytest.raises(BadRequest, match="over this connection's limit of 1024"):
            connection.add_prepared(PreparedAdd.of(entry(LEDGER, 0, bytes(2000)), KEY), Answers())
        assert not bookie.received
        bookie.entries[LEDGER] = {0: bytes(2000)}
        with pytest.raises(BookieUnavailable, match="exceeds the limit of 1024"):
            await connection.read(LEDGER, 0)


async def test_answers_to_cancelled_requests_are_dropped() -> None:
    async with connected() as (bookie, connection):
        bookie.hold = True
        add = connection.add_nowait(entry(LEDGER, 0), KEY)
        read = asyncio.ensure_future(connection.read(LEDGER, 0))
        await until(lambda: len(bookie.held) == 2)
        add.cancel()
        read.cancel()
        bookie.release()
        bookie.hold = False
        assert await connection.read(LEDGER, 0) == entry(LEDGER, 0)
        assert not connection.closed


# --- availability dumps ---------------------------------------------------------------------


def dump_records(count: int) -> list[LedgerAvailability]:
    return [
        LedgerAvailability(
            LedgerId(i % 3, i), EntryAvailability.span(0, i).to_bytes() if i % 4 else b""
        )
        for i in range(count)
    ]


async def test_dump_streams_every_record_across_frames() -> None:
    async with connected() as (bookie, connection):
        bookie.dump = dump_records(200)
        assert [record async for record in connection.availability_dump()] == bookie.dump
        assert bookie.dump_frames > 20
        bookie.dump = []
        assert [record async for record in connection.availability_dump()] == []


async def test_dump_reading_pauses_while_the_consumer_lags() -> None:
    async with connected() as (bookie, connection):
        bookie.dump = dump_records(2000)
        transport = connection._transport  # the only way to see the connection stop reading
        assert transport is not None
        records = []
        async with aclosing(connection.availability_dump()) as dump:
            records.append(await anext(dump))
            await until(lambda: not transport.is_reading())
            await asyncio.sleep(0.05)
            assert not transport.is_reading()
            records.extend([record async for record in dump])
        assert records == bookie.dump
        assert transport.is_reading()
        assert bookie.dump_frames > 10 * STREAM_BACKLOG


async def test_dump_left_early_leaves_the_connection_usable() -> None:
    async with connected() as (bookie, connection):
        bookie.dump = dump_records(2000)
        transport = connection._transport
        assert transport is not None
        async with aclosing(connection.availability_dump()) as dump:
            assert await anext(dump) == bookie.dump[0]
            await until(lambda: not transport.is_reading())
        assert transport.is_reading()
        assert await connection.read_lac(LEDGER) == -1
        assert not connection.closed


async def test_dump_error_after_some_frames() -> None:
    async with connected() as (bookie, connection):
        bookie.hold = True
        records = dump_records(50)
        received: list[LedgerAvailability] = []

        async def consume() -> None:
            async for record in connection.availability_dump():
                received.append(record)

        consumer = asyncio.create_task(consume())
        await until(lambda: len(bookie.held) == 1)
        request = bookie.held[0][1]
        frames = encode_availability_dump(request.request_id, records, 300)
        bookie.send_raw(next(frames) + next(frames))
        bookie.send_raw(ErrorResponse.answering(request, NoSuchLedger("gone")).encode())
        with pytest.raises(NoSuchLedger, match="gone"):
            await consumer
        assert received == records[: len(received)]
        assert len(received) > 1


# --- timeouts -------------------------------------------------------------------------------


async def test_timeout_then_the_late_answer_is_dropped() -> None:
    async with connected(request_timeout=0.3) as (bookie, connection):
        bookie.hold = True
        first = connection.add_nowait(entry(LEDGER, 0), KEY)
        await asyncio.sleep(0.15)
        second = connection.add_nowait(entry(LEDGER, 1), KEY)
        started = time.monotonic()
        with pytest.raises(Timeout, match=rf"{bookie.address}.*ADD request 0"):
            await first
        assert not second.done()
        with pytest.raises(Timeout, match="ADD request 1"):
            await second
        assert 0.1 < time.monotonic() - started < 1.0
        bookie.release()
        bookie.hold = False
        assert await connection.read_lac(LEDGER) == -1
        assert not connection.closed


async def test_a_lagging_dump_consumer_is_not_a_timeout() -> None:
    # The consumer lags three timeouts; a timeout of 0.1 s was missed by the (same-loop)
    # fake bookie itself on a loaded machine.
    async with connected(request_timeout=0.5) as (bookie, connection):
        bookie.dump = dump_records(2000)
        records = []
        async with aclosing(connection.availability_dump()) as dump:
            records.append(await anext(dump))
            await asyncio.sleep(1.5)
            records.extend([record async for record in dump])
        assert records == bookie.dump


async def test_timeout_of_reads_and_dumps() -> None:
    async with connected(request_timeout=0.1) as (bookie, connection):
        bookie.hold = True
        with pytest.raises(Timeout, match="READ request"):
            await connection.read(LEDGER, 3)
        with pytest.raises(Timeout, match="AVAILABILITY_DUMP"):
            async for _ in connection.availability_dump():
                pass


# --- failures of the connection -------------------------------------------------------------


async def pending_of_every_kind(connection: BookieConnection) -> list[asyncio.Future[Any]]:
    async def dump() -> list[LedgerAvailability]:
        return [record async for record in connection.availability_dump()]

    return [
        connection.add_nowait(entry(LEDGER, 0), KEY),
        asyncio.ensure_future(connection.read(LEDGER, 0)),
        asyncio.ensure_future(connection.ledger_info(LEDGER)),
        asyncio.ensure_future(dump()),
    ]


async def assert_all_unavailable(futures: list[asyncio.Future[Any]], cause: str) -> None:
    for future in futures:
        with pytest.raises(BookieUnavailable, match=cause):
            await future


async def test_bookie_closing_fails_every_pending_request() -> None:
    async with connected() as (bookie, connection):
        bookie.hold = True
        pending = await pending_of_every_kind(connection)
        await until(lambda: len(bookie.held) == 4)
        bookie.disconnect()
        await assert_all_unavailable(pending, rf"bookie {bookie.address}: closed by the bookie")
        assert connection.closed


async def test_closed_connection_refuses_new_requests_at_once() -> None:
    async with connected() as (bookie, connection):
        bookie.disconnect()
        await until(lambda: connection.closed)
        sent = len(bookie.received)
        started = time.monotonic()
        future = connection.add_nowait(entry(LEDGER, 0), KEY)
        assert future.done()
        with pytest.raises(BookieUnavailable, match=bookie.address):
            await future
        with pytest.raises(BookieUnavailable, match="closed by the bookie"):
            await connection.read(LEDGER, 0)
        with pytest.raises(BookieUnavailable):
            async for _ in connection.availability_dump():
                pass
        assert time.monotonic() - started < 0.5
        assert len(bookie.received) == sent


async def test_bookie_closing_mid_frame() -> None:
    async with connected() as (bookie, connection):
        bookie.hold = True
        pending = await pending_of_every_kind(connection)
        await until(lambda: len(bookie.held) == 4)
        _, request = bookie.held[1]
        answer = ReadResponse(request.request_id, LEDGER, 0, b"x" * 100).encode()
        bookie.send_raw(answer[:60])
        await asyncio.sleep(0.01)
        bookie.disconnect()
        await assert_all_unavailable(pending, "middle of a response .60 bytes")


async def test_garbage_fails_everything_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async with connected() as (bookie, connection):
        bookie.hold = True
        pending = await pending_of_every_kind(connection)
        await until(lambda: len(bookie.held) == 4)
        with caplog.at_level(logging.WARNING, "tally.client.bookie_connection"):
            bookie.send_raw(b"\x00\x00\x00\x30" + b"\xff" * 48)
            await assert_all_unavailable(pending, "malformed response: .*version 255")
        assert "version 255" in caplog.text
        assert bookie.address in caplog.text
        assert connection.closed
        await until(lambda: all(c.transport.is_closing() for c in bookie.connections))


@pytest.mark.parametrize(
    ("answer", "cause"),
    [
        (lambda held: AddResponse(999, LEDGER, 0).encode(), "request 999, which was never sent"),
        (lambda held: WriteLacResponse(held.request_id, LEDGER).encode(), "does not answer"),
        (lambda held: AddResponse(held.request_id, LEDGER, 5).encode(), "does not answer"),
        (lambda held: AddResponse(held.request_id, WIDE, 0).encode(), "does not answer"),
    ],
)
async def test_answers_that_match_no_request_close_the_connection(
    answer: Callable[[Request], bytes], cause: str
) -> None:
    async with connected() as (bookie, connection):
        bookie.hold = True
        pending = await pending_of_every_kind(connection)
        await until(lambda: len(bookie.held) == 4)
        bookie.send_raw(answer(bookie.held[0][1]))
        await assert_all_unavailable(pending, cause)


async def test_close_fails_pending_requests() -> None:
    async with connected() as (bookie, connection):
        bookie.hold = True
        pending = await pending_of_every_kind(connection)
        await until(lambda: len(bookie.held) == 4)
        await connection.close()
        await assert_all_unavailable(pending, "closed by the client")
        assert connection.closed
        await until(lambda: all(c.transport.is_closing() for c in bookie.connections))
        await connection.close()


async def test_close_does_not_wait_for_a_bookie_that_stopped_reading() -> None:
    async with connected() as (bookie, connection):
        await connection.read_lac(LEDGER)
        bookie.pause_reading(True)
        transport = connection._transport
        assert transport is not None
        futures = [connection.add_nowait(entry(LEDGER, i, bytes(1 << 20)), KEY) for i in range(40)]
        await until(lambda: transport.get_write_buffer_size() > 0)
        await asyncio.wait_for(connection.close(), 1.0)
        await assert_all_unavailable(futures, "closed by the client")


# --- connecting -----------------------------------------------------------------------------


async def test_connect_refused() -> None:
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(BookieUnavailable, match=rf"bookie {address}: cannot connect"):
        await BookieConnection.connect(address)


@pytest.mark.parametrize(
    "address", ["localhost", "localhost:", ":3181", "host:0", "host:65536", "host:x1", "[::1]"]
)
async def test_bad_address(address: str) -> None:
    with pytest.raises(BadRequest, match="host:port"):
        await BookieConnection.connect(address)


async def test_bad_options() -> None:
    with pytest.raises(BadRequest, match="needs ssl"):
        await BookieConnection.connect("127.0.0.1:1", server_hostname="bookie.test")
    with pytest.raises(BadRequest, match="request timeout"):
        await BookieConnection.connect("127.0.0.1:1", request_timeout=0)


async def test_ipv6_address() -> None:
    bookie = FakeBookie()
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(lambda: FakeConnection(bookie), "::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    try:
        connection = await BookieConnection.connect(f"[::1]:{server.sockets[0].getsockname()[1]}")
        assert await connection.read_lac(LEDGER) == -1
        await connection.close()
    finally:
        server.close()


# --- TLS ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for the name bookie.test, and its key."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=bookie.test",
            "-addext",
            "subjectAltName=DNS:bookie.test",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def server_context(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    return context


async def test_tls_round_trip(certificate: tuple[Path, Path]) -> None:
    async with fake_bookie(server_context(certificate)) as bookie:
        client = ssl.create_default_context(cafile=certificate[0])
        connection = await BookieConnection.connect(
            bookie.address, ssl=client, server_hostname="bookie.test"
        )
        try:
            transport = connection._transport
            assert transport is not None
            assert transport.get_extra_info("ssl_object") is not None
            data = entry(LEDGER, 0, bytes(100_000))
            await asyncio.gather(*(connection.add_nowait(data, KEY) for _ in range(20)))
            assert await connection.read(LEDGER, 0) == data
            bookie.dump = dump_records(100)
            assert [r async for r in connection.availability_dump()] == bookie.dump
        finally:
            await connection.close()


async def test_tls_with_an_untrusted_certificate(certificate: tuple[Path, Path]) -> None:
    async with fake_bookie(server_context(certificate)) as bookie:
        with pytest.raises(BookieUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            await BookieConnection.connect(
                bookie.address, ssl=ssl.create_default_context(), server_hostname="bookie.test"
            )
        trusting = ssl.create_default_context(cafile=certificate[0])
        with pytest.raises(BookieUnavailable, match="IP address mismatch"):
            await BookieConnection.connect(bookie.address, ssl=trusting)


async def test_connect_timeout_when_the_handshake_never_ends() -> None:
    with socket.socket() as silent:  # accepts TCP connections (backlog) but never speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(Timeout, match=rf"bookie {address}: not connected within 0.2 s"):
            await BookieConnection.connect(
                address, ssl=ssl.create_default_context(), connect_timeout=0.2
            )
        assert time.monotonic() - started < 1.0


# --- flow control ---------------------------------------------------------------------------


async def test_requests_wait_while_the_transport_is_paused() -> None:
    async with connected() as (bookie, connection):
        connection.pause_writing()
        add = connection.add_nowait(entry(LEDGER, 0), KEY)
        read_lac = asyncio.ensure_future(connection.read_lac(LEDGER))
        await asyncio.sleep(0.05)
        assert bookie.received == []
        assert not add.done()
        assert not read_lac.done()
        connection.resume_writing()
        await add
        assert await read_lac == -1
        assert [type(r) for r in bookie.received] == [AddRequest, ReadLacRequest]


async def test_adds_complete_through_real_backpressure() -> None:
    async with connected() as (bookie, connection):
        await connection.read_lac(LEDGER)
        bookie.pause_reading(True)
        transport = connection._transport
        assert transport is not None
        big = [entry(LEDGER, i, bytes(1 << 20)) for i in range(40)]
        futures = [connection.add_nowait(data, KEY) for data in big]
        await until(lambda: transport.get_write_buffer_size() > 0)
        later = asyncio.ensure_future(connection.add(entry(LEDGER, 40), KEY))
        await asyncio.sleep(0.05)
        assert not later.done()
        assert not any(f.done() for f in futures)
        bookie.pause_reading(False)
        await asyncio.gather(*futures, later)
        assert bookie.entries[LEDGER] == {**dict(enumerate(big)), 40: entry(LEDGER, 40)}
