"""A local ZooKeeper for tests and benchmarks: Debian's `zookeeper` package, on loopback.

The metadata tests run against a real ZooKeeper and the benchmarks measure one, so both
start it the same way: a standalone server with its own data directory on a free port,
up once it says it serves clients. The chaos suite also pauses and kills one, as a member
of a `zk_ensemble`. `scripts/ensure-zookeeper.sh` installs the package.
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
from tally.ports import free_port

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
START_DEADLINE = 30.0
"""Seconds for a JVM to start ZooKeeper on a loaded machine."""


def four_letter_word(port: int, word: bytes, timeout: float = 1.0) -> bytes:
    """ZooKeeper's answer to an admin word such as b"ruok" (b"imok" when serving)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(word)
        chunks = []
        while chunk := s.recv(4096):
            chunks.append(chunk)
    return b"".join(chunks)


def srvr(port: int) -> dict[str, str]:
    """The fields of the `srvr` word's answer (Mode, Connections, Zxid...) by name; none
    while the server takes no sessions (it answers a sentence then) or answers nothing."""
    try:
        answer = four_letter_word(port, b"srvr").decode(errors="replace")
    except OSError:
        return {}
    return dict(line.split(": ", 1) for line in answer.splitlines() if ": " in line)


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

    @property
    def log_path(self) -> Path:
        return self.workdir / "zookeeper.log"

    def uri(self, chroot: str) -> str:
        return f"zk://{self.hosts}{chroot}"

    def start(self, port: int | None = None) -> None:
        """Start (on `port`, else the usual one) and wait until it serves clients."""
        self.launch(port)
        self.wait_serving(time.monotonic() + START_DEADLINE)

    def launch(self, port: int | None = None) -> None:
        """Start the JVM without waiting for it, so that several servers start at once."""
        if self.process is not None:
            raise MetadataStoreError(f"ZooKeeper already running on port {self.running_port}")
        why_not = missing_prerequisite()
        if why_not is not None:
            raise MetadataStoreError(why_not)
        self.running_port = self.port if port is None else port
        config = self._write_config(self.running_port)
        with self.log_path.open("ab") as log:
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

    def _write_config(self, port: int) -> Path:
        """The data directory and the zoo.cfg of a server on `port`; the config's path."""
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        config = self.workdir / "zoo.cfg"
        config.write_text("\n".join([*self._config_lines(port), ""]))
        return config

    def _config_lines(self, port: int) -> list[str]:
        """zoo.cfg's settings: a 200 ms tick, so that sessions and elections settle in
        test time, and only the admin words the tests use."""
        return [
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
        ]

    def wait_serving(self, deadline: float) -> None:
        """Wait until the launched server serves clients (says its mode: `ruok` answers
        earlier, and a client that connects then is dropped; a quorum member serves only in
        a quorum); stopped, and Timeout, if it does not by `deadline` (time.monotonic())."""
        if self.process is None or self.running_port is None:
            raise MetadataStoreError(f"ZooKeeper in {self.workdir} is not running")
        while time.monotonic() < deadline and self.process.poll() is None:
            if self.mode() is not None:
                return
            time.sleep(0.05)
        port, tail = self.running_port, self.log_path.read_text(errors="replace")[-3000:]
        self.stop()
        raise Timeout(
            f"ZooKeeper did not serve clients on port {port} within {START_DEADLINE}s; "
            f"the end of {self.log_path}:\n{tail}"
        )

    def mode(self) -> str | None:
        """standalone, leader or follower while it serves clients, else None."""
        return None if self.running_port is None else srvr(self.running_port).get("Mode")

    def pause(self) -> None:
        """SIGSTOP: the server holds its sockets but answers nothing, as in a long GC."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, as a crash: no clean shutdown of sessions or connections."""
        process, self.process, self.running_port = self.process, None, None
        if process is not None:
            process.kill()
            process.wait(10)

    def _signal(self, signum: int) -> None:
        if self.process is None:
            raise MetadataStoreError(f"ZooKeeper in {self.workdir} is not running")
        self.process.send_signal(signum)

    def stop(self) -> None:
        process, self.process, self.running_port = self.process, None, None
        if process is None:
            return
        process.send_signal(signal.SIGCONT)  # a paused JVM would not act on SIGTERM
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def restart(self, port: int | None = None) -> None:
        self.stop()
        self.start(port)
