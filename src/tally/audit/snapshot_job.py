"""`tally audit snapshot --master M`: the snapshot as a Spark job, for clusters one process
walks too slowly.

The driver reads only what is small: the cluster record, its settings, the registry, and
the top levels of the ledger trees, which it splits into subtrees (ranges of ids, the same in
the metadata, the under-replication marks and the tombstones). Spark tasks then export each
range with their own metadata session, and, in a second job started once every range is
done (the metadata goes first, as in one process: a dump can then only show more than the
metadata knows), dump each registered bookie. Every task writes its own Parquet part
straight into the snapshot directory and returns counts, so the driver never holds a row.
A bookie that does not answer within the timeout is recorded as not responding by its task,
which does not fail (Spark does not retry it); an executor lost midway reruns its task,
which writes the same part again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pyspark import RDD, SparkContext
from pyspark.sql import SparkSession

from tally.audit import schema
from tally.audit.config import AuditConfig
from tally.audit.snapshot import (
    BookieDump,
    MetadataPart,
    Progress,
    Registered,
    dump_bookie,
    export_metadata_range,
    finish_snapshot,
    prepare_output,
    registered_bookies,
)
from tally.metadata.cluster import require_cluster
from tally.metadata.cluster_settings import read_settings
from tally.metadata.ledger_tree import Subtree, split
from tally.metadata.paths import LEDGER_METADATA, TOMBSTONE_RECORDS, UNDER_REPLICATION_MARKS
from tally.metadata.stores import open_store

log = logging.getLogger(__name__)

RANGES_PER_CORE = 4
"""Ranges of ledger ids per core of the cluster: enough that a range of many ledgers does
not hold up the end of the job."""
TREES = (LEDGER_METADATA, UNDER_REPLICATION_MARKS, TOMBSTONE_RECORDS)
T = TypeVar("T")


def take_snapshot_on_spark(
    spark: SparkSession,
    metadata_uri: str,
    out: Path,
    *,
    config: AuditConfig | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Export the cluster at `metadata_uri` into `out` with Spark tasks; returns
    snapshot.json's content. `out` and the metadata store must be reachable from every
    executor at the same path and address."""
    config = config or AuditConfig()
    prepare_output(out, schema.SNAPSHOT_PARTS)
    created_ms = int(time.time() * 1000)
    context = spark.sparkContext
    instance_id, settings, ranges, strays = asyncio.run(
        _plan(metadata_uri, config, RANGES_PER_CORE * context.defaultParallelism)
    )
    export = functools.partial(_export_range, metadata_uri, str(out), config)
    parts = _collect(context, ranges, export, "ledger ranges", progress)
    found = sum(parts, strays)
    registered = asyncio.run(_registered(metadata_uri, config))
    dump = functools.partial(_dump, registered, str(out), config)
    dumps = _collect(context, registered.bookies, dump, "bookies dumped", progress)
    return finish_snapshot(
        out,
        metadata_uri=metadata_uri,
        instance_id=instance_id,
        created_ms=created_ms,
        settings=settings,
        found=found,
        registered=registered,
        dumps=dumps,
    )


async def _plan(
    metadata_uri: str, config: AuditConfig, wanted: int
) -> tuple[str, dict[str, Any], list[Subtree], MetadataPart]:
    """The cluster's instance id and settings, the ranges, and the stray keys met splitting
    (as unreadable ledgers and tombstones: keys of those trees that name no ledger)."""
    async with open_store(metadata_uri, session_timeout=config.snapshot_session_timeout) as store:
        cluster = await require_cluster(store, uri=metadata_uri)
        settings = await read_settings(store)
        ranges, strays = await split(store, TREES, wanted)
    for tree, path in strays:
        log.error("snapshot: %s is in the tree %s but names no ledger", path, tree.root)
    unreadable = MetadataPart(
        unreadable_ledgers=sum(tree is LEDGER_METADATA for tree, _ in strays),
        unreadable_tombstones=sum(tree is TOMBSTONE_RECORDS for tree, _ in strays),
    )
    return cluster.instance_id, settings.to_dict(), ranges, unreadable


async def _registered(metadata_uri: str, config: AuditConfig) -> Registered:
    async with open_store(metadata_uri, session_timeout=config.snapshot_session_timeout) as store:
        return await registered_bookies(store)


def _export_range(
    metadata_uri: str, out: str, config: AuditConfig, item: tuple[int, Subtree]
) -> MetadataPart:
    """A task: one range's marks, ledgers, segments and tombstones, as part `number`."""
    number, within = item

    async def run() -> MetadataPart:
        timeout = config.snapshot_session_timeout
        async with open_store(metadata_uri, session_timeout=timeout) as store:
            return await export_metadata_range(store, Path(out), number, within, _quiet)

    return asyncio.run(run())


def _dump(
    registered: Registered, out: str, config: AuditConfig, item: tuple[int, str]
) -> BookieDump:
    """A task: one bookie's availability dump, as part `number`."""
    number, bookie = item
    return asyncio.run(dump_bookie(registered, bookie, Path(out), number, config, _quiet))


def _quiet(stage: str, done: int, total: int | None) -> None:
    """A task's progress is Spark's to show (the driver polls its stages)."""


def _collect(
    context: SparkContext,
    items: list[T],
    task: Callable[[tuple[int, T]], Any],
    stage: str,
    progress: Progress | None,
) -> list[Any]:
    """`task` run on each numbered item, one Spark task per item; the results, in order."""
    if not items:
        return []
    rdd: RDD[tuple[int, T]] = context.parallelize(list(enumerate(items)), len(items))
    if progress is None:
        return rdd.map(task).collect()
    done = threading.Event()
    watcher = threading.Thread(
        target=_watch_tasks, args=(context, stage, len(items), progress, done), daemon=True
    )
    watcher.start()
    try:
        return rdd.map(task).collect()
    finally:
        done.set()
        watcher.join()
        progress(stage, len(items), len(items))


def _watch_tasks(
    context: SparkContext, stage: str, total: int, progress: Progress, done: threading.Event
) -> None:
    """Report the tasks completed by the running stages until `done`."""
    tracker = context.statusTracker()
    while not done.wait(0.5):
        finished = 0
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                finished += info.numCompletedTasks
        progress(stage, min(finished, total), total)
