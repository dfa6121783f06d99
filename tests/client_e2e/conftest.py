"""Fixtures for the client end-to-end tests: real bookie processes on loopback, a writer
in a process of its own, and direct looks at every replica.

Tests here may be `async def`: each runs in a fresh event loop under a deadline. Bookies
get a short metadata session (a killed bookie's registration lapses in seconds) through
TALLY_BOOKIE_* variables, as an operator's unit file would set them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tally.client.bookie_connection import BookieConnection
from tally.client.config import ClientConfig
from tally.client.reader import LedgerReader
from tally.core.digest import mac_key
from tally.core.entry_format import decode_entry
from tally.core.errors import TallyError
from tally.core.ids import LedgerId
from tally.core.metadata import LedgerMetadata
from tally.core.schedule import write_set
from tally.metadata.bookie_registry import BookieRegistry
from tally.metadata.store import MetadataStore, open_store
from tests.support.async_tests import run_if_async
from tests.support.processes import BookieProcess, environment, init_cluster

ASYNC_TEST_DEADLINE = 90.0
SESSION_TIMEOUT = 2.0
"""Seconds: the bookies' metadata session, so a dead bookie leaves the writable set fast."""

FAST = ClientConfig(
    add_entry_timeout=1.5, read_timeout=1.5, speculative_read_timeout=0.3, session_timeout=5.0
)
"""Short timeouts for tests where bookies die or hang."""

WORKER = Path(__file__).with_name("writer_worker.py")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests in a fresh event loop, under a deadline."""
    return run_if_async(pyfuncitem, ASYNC_TEST_DEADLINE)


@dataclass
class Cluster:
    """A sqlite-backed cluster and its bookie processes; bookie id == "127.0.0.1:port"."""

    uri: str
    root: Path
    bookies: list[BookieProcess] = field(default_factory=list)
    paused: set[str] = field(default_factory=set)

    def start(self, count: int) -> None:
        self.bookies += [
            BookieProcess(self.uri, self.root / f"bookie-{len(self.bookies) + i}")
            for i in range(count)
        ]
        self._start_all(self.bookies)

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


@dataclass
class WriterWorker:
    """`writer_worker.py` as a child process, its output read line by line as it comes."""

    process: asyncio.subprocess.Process
    seed: int
    ledger_id: LedgerId | None = None
    acked: dict[int, bytes] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    async def next_line(self) -> str:
        """The next whole line ("" at the end); ACK lines are recorded on the way."""
        assert self.process.stdout is not None
        raw = await self.process.stdout.readline()
        if not raw.endswith(b"\n"):
            return ""  # the end, or a line the kill cut short: never acknowledged
        line = raw.decode().rstrip("\n")
        self.lines.append(line)
        if line.startswith("ACK "):
            _, entry_id, data = line.split(" ")
            assert int(entry_id) not in self.acked, f"entry {entry_id} acknowledged twice"
            self.acked[int(entry_id)] = bytes.fromhex(data)
        return line

    async def until(self, prefix: str) -> str:
        while line := await self.next_line():
            if line.startswith(prefix):
                return line
        raise AssertionError(f"the worker ended without a {prefix!r} line: {self.lines[-5:]}")

    async def until_acked(self, count: int) -> None:
        while len(self.acked) < count:
            line = await self.next_line()
            assert line, f"the worker ended after {len(self.acked)} acks: {self.lines[-5:]}"
            assert not line.startswith("ERROR"), line

    async def command(self, text: str) -> str:
        """Send a --commands line; the DONE line that finished it."""
        assert self.process.stdin is not None
        self.process.stdin.write(text.encode() + b"\n")
        await self.process.stdin.drain()
        return await self.until("DONE")

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    async def kill(self) -> None:
        """SIGKILL (unless it ended), then take every whole line it wrote before dying."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        while await self.next_line():
            pass
        await self.process.wait()
        if self.process.stdin is not None:
            self.process.stdin.close()

    async def finish(self, timeout: float = 30.0) -> int:
        """Read to the end and wait for the exit; its code."""

        async def rest() -> None:
            while await self.next_line():
                pass

        await asyncio.wait_for(rest(), timeout)
        return await asyncio.wait_for(self.process.wait(), timeout)


@contextlib.asynccontextmanager
async def writer_process(
    uri: str,
    quorums: tuple[int, int, int],
    *,
    seed: int,
    password: str,
    stderr: Path,
    options: tuple[str, ...] = (),
) -> AsyncIterator[WriterWorker]:
    """`writer_worker.py` started with a new ledger; SIGKILLed on the way out, whatever
    happened, so no writer outlives its test."""
    ensemble, write_quorum, ack_quorum = quorums
    with stderr.open("ab") as errors:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER),
            "--metadata", uri,
            "--ensemble", str(ensemble),
            "--write-quorum", str(write_quorum),
            "--ack-quorum", str(ack_quorum),
            "--password", password,
            "--seed", str(seed),
            *options,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
        )  # fmt: skip
    worker = WriterWorker(process, seed)
    try:
        line = await worker.next_line()
        assert line.startswith("LEDGER "), f"{line!r}; stderr: {stderr.read_text()}"
        worker.ledger_id = LedgerId.from_qualified_name(line.split()[1])
        yield worker
    finally:
        await worker.kill()


@pytest.fixture
def healthy(cluster: Cluster) -> Cluster:
    """The module's `cluster`, with every bookie running and registered."""
    cluster.restore()
    return cluster


@pytest.fixture
def worker_log(tmp_path: Path) -> Path:
    return tmp_path / "worker.stderr"
