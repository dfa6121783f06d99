"""Bookies keep a copy of each ledger's metadata (issue 18), with real bookie processes: the
writer gives each bookie of a segment the copy of that segment ahead of its adds, and the
closed metadata to the last segment's bookies; a recovery closing a ledger does the same.
What each bookie kept is read from its index once it has stopped (a checkpoint)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tally.bookie.index import Index
from tally.client.client import Client
from tally.client.config import ClientConfig
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tests.support.cluster import Cluster, running_cluster

PASSWORD = b"copies"
CONFIG = ClientConfig(add_entry_timeout=2.0, read_timeout=1.5, session_timeout=5.0)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path, 4) as found:
        yield found


def copies_kept(cluster: Cluster, ledger_id: LedgerId) -> dict[str, LedgerMetadata]:
    """What each stopped bookie kept of the ledger's metadata."""
    kept = {}
    for bookie in cluster.bookies:
        index = Index.open_read_only(bookie.data_dir / "ledgers" / "index")
        try:
            copy = index.metadata_copy(ledger_id)
        finally:
            index.close()
        if copy is not None:
            kept[bookie.address] = LedgerMetadata.from_bytes(copy, ledger_id)
    return kept


async def test_each_bookie_keeps_the_copy_of_the_latest_segment_it_is_in(
    cluster: Cluster,
) -> None:
    async with Client(cluster.uri, config=CONFIG) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
        )
        for entry_id in range(10):
            await writer.append(b"entry %d" % entry_id)
        first = writer.metadata.metadata
        gone = first.segments[0].ensemble[0]
        await asyncio.to_thread(cluster.kill, gone)
        for entry_id in range(10, 20):
            await writer.append(b"entry %d" % entry_id)
        await writer.close()
        closed = (await client.context.ledgers.read_ledger_metadata(writer.ledger_id)).metadata
    assert len(closed.segments) == 2
    await asyncio.to_thread(cluster.restart, [gone])  # its copy is in its journal: replayed
    for bookie in cluster.bookies:
        await asyncio.to_thread(bookie.stop)
    kept = copies_kept(cluster, writer.ledger_id)
    for bookie in closed.segments[-1].ensemble:
        assert kept[bookie] == closed, bookie
    assert kept[gone] == first, "killed in the first segment: that segment's copy, journaled"
    in_first_only = set(first.segments[0].ensemble) - set(closed.segments[-1].ensemble) - {gone}
    for bookie in in_first_only:
        assert kept[bookie].segments == first.segments
    assert all(copy.master_key == closed.master_key for copy in kept.values())


async def test_a_recovery_gives_the_closed_copy_to_the_last_segment(cluster: Cluster) -> None:
    async with Client(cluster.uri, config=CONFIG) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        for entry_id in range(5):
            await writer.append(b"entry %d" % entry_id)
        ledger_id = writer.ledger_id
    async with Client(cluster.uri, config=CONFIG) as recovering:
        reader = await recovering.open_ledger(ledger_id, password=PASSWORD)
        closed = reader.metadata
        assert closed.state is LedgerState.CLOSED
    for bookie in cluster.bookies:
        await asyncio.to_thread(bookie.stop)
    kept = copies_kept(cluster, ledger_id)
    assert {bookie: kept[bookie] for bookie in closed.segments[-1].ensemble} == dict.fromkeys(
        closed.segments[-1].ensemble, closed
    )
