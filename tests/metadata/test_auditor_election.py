"""Auditor election on every backend: the lowest vote wins, its successor takes over."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from tally.core.errors import BadRequest
from tally.metadata.auditor_election import AuditorElection, who_is_auditor
from tally.metadata.cluster import init_cluster
from tally.metadata.paths import AUDITOR
from tally.metadata.store import MetadataStore
from tests.metadata.conftest import Backend
from tests.support.polling import until

TAKEOVER = 10.0


@contextlib.asynccontextmanager
async def candidates(backend: Backend, count: int) -> AsyncIterator[list[AuditorElection]]:
    """`count` candidates, each on its own session, having voted in order."""
    async with contextlib.AsyncExitStack() as stack:
        stores: list[MetadataStore] = [
            await stack.enter_async_context(backend.open()) for _ in range(count)
        ]
        await init_cluster(stores[0])
        elections = [AuditorElection(store, f"bookie-{i}") for i, store in enumerate(stores)]
        for election in elections:
            await election.start()
        yield elections


async def test_the_first_vote_wins_and_the_next_takes_over_when_it_dies(
    backend: Backend,
) -> None:
    async with candidates(backend, 3) as (first, second, third), backend.open() as observer:
        assert first.elected.is_set()
        assert not second.elected.is_set()
        assert not third.elected.is_set()
        assert await who_is_auditor(observer) == "bookie-0"

        await first.store.expire_session()
        await asyncio.wait_for(second.elected.wait(), TAKEOVER)
        assert first.lost.is_set()
        assert not first.elected.is_set()
        assert not third.elected.is_set()
        assert await who_is_auditor(observer) == "bookie-1"

        await second.stop()
        await asyncio.wait_for(third.elected.wait(), TAKEOVER)
        assert await who_is_auditor(observer) == "bookie-2"
        await third.stop()
        assert await who_is_auditor(observer) is None


async def test_a_candidate_whose_predecessor_dies_watches_the_next_one_down(
    backend: Backend,
) -> None:
    async with candidates(backend, 3) as (first, second, third):
        assert (first.watching, second.watching, third.watching) == (None, first.vote, second.vote)
        await second.store.expire_session()
        await until(lambda: third.watching == first.vote, "the third watching the first")
        assert not third.elected.is_set(), "the auditor is still alive"
        await first.stop()
        await asyncio.wait_for(third.elected.wait(), TAKEOVER)
        assert third.watching is None
        assert await who_is_auditor(third.store) == "bookie-2"
        assert await third.store.children(AUDITOR) == [third.vote.rsplit("/", 1)[1]]  # type: ignore[union-attr]


async def test_a_late_candidate_joins_behind_the_auditor(backend: Backend) -> None:
    async with candidates(backend, 1) as (auditor,), backend.open() as store:
        late = AuditorElection(store, "bookie-late")
        await late.start()
        assert not late.elected.is_set()
        await auditor.stop()
        await asyncio.wait_for(late.elected.wait(), TAKEOVER)
        assert await who_is_auditor(store) == "bookie-late"


async def test_a_candidate_needs_a_bookie_id(backend: Backend) -> None:
    async with backend.open() as store:
        with pytest.raises(BadRequest, match="bookie id"):
            AuditorElection(store, "a/b")
