"""The bookie's end of a client connection: an asyncio.BufferedProtocol that receives into
the bookie's arenas, hands each request to the request processor (requests.py), and
writes the responses of one event-loop turn at once.

What unfinished frames hold is bounded over all connections by the bookie's receive budget,
and a frame that stops arriving closes its connection (tally.core.receive_limits).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from tally.bookie.metrics import BookieMetrics
from tally.core import protocol
from tally.core.errors import MalformedData
from tally.core.receive_limits import ReceiveBudget, ReceiveProgress

log = logging.getLogger(__name__)

Dispatch = Callable[[list[protocol.Request], "BookieConnectionHandler"], None]
"""Answers the requests of one receive on the connection they came from (the bookie's
request processor)."""


class BookieConnectionHandler(asyncio.BufferedProtocol):
    """One client connection: frames in, requests to `dispatch`, responses out.

    Responses sent in one event-loop turn leave in one write: a group commit answers
    hundreds of adds at once, which would otherwise cost a system call each
    (docs/benchmarks.md, bookie section). A frame begun holds its length of the shared
    receive `budget` until it is complete; while the budget has no room for it, the
    connection is not read.
    """

    def __init__(
        self,
        dispatch: Dispatch,
        reader: protocol.RequestReader,
        connections: set[BookieConnectionHandler],
        metrics: BookieMetrics,
        budget: ReceiveBudget[BookieConnectionHandler],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._dispatch = dispatch
        self._reader = reader
        self._connections = connections
        """The bookie's open connections, which it closes when it stops."""
        self._metrics = metrics
        self._transport: asyncio.Transport | None = None
        self._peer = "?"
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._outbox: list[bytes] = []
        self._budget = budget
        self._frame_size = 0
        """The length of the unfinished frame, which it holds of the budget or waits for."""
        self._clock = clock
        self._progress = ReceiveProgress()
        self._stalled = False
        """Closed for a stalled frame, which is then no malformed one."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._connections.add(self)
        self._metrics.connections.inc()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._outbox.clear()
        self._connections.discard(self)
        self._metrics.connections.dec()
        for task in self._tasks:
            task.cancel()
        if self._reader.pending_bytes and not self._stalled:
            # A frame cut short by the end of the stream is a malformed frame too.
            self._metrics.malformed_frames.inc()
            log.warning(
                "connection from %s closed with %d bytes of an unfinished frame",
                self._peer,
                self._reader.pending_bytes,
            )
        self._reader.release()
        self._give_back_room()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            requests = self._reader.buffer_updated(nbytes)
        except MalformedData as error:
            log.warning("closing connection from %s: %s", self._peer, error)
            self._metrics.malformed_frames.inc()
            self._give_back_room()
            self.close()
            return
        reader = self._reader
        self._progress.received(self._clock(), reader.pending_bytes > 0)
        size = reader.unfinished_frame_size
        if size != self._frame_size:
            self._frame_size = size
            if not self._budget.hold(self, size):
                self._wait_for_budget()
            self._admit_waiters()
        if requests:
            self._dispatch(requests, self)

    def _wait_for_budget(self) -> None:
        """Stop reading until the budget has room for the frame begun: its sender slows
        down, and what this connection already received stays as it is."""
        self._progress.paused()
        if self._transport is not None:
            self._transport.pause_reading()

    def _admit_waiters(self) -> None:
        """Read again the connections whose turn has come (this one among them, maybe)."""
        if self._budget.waiting:
            for connection in self._budget.admit():
                connection._read_again()

    def _give_back_room(self) -> None:
        """The connection reads no more: its room goes to the waiters, at once (a close
        may wait for a peer that does not read what it is sent)."""
        self._frame_size = 0
        self._progress.paused()
        self._budget.release(self)
        self._admit_waiters()

    def _read_again(self) -> None:
        self._progress.resumed(self._clock())
        if self._transport is not None:
            self._transport.resume_reading()

    def close_if_stalled(self, timeout: float) -> None:
        """Close the connection if its unfinished frame got no byte for `timeout` seconds
        while it was read. It is aborted: a sender that sends nothing may read nothing
        either, and its buffered responses would hold the connection open."""
        if not self._progress.stalled(self._clock(), timeout):
            return
        log.warning(
            "closing connection from %s: its unfinished frame (%d bytes received) got no "
            "byte for %gs (receive_stall_timeout)",
            self._peer,
            self._reader.pending_bytes,
            timeout,
        )
        self._metrics.receive_stalled_connections.inc()
        self._progress.paused()
        self._stalled = True
        if self._transport is not None:
            self._transport.abort()

    def send(self, frame: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._outbox.append(frame)
            if len(self._outbox) == 1:
                asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        frames, self._outbox = self._outbox, []
        if frames and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(frames))

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    async def writable(self) -> None:
        self._flush()
        await self._can_write.wait()
        if self._transport is None:
            raise asyncio.CancelledError

    def start_task(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()


async def close_stalled(connections: set[BookieConnectionHandler], timeout: float) -> None:
    """Close every connection whose unfinished frame got no byte for `timeout` seconds of
    reading, looking every quarter of it."""
    while True:
        await asyncio.sleep(timeout / 4)
        for connection in list(connections):
            connection.close_if_stalled(timeout)
