"""The client's public contract against five healthy bookie processes: create, append,
close, open (with and without recovery), read, delete; ids in every form; the errors of
`tally.errors`; advanced ledgers; every digest type; the synchronous facade."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

import tally
from tally.client.bookie_connection import BookieConnection
from tally.client.writer import LedgerWriter
from tally.core.availability import EntryAvailability
from tally.core.deletion import DeletePlan
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerState
from tally.errors import (
    BadRequest,
    LedgerClosed,
    LedgerDeleted,
    LedgerFenced,
    NoSuchLedger,
    NotEnoughBookies,
    Unauthorized,
)
from tests.client_e2e.conftest import FAST, Cluster, read_all, replica_copies, running_cluster

BOOKIES = 5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("contract"), BOOKIES) as cluster:
        yield cluster


async def test_the_contract_round_trip(cluster: Cluster) -> None:
    async with tally.Client(cluster.uri) as client:
        w = await client.create_ledger(
            ensemble_size=3,
            write_quorum=3,
            ack_quorum=2,
            password=b"pw",
            digest="crc32c",
            custom_metadata={"k": b"v"},
        )
        assert w.last_add_confirmed == -1
        payloads = [f"entry {i}".encode() * (i % 7) for i in range(300)]
        ids = [await w.append(p) for p in payloads[:10]]
        assert ids == list(range(10))
        assert w.last_add_confirmed == 9
        ids += await asyncio.gather(*(w.append(p) for p in payloads[10:]))
        assert ids == list(range(300))
        assert w.last_add_confirmed == 299
        assert w.length == sum(map(len, payloads))
        await w.close()

        r = await client.open_ledger(w.ledger_id, password=b"pw", recovery=True)
        assert r.is_closed
        assert r.last_entry_id == 299
        assert r.metadata.length == sum(map(len, payloads))
        assert dict(r.metadata.custom_metadata) == {"k": b"v"}
        assert (r.metadata.ensemble_size, r.metadata.write_quorum, r.metadata.ack_quorum) == (
            3,
            3,
            2,
        )
        entries = [(e.entry_id, e.data) async for e in r.read(0, r.last_entry_id)]
        assert entries == list(enumerate(payloads))
        assert (await r.read_entry(123)).data == payloads[123]
        with pytest.raises(BadRequest):
            await r.read_entry(300)

        copies = await replica_copies(w.ledger_id, r.metadata, b"pw", 299)
        for entry_id, held in copies.items():
            assert list(held.values()) == [payloads[entry_id]] * 3

        deleted = await client.delete_ledger(w.ledger_id)
        assert deleted.deletion.violations == 0, deleted.deletion.detail
        with pytest.raises(LedgerDeleted):
            await client.open_ledger(w.ledger_id, password=b"pw")
        again = await client.delete_ledger(w.ledger_id)
        assert again.plan is DeletePlan.ALREADY_DELETED
        await client.undelete_ledger(w.ledger_id)
        r = await client.open_ledger(w.ledger_id, password=b"pw")
        assert (await r.read_entry(299)).data == payloads[299]
        with pytest.raises(NoSuchLedger):
            await client.delete_ledger(LedgerId.classic(10**12))


async def test_an_empty_ledger_has_last_entry_minus_one(cluster: Cluster) -> None:
    async with tally.Client(cluster.uri) as client:
        closed = await client.create_ledger(password=b"pw")
        await closed.close()
        r = await client.open_ledger(closed.ledger_id, password=b"pw")
        assert (r.last_entry_id, r.is_closed) == (-1, True)
        assert await read_all(r) == {}

        left_open = await client.create_ledger(password=b"pw")
        recovered = await client.open_ledger(left_open.ledger_id, password=b"pw")
        assert (recovered.last_entry_id, recovered.is_closed) == (-1, True)
        # The bookies were fenced although they had never seen the ledger.
        with pytest.raises(LedgerFenced):
            await left_open.append(b"too late")
        with pytest.raises(LedgerFenced):
            await left_open.close()


async def test_ledger_ids_as_int_ledger_id_and_qualified_name(cluster: Cluster) -> None:
    async with tally.Client(cluster.uri) as client:
        w = await client.create_ledger(password=b"pw")
        await w.append(b"one")
        await w.close()
        assert w.ledger_id.is_classic
        forms: list[int | str | LedgerId] = [
            int(w.ledger_id),
            w.ledger_id,
            w.ledger_id.qualified_name,
            str(int(w.ledger_id)),
        ]
        for form in forms:
            r = await client.open_ledger(form, password=b"pw", recovery=False)
            assert r.ledger_id == w.ledger_id
            assert (await r.read_entry(0)).data == b"one"
        await client.delete_ledger(w.ledger_id.qualified_name)
        with pytest.raises(LedgerDeleted):
            await client.open_ledger(int(w.ledger_id), password=b"pw")


@pytest.mark.parametrize("kind", ["scope", "uuid"])
async def test_128_bit_ledgers_round_trip(cluster: Cluster, kind: str) -> None:
    scope = 0xABCDEF0123
    async with tally.Client(cluster.uri) as client:
        if kind == "scope":
            w = await client.create_ledger(password=b"pw", scope=scope)
            assert w.ledger_id.scope == scope
        else:
            w = await client.create_ledger(password=b"pw", uuid=True)
            assert w.ledger_id.scope != 0
        payloads = [random.Random(i).randbytes(i) for i in range(50)]
        await asyncio.gather(*(w.append(p) for p in payloads))
        await w.close()
        name = w.ledger_id.qualified_name
        assert len(name) == 32
        with pytest.raises(BadRequest):
            int(w.ledger_id)
        for form in (name, w.ledger_id, LedgerId.from_qualified_name(name)):
            r = await client.open_ledger(form, password=b"pw")
            assert await read_all(r) == dict(enumerate(payloads))
        # The bookies hold the entries under the full 128-bit id (entry format V2).
        copies = await replica_copies(w.ledger_id, r.metadata, b"pw", 49)
        assert all(payloads[e] in held.values() for e, held in copies.items())
        await client.delete_ledger(name)
        with pytest.raises(LedgerDeleted):
            await client.open_ledger(w.ledger_id, password=b"pw")
        with pytest.raises(BadRequest):
            await client.create_ledger(password=b"pw", scope=1, uuid=True)


@pytest.mark.parametrize("digest", ["crc32", "crc32c", "hmac", "dummy"])
async def test_every_digest_type_round_trips(cluster: Cluster, digest: str) -> None:
    async with tally.Client(cluster.uri) as client:
        w = await client.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw", digest=digest
        )
        payloads = [random.Random(digest).randbytes(n) for n in (0, 1, 100, 5000, 70_000)]
        await asyncio.gather(*(w.append(p) for p in payloads))
        await w.close()
        r = await client.open_ledger(w.ledger_id, password=b"pw")
        assert r.metadata.digest_type.name.lower() == digest
        assert await read_all(r) == dict(enumerate(payloads))


async def test_advanced_ledger_takes_entry_ids_in_any_order(cluster: Cluster) -> None:
    async with tally.Client(cluster.uri) as client:
        w = await client.create_ledger(password=b"pw", advanced=True)
        order = list(range(40))
        random.Random(5).shuffle(order)
        assert order[0] != 0
        results = await asyncio.gather(*(w.append(b"entry %d" % i, entry_id=i) for i in order))
        assert results == order
        assert w.last_add_confirmed == 39
        with pytest.raises(BadRequest):
            await w.append(b"again", entry_id=7)
        with pytest.raises(BadRequest):
            await w.append(b"no id")
        await w.close()
        r = await client.open_ledger(w.ledger_id, password=b"pw")
        assert await read_all(r) == {i: b"entry %d" % i for i in range(40)}

        plain = await client.create_ledger(password=b"pw")
        with pytest.raises(BadRequest):
            await plain.append(b"x", entry_id=0)
        await plain.close()


async def test_advanced_close_fails_appends_behind_a_gap(cluster: Cluster) -> None:
    async with tally.Client(cluster.uri) as client:
        w = await client.create_ledger(password=b"pw", advanced=True)
        assert await w.append(b"zero", entry_id=0) == 0
        behind_gap = asyncio.ensure_future(w.append(b"five", entry_id=5))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(w.close(), 10)  # never sent, so nothing to wait for
        with pytest.raises(LedgerClosed):
            await behind_gap
        r = await client.open_ledger(w.ledger_id, password=b"pw")
        assert await read_all(r) == {0: b"zero"}


async def test_close_twice_and_append_after_close(cluster: Cluster) -> None:
    async with tally.Client(cluster.uri) as client:
        w = await client.create_ledger(password=b"pw")
        await w.append(b"a")
        await w.close()
        await w.close()
        with pytest.raises(LedgerClosed):
            await w.append(b"b")
        r = await client.open_ledger(w.ledger_id, password=b"pw")
        assert r.last_entry_id == 0


async def test_close_by_another_client_at_the_same_end(cluster: Cluster) -> None:
    async with tally.Client(cluster.uri) as a, tally.Client(cluster.uri) as b:
        w = await a.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw")
        await asyncio.gather(*(w.append(b"%d" % i) for i in range(20)))
        r = await b.open_ledger(w.ledger_id, password=b"pw", recovery=True)
        assert (r.is_closed, r.last_entry_id) == (True, 19)
        assert r.metadata.length == w.length
        await w.close()  # the same end: nothing to refuse
        assert (await a.open_ledger(w.ledger_id, password=b"pw")).last_entry_id == 19


async def test_wrong_password_and_unknown_ledger(cluster: Cluster) -> None:
    async with tally.Client(cluster.uri) as client:
        w = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw"
        )
        await w.append(b"secret")
        for recovery in (True, False):
            with pytest.raises(Unauthorized):
                await client.open_ledger(w.ledger_id, password=b"wrong", recovery=recovery)
        # Refused before any fencing: the writer goes on.
        assert await w.append(b"more") == 1

        # A writer handle that reuses the ledger with another key: the bookies know the
        # ledger's master key from the first add and refuse it.
        # Refused, it must not close the ledger at its own LAC (-1) either: that would cut
        # off the real writer's acknowledged entries.
        impostor = LedgerWriter(client.context, w.metadata, b"wrong")
        with pytest.raises(Unauthorized):
            await impostor.append(b"forged")
        with pytest.raises(Unauthorized):
            await impostor.close()
        assert (
            await client.open_ledger(w.ledger_id, password=b"pw", recovery=False)
        ).metadata.state is LedgerState.OPEN
        await w.close()
        r = await client.open_ledger(w.ledger_id, password=b"pw")
        assert await read_all(r) == {0: b"secret", 1: b"more"}

        unknown = LedgerId(0, 2**62 + 17)
        for recovery in (True, False):
            with pytest.raises(NoSuchLedger):
                await client.open_ledger(unknown, password=b"pw", recovery=recovery)
        with pytest.raises(NoSuchLedger):
            await client.open_ledger(LedgerId(77, 1).qualified_name, password=b"pw")


async def test_not_enough_bookies(cluster: Cluster) -> None:
    async with tally.Client(cluster.uri) as client:
        with pytest.raises(NotEnoughBookies):
            await client.create_ledger(ensemble_size=BOOKIES + 1, write_quorum=2, ack_quorum=2)
        w = await client.create_ledger(ensemble_size=BOOKIES, write_quorum=2, ack_quorum=2)
        assert set(w.metadata.metadata.segments[0].ensemble) == {b.address for b in cluster.bookies}
        await w.close()


async def test_open_without_recovery_follows_the_tail_without_fencing(cluster: Cluster) -> None:
    config = dataclasses.replace(FAST, explicit_lac_interval=0.2)
    async with tally.Client(cluster.uri, config=config) as a, tally.Client(cluster.uri) as b:
        w = await a.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw")
        for i in range(10):
            await w.append(b"%d" % i)
        r = await b.open_ledger(w.ledger_id, password=b"pw", recovery=False)
        assert not r.is_closed
        assert r.metadata.state is LedgerState.OPEN
        # Entry 9 carried LAC 8; the explicit LAC may already have told them 9.
        assert r.last_entry_id in (8, 9)
        assert await read_all(r) == {i: b"%d" % i for i in range(r.last_entry_id + 1)}
        with pytest.raises(BadRequest):
            await r.read_entry(r.last_entry_id + 1)

        # The writer is not fenced: it goes on, and the reader follows.
        for i in range(10, 30):
            assert await w.append(b"%d" % i) == i
        assert await r.wait_for(20, timeout=10) >= 20
        assert await read_all(r) == {i: b"%d" % i for i in range(r.last_entry_id + 1)}
        # Idle, the writer sends its LAC explicitly: the reader sees the very last entry.
        assert await r.wait_for(29, timeout=10) == 29
        assert (await r.read_entry(29)).data == b"29"

        await w.close()
        assert (await b.open_ledger(w.ledger_id, password=b"pw")).last_entry_id == 29


async def test_a_close_right_after_the_adds_leaves_every_copy_in_place(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Adds resolve at AQ=2 while third copies are in flight: the writer's close waits for
    them, and the client's close cuts nothing and reports no failure."""
    async with tally.Client(cluster.uri) as client:

        async def write_and_close() -> LedgerWriter:
            w = await client.create_ledger(
                ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw"
            )
            futures = [w.append_nowait(b"entry %d" % i) for i in range(300)]
            assert await asyncio.gather(*futures) == list(range(300))
            await w.close()
            return w

        writers = await asyncio.gather(*(write_and_close() for _ in range(5)))
    for w in writers:
        (segment,) = w.metadata.metadata.segments
        for bookie in segment.ensemble:
            connection = await BookieConnection.connect(bookie)
            try:
                held = await connection.get_list_of_entries(w.ledger_id)
            finally:
                await connection.close()
            assert held == EntryAvailability.span(0, 299), f"{bookie} of ledger {w.ledger_id}"
    gc.collect()  # a future dropped with its exception unread warns when collected
    assert not [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING or "never retrieved" in r.getMessage()
    ]


def test_sync_client_does_the_contract(cluster: Cluster, tmp_path: Path) -> None:
    with tally.SyncClient(cluster.uri) as client:
        w = client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw", digest="crc32c"
        )
        assert [w.append(b"sync %d" % i) for i in range(20)] == list(range(20))
        assert w.last_add_confirmed == 19
        w.close()
        r = client.open_ledger(int(w.ledger_id), password=b"pw", recovery=True)
        assert r.last_entry_id == 19
        assert [(e.entry_id, e.data) for e in r.read(0, 19)] == [
            (i, b"sync %d" % i) for i in range(20)
        ]
        assert r.read_entry(3).data == b"sync 3"
        with pytest.raises(Unauthorized):
            client.open_ledger(w.ledger_id, password=b"nope")
        client.delete_ledger(w.ledger_id.qualified_name)
        with pytest.raises(LedgerDeleted):
            client.open_ledger(w.ledger_id, password=b"pw")
        client.undelete_ledger(w.ledger_id)
        assert client.open_ledger(w.ledger_id, password=b"pw").last_entry_id == 19
        with pytest.raises(NotEnoughBookies):
            client.create_ledger(ensemble_size=BOOKIES + 1)
