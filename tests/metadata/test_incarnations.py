"""The incarnations the auditor remembers, and the cookies' incarnations it compares them with."""

from __future__ import annotations

import pytest

from tally.core.errors import KeyExists, MetadataVersionConflict
from tally.metadata.cluster import init_cluster
from tally.metadata.cookies import Cookie, CookieManager
from tally.metadata.incarnations import RememberedIncarnation, RememberedIncarnations
from tally.metadata.paths import INCARNATIONS, cookie_path, incarnation_path
from tests.metadata.conftest import Backend
from tests.support.polling import until


async def test_remember_then_replace_by_version(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        memory = RememberedIncarnations(store)
        assert await memory.all() == {}
        await memory.remember("b1", "inc-1", expected_version=None, now_ms=5)
        with pytest.raises(KeyExists):
            await memory.remember("b1", "inc-2", expected_version=None, now_ms=6)
        assert await memory.all() == {"b1": RememberedIncarnation("b1", "inc-1", 5, 0)}
        await memory.remember("b1", "inc-2", expected_version=0, now_ms=7)
        with pytest.raises(MetadataVersionConflict):
            await memory.remember("b1", "inc-3", expected_version=0, now_ms=8)
        assert await memory.all() == {"b1": RememberedIncarnation("b1", "inc-2", 7, 1)}


async def test_a_cluster_made_before_incarnations_were_remembered(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        await store.delete(INCARNATIONS)  # as a cluster initialised by an older tally
        memory = RememberedIncarnations(store)
        assert await memory.all() == {}
        await memory.remember("b1", "inc-1", expected_version=None, now_ms=1)
        assert (await memory.all())["b1"].incarnation_id == "inc-1"


async def test_a_record_that_does_not_decode_is_an_unknown_incarnation(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        await store.create(incarnation_path("b1"), b"{not json")
        assert await RememberedIncarnations(store).all() == {
            "b1": RememberedIncarnation("b1", None, None, 0)
        }


async def test_the_cookies_incarnations_leave_out_what_does_not_decode(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        cookies = CookieManager(store)
        assert await cookies.incarnations() == {}
        first = Cookie.new("b1", ["/j"], "instance")
        await cookies.put(first, None)
        await store.create(cookie_path("b2"), b"\x00")
        await store.create(cookie_path("b3"), first.to_bytes())  # b1's cookie under b3
        assert await cookies.incarnations() == {"b1": first.incarnation_id}


async def test_a_deleted_then_recreated_cookie_is_delivered(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        cookies = CookieManager(store)
        first = Cookie.new("b1", ["/j"], "instance")
        await cookies.put(first, None)
        seen: list[dict[str, str]] = []
        watcher = await cookies.watch_incarnations(seen.append)
        try:
            assert seen == [{"b1": first.incarnation_id}]
            await cookies.delete("b1")
            again = Cookie.new("b1", ["/j"], "instance")
            await cookies.put(again, None)
            await until(lambda: seen[-1] == {"b1": again.incarnation_id}, "the new incarnation")
        finally:
            watcher.cancel()
