"""The failpoint tests (tally.failpoints, issue 19): each failpoint made to fail, and what
the code does about it proven from the outside.

An `error` or a `delay` is enabled in-process (`failpoints.enabled`) around bookies run in
the test's event loop (`in_process_cluster`); a `crash` ends a process, so it is enabled
through TALLY_FAILPOINTS for a bookie or auto-recovery process of its own, which the test
restarts without it. Async tests run in a fresh event loop under a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tally.bookie.config import BookieConfig
from tally.bookie.server import Bookie
from tally.client.bookie_connection import BookieConnection
from tally.core.digest import DigestType, master_key
from tally.core.entry_format import encode_entry
from tally.core.errors import TallyError
from tally.core.ids import LedgerId
from tally.failpoints import CRASH_EXIT_CODE, ENVIRONMENT_VARIABLE
from tally.metadata.bookie_registry import BookieRegistry
from tally.metadata.cluster import init_cluster
from tests.support.async_tests import run_if_async
from tests.support.cluster import SESSION_TIMEOUT, store_session
from tests.support.processes import BookieProcess, free_port

ASYNC_TEST_DEADLINE = 90.0
KEY = master_key(b"failpoints")
PASSWORD = b"failpoints"
DIGEST = DigestType.CRC32C

QUIET_DISK = {
    "disk_usage_warn_threshold": 1.0,
    "disk_usage_threshold": 1.0,
    "disk_usage_lwm_threshold": 1.0,
}
"""The test machine's own disk, however full, is not these tests' business."""


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    return run_if_async(pyfuncitem, ASYNC_TEST_DEADLINE)


def payload(ledger_id: LedgerId, entry_id: int, size: int = 1000) -> bytes:
    """An entry's payload: every byte follows from (ledger, entry)."""
    seed = f"{ledger_id.qualified_name}/{entry_id};".encode()
    return (seed * (size // len(seed) + 1))[:size]


def entry(ledger_id: LedgerId, entry_id: int, size: int = 1000) -> bytes:
    """The encoded entry (CRC32C) of `payload`, as a raw writer sends it."""
    data = payload(ledger_id, entry_id, size)
    return encode_entry(ledger_id, entry_id, entry_id - 1, entry_id * size + size, data, DIGEST)


def failpoints_env(spec: str) -> dict[str, str]:
    """The environment of a process with failpoints `spec`."""
    return {ENVIRONMENT_VARIABLE: spec}


def faulty_bookie(
    uri: str,
    data_dir: Path,
    spec: str,
    *,
    program: tuple[str, ...] = BookieProcess.program,
    env: Mapping[str, str] | None = None,
    extra: tuple[str, ...] = (),
    **settings: Any,
) -> BookieProcess:
    """A bookie process (not started) with failpoints `spec` and BookieConfig `settings`,
    as TALLY_FAILPOINTS and TALLY_BOOKIE_* variables (and `env`); `extra`: more options."""
    variables = {"session_timeout": SESSION_TIMEOUT, **QUIET_DISK, **settings}
    return BookieProcess(
        uri,
        data_dir,
        program=program,
        extra=extra,
        env={
            **(env or {}),
            ENVIRONMENT_VARIABLE: spec,
            **{f"TALLY_BOOKIE_{name.upper()}": str(value) for name, value in variables.items()},
        },
    )


def crashed_at(process: BookieProcess, name: str, timeout: float = 30.0) -> None:
    """The process ended with the crash exit code, its log naming failpoint `name`."""
    assert process.process is not None
    code = process.process.wait(timeout)
    assert code == CRASH_EXIT_CODE, f"exit {code}:\n{process.log()}"
    assert f"tally failpoint {name}: crash" in process.log()


# --- raw writers --------------------------------------------------------------------------


@dataclass
class RawWriter:
    """Pipelined adds straight to one bookie, over ledgers of its own: which were
    acknowledged, and which refused."""

    address: str
    ledgers: list[LedgerId]
    size: int = 1000
    acknowledged: dict[LedgerId, set[int]] = field(default_factory=dict)
    refused: dict[LedgerId, set[int]] = field(default_factory=dict)
    next_entry: dict[LedgerId, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for ledger_id in self.ledgers:
            self.acknowledged.setdefault(ledger_id, set())
            self.refused.setdefault(ledger_id, set())
            self.next_entry.setdefault(ledger_id, 0)

    @property
    def acknowledged_count(self) -> int:
        return sum(len(ids) for ids in self.acknowledged.values())

    async def add(self, count: int, window: int = 32) -> None:
        """Send `count` adds, `window` in flight, round robin over the ledgers; wait for
        every answer. Refusals are recorded, not raised."""
        connection = await BookieConnection.connect(self.address, request_timeout=10)
        try:
            pending: set[asyncio.Future[None]] = set()
            for number in range(count):
                if len(pending) >= window:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                pending.add(self._send(connection, self.ledgers[number % len(self.ledgers)]))
            if pending:
                await asyncio.wait(pending)
        finally:
            await connection.close()

    @property
    def refused_count(self) -> int:
        return sum(len(ids) for ids in self.refused.values())

    async def add_until_refused(self, window: int = 32) -> None:
        """Keep `window` adds in flight until the bookie refuses one or goes away."""
        connection = await BookieConnection.connect(self.address, request_timeout=10)
        pending: set[asyncio.Future[None]] = set()
        try:
            for number in itertools.count():
                if len(pending) >= window:
                    _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if connection.closed or self.refused_count:
                    return
                pending.add(self._send(connection, self.ledgers[number % len(self.ledgers)]))
                if number % 16 == 0:
                    await asyncio.sleep(0)
        finally:
            await connection.close()
            if pending:
                await asyncio.wait(pending)

    def _send(self, connection: BookieConnection, ledger_id: LedgerId) -> asyncio.Future[None]:
        entry_id = self.next_entry[ledger_id]
        self.next_entry[ledger_id] += 1
        future = connection.add_nowait(entry(ledger_id, entry_id, self.size), KEY)

        def done(future: asyncio.Future[None]) -> None:
            if future.cancelled():
                return
            if future.exception() is None:
                self.acknowledged[ledger_id].add(entry_id)
            else:
                self.refused[ledger_id].add(entry_id)

        future.add_done_callback(done)
        return future


async def read_back(
    address: str, acknowledged: Mapping[LedgerId, Iterable[int]], size: int = 1000
) -> int:
    """Read every acknowledged entry straight from the bookie: exactly the bytes sent.
    Returns how many were read."""
    connection = await BookieConnection.connect(address, request_timeout=30)
    read = 0
    try:
        for ledger_id, entry_ids in acknowledged.items():
            ordered = sorted(entry_ids)
            for first in range(0, len(ordered), 256):
                batch = ordered[first : first + 256]
                answers = await asyncio.gather(
                    *(connection.read(ledger_id, e) for e in batch), return_exceptions=True
                )
                for entry_id, answer in zip(batch, answers, strict=True):
                    assert not isinstance(answer, BaseException), (
                        f"acknowledged entry {entry_id} of ledger {ledger_id} on {address}: "
                        f"{type(answer).__name__}: {answer}"
                    )
                    assert answer == entry(ledger_id, entry_id, size), (ledger_id, entry_id)
                read += len(batch)
    finally:
        await connection.close()
    return read


# --- in-process bookies ---------------------------------------------------------------------

_memory_stores = itertools.count()


@dataclass
class InProcessCluster:
    """Bookies in the test's event loop on one metadata store, each on a port of its own
    (kept across restarts, so it keeps its id)."""

    uri: str
    root: Path
    settings: dict[str, Any]
    bookies: dict[str, Bookie] = field(default_factory=dict)
    configs: dict[str, BookieConfig] = field(default_factory=dict)

    async def start(self, count: int) -> list[str]:
        configs = [
            self._config(self.root / f"bookie-{len(self.configs) + number}", free_port())
            for number in range(count)
        ]
        await asyncio.gather(*(self._start(config) for config in configs))
        return [config.listen for config in configs]

    async def take_over(self, process: BookieProcess) -> Bookie:
        """Start, in this event loop, the bookie that `process` ran (which is gone): its
        directories, its port and id, this cluster's settings, and no failpoint."""
        assert process.process is None or process.process.poll() is not None
        config = self._config(process.data_dir, process.port)
        await self._start(config)
        return self.bookies[config.listen]

    def _config(self, data_dir: Path, port: int) -> BookieConfig:
        config = BookieConfig(
            metadata=self.uri,
            data_dir=data_dir,
            listen=f"127.0.0.1:{port}",
            session_timeout=SESSION_TIMEOUT,
            **{**QUIET_DISK, **self.settings},
        )
        self.configs[config.listen] = config
        return config

    async def _start(self, config: BookieConfig) -> None:
        bookie = Bookie(config)
        await bookie.start()
        self.bookies[bookie.bookie_id] = bookie

    async def stop(self, bookie_id: str) -> None:
        await self.bookies.pop(bookie_id).stop()

    async def restart(self, bookie_id: str) -> Bookie:
        if bookie_id in self.bookies:
            await self.stop(bookie_id)
        await self._start(self.configs[bookie_id])
        return self.bookies[bookie_id]

    async def close(self) -> None:
        for bookie_id in list(self.bookies):
            with contextlib.suppress(TallyError, OSError):
                await self.stop(bookie_id)

    async def registered_as(self, bookie_id: str) -> str | None:
        """ "writable", "readonly" or None, as the store lists the bookie now."""
        async with store_session(self.uri) as store:
            registration = await BookieRegistry(store).registration(bookie_id)
        if registration is None:
            return None
        return "readonly" if registration.read_only else "writable"


@contextlib.asynccontextmanager
async def in_process_cluster(
    root: Path, count: int, *, uri: str | None = None, **settings: Any
) -> AsyncIterator[InProcessCluster]:
    """`count` bookies in this event loop on a new cluster (a memory store of its own
    unless `uri` names an initialised one); BookieConfig `settings` for each."""
    if uri is None:
        uri = f"memory://failpoints-{os.getpid()}-{next(_memory_stores)}"
        async with store_session(uri) as store:
            await init_cluster(store)
    cluster = InProcessCluster(uri, root, dict(settings))
    try:
        await cluster.start(count)
        yield cluster
    finally:
        await cluster.close()
