"""A local ZooKeeper for tests and benchmarks: Debian's `zookeeper` package, on loopback.

The metadata tests run against a real ZooKeeper and the benchmarks measure one, so both
start it the same way: a standalone server with its own data directory on a free port,
up once it says it serves clients. `scripts/ensure-zookeeper.sh` installs the package.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tally.core.errors import MetadataStoreError, Timeout

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
START_DEADLINE = 30.0
"""Seconds for a JVM to start ZooKeeper on a loaded machine."""


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def four_letter_word(port: int, word: bytes, timeout: float = 1.0) -> bytes:
    """ZooKeeper's answer to an admin word such as b"ruok" (b"imok" when serving)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(word)
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


def _serving(port: int) -> bool:
    """Whether the server takes sessions: `imok` comes earlier, and a client that connects
    then is dropped (kazoo reconnects, but warns)."""
    return four_letter_word(port, b"ruok") == b"imok" and b"Mode: " in four_letter_word(
        port, b"srvr"
    )


def missing_prerequisite() -> str | None:
    """Why a ZooKeeper cannot be started here, or None when it can."""
    if shutil.which("java") is None or not ZOOKEEPER_JAR.exists():
        return (
            f"a real ZooKeeper is required: java or {ZOOKEEPER_JAR} is missing; "
            "run scripts/ensure-zookeeper.sh (installs Debian's zookeeper package)"
        )
    return None


def _classpath() -> str:
    """zookeeper.jar names its dependencies in its manifest; add an slf4j binding."""
    java_dir = ZOOKEEPER_JAR.parent
    binding = next(
        (
            java_dir / name
            for name in ("slf4j-simple.jar", "slf4j-nop.jar")
            if (java_dir / name).exists()
        ),
        None,
    )
    return ":".join(str(p) for p in (ZOOKEEPER_JAR, binding) if p is not None)


@dataclass
class ZooKeeperServer:
    """A standalone ZooKeeper 3.8 on loopback, with its own data dir; restartable.

    `force_sync=False` (the tests' choice) skips ZooKeeper's fsync of its transaction log;
    a benchmark that compares ZooKeeper with a store that syncs should pass True.
    """

    workdir: Path
    port: int = field(default_factory=free_port)
    force_sync: bool = False
    running_port: int | None = None
    process: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def uri(self, chroot: str) -> str:
        return f"zk://{self.hosts}{chroot}"

    def start(self, port: int | None = None) -> None:
        """Start (on `port`, else the usual one) and wait until it serves clients."""
        if self.process is not None:
            raise MetadataStoreError(f"ZooKeeper already running on port {self.running_port}")
        why_not = missing_prerequisite()
        if why_not is not None:
            raise MetadataStoreError(why_not)
        port = self.port if port is None else port
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        config = self.workdir / "zoo.cfg"
        config.write_text(
            "\n".join(
                [
                    "tickTime=200",
                    "initLimit=10",
                    "syncLimit=5",
                    f"dataDir={self.workdir / 'data'}",
                    f"clientPort={port}",
                    "clientPortAddress=127.0.0.1",
                    "admin.enableServer=false",
                    "4lw.commands.whitelist=ruok,stat,srvr",
                    "minSessionTimeout=400",
                    "maxSessionTimeout=20000",
                    "maxClientCnxns=0",
                    f"forceSync={'yes' if self.force_sync else 'no'}",
                    "",
                ]
            )
        )
        log_path = self.workdir / "zookeeper.log"
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    "java",
                    "-Xmx256m",
                    "-XX:+UseSerialGC",
                    "-XX:TieredStopAtLevel=1",
                    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                    "-cp",
                    _classpath(),
                    "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                    str(config),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_DEADLINE
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if _serving(port):
                    self.running_port = port
                    return
            except OSError:
                pass
            time.sleep(0.05)
        tail = log_path.read_text(errors="replace")[-3000:]
        self.stop()
        raise Timeout(
            f"ZooKeeper did not serve clients on port {port} within {START_DEADLINE}s; "
            f"the end of {log_path}:\n{tail}"
        )

    def stop(self) -> None:
        process, self.process, self.running_port = self.process, None, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def restart(self, port: int | None = None) -> None:
        self.stop()
        self.start(port)
