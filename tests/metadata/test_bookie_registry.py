"""The bookie registry on every backend: ephemeral registrations, watches, placements."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from tally.core.errors import BadRequest, KeyExists, MalformedData
from tally.metadata.bookie_registry import (
    AvailableBookies,
    BookieInfo,
    BookiePlacement,
    BookieRegistration,
    BookieRegistry,
)
from tally.metadata.cluster import init_cluster
from tally.metadata.paths import rack_path, writable_path
from tests.metadata.conftest import Backend
from tests.metadata.service_support import Collected
from tests.support.polling import until

INFO = BookieInfo(address="127.0.0.1:3181", http_port=8000, version="0.1.0", start_time_ms=5)


def available(writable: set[str], read_only: set[str]) -> AvailableBookies:
    return AvailableBookies(frozenset(writable), frozenset(read_only))


async def test_register_list_switch_and_unregister(backend: Backend) -> None:
    async with backend.open() as bookie, backend.open() as client:
        await init_cluster(client)
        registry, view = BookieRegistry(bookie), BookieRegistry(client)
        await registry.register("b1", INFO)
        await registry.register("b2", INFO, read_only=True)
        assert await view.available_bookies() == available({"b1"}, {"b2"})
        assert await view.registration("b1") == BookieRegistration(
            "b1", INFO, read_only=False, session_id=bookie.session_id
        )
        restarted = BookieInfo("127.0.0.1:3181", None, "0.2.0", 9)
        await registry.register("b1", restarted, read_only=True)
        assert await view.writable_bookies() == []
        assert await view.readonly_bookies() == ["b1", "b2"]
        registration = await view.registration("b1")
        assert registration is not None
        assert (registration.info, registration.read_only) == (restarted, True)
        await registry.register("b1", INFO)
        assert await view.available_bookies() == available({"b1"}, {"b2"})
        await view.unregister("b1")  # another session's registration stays
        assert await view.writable_bookies() == ["b1"]
        await registry.unregister("b1")
        await registry.unregister("b1")
        assert await view.registration("b1") is None
        assert await view.available_bookies() == available(set(), {"b2"})


async def test_a_registration_dies_with_its_session_and_watchers_see_it(
    backend: Backend,
) -> None:
    async with backend.open() as client:
        await init_cluster(client)
        seen: Collected[AvailableBookies] = Collected()
        watcher = await BookieRegistry(client).watch_bookies(seen)
        assert seen.values == [available(set(), set())]
        async with backend.open() as bookie:
            registry = BookieRegistry(bookie)
            await registry.register("b1", INFO)
            assert (await seen.wait_for(2))[-1] == available({"b1"}, set())
            await registry.register("b1", INFO, read_only=True)
            assert (await seen.wait_for(3))[-1] == available(set(), {"b1"})
            await bookie.expire_session()
            assert (await seen.wait_for(4))[-1] == available(set(), set())
        values = seen.values
        assert all(a != b for a, b in itertools.pairwise(values)), "each change given once"
        watcher.cancel()


async def test_a_restarted_bookie_waits_for_its_previous_session_to_go(
    backend: Backend,
) -> None:
    async with backend.open() as old, backend.open() as new:
        await init_cluster(old)
        await BookieRegistry(old).register("b1", INFO)
        impatient = BookieRegistry(new, previous_session_wait=0.2)
        with pytest.raises(KeyExists, match="another bookie running with this id"):
            await impatient.register("b1", INFO)
        patient = BookieRegistry(new, previous_session_wait=10)
        looks = 0
        get_many = new.get_many

        async def counted_get_many(paths: list[str]) -> Any:
            nonlocal looks
            looks += 1
            return await get_many(paths)

        new.get_many = counted_get_many  # type: ignore[method-assign]
        registering = asyncio.ensure_future(patient.register("b1", INFO, read_only=True))
        await until(lambda: looks >= 3, "the registration looked at the old one three times")
        assert not registering.done()
        await old.expire_session()
        await asyncio.wait_for(registering, 10)
        registration = await patient.registration("b1")
        assert registration is not None
        assert registration.session_id == new.session_id
        assert registration.read_only


async def test_placements_are_persistent_per_bookie(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        registry = BookieRegistry(store)
        assert await registry.placement("b1") is None
        await registry.set_placement("b1", BookiePlacement("/dc1/rack1", "zone-a"))
        await registry.set_placement("b2", BookiePlacement("/dc1/rack2", "zone-a"))
        await registry.set_placement("b1", BookiePlacement("/dc1/rack3", "zone-b"))
        assert await registry.placement("b1") == BookiePlacement("/dc1/rack3", "zone-b")
        assert await registry.placements() == {
            "b1": BookiePlacement("/dc1/rack3", "zone-b"),
            "b2": BookiePlacement("/dc1/rack2", "zone-a"),
        }
        assert await registry.remove_placement("b2")
        assert not await registry.remove_placement("b2")
        assert list(await registry.placements()) == ["b1"]
        await store.set(rack_path("b1"), b'{"rack": "/r"}')
        with pytest.raises(MalformedData, match="placement /racks/b1"):
            await registry.placement("b1")


async def test_unreadable_registration_data_names_the_bookie(backend: Backend) -> None:
    async with backend.open() as store:
        await init_cluster(store)
        await store.create(writable_path("b9"), b"not json", ephemeral=True)
        with pytest.raises(MalformedData, match="registration /available/writable/b9"):
            await BookieRegistry(store).registration("b9")


def test_info_and_placement_round_trip_and_refuse_bad_values() -> None:
    assert BookieInfo.from_bytes(INFO.to_bytes(), "x") == INFO
    placement = BookiePlacement("/region/rack", "zone")
    assert BookiePlacement.from_bytes(placement.to_bytes(), "x") == placement
    for bad in [
        {"address": ""},
        {"http_port": 0},
        {"http_port": 70000},
        {"http_port": True},
        {"version": 1},
        {"start_time_ms": -1},
    ]:
        fields = {**vars(INFO), **bad}
        with pytest.raises(BadRequest):
            BookieInfo(**fields)
    with pytest.raises(BadRequest, match="rack"):
        BookiePlacement("", "zone")
    with pytest.raises(BadRequest, match="zone"):
        BookiePlacement("/r", "z\n")
    with pytest.raises(BadRequest, match="bookie id"):
        writable_path("a/b")
