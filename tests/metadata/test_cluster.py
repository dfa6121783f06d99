"""Cluster init / require / nuke on every backend."""

from __future__ import annotations

import asyncio

import pytest

from tally.core.errors import BadRequest, ClusterNotInitialised, IllegalOperation, MalformedData
from tally.core.ids import LedgerId
from tally.metadata import cluster
from tally.metadata.bookie_registry import BookieInfo, BookieRegistry
from tally.metadata.cluster import (
    LAYOUT_VERSION,
    ClusterInfo,
    init_cluster,
    nuke_cluster,
    read_cluster,
    require_cluster,
)
from tally.metadata.cookies import Cookie, CookieManager
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.paths import CLUSTER, LEDGERS, ROOTS
from tally.metadata.underreplication import UnderReplicationManager
from tests.metadata.conftest import Backend
from tests.metadata.service_support import sample_metadata

INFO = BookieInfo("127.0.0.1:3181", None, "0.1.0", 0)


async def test_init_creates_the_record_and_every_root_once(backend: Backend) -> None:
    async with backend.open() as store:
        first = await init_cluster(store, now_ms=1234)
        assert first.created
        assert first.info.layout_version == LAYOUT_VERSION
        assert first.info.created_ms == 1234
        assert all(found is not None for found in await store.get_many(list(ROOTS)))
        again = await init_cluster(store)
        assert not again.created
        assert again.info == first.info
        assert await require_cluster(store) == first.info


async def test_concurrent_inits_agree_on_one_cluster(backend: Backend) -> None:
    async with backend.open() as a, backend.open() as b, backend.open() as c:
        results = await asyncio.gather(*(init_cluster(s) for s in (a, b, c, a, b, c)))
        assert sum(result.created for result in results) == 1
        assert len({result.info for result in results}) == 1


async def test_init_completes_a_store_that_has_only_some_roots(backend: Backend) -> None:
    async with backend.open() as store:
        await store.create(LEDGERS)
        await store.create(LEDGERS + "/0000")
        assert (await init_cluster(store)).created
        assert await store.children(LEDGERS) == ["0000"]
        assert all(found is not None for found in await store.get_many(list(ROOTS)))


async def test_an_uninitialised_store_names_the_command_to_run(backend: Backend) -> None:
    async with backend.open() as store:
        assert await read_cluster(store) is None
        with pytest.raises(ClusterNotInitialised, match="run `tally cluster init --metadata"):
            await require_cluster(store)
        with pytest.raises(ClusterNotInitialised, match=f"--metadata {backend.uri}`"):
            await require_cluster(store, uri=backend.uri)


async def test_a_newer_layout_or_a_corrupt_record_is_refused(backend: Backend) -> None:
    async with backend.open() as store:
        newer = ClusterInfo("id", LAYOUT_VERSION + 1, 0)
        await store.create(CLUSTER, newer.to_bytes())
        with pytest.raises(IllegalOperation, match="upgrade tally"):
            await require_cluster(store)
        await store.set(CLUSTER, b"\x00")
        with pytest.raises(MalformedData, match="cluster record /cluster"):
            await require_cluster(store)


async def test_nuke_is_guarded_by_the_instance_id_and_running_bookies(backend: Backend) -> None:
    async with backend.open() as store, backend.open() as bookie:
        with pytest.raises(ClusterNotInitialised):
            await nuke_cluster(store, instance_id="anything")
        info = (await init_cluster(store)).info
        with pytest.raises(BadRequest, match="instance id"):
            await nuke_cluster(store, instance_id="another-cluster")
        await BookieRegistry(bookie).register("b1", INFO)
        with pytest.raises(IllegalOperation, match=r"bookies \['b1'\] are registered"):
            await nuke_cluster(store, instance_id=info.instance_id)
        assert await require_cluster(store) == info
        await bookie.close()
        assert await nuke_cluster(store, instance_id=info.instance_id) == len(ROOTS) + 1
        assert await store.children("/") == []


async def test_a_forced_nuke_wipes_everything_and_a_new_init_is_a_new_cluster(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "NUKE_BATCH", 3)
    async with backend.open() as store, backend.open() as bookie:
        old = (await init_cluster(store)).info
        manager = LedgerManager(store)
        for ledger_id in [await manager.generate_ledger_id() for _ in range(7)] + [
            LedgerId.from_uuid()
        ]:
            await manager.create_ledger_metadata(ledger_id, sample_metadata())
        await BookieRegistry(bookie).register("b1", INFO)
        await CookieManager(store).put(Cookie.new("b1", ["/d"], old.instance_id), None)
        await UnderReplicationManager(store).mark_under_replicated(LedgerId.classic(3), ["b1"])
        await store.create("/unrelated", b"not tally's")
        deleted = await nuke_cluster(store, force=True)
        assert deleted > 7 + len(ROOTS)
        assert await store.children("/") == ["unrelated"]
        assert await nuke_cluster(store, force=True) == 0
        new = (await init_cluster(store)).info
        assert new.instance_id != old.instance_id
        assert await LedgerManager(store).generate_ledger_id() == LedgerId.classic(1)
        assert [page async for page in LedgerManager(store).ledger_pages()] == []
