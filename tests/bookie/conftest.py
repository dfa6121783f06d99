"""Shared fixtures for the bookie server tests: real bookie processes, in-process bookies,
raw sockets, entries and the /metrics scrape.

Tests here may be `async def`: each runs in its own event loop under a deadline. Bookie
processes get their settings as TALLY_BOOKIE_* variables (the way an operator's unit file
would), a short session timeout so that a SIGKILLed bookie's registration goes quickly,
and a Prometheus port of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import subprocess
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tally.bookie.config import BookieConfig
from tally.bookie.server import Bookie
from tally.cli.bookie import admin_http
from tally.client.bookie_connection import BookieConnection
from tally.core.digest import DigestType, master_key
from tally.core.entry_format import encode_entry
from tally.core.ids import LedgerId
from tally.core.protocol import Response, ResponseReader
from tally.metadata.bookie_registry import BookieRegistry
from tally.metadata.cluster import init_cluster as init_cluster_in
from tally.metadata.store import MetadataStore
from tests.support.async_tests import run_if_async
from tests.support.cluster import SESSION_TIMEOUT, store_session
from tests.support.processes import BookieProcess, environment, free_port, init_cluster, tally

ASYNC_TEST_DEADLINE = 30.0
KEY = master_key(b"the ledger password")
OTHER_KEY = master_key(b"another password")

_ledger_ids = itertools.count(1)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests in a fresh event loop, under a deadline."""
    return run_if_async(pyfuncitem, ASYNC_TEST_DEADLINE)


def new_ledger(scope: int = 0) -> LedgerId:
    """A ledger id no other test in the session uses (tests share bookies)."""
    return LedgerId(scope, next(_ledger_ids))


def entry(
    ledger_id: LedgerId, entry_id: int, payload: bytes = b"payload", lac: int | None = None
) -> bytes:
    """An encoded entry (CRC32C digest); its piggy-backed LAC defaults to entry_id - 1."""
    last = entry_id - 1 if lac is None else lac
    return encode_entry(
        ledger_id, entry_id, last, 1000 * entry_id + len(payload), payload, DigestType.CRC32C
    )


@contextlib.asynccontextmanager
async def connected(address: str, **options: Any) -> AsyncIterator[BookieConnection]:
    options.setdefault("request_timeout", 10.0)
    connection = await BookieConnection.connect(address, **options)
    try:
        yield connection
    finally:
        await connection.close()


async def registered_mode(store: MetadataStore, bookie_id: str) -> str | None:
    """ "writable", "readonly" or None, as the store lists the bookie now."""
    registration = await BookieRegistry(store).registration(bookie_id)
    if registration is None:
        return None
    return "readonly" if registration.read_only else "writable"


async def registration_of(uri: str, bookie_id: str) -> str | None:
    """`registered_mode`, through a session of its own on the store at `uri`."""
    async with store_session(uri) as store:
        return await registered_mode(store, bookie_id)


# --- raw sockets ------------------------------------------------------------------------------


class RawConnection:
    """A plain socket to a bookie for bytes no client would send, with a response decoder."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._decoder = ResponseReader()
        self._decoded: list[Response] = []

    @classmethod
    async def open(cls, address: str) -> RawConnection:
        host, _, port = address.rpartition(":")
        return cls(*await asyncio.open_connection(host, int(port)))

    @property
    def local_address(self) -> str:
        """host:port of this end, as the bookie's log names its peer."""
        host, port = self._writer.get_extra_info("sockname")[:2]
        return f"{host}:{port}"

    async def send(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    async def end(self) -> None:
        """Half-close: the bookie sees end of stream."""
        self._writer.write_eof()
        await self._writer.drain()

    async def responses(self, count: int, timeout: float = 10.0) -> list[Response]:
        async with asyncio.timeout(timeout):
            while len(self._decoded) < count:
                data = await self._reader.read(65536)
                assert data, f"connection closed after {len(self._decoded)} of {count} responses"
                self._decoded += self._decoder.feed(data)
        taken, self._decoded = self._decoded[:count], self._decoded[count:]
        return taken

    async def closed_by_bookie(self, timeout: float = 10.0) -> bool:
        """True once the bookie closed the connection (EOF or reset), ignoring any data."""
        async with asyncio.timeout(timeout):
            try:
                while await self._reader.read(65536):
                    pass
            except ConnectionResetError:
                pass
        return True

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


# --- metrics ----------------------------------------------------------------------------------


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the bookie's /metrics, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(
    samples: Mapping[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """One sample's value; 0 for a labelled counter not yet incremented."""
    return samples.get((name, frozenset(labels.items())), 0.0)


# --- bookie processes -------------------------------------------------------------------------


def bookie_environment(settings: Mapping[str, object]) -> dict[str, str]:
    """TALLY_BOOKIE_* variables for `settings` (BookieConfig field names)."""
    return {f"TALLY_BOOKIE_{name.upper()}": str(value) for name, value in settings.items()}


@dataclass
class BookieUnderTest(BookieProcess):
    """A bookie process with settings (as environment variables) and a /metrics port."""

    settings: dict[str, object] = field(default_factory=dict)
    metrics_port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        self.extra = ("--metrics-port", str(self.metrics_port), *self.extra)

    def start(self) -> BookieUnderTest:
        variables = bookie_environment({"session_timeout": SESSION_TIMEOUT, **self.settings})
        with environment(variables):
            super().start()
        return self

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return scrape(self.metrics_port)

    def refused_start(self) -> subprocess.CompletedProcess[str]:
        """Run the bookie expecting it to refuse to start; its exit and its stderr."""
        variables = bookie_environment({"session_timeout": SESSION_TIMEOUT, **self.settings})
        command = [
            "bookie", "--metadata", self.metadata, "--data-dir", str(self.data_dir),
            "--listen", self.address, *self.extra,
        ]  # fmt: skip
        with environment(variables):
            return tally(*command, timeout=30)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A cluster on a sqlite store of the module's own; its metadata URI."""
    return init_cluster(tmp_path_factory.mktemp("cluster"))


@contextlib.contextmanager
def running(bookie: BookieUnderTest) -> Iterator[BookieUnderTest]:
    """Start the bookie; SIGKILL it at the end whatever happened (no stray processes)."""
    try:
        yield bookie.start()
    finally:
        bookie.kill()


# --- in-process bookies -----------------------------------------------------------------------


@dataclass
class InProcess:
    """A bookie in the test's event loop, and an admin session on its (memory) store."""

    bookie: Bookie
    store: MetadataStore

    @property
    def address(self) -> str:
        return self.bookie.address

    async def registered_as(self) -> str | None:
        return await registered_mode(self.store, self.bookie.bookie_id)


_memory_stores = itertools.count()


@contextlib.asynccontextmanager
async def in_process_bookie(data_dir: Path, **settings: Any) -> AsyncIterator[InProcess]:
    """A started `Bookie` on a fresh memory:// cluster, stopped at the end."""
    uri = f"memory://bookie-test-{os.getpid()}-{next(_memory_stores)}"
    async with store_session(uri) as admin:
        await init_cluster_in(admin)
        config = BookieConfig(metadata=uri, data_dir=data_dir, listen="127.0.0.1:0", **settings)
        bookie = Bookie(config, admin_http=admin_http)
        try:
            await bookie.start()
            yield InProcess(bookie, admin)
        finally:
            await bookie.stop()
