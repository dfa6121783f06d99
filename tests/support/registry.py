"""A cluster that exists only in a memory store: bookies registered with their racks, none
serving. Enough for what the client decides from the registry alone (placement)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from tally.metadata.bookie_registry import BookieInfo, BookiePlacement, BookieRegistry
from tally.metadata.cluster import init_cluster
from tally.metadata.store import MetadataStore
from tally.metadata.stores import open_store

_names = itertools.count()


@dataclass
class Registry:
    uri: str
    sessions: dict[str, MetadataStore]
    """Each bookie's own session: its registration lives as long as it does."""

    async def lose(self, bookie: str) -> None:
        """The bookie's session ends, and its registration with it (its rack stays set)."""
        await self.sessions.pop(bookie).close()


@contextlib.asynccontextmanager
async def registered_bookies(
    racks: Mapping[str, str | None], read_only: frozenset[str] = frozenset()
) -> AsyncIterator[Registry]:
    """Bookies registered (writable unless in `read_only`), each on its rack (None: never
    set, as for a bookie started without --rack)."""
    uri = f"memory://registered-bookies-{next(_names)}"
    store = open_store(uri)
    await store.start()
    registry = Registry(uri, {})
    try:
        await init_cluster(store)
        for bookie, rack in racks.items():
            session = open_store(uri)
            await session.start()
            registry.sessions[bookie] = session
            await BookieRegistry(session).register(
                bookie, BookieInfo(bookie, None, "test", 0), read_only=bookie in read_only
            )
            if rack is not None:
                await BookieRegistry(store).set_placement(bookie, BookiePlacement(rack, "/zone"))
        yield registry
    finally:
        for session in registry.sessions.values():
            await session.close()
        await store.close()
