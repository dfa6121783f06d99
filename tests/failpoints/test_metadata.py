"""metadata.cas: every compare-and-set of the metadata store (a versioned set or delete, a
transaction with a versioned op), in every backend, fails with a store error and changes
nothing; and the client operations built on it (a writer's close, a recovery, an ensemble
change) are reported failed with the metadata as it was, or, for a recovery whose close
fails, IN_RECOVERY as designed. The ledger's entries are all there for the recovery that
closes it once the store works again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tally
from tally.client.config import ClientConfig
from tally.core.errors import MetadataStoreError
from tally.core.ledger_metadata import LedgerState
from tally.failpoints import enabled
from tally.metadata.store import CheckVersion, Create, Delete, SetData
from tests.failpoints.conftest import PASSWORD, in_process_cluster, payload
from tests.metadata.conftest import Backend, make_backend, zookeeper

__all__ = ["zookeeper"]  # the fixture, for the zk backend

CLIENT = ClientConfig(
    add_entry_timeout=2.0, read_timeout=2.0, speculative_read_timeout=0.5, session_timeout=5.0
)
FAILED = r"compare-and-set failed: .*failpoint metadata\.cas"


@pytest.fixture(params=["memory", "sqlite", "zk"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, request, tmp_path)


async def test_every_compare_and_set_fails_and_changes_nothing(backend: Backend) -> None:
    async with backend.open() as store:
        await store.create("/k", b"v0")
        with enabled("metadata.cas", "error") as point:
            with pytest.raises(MetadataStoreError, match=FAILED):
                await store.set("/k", b"v1", 0)
            with pytest.raises(MetadataStoreError, match=FAILED):
                await store.delete("/k", 0)
            with pytest.raises(MetadataStoreError, match=FAILED):
                await store.transaction([SetData("/k", b"v2", 0), Create("/other")])
            with pytest.raises(MetadataStoreError, match=FAILED):
                await store.transaction([CheckVersion("/k", 0), Delete("/k")])
            found = await store.get("/k")
            assert (found.data, found.version) == (b"v0", 0)
            assert await store.exists("/other") is None
            assert point.hits == 4
            # Writes without a version are no compare-and-set: they pass.
            await store.set("/k", b"v3")
            await store.transaction([Create("/other"), SetData("/k", b"v4")])
            assert point.hits == 4
        assert (await store.get("/k")).data == b"v4"


async def test_a_close_and_a_recovery_that_cannot_write_change_nothing(tmp_path: Path) -> None:
    async with (
        in_process_cluster(tmp_path, 3) as cluster,
        tally.Client(cluster.uri, config=CLIENT) as client,
    ):
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
        )
        data = [payload(writer.ledger_id, e, 100) for e in range(10)]
        await asyncio.gather(*(writer.append_nowait(d) for d in data))
        before = await client.context.ledgers.read_ledger_metadata(writer.ledger_id)
        with enabled("metadata.cas", "error"):
            with pytest.raises(MetadataStoreError, match=FAILED):
                await writer.close()
            with pytest.raises(MetadataStoreError, match=FAILED):
                await client.open_ledger(writer.ledger_id, password=PASSWORD)
            after = await client.context.ledgers.read_ledger_metadata(writer.ledger_id)
            assert (after.metadata, after.version) == (before.metadata, before.version)
            assert after.metadata.state is LedgerState.OPEN
        # A recovery whose close cannot be written leaves the ledger IN_RECOVERY, for a
        # later recovery to close: fenced, its end not decided.
        with enabled("metadata.cas", "1*off->error") as point:
            with pytest.raises(MetadataStoreError, match=FAILED):
                await client.open_ledger(writer.ledger_id, password=PASSWORD)
            assert point.hits == 2
            after = await client.context.ledgers.read_ledger_metadata(writer.ledger_id)
            assert after.metadata.state is LedgerState.IN_RECOVERY
            assert after.metadata.segments == before.metadata.segments
        reader = await client.open_ledger(writer.ledger_id, password=PASSWORD)
        assert reader.last_entry_id == 9
        assert [e.data async for e in reader.read(0, 9)] == data


async def test_an_ensemble_change_that_cannot_write_stops_the_writer_and_changes_nothing(
    tmp_path: Path,
) -> None:
    async with (
        in_process_cluster(tmp_path, 4) as cluster,
        tally.Client(cluster.uri, config=CLIENT) as client,
    ):
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
        )
        data = {e: payload(writer.ledger_id, e, 100) for e in range(10)}
        await asyncio.gather(*(writer.append_nowait(d) for d in data.values()))
        before = await client.context.ledgers.read_ledger_metadata(writer.ledger_id)
        await cluster.stop(before.metadata.segments[0].ensemble[1])
        with enabled("metadata.cas", "error") as point:
            more = {e: payload(writer.ledger_id, e, 100) for e in range(10, 13)}
            results = await asyncio.gather(
                *(writer.append_nowait(d) for d in more.values()), return_exceptions=True
            )
            assert point.hits == 1, "one ensemble change tried"
            failures = [r for r in results if isinstance(r, BaseException)]
            assert failures, "an entry of the stopped bookie's could not be confirmed"
            assert all(isinstance(f, MetadataStoreError) for f in failures), failures
            data.update({e: d for e, d in more.items() if results[e - 10] == e})
            after = await client.context.ledgers.read_ledger_metadata(writer.ledger_id)
            assert (after.metadata, after.version) == (before.metadata, before.version)
        reader = await client.open_ledger(writer.ledger_id, password=PASSWORD)
        assert reader.last_entry_id >= max(data)
        read = {e.entry_id: e.data async for e in reader.read(0, reader.last_entry_id)}
        assert {e: read[e] for e in data} == data
