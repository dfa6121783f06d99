"""A fake bookie in the test's own event loop, for the client's unit tests.

It is built on the real codec (`RequestReader`, the response encoders), so every byte the
client sends is decoded as a bookie would decode it. It answers from dicts, and on demand
holds requests back (to answer them later, in any order), answers with errors, sends raw
bytes (garbage, half frames), or drops the connection. `fake_cluster` registers several
in a `memory://` metadata store, so that a `tally.Client` places ledgers on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import tally
from tally.client.config import ClientConfig
from tally.core.availability import EntryAvailability
from tally.core.errors import LedgerFenced, NoSuchEntry, TallyError
from tally.core.ids import LedgerId
from tally.core.protocol import (
    AddRequest,
    AddResponse,
    AvailabilityDumpRequest,
    ErrorResponse,
    GetListOfEntriesOfLedgerRequest,
    GetListOfEntriesOfLedgerResponse,
    LedgerAvailability,
    LedgerInfo,
    LedgerInfoRequest,
    LedgerInfoResponse,
    MetadataCopyRequest,
    MetadataCopyResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    RequestReader,
    WriteLacRequest,
    WriteLacResponse,
    encode_availability_dump,
)
from tally.metadata.bookie_registry import BookieInfo, BookieRegistry
from tally.metadata.cluster import init_cluster
from tally.metadata.store import MetadataStore
from tally.metadata.stores import open_store


class FakeBookie:
    """Answers requests from dicts, or as a test scripts it."""

    def __init__(self) -> None:
        self.address = ""
        self.entries: dict[LedgerId, dict[int, bytes]] = {}
        self.lacs: dict[LedgerId, int] = {}
        self.fenced: set[LedgerId] = set()
        self.errors: dict[LedgerId, TallyError] = {}
        self.dump: list[LedgerAvailability] = []
        self.copies: dict[LedgerId, bytes] = {}
        """The metadata copies given, by ledger (the last one)."""
        self.dump_budget = 300
        self.dump_frames = 0
        self.hold = False
        self.held: list[tuple[FakeConnection, Request]] = []
        self.received: list[Request] = []
        self.connections: list[FakeConnection] = []
        self.refuse: Callable[[Request], TallyError | None] = lambda request: None
        """The error to answer `request` with instead of serving it, if any."""

    def answer(self, request: Request) -> list[bytes]:
        try:
            return self._answer(request)
        except TallyError as error:
            return [ErrorResponse.answering(request, error).encode()]

    def _answer(self, request: Request) -> list[bytes]:
        ledger = request.ledger_id
        if ledger in self.errors:
            raise self.errors[ledger]
        if (refused := self.refuse(request)) is not None:
            raise refused
        stored = self.entries.setdefault(ledger, {})
        if isinstance(request, AddRequest):
            request.verify_crc()
            if ledger in self.fenced and not request.recovery:
                raise LedgerFenced(f"ledger {ledger} is fenced")
            stored[request.entry_id] = request.entry
            return [AddResponse(request.request_id, ledger, request.entry_id).encode()]
        if isinstance(request, ReadRequest):
            if request.do_fencing:
                self.fenced.add(ledger)
            wanted = max(stored, default=-1) if request.entry_id == -1 else request.entry_id
            if wanted not in stored:
                raise NoSuchEntry(f"ledger {ledger} has no entry {wanted}")
            data = stored[wanted]
            return [ReadResponse(request.request_id, ledger, request.entry_id, data).encode()]
        if isinstance(request, ReadLacRequest):
            lac = self.lacs.get(ledger, -1)
            return [ReadLacResponse(request.request_id, ledger, lac).encode()]
        if isinstance(request, WriteLacRequest):
            self.lacs[ledger] = request.last_add_confirmed
            return [WriteLacResponse(request.request_id, ledger).encode()]
        if isinstance(request, GetListOfEntriesOfLedgerRequest):
            availability = EntryAvailability.from_entries(stored).to_bytes()
            return [
                GetListOfEntriesOfLedgerResponse(request.request_id, ledger, availability).encode()
            ]
        if isinstance(request, MetadataCopyRequest):
            self.copies[ledger] = request.metadata
            return [MetadataCopyResponse(request.request_id, ledger).encode()]
        if isinstance(request, LedgerInfoRequest):
            info = LedgerInfo(
                ledger in self.fenced,
                self.lacs.get(ledger, -1),
                len(stored),
                sum(map(len, stored.values())),
            )
            return [LedgerInfoResponse(request.request_id, ledger, info).encode()]
        assert isinstance(request, AvailabilityDumpRequest)
        frames = list(encode_availability_dump(request.request_id, self.dump, self.dump_budget))
        self.dump_frames += len(frames)
        return frames

    def release(self, indexes: list[int] | None = None) -> None:
        """Answer the held requests at `indexes` (all, by default), in that order."""
        chosen = range(len(self.held)) if indexes is None else indexes
        for index in chosen:
            connection, request = self.held[index]
            connection.write(b"".join(self.answer(request)))

    def resume(self) -> None:
        """Stop holding requests, and answer the held ones in the order they came."""
        self.hold = False
        held, self.held = self.held, []
        for connection, request in held:
            connection.write(b"".join(self.answer(request)))

    def send_raw(self, data: bytes) -> None:
        for connection in self.connections:
            connection.write(data)

    def disconnect(self) -> None:
        for connection in self.connections:
            connection.transport.close()

    def pause_reading(self, paused: bool) -> None:
        for connection in self.connections:
            if paused:
                connection.transport.pause_reading()
            else:
                connection.transport.resume_reading()


class FakeConnection(asyncio.Protocol):
    def __init__(self, bookie: FakeBookie) -> None:
        self.bookie = bookie
        self.reader = RequestReader()
        self.transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.bookie.connections.append(self)

    def data_received(self, data: bytes) -> None:
        bookie = self.bookie
        answers = []
        for request in self.reader.feed(data):
            if isinstance(request, MetadataCopyRequest):  # kept apart: the tests are of the rest
                answers.extend(bookie.answer(request))
                continue
            bookie.received.append(request)
            if bookie.hold:
                bookie.held.append((self, request))
            else:
                answers.extend(bookie.answer(request))
        self.write(b"".join(answers))

    def write(self, data: bytes) -> None:
        if data and not self.transport.is_closing():
            self.transport.write(data)


@contextlib.asynccontextmanager
async def fake_bookie(tls: ssl.SSLContext | None = None) -> AsyncIterator[FakeBookie]:
    bookie = FakeBookie()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FakeConnection(bookie), "127.0.0.1", 0, ssl=tls)
    bookie.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield bookie
    finally:
        server.close()
        for connection in bookie.connections:
            connection.transport.abort()
        await server.wait_closed()


@dataclass
class FakeCluster:
    """Fake bookies registered (writable, bookie id == address) in a `memory://` store."""

    uri: str
    bookies: list[FakeBookie]
    store: MetadataStore
    """The bookies' own session: what a test reads the metadata with."""

    def bookie(self, bookie_id: str) -> FakeBookie:
        return next(b for b in self.bookies if b.address == bookie_id)

    def client(self, config: ClientConfig | None = None) -> tally.Client:
        return tally.Client(self.uri, config=config)


_names = itertools.count()


@contextlib.asynccontextmanager
async def fake_cluster(count: int) -> AsyncIterator[FakeCluster]:
    uri = f"memory://fake-cluster-{next(_names)}"
    store = open_store(uri)
    await store.start()
    try:
        await init_cluster(store)
        async with contextlib.AsyncExitStack() as stack:
            bookies = [await stack.enter_async_context(fake_bookie()) for _ in range(count)]
            registry = BookieRegistry(store)
            for bookie in bookies:
                info = BookieInfo(bookie.address, None, "fake", 0)
                await registry.register(bookie.address, info)
            yield FakeCluster(uri, bookies, store)
    finally:
        await store.close()
