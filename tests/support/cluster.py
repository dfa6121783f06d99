"""A real cluster for tests: a sqlite metadata store and bookie processes on loopback, with
ways to pause, kill and restart bookies and to look at every replica directly.

Bookies get a short metadata session (a killed bookie's registration lapses in seconds)
through TALLY_BOOKIE_* variables, as an operator's unit file would set them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tally.client.bookie_connection import BookieConnection
from tally.client.reader import LedgerReader
from tally.core.availability import EntryAvailability
from tally.core.digest import mac_key
from tally.core.entry_format import decode_entry
from tally.core.errors import NoSuchLedger, TallyError
from tally.core.ids import LedgerId
from tally.core.ledger_audit import over_replicated
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.schedule import write_set
from tally.metadata.bookie_registry import BookieRegistry
from tally.metadata.store import MetadataStore
from tally.metadata.stores import open_store
from tests.support.processes import BookieProcess, environment, init_cluster

SESSION_TIMEOUT = 2.0
"""Seconds: the bookies' metadata session, so a dead bookie leaves the writable set fast."""


@dataclass
class Cluster:
    """A sqlite-backed cluster and its bookie processes; bookie id == "127.0.0.1:port"."""

    uri: str
    root: Path
    bookies: list[BookieProcess] = field(default_factory=list)
    paused: set[str] = field(default_factory=set)

    def start(self, count: int) -> None:
        self.add(self.new_bookies(count))

    def new_bookies(self, count: int) -> list[BookieProcess]:
        """`count` bookie processes for this cluster, not started."""
        first = len(self.bookies)
        return [BookieProcess(self.uri, self.root / f"bookie-{first + i}") for i in range(count)]

    def add(self, bookies: list[BookieProcess]) -> None:
        """Start `bookies` (of this cluster's store) in parallel, and count them in."""
        self.bookies += bookies
        self._start_all(bookies)

    def _start_all(self, bookies: list[BookieProcess]) -> None:
        """Start in parallel: each start waits for its bookie to register."""
        with (
            environment({"TALLY_BOOKIE_SESSION_TIMEOUT": str(SESSION_TIMEOUT)}),
            ThreadPoolExecutor(max(1, len(bookies))) as pool,
        ):
            list(pool.map(BookieProcess.start, bookies))

    def bookie(self, bookie_id: str) -> BookieProcess:
        return next(b for b in self.bookies if b.address == bookie_id)

    def pause(self, bookie_id: str) -> None:
        self.bookie(bookie_id).signal(signal.SIGSTOP)
        self.paused.add(bookie_id)

    def resume(self, bookie_id: str) -> None:
        self.bookie(bookie_id).signal(signal.SIGCONT)
        self.paused.discard(bookie_id)

    def kill(self, bookie_id: str) -> None:
        """SIGKILL (a paused bookie too: what it had not read from its sockets is lost)."""
        self.bookie(bookie_id).kill()
        self.paused.discard(bookie_id)

    def restart(self, bookie_ids: list[str]) -> None:
        self._start_all([self.bookie(b) for b in bookie_ids])

    def restore(self) -> None:
        """Every bookie running and registered again. A paused bookie is resumed and
        restarted: paused past its session, it would stop itself at some later moment."""
        for bookie_id in list(self.paused):
            self.resume(bookie_id)
            self.bookie(bookie_id).stop()
        dead = [b for b in self.bookies if b.process is None or b.process.poll() is not None]
        if dead:
            self._start_all(dead)
        asyncio.run(eventually_writable(self.uri, {b.address for b in self.bookies}))

    def shutdown(self) -> None:
        for bookie_id in list(self.paused):
            self.resume(bookie_id)
        for bookie in self.bookies:
            bookie.kill()


@contextlib.contextmanager
def running_cluster(root: Path, count: int) -> Iterator[Cluster]:
    cluster = Cluster(init_cluster(root), root)
    try:
        cluster.start(count)
        yield cluster
    finally:
        cluster.shutdown()


@contextlib.asynccontextmanager
async def store_session(uri: str) -> AsyncIterator[MetadataStore]:
    store = open_store(uri, session_timeout=SESSION_TIMEOUT)
    await store.start()
    try:
        yield store
    finally:
        await store.close()


async def eventually_writable(uri: str, expected: set[str], timeout: float = 15.0) -> None:
    """Wait until the writable bookies are exactly `expected` (registrations lapse late)."""
    async with store_session(uri) as store:
        registry = BookieRegistry(store)
        deadline = asyncio.get_running_loop().time() + timeout
        while (found := set(await registry.writable_bookies())) != expected:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"writable bookies {sorted(found)}, expected {expected}")
            await asyncio.sleep(0.1)


async def read_all(reader: LedgerReader) -> dict[int, bytes]:
    """Every entry of the reader's view, by entry id."""
    if reader.last_entry_id < 0:
        return {}
    return {e.entry_id: e.data async for e in reader.read(0, reader.last_entry_id)}


async def extra_copies(
    ledger_id: LedgerId, metadata: LedgerMetadata, bookies: set[str]
) -> list[tuple[str, int, int]]:
    """(bookie, segment, entries) of every copy that `bookies` hold of the ledger where no
    write set of the (closed) metadata puts it: over-replication, as the audit counts it."""
    held = {}
    for bookie in sorted(bookies):
        connection = await BookieConnection.connect(bookie, request_timeout=5.0)
        try:
            held[bookie] = await connection.get_list_of_entries(ledger_id)
        except NoSuchLedger:
            held[bookie] = EntryAvailability.empty()
        finally:
            await connection.close()
    return [
        (row.bookie_id or "", row.segment_index or 0, row.missing_count or 0)
        for row in over_replicated(metadata, held)
    ]


async def replica_copies(
    ledger_id: LedgerId, metadata: LedgerMetadata, password: bytes, last: int
) -> dict[int, dict[str, bytes | str]]:
    """For entries 0..last, what each bookie of the entry's write set holds: the verified
    payload, or the name of the error it answered (NoSuchEntry, EntryUnreadable, ...)."""
    key = mac_key(password)
    bookies = {b for e in range(last + 1) for b in metadata.ensemble_at(e)}
    connections = {b: await BookieConnection.connect(b, request_timeout=5.0) for b in bookies}

    async def copy(bookie: str, entry_id: int) -> bytes | str:
        try:
            raw = await connections[bookie].read(ledger_id, entry_id)
            entry = decode_entry(raw, metadata.digest_type, key)
        except TallyError as error:
            return type(error).__name__
        assert (entry.ledger_id, entry.entry_id) == (ledger_id, entry_id)
        return entry.payload

    try:
        copies: dict[int, dict[str, bytes | str]] = {}
        for entry_id in range(last + 1):
            ensemble = metadata.ensemble_at(entry_id)
            holders = [
                ensemble[p]
                for p in write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
            ]
            answers = await asyncio.gather(*(copy(b, entry_id) for b in holders))
            copies[entry_id] = dict(zip(holders, answers, strict=True))
        return copies
    finally:
        for connection in connections.values():
            await connection.close()
