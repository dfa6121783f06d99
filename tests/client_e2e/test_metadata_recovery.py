"""Metadata recovery end to end (issue 18), with real bookie processes and real Spark: ledgers
of several shapes, the store's file deleted, `tally cluster recover --apply` (the command a
user runs), the bookies restarted on the rebuilt store. Every acknowledged entry reads back
byte for byte, every field of an exact ledger equals the original, the audit finds nothing,
a deleted ledger stays deleted, a soft-deleted one comes back DELETED (and can be undeleted)
and one undeleted before the loss comes back CLOSED."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tally.audit.recovery.apply import Applied, apply_recovery
from tally.audit.recovery.exports import export_files, export_path, export_running_bookie
from tally.audit.schema import from_int64
from tally.client.bookie_connection import BookieConnection
from tally.client.client import Client
from tally.client.config import ClientConfig
from tally.core.deletion import ClusterSettings
from tally.core.digest import DigestType, master_key
from tally.core.entry_format import encode_entry
from tally.core.errors import LedgerDeleted, NoSuchLedger
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.core.metadata_recovery import FROM_SNAPSHOT, SOFT_DELETED
from tally.core.schedule import write_set
from tally.metadata.cluster_settings import read_settings, write_settings
from tally.metadata.tombstones import read_tombstone
from tally.metadata.zk_server import ZooKeeperServer, missing_prerequisite
from tests.client_e2e.conftest import writer_process
from tests.support.async_tests import run
from tests.support.cluster import Cluster, read_all, running_cluster, store_session
from tests.support.polling import until
from tests.support.processes import environment, tally

PASSWORD = b"recovery"
CONFIG = ClientConfig(add_entry_timeout=2.0, read_timeout=1.5, session_timeout=5.0)
RECOVER_TIMEOUT = 300
DEADLINE = 120.0
SORTED_BY = ("bookie_id", "kind", "scope", "ledger_id")
OLD_DIGEST = DigestType.CRC32
"""The digest type of the ledger written without copies: what its inferred metadata must
learn from its entries (the client's default, CRC32C, would fail every read)."""


@dataclass
class Written:
    """A ledger as its writer left it: what the store said, and what was acknowledged."""

    ledger_id: LedgerId
    entries: list[bytes]
    metadata: LedgerMetadata | None = None
    """As the store had it when it was lost (None: written without a store, below)."""


@dataclass
class Shapes:
    written: list[Written]
    """Readable after the recovery, each CLOSED."""
    deleted: LedgerId
    """Deleted under its tombstone, obeyed by its bookies."""
    soft: Written
    """Soft-deleted (DELETED, within its retention) when the store was lost."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with (
        environment({"TALLY_BOOKIE_GC_WAIT_TIME": "1"}),
        running_cluster(tmp_path, 4) as found,
    ):
        yield found


async def append_all(writer: object, count: int, tag: str) -> list[bytes]:
    entries = [f"{tag} entry {n}".encode() * (n % 7 + 1) for n in range(count)]
    for data in entries:
        await writer.append(data)  # type: ignore[attr-defined]
    return entries


async def write_shapes(cluster: Cluster) -> Shapes:
    """Closed, with an ensemble change, 128-bit with custom metadata, recovered after its
    writer died, deleted and undeleted, left open by its writer; one deleted (its tombstone
    obeyed by its bookies) and one soft-deleted."""
    written = []
    async with store_session(cluster.uri) as store:
        await write_settings(store, ClusterSettings(ledger_delete_retention=0))
    async with Client(cluster.uri, config=CONFIG) as client:
        closed = await client.create_ledger(ensemble_size=3, write_quorum=2, password=PASSWORD)
        written.append(Written(closed.ledger_id, await append_all(closed, 30, "closed")))
        await closed.close()

        changed = await client.create_ledger(ensemble_size=3, write_quorum=2, password=PASSWORD)
        entries = await append_all(changed, 10, "changed")
        gone = changed.metadata.metadata.segments[0].ensemble[0]
        await asyncio.to_thread(cluster.kill, gone)
        entries += await append_all(changed, 10, "changed later")
        await changed.close()
        await asyncio.to_thread(cluster.restart, [gone])
        written.append(Written(changed.ledger_id, entries))

        wide = await client.create_ledger(
            ensemble_size=4,
            write_quorum=3,
            ack_quorum=2,
            password=PASSWORD,
            uuid=True,
            custom_metadata={"app": b"recovery-test", "owner": b"\x00\xff"},
        )
        written.append(Written(wide.ledger_id, await append_all(wide, 12, "wide")))
        await wide.close()

        died = await client.create_ledger(ensemble_size=3, write_quorum=2, password=PASSWORD)
        written.append(Written(died.ledger_id, await append_all(died, 8, "died")))
        await client.open_ledger(died.ledger_id, password=PASSWORD)  # recovered, closed

        doomed = await client.create_ledger(ensemble_size=3, write_quorum=3, password=PASSWORD)
        await append_all(doomed, 5, "doomed")
        await doomed.close()
        await client.delete_ledger(doomed.ledger_id)
        async with store_session(cluster.uri) as store:
            await write_settings(store, ClusterSettings(ledger_delete_retention=3600))

        soft_deleted = await client.create_ledger(
            ensemble_size=3, write_quorum=2, password=PASSWORD
        )
        soft = Written(soft_deleted.ledger_id, await append_all(soft_deleted, 9, "soft"))
        await soft_deleted.close()
        await client.delete_ledger(soft.ledger_id, reason="retention")
        soft.metadata = (await client.context.ledgers.read_ledger_metadata(soft.ledger_id)).metadata

        revived = await client.create_ledger(ensemble_size=3, write_quorum=2, password=PASSWORD)
        written.append(Written(revived.ledger_id, await append_all(revived, 6, "revived")))
        await revived.close()
        await client.delete_ledger(revived.ledger_id, reason="by mistake")
        await client.undelete_ledger(revived.ledger_id)

        left_open = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        written.append(Written(left_open.ledger_id, await append_all(left_open, 15, "open")))
        # the client closes with the ledger open, as a writer that died would leave it
        for record in written:
            found = await client.context.ledgers.read_ledger_metadata(record.ledger_id)
            record.metadata = found.metadata

    async def obeyed() -> bool:
        async with store_session(cluster.uri) as store:
            found = await read_tombstone(store, doomed.ledger_id)
        return found is None or not found.tombstone.pending

    await until(obeyed, "every bookie of the deleted ledger obeyed its tombstone", timeout=30)
    return Shapes(written, doomed.ledger_id, soft)


async def write_without_copies(cluster: Cluster) -> Written:
    """A ledger as a bookie without metadata copies held it: adds only (E3 WQ2), straight
    to three bookies, of entries in format V1 (scope 0, as before BP-34: their digest type is
    told by checking their CRC) with a CRC32 digest, not the client's default, at an id far
    past the client's."""
    ledger_id = LedgerId(0, 1_000_007)
    bookies = [bookie.address for bookie in cluster.bookies[:3]]
    entries = [b"old entry %d" % n for n in range(20)]
    await add_without_copies(bookies, ledger_id, entries, OLD_DIGEST)
    return Written(ledger_id, entries)


async def add_without_copies(
    ensemble: list[str], ledger_id: LedgerId, entries: list[bytes], digest_type: DigestType
) -> int:
    """Add `entries` to the bookies of `ensemble` as the round-robin schedule of WQ 2 puts
    them, straight (no writer, so no metadata copy); the ledger's length."""
    key = master_key(PASSWORD)
    connections = [await BookieConnection.connect(address) for address in ensemble]
    try:
        length = 0
        for entry_id, data in enumerate(entries):
            length += len(data)
            raw = encode_entry(ledger_id, entry_id, entry_id - 1, length, data, digest_type)
            copies = write_set(entry_id, len(ensemble), 2)
            await asyncio.gather(*(connections[p].add(raw, key) for p in copies))
    finally:
        for connection in connections:
            await connection.close()
    return length


async def lose_the_store_under_a_writer(cluster: Cluster, tmp_path: Path) -> Written:
    """A writer process adding when the store is lost goes on (adds need no store) until
    it is SIGKILLed: every entry it saw acknowledged, before the loss or after, must come
    back."""
    async with writer_process(
        cluster.uri, (3, 2, 2), seed=18, password=PASSWORD.decode(), stderr=tmp_path / "w.err"
    ) as worker:
        await worker.until_acked(20)
        assert worker.ledger_id is not None
        async with Client(cluster.uri, config=CONFIG) as client:
            found = await client.context.ledgers.read_ledger_metadata(worker.ledger_id)
        lose_the_store(cluster)
        await worker.until_acked(40)
        await worker.kill()
        acked = dict(sorted(worker.acked.items()))
    assert list(acked) == list(range(len(acked)))
    return Written(worker.ledger_id, list(acked.values()), found.metadata)


def recover_from_the_bookies(
    cluster: Cluster, report: Path, *options: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """`tally cluster recover --apply` from all the running bookies, as a user runs it: its
    outcome and summary.json."""
    addresses = ",".join(bookie.address for bookie in cluster.bookies)
    applied = tally(
        "cluster", "recover", "--metadata", cluster.uri, "--bookies", addresses,
        "--report", str(report), "--master", "local[2]", "--apply", *options,
        timeout=RECOVER_TIMEOUT,
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr + applied.stdout
    assert "Traceback" not in applied.stderr
    return applied, json.loads((report / "summary.json").read_text())


def lose_the_store(cluster: Cluster) -> None:
    database = Path(cluster.uri.removeprefix("sqlite:///"))
    for path in database.parent.glob(database.name + "*"):
        path.unlink()


async def check_recovered(cluster: Cluster, shapes: Shapes) -> None:
    async with Client(cluster.uri, config=CONFIG) as client:
        for record in shapes.written:
            reader = await client.open_ledger(record.ledger_id, password=PASSWORD)
            got = await read_all(reader)
            assert [got[n] for n in range(len(record.entries))] == record.entries, record
            now = (await client.context.ledgers.read_ledger_metadata(record.ledger_id)).metadata
            assert now.state is LedgerState.CLOSED
            original = record.metadata
            if original is None:
                assert (now.ensemble_size, now.write_quorum) == (3, 2)
                assert now.digest_type is OLD_DIGEST
                continue
            for name in (
                "ensemble_size", "write_quorum", "ack_quorum", "segments", "digest_type",
                "master_key", "ctime_ms", "creator_token", "custom_metadata", "undeleted_ms",
            ):  # fmt: skip
                assert getattr(now, name) == getattr(original, name), (record, name)
            if original.state is LedgerState.CLOSED:
                assert (now.last_entry_id, now.length) == (
                    original.last_entry_id,
                    original.length,
                )
            else:  # recovered: every acknowledged entry kept
                assert now.last_entry_id >= len(record.entries) - 1
        with pytest.raises(NoSuchLedger):
            await client.open_ledger(shapes.deleted, password=PASSWORD)
        soft = (await client.context.ledgers.read_ledger_metadata(shapes.soft.ledger_id)).metadata
        assert soft == shapes.soft.metadata
        with pytest.raises(LedgerDeleted):
            await client.open_ledger(shapes.soft.ledger_id, password=PASSWORD)


async def undelete_and_read(cluster: Cluster, soft: Written) -> None:
    """The soft-deleted ledger came back as it was: an undelete makes it readable."""
    async with Client(cluster.uri, config=CONFIG) as client:
        await client.undelete_ledger(soft.ledger_id)
        got = await read_all(await client.open_ledger(soft.ledger_id, password=PASSWORD))
    assert [got[n] for n in range(len(soft.entries))] == soft.entries


@pytest.mark.timeout(600)
def test_a_lost_store_is_rebuilt_from_the_running_bookies(cluster: Cluster, tmp_path: Path) -> None:
    """A plain test (Spark runs three times): its deadline is pytest's, not the directory's
    for async tests."""
    shapes = run(write_shapes(cluster), DEADLINE)
    shapes.written.append(run(write_without_copies(cluster)))
    shapes.written.append(run(lose_the_store_under_a_writer(cluster, tmp_path), DEADLINE))
    report = tmp_path / "report"
    applied, summary = recover_from_the_bookies(cluster, report)
    assert summary["ledgers"] == {
        "exact": 8,
        "inferred": 1,
        "deleted": 1,
        "not_recoverable": 0,
    }, summary
    assert summary["needs_recovery"] == 3  # left open, the killed writer's, the inferred one
    decided = pq.read_table(report / "ledgers", filters=[("verdict", "=", "inferred")])
    (inferred,) = decided.to_pylist()
    assert f"digest type {OLD_DIGEST.name} from its entries" in inferred["reason"], inferred
    assert "3 ledgers recovered" in applied.stdout, applied.stdout
    soft_name = shapes.soft.ledger_id.qualified_name
    assert f"ledger {soft_name}: exact: {SOFT_DELETED}" in applied.stdout, applied.stdout
    for bookie in cluster.bookies:
        bookie.stop()
    cluster.restart([bookie.address for bookie in cluster.bookies])
    run(check_recovered(cluster, shapes), DEADLINE)

    async def again() -> Applied:
        async with store_session(cluster.uri) as store:
            return await apply_recovery(store, report)

    repeated = run(again(), DEADLINE)
    assert (repeated.ledgers_written, repeated.ledgers_present) == (0, 9), repeated
    assert repeated.recovery_failed == {}
    run(check_recovered(cluster, shapes), DEADLINE)
    run(undelete_and_read(cluster, shapes.soft), DEADLINE)

    snapshot, audit = tmp_path / "snapshot", tmp_path / "audit"
    taken = tally(
        "audit", "snapshot", "--metadata", cluster.uri, "--out", str(snapshot), timeout=120
    )
    assert taken.returncode == 0, taken.stderr
    audited = tally(
        "audit", "run", "--snapshot", str(snapshot), "--out", str(audit), "--master", "local[2]",
        timeout=RECOVER_TIMEOUT,
    )  # fmt: skip
    assert audited.returncode == 0, audited.stderr
    categories = json.loads((audit / "summary.json").read_text())["categories"]
    assert not any(categories.values()), categories

    # A stopped bookie's files say what the running bookie said.
    online, offline = tmp_path / "online", tmp_path / "offline"
    for bookie in cluster.bookies:
        run(export_running_bookie(bookie.address, export_path(online, bookie.address)))
    for bookie in cluster.bookies:
        bookie.stop()
        exported = tally(
            "cluster", "export-bookie", "--data-dir", str(bookie.data_dir), "--out", str(offline)
        )  # fmt: skip
        assert exported.returncode == 0, exported.stderr
    assert rows_of(offline) == rows_of(online)


@pytest.mark.timeout(600)
def test_a_lost_zookeeper_store_is_rebuilt_from_stopped_bookies_exports(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """The bookies are stopped and their ZooKeeper store wiped; each is exported from its
    files (`tally cluster export-bookie`), and the store rebuilt from the exports."""
    why_not = missing_prerequisite()
    if why_not is not None:
        pytest.fail(why_not)
    zookeeper = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    zookeeper.start()
    uri = zookeeper.uri("/lost")
    cluster = Cluster(uri, tmp_path)
    try:
        made = tally("cluster", "init", "--metadata", uri, timeout=60)
        assert made.returncode == 0, made.stderr
        with environment({"TALLY_BOOKIE_GC_WAIT_TIME": "1"}):
            cluster.start(4)
        shapes = run(write_shapes(cluster), DEADLINE)
        for bookie in cluster.bookies:
            bookie.stop()
        wiped = tally("cluster", "nuke", "--metadata", uri, "--force", timeout=60)
        assert wiped.returncode == 0, wiped.stderr
        exports = tmp_path / "exports"
        for bookie in cluster.bookies:
            exported = tally(
                "cluster", "export-bookie", "--data-dir", str(bookie.data_dir),
                "--out", str(exports), timeout=120,
            )  # fmt: skip
            assert exported.returncode == 0, exported.stderr
        applied = tally(
            "cluster", "recover", "--metadata", uri, "--exports", str(exports),
            "--report", str(tmp_path / "report"), "--master", "local[2]", "--apply",
            timeout=RECOVER_TIMEOUT,
        )  # fmt: skip
        # The bookies are stopped: the open ledger's recovery waits for them.
        assert applied.returncode == 1, applied.stderr + applied.stdout
        assert "run again once their bookies answer" in applied.stderr
        assert "Traceback" not in applied.stderr
        summary = json.loads((tmp_path / "report" / "summary.json").read_text())
        assert summary["ledgers"]["exact"] == len(shapes.written) + 1, summary
        assert summary["ledgers"]["deleted"] == 1, summary
        cluster.restart([bookie.address for bookie in cluster.bookies])

        async def again() -> Applied:
            async with store_session(uri) as store:
                return await apply_recovery(store, tmp_path / "report")

        finished = run(again(), DEADLINE)
        assert (finished.ledgers_written, finished.recovered) == (0, 1), finished
        run(check_recovered(cluster, shapes), DEADLINE)
    finally:
        cluster.shutdown()
        zookeeper.stop()


def rows_of(exports: Path) -> list[dict[str, object]]:
    rows = [row for path in export_files(exports) for row in pq.read_table(path).to_pylist()]
    return sorted(
        rows, key=lambda row: (row["bookie_id"], row["kind"], row["scope"], row["ledger_id"])
    )


@dataclass
class Taken:
    """What the snapshot test wrote, around the snapshot."""

    old: Written
    """In the store, written without copies (an older tally's bookies): only the snapshot
    has its metadata."""
    grown: Written
    """Open at the snapshot; then an ensemble change and a close (the bookies' copies)."""
    empty: Written
    """Closed with no entries: no bookie holds any of it."""
    doomed: LedgerId
    """In the snapshot, deleted after it."""
    later: Written
    """Created after the snapshot."""


async def write_around_a_snapshot(cluster: Cluster, snapshot: Path) -> Taken:
    async with store_session(cluster.uri) as store:
        await write_settings(
            store, ClusterSettings(ledger_delete_retention=0, tombstone_retention=7_777)
        )
    async with Client(cluster.uri, config=CONFIG) as client:
        ledgers = client.context.ledgers
        created = await client.create_ledger(
            ensemble_size=3, write_quorum=2, password=PASSWORD, custom_metadata={"app": b"old"}
        )  # no add through the writer: no copy on any bookie
        ensemble = list(created.metadata.metadata.segments[0].ensemble)
        entries = [b"before copies %d" % n for n in range(12)]
        length = await add_without_copies(ensemble, created.ledger_id, entries, DigestType.CRC32C)
        closed = await ledgers.update(
            created.ledger_id, lambda metadata: metadata.close(len(entries) - 1, length)
        )
        old = Written(created.ledger_id, entries, closed.metadata)

        grown = await client.create_ledger(ensemble_size=3, write_quorum=2, password=PASSWORD)
        grown_entries = await append_all(grown, 6, "grown")
        empty = await client.create_ledger(ensemble_size=3, write_quorum=2, password=PASSWORD)
        await empty.close()
        doomed = await client.create_ledger(ensemble_size=3, write_quorum=2, password=PASSWORD)
        await append_all(doomed, 4, "doomed")
        await doomed.close()

        taken = await asyncio.to_thread(
            tally, "audit", "snapshot", "--metadata", cluster.uri, "--out", str(snapshot),
            timeout=120,
        )  # fmt: skip
        assert taken.returncode == 0, taken.stderr

        gone = grown.metadata.metadata.segments[0].ensemble[0]
        await asyncio.to_thread(cluster.kill, gone)
        grown_entries += await append_all(grown, 6, "grown later")
        await grown.close()
        await asyncio.to_thread(cluster.restart, [gone])
        await client.delete_ledger(doomed.ledger_id)
        later = await client.create_ledger(ensemble_size=3, write_quorum=2, password=PASSWORD)
        later_entries = await append_all(later, 5, "later")
        await later.close()

        async def now(ledger_id: LedgerId) -> LedgerMetadata:
            return (await ledgers.read_ledger_metadata(ledger_id)).metadata

        return Taken(
            old,
            Written(grown.ledger_id, grown_entries, await now(grown.ledger_id)),
            Written(empty.ledger_id, [], await now(empty.ledger_id)),
            doomed.ledger_id,
            Written(later.ledger_id, later_entries, await now(later.ledger_id)),
        )


@pytest.mark.timeout(600)
def test_a_lost_store_is_rebuilt_from_a_snapshot_and_the_bookies(
    cluster: Cluster, tmp_path: Path
) -> None:
    """`--from-snapshot`: the snapshot's metadata where the bookies hold no copy (data
    written before copies, an empty ledger), the bookies' copies where they are newer (a
    later segment and close, a ledger created after), its tombstones and the bookies' where
    a ledger was deleted after it, and its cluster settings."""
    snapshot, report = tmp_path / "snapshot", tmp_path / "report"
    taken = run(write_around_a_snapshot(cluster, snapshot), DEADLINE)

    async def obeyed() -> bool:
        async with store_session(cluster.uri) as store:
            found = await read_tombstone(store, taken.doomed)
        return found is None or not found.tombstone.pending

    run(until(obeyed, "the bookies obeyed the tombstone", timeout=30), DEADLINE)
    lose_the_store(cluster)
    _, summary = recover_from_the_bookies(cluster, report, "--from-snapshot", str(snapshot))
    assert summary["ledgers"] == {
        "exact": 4,
        "inferred": 0,
        "deleted": 1,
        "not_recoverable": 0,
    }, summary
    assert summary["needs_recovery"] == 0
    decisions = {
        LedgerId(from_int64(row["scope"]), from_int64(row["ledger_id"])): row["reason"]
        for row in pq.read_table(report / "ledgers").to_pylist()
    }
    assert decisions[taken.old.ledger_id] == FROM_SNAPSHOT
    assert decisions[taken.empty.ledger_id].startswith(FROM_SNAPSHOT)
    assert decisions[taken.grown.ledger_id] == ""
    for bookie in cluster.bookies:
        bookie.stop()
    cluster.restart([bookie.address for bookie in cluster.bookies])

    async def check() -> None:
        async with Client(cluster.uri, config=CONFIG) as client:
            for record in (taken.old, taken.grown, taken.empty, taken.later):
                found = await client.context.ledgers.read_ledger_metadata(record.ledger_id)
                assert found.metadata == record.metadata, record
                if record.entries:
                    reader = await client.open_ledger(record.ledger_id, password=PASSWORD)
                    got = await read_all(reader)
                    assert [got[n] for n in range(len(record.entries))] == record.entries
            with pytest.raises(NoSuchLedger):
                await client.open_ledger(taken.doomed, password=PASSWORD)
        async with store_session(cluster.uri) as store:
            settings = await read_settings(store)
        assert (settings.ledger_delete_retention, settings.tombstone_retention) == (0, 7_777)

    run(check(), DEADLINE)


def recover_from_edited_snapshot(
    cluster: Cluster, tmp_path: Path, edit: Callable[[dict[str, Any]], None]
) -> subprocess.CompletedProcess[str]:
    """`tally cluster recover --from-snapshot` with a snapshot of the cluster whose
    snapshot.json `edit` changed, and the exports of one bookie."""
    snapshot = tmp_path / "snapshot"
    taken = tally("audit", "snapshot", "--metadata", cluster.uri, "--out", str(snapshot))
    assert taken.returncode == 0, taken.stderr
    recorded = json.loads((snapshot / "snapshot.json").read_text())
    edit(recorded)
    (snapshot / "snapshot.json").write_text(json.dumps(recorded))
    exports = tmp_path / "exports"
    bookie = cluster.bookies[0]
    run(export_running_bookie(bookie.address, export_path(exports, bookie.address)))
    return tally(
        "cluster", "recover", "--exports", str(exports), "--from-snapshot", str(snapshot),
        "--report", str(tmp_path / "report"),
    )  # fmt: skip


def test_a_snapshot_of_another_cluster_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    def of_another_cluster(recorded: dict[str, Any]) -> None:
        recorded["cluster"]["instance_id"] = "another-cluster"

    refused = recover_from_edited_snapshot(cluster, tmp_path, of_another_cluster)
    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    assert "is of cluster another-cluster" in refused.stderr, refused.stderr
    assert not (tmp_path / "report" / "ledgers").exists()


def test_a_snapshot_with_undecodable_records_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    """Its unreadable tombstone would read as no deletion: the recovery decides nothing."""

    def with_an_unreadable_tombstone(recorded: dict[str, Any]) -> None:
        recorded["counts"]["unreadable_tombstones"] = 1

    refused = recover_from_edited_snapshot(cluster, tmp_path, with_an_unreadable_tombstone)
    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    assert "1 tombstone records that did not decode" in refused.stderr, refused.stderr
    assert not (tmp_path / "report" / "ledgers").exists()
