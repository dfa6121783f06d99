"""Deleting ledgers on a real cluster (bookie processes, sqlite store, the shell): tombstones
acknowledged by every bookie, one of them when it comes back, and data whose metadata went
behind the delete path's back kept and reported until an operator deletes it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tally.client.bookie_connection import BookieConnection
from tally.client.client import Client
from tally.core.deletion import ClusterSettings
from tally.core.errors import LedgerDeleted, NoSuchLedger
from tally.core.ids import LedgerId
from tally.metadata.cluster_settings import write_settings
from tally.metadata.deletion import sweep_deletions
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.paths import LEDGER_METADATA
from tally.metadata.store import MetadataStore
from tally.metadata.tombstones import read_tombstone
from tests.support.cluster import Cluster, read_all, store_session
from tests.support.polling import until
from tests.support.processes import (
    AutoRecoveryProcess,
    BookieProcess,
    environment,
    init_cluster,
)

PASSWORD = b"gc"
ENTRIES = 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("gc-cluster")
    found = Cluster(init_cluster(root), root)
    found.bookies = [
        BookieProcess(found.uri, root / f"bookie-{i}", extra=("--metrics-port", "0"))
        for i in range(3)
    ]
    with environment({"TALLY_BOOKIE_GC_WAIT_TIME": "3600"}):
        found._start_all(found.bookies)
    try:
        yield found
    finally:
        found.shutdown()


def shell(*args: str, uri: str) -> subprocess.CompletedProcess[str]:
    variables = {k: v for k, v in os.environ.items() if k != "TALLY_METADATA"}
    command = [sys.executable, "-m", "tally.cli.main", "shell", *args, "--metadata", uri]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, check=False, env=variables
    )


def triggergc(cluster: Cluster, *bookie: str) -> dict[str, dict[str, object]]:
    options = ("--bookie", bookie[0]) if bookie else ()
    done = shell("triggergc", *options, "--json", uri=cluster.uri)
    assert done.returncode == 0, done.stderr
    runs: dict[str, dict[str, object]] = json.loads(done.stdout)
    return runs


async def settings(uri: str, **values: int) -> None:
    async with store_session(uri) as store:
        await write_settings(store, ClusterSettings(**values))  # type: ignore[arg-type]


async def write_ledger(uri: str, ensemble_size: int = 3) -> LedgerId:
    async with Client(uri) as client:
        writer = await client.create_ledger(
            ensemble_size=ensemble_size, write_quorum=ensemble_size, ack_quorum=2,
            password=PASSWORD,
        )  # fmt: skip
        for entry_id in range(ENTRIES):
            await writer.append(b"entry %d" % entry_id)
        await writer.close()
        return writer.ledger_id


async def held_by(bookie: str, ledger_id: LedgerId) -> int:
    connection = await BookieConnection.connect(bookie, request_timeout=5.0)
    try:
        return len(await connection.get_list_of_entries(ledger_id))
    except NoSuchLedger:
        return 0
    finally:
        await connection.close()


async def delete(uri: str, ledger_id: LedgerId) -> None:
    async with Client(uri) as client:
        outcome = await client.delete_ledger(ledger_id, reason="test")
        assert outcome.tombstone is not None
        assert outcome.deletion.violations == 0, outcome.deletion.detail


def test_every_bookie_drops_a_tombstoned_ledger_one_when_it_returns(cluster: Cluster) -> None:
    async def scenario() -> None:
        await settings(cluster.uri, ledger_delete_retention=0)
        kept, doomed, later = [await write_ledger(cluster.uri) for _ in range(3)]
        bookies = [b.address for b in cluster.bookies]
        assert [await held_by(b, doomed) for b in bookies] == [ENTRIES] * 3

        await delete(cluster.uri, doomed)
        runs = await asyncio.to_thread(triggergc, cluster)
        assert all(run["ledgers_deleted"] == [doomed.qualified_name] for run in runs.values())
        assert [await held_by(b, doomed) for b in bookies] == [0, 0, 0]
        assert [await held_by(b, kept) for b in bookies] == [ENTRIES] * 3
        async with store_session(cluster.uri) as store:
            found = await read_tombstone(store, doomed)
            assert found is not None
            assert not found.tombstone.pending

        away = cluster.bookies[2]
        away.stop()
        await delete(cluster.uri, later)
        await asyncio.to_thread(triggergc, cluster, bookies[0])
        async with store_session(cluster.uri) as store:
            found = await read_tombstone(store, later)
            assert found is not None
            assert found.tombstone.pending == {bookies[1], away.address}
        cluster.restart([away.address])
        await asyncio.to_thread(triggergc, cluster)
        assert [await held_by(b, later) for b in bookies] == [0, 0, 0]
        async with store_session(cluster.uri) as store:
            found = await read_tombstone(store, later)
            assert found is not None
            assert not found.tombstone.pending
        async with Client(cluster.uri) as client:
            reader = await client.open_ledger(kept, password=PASSWORD)
            assert reader.last_entry_id == ENTRIES - 1

    asyncio.run(scenario())


def test_data_without_metadata_is_kept_reported_and_deleted_on_order(cluster: Cluster) -> None:
    async def scenario() -> None:
        bookies = [b.address for b in cluster.bookies]
        ledger_id = await write_ledger(cluster.uri)
        async with store_session(cluster.uri) as store:
            await store.delete(LEDGER_METADATA.path(ledger_id))  # behind the delete path
        runs = await asyncio.to_thread(triggergc, cluster)
        assert all(ledger_id.qualified_name in run["orphans"] for run in runs.values())
        assert [await held_by(b, ledger_id) for b in bookies] == [ENTRIES] * 3

        listed = shell("gc", "orphans", "--bookie", bookies[0], "--json", uri=cluster.uri)
        assert listed.returncode == 0, listed.stderr
        report = json.loads(listed.stdout)
        assert [o["ledger_id"] for o in report["orphans"]] == [str(ledger_id)]
        assert report["deleted"] is None
        assert await held_by(bookies[0], ledger_id) == ENTRIES
        ordered = shell("gc", "orphans", "--bookie", bookies[0], "--delete", uri=cluster.uri)
        assert ordered.returncode == 0, ordered.stderr
        assert f"deleted 1 orphan ledger(s): {ledger_id}" in ordered.stdout
        assert [await held_by(b, ledger_id) for b in bookies] == [0, ENTRIES, ENTRIES]
        status = shell("gcstatus", "--bookie", bookies[1], uri=cluster.uri)
        assert status.returncode == 0, status.stderr
        assert "orphans" in status.stdout

    asyncio.run(scenario())


def test_a_bookie_away_past_tombstone_retention_keeps_the_data_as_orphan(
    cluster: Cluster,
) -> None:
    async def scenario() -> None:
        await settings(cluster.uri, ledger_delete_retention=0, tombstone_retention=0)
        bookies = [b.address for b in cluster.bookies]
        ledger_id = await write_ledger(cluster.uri)
        away = cluster.bookies[1]
        away.stop()
        await delete(cluster.uri, ledger_id)
        await asyncio.to_thread(triggergc, cluster, bookies[0])
        async with store_session(cluster.uri) as store:
            report = await sweep_deletions(LedgerManager(store), now_ms=2**62)
        assert ledger_id in report.tombstones_removed
        cluster.restart([away.address])
        runs = await asyncio.to_thread(triggergc, cluster, away.address)
        assert runs[away.address]["ledgers_deleted"] == []
        assert ledger_id.qualified_name in runs[away.address]["orphans"]
        assert await held_by(away.address, ledger_id) == ENTRIES
        await settings(cluster.uri, ledger_delete_retention=0)

    asyncio.run(scenario())


def test_the_delete_lifecycle_runs_by_itself(tmp_path: Path) -> None:
    """Soft delete and undelete, then the auditor's tombstone past the retention, every
    bookie's GC dropping and acknowledging on its timer, and the tombstone's removal."""
    root = tmp_path / "lifecycle"
    cluster = Cluster(init_cluster(root), root)
    cluster.bookies = [BookieProcess(cluster.uri, root / f"bookie-{i}") for i in range(3)]
    auditor = AutoRecoveryProcess(
        cluster.uri,
        root / "autorecovery.log",
        "auditor-1",
        settings={"auditor_deletion_check_interval": "0.2"},
    )
    with environment({"TALLY_BOOKIE_GC_WAIT_TIME": "0.2"}):
        cluster._start_all(cluster.bookies)

    async def scenario() -> None:
        await settings(cluster.uri, ledger_delete_retention=1, tombstone_retention=1)
        kept, doomed = await write_ledger(cluster.uri), await write_ledger(cluster.uri)
        bookies = [b.address for b in cluster.bookies]
        async with Client(cluster.uri) as client:
            before = (await client.context.ledgers.read_ledger_metadata(kept)).metadata
            await client.delete_ledger(kept, reason="oops")
            with pytest.raises(LedgerDeleted):
                await client.open_ledger(kept, password=PASSWORD)
            restored = await client.undelete_ledger(kept)
            assert restored.metadata == dataclasses.replace(
                before, undeleted_ms=restored.metadata.undeleted_ms
            )
            assert restored.metadata.undeleted_ms > 0
            outcome = await client.delete_ledger(doomed, reason="retention")
            assert outcome.tombstone is None  # within its retention: DELETED only
        await asyncio.to_thread(auditor.start)
        async with store_session(cluster.uri) as store:

            async def tombstone_pending() -> frozenset[str] | None:
                found = await read_tombstone(store, doomed)
                return None if found is None else found.tombstone.pending

            await until(lambda: tombstone_pending(), "the auditor tombstones", timeout=30)
            await until(
                lambda: _all_acknowledged(store, doomed), "every bookie acknowledges", timeout=30
            )
            assert [await held_by(b, doomed) for b in bookies] == [0, 0, 0]
            await until(lambda: _removed(store, doomed), "the tombstone goes", timeout=30)
        async with Client(cluster.uri) as client:
            with pytest.raises(NoSuchLedger):
                await client.open_ledger(doomed, password=PASSWORD)
            reader = await client.open_ledger(kept, password=PASSWORD)
            assert reader.last_entry_id == ENTRIES - 1

    try:
        asyncio.run(scenario())
    finally:
        auditor.kill()
        cluster.shutdown()


async def _all_acknowledged(store: MetadataStore, ledger_id: LedgerId) -> bool:
    found = await read_tombstone(store, ledger_id)
    return found is not None and not found.tombstone.pending


async def _removed(store: MetadataStore, ledger_id: LedgerId) -> bool:
    return await read_tombstone(store, ledger_id) is None


def _disk_bytes(directory: Path) -> int:
    return sum(path.stat().st_blocks * 512 for path in directory.rglob("*") if path.is_file())


LEDGERS = 20
ENTRIES_PER_LEDGER = 200
"""Of about 52 KiB on average: 200 MiB in all, on every bookie (E = WQ = 3)."""


def test_deleted_ledgers_give_their_disk_space_back(tmp_path: Path) -> None:
    """Through the real path: the delete path, tombstones, `tally shell triggergc` (deletion,
    then a forced major compaction); each bookie's disk comes back to within a small factor
    of its live bytes, and the ledgers left read back byte for byte."""
    root = tmp_path / "space"
    cluster = Cluster(init_cluster(root), root)
    cluster.bookies = [
        BookieProcess(cluster.uri, root / f"bookie-{i}", extra=("--metrics-port", "0"))
        for i in range(3)
    ]
    small = {
        "TALLY_BOOKIE_ENTRY_LOG_SIZE_LIMIT": str(4 << 20),
        "TALLY_BOOKIE_JOURNAL_FILE_SIZE": str(8 << 20),
        "TALLY_BOOKIE_JOURNAL_PREALLOCATE_SIZE": str(4 << 20),
        "TALLY_BOOKIE_WRITE_CACHE_MAX_BYTES": str(4 << 20),
        "TALLY_BOOKIE_FLUSH_INTERVAL": "0.2",
        "TALLY_BOOKIE_KEEP_LARGE_ENTRIES_IN_JOURNAL": "true",
        "TALLY_BOOKIE_GC_WAIT_TIME": "3600",
    }
    slack = (4 << 20) + 2 * (8 << 20) + (8 << 20)  # the current entry log, journal, index
    with environment(small):
        cluster._start_all(cluster.bookies)

    def payload(ledger_id: LedgerId, entry_id: int) -> bytes:
        size = 200_000 if entry_id % 4 == 0 else 3_000  # some kept in the journal
        return (b"%d/%d;" % (ledger_id.id, entry_id) * size)[:size]

    async def scenario() -> None:
        await settings(cluster.uri, ledger_delete_retention=0)
        async with Client(cluster.uri) as client:
            ledgers = []
            for _ in range(LEDGERS):
                writer = await client.create_ledger(
                    ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
                )
                for entry_id in range(ENTRIES_PER_LEDGER):
                    writer.append_nowait(payload(writer.ledger_id, entry_id))
                await writer.close()
                ledgers.append(writer.ledger_id)
            await until(
                lambda: all(
                    not (b.data_dir / "ledgers" / "logs").exists()
                    or any((b.data_dir / "ledgers" / "logs").iterdir())
                    for b in cluster.bookies
                ),
                "entry logs written",
            )
            written = [_disk_bytes(b.data_dir) for b in cluster.bookies]
            kept, doomed = ledgers[:2], ledgers[2:]
            for ledger_id in doomed:
                await client.delete_ledger(ledger_id, reason="trimmed")
        live = sum(
            len(payload(ledger_id, entry_id))
            for ledger_id in kept
            for entry_id in range(ENTRIES_PER_LEDGER)
        )
        runs = await asyncio.to_thread(triggergc, cluster)
        assert all(len(run["ledgers_deleted"]) == len(doomed) for run in runs.values())
        # A second run reclaims what the first one's checkpoint let go of.
        runs = await asyncio.to_thread(triggergc, cluster)
        after = [_disk_bytes(b.data_dir) for b in cluster.bookies]
        print(
            f"{sum(written) / 2**20:.0f} MiB on the bookies' disks; after deleting "
            f"{len(doomed)} of {LEDGERS} ledgers: {sum(after) / 2**20:.0f} MiB for "
            f"{3 * live / 2**20:.0f} MiB live"
        )
        for now in after:
            assert now < 1.5 * live + slack, (written, after, live, runs)
        async with Client(cluster.uri) as client:
            for ledger_id in kept:
                reader = await client.open_ledger(ledger_id, password=PASSWORD)
                assert await read_all(reader) == {
                    entry_id: payload(ledger_id, entry_id) for entry_id in range(ENTRIES_PER_LEDGER)
                }

    try:
        asyncio.run(scenario())
    finally:
        cluster.shutdown()
