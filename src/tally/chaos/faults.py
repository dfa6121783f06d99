"""Carrying out the planned faults (core/chaos/schedule.py) on the run's processes, proxies
and files, each start and end recorded in the history; and the watch that restarts a
process that died by itself (a bookie that lost its session while paused, a crash), which
is recorded too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import subprocess
import time
from collections import Counter
from pathlib import Path

from tally.bookie.entry_log import FILE_HEADER_SIZE
from tally.chaos.cluster import ChaosBookie, ChaosCluster, Process
from tally.chaos.disks import FILLER, Disk, fail_read_only, fill
from tally.chaos.history_file import HistoryFile
from tally.chaos.proxy import Cut, Delay, Partition, Reset, Stall
from tally.chaos.workload import Writers
from tally.core.chaos.history import Fault
from tally.core.chaos.schedule import AUTORECOVERY, ZOOKEEPER_FAULTS, FaultKind, PlannedFault
from tally.local.services import tally_command
from tally.metadata.zk_ensemble import ZooKeeperEnsemble

log = logging.getLogger(__name__)

WATCH_INTERVAL = 1.0
LEFT_ON_A_FULL_DISK = 64 << 10
COOKIE_UPDATE_TIMEOUT = 60.0
"""How long the repair of a failed disk tries the cookie update: a bookie killed at its stop
stays registered on ZooKeeper until its session times out."""


class FaultInjector:
    def __init__(
        self,
        cluster: ChaosCluster,
        writers: Writers,
        history: HistoryFile,
        seed: int,
        ensemble: ZooKeeperEnsemble | None = None,
    ) -> None:
        self.cluster = cluster
        self.ensemble = ensemble
        self._zookeeper_member: int | None = None
        """The member a ZooKeeper fault holds down now."""
        self.writers = writers
        self.history = history
        self.rng = random.Random(f"flips/{seed}")
        self.injected: Counter[str] = Counter()
        self.crashes: Counter[str] = Counter()
        self._down: set[str] = set()
        """Processes a fault keeps down on purpose: the watch leaves them be."""

    def _record(self, fault: PlannedFault, action: str, detail: str = "") -> None:
        self.history.write(
            Fault(
                t=self.history.now(),
                fault=fault.kind.value,
                target=fault.target,
                action="start" if action == "start" else "end",
                detail=detail or fault.detail,
            )
        )

    async def run(self, planned: list[PlannedFault], stopping: asyncio.Event) -> None:
        """Start and end every fault at its time; end any still on when `stopping` is set."""
        steps = sorted(
            [(fault.start, 0, fault) for fault in planned]
            + [(fault.end, 1, fault) for fault in planned if fault.end > fault.start],
            key=lambda step: (step[0], step[1]),
        )
        started: list[PlannedFault] = []
        try:
            for at, ending, fault in steps:
                delay = at - self.history.now()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stopping.wait(), delay)
                if stopping.is_set():
                    return
                if ending:
                    await self.end(fault)
                    started.remove(fault)
                else:
                    await self.start(fault)
                    if fault.end > fault.start:
                        started.append(fault)
        finally:
            for fault in started:
                await self.end(fault)

    async def start(self, fault: PlannedFault) -> None:
        self.injected[fault.kind.value] += 1
        kind, target = fault.kind, fault.target
        detail = ""
        if kind is FaultKind.KILL_BOOKIE:
            self._down.add(target)
            await self.cluster.bookies[target].process.kill()
        elif kind is FaultKind.PAUSE_BOOKIE:
            self._down.add(target)
            self.cluster.bookies[target].process.pause()
        elif kind is FaultKind.FLIP_BYTES:
            detail = self.flip(self.cluster.bookies[target].data_dir, int(fault.detail))
        elif kind is FaultKind.KILL_AUTORECOVERY:
            self._down.add(AUTORECOVERY)
            await self._autorecovery().kill()
        elif kind is FaultKind.PAUSE_AUTORECOVERY:
            self._autorecovery().pause()
        elif kind is FaultKind.KILL_WRITER:
            await self.writers.kill_and_take_over(target)
        elif kind is FaultKind.PAUSE_WRITER:
            self._process_of_writer(target).pause()
        elif kind in ZOOKEEPER_FAULTS:
            detail = await self._zookeeper_down(kind)
        elif kind is FaultKind.DISK_FULL:
            disk = self._disk(fault)
            await asyncio.to_thread(fill, disk.path, LEFT_ON_A_FULL_DISK)
            detail = f"{fault.detail} filled up"
        elif kind is FaultKind.FAIL_LEDGER_DIR:
            await asyncio.to_thread(fail_read_only, self._disk(fault).path)
            detail = f"{fault.detail} failed (remounted read-only)"
        else:
            self.cluster.bookies[target].proxy.set_fault(_network_fault(fault))
        self._record(fault, "start", detail)

    async def end(self, fault: PlannedFault) -> None:
        kind, target = fault.kind, fault.target
        detail = ""
        if kind is FaultKind.KILL_BOOKIE:
            await self.cluster.bookies[target].process.start()
            self._down.discard(target)
        elif kind is FaultKind.PAUSE_BOOKIE:
            process = self.cluster.bookies[target].process
            process.resume()
            self._down.discard(target)
        elif kind is FaultKind.KILL_AUTORECOVERY:
            await self._autorecovery().start()
            self._down.discard(AUTORECOVERY)
        elif kind is FaultKind.PAUSE_AUTORECOVERY:
            self._autorecovery().resume()
        elif kind is FaultKind.PAUSE_WRITER:
            self._process_of_writer(target).resume()
        elif kind in ZOOKEEPER_FAULTS:
            await self._zookeeper_up(kind)
        elif kind is FaultKind.DISK_FULL:
            (self._disk(fault).path / FILLER).unlink(missing_ok=True)
            detail = f"{fault.detail}: room given back"
        elif kind is FaultKind.FAIL_LEDGER_DIR:
            detail = await self._replace_disk(fault)
        elif kind not in (FaultKind.FLIP_BYTES, FaultKind.KILL_WRITER):
            self.cluster.bookies[target].proxy.clear()
        self._record(fault, "end", detail)

    def _disk(self, fault: PlannedFault) -> Disk:
        disks = self.cluster.bookies[fault.target].disks
        assert disks is not None, "disk faults are planned only for a bookie with disks"
        return disks.by_name[fault.detail]

    async def _replace_disk(self, fault: PlannedFault) -> str:
        """The operator's repair of a failed ledger disk: stop the bookie, put an empty disk
        in its place, update the bookie's cookie, start it; what the update said."""
        bookie = self.cluster.bookies[fault.target]
        self._down.add(fault.target)
        try:
            await bookie.process.stop()
            await asyncio.to_thread(self._disk(fault).replace)
            said = await asyncio.to_thread(self._update_cookie, bookie)
            await bookie.process.start()
        finally:
            self._down.discard(fault.target)
        return said

    def _update_cookie(self, bookie: ChaosBookie) -> str:
        """`tally shell cookie update`, with the bookie's own settings; tried again while
        the bookie still shows as registered (a session that has not expired yet)."""
        command = tally_command(
            "shell",
            "cookie",
            "update",
            bookie.bookie_id,
            "--metadata",
            self.cluster.metadata,
            "--data-dir",
            str(bookie.data_dir),
        )
        environment = {**os.environ, **bookie.process.environment}
        deadline = time.monotonic() + COOKIE_UPDATE_TIMEOUT
        while True:
            done = subprocess.run(
                command, capture_output=True, text=True, env=environment, check=False
            )
            said = (done.stdout + done.stderr).strip()
            if done.returncode == 0 or time.monotonic() > deadline:
                return said
            time.sleep(1.0)

    async def _zookeeper_down(self, kind: FaultKind) -> str:
        """Pause a random member, or kill the leader; which, for the history."""
        ensemble = self.ensemble
        assert ensemble is not None
        if kind is FaultKind.KILL_ZOOKEEPER_LEADER:
            member = await asyncio.to_thread(ensemble.leader)
            if member is None:
                return "no leader now: nothing killed"
            ensemble.kill(member)
        else:
            member = self.rng.randrange(len(ensemble.members))
            ensemble.pause(member)
        self._zookeeper_member = member
        return f"member {member}"

    async def _zookeeper_up(self, kind: FaultKind) -> None:
        ensemble, member = self.ensemble, self._zookeeper_member
        self._zookeeper_member = None
        if ensemble is None or member is None:
            return
        if kind is FaultKind.KILL_ZOOKEEPER_LEADER:
            await asyncio.to_thread(ensemble.restart, member)
        else:
            ensemble.resume(member)

    def _autorecovery(self) -> Process:
        assert self.cluster.autorecovery is not None
        return self.cluster.autorecovery

    def _process_of_writer(self, log_name: str) -> Process:
        process = self.writers.process(log_name)
        assert process is not None
        return process

    def flip(self, data_dir: Path, count: int) -> str:
        """Flip a bit of `count` random bytes of the bookie's entry logs (past their file
        header): bit rot, found by a scrub or a read, repaired from the other copies."""
        logs = sorted(path for path in data_dir.rglob("*.log") if "logs" in path.parts)
        logs = [path for path in logs if path.stat().st_size > FILE_HEADER_SIZE]
        flipped = []
        for _ in range(count if logs else 0):
            path = self.rng.choice(logs)
            try:
                offset = self.rng.randrange(FILE_HEADER_SIZE, path.stat().st_size)
                with path.open("r+b") as file:
                    file.seek(offset)
                    byte = file.read(1)
                    file.seek(offset)
                    file.write(bytes([byte[0] ^ 0x08]))
            except OSError:  # compacted away meanwhile, or on a disk that failed
                continue
            flipped.append(f"{path.name}@{offset}")
        return ", ".join(flipped) or "no entry log yet"

    async def watch(self, stopping: asyncio.Event) -> None:
        """Restart a bookie or the auto-recovery process that died without a fault (a
        bookie paused past its session exits for a restart), and a writer that died."""
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), WATCH_INTERVAL)
            await self.restart_the_dead()

    async def restart_the_dead(self) -> None:
        for bookie_id, bookie in self.cluster.bookies.items():
            if bookie_id not in self._down and not bookie.process.running:
                await self._restart(bookie_id, bookie.process)
        autorecovery = self.cluster.autorecovery
        if autorecovery is not None and AUTORECOVERY not in self._down and not autorecovery.running:
            await self._restart(AUTORECOVERY, autorecovery)
        for name, slot in self.writers.slots.items():
            process = slot.process
            if process is not None and not process.running and not process.stopped:
                self._crashed(name, process)
                await self.writers.start(name)

    async def _restart(self, name: str, process: Process) -> None:
        self._crashed(name, process)
        await process.start()

    def _crashed(self, name: str, process: Process) -> None:
        code = None if process.process is None else process.process.returncode
        self.crashes[name] += 1
        log.warning("chaos: %s exited by itself (status %s): restarting it", name, code)
        self.history.write(
            Fault(
                t=self.history.now(),
                fault="exited",
                target=name,
                action="start",
                detail=f"exit status {code}; see {process.log}",
            )
        )


def _network_fault(fault: PlannedFault) -> Delay | Stall | Cut | Reset | Partition:
    kind = fault.kind
    if kind is FaultKind.NETWORK_DELAY:
        return Delay(float(fault.detail), jitter=float(fault.detail) / 2)
    if kind is FaultKind.NETWORK_STALL:
        return Stall()
    if kind is FaultKind.NETWORK_CUT:
        return Cut()
    if kind is FaultKind.NETWORK_RESET:
        return Reset(float(fault.detail))
    return Partition("to_target" if fault.detail == "to_target" else "to_client")
