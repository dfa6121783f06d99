"""The chaos run's workload: writer processes keeping segmented logs, readers tailing them
and reading closed ledgers, and a retention task deleting old ledgers through the delete
path; and the history they make together.

Writers are processes of their own (tally.chaos.writer), so that a fault can SIGKILL or
SIGSTOP them; each appends to its own history file, which `HistoryCollector` tails into
the run's history and into what the readers and the retention task follow (`Logs`). The
readers and the retention task run in the harness, on one client, behind the same proxies
as everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from tally.chaos.cluster import Process
from tally.chaos.history_file import HistoryFile
from tally.chaos.writer import PASSWORD
from tally.client.client import Client
from tally.client.reader import LedgerReader
from tally.core.chaos.history import (
    Added,
    Deleted,
    Ended,
    Event,
    LedgerOpened,
    Read,
    content_digest,
    decode_event,
)
from tally.core.errors import LedgerDeleted, NoSuchLedger, TallyError

log = logging.getLogger(__name__)

COLLECT_INTERVAL = 0.2
READ_INTERVAL = 0.3
READ_BATCH = 200
"""Entries a tailing reader reads at once."""
RETENTION_INTERVAL = 4.0
KEEP_LEDGERS = 3
"""Closed ledgers each log keeps; older ones are deleted."""


@dataclass
class LogState:
    """What the run knows of one segmented log, from the history."""

    ledgers: list[str] = field(default_factory=list)
    ended: set[str] = field(default_factory=set)
    """Closed or recovered (their end is known)."""
    deleted: set[str] = field(default_factory=set)

    @property
    def open_ledger(self) -> str | None:
        """The log's last ledger, if it has not ended: what a takeover must recover."""
        if self.ledgers and self.ledgers[-1] not in self.ended:
            return self.ledgers[-1]
        return None


@dataclass
class Logs:
    by_name: dict[str, LogState] = field(default_factory=dict)
    acknowledged: int = 0
    failed_adds: int = 0

    def observe(self, event: Event) -> None:
        if isinstance(event, LedgerOpened):
            self.by_name.setdefault(event.log, LogState()).ledgers.append(event.ledger)
        elif isinstance(event, Ended) and event.outcome == "ok":
            self.by_name.setdefault(event.log, LogState()).ended.add(event.ledger)
        elif isinstance(event, Deleted) and event.outcome == "ok":
            self.by_name.setdefault(event.log, LogState()).deleted.add(event.ledger)
        elif isinstance(event, Added):
            if event.outcome == "ok":
                self.acknowledged += 1
            else:
                self.failed_adds += 1


@dataclass
class WriterSlot:
    """One log's writer: the process writing it now, and its generation (a takeover's
    process is the next one)."""

    log: str
    generation: int = 0
    process: Process | None = None
    history: Path | None = None
    offset: int = 0


class HistoryCollector:
    """Tails every writer's history file into the run's history and `Logs`."""

    def __init__(self, history: HistoryFile, logs: Logs) -> None:
        self.history = history
        self.logs = logs
        self.files: dict[Path, int] = {}

    def follow(self, path: Path) -> None:
        self.files.setdefault(path, 0)

    def collect(self) -> None:
        for path, offset in list(self.files.items()):
            if not path.exists():
                continue
            with path.open("rb") as source:
                source.seek(offset)
                chunk = source.read()
            complete = chunk.rfind(b"\n") + 1  # a line being written waits for its end
            for line in chunk[:complete].decode().splitlines():
                if line.strip():
                    self.logs.observe(decode_event(line, str(path)))
                    self.history.write_line(line)
            self.files[path] = offset + complete

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            self.collect()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), COLLECT_INTERVAL)
        self.collect()


class Writers:
    """The writer processes, one per log; started, killed and taken over by the harness."""

    def __init__(
        self,
        root: Path,
        metadata: str,
        seed: int,
        epoch: float,
        rate: float,
        collector: HistoryCollector,
        logs: Logs,
    ):
        self.root = root
        self.metadata = metadata
        self.seed = seed
        self.epoch = epoch
        self.rate = rate
        self.collector = collector
        self.logs = logs
        self.slots: dict[str, WriterSlot] = {}

    async def start(self, log_name: str) -> None:
        """A new writer for the log; it takes the log over if its last ledger is open."""
        self.collector.collect()
        slot = self.slots.setdefault(log_name, WriterSlot(log_name))
        slot.generation += 1
        slot.history = self.root / "writers" / f"{log_name}.{slot.generation}.jsonl"
        slot.history.parent.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "tally.chaos.writer",
            "--metadata", self.metadata,
            "--log", log_name,
            "--seed", str(self.seed),
            "--history", str(slot.history),
            "--epoch", repr(self.epoch),
            "--rate", str(self.rate),
        ]  # fmt: skip
        takeover = self.logs.by_name.get(log_name, LogState()).open_ledger
        if takeover is not None:
            argv += ["--takeover", takeover]
        slot.process = Process(
            name=f"writer-{log_name}.{slot.generation}",
            argv=argv,
            log=self.root / "logs" / f"writer-{log_name}.log",
            ready_text=None,
        )
        self.collector.follow(slot.history)
        await slot.process.start()

    async def kill_and_take_over(self, log_name: str) -> None:
        slot = self.slots[log_name]
        if slot.process is not None:
            slot.process.stopped = True  # on purpose: the watch must not start a second one
            await slot.process.kill()
        await self.start(log_name)

    def process(self, log_name: str) -> Process | None:
        return self.slots[log_name].process

    async def stop_all(self) -> None:
        """SIGTERM every writer: each closes its ledger and exits."""
        await asyncio.gather(
            *(slot.process.stop() for slot in self.slots.values() if slot.process is not None)
        )
        self.collector.collect()


class Readers:
    """Tailing readers (one per log), a reader of closed ledgers, and the retention task."""

    def __init__(
        self, client: Client, history: HistoryFile, logs: Logs, seed: int, stopping: asyncio.Event
    ):
        self.client = client
        self.history = history
        self.logs = logs
        self.rng = random.Random(f"readers/{seed}")
        self.stopping = stopping
        self.reads = 0

    def tasks(self, log_names: list[str]) -> list[Awaitable[None]]:
        return [
            *(self.tail(name) for name in log_names),
            self.closed_reader(),
            self.retention(),
        ]

    async def _every(self, interval: float, step: Callable[[], Awaitable[None]]) -> None:
        while not self.stopping.is_set():
            try:
                await step()
            except TallyError as error:
                log.info("chaos workload: %s", error)  # faults make reads fail: go on
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), interval)

    async def tail(self, log_name: str) -> None:
        """Follow the log: read each ledger's entries up to its LAC as they come, then on
        to the next ledger once it has ended."""
        position = {"index": 0, "next": 0}

        async def step() -> None:
            state = self.logs.by_name.get(log_name, LogState())
            if position["index"] >= len(state.ledgers):
                return
            ledger = state.ledgers[position["index"]]
            if ledger in state.deleted:
                position.update(index=position["index"] + 1, next=0)
                return
            try:
                reader = await self.client.open_ledger(ledger, password=PASSWORD, recovery=False)
            except (NoSuchLedger, LedgerDeleted):
                position.update(index=position["index"] + 1, next=0)
                return
            last = reader.last_add_confirmed
            first = position["next"]
            if first <= last:
                last = min(last, first + READ_BATCH - 1)
                await self._read(f"reader:{log_name}", reader, ledger, first, last)
                position["next"] = last + 1
            elif reader.is_closed:
                position.update(index=position["index"] + 1, next=0)

        await self._every(READ_INTERVAL, step)

    async def closed_reader(self) -> None:
        """Read a random ended ledger whole, now and then."""

        async def step() -> None:
            ended = sorted(
                ledger
                for state in self.logs.by_name.values()
                for ledger in state.ended - state.deleted
            )
            if not ended:
                return
            ledger = self.rng.choice(ended)
            try:
                reader = await self.client.open_ledger(ledger, password=PASSWORD, recovery=False)
            except (NoSuchLedger, LedgerDeleted):
                return
            if reader.is_closed and reader.last_entry_id >= 0:
                await self._read("reader:closed", reader, ledger, 0, reader.last_entry_id)

        await self._every(1.0, step)

    async def _read(
        self, actor: str, reader: LedgerReader, ledger: str, first: int, last: int
    ) -> None:
        digests = tuple([content_digest(entry.data) async for entry in reader.read(first, last)])
        self.reads += len(digests)
        now = self.history.now()
        self.history.write(Read(t=now, actor=actor, ledger=ledger, first=first, digests=digests))

    async def retention(self) -> None:
        """Delete each log's ended ledgers beyond the newest KEEP_LEDGERS."""

        async def step() -> None:
            for name, state in sorted(self.logs.by_name.items()):
                ended = [
                    ledger
                    for ledger in state.ledgers
                    if ledger in state.ended and ledger not in state.deleted
                ]
                for ledger in ended[:-KEEP_LEDGERS]:
                    await self._delete(name, ledger)

        await self._every(RETENTION_INTERVAL, step)

    async def _delete(self, log_name: str, ledger: str) -> None:
        started = self.history.now()
        try:
            await self.client.delete_ledger(ledger, reason="chaos retention")
        except TallyError as error:
            event = Deleted(
                t=self.history.now(), t_start=started, actor="retention", log=log_name,
                ledger=ledger, outcome="failed", error=str(error),
            )  # fmt: skip
        else:
            event = Deleted(
                t=self.history.now(), t_start=started, actor="retention", log=log_name,
                ledger=ledger, outcome="ok",
            )  # fmt: skip
        self.logs.observe(event)
        self.history.write(event)
