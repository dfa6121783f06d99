"""LedgerWriter against fake bookies and a memory:// store: pipelined adds confirmed in
order at the ack quorum, ensemble changes on failure, and closes that wait for the copies
beyond the ack quorum (or mark the ledger under-replicated for them)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import time
from collections.abc import Callable

import pytest

import tally
from tally.client.config import ClientConfig
from tally.client.writer import LedgerWriter
from tally.core.errors import BadRequest, IllegalOperation, TallyError, TooManyRequests
from tally.core.ledger_metadata import LedgerState
from tally.core.protocol import MAX_FRAME_SIZE, AddRequest, Request
from tally.core.schedule import write_set
from tally.metadata.ledger_manager import LedgerManager, LedgerRecord
from tally.metadata.underreplication import UnderReplicationManager
from tests.support.fake_bookie import FakeBookie, FakeCluster, fake_cluster
from tests.support.polling import until

PASSWORD = b"writer"
CONFIG = ClientConfig(explicit_lac_interval=0)


def refusing_adds(error: TallyError, first: int = 0) -> Callable[[Request], TallyError | None]:
    """A `FakeBookie.refuse` that fails the adds of entries from `first` on."""

    def refuse(request: Request) -> TallyError | None:
        if isinstance(request, AddRequest) and request.entry_id >= first:
            return error
        return None

    return refuse


def ensemble_of(cluster: FakeCluster, writer: LedgerWriter) -> list[FakeBookie]:
    return [cluster.bookie(b) for b in writer.metadata.metadata.segments[-1].ensemble]


async def stored(cluster: FakeCluster, writer: LedgerWriter) -> LedgerRecord:
    return await LedgerManager(cluster.store).read_ledger_metadata(writer.ledger_id)


async def missing_bookies(cluster: FakeCluster, writer: LedgerWriter) -> frozenset[str] | None:
    mark = await UnderReplicationManager(cluster.store).under_replicated(writer.ledger_id)
    return None if mark is None else mark.missing_bookies


async def confirmed_past_a_held_copy(
    cluster: FakeCluster, client: tally.Client, count: int, position: int
) -> tuple[LedgerWriter, FakeBookie]:
    """A writer of E = WQ = 3, AQ = 2 whose `count` entries are confirmed while the bookie
    at `position` holds its copies; that bookie."""
    writer = await client.create_ledger(
        ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
    )
    held = ensemble_of(cluster, writer)[position]
    held.hold = True
    futures = [writer.append_nowait(b"%d" % i) for i in range(count)]
    assert await asyncio.gather(*futures) == list(range(count))
    await until(lambda: len(held.held) == count)
    return writer, held


def failures_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What a close must not leave: failures of adds that did not fail, unseen exceptions."""
    gc.collect()  # a future dropped with its exception unread warns when collected
    return [
        r.getMessage()
        for r in caplog.records
        if "failed entry" in r.getMessage()
        or "writer stops" in r.getMessage()
        or "never retrieved" in r.getMessage()
    ]


@pytest.mark.parametrize("advanced", [False, True])
async def test_an_entry_too_large_for_a_frame_is_refused_and_the_writer_goes_on(
    advanced: bool,
) -> None:
    async with fake_cluster(3) as cluster, cluster.client(CONFIG) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD, advanced=advanced
        )
        ids = {"entry_id": 0} if advanced else {}
        with pytest.raises(BadRequest, match=r"an entry of 5242880 bytes is over the \d+"):
            writer.append_nowait(bytes(MAX_FRAME_SIZE), **ids)
        assert await writer.append(b"small", **ids) == 0
        assert writer.length == 5
        await writer.close()
        assert (await stored(cluster, writer)).metadata.last_entry_id == 0
        assert all(len(b.entries[writer.ledger_id]) == 1 for b in ensemble_of(cluster, writer))


async def test_pipelined_adds_are_confirmed_in_entry_order_at_the_ack_quorum() -> None:
    async with fake_cluster(3) as cluster, cluster.client(CONFIG) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        first, second, third = ensemble_of(cluster, writer)
        for bookie in (first, second, third):
            bookie.hold = True
        confirmed: list[int] = []
        futures = [writer.append_nowait(b"entry %d" % i) for i in range(10)]
        for future in futures:
            future.add_done_callback(lambda f: confirmed.append(f.result()))
        await until(lambda: all(len(b.held) == 10 for b in (first, second, third)))
        # Entries 5..9 reach their ack quorum before 0..4 have a single ack.
        for bookie in (first, second):
            bookie.release(list(range(5, 10)))
        for bookie in (first, second):
            bookie.release(list(range(5)))
        assert await asyncio.gather(*futures) == list(range(10))
        # In entry order, although the third copies never answered.
        assert confirmed == list(range(10))
        assert writer.last_add_confirmed == 9
        assert writer.length == sum(len(b"entry %d" % i) for i in range(10))
        third.resume()
        await writer.close()
        assert (await stored(cluster, writer)).metadata.last_entry_id == 9


async def test_a_failed_bookie_is_replaced_from_the_lac_on() -> None:
    async with fake_cluster(4) as cluster, cluster.client(CONFIG) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
        )
        ensemble = ensemble_of(cluster, writer)
        (spare,) = set(cluster.bookies) - set(ensemble)
        for i in range(5):
            assert await writer.append(b"before %d" % i) == i
        victim = 1
        ensemble[victim].refuse = refusing_adds(TooManyRequests("overloaded"), first=5)
        for i in range(5, 10):
            assert await writer.append(b"after %d" % i) == i
        await writer.close()

        record = await stored(cluster, writer)
        _, new = record.metadata.segments
        changed_at = next(e for e in range(5, 10) if victim in write_set(e, 3, 2))
        assert new.first_entry_id == changed_at
        assert new.ensemble[victim] == spare.address
        assert [b for p, b in enumerate(new.ensemble) if p != victim] == [
            b.address for p, b in enumerate(ensemble) if p != victim
        ]
        assert (record.metadata.state, record.metadata.last_entry_id) == (LedgerState.CLOSED, 9)
        # The newcomer holds the copies of its position from the change on.
        assert sorted(spare.entries[writer.ledger_id]) == [
            e for e in range(changed_at, 10) if victim in write_set(e, 3, 2)
        ]
        reader = await client.open_ledger(writer.ledger_id, password=PASSWORD)
        got = [e.data async for e in reader.read(0, 9)]
        assert got == [b"before %d" % i for i in range(5)] + [b"after %d" % i for i in range(5, 10)]
        assert await missing_bookies(cluster, writer) is None  # nothing confirmed was lost


async def test_close_waits_for_the_copies_beyond_the_ack_quorum(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with fake_cluster(3) as cluster, cluster.client(CONFIG) as client:
        writer, slow = await confirmed_past_a_held_copy(cluster, client, 20, position=2)
        asyncio.get_running_loop().call_later(0.2, slow.resume)
        await writer.close()
        # The close returned after the third copies answered, not before.
        assert sorted(slow.entries[writer.ledger_id]) == list(range(20))
        record = await stored(cluster, writer)
        assert (record.metadata.state, record.metadata.last_entry_id) == (LedgerState.CLOSED, 19)
        assert await missing_bookies(cluster, writer) is None
    assert failures_logged(caplog) == []


async def test_close_gives_up_on_a_silent_copy_at_its_bound_and_marks_the_ledger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = dataclasses.replace(CONFIG, close_copies_timeout=0.5)
    async with fake_cluster(3) as cluster, cluster.client(config) as client:
        writer, stalled = await confirmed_past_a_held_copy(cluster, client, 30, position=1)
        started = time.monotonic()
        await writer.close()
        assert 0.5 <= time.monotonic() - started < 3.0
        record = await stored(cluster, writer)
        assert (record.metadata.state, record.metadata.last_entry_id) == (LedgerState.CLOSED, 29)
        assert await missing_bookies(cluster, writer) == {stalled.address}
        assert len(record.metadata.segments) == 1  # marked, not replaced
        stalled.resume()
    assert any("did not answer before the close" in r.getMessage() for r in caplog.records)
    assert failures_logged(caplog) == []


async def test_a_copy_that_fails_during_the_close_is_marked_not_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with fake_cluster(4) as cluster, cluster.client(CONFIG) as client:
        writer, failing = await confirmed_past_a_held_copy(cluster, client, 10, position=0)
        failing.refuse = refusing_adds(TooManyRequests("overloaded"))
        asyncio.get_running_loop().call_later(0.2, failing.resume)
        await writer.close()
        record = await stored(cluster, writer)
        assert (record.metadata.state, record.metadata.last_entry_id) == (LedgerState.CLOSED, 9)
        assert len(record.metadata.segments) == 1
        assert await missing_bookies(cluster, writer) == {failing.address}
    assert failures_logged(caplog) == []


async def test_client_close_stops_a_writer_left_open_and_marks_its_silent_copies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = dataclasses.replace(CONFIG, close_copies_timeout=0.5)
    async with fake_cluster(3) as cluster:
        async with cluster.client(config) as client:
            writer, stalled = await confirmed_past_a_held_copy(cluster, client, 10, position=2)
            started = time.monotonic()
        assert time.monotonic() - started < 3.0
        # Left open by its writer, the ledger stays OPEN for a recovery to close.
        assert (await stored(cluster, writer)).metadata.state is LedgerState.OPEN
        assert await missing_bookies(cluster, writer) == {stalled.address}
        with pytest.raises(IllegalOperation, match="client was closed"):
            writer.append_nowait(b"late")
        stalled.resume()
    assert failures_logged(caplog) == []


async def test_client_close_fails_the_adds_it_cuts_short() -> None:
    config = dataclasses.replace(CONFIG, close_copies_timeout=0.2)
    async with fake_cluster(3) as cluster:
        async with cluster.client(config) as client:
            writer = await client.create_ledger(
                ensemble_size=3, write_quorum=3, ack_quorum=3, password=PASSWORD
            )
            silent = ensemble_of(cluster, writer)[0]
            silent.hold = True
            future = writer.append_nowait(b"never confirmed")
        with pytest.raises(IllegalOperation, match="client was closed"):
            await future
        assert await missing_bookies(cluster, writer) is None  # nothing was confirmed
        silent.resume()


async def test_answers_of_a_replaced_bookie_leave_no_unretrieved_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with fake_cluster(4) as cluster, cluster.client(CONFIG) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=3, password=PASSWORD
        )
        victim = ensemble_of(cluster, writer)[1]
        victim.hold = True
        futures = [writer.append_nowait(b"%d" % i) for i in range(10)]
        await until(lambda: len(victim.held) == 10)
        victim.refuse = refusing_adds(TooManyRequests("overloaded"))
        victim.release([0])  # replaced from entry 0 on: its other 9 adds no longer count
        assert await asyncio.gather(*futures) == list(range(10))
        assert victim.address not in writer.metadata.metadata.segments[-1].ensemble
        victim.disconnect()  # fails them
        await until(lambda: client.context.bookies.cached(victim.address) is None)
        await writer.close()
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def adds_held(bookie: FakeBookie) -> int:
    return sum(isinstance(request, AddRequest) for _, request in bookie.held)


def held_adds(bookie: FakeBookie, entry_ids: list[int]) -> list[int]:
    """The indexes in `bookie.held` of its held adds of these entries, in that order."""
    where = {
        request.entry_id: index
        for index, (_, request) in enumerate(bookie.held)
        if isinstance(request, AddRequest)
    }
    return [where[entry_id] for entry_id in entry_ids]


async def test_a_replaced_bookies_late_acks_count_in_its_old_segment_only() -> None:
    """After an ensemble change, the replaced bookie's acks of entries before the new
    segment still count (the close waits for them), those of the new segment's entries do
    not: only the newcomer's copy there completes the ack quorum."""
    async with fake_cluster(4) as cluster, cluster.client(CONFIG) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        first, victim, third = ensemble_of(cluster, writer)
        (spare,) = set(cluster.bookies) - {first, victim, third}
        victim.hold = spare.hold = True
        assert await asyncio.gather(*(writer.append_nowait(b"%d" % i) for i in range(2))) == [0, 1]
        first.hold = True  # from here on only the third acks at once: one short of AQ
        later = [writer.append_nowait(b"%d" % i) for i in range(2, 6)]
        await until(lambda: adds_held(victim) == 6)
        victim.refuse = refusing_adds(TooManyRequests("overloaded"))
        victim.release(held_adds(victim, [5]))  # replaced from entry 2, the LAC + 1, on
        await until(lambda: adds_held(spare) == 4)
        assert writer.metadata.metadata.segments[-1].first_entry_id == 2
        victim.refuse = lambda request: None
        victim.release(held_adds(victim, [0, 1, 2, 3, 4]))
        victim.hold = False
        connection = client.context.bookies.cached(victim.address)
        assert connection is not None
        await connection.read_lac(writer.ledger_id)  # answered after the acks before it
        assert not any(future.done() for future in later)
        spare.resume()
        assert await asyncio.gather(*later) == [2, 3, 4, 5]
        first.resume()
        await writer.close()
        assert await missing_bookies(cluster, writer) is None


async def test_a_client_closed_after_its_writer_logs_no_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with fake_cluster(3) as cluster:
        async with cluster.client(CONFIG) as client:
            writer = await client.create_ledger(
                ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
            )
            futures = [writer.append_nowait(b"%d" % i) for i in range(300)]
            await asyncio.gather(*futures)
            await writer.close()
        for bookie in cluster.bookies:
            assert sorted(bookie.entries[writer.ledger_id]) == list(range(300))
        assert await missing_bookies(cluster, writer) is None
    assert failures_logged(caplog) == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
