"""Fixtures for the client end-to-end tests: real bookie processes on loopback, a writer
in a process of its own, and direct looks at every replica.

Tests here may be `async def`: each runs in a fresh event loop under a deadline. The
cluster itself is tests/support/cluster.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tally.client.config import ClientConfig
from tally.core.ids import LedgerId
from tests.support.async_tests import run_if_async
from tests.support.cluster import (  # noqa: F401 (fixtures' helpers, used by the tests here)
    SESSION_TIMEOUT,
    Cluster,
    eventually_writable,
    extra_copies,
    read_all,
    replica_copies,
    running_cluster,
    store_session,
)

ASYNC_TEST_DEADLINE = 90.0
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
