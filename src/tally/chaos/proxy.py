"""A fault-injecting TCP proxy: one in front of each bookie of a chaos run, so that the
harness can delay, hold and cut what passes between the clients and that bookie.

Clients connect to the proxy's port; each of their connections gets one of its own to the
target, and bytes go both ways through a queue per direction, so that a fault can hold or
delay them without reordering them. One fault at a time applies to every connection, open
or new, from the moment it is set (`set_fault`) until it is cleared (`clear`):

- `Delay`: each chunk is forwarded `seconds` (plus up to `jitter`) after it was read.
- `Stall`: nothing is forwarded either way; the bytes wait here, the connections stay open.
- `Partition`: a Stall in one direction only.
- `Cut`: every open connection is reset now, and new ones are reset as soon as accepted.
- `Reset`: each chunk read resets its connection with some probability.

A chunk's delay is drawn when it is read, so clearing a Delay lets the chunks already
delayed arrive when they were due; a Stall or Partition holds whatever waits to be forwarded,
and clearing it lets all of that flow at once. `stats` counts what a proxy did, for the
harness's report, and `held_bytes` tells what it holds now.

No fault drops bytes: TCP retransmits a lost packet, so what its peers see of packet loss is
a delay or a stall (Delay, Stall), never a hole in the stream (which would turn a framed
protocol into garbage); what they see of a path that dies is a reset (Reset, Cut).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

log = logging.getLogger(__name__)

CHUNK: Final = 64 * 1024
"""The most bytes read at once from either side: the unit a fault delays, holds or resets on."""

DIAL_TIMEOUT: Final = 5.0
"""Seconds the proxy waits for its own connection to the target before resetting the
client's: a target whose listen backlog is full must not keep `close` waiting."""

MAX_HELD: Final = 64 * 1024 * 1024
"""Bytes held in one direction of a connection at which the proxy stops reading its source,
so that the sender backs up through TCP flow control, as behind a slow link, instead of the
proxy growing without bound under a long Stall."""

Direction: TypeAlias = Literal["to_target", "to_client"]
DIRECTIONS: Final[tuple[Direction, ...]] = ("to_target", "to_client")

_LINGER_ZERO: Final = struct.pack("ii", 1, 0)
"""SO_LINGER on, 0 s: closing the socket sends RST, as a peer sees a path that died."""


@dataclass(frozen=True)
class Delay:
    """Each chunk is forwarded `seconds` after it was read, plus a uniform draw up to `jitter`.
    Order is kept: a chunk waits behind an earlier one that drew a longer delay, as TCP's
    in-order delivery makes it wait."""

    seconds: float
    jitter: float = 0.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.seconds >= 0 and self.jitter >= 0):
            raise ValueError(f"a delay and its jitter must be >= 0, not {self}")

    def draw(self) -> float:
        return self.seconds + self.rng.uniform(0.0, self.jitter)


@dataclass(frozen=True)
class Reset:
    """Each chunk read resets its connection (RST both ways) with `probability`, before it is
    forwarded: the chunk is lost with the connection, as when a path dies mid-stream."""

    probability: float
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.probability <= 1:
            raise ValueError(f"a probability must be in [0, 1], not {self.probability}")

    def strikes(self) -> bool:
        return self.rng.random() < self.probability


@dataclass(frozen=True)
class Stall:
    """Nothing is forwarded either way until the fault is cleared; then all held flows."""


@dataclass(frozen=True)
class Cut:
    """Every open connection is reset, and new ones are accepted and reset at once."""


@dataclass(frozen=True)
class Partition:
    """A Stall in one direction: `to_target` holds the requests, `to_client` the answers."""

    direction: Direction

    def __post_init__(self) -> None:
        if self.direction not in DIRECTIONS:
            raise ValueError(f"a direction is one of {DIRECTIONS}, not {self.direction!r}")


Fault: TypeAlias = Delay | Reset | Stall | Cut | Partition


@dataclass
class ProxyStats:
    """What a proxy did since it started, for the harness's report."""

    connections: int = 0
    """Accepted and connected to the target."""
    refused: int = 0
    """Accepted under a Cut, and reset at once."""
    unreachable: int = 0
    """Accepted, but the target refused the proxy's own connection: reset at once."""
    bytes_to_target: int = 0
    bytes_to_client: int = 0
    chunks_delayed: int = 0
    chunks_held: int = 0
    """Chunks read while a Stall or Partition held their direction."""
    connections_cut: int = 0
    """Open connections reset by a Cut."""
    connections_reset: int = 0
    """Connections reset by a Reset."""
    held_peak: int = 0
    """The most bytes held at once in one direction of one connection."""


@dataclass
class _Flow:
    """One direction of a connection: the chunks read from `source`, not yet written to
    `sink`, each with the loop time it is due; an empty chunk is the source's end of stream,
    forwarded in its turn."""

    source: asyncio.StreamReader
    sink: asyncio.StreamWriter
    chunks: deque[tuple[float, bytes]] = field(default_factory=deque)
    size: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a chunk arrives or the fault changes: the forwarder looks again."""
    room: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a chunk leaves: a reader stopped at `max_held` looks again."""


class _Connection:
    """A client's connection and the proxy's own to the target; in each direction, a reader
    task queues what it reads and a forwarder task writes it on when the fault lets it."""

    def __init__(
        self,
        proxy: FaultProxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        target: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self._proxy = proxy
        self._writers = (client[1], target[1])
        self.flows: dict[Direction, _Flow] = {
            "to_target": _Flow(client[0], target[1]),
            "to_client": _Flow(target[0], client[1]),
        }
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        """Until both directions have forwarded their end of stream, or the connection is reset."""
        try:
            async with asyncio.TaskGroup() as group:
                for direction in DIRECTIONS:
                    self._tasks.append(group.create_task(self._read(direction)))
                    self._tasks.append(group.create_task(self._forward(direction)))
        finally:
            for writer in self._writers:
                writer.close()

    def wake(self) -> None:
        for flow in self.flows.values():
            flow.wake.set()

    def reset(self) -> None:
        """Reset both sides now, dropping whatever is held; it no longer counts as open."""
        self._proxy._connections.discard(self)
        for task in self._tasks:
            task.cancel()
        for writer in self._writers:
            _reset(writer)

    async def _read(self, direction: Direction) -> None:
        flow, proxy, stats = self.flows[direction], self._proxy, self._proxy.stats
        loop = asyncio.get_running_loop()
        while True:
            while flow.size >= proxy.max_held:
                flow.room.clear()
                await flow.room.wait()
            try:
                chunk = await flow.source.read(CHUNK)
            except OSError:
                self.reset()  # the source reset its side: the other side sees it reset too
                return
            fault = proxy.fault
            if chunk and isinstance(fault, Reset) and fault.strikes():
                stats.connections_reset += 1
                self.reset()
                return
            due = loop.time()
            if isinstance(fault, Delay):
                due += fault.draw()  # an end of stream too: a FIN is delayed like data
                stats.chunks_delayed += bool(chunk)
            if proxy.holds(direction):
                stats.chunks_held += bool(chunk)
            flow.chunks.append((due, chunk))
            flow.size += len(chunk)
            stats.held_peak = max(stats.held_peak, flow.size)
            flow.wake.set()
            if not chunk:
                return

    async def _forward(self, direction: Direction) -> None:
        flow, proxy = self.flows[direction], self._proxy
        loop = asyncio.get_running_loop()
        while True:
            flow.wake.clear()
            wait: float | None = None
            if flow.chunks and not proxy.holds(direction):
                due, chunk = flow.chunks[0]
                wait = due - loop.time()
                if wait <= 0:
                    flow.chunks.popleft()
                    flow.size -= len(chunk)
                    flow.room.set()
                    try:
                        if not chunk:
                            flow.sink.write_eof()
                            return
                        flow.sink.write(chunk)
                        if direction == "to_target":
                            proxy.stats.bytes_to_target += len(chunk)
                        else:
                            proxy.stats.bytes_to_client += len(chunk)
                        await flow.sink.drain()
                    except OSError:
                        self.reset()  # the sink's peer is gone: so is the whole connection
                        return
                    continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await flow.wake.wait()


class FaultProxy:
    """A TCP proxy to `target_host:target_port` with a fault that can change at any time;
    make it with `start`, stop it with `close`.

    Without a fault it passes bytes through unchanged. `max_held` bounds the bytes held in
    each direction of each connection (to at most one chunk more).
    """

    def __init__(self, target_host: str, target_port: int, max_held: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.max_held = max_held
        self.port = 0
        self.fault: Fault | None = None
        self.stats = ProxyStats()
        self._name = f"{target_host}:{target_port}"
        self._server: asyncio.Server | None = None
        self._closed = False
        self._connections: set[_Connection] = set()
        self._handlers: set[asyncio.Task[object]] = set()

    @classmethod
    async def start(
        cls,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        *,
        max_held: int = MAX_HELD,
    ) -> FaultProxy:
        """Listen on `listen_host:listen_port` (port 0: a free one, then in `port`)."""
        proxy = cls(target_host, target_port, max_held)
        proxy._server = await asyncio.start_server(proxy._accept, listen_host, listen_port)
        proxy.port = proxy._server.sockets[0].getsockname()[1]
        proxy._name = f"{listen_host}:{proxy.port}->{proxy._name}"
        return proxy

    def set_fault(self, fault: Fault) -> None:
        """Apply `fault` from now on, to open connections and new ones; it replaces any other."""
        log.info("proxy %s: fault %s", self._name, fault)
        self.fault = fault
        if isinstance(fault, Cut):
            for connection in list(self._connections):
                connection.reset()
                self.stats.connections_cut += 1
        self._wake_all()

    def clear(self) -> None:
        """Pass-through again: what a Stall or Partition held flows now."""
        if self.fault is not None:
            log.info("proxy %s: fault %s cleared", self._name, self.fault)
            self.fault = None
        self._wake_all()

    def holds(self, direction: Direction) -> bool:
        """Whether the fault keeps bytes going in `direction` from being forwarded."""
        fault = self.fault
        return isinstance(fault, Stall) or (
            isinstance(fault, Partition) and fault.direction == direction
        )

    def held_bytes(self, direction: Direction) -> int:
        """Bytes read and not yet forwarded in `direction`, over the open connections."""
        return sum(connection.flows[direction].size for connection in self._connections)

    async def close(self) -> None:
        """Stop listening and reset every connection (the path dies with the proxy).

        Connection handlers are waited for, not cancelled: asyncio's streams (3.11) log a
        cancelled handler as an error."""
        self._closed = True
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.reset()
        await asyncio.gather(*self._handlers)
        if self._server is not None:
            await self._server.wait_closed()

    def _wake_all(self) -> None:
        for connection in self._connections:
            connection.wake()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            await self._serve(reader, writer)
        finally:
            self._handlers.discard(handler)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if isinstance(self.fault, Cut):
            self.stats.refused += 1
            _reset(writer)
            return
        try:
            async with asyncio.timeout(DIAL_TIMEOUT):
                target = await asyncio.open_connection(self.target_host, self.target_port)
        except (OSError, TimeoutError) as error:
            log.debug("proxy %s: target unreachable: %r", self._name, error)
            self.stats.unreachable += 1
            _reset(writer)
            return
        if self._closed or isinstance(self.fault, Cut):  # while the target was dialled
            if not self._closed:
                self.stats.refused += 1
            _reset(writer)
            _reset(target[1])
            return
        connection = _Connection(self, (reader, writer), target)
        self.stats.connections += 1
        self._connections.add(connection)
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN, dropping what is unsent."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
    writer.transport.abort()
