"""The reader against fake bookies and a memory:// store: failover on errors, speculative
reads past a silent replica, corrupt copies skipped, and never "missing" on an error or a
timeout: NoSuchEntry only when every replica says so."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import REGISTRY

from tally.client.config import ClientConfig
from tally.core.errors import (
    BadDigest,
    EntryUnreadable,
    NoSuchEntry,
    NoSuchLedger,
    TallyError,
    Timeout,
    TooManyRequests,
)
from tally.core.ids import LedgerId
from tally.core.protocol import ReadLacRequest, ReadRequest, Request
from tally.core.schedule import write_set
from tests.support.fake_bookie import FakeBookie, FakeCluster, fake_cluster

PASSWORD = b"reader"
ENTRIES = 6
CONFIG = ClientConfig(explicit_lac_interval=0, read_timeout=5.0, speculative_read_timeout=5.0)


def refusing(kind: type[Request], error: TallyError) -> Callable[[Request], TallyError | None]:
    """A `FakeBookie.refuse` that answers every request of `kind` with `error`."""

    def refuse(request: Request) -> TallyError | None:
        return error if isinstance(request, kind) else None

    return refuse


@dataclasses.dataclass
class Written:
    cluster: FakeCluster
    ledger_id: LedgerId
    ensemble: list[FakeBookie]


@contextlib.asynccontextmanager
async def written_ledger(*, close: bool = True) -> AsyncIterator[Written]:
    """A ledger of ENTRIES entries, E=WQ=AQ=3, so that every bookie has every entry."""
    async with fake_cluster(3) as cluster:
        async with cluster.client(CONFIG) as client:
            writer = await client.create_ledger(
                ensemble_size=3, write_quorum=3, ack_quorum=3, password=PASSWORD
            )
            for i in range(ENTRIES):
                await writer.append(b"entry %d" % i)
            if close:
                await writer.close()
            ensemble = writer.metadata.metadata.segments[0].ensemble
        yield Written(cluster, writer.ledger_id, [cluster.bookie(b) for b in ensemble])


async def read_every_entry(written: Written, config: ClientConfig = CONFIG) -> list[bytes]:
    async with written.cluster.client(config) as client:
        reader = await client.open_ledger(written.ledger_id, password=PASSWORD, recovery=False)
        return [(await reader.read_entry(i)).data for i in range(ENTRIES)]


async def test_errors_fail_over_to_the_next_replica() -> None:
    async with written_ledger() as written:
        first, second, _ = written.ensemble
        first.refuse = refusing(ReadRequest, TooManyRequests("overloaded"))
        second.refuse = refusing(ReadRequest, NoSuchEntry("not here"))  # one replica's word
        assert await read_every_entry(written) == [b"entry %d" % i for i in range(ENTRIES)]


async def test_a_silent_replica_is_passed_by_a_speculative_read() -> None:
    config = dataclasses.replace(CONFIG, speculative_read_timeout=0.05)
    async with written_ledger() as written:
        written.ensemble[0].hold = True
        started = time.monotonic()
        assert await read_every_entry(written, config) == [b"entry %d" % i for i in range(ENTRIES)]
        assert time.monotonic() - started < config.read_timeout
        written.ensemble[0].resume()


async def test_a_corrupt_copy_is_reported_and_another_replica_serves() -> None:
    def corrupt_copies() -> float:
        return REGISTRY.get_sample_value("client_read_corrupt_copies_total") or 0.0

    async with written_ledger() as written:
        ledger = written.ledger_id
        for entry_id in range(ENTRIES):
            first = written.ensemble[write_set(entry_id, 3, 3)[0]]
            copy = bytearray(first.entries[ledger][entry_id])
            copy[-1] ^= 0xFF  # a payload byte: the digest no longer matches
            first.entries[ledger][entry_id] = bytes(copy)
        before = corrupt_copies()
        assert await read_every_entry(written) == [b"entry %d" % i for i in range(ENTRIES)]
        assert corrupt_copies() - before == ENTRIES
        async with written.cluster.client(CONFIG) as client:
            mark = await client.context.under_replication.under_replicated(ledger)
        assert mark is not None, "the bad copies were filed for repair"
        assert {bookie: list(entries) for bookie, entries in mark.bad_copies.items()} == {
            written.ensemble[position].address: [
                e for e in range(ENTRIES) if write_set(e, 3, 3)[0] == position
            ]
            for position in range(3)
        }


async def test_copies_that_all_fail_their_digest_are_not_filed() -> None:
    """Every copy failing its digest may say the reader has the wrong key, not that the
    copies are bad: nothing is filed (the auditor's checks, which know, will)."""
    async with written_ledger() as written:
        for bookie in written.ensemble:
            bookie.refuse = refusing(ReadRequest, EntryUnreadable("rotten"))
        async with written.cluster.client(CONFIG) as client:
            reader = await client.open_ledger(written.ledger_id, password=PASSWORD, recovery=False)
            with pytest.raises(EntryUnreadable):
                await reader.read_entry(0)
            await client.context.bad_copies.flush()
            assert (
                await client.context.under_replication.under_replicated(written.ledger_id) is None
            )


@pytest.mark.parametrize(
    ("answers", "raised"),
    [
        ((NoSuchEntry, TooManyRequests, NoSuchEntry), TooManyRequests),
        ((NoSuchEntry, EntryUnreadable, NoSuchLedger), EntryUnreadable),
        ((NoSuchEntry, BadDigest, NoSuchEntry), BadDigest),
        ((NoSuchEntry, NoSuchEntry, Timeout), Timeout),
        ((NoSuchEntry, NoSuchLedger, NoSuchEntry), NoSuchEntry),  # every replica said so
    ],
)
async def test_an_error_or_a_timeout_is_never_taken_as_missing(
    answers: tuple[type[TallyError], ...], raised: type[TallyError]
) -> None:
    config = dataclasses.replace(CONFIG, read_timeout=1.0, speculative_read_timeout=0.05)
    async with written_ledger() as written:
        for bookie, answer in zip(written.ensemble, answers, strict=True):
            if answer is Timeout:
                bookie.hold = True
            else:
                bookie.refuse = refusing(ReadRequest, answer(f"{answer.__name__} from {bookie}"))
        async with written.cluster.client(config) as client:
            reader = await client.open_ledger(written.ledger_id, password=PASSWORD, recovery=False)
            for entry_id in range(ENTRIES):
                with pytest.raises(TallyError) as caught:
                    await reader.read_entry(entry_id)
                assert type(caught.value) is raised
        for bookie in written.ensemble:
            bookie.resume()


async def test_the_lac_of_an_open_ledger_is_the_highest_answer_despite_errors() -> None:
    async with written_ledger(close=False) as written:
        first, second, third = written.ensemble
        first.lacs[written.ledger_id] = 3
        second.refuse = refusing(ReadLacRequest, TooManyRequests("overloaded"))
        third.lacs[written.ledger_id] = 4
        async with written.cluster.client(CONFIG) as client:
            reader = await client.open_ledger(written.ledger_id, password=PASSWORD, recovery=False)
            assert not reader.is_closed
            assert reader.last_add_confirmed == 4
            assert [e.data async for e in reader.read(0, 4)] == [b"entry %d" % i for i in range(5)]
