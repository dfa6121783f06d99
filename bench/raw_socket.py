"""The machine's raw framed request/reply rate over loopback TCP: the physical reference for
the bookie's and the client's figures, measured with asyncio in Python as they are.

A server process reads length-prefixed frames and answers each with a tiny framed reply,
doing nothing else; a client process keeps a window of requests in flight (pipelined) and
sends one more for each reply. Two processes, as the bookie benchmark runs (2 cores):

- raw request/reply rate: 1,000 in flight, 100-byte payloads, replies/s;
- raw loopback throughput: 64 KiB payloads, 64 in flight, payload MB/s;
- `BookieConnection.add_nowait`, 1,000 in flight, entries with 100-byte payloads, against a
  fake bookie that answers each ADD with an AddResponse header built by one `struct.pack`
  (the same work per frame as the raw server): acknowledged adds/s, so the client's own
  cost shows as its share of the raw rate; beside it, the rate the core's codec alone
  allows on one core (`AddRequest.for_entry(...).encode()` per add and `ResponseReader.feed`
  of the answers, no I/O), the part of each add that is not the connection's.

    python bench/raw_socket.py [--seconds S]

`main()` returns the figures as a dict; other benchmarks import `request_reply_rate`,
`loopback_mb_per_s` and `print_references` to print the same references beside theirs.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection

from tally.client.bookie_connection import BookieConnection
from tally.core.digest import DigestType, master_key
from tally.core.entry_format import encode_entry
from tally.core.ids import LedgerId
from tally.core.protocol import AddRequest, AddResponse, ResponseReader

KIB = 1 << 10
SMALL, LARGE = 100, 64 * KIB
SMALL_WINDOW, LARGE_WINDOW = 1_000, 64

_LENGTH = struct.Struct(">I")
_RAW = struct.Struct(">IQ")  # length prefix, request id: a raw request's head and its reply
# The protocol's request header (after the length prefix) and its response frame header:
# version, operation, flags, request id, ledger scope, ledger id, entry id (+ status).
_REQUEST_HEADER = struct.Struct(">BBHQQQq")
_RESPONSE = struct.Struct(">IBBHQQQqi")
_RESPONSE_BIT = 0x80


# -- framing shared by both ends --------------------------------------------------------------


class _Frames:
    """Whole frames out of a byte stream: the least a framed reader can do."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[tuple[memoryview, int]]:
        """(buffer, offset of the frame's length prefix) for each complete frame."""
        buffer = self._buffer
        buffer += data
        size, pos = len(buffer), 0
        with memoryview(buffer) as view:
            while size - pos >= 4:
                stop = pos + 4 + _LENGTH.unpack_from(view, pos)[0]
                if stop > size:
                    break
                yield view, pos
                pos = stop
        del buffer[:pos]


def _echo_reply(view: memoryview, pos: int) -> bytes:
    return _RAW.pack(8, _RAW.unpack_from(view, pos)[1])


def _add_reply(view: memoryview, pos: int) -> bytes:
    version, operation, _, request_id, scope, ledger, entry = _REQUEST_HEADER.unpack_from(
        view, pos + 4
    )
    return _RESPONSE.pack(
        _RESPONSE.size - 4,
        version,
        operation | _RESPONSE_BIT,
        0,
        request_id,
        scope,
        ledger,
        entry,
        0,
    )


_REPLIES: dict[str, Callable[[memoryview, int], bytes]] = {"echo": _echo_reply, "add": _add_reply}


class FramedProtocol(asyncio.Protocol):
    """A connection's transport once made, and the frames of what it receives."""

    def __init__(self) -> None:
        self._frames = _Frames()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport


class _Server(FramedProtocol):
    """Answers every frame, one write per chunk received."""

    def __init__(self, reply: Callable[[memoryview, int], bytes]) -> None:
        super().__init__()
        self._reply = reply

    def data_received(self, data: bytes) -> None:
        reply = self._reply
        replies = [reply(view, pos) for view, pos in self._frames.feed(data)]
        if replies and self._transport is not None:
            self._transport.write(b"".join(replies))


def serve(mode: str, report: Connection) -> None:
    """Child process: serve on a loopback port (sent through `report`) until terminated."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Server(_REPLIES[mode]), "127.0.0.1", 0)
        report.send(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(run())


@contextmanager
def server_process(mode: str) -> Iterator[str]:
    """A server of `mode` ("echo" or "add") in its own process; yields its address."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=serve, args=(mode, sender), daemon=True)
    process.start()
    try:
        if not receiver.poll(30):
            raise RuntimeError(f"the {mode} server process did not start")
        yield f"127.0.0.1:{receiver.recv()}"
    finally:
        process.terminate()
        process.join()


# -- the raw client ---------------------------------------------------------------------------


class _RawClient(FramedProtocol):
    """Keeps `window` requests in flight: one new request per reply, one write per chunk."""

    def __init__(self, frame: bytes, window: int) -> None:
        super().__init__()
        self._frame = frame
        self._window = window
        self.replies = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        transport.write(self._frame * self._window)

    def data_received(self, data: bytes) -> None:
        count = sum(1 for _ in self._frames.feed(data))
        self.replies += count
        if count and self._transport is not None:
            self._transport.write(self._frame * count)


async def _raw_rate(address: str, payload: int, window: int, seconds: float) -> float:
    """Replies per second of a pipelined raw client, after a warm-up of a tenth of the run."""
    host, port = address.rsplit(":", 1)
    frame = _RAW.pack(_RAW.size - 4 + payload, 1) + bytes(payload)
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_connection(
        lambda: _RawClient(frame, window), host, int(port)
    )
    try:
        await asyncio.sleep(seconds / 10)
        first, started = client.replies, time.perf_counter()
        await asyncio.sleep(seconds)
        return (client.replies - first) / (time.perf_counter() - started)
    finally:
        transport.close()


def request_reply_rate(seconds: float = 4.0) -> float:
    """Raw framed request/reply rate: 100-byte requests, 1,000 in flight, replies/s."""
    with server_process("echo") as address:
        return asyncio.run(_raw_rate(address, SMALL, SMALL_WINDOW, seconds))


def loopback_mb_per_s(seconds: float = 3.0) -> float:
    """Raw loopback throughput of 64 KiB frames, 64 in flight, payload MB/s (10^6 B/s)."""
    with server_process("echo") as address:
        rate = asyncio.run(_raw_rate(address, LARGE, LARGE_WINDOW, seconds))
    return rate * LARGE / 1e6


# -- the client under test --------------------------------------------------------------------


KEY = master_key(b"bench")
ENTRY = encode_entry(LedgerId(0, 1), 0, -1, SMALL, bytes(SMALL), DigestType.CRC32C)


async def _add_rate(address: str, window: int, seconds: float) -> float:
    """Acknowledged adds/s through one BookieConnection, `window` adds in flight."""
    entry, key = ENTRY, KEY
    connection = await BookieConnection.connect(address)
    add = connection.add_nowait
    try:
        in_flight = deque(add(entry, key) for _ in range(window))
        warm_up = time.perf_counter() + seconds / 10
        while time.perf_counter() < warm_up:
            await in_flight.popleft()
            in_flight.append(add(entry, key))
        acknowledged, started = 0, time.perf_counter()
        deadline = started + seconds
        while True:
            await in_flight.popleft()
            in_flight.append(add(entry, key))
            acknowledged += 1
            if not acknowledged % window and time.perf_counter() >= deadline:
                break
        elapsed = time.perf_counter() - started
        for future in in_flight:
            await future
        return acknowledged / elapsed
    finally:
        await connection.close()


def add_nowait_rate(seconds: float = 4.0) -> float:
    """`BookieConnection.add_nowait` against the struct-only fake bookie, adds/s."""
    with server_process("add") as address:
        return asyncio.run(_add_rate(address, SMALL_WINDOW, seconds))


def codec_add_rate(batch: int = SMALL_WINDOW, repeats: int = 30) -> float:
    """Adds/s the codec alone allows: encode `batch` ADDs, decode their answers in one feed
    (best of `repeats` batches)."""
    answers = b"".join(
        AddResponse(request_id, LedgerId(0, 1), 0).encode() for request_id in range(batch)
    )
    reader = ResponseReader()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for request_id in range(batch):
            AddRequest.for_entry(request_id, ENTRY, KEY).encode()
        reader.feed(answers)
        best = min(best, time.perf_counter() - started)
    return batch / best


def print_references(figures: dict[str, float]) -> None:
    """The raw references as one block, for any benchmark that measured them."""
    print(
        f"raw loopback TCP, 2 processes (asyncio, framed):\n"
        f"  request/reply, {SMALL} B payload, {SMALL_WINDOW} in flight:"
        f"  {figures['raw_request_reply_per_s']:12,.0f} /s\n"
        f"  throughput, {LARGE // KIB} KiB frames, {LARGE_WINDOW} in flight:"
        f"  {figures['raw_loopback_mb_per_s']:12,.0f} MB/s"
    )


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="per small-frame figure")
    args = parser.parse_args(argv)
    figures = {
        "raw_request_reply_per_s": request_reply_rate(args.seconds),
        "raw_loopback_mb_per_s": loopback_mb_per_s(args.seconds * 0.75),
        "bookie_connection_adds_per_s": add_nowait_rate(args.seconds),
        "codec_adds_per_s": codec_add_rate(),
    }
    adds = figures["bookie_connection_adds_per_s"]
    figures["adds_to_raw_ratio"] = adds / figures["raw_request_reply_per_s"]
    figures["connection_us_per_add"] = (1 / adds - 1 / figures["codec_adds_per_s"]) * 1e6
    print_references(figures)
    print(
        f"BookieConnection.add_nowait, {SMALL} B payload, {SMALL_WINDOW} in flight:"
        f"  {figures['bookie_connection_adds_per_s']:12,.0f} /s"
        f"  ({figures['adds_to_raw_ratio']:.1%} of the raw request/reply rate)\n"
        f"  the codec alone (encode ADD, decode its answer), one core:"
        f"  {figures['codec_adds_per_s']:12,.0f} /s\n"
        f"  so the connection's own cost (I/O, futures, dispatch) per add:"
        f"  {figures['connection_us_per_add']:.1f} us"
    )
    return figures


if __name__ == "__main__":
    main()
