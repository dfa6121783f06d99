"""The bookie's end of a client connection: an asyncio.BufferedProtocol that receives into
the bookie's arenas, hands each request to the request processor (requests.py), and
writes the responses of one event-loop turn at once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from tally.bookie.metrics import BookieMetrics
from tally.core import protocol
from tally.core.errors import MalformedData

log = logging.getLogger(__name__)

Dispatch = Callable[[protocol.Request, "BookieConnectionHandler"], None]
"""Answers one request on the connection it came from (the bookie's request processor)."""


class BookieConnectionHandler(asyncio.BufferedProtocol):
    """One client connection: frames in, requests to `dispatch`, responses out.

    Responses sent in one event-loop turn leave in one write: a group commit answers
    hundreds of adds at once, which would otherwise cost a system call each
    (docs/benchmarks.md, bookie section).
    """

    def __init__(
        self,
        dispatch: Dispatch,
        reader: protocol.RequestReader,
        connections: set[BookieConnectionHandler],
        metrics: BookieMetrics,
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
        if self._reader.pending_bytes:
            # A frame cut short by the end of the stream is a malformed frame too.
            self._metrics.malformed_frames.inc()
            log.warning(
                "connection from %s closed with %d bytes of an unfinished frame",
                self._peer,
                self._reader.pending_bytes,
            )
        self._reader.release()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            requests = self._reader.buffer_updated(nbytes)
        except MalformedData as error:
            log.warning("closing connection from %s: %s", self._peer, error)
            self._metrics.malformed_frames.inc()
            self.close()
            return
        for request in requests:
            self._dispatch(request, self)

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
