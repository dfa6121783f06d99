"""`take_snapshot` against real bookie processes: every ledger (DELETED ones too), segment,
tombstone, bookie and copy is exported as the metadata and the bookies have it, with the
cluster settings; a bookie that cannot be reached, answers nothing, or breaks off its dump
midway is recorded as not responding, with no partial rows."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

import tally
from tally.audit import schema, snapshot
from tally.audit.config import AuditConfig
from tally.audit.snapshot import take_snapshot
from tally.audit.snapshot_job import take_snapshot_on_spark
from tally.client.bookie_connection import BookieConnection
from tally.core.availability import EntryAvailability
from tally.core.deletion import ClusterSettings
from tally.core.errors import BadRequest
from tally.core.ids import LedgerId
from tally.core.protocol import (
    AvailabilityDumpEncoder,
    AvailabilityDumpRequest,
    LedgerAvailability,
    RequestReader,
)
from tally.core.schedule import expected_entries
from tally.metadata.bookie_registry import BookieInfo, BookiePlacement, BookieRegistry
from tally.metadata.cluster import read_cluster
from tally.metadata.cluster_settings import read_settings, write_settings
from tally.metadata.paths import LEDGER_METADATA, TOMBSTONE_RECORDS
from tally.metadata.stores import open_store
from tally.metadata.tombstones import tombstone_pages
from tally.metadata.underreplication import UnderReplicationManager
from tests.support.cluster import Cluster, eventually_writable, running_cluster, store_session
from tests.support.processes import environment, free_port
from tests.support.processes import tally as run_tally

BOOKIES = 3
CONFIG = tally.ClientConfig(explicit_lac_interval=0)
MARKED_MS = 1_234_567
SETTINGS = ClusterSettings(ledger_delete_retention=0, deletion_stuck_after=1234)
"""The cluster's settings once the test's ledgers are deleted."""
NO_GC = {"TALLY_BOOKIE_GC_WAIT_TIME": "86400"}
"""No garbage collection while the module runs: a tombstoned ledger's data stays."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with environment(NO_GC), running_cluster(tmp_path_factory.mktemp("snapshot"), BOOKIES) as c:
        yield c


@pytest.fixture(scope="module")
def written(cluster: Cluster) -> dict[LedgerId, int]:
    """Ledgers of several shapes, all closed but the last, with the entries written to each;
    one of them archived and DELETED (within its retention), and one more deleted past its
    retention: a tombstone, which its bookies have not acted on."""
    return asyncio.run(_write(cluster))


async def _write(cluster: Cluster) -> dict[LedgerId, int]:
    written: dict[LedgerId, int] = {}
    async with tally.Client(cluster.uri, config=CONFIG) as client:
        for quorums, entries, scope in (
            ((3, 2, 2), 40, None),
            ((3, 3, 2), 7, None),
            ((3, 2, 1), 1, 2**63 + 5),  # a 128-bit id whose scope has the sign bit
            ((2, 2, 2), 0, None),  # closed empty
        ):
            e, wq, aq = quorums
            writer = await client.create_ledger(
                ensemble_size=e, write_quorum=wq, ack_quorum=aq, scope=scope
            )
            for i in range(entries):
                await writer.append(b"entry %d" % i)
            await writer.close()
            written[writer.ledger_id] = entries
        store = client.context.ledgers.store
        for retention in (SETTINGS.ledger_delete_retention + 3600, 0):
            await write_settings(store, ClusterSettings(ledger_delete_retention=retention))
            writer = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
            for i in range(6):
                await writer.append(b"deleted %d" % i)
            await writer.close()
            if retention:
                written[writer.ledger_id] = 6
                await client.set_archived(writer.ledger_id)
            await client.delete_ledger(writer.ledger_id, reason="trimmed")
        await write_settings(store, SETTINGS)
        still_open = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        for i in range(5):
            await still_open.append(b"open %d" % i)
        written[still_open.ledger_id] = 5
        marks = UnderReplicationManager(client.context.ledgers.store)
        first = next(iter(written))
        await marks.mark_under_replicated(first, ["somewhere"], now_ms=MARKED_MS)
        await client.context.registry.set_placement(
            cluster.bookies[0].address, BookiePlacement("/rack-a", "/zone-1")
        )
    return written


def _rows(out: Path, name: str) -> list[dict[str, Any]]:
    return pq.read_table(out / name).to_pylist()


def _by_ledger(rows: list[dict[str, Any]]) -> dict[LedgerId, list[dict[str, Any]]]:
    found: dict[LedgerId, list[dict[str, Any]]] = {}
    for row in rows:
        ledger = LedgerId(schema.from_int64(row["scope"]), schema.from_int64(row["ledger_id"]))
        found.setdefault(ledger, []).append(row)
    return found


def test_snapshot_exports_the_cluster_exactly(
    cluster: Cluster, written: dict[LedgerId, int], tmp_path: Path
) -> None:
    out = tmp_path / "snap"
    progress: list[tuple[str, int, int | None]] = []
    summary = asyncio.run(
        take_snapshot(cluster.uri, out, progress=lambda *args: progress.append(args))
    )

    async def records() -> tuple[str, dict[LedgerId, Any], list[Any], ClusterSettings]:
        async with tally.Client(cluster.uri) as client:
            store = client.context.ledgers.store
            info = await read_cluster(store)
            assert info is not None
            found = {
                ledger: (await client.context.ledgers.read_ledger_metadata(ledger)).metadata
                for ledger in written
            }
            tombstones = [
                found async for page in tombstone_pages(store) for found in page.tombstones
            ]
            return info.instance_id, found, tombstones, await read_settings(store)

    instance_id, metadata, tombstones, settings = asyncio.run(records())
    assert json.loads((out / schema.SNAPSHOT_JSON).read_text()) == summary
    assert summary["format_version"] == schema.FORMAT_VERSION
    assert summary["cluster"] == {"metadata": cluster.uri, "instance_id": instance_id}
    assert summary["tool"] == {"name": "tally", "version": tally.__version__}
    assert settings == SETTINGS
    assert summary[schema.CLUSTER_SETTINGS] == SETTINGS.to_dict()
    for name, expected in (
        (schema.LEDGERS, schema.LEDGERS_SCHEMA),
        (schema.SEGMENTS, schema.SEGMENTS_SCHEMA),
        (schema.BOOKIES, schema.BOOKIES_SCHEMA),
        (schema.AVAILABILITY, schema.AVAILABILITY_SCHEMA),
        (schema.TOMBSTONES, schema.TOMBSTONES_SCHEMA),
    ):
        for part in (out / name).glob("*.parquet"):
            assert pq.read_schema(part).remove_metadata() == expected, part

    ledgers = _by_ledger(_rows(out, schema.LEDGERS))
    assert set(ledgers) == set(written)
    assert summary["counts"]["ledgers"] == len(written)
    marked = next(iter(written))
    for ledger, [row] in ledgers.items():
        md = metadata[ledger]
        assert row == {
            "scope": schema.to_int64(ledger.scope),
            "ledger_id": schema.to_int64(ledger.id),
            "state": md.state.name,
            "ensemble_size": md.ensemble_size,
            "write_quorum": md.write_quorum,
            "ack_quorum": md.ack_quorum,
            "last_entry_id": md.last_entry_id,
            "length": md.length,
            "ctime_ms": md.ctime_ms,
            "digest_type": md.digest_type.name,
            "underreplicated_since_ms": MARKED_MS if ledger == marked else None,
            "archived": md.archived,
            "deleted_ms": None if md.deletion is None else md.deletion.time_ms,
            "metadata": md.to_bytes(),
        }
    assert any(row["scope"] < 0 for [row] in ledgers.values())
    [deleted] = [row for [row] in ledgers.values() if row["state"] == "DELETED"]
    assert deleted["archived"]
    assert deleted["deleted_ms"] is not None

    [tombstone] = tombstones
    gone, deletion = tombstone.tombstone, tombstone.tombstone.deletion
    assert deletion.reason == "trimmed"
    assert _rows(out, schema.TOMBSTONES) == [
        {
            "scope": schema.to_int64(tombstone.ledger_id.scope),
            "ledger_id": schema.to_int64(tombstone.ledger_id.id),
            "deleted_ms": deletion.time_ms,
            "reason": deletion.reason,
            "violations": deletion.violations,
            "check_detail": deletion.detail,
            "tombstoned_ms": gone.tombstoned_ms,
            "last_entry_id": 5,
            "length": gone.length,
            "bookies": sorted(gone.bookies),
            "acknowledged_ms": [None] * len(gone.bookies),
        }
    ]
    assert (summary["counts"]["tombstones"], summary["counts"]["unreadable_tombstones"]) == (1, 0)

    segments = _by_ledger(_rows(out, schema.SEGMENTS))
    for ledger, rows in segments.items():
        md = metadata[ledger]
        assert [
            (r["segment_index"], r["first_entry_id"], r["last_entry_id"], r["ensemble"])
            for r in rows
        ] == [
            (i, first, -1 if last is None else last, list(s.ensemble))
            for i, (s, (first, last)) in enumerate(
                zip(md.segments, md.segment_bounds(), strict=True)
            )
        ]

    bookies = {row["bookie_id"]: row for row in _rows(out, schema.BOOKIES)}
    assert bookies == {
        b.address: {
            "bookie_id": b.address,
            "rack": "/rack-a" if b is cluster.bookies[0] else "/default-rack",
            "state": "writable",
            "responded": True,
        }
        for b in cluster.bookies
    }

    availability = _by_ledger(_rows(out, schema.AVAILABILITY))
    for ledger, entries in written.items():
        [segment] = metadata[ledger].segments
        e, wq = metadata[ledger].ensemble_size, metadata[ledger].write_quorum
        expected = {
            bookie: held
            for position, bookie in enumerate(segment.ensemble)
            if (held := expected_entries(0, entries - 1, e, wq, position))
        }
        got = {
            row["bookie_id"]: EntryAvailability.from_bytes(row["availability"])
            for row in availability.get(ledger, [])
        }
        assert got == expected, ledger
    assert summary["counts"]["availability"] == sum(len(rows) for rows in availability.values())

    stages = {stage for stage, _, _ in progress}
    assert stages == {"ledgers", "tombstones"} | {f"bookie {b.address}" for b in cluster.bookies}
    for bookie in cluster.bookies:
        done = [(d, t) for s, d, t in progress if s == f"bookie {bookie.address}"]
        assert (
            done[-1][0]
            == done[-1][1]
            == sum(
                1
                for rows in availability.values()
                for r in rows
                if r["bookie_id"] == bookie.address
            )
        )

    with pytest.raises(BadRequest, match="already holds"):
        asyncio.run(take_snapshot(cluster.uri, out))


@contextlib.asynccontextmanager
async def fake_bookie(uri: str, behaviour: str) -> AsyncIterator[str]:
    """A registered bookie that is not there ("absent"), never answers ("silent"), or breaks
    its availability dump off after a few thousand records ("cut"); yields its id."""
    loop = asyncio.get_running_loop()
    port = free_port()
    server = None
    if behaviour != "absent":
        server = await loop.create_server(lambda: _FakeBookie(behaviour), "127.0.0.1", port)
    bookie_id = f"fake-{behaviour}"
    store = open_store(uri, session_timeout=60.0)  # a loaded machine must not lose it
    await store.start()
    try:
        await BookieRegistry(store).register(
            bookie_id, BookieInfo(f"127.0.0.1:{port}", None, "fake", 0)
        )
        yield bookie_id
    finally:
        await store.close()
        if server is not None:
            server.close()


class _FakeBookie(asyncio.Protocol):
    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.reader = RequestReader()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        for request in self.reader.feed(data):
            if self.behaviour == "cut" and isinstance(request, AvailabilityDumpRequest):
                encoder = AvailabilityDumpEncoder(request.request_id, budget=4096)
                held = EntryAvailability.span(0, 9).to_bytes()
                for ledger in range(3000):
                    frame = encoder.add(LedgerAvailability(LedgerId(0, ledger), held))
                    if frame is not None:
                        self.transport.write(frame)
                self.transport.close()


@pytest.mark.parametrize("behaviour", ["absent", "silent", "cut"])
def test_a_registered_bookie_that_does_not_respond_leaves_no_rows(
    cluster: Cluster,
    written: dict[LedgerId, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    behaviour: str,
) -> None:
    monkeypatch.setattr(snapshot, "ROW_BATCH", 100)  # so "cut" has written parts to undo
    out = tmp_path / "snap"

    async def run() -> tuple[str, dict[str, Any]]:
        async with fake_bookie(cluster.uri, behaviour) as bookie_id:
            return bookie_id, await take_snapshot(
                cluster.uri, out, config=AuditConfig(snapshot_bookie_timeout=1.0)
            )

    bookie_id, summary = asyncio.run(run())
    bookies = {row["bookie_id"]: row for row in _rows(out, schema.BOOKIES)}
    assert bookies[bookie_id] == {
        "bookie_id": bookie_id,
        "rack": "/default-rack",
        "state": "writable",
        "responded": False,
    }
    assert all(bookies[b.address]["responded"] for b in cluster.bookies)
    rows = _rows(out, schema.AVAILABILITY)
    assert {row["bookie_id"] for row in rows} == {b.address for b in cluster.bookies}
    assert len(list((out / schema.AVAILABILITY).glob("*.parquet"))) == BOOKIES
    assert summary["counts"]["availability"] == len(rows)
    assert summary["counts"]["bookies_responded"] == BOOKIES
    assert set(summary["unresponsive_bookies"]) == {bookie_id}


def test_a_dead_bookie_is_unregistered_and_not_asked(
    cluster: Cluster, written: dict[LedgerId, int], tmp_path: Path
) -> None:
    victim = cluster.bookies[-1]
    cluster.kill(victim.address)
    try:
        others = {b.address for b in cluster.bookies if b is not victim}
        asyncio.run(eventually_writable(cluster.uri, others))
        out = tmp_path / "snap"
        summary = asyncio.run(take_snapshot(cluster.uri, out))
        bookies = {row["bookie_id"]: row for row in _rows(out, schema.BOOKIES)}
        assert bookies[victim.address]["state"] == "unregistered"
        assert bookies[victim.address]["responded"] is False
        assert summary["unresponsive_bookies"] == {}
        rows = _rows(out, schema.AVAILABILITY)
        assert rows
        assert victim.address not in {row["bookie_id"] for row in rows}
    finally:
        cluster.restore()


def test_the_dump_agrees_with_get_list_of_entries(
    cluster: Cluster, written: dict[LedgerId, int], tmp_path: Path
) -> None:
    """The two ways to ask a bookie what it holds give the same bytes' meaning."""
    out = tmp_path / "snap"
    asyncio.run(take_snapshot(cluster.uri, out))
    rows = _rows(out, schema.AVAILABILITY)

    async def ask() -> None:
        for bookie in cluster.bookies:
            connection = await BookieConnection.connect(bookie.address)
            try:
                for row in rows:
                    if row["bookie_id"] != bookie.address:
                        continue
                    ledger = LedgerId(
                        schema.from_int64(row["scope"]), schema.from_int64(row["ledger_id"])
                    )
                    held = await connection.get_list_of_entries(ledger)
                    assert held == EntryAvailability.from_bytes(row["availability"])
            finally:
                await connection.close()

    asyncio.run(ask())


def test_records_the_store_cannot_decode_are_rows_of_unreadable(
    cluster: Cluster, written: dict[LedgerId, int], tmp_path: Path
) -> None:
    """Metadata there but unreadable is written down with its ledger, never dropped: the
    audit must not take that ledger's data for orphan data."""
    broken_ledger, broken_tombstone = LedgerId.classic(900_001), LedgerId(5, 900_002)
    paths = [LEDGER_METADATA.path(broken_ledger), TOMBSTONE_RECORDS.path(broken_tombstone)]

    async def damage() -> None:
        async with store_session(cluster.uri) as store:
            for path in paths:
                await store.create(path, b"\xff not a record", make_parents=True)

    async def repair() -> None:
        async with store_session(cluster.uri) as store:
            for path in paths:
                await store.delete(path)

    asyncio.run(damage())
    try:
        summary = asyncio.run(take_snapshot(cluster.uri, tmp_path / "snap"))
    finally:
        asyncio.run(repair())
    rows = {
        (row["scope"], row["ledger_id"], row["record"], row["path"])
        for row in _rows(tmp_path / "snap", schema.UNREADABLE)
    }
    assert rows == {
        (0, 900_001, "ledger", paths[0]),
        (5, 900_002, "tombstone", paths[1]),
    }
    assert summary["counts"]["unreadable_ledgers"] == 1
    assert summary["counts"]["unreadable_tombstones"] == 1
    assert summary["counts"]["ledgers"] == len(written)


@pytest.mark.parametrize("spark_from", [None, 1])
def test_the_command_takes_a_large_cluster_s_snapshot_on_spark(
    cluster: Cluster, written: dict[LedgerId, int], tmp_path: Path, spark_from: int | None
) -> None:
    """Without --master: in one process below spark_snapshot_from ledger ids handed out,
    as a Spark job on spark_master from it on; the same snapshot either way."""
    variables = {"TALLY_AUDIT_SPARK_MASTER": "local[2]"}
    if spark_from is not None:
        variables["TALLY_AUDIT_SPARK_SNAPSHOT_FROM"] = str(spark_from)
    with environment(variables):
        taken = run_tally(
            "audit",
            "snapshot",
            "--metadata",
            cluster.uri,
            "--out",
            str(tmp_path / "s"),
            timeout=180,
        )
    assert taken.returncode == 0, taken.stderr
    on_spark = "taking the snapshot as a Spark job on local[2]" in taken.stderr
    assert on_spark == (spark_from is not None), taken.stderr
    by_command = json.loads((tmp_path / "s" / schema.SNAPSHOT_JSON).read_text())
    alone = asyncio.run(take_snapshot(cluster.uri, tmp_path / "alone"))
    assert by_command["counts"] == alone["counts"]


def _sorted_rows(out: Path, name: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(row.values()) for row in _rows(out, name))


def test_the_snapshot_taken_by_spark_tasks_is_the_one_taken_in_process(
    cluster: Cluster, written: dict[LedgerId, int], tmp_path: Path, spark: SparkSession
) -> None:
    """Ranges of ledger ids and the bookies' dumps exported by Spark tasks, each into its own
    part; a bookie that never answers and one that breaks its dump off are recorded as not
    responding, with no rows, and the job goes on."""
    alone, tasks = tmp_path / "alone", tmp_path / "tasks"
    config = AuditConfig(snapshot_bookie_timeout=1.0)
    progress: list[tuple[str, int, int | None]] = []

    async def run() -> tuple[dict[str, Any], dict[str, Any], set[str]]:
        async with (
            fake_bookie(cluster.uri, "silent") as silent,
            fake_bookie(cluster.uri, "cut") as cut,
        ):
            in_process = await take_snapshot(cluster.uri, alone, config=config)
            by_spark = await asyncio.to_thread(
                take_snapshot_on_spark,
                spark,
                cluster.uri,
                tasks,
                config=config,
                progress=lambda *args: progress.append(args),
            )
            return in_process, by_spark, {silent, cut}

    in_process, by_spark, fakes = asyncio.run(run())
    for name in schema.SNAPSHOT_TABLES:
        assert _sorted_rows(tasks, name) == _sorted_rows(alone, name), name
    assert len(list((tasks / schema.LEDGERS).glob("*.parquet"))) > 1, "one part per range"
    assert by_spark["counts"] == in_process["counts"]
    assert by_spark["counts"]["ledgers"] == len(written)
    assert set(by_spark["unresponsive_bookies"]) == fakes
    assert {row["bookie_id"] for row in _rows(tasks, schema.AVAILABILITY)} == {
        b.address for b in cluster.bookies
    }
    ignored = ("created_ms", "unresponsive_bookies")
    assert {k: v for k, v in by_spark.items() if k not in ignored} == {
        k: v for k, v in in_process.items() if k not in ignored
    }
    bookies = len(cluster.bookies) + len(fakes)
    assert ("bookies dumped", bookies, bookies) in progress
    assert any(stage == "ledger ranges" for stage, _, _ in progress)
