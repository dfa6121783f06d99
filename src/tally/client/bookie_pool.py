"""One connection per bookie, shared by every ledger handle of a client.

A bookie is reached at the address it registered; a bookie that is not registered (dead,
or being replaced) is tried at its id when the id is a host:port, as BookKeeper does.
A connection that failed is dropped, so the next request dials again.
"""

from __future__ import annotations

import asyncio
import ssl

from tally.client.bookie_connection import BookieConnection
from tally.core.errors import BookieUnavailable, TallyError
from tally.metadata.bookie_registry import BookieRegistry


class BookiePool:
    def __init__(
        self,
        registry: BookieRegistry,
        *,
        request_timeout: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._registry = registry
        self._request_timeout = request_timeout
        self._ssl = ssl_context
        self._connections: dict[str, BookieConnection] = {}
        self._dialing: dict[str, asyncio.Future[BookieConnection]] = {}
        self._closed = False

    def cached(self, bookie_id: str) -> BookieConnection | None:
        """The open connection to `bookie_id`, if there is one: the add path's fast way."""
        connection = self._connections.get(bookie_id)
        return connection if connection is not None and not connection.closed else None

    async def get(self, bookie_id: str) -> BookieConnection:
        """An open connection to `bookie_id`; BookieUnavailable when it cannot be reached."""
        connection = self._connections.get(bookie_id)
        if connection is not None and not connection.closed:
            return connection
        dialing = self._dialing.get(bookie_id)
        if dialing is None:
            dialing = asyncio.ensure_future(self._dial(bookie_id))
            self._dialing[bookie_id] = dialing
            dialing.add_done_callback(lambda done: self._dialed(bookie_id, done))
        return await asyncio.shield(dialing)

    def _dialed(self, bookie_id: str, done: asyncio.Future[BookieConnection]) -> None:
        """A dial ended. Its failure is taken here too: every caller that waited for it may
        have been cancelled meanwhile (a timeout), and asyncio would then print it."""
        self._dialing.pop(bookie_id, None)
        if not done.cancelled():
            done.exception()

    async def _dial(self, bookie_id: str) -> BookieConnection:
        address = await self._address(bookie_id)
        connection = await BookieConnection.connect(
            address, ssl=self._ssl, request_timeout=self._request_timeout
        )
        if self._closed:  # a dial that outlived the pool would leave its connection open
            await connection.close()
            raise BookieUnavailable(f"bookie {bookie_id}: the client was closed")
        self._connections[bookie_id] = connection
        return connection

    async def _address(self, bookie_id: str) -> str:
        try:
            registration = await self._registry.registration(bookie_id)
        except TallyError as error:
            raise BookieUnavailable(f"bookie {bookie_id}: {error}") from error
        if registration is not None:
            return registration.info.address
        if ":" in bookie_id:
            return bookie_id
        raise BookieUnavailable(f"bookie {bookie_id} is not registered and has no address")

    async def close(self) -> None:
        self._closed = True
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            await connection.close()
