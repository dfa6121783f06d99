"""The fault proxy between real peers on loopback: an echo server, and a real bookie.

Each fault is shown doing what it says and undone by `clear`: Delay slows each way and keeps
order, Stall and Partition hold bytes and let them flow afterwards, Cut and Reset reset
connections (RST, as a dead path shows), and a long hold stops reading rather than growing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tally.chaos.proxy import CHUNK, MAX_HELD, Cut, Delay, FaultProxy, Partition, Reset, Stall
from tally.client.bookie_connection import BookieConnection
from tally.core.digest import DigestType, master_key
from tally.core.entry_format import encode_entry
from tally.core.errors import BookieUnavailable, NoSuchEntry, Timeout
from tally.core.ids import LedgerId
from tests.support.cluster import running_cluster
from tests.support.polling import until
from tests.support.processes import free_port

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class EchoServer:
    """Writes back whatever it reads; counts the connections and bytes it got."""

    def __init__(self) -> None:
        self.connections = 0
        self.received = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> EchoServer:
        self._server = await asyncio.start_server(self._echo, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _echo(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(CHUNK):
                self.received += len(data)
                writer.write(data)
                await writer.drain()
        writer.close()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


@dataclass
class Rig:
    """An echo server behind a proxy, and the client connections a test opened."""

    proxy: FaultProxy
    echo: EchoServer
    clients: list[asyncio.StreamWriter] = field(default_factory=list)

    async def connect(self, port: int | None = None) -> Stream:
        """A client connection to the proxy (or to `port`), closed with the rig."""
        stream = await asyncio.open_connection("127.0.0.1", port or self.proxy.port)
        self.clients.append(stream[1])
        return stream


@contextlib.asynccontextmanager
async def proxied_echo(max_held: int = MAX_HELD) -> AsyncIterator[Rig]:
    echo = await EchoServer().start()
    rig = Rig(await FaultProxy.start("127.0.0.1", echo.port, max_held=max_held), echo)
    try:
        yield rig
    finally:
        for client in rig.clients:
            client.close()
        await rig.proxy.close()
        await echo.close()


async def round_trip(stream: Stream, data: bytes) -> bytes:
    reader, writer = stream
    writer.write(data)
    await writer.drain()
    return await reader.readexactly(len(data))


async def reset_by_peer(reader: asyncio.StreamReader) -> bool:
    """True when the connection ends in a reset (RST); False for an orderly end (FIN)."""
    try:
        while await reader.read(CHUNK):
            pass
    except ConnectionResetError:
        return True
    return False


async def test_pass_through_forwards_both_ways_and_counts() -> None:
    async with proxied_echo() as rig:
        proxy, echo = rig.proxy, rig.echo
        stream = await rig.connect()
        assert await round_trip(stream, b"hello") == b"hello"
        stream[1].write_eof()
        assert not await reset_by_peer(stream[0]), "an orderly end is forwarded as one"
        stats = proxy.stats
        assert (stats.connections, stats.bytes_to_target, stats.bytes_to_client) == (1, 5, 5)
        assert echo.received == 5


async def test_delay_slows_each_way() -> None:
    async with proxied_echo() as rig:
        proxy = rig.proxy
        stream = await rig.connect()
        proxy.set_fault(Delay(0.2))
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await round_trip(stream, b"ping") == b"ping"
        assert loop.time() - started >= 0.4, "delayed on the way there and on the way back"
        assert proxy.stats.chunks_delayed == 2


async def test_delay_with_jitter_keeps_order_over_a_thousand_chunks() -> None:
    messages = [f"<{i}>".encode() * (1 + i % 5) for i in range(1000)]
    async with proxied_echo() as rig:
        proxy = rig.proxy
        reader, writer = await rig.connect()
        proxy.set_fault(Delay(0.2, jitter=0.1, rng=random.Random(19)))
        sent = 0
        for message in messages:
            writer.write(message)
            sent += len(message)
            # The proxy has read all sent so far: the next message is a chunk of its own.
            await until(
                lambda sent=sent: (
                    proxy.stats.bytes_to_target + proxy.held_bytes("to_target") == sent
                ),
                "the proxy read the message",
                step=0,
            )
        assert await reader.readexactly(sent) == b"".join(messages)
        assert proxy.stats.chunks_delayed >= len(messages)


async def test_stall_holds_both_ways_until_cleared(caplog: pytest.LogCaptureFixture) -> None:
    proxy_log = "tally.chaos.proxy"
    caplog.set_level(logging.INFO, logger=proxy_log)
    async with proxied_echo() as rig:
        proxy, echo = rig.proxy, rig.echo
        reader, writer = await rig.connect()
        proxy.set_fault(Partition("to_client"))
        writer.write(b"ping")
        await until(lambda: proxy.held_bytes("to_client") == 4, "the echo held on its way back")
        proxy.set_fault(Stall())
        writer.write(b"pong")
        await until(lambda: proxy.held_bytes("to_target") == 4, "the request held")
        assert (echo.received, proxy.held_bytes("to_client")) == (4, 4)
        proxy.clear()
        assert await reader.readexactly(8) == b"pingpong"
        assert proxy.stats.chunks_held == 2
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records if r.name == proxy_log] == [
        "fault Partition(direction='to_client')",
        "fault Stall()",
        "fault Stall() cleared",
    ]


async def test_partition_holds_one_direction_only() -> None:
    async with proxied_echo() as rig:
        proxy, echo = rig.proxy, rig.echo
        reader, writer = await rig.connect()
        proxy.set_fault(Partition("to_client"))
        writer.write(b"ping")
        await until(lambda: proxy.held_bytes("to_client") == 4, "the answer held")
        assert echo.received == 4, "requests went through"
        proxy.set_fault(Partition("to_target"))
        writer.write(b"pong")
        await until(lambda: proxy.held_bytes("to_target") == 4, "the request held")
        assert await reader.readexactly(4) == b"ping", "answers go through"
        assert echo.received == 4, "requests do not"
        proxy.clear()
        assert await reader.readexactly(4) == b"pong"


async def test_cut_resets_open_connections_and_refuses_new_ones_until_cleared() -> None:
    async with proxied_echo() as rig:
        proxy, echo = rig.proxy, rig.echo
        first = await rig.connect()
        assert await round_trip(first, b"before") == b"before"
        proxy.set_fault(Cut())
        assert await reset_by_peer(first[0])
        refused = await rig.connect()  # accepted, and reset at once
        assert await reset_by_peer(refused[0])
        assert (proxy.stats.connections_cut, proxy.stats.refused, echo.connections) == (1, 1, 1)
        proxy.clear()
        assert await round_trip(await rig.connect(), b"after") == b"after"


async def test_reset_kills_a_connection_on_its_first_chunk() -> None:
    async with proxied_echo() as rig:
        proxy, echo = rig.proxy, rig.echo
        proxy.set_fault(Reset(1.0))
        reader, writer = await rig.connect()
        writer.write(b"doomed")
        assert await reset_by_peer(reader)
        assert (proxy.stats.connections_reset, echo.received) == (1, 0)
        proxy.set_fault(Reset(0.0))
        assert await round_trip(await rig.connect(), b"spared") == b"spared"


async def test_an_unreachable_target_resets_the_client() -> None:
    proxy = await FaultProxy.start("127.0.0.1", free_port())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        assert await reset_by_peer(reader)
        writer.close()
        assert proxy.stats.unreachable == 1
    finally:
        await proxy.close()


async def test_a_long_hold_stops_reading_instead_of_growing() -> None:
    cap = 256 * 1024
    payload = random.Random(7).randbytes(32 << 20)  # more than loopback's socket buffers
    async with proxied_echo(max_held=cap) as rig:
        proxy, echo = rig.proxy, rig.echo
        reader, writer = await rig.connect()
        proxy.set_fault(Stall())
        writer.write(payload)
        await until(lambda: proxy.held_bytes("to_target") >= cap, "the proxy held up to its cap")
        # Round trips straight to the echo server give the proxy's loop many turns in which
        # it could read on: it does not, though the client still has bytes to send.
        direct = await rig.connect(echo.port)
        for _ in range(20):
            assert await round_trip(direct, b"turn") == b"turn"
        assert writer.transport.get_write_buffer_size() > 0
        assert cap <= proxy.held_bytes("to_target") < cap + CHUNK
        assert proxy.stats.held_peak < cap + CHUNK
        proxy.clear()
        assert await reader.readexactly(len(payload)) == payload
        assert proxy.stats.held_peak < cap + CHUNK, "the echo's way back was capped too"


# --- a real bookie behind the proxy -----------------------------------------------------------

KEY = master_key(b"chaos proxy")
LEDGER = LedgerId(0, 19)


def entry(entry_id: int) -> bytes:
    payload = b"entry %d" % entry_id
    length = 100 * (entry_id + 1)  # the ledger's length up to it: payloads are shorter
    return encode_entry(LEDGER, entry_id, entry_id - 1, length, payload, DigestType.CRC32C)


@pytest.fixture(scope="module")
def bookie(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real bookie process; its address."""
    root: Path = tmp_path_factory.mktemp("cluster")
    with running_cluster(root, 1) as cluster:
        yield cluster.bookies[0].address


async def test_a_bookie_behind_the_proxy_stalled_cut_and_cleared(bookie: str) -> None:
    host, _, port = bookie.rpartition(":")
    proxy = await FaultProxy.start(host, int(port))
    direct = await BookieConnection.connect(bookie)
    client = await BookieConnection.connect(f"127.0.0.1:{proxy.port}", request_timeout=1.0)
    try:
        await client.add(entry(0), KEY)
        assert await direct.read(LEDGER, 0) == entry(0)

        proxy.set_fault(Stall())
        with pytest.raises(Timeout):
            await client.add(entry(1), KEY)
        with pytest.raises(NoSuchEntry):
            await direct.read(LEDGER, 1)
        first = proxy.held_bytes("to_target")
        added = client.add_nowait(entry(2), KEY)
        await until(lambda: proxy.held_bytes("to_target") > first, "the second add held too")
        proxy.clear()
        await added
        assert [await direct.read(LEDGER, e) for e in (1, 2)] == [entry(1), entry(2)]

        proxy.set_fault(Cut())
        await until(lambda: client.closed, "the client saw its connection reset")
        with pytest.raises(BookieUnavailable):
            await client.add(entry(3), KEY)
        refused = await BookieConnection.connect(f"127.0.0.1:{proxy.port}")
        with pytest.raises(BookieUnavailable):
            await refused.add(entry(3), KEY)
        await refused.close()
        proxy.clear()
        again = await BookieConnection.connect(f"127.0.0.1:{proxy.port}")
        await again.add(entry(3), KEY)
        await again.close()
    finally:
        await client.close()
        await direct.close()
        await proxy.close()
