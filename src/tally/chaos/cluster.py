"""The chaos run's cluster: bookie processes, each behind a fault proxy, an auto-recovery
process, and the writer processes, all started, killed, paused and restarted by the harness.

Every bookie listens on a port of its own and advertises its proxy's, so every client
(writers, readers, the replication worker) reaches it through the proxy, where network
faults are made. A bookie keeps its ports for the whole run: its id, which its cookie
holds, is its advertised address. Settings are the defaults shortened so that a run of
minutes sees garbage collection, checkpoints, audits and repairs many times.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tally.chaos.disks import Disk
from tally.chaos.proxy import FaultProxy
from tally.core.chaos.schedule import JOURNAL, LEDGER_DISKS
from tally.core.errors import IllegalOperation, Timeout
from tally.local.processes import log_since, signal_group
from tally.local.services import tally_command
from tally.ports import free_ports

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0
BOOKIE_SETTINGS = {
    "TALLY_BOOKIE_GC_WAIT_TIME": "3",
    "TALLY_BOOKIE_FLUSH_INTERVAL": "5",
    "TALLY_BOOKIE_SCRUB_INTERVAL": "0",
    "TALLY_BOOKIE_LIMBO_CHECK_INTERVAL": "3",
    "TALLY_BOOKIE_ENTRY_LOG_SIZE_LIMIT": str(8 * 1024**2),
    "TALLY_BOOKIE_MINOR_COMPACTION_INTERVAL": "20",
    "TALLY_BOOKIE_MAJOR_COMPACTION_INTERVAL": "60",
}
"""A bookie's settings in a chaos run: garbage collection, checkpoints and compaction every
few seconds; scrubbing only when asked (the settle step asks)."""
AUTORECOVERY_SETTINGS = {
    "TALLY_AUTORECOVERY_AUDITOR_PERIODIC_BOOKIE_CHECK_INTERVAL": "5",
    "TALLY_AUTORECOVERY_AUDITOR_DELETION_CHECK_INTERVAL": "3",
    "TALLY_AUTORECOVERY_AUDITOR_REPLICAS_CHECK_INTERVAL": "20",
    "TALLY_AUTORECOVERY_AUDITOR_REPLICAS_CHECK_RETRY_DELAY": "2",
    "TALLY_AUTORECOVERY_UNDER_REPLICATED_POLL_INTERVAL": "1",
    "TALLY_AUTORECOVERY_OPEN_LEDGER_REREPLICATION_GRACE_PERIOD": "5",
    "TALLY_AUTORECOVERY_UNDERREPLICATED_LEDGER_RECOVERY_GRACE_PERIOD": "30",
    "TALLY_AUTORECOVERY_REPLICATION_BACKOFF_INITIAL": "0.5",
    "TALLY_AUTORECOVERY_REPLICATION_BACKOFF_MAX": "5",
}


@dataclass
class Process:
    """One process of the run: how to start it, its log, and the one running now."""

    name: str
    argv: Sequence[str]
    log: Path
    ready_text: str | None
    environment: Mapping[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    stopped: bool = False
    """Stopped on purpose (`stop`), not died."""

    async def start(self) -> None:
        """Start it, and wait (without blocking the loop: the proxies run there) until it
        says it serves."""
        if self.running:
            raise IllegalOperation(f"{self.name} already runs")
        self.log.parent.mkdir(parents=True, exist_ok=True)
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as output:
            self.process = subprocess.Popen(
                self.argv,
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.environment},
                start_new_session=True,
            )
        self.paused = self.stopped = False
        if self.ready_text is not None:
            await self._wait_ready(offset, self.ready_text)

    async def _wait_ready(self, offset: int, ready: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if ready in log_since(self.log, offset):
                return
            if not self.running:
                raise IllegalOperation(f"{self.name} exited at start: see {self.log}")
            await asyncio.sleep(0.1)
        raise Timeout(f"{self.name} not ready within {START_TIMEOUT:.0f} s: see {self.log}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            signal_group(self.process.pid, signum)

    async def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.process is not None:
            await asyncio.to_thread(self.process.wait)
        self.paused = False

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    async def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if it outlives STOP_TIMEOUT; its exit status."""
        process = self.process
        if process is None:
            return None
        self.stopped = True
        self.resume()
        self.signal(signal.SIGTERM)
        try:
            return await asyncio.to_thread(process.wait, STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            await self.kill()
            return process.returncode


DISK_SIZE = 128 << 20
"""Each disk of the at-rest bookie: room for a run's data several times over (a ledger disk
holds some tens of MiB after ten minutes), small enough to fill in a moment."""


@dataclass(frozen=True)
class BookieDisks:
    """The at-rest bookie's disks, each a small file system of its own so that one fills
    up or fails alone: its journal's, and two ledger disks."""

    by_name: dict[str, Disk]

    @classmethod
    def under(cls, root: Path) -> BookieDisks:
        return cls({name: Disk(root / name, DISK_SIZE) for name in (JOURNAL, *LEDGER_DISKS)})

    def mount(self) -> None:
        """Make and mount them all, or none (FilesystemRefused: not root, say)."""
        try:
            for disk in self.by_name.values():
                disk.mount()
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        for disk in self.by_name.values():
            disk.remove()

    def unmount(self) -> None:
        """At the end of the run: their images stay, with the run's data (`clean` goes)."""
        for disk in self.by_name.values():
            disk.unmount()

    def settings(self) -> dict[str, str]:
        """The bookie's settings that put its journal and ledgers on them, with journal files
        that a small disk holds several of (a file is let go once the next is written)."""
        ledgers = ",".join(str(self.by_name[name].path) for name in LEDGER_DISKS)
        return {
            "TALLY_BOOKIE_JOURNAL_DIR": str(self.by_name[JOURNAL].path),
            "TALLY_BOOKIE_LEDGER_DIRS": ledgers,
            "TALLY_BOOKIE_JOURNAL_FILE_SIZE": str(DISK_SIZE // 8),
        }


@dataclass
class ChaosBookie:
    process: Process
    proxy: FaultProxy
    data_dir: Path
    metrics_port: int
    disks: BookieDisks | None = None

    @property
    def bookie_id(self) -> str:
        return f"{HOST}:{self.proxy.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}"


@dataclass
class ChaosCluster:
    """Its processes, by name; started by `start`, all stopped by `shutdown`."""

    root: Path
    """The bookies' data."""
    metadata: str
    logs: Path
    """Every process's log: kept when `root` is cleaned after a run that passed."""
    bookies: dict[str, ChaosBookie] = field(default_factory=dict)
    autorecovery: Process | None = None

    async def add_bookie(self, index: int) -> ChaosBookie:
        listen, metrics_port = free_ports(2)
        proxy = await FaultProxy.start(HOST, listen)
        data_dir = self.root / f"bookie-{index}"
        advertised = f"{HOST}:{proxy.port}"
        process = Process(
            name=f"bookie-{index}",
            argv=tally_command(
                "bookie",
                "--metadata",
                self.metadata,
                "--data-dir",
                str(data_dir),
                "--listen",
                f"{HOST}:{listen}",
                "--advertised-address",
                advertised,
                "--metrics-port",
                str(metrics_port),
            ),
            log=self.logs / f"bookie-{index}.log",
            ready_text=f"bookie {advertised} ready on ",
            environment=BOOKIE_SETTINGS,
        )
        bookie = ChaosBookie(process, proxy, data_dir, metrics_port)
        self.bookies[bookie.bookie_id] = bookie
        return bookie

    async def start_autorecovery(self) -> None:
        self.autorecovery = Process(
            name="autorecovery",
            argv=tally_command("autorecovery", "--metadata", self.metadata, "--id", "chaos"),
            log=self.logs / "autorecovery.log",
            ready_text="autorecovery chaos ready",
            environment=AUTORECOVERY_SETTINGS,
        )
        await self.autorecovery.start()

    def give_disks(self, bookie_id: str) -> None:
        """Put the bookie's journal and ledgers on disks of their own, before it first
        starts; FilesystemRefused if they cannot be mounted."""
        bookie = self.bookies[bookie_id]
        disks = BookieDisks.under(bookie.data_dir / "disks")
        disks.mount()
        bookie.disks = disks
        bookie.process.environment = {**bookie.process.environment, **disks.settings()}

    def processes(self) -> list[Process]:
        found = [bookie.process for bookie in self.bookies.values()]
        return found + ([self.autorecovery] if self.autorecovery is not None else [])

    async def shutdown(self) -> None:
        for process in self.processes():
            await process.stop()
        for bookie in self.bookies.values():
            await bookie.proxy.close()
            if bookie.disks is not None:
                bookie.disks.unmount()
