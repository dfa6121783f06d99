"""One chaos run (issue 19): a local cluster, the workload, the faults from the seed, then
settling, the final reads and the checker's verdict, all under one output directory.

    out/history.jsonl     the run's history (core/chaos/history.py)
    out/writers/          each writer process's own history, merged into it
    out/logs/             every process's log
    out/cluster/          the bookies' data and the metadata store
    out/audit/            the Spark audit of the settled cluster
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from tally.chaos.cluster import ChaosCluster
from tally.chaos.disks import FilesystemRefused
from tally.chaos.faults import FaultInjector
from tally.chaos.history_file import HistoryFile
from tally.chaos.report import SAMPLES
from tally.chaos.settle import judge, look, read_back, settle
from tally.chaos.workload import HistoryCollector, Logs, Readers, Writers
from tally.client.client import Client
from tally.client.config import ClientConfig
from tally.core.chaos.history import End, Run
from tally.core.chaos.schedule import PlannedFault, at_rest_bookie, plan_faults
from tally.core.deletion import ClusterSettings
from tally.core.errors import BadRequest, TallyError
from tally.metadata.cluster import init_cluster
from tally.metadata.cluster_settings import write_settings
from tally.metadata.stores import open_store
from tally.metadata.underreplication import UnderReplicationManager
from tally.metadata.zk_ensemble import ZooKeeperEnsemble

HISTORY = "history.jsonl"
METADATA_STORES = ("sqlite", "zk")
SAMPLE_INTERVAL = 2.0
CLIENT = ClientConfig(add_entry_timeout=3.0, read_timeout=3.0)
Say = Callable[[str], None]


@dataclass(frozen=True)
class ChaosSettings:
    duration: float
    seed: int
    out: Path
    metadata: str = "sqlite"
    bookies: int = 5
    writers: int = 3
    rate: float = 50.0
    """Adds per second each writer offers."""
    max_bookies_down: int = 1
    settle_timeout: float = 300.0
    audit: bool = True
    disk_faults: bool | None = None
    """Fill and fail disks of one bookie (they need root, to mount them); None: if this
    process may."""


@dataclass(frozen=True)
class ChaosOutcome:
    history: Path
    planned: list[PlannedFault]
    acknowledged: int
    settled: bool


async def run_chaos(settings: ChaosSettings, say: Say) -> ChaosOutcome:
    if settings.metadata not in METADATA_STORES:
        raise BadRequest(
            f"--metadata {settings.metadata}: give one of {', '.join(METADATA_STORES)}"
        )
    out = settings.out
    if (out / HISTORY).exists():
        raise BadRequest(f"{out} holds a run already: give another --out, or remove it")
    (out / "cluster").mkdir(parents=True, exist_ok=True)
    ensemble = None
    if settings.metadata == "zk":
        say("starting a 3-member ZooKeeper ensemble")
        ensemble = ZooKeeperEnsemble(out / "cluster" / "zookeeper")
        await asyncio.to_thread(ensemble.start)
        uri = ensemble.uri("/tally-chaos")
    else:
        uri = f"sqlite:///{(out / 'cluster' / 'metadata.db').resolve()}"
    try:
        return await _run(settings, uri, ensemble, say)
    finally:
        if ensemble is not None:
            await asyncio.to_thread(ensemble.stop)


async def _run(
    settings: ChaosSettings, uri: str, ensemble: ZooKeeperEnsemble | None, say: Say
) -> ChaosOutcome:
    out = settings.out
    async with open_store(uri) as store:
        await init_cluster(store)
        await write_settings(store, ClusterSettings(ledger_delete_retention=0))

    epoch = time.time()
    history = HistoryFile(out / HISTORY, epoch)
    cluster = ChaosCluster(out / "cluster", uri, out / "logs")
    logs = Logs()
    collector = HistoryCollector(history, logs)
    writers = Writers(out, uri, settings.seed, epoch, settings.rate, collector, logs)
    names = [f"log-{n}" for n in range(settings.writers)]
    try:
        say(f"starting {settings.bookies} bookies behind fault proxies, and auto-recovery")
        for index in range(settings.bookies):
            await cluster.add_bookie(index)
        planned = plan_faults(
            settings.seed,
            settings.duration,
            sorted(cluster.bookies),
            names,
            max_bookies_down=settings.max_bookies_down,
            zookeeper=ensemble is not None,
            disks=_give_disks(settings, cluster, say),
        )
        await asyncio.gather(*(b.process.start() for b in cluster.bookies.values()))
        await cluster.start_autorecovery()
        history.write(
            Run(
                t=history.now(),
                seed=settings.seed,
                metadata=settings.metadata,
                duration=settings.duration,
                bookies=tuple(sorted(cluster.bookies)),
                wall_ms=int(epoch * 1000),
            )
        )
        say(f"{len(planned)} faults planned over {settings.duration:.0f} s (seed {settings.seed})")
        async with Client(uri, config=CLIENT) as client, _sampling(client, history, out):
            injector = FaultInjector(cluster, writers, history, settings.seed, ensemble)
            await _workload(
                settings, client, writers, collector, history, logs, injector, planned, names, say
            )
            say("faults over; settling")
            settling = await settle(client, cluster, history, settings.settle_timeout)
            say(f"settled: {settling.settled} ({settling.detail.get('seconds')} s)")
            deleted = sorted(ledger for state in logs.by_name.values() for ledger in state.deleted)
            await judge(client, cluster, history, settling, deleted, out, settings.audit, uri)
            every = [ledger for state in logs.by_name.values() for ledger in state.ledgers]
            say(f"reading back {len(every)} ledgers")
            await read_back(client, history, every)
            history.write(
                End(
                    t=history.now(),
                    operations=history.events,
                    acknowledged=logs.acknowledged,
                    faults=sum(injector.injected.values()),
                )
            )
            still = await look(client, cluster)
        return ChaosOutcome(out / HISTORY, planned, logs.acknowledged, still.settled)
    finally:
        history.close()
        await cluster.shutdown()
        for slot in writers.slots.values():
            if slot.process is not None:
                await slot.process.kill()


def _give_disks(settings: ChaosSettings, cluster: ChaosCluster, say: Say) -> bool:
    """Whether the at-rest bookie has disks of its own to fill and fail."""
    bookie = at_rest_bookie(settings.seed, sorted(cluster.bookies))
    if settings.disk_faults is False or bookie is None:
        return False
    try:
        cluster.give_disks(bookie)
    except FilesystemRefused as refused:
        if settings.disk_faults:
            raise BadRequest(
                f"--disk-faults: the disks cannot be made ({refused}): run as root, with loop "
                "devices, or give --no-disk-faults"
            ) from None
        say(f"disk faults off: the disks need root and loop devices ({refused})")
        return False
    say(f"bookie {bookie}: its journal and two ledger directories on small disks, to fill and fail")
    return True


async def _workload(
    settings: ChaosSettings,
    client: Client,
    writers: Writers,
    collector: HistoryCollector,
    history: HistoryFile,
    logs: Logs,
    injector: FaultInjector,
    planned: list[PlannedFault],
    names: list[str],
    say: Say,
) -> None:
    """Writers, readers, retention and faults for the run's duration; then every fault
    ended, every process up, and the writers stopped (their ledgers closed)."""
    stopping, collected = asyncio.Event(), asyncio.Event()
    collecting = asyncio.create_task(collector.run(collected))
    for name in names:
        await writers.start(name)
    readers = Readers(client, history, logs, settings.seed, stopping)
    tasks = [asyncio.ensure_future(task) for task in readers.tasks(names)]
    tasks.append(asyncio.ensure_future(injector.run(planned, stopping)))
    tasks.append(asyncio.ensure_future(injector.watch(stopping)))
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), settings.duration)
    except asyncio.CancelledError:
        # Stopped (SIGTERM, Ctrl-C): the faults still on end first (a failed disk is
        # replaced, a paused process resumed), before the cluster is shut down.
        stopping.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        collecting.cancel()
        raise
    stopping.set()
    await asyncio.gather(*tasks)
    await injector.restart_the_dead()
    await writers.stop_all()
    collected.set()
    await collecting
    say(
        f"workload done: {logs.acknowledged:,} adds acknowledged, {logs.failed_adds:,} failed, "
        f"{readers.reads:,} entries read, faults {dict(injector.injected)}"
    )


@contextlib.asynccontextmanager
async def _sampling(client: Client, history: HistoryFile, out: Path) -> AsyncIterator[None]:
    """Sample the ledgers marked under-replicated every SAMPLE_INTERVAL, for the report."""
    stopping = asyncio.Event()

    async def sample() -> None:
        marks = UnderReplicationManager(client.context.ledgers.store)
        with (out / SAMPLES).open("a", encoding="utf-8") as samples:
            while not stopping.is_set():
                try:
                    count = sum([1 async for _ in marks.list_under_replicated()])
                except TallyError:
                    count = -1  # the store did not answer: a gap in the line
                if count >= 0:
                    samples.write(
                        json.dumps({"t": history.now(), "under_replicated": count}) + "\n"
                    )
                    samples.flush()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), SAMPLE_INTERVAL)

    task = asyncio.create_task(sample())
    try:
        yield
    finally:
        stopping.set()
        await task


def clean(out: Path) -> None:
    """Remove a passed run's cluster data (its history, logs and report stay)."""
    shutil.rmtree(out / "cluster", ignore_errors=True)
