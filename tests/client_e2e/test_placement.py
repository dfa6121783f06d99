"""Placement on real bookies: two racks of two bookies each, ledgers of E=2 WQ=2 whose one
write set must hold both racks, from the create through an ensemble change."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import tally
from tally.metadata.bookie_registry import BookiePlacement, BookieRegistry
from tests.client_e2e.conftest import FAST, Cluster, running_cluster, store_session
from tests.client_e2e.writer_worker import payload

BOOKIES = 4
LEDGERS = 4
PASSWORD = b"placement"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("placement"), BOOKIES) as cluster:
        yield cluster


async def test_an_ensemble_change_keeps_the_write_set_on_both_racks(healthy: Cluster) -> None:
    cluster = healthy
    racks = {b.address: f"/r{i // 2}" for i, b in enumerate(cluster.bookies)}
    async with store_session(cluster.uri) as store:
        for bookie, rack in racks.items():
            await BookieRegistry(store).set_placement(bookie, BookiePlacement(rack, "/zone"))
    async with tally.Client(cluster.uri, config=FAST) as client:
        writers = [
            await client.create_ledger(
                ensemble_size=2, write_quorum=2, ack_quorum=2, password=PASSWORD
            )
            for _ in range(LEDGERS)
        ]
        for writer in writers:
            ensemble = writer.metadata.metadata.segments[0].ensemble
            assert {racks[b] for b in ensemble} == {"/r0", "/r1"}, ensemble
        victim = writers[0].metadata.metadata.segments[0].ensemble[0]
        twin = next(b for b in racks if racks[b] == racks[victim] and b != victim)
        cluster.kill(victim)
        for number, writer in enumerate(writers):
            for entry_id in range(5):
                await writer.append(payload(number, entry_id))
        for writer in writers:
            first, *changed = writer.metadata.metadata.segments
            expected = [tuple(twin if b == victim else b for b in first.ensemble)]
            if victim not in first.ensemble:
                expected = []
            assert [segment.ensemble for segment in changed] == expected
            await writer.close()
