"""Real tally processes for tests: a cluster on a sqlite store, bookie and auto-recovery
processes.

Each runs as `python -m tally.cli.main ...` in its own process group, so a test can
SIGKILL, SIGSTOP or SIGTERM it exactly as an operator's incident would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tally.metadata.cluster import init_cluster as init_cluster_in
from tally.metadata.stores import open_store

READY_TIMEOUT = 30.0


PORTS = range(20_000, 32_768)
"""Where test processes listen: below Linux's ephemeral range (32768-60999), from which the
kernel picks the local port of every outgoing connection, so that none can take a port
between the probe and the process's bind (seen as EADDRINUSE under two test workers)."""


def _worker_ports() -> Iterator[int]:
    """This test worker's share of PORTS (pytest-xdist's workers split it), shuffled, each
    port once: two workers, or two tests of one, never get the same port."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    share = len(PORTS) // workers
    ports = list(PORTS[worker * share : (worker + 1) * share])
    random.shuffle(ports)
    return iter(ports)


_PORTS = _worker_ports()


def free_port() -> int:
    """A port of this worker's share that nothing listens on now."""
    for port in _PORTS:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"every port of this test worker's share of {PORTS} was handed out")


def tally(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run the tally CLI to completion."""
    return subprocess.run(
        [sys.executable, "-m", "tally.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def init_cluster(root: Path) -> str:
    """A new cluster on a sqlite store under `root`; returns its metadata URI. Made in this
    process (tests/cli tests `tally cluster init` itself), in a thread of its own, so that
    async tests may call it too."""
    uri = f"sqlite:///{root / 'meta.db'}"
    root.mkdir(parents=True, exist_ok=True)

    async def init() -> None:
        async with open_store(uri) as store:
            await init_cluster_in(store)

    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, init()).result()
    return uri


@dataclass
class BookieProcess:
    """One bookie process; `start` waits until it has registered and prints its address."""

    metadata: str
    data_dir: Path
    port: int = field(default_factory=free_port)
    extra: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    program: tuple[str, ...] = ("tally.cli.main", "bookie")
    """The module run with `python -m`, and its arguments before the bookie's options."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment variables of this process beside the inherited ones (TALLY_FAILPOINTS,
    say), for its next starts."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> BookieProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / "bookie.log"
        log = self.log_path.open("a")
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", *self.program,
                "--metadata", self.metadata,
                "--data-dir", str(self.data_dir),
                "--listen", self.address,
                *self.extra,
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            env={**os.environ, **self.env},
        )  # fmt: skip
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        assert self.process is not None
        wait_for_output(self.process, b" ready on ", f"bookie {self.address}", self.log)

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""

    def signal(self, signum: int) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code."""
        assert self.process is not None
        return stop_process(self.process, self.log)


STOP_TIMEOUT = 30.0


def stop_process(process: subprocess.Popen[bytes], log: Callable[[], str]) -> int:
    """SIGTERM a process group and wait for a clean exit; returns the exit code. One that
    has not exited within STOP_TIMEOUT is asked for its threads' stacks (SIGUSR1, see
    tally.cli.main), then SIGKILLed, and its log's end goes to stderr, which pytest shows
    with the failure that follows (exit code -9)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(2)
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
            print(f"no exit {STOP_TIMEOUT:g}s after SIGTERM; its log ends:", file=sys.stderr)
            print(log()[-20_000:], file=sys.stderr)
    return process.returncode


def wait_for_output(
    process: subprocess.Popen[bytes], marker: bytes, what: str, log: Callable[[], str]
) -> None:
    """Wait until `process` prints `marker` on its stdout (which is a pipe)."""
    assert process.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT
    fd = process.stdout.fileno()
    os.set_blocking(fd, False)
    seen = b""
    while time.monotonic() < deadline:
        with contextlib.suppress(BlockingIOError):
            seen += os.read(fd, 4096)
        if marker in seen:
            return
        if process.poll() is not None:
            raise AssertionError(f"{what} exited with {process.returncode}:\n{log()}")
        time.sleep(0.02)
    raise AssertionError(f"{what} not ready in {READY_TIMEOUT}s:\n{log()}")


@dataclass
class AutoRecoveryProcess:
    """One `tally autorecovery` process; `start` waits until its first generation runs.
    Settings come as TALLY_AUTORECOVERY_* variables in `settings` (without the prefix), and
    its client's as TALLY_CLIENT_* ones in `client_settings`."""

    metadata: str
    log_path: Path
    process_id: str
    settings: Mapping[str, str] = field(default_factory=dict)
    client_settings: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    """Other environment variables of the process (TALLY_FAILPOINTS, say)."""
    http_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> AutoRecoveryProcess:
        variables = {
            **self.env,
            **{f"TALLY_AUTORECOVERY_{k.upper()}": v for k, v in self.settings.items()},
            **{f"TALLY_CLIENT_{k.upper()}": v for k, v in self.client_settings.items()},
        }
        log = self.log_path.open("a")
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "tally.cli.main", "autorecovery",
                "--metadata", self.metadata,
                "--id", self.process_id,
                "--http-port", str(self.http_port),
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            env={**os.environ, **variables},
        )  # fmt: skip
        wait_for_output(self.process, b" ready", f"autorecovery {self.process_id}", self.log)
        return self

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> int:
        assert self.process is not None
        return stop_process(self.process, self.log)


@contextlib.contextmanager
def environment(variables: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the child processes started meanwhile."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
