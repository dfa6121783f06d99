"""`confirm` against real bookie processes: a finding that still holds is kept (entries really
deleted behind a bookie's back, data of a ledger whose metadata went behind the delete
path's back still on a bookie, a tombstoned ledger's data still on a bookie past
deletion_stuck_after, a mark left too long, a registered bookie that does not answer); one
that no longer holds is dropped (the ledger repaired or deleted since, the data of a deleted
ledger that is DELETED or has a tombstone, a bookie that dropped a tombstoned ledger, the
mark gone, the bookie back)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tally
from tally.audit import schema
from tally.audit.confirm import CONFIRMED, CONFIRMED_JSON, confirm
from tally.bookie.ledger_directories import LedgerDirectories
from tally.core.deletion import ClusterSettings
from tally.core.ids import LedgerId
from tally.core.ledger_audit import VIOLATION_CATEGORIES, Category
from tally.core.ledger_metadata import LedgerMetadata
from tally.metadata.bookie_registry import BookiePlacement
from tally.metadata.cluster_settings import write_settings
from tally.metadata.paths import LEDGER_METADATA
from tally.metadata.underreplication import UnderReplicationManager
from tests.audit.test_snapshot import NO_GC, fake_bookie
from tests.support.cluster import Cluster, running_cluster, store_session
from tests.support.processes import environment

BOOKIES = 3
ENTRIES = 20
LOST = range(3, 8)
HOUR_MS = 3_600_000
CONFIG = tally.ClientConfig(explicit_lac_interval=0)
GHOST = LedgerId(0, 10**12)
"""Never created: a bookie reported holding it, which holds nothing of it now."""

NAMES = (
    "damaged",
    "damaged_unjudged",
    "wiped",
    "healthy",
    "unjudged",
    "deleted",
    "orphan",
    "marked_long_ago",
    "unmarked",
    "tombstoned",
    "stuck",
    "stuck_dropped",
)
TOMBSTONED = ("tombstoned", "stuck", "stuck_dropped")
"""Deleted with no retention: tombstones, whose bookies (no garbage collection runs) still
hold their data, and deletion_stuck at once (deletion_stuck_after 0)."""


class Ledgers(dict[str, LedgerId]):
    """The test's ledgers by role, with their metadata at the start."""

    metadata: dict[str, LedgerMetadata]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with environment(NO_GC), running_cluster(tmp_path_factory.mktemp("confirm"), BOOKIES) as c:
        yield c


@pytest.fixture(scope="module")
def ledgers(cluster: Cluster) -> Ledgers:
    """E=WQ=3 ledgers; behind one bookie's back, the damaged ones lose entries 3..7 and the
    wiped and stuck_dropped ones are deleted whole (the bookie then knows nothing of them)."""
    found = asyncio.run(_write(cluster))
    victim = found.metadata["damaged"].segments[0].ensemble[0]
    bookie = cluster.bookie(victim)
    bookie.stop()
    storage = LedgerDirectories([bookie.data_dir / "ledgers"], bookie.data_dir / "journal")
    try:  # its index and its placement record: a ledger only the placement knows is in limbo
        for name in ("damaged", "damaged_unjudged"):
            assert storage.forget_entries(found[name], LOST) == len(LOST)
        storage.delete_ledger(found["wiped"])
        storage.delete_ledger(found["stuck_dropped"])
    finally:
        storage.close()
    cluster.restart([victim])
    return found


async def _write(cluster: Cluster) -> Ledgers:
    found = Ledgers()
    found.metadata = {}
    async with tally.Client(cluster.uri, config=CONFIG) as client:
        for number, bookie in enumerate(cluster.bookies):  # placement holds: one rack each
            placement = BookiePlacement(f"/rack-{number}", "/zone")
            await client.context.registry.set_placement(bookie.address, placement)
        for name in NAMES:
            scope = 2**63 + 1 if name == "damaged" else None  # an id with the sign bit
            writer = await client.create_ledger(
                ensemble_size=3, write_quorum=3, ack_quorum=2, scope=scope
            )
            for i in range(ENTRIES):
                await writer.append(b"%s %d" % (name.encode(), i))
            await writer.close()
            found[name] = writer.ledger_id
            found.metadata[name] = writer.metadata.metadata
        store = client.context.ledgers.store
        await client.delete_ledger(found["deleted"])  # DELETED: within its retention
        await store.delete(LEDGER_METADATA.path(found["orphan"]))  # behind the delete path
        await write_settings(
            store, ClusterSettings(ledger_delete_retention=0, deletion_stuck_after=0)
        )
        for name in TOMBSTONED:
            await client.delete_ledger(found[name])
        marks = UnderReplicationManager(store)
        now_ms = int(time.time() * 1000)
        await marks.mark_under_replicated(
            found["marked_long_ago"], ["gone"], now_ms=now_ms - 2 * HOUR_MS
        )
    return found


def _row(
    ledger: LedgerId | None,
    category: Category,
    *,
    segment: int | None = None,
    bookie: str | None = None,
    missing: int | None = None,
) -> dict[str, Any]:
    return {
        "scope": None if ledger is None else schema.to_int64(ledger.scope),
        "ledger_id": None if ledger is None else schema.to_int64(ledger.id),
        "category": category.value,
        "segment_index": segment,
        "bookie_id": bookie,
        "missing_count": missing,
        "detail": "as the checks reported it",
    }


def _report(path: Path, rows: list[dict[str, Any]], summary: dict[str, Any]) -> Path:
    (path / schema.VIOLATIONS).mkdir(parents=True)
    table = pa.Table.from_pylist(rows, schema=schema.VIOLATIONS_SCHEMA)
    pq.write_table(table, path / schema.VIOLATIONS / "part-00000.parquet")
    (path / schema.SUMMARY_JSON).write_text(json.dumps(summary))
    return path


def _findings(cluster: Cluster, ledgers: Ledgers, fake: str) -> list[dict[str, Any]]:
    victim = ledgers.metadata["damaged"].segments[0].ensemble[0]
    holder = ledgers.metadata["orphan"].segments[0].ensemble[1]
    answering = next(b.address for b in cluster.bookies if b.address != victim)
    return [
        _row(
            ledgers["damaged"],
            Category.BELOW_WRITE_QUORUM,
            segment=0,
            bookie=victim,
            missing=len(LOST),
        ),
        _row(ledgers["damaged_unjudged"], Category.POTENTIALLY_FAULTY, bookie=victim),
        _row(ledgers["wiped"], Category.BELOW_WRITE_QUORUM, segment=0, bookie=victim, missing=1),
        _row(ledgers["healthy"], Category.BELOW_WRITE_QUORUM, segment=0, bookie=victim, missing=1),
        _row(ledgers["healthy"], Category.ORPHAN_DATA, bookie=victim),
        _row(ledgers["healthy"], Category.DELETION_STUCK, bookie=victim),
        _row(ledgers["unjudged"], Category.POTENTIALLY_FAULTY, bookie=victim),
        _row(ledgers["deleted"], Category.NO_REPLICA, segment=0, bookie=victim, missing=1),
        _row(ledgers["deleted"], Category.ORPHAN_DATA, bookie=holder),
        _row(ledgers["orphan"], Category.ORPHAN_DATA, bookie=holder),
        _row(GHOST, Category.ORPHAN_DATA, bookie=holder),
        _row(ledgers["tombstoned"], Category.ORPHAN_DATA, bookie=holder),
        _row(ledgers["stuck"], Category.DELETION_STUCK, bookie=holder, missing=ENTRIES),
        _row(ledgers["stuck_dropped"], Category.DELETION_STUCK, bookie=victim, missing=ENTRIES),
        _row(ledgers["marked_long_ago"], Category.UNDERREPLICATED_TOO_LONG),
        _row(ledgers["unmarked"], Category.UNDERREPLICATED_TOO_LONG),
        _row(None, Category.UNRESPONSIVE_REGISTERED_BOOKIE, bookie=fake),
        _row(None, Category.UNRESPONSIVE_REGISTERED_BOOKIE, bookie=answering),
        _row(None, Category.UNRESPONSIVE_REGISTERED_BOOKIE, bookie="10.9.9.9:3181"),
    ]


def test_confirm_keeps_what_still_holds_and_drops_what_changed(
    cluster: Cluster, ledgers: Ledgers, tmp_path: Path
) -> None:
    progress: list[tuple[str, int, int | None]] = []

    async def run() -> tuple[str, dict[str, Any]]:
        async with fake_bookie(cluster.uri, "absent") as fake:
            report = _report(tmp_path / "report", _findings(cluster, ledgers, fake), {})
            result = await confirm(
                report, cluster.uri, progress=lambda *args: progress.append(args)
            )
            return fake, result

    fake, result = asyncio.run(run())
    report = tmp_path / "report"
    assert json.loads((report / CONFIRMED_JSON).read_text()) == result
    counts = {category.value: 0 for category in VIOLATION_CATEGORIES}
    counts |= {
        "below_write_quorum": 3,
        "orphan_data": 1,
        "deletion_stuck": 1,
        "underreplicated_too_long": 1,
        "unresponsive_registered_bookie": 1,
    }
    assert result == {"confirmed": 7, "dropped": 13, "categories": counts}
    assert progress[-1] == ("confirm", 16, 16), "13 ledgers and 3 bookies"

    table = pq.read_table(report / CONFIRMED)
    assert table.schema.remove_metadata() == schema.VIOLATIONS_SCHEMA
    rows = table.to_pylist()
    found = {
        (
            None
            if row["ledger_id"] is None
            else LedgerId(schema.from_int64(row["scope"]), schema.from_int64(row["ledger_id"])),
            row["category"],
            row["segment_index"],
            row["bookie_id"],
            row["missing_count"],
        )
        for row in rows
    }
    victim = ledgers.metadata["damaged"].segments[0].ensemble[0]
    holder = ledgers.metadata["orphan"].segments[0].ensemble[1]
    assert found == {
        (ledgers["damaged"], "below_write_quorum", 0, victim, len(LOST)),
        (ledgers["damaged_unjudged"], "below_write_quorum", 0, victim, len(LOST)),
        (ledgers["wiped"], "below_write_quorum", 0, victim, ENTRIES),
        (ledgers["orphan"], "orphan_data", None, holder, ENTRIES),
        (ledgers["stuck"], "deletion_stuck", None, holder, ENTRIES),
        (ledgers["marked_long_ago"], "underreplicated_too_long", None, None, None),
        (None, "unresponsive_registered_bookie", None, fake, None),
    }
    assert all(row["detail"] != "as the checks reported it" for row in rows), "fresh rows"


def test_a_tombstone_younger_than_the_cluster_s_threshold_now_is_not_stuck(
    cluster: Cluster, ledgers: Ledgers, tmp_path: Path
) -> None:
    """deletion_stuck_after is read from the store at confirmation: raised to a day, the
    tombstone of a moment ago is no longer stuck, though its bookie still holds its data."""
    holder = ledgers.metadata["stuck"].segments[0].ensemble[1]
    finding = [_row(ledgers["stuck"], Category.DELETION_STUCK, bookie=holder, missing=ENTRIES)]
    report = _report(tmp_path / "report", finding, {})

    async def settings(stuck_after: int) -> None:
        async with store_session(cluster.uri) as store:
            await write_settings(
                store,
                ClusterSettings(ledger_delete_retention=0, deletion_stuck_after=stuck_after),
            )

    asyncio.run(settings(86_400))
    try:
        result = asyncio.run(confirm(report, cluster.uri))
    finally:
        asyncio.run(settings(0))
    assert (result["confirmed"], result["dropped"]) == (0, 1)
    assert asyncio.run(confirm(report, cluster.uri))["confirmed"] == 1


def test_the_grace_period_the_checks_used_is_the_one_confirmed_against(
    cluster: Cluster, ledgers: Ledgers, tmp_path: Path
) -> None:
    """Marked two hours ago: too long for a one-hour grace period, not for a three-hour one
    (recorded in summary.json, or given)."""
    finding = [_row(ledgers["marked_long_ago"], Category.UNDERREPLICATED_TOO_LONG)]
    for name, recorded, given, kept in (
        ("recorded", {"params": {"grace_period_ms": 3 * HOUR_MS}}, None, 0),
        ("given", {"params": {"grace_period_ms": 3 * HOUR_MS}}, HOUR_MS, 1),
        ("default", {}, None, 1),
    ):
        report = _report(tmp_path / name, finding, recorded)
        result = asyncio.run(confirm(report, cluster.uri, grace_period_ms=given))
        assert result["confirmed"] == kept, name
        assert result["dropped"] == 1 - kept, name
        assert pq.read_table(report / CONFIRMED).num_rows == kept


def test_confirming_again_replaces_the_previous_confirmation(
    cluster: Cluster, ledgers: Ledgers, tmp_path: Path
) -> None:
    report = _report(
        tmp_path / "report",
        [_row(ledgers["damaged"], Category.BELOW_WRITE_QUORUM, segment=0, missing=len(LOST))],
        {},
    )
    for _ in range(2):
        assert asyncio.run(confirm(report, cluster.uri))["confirmed"] == 1
        assert pq.read_table(report / CONFIRMED).num_rows == 1


def test_a_ledger_the_snapshot_could_not_judge_is_judged_on_its_live_metadata(
    cluster: Cluster, ledgers: Ledgers, tmp_path: Path
) -> None:
    """invalid_metadata: the snapshot's rows made no valid ledger; the store's metadata does,
    so the ledger is judged afresh as a whole, as a potentially faulty one is."""
    report = _report(
        tmp_path / "report",
        [
            _row(ledgers["damaged"], Category.INVALID_METADATA),
            _row(ledgers["healthy"], Category.INVALID_METADATA),
        ],
        {},
    )
    result = asyncio.run(confirm(report, cluster.uri))
    victim = ledgers.metadata["damaged"].segments[0].ensemble[0]
    rows = pq.read_table(report / CONFIRMED).to_pylist()
    assert [(r["ledger_id"], r["category"], r["bookie_id"]) for r in rows] == [
        (schema.to_int64(ledgers["damaged"].id), "below_write_quorum", victim)
    ]
    assert (result["confirmed"], result["dropped"]) == (1, 2)
