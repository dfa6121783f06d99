"""One connection to one bookie: pipelined requests, answered in any order, by request id.

An asyncio protocol rather than streams, so that an add needs no coroutine or task:
`add_nowait` encodes the frame, parks a future under the request id and queues the bytes;
the transport receives straight into the `ResponseReader`'s arena (`get_buffer`), and
`buffer_updated` resolves the futures of whatever answers arrived. Frames queued in one
event-loop turn leave in one write, so a burst of adds costs one send, not one each. A
writer's copies take `add_prepared` instead, with `AddAnswers` in place of a future: the
acknowledgements of one receive reach it together, from `buffer_updated` itself, not a
loop turn later.

Failures keep BookKeeper's distinction between a negative answer and an unknown one: an
error response raises the bookie's own typed error; no answer within `request_timeout`
raises `Timeout`; a connection that is refused, reset, closed, or that delivers a frame
that does not decode fails every pending and every later request with `BookieUnavailable`
naming the bookie and the cause. A connection is never reopened: the caller makes another.

Timeouts cost no timer per request: every request waits the same time, so deadlines grow
in the order requests are sent, which is the order of the pending table, and one timer
armed at the oldest deadline finds all the late ones at its front.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from asyncio import BaseEventLoop
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from ssl import SSLContext
from typing import Any, Final, Protocol, TypeAlias, cast

from tally.core import protocol
from tally.core.addresses import split_host_port
from tally.core.availability import EntryAvailability
from tally.core.errors import BadRequest, BookieUnavailable, MalformedData, TallyError, Timeout
from tally.core.ids import LedgerId
from tally.core.protocol import (
    AddResponse,
    AvailabilityDumpRequest,
    AvailabilityDumpResponse,
    ErrorResponse,
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
    PreparedAdd,
    ReadEntriesRequest,
    ReadEntriesResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    ResponseReader,
    StateRecord,
    WriteLacRequest,
    answered_prefix,
)
from tally.core.protocol.dump import DumpRecord
from tally.core.protocol.read_entries import check_answered
from tally.core.protocol.wire import EntryBytes

log = logging.getLogger(__name__)

STREAM_BACKLOG: Final = 4
"""Dump frames received and not yet consumed at which the connection stops reading, so a
slow consumer bounds the memory a dump takes (it also holds back other answers meanwhile)."""


class _Stream:
    """A dump's frames, or the error that ended it, waiting for the consumer."""

    __slots__ = ("backlogged", "items", "waiter")

    def __init__(self) -> None:
        self.items: deque[AvailabilityDumpResponse | TallyError] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.backlogged = False

    def push(self, item: AvailabilityDumpResponse | TallyError) -> None:
        self.items.append(item)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class AddAnswers(Protocol):
    """How the adds a writer sends to one bookie end: one object serves all its entries."""

    def acknowledged(self, entry_ids: list[int]) -> None:
        """The bookie has these entries durably: its acks in one receive, in their order."""

    def failed(self, entry_id: int, error: Exception) -> None:
        """The add of `entry_id` failed (told a loop turn after it is known)."""


class _Settles:
    """A future's AddAnswers: `add_nowait`'s, for its one entry."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future

    def acknowledged(self, entry_ids: list[int]) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def failed(self, entry_id: int, error: Exception) -> None:
        if not self.future.done():
            self.future.set_exception(error)


_Target: TypeAlias = "asyncio.Future[Any] | _Stream | AddAnswers"
_Sent: TypeAlias = "Request | PreparedAdd"
_Pending: TypeAlias = tuple[_Target, _Sent, float]
"""Who waits for the answer, the request, and its deadline on the loop's clock."""


class BookieConnection(asyncio.BufferedProtocol):
    """A client connection to the bookie at `address` ("host:port"); make it with `connect`.

    The asyncio.Protocol methods are the transport's to call, not the user's.
    """

    def __init__(
        self,
        address: str,
        loop: asyncio.AbstractEventLoop,
        request_timeout: float,
        max_frame_size: int,
    ) -> None:
        self.address = address
        self._loop = loop
        # A deadline per request sent: the standard loop's clock is time.monotonic, read
        # without the loop's method around it (3 Python calls fewer per replicated add).
        self._time = time.monotonic if type(loop).time is BaseEventLoop.time else loop.time
        self.closed = False
        """True once the connection failed or was closed: every request now fails at once."""
        self._request_timeout = request_timeout
        self._max_frame_size = max_frame_size
        self._reader = ResponseReader(max_frame_size)
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, _Pending] = {}
        self._next_id = 0
        self._timer: asyncio.TimerHandle | None = None
        self._outbox: list[EntryBytes | bytearray] = []
        self._writing_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._backlogged = 0
        self._failure: str | None = None
        self._lost: asyncio.Future[None] = loop.create_future()

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        ssl: SSLContext | None = None,
        connect_timeout: float = 5.0,
        request_timeout: float = 30.0,
        max_frame_size: int = protocol.MAX_FRAME_SIZE,
        server_hostname: str | None = None,
    ) -> BookieConnection:
        """Connect (and finish the TLS handshake, with `ssl`) within `connect_timeout`.

        `server_hostname` is the name the bookie's certificate must carry, when it is not
        the host of `address`. `max_frame_size` bounds the frames sent and received.
        """
        host, port = split_host_port(address)
        if server_hostname is not None and ssl is None:
            raise BadRequest(f"bookie {address}: server_hostname {server_hostname!r} needs ssl")
        for name, seconds in (
            ("connect timeout", connect_timeout),
            ("request timeout", request_timeout),
        ):
            if not seconds > 0:
                raise BadRequest(f"bookie {address}: the {name} must be positive, not {seconds}")
        loop = asyncio.get_running_loop()
        connection = cls(address, loop, request_timeout, max_frame_size)
        try:
            async with asyncio.timeout(connect_timeout):
                await loop.create_connection(
                    lambda: connection, host, port, ssl=ssl, server_hostname=server_hostname
                )
        except TimeoutError:
            raise Timeout(f"bookie {address}: not connected within {connect_timeout:g} s") from None
        except OSError as error:
            raise BookieUnavailable(f"bookie {address}: cannot connect: {error}") from error
        return connection

    # --- requests -------------------------------------------------------------------------

    def add_nowait(
        self, entry: bytes, master_key: bytes, *, recovery: bool = False
    ) -> asyncio.Future[None]:
        """Send an ADD of the encoded `entry` now; the future resolves when the bookie has it
        durably. Does not wait while the transport is full: the frame queues until it drains.
        """
        add = PreparedAdd.of(entry, master_key, recovery, self._max_frame_size)
        future: asyncio.Future[None] = self._loop.create_future()
        if self._failure is not None:
            future.set_exception(self._unavailable())
        else:
            self.add_prepared(add, _Settles(future))
        return future

    def add_prepared(self, add: PreparedAdd, answers: AddAnswers) -> None:
        """Send an ADD made once for every copy of its entry (a writer's). `answers` hears
        once how it ended: acknowledged straight from the connection's receive callback, or
        failed a loop turn after the error is known (never before this returns), so that
        failures meet the writer outside the connection's own code."""
        if add.frame_size > self._max_frame_size:
            raise BadRequest(
                f"{_describe(add, self._next_id)}: a frame of {add.frame_size} bytes "
                f"is over this connection's limit of {self._max_frame_size}"
            )
        if self._failure is not None:
            self._loop.call_soon(answers.failed, add.entry_id, self._unavailable())
            return
        request_id = self._next_id
        self._next_id = request_id + 1
        self._register(request_id, answers, add)
        self._send(add.head_for(request_id), add.entry)

    async def add(self, entry: bytes, master_key: bytes, *, recovery: bool = False) -> None:
        """`add_nowait`, after waiting for the transport to drain if it is full."""
        await self.drain()
        await self.add_nowait(entry, master_key, recovery=recovery)

    async def drain(self) -> None:
        """Wait while the transport is full (over its high-water mark), if it is."""
        if self._writing_paused:
            await self._drain()

    async def read(
        self, ledger_id: LedgerId, entry_id: int, *, fencing_key: bytes | None = None
    ) -> bytes:
        """The entry as the bookie stores it (entry id -1: the last it has). With the ledger's
        master key as `fencing_key`, the bookie fences the ledger first (a recovery read)."""
        response: ReadResponse = await self._call(
            lambda request_id: ReadRequest(request_id, ledger_id, entry_id, fencing_key)
        )
        return bytes(response.entry)  # decoded responses hold bytes: no copy

    async def read_entries(
        self, ledger_id: LedgerId, entry_ids: Sequence[int], max_bytes: int
    ) -> tuple[bytes, ...]:
        """The entries as the bookie stores them, for a prefix of `entry_ids` (ascending,
        1..MAX_ENTRIES_PER_READ) up to about `max_bytes`: ask again, or alone, for the rest.
        Raises the first entry's error if the bookie cannot serve it; a bookie too old to
        know the operation closes the connection (BookieUnavailable)."""
        asked = tuple(entry_ids)
        response: ReadEntriesResponse = await self._call(
            lambda request_id: ReadEntriesRequest(request_id, ledger_id, asked, max_bytes)
        )
        check_answered(len(asked), len(response.entries))
        return cast(tuple[bytes, ...], response.entries)  # decoded responses hold bytes

    async def read_lac(self, ledger_id: LedgerId) -> int:
        response: ReadLacResponse = await self._call(
            lambda request_id: ReadLacRequest(request_id, ledger_id)
        )
        return response.last_add_confirmed

    async def write_lac(
        self, ledger_id: LedgerId, master_key: bytes, last_add_confirmed: int
    ) -> None:
        await self._call(
            lambda request_id: WriteLacRequest(
                request_id, ledger_id, master_key, last_add_confirmed
            )
        )

    def metadata_copy_nowait(
        self, ledger_id: LedgerId, master_key: bytes, metadata: bytes
    ) -> asyncio.Future[Response | None]:
        """Send the ledger's metadata copy now (ahead of any frame sent after it); the future
        resolves when the bookie has it durably."""
        future: asyncio.Future[Response | None] = self._loop.create_future()
        try:
            self._submit(
                lambda request_id: MetadataCopyRequest(request_id, ledger_id, master_key, metadata),
                future,
            )
        except TallyError as error:
            future.set_exception(error)
        return future

    async def get_list_of_entries(self, ledger_id: LedgerId) -> EntryAvailability:
        """The entries the bookie's index has. MalformedData if it sends a bad encoding."""
        response: GetListOfEntriesOfLedgerResponse = await self._call(
            lambda request_id: GetListOfEntriesOfLedgerRequest(request_id, ledger_id)
        )
        return response.entries()

    async def get_lists_of_entries(
        self, ledger_ids: Sequence[LedgerId]
    ) -> tuple[LedgerEntries, ...]:
        """What the bookie holds of each of a prefix of `ledger_ids` (1..MAX_LEDGERS_PER_LIST),
        in their order: ask again for the rest. A bookie too old to know the operation closes
        the connection (BookieUnavailable)."""
        asked = tuple(ledger_ids)
        response: GetListOfEntriesOfLedgersResponse = await self._call(
            lambda request_id: GetListOfEntriesOfLedgersRequest(request_id, asked)
        )
        return answered_prefix(asked, response.records)

    async def ledger_info(self, ledger_id: LedgerId) -> LedgerInfo:
        response: LedgerInfoResponse = await self._call(
            lambda request_id: LedgerInfoRequest(request_id, ledger_id)
        )
        return response.info

    async def availability_dump(self) -> AsyncGenerator[LedgerAvailability, None]:
        """Every ledger the bookie holds, as its frames arrive.

        At most STREAM_BACKLOG frames wait for the consumer; then the connection stops
        reading until it catches up. `request_timeout` applies to each frame while the
        consumer waits for it. To leave early, `aclose()` the generator (contextlib.aclosing):
        the rest of the stream is then dropped.
        """
        async with contextlib.aclosing(self._dump(with_state=False)) as records:
            async for record in records:
                assert isinstance(record, LedgerAvailability)
                yield record

    async def state_dump(self) -> AsyncGenerator[StateRecord, None]:
        """The bookie's cookie, every ledger it holds with its state, and the ledgers it
        deleted under their tombstones (a metadata recovery's input); as availability_dump."""
        async with contextlib.aclosing(self._dump(with_state=True)) as records:
            async for record in records:
                assert isinstance(record, StateRecord)
                yield record

    async def _dump(self, *, with_state: bool) -> AsyncGenerator[DumpRecord, None]:
        if self._writing_paused:
            await self._drain()
        stream = _Stream()
        request = self._submit(
            lambda request_id: AvailabilityDumpRequest(request_id, with_state), stream
        )
        try:
            while True:
                while not stream.items:
                    stream.waiter = self._loop.create_future()
                    await stream.waiter
                item = stream.items.popleft()
                if stream.backlogged and len(stream.items) <= STREAM_BACKLOG // 2:
                    self._catch_up(stream)
                if isinstance(item, TallyError):
                    raise item
                for record in item.records:
                    yield record
                if item.stream_end:
                    return
        finally:
            entry = self._pending.get(request.request_id)
            if entry is not None and entry[0] is stream:
                del self._pending[request.request_id]
            self._catch_up(stream)

    async def close(self) -> None:
        """Fail what is pending with BookieUnavailable and close; requests not yet sent are
        dropped rather than flushed, since their callers have been told they failed."""
        self._fail("connection closed by the client")
        transport = self._transport
        if transport is not None:
            if transport.get_write_buffer_size():
                transport.abort()
            else:
                transport.close()
            await self._lost

    # --- asyncio.BufferedProtocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            responses = self._reader.buffer_updated(nbytes)
        except MalformedData as error:
            self._abort(f"malformed response: {error}")
            return
        pending = self._pending
        # The acks of a run of answers to one AddAnswers go to it together.
        acked: list[int] = []
        acks_to: AddAnswers | None = None
        for response in responses:
            request_id = response.request_id
            entry = pending.pop(request_id, None)
            if entry is None:
                if request_id >= self._next_id:
                    self._acknowledge(acks_to, acked)
                    self._abort(f"answer to request {request_id}, which was never sent")
                    return
                continue  # a late answer to a request that timed out or was given up
            target, request, _ = entry
            answer_ledger, request_ledger = response.ledger_id, request.ledger_id
            if (
                response.operation is not request.operation
                or response.entry_id != request.entry_id
                or answer_ledger.id != request_ledger.id
                or answer_ledger.scope != request_ledger.scope
            ):
                pending[request_id] = entry
                self._acknowledge(acks_to, acked)
                self._abort(_mismatch(response, request, request_id))
                return
            if isinstance(target, _Stream):
                self._deliver(target, request_id, request, response)
            elif isinstance(target, asyncio.Future):
                if target.done():
                    pass
                elif type(response) is ErrorResponse:
                    target.set_exception(response.error())
                else:
                    target.set_result(None if type(response) is AddResponse else response)
            elif type(response) is ErrorResponse:
                self._loop.call_soon(target.failed, request.entry_id, response.error())
            else:
                if target is not acks_to:
                    if not self._acknowledge(acks_to, acked):
                        # The writer closed this connection: the rest was failed, but this
                        # answer was taken from the pending table already.
                        self._acknowledge(target, [request.entry_id])
                        return
                    acked, acks_to = [], target
                acked.append(request.entry_id)
        self._acknowledge(acks_to, acked)

    def _acknowledge(self, answers: AddAnswers | None, entry_ids: list[int]) -> bool:
        """Tell `answers` of its acks; whether the connection is still open after.

        A callback that raises is told its acks again one at a time (a writer takes repeats
        as nothing new), so that a bug with one answer loses no other."""
        if answers is not None:
            try:
                answers.acknowledged(entry_ids)
            except Exception:
                log.exception("bookie %s: an add's acknowledgement callback failed", self.address)
                for entry_id in entry_ids:
                    with contextlib.suppress(Exception):
                        answers.acknowledged([entry_id])
        return self._failure is None

    def eof_received(self) -> None:
        """Let the transport close: the bookie will not answer what is pending."""

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._fail(f"connection lost: {type(exc).__name__}: {exc}")
        elif self._reader.pending_bytes:
            self._fail(
                f"closed by the bookie in the middle of a response "
                f"({self._reader.pending_bytes} bytes of it received)"
            )
        else:
            self._fail("closed by the bookie")
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._flush()
        self._wake_drainers()

    # --- internals ------------------------------------------------------------------------

    async def _call(self, make: Callable[[int], Request]) -> Any:
        """The OK response to the request `make` builds for a request id (buffer_updated has
        checked it answers that request's operation); an error response raises its error."""
        if self._writing_paused:
            await self._drain()
        future: asyncio.Future[Response | None] = self._loop.create_future()
        self._submit(make, future)
        return await future

    def _submit(self, make: Callable[[int], Request], target: _Target) -> Request:
        if self._failure is not None:
            raise self._unavailable()
        request_id = self._next_id
        request = make(request_id)
        frame = request.encode(self._max_frame_size)
        self._next_id = request_id + 1
        self._register(request_id, target, request)
        self._send(frame)
        return request

    def _register(self, request_id: int, target: _Target, request: _Sent) -> None:
        deadline = self._time() + self._request_timeout
        self._pending[request_id] = (target, request, deadline)
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._expire)

    def _send(self, *parts: EntryBytes | bytearray) -> None:
        """Queue a frame (in parts: an ADD's header, then its entry shared by every copy);
        the outbox goes out in one write at the loop's next turn."""
        outbox = self._outbox
        if not outbox:
            self._loop.call_soon(self._flush)
        outbox.extend(parts)

    def _flush(self) -> None:
        if self._writing_paused or not self._outbox or self._transport is None:
            return
        frames, self._outbox = self._outbox, []
        self._transport.write(frames[0] if len(frames) == 1 else b"".join(frames))

    async def _drain(self) -> None:
        while self._writing_paused and self._failure is None:
            if self._drained is None:
                self._drained = self._loop.create_future()
            await asyncio.shield(self._drained)

    def _wake_drainers(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _deliver(
        self, stream: _Stream, request_id: int, request: _Sent, response: Response
    ) -> None:
        if type(response) is ErrorResponse:
            stream.push(response.error())
            return
        assert type(response) is AvailabilityDumpResponse
        stream.push(response)
        if not response.stream_end:
            self._register(request_id, stream, request)
        if not stream.backlogged and len(stream.items) >= STREAM_BACKLOG:
            stream.backlogged = True
            self._backlogged += 1
            if self._backlogged == 1 and self._transport is not None:
                self._transport.pause_reading()

    def _catch_up(self, stream: _Stream) -> None:
        if stream.backlogged:
            stream.backlogged = False
            self._backlogged -= 1
            if self._backlogged == 0 and self._transport is not None:
                self._transport.resume_reading()

    def _expire(self) -> None:
        self._timer = None
        now = self._time()
        pending = self._pending
        due = []
        for request_id, (_, _, deadline) in pending.items():
            if deadline > now:
                break
            due.append(request_id)
        for request_id in due:
            target, request, _ = pending.pop(request_id)
            if isinstance(target, _Stream) and target.items:
                # The consumer is behind, not the bookie: the clock restarts when it waits.
                pending[request_id] = (target, request, now + self._request_timeout)
                continue
            self._reject(
                target,
                request,
                Timeout(
                    f"bookie {self.address}: no answer within {self._request_timeout:g} s to "
                    f"{_describe(request, request_id)}"
                ),
            )
        if pending:
            _, _, oldest = next(iter(pending.values()))
            self._timer = self._loop.call_at(oldest, self._expire)

    def _abort(self, reason: str) -> None:
        """The stream can no longer be trusted: fail everything and drop the connection."""
        log.warning("bookie %s: %s; closing the connection", self.address, reason)
        self._fail(reason)
        if self._transport is not None:
            self._transport.abort()

    def _fail(self, reason: str) -> None:
        if self._failure is not None:
            return
        self._failure = reason
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, {}
        self._outbox.clear()
        for target, request, _ in pending.values():
            self._reject(target, request, self._unavailable())
        self._wake_drainers()

    def _unavailable(self) -> BookieUnavailable:
        return BookieUnavailable(f"bookie {self.address}: {self._failure}")

    def _reject(self, target: _Target, request: _Sent, error: TallyError) -> None:
        if isinstance(target, _Stream):
            target.push(error)
        elif isinstance(target, asyncio.Future):
            if not target.done():
                target.set_exception(error)
        else:
            self._loop.call_soon(target.failed, request.entry_id, error)


def _describe(request: _Sent, request_id: int) -> str:
    """The request sent as `request_id` (a prepared ADD carries none of its own)."""
    return (
        f"{request.operation.name} request {request_id} "
        f"(ledger {request.ledger_id}, entry {request.entry_id})"
    )


def _mismatch(response: Response, request: _Sent, request_id: int) -> str:
    return (
        f"{response.operation.name} response {response.request_id} (ledger "
        f"{response.ledger_id}, entry {response.entry_id}) does not answer "
        f"{_describe(request, request_id)}"
    )
