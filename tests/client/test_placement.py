"""The client's placement against a registry alone (a memory store, bookies registered with
their racks, none of them serving): which ensembles a create gets or is refused, and which
bookies replace failed positions. What is created must pass the audit's placement rule."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine, Mapping
from typing import Any

import pytest

import tally
from tally.client.config import ClientConfig
from tally.core.errors import NotEnoughBookies
from tally.core.placement import (
    DEFAULT_RACK,
    PlacementAdherence,
    RackAwarePlacementPolicy,
    write_sets_on_enough_racks,
)
from tests.support.registry import registered_bookies

DEADLINE = 15.0
NOT_ENFORCED = ClientConfig(enforce_min_num_racks_per_write_quorum=False)

B1, B2, B3, B4, B5, B6 = (f"127.0.0.1:{4181 + i}" for i in range(6))


@contextlib.asynccontextmanager
async def registry(
    racks: Mapping[str, str | None], read_only: frozenset[str] = frozenset()
) -> AsyncIterator[str]:
    async with registered_bookies(racks, read_only) as registered:
        yield registered.uri


def run(test: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(test, DEADLINE))


def audited(ensemble: tuple[str, ...], write_quorum: int, racks: Mapping[str, str]) -> bool:
    """The audit's verdict (the online placement check's policy): not FAIL."""
    adherence = RackAwarePlacementPolicy().adherence(
        ensemble, write_quorum, racks, len(set(racks.values()))
    )
    return adherence is not PlacementAdherence.FAIL


TWO_RACKS = {B1: "/zone-1/rack-1", B2: "/zone-1/rack-2", B3: "/zone-1/rack-1"}
"""`tally local up --bookies 3 --racks 2`: racks round-robin."""


def test_e3_wq2_on_two_racks_is_refused_at_create_saying_what_exists_and_what_it_needs() -> None:
    async def test() -> None:
        async with registry(TWO_RACKS) as uri, tally.Client(uri) as client:
            with pytest.raises(NotEnoughBookies) as refused:
                await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
            message = str(refused.value)
            assert "refusing to place unsafely: E=3 WQ=2 needs every write set on at least 2 " in (
                message
            )
            assert "the 2 racks of the cluster" in message
            assert (
                f"Racks and their candidate bookies: /zone-1/rack-1: {B1}, {B3}; "
                f"/zone-1/rack-2: {B2}."
            ) in message
            assert "enforce_min_num_racks_per_write_quorum = false" in message
            pages = [page async for page in client.context.ledgers.ledger_pages()]
            assert [record for page in pages for record in page.ledgers] == [], "none created"
            # E=3 WQ=3 fits two racks: its one write set holds both.
            writer = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
            assert audited(writer.metadata.metadata.segments[0].ensemble, 3, TWO_RACKS)

    run(test())


def test_with_enforcement_off_the_same_cluster_creates_what_the_audit_fails() -> None:
    async def test() -> None:
        async with registry(TWO_RACKS) as uri, tally.Client(uri, config=NOT_ENFORCED) as client:
            for _ in range(5):
                writer = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
                ensemble = writer.metadata.metadata.segments[0].ensemble
                assert sorted(ensemble) == sorted(TWO_RACKS)
                assert not audited(ensemble, 2, TWO_RACKS)

    run(test())


@pytest.mark.parametrize("rack", [None, "/zone-1/rack-1"])
def test_a_cluster_on_one_rack_is_not_refused(rack: str | None) -> None:
    bookies = dict.fromkeys((B1, B2, B3, B4), rack)

    async def test() -> None:
        async with registry(bookies) as uri, tally.Client(uri) as client:
            for size, write_quorum in ((3, 2), (4, 2), (3, 3), (2, 2)):
                writer = await client.create_ledger(
                    ensemble_size=size, write_quorum=write_quorum, ack_quorum=2
                )
                ensemble = writer.metadata.metadata.segments[0].ensemble
                assert len(set(ensemble)) == size
                assert audited(ensemble, write_quorum, dict.fromkeys(bookies, rack or DEFAULT_RACK))

    run(test())


def test_every_created_ensemble_passes_the_audit_on_three_racks() -> None:
    bookies = {B1: "/r1", B2: "/r2", B3: "/r3", B4: "/r1", B5: "/r2"}

    async def test() -> None:
        async with registry(bookies) as uri, tally.Client(uri, seed=5) as client:
            for size, write_quorum in ((3, 2), (5, 2), (5, 3), (4, 3), (2, 2)):
                for _ in range(5):
                    writer = await client.create_ledger(
                        ensemble_size=size, write_quorum=write_quorum, ack_quorum=2
                    )
                    ensemble = writer.metadata.metadata.segments[0].ensemble
                    racks = [bookies[b] for b in ensemble]
                    assert write_sets_on_enough_racks(racks, write_quorum, 2, 3)
                    assert audited(ensemble, write_quorum, bookies)

    run(test())


def test_a_read_only_bookies_rack_counts_though_it_takes_no_ledger() -> None:
    bookies = {B1: "/r1", B2: "/r1", B3: "/r2"}

    async def test() -> None:
        async with registry(bookies, read_only=frozenset({B3})) as uri, tally.Client(uri) as c:
            with pytest.raises(NotEnoughBookies, match=f"/r1: {B1}, {B2}; /r2: no candidate"):
                await c.create_ledger(ensemble_size=2, write_quorum=2, ack_quorum=2)
        async with registry({B1: "/r1", B2: "/r1"}) as uri, tally.Client(uri) as c:
            await c.create_ledger(ensemble_size=2, write_quorum=2, ack_quorum=2)  # one rack

    run(test())


def test_replacements_keep_the_rule_for_every_failed_position() -> None:
    bookies = {B1: "/r1", B2: "/r2", B3: "/r1", B4: "/r2", B5: "/r1", B6: "/r1"}

    async def test() -> None:
        async with registry(bookies) as uri, tally.Client(uri) as client:
            for _ in range(10):
                # B2 of /r2 failed between B1 and B3 of /r1: only B4 keeps the pairs apart.
                replaced = await client.context.replace_positions((B1, B2, B3, B5), [1], 2)
                assert replaced == (B1, B4, B3, B5)
            # Both bookies of /r2 failed, and are still registered: /r1 alone cannot part
            # the pairs while /r2 is a rack of the cluster.
            with pytest.raises(NotEnoughBookies, match=r"position\(s\) \[1, 3\] of"):
                await client.context.replace_positions((B1, B2, B3, B4), [1, 3], 2)
        async with registry(bookies) as uri, tally.Client(uri, config=NOT_ENFORCED) as client:
            replaced = await client.context.replace_positions((B1, B2, B3, B4), [1, 3], 2)
            assert replaced[0::2] == (B1, B3)
            assert {replaced[1], replaced[3]} == {B5, B6}

    run(test())
