"""Ledger recovery against fake bookies and a memory:// store, with what each bookie holds
and answers set by hand: fencing to quorum coverage, re-writing what lies past the LAC,
closing only on WQ - AQ + 1 explicit negatives, and never on unknown answers."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable

import pytest

from tally.client.config import ClientConfig
from tally.core.digest import DigestType, mac_key
from tally.core.entry_format import encode_entry
from tally.core.errors import (
    EntryUnreadable,
    LedgerRecoveryFailed,
    TallyError,
    TooManyRequests,
)
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.core.protocol import ReadRequest, Request
from tally.metadata.ledger_manager import LedgerManager
from tests.support.fake_bookie import FakeBookie, FakeCluster, fake_cluster

PASSWORD = b"recovery"
CONFIG = ClientConfig(explicit_lac_interval=0, read_timeout=2.0, speculative_read_timeout=0.1)
"""A held bookie times out after 2 s: long enough that the answering ones never do, on a
machine shared with another test worker (0.3 s was passed there)."""
PATIENT = dataclasses.replace(CONFIG, read_timeout=10.0)
"""For recoveries whose bookies all answer, on a machine busy enough to pass 0.3 s."""


def payload(entry_id: int) -> bytes:
    return b"entry %d" % entry_id


@dataclasses.dataclass
class OpenLedger:
    """An OPEN ledger whose writer is gone, E = WQ = 3, on fake bookies a, b and c."""

    cluster: FakeCluster
    ledger_id: LedgerId
    a: FakeBookie
    b: FakeBookie
    c: FakeBookie

    def put(self, bookie: FakeBookie, entry_id: int) -> None:
        """`entry_id` as its writer sent it: carrying LAC entry_id - 1."""
        length = sum(len(payload(e)) for e in range(entry_id + 1))
        encoded = encode_entry(
            self.ledger_id,
            entry_id,
            entry_id - 1,
            length,
            payload(entry_id),
            DigestType.CRC32C,
            mac_key(PASSWORD),
        )
        bookie.entries.setdefault(self.ledger_id, {})[entry_id] = encoded

    def has(self, bookie: FakeBookie) -> list[int]:
        return sorted(bookie.entries.get(self.ledger_id, {}))

    async def recover(self, config: ClientConfig = CONFIG) -> LedgerMetadata:
        async with self.cluster.client(config) as client:
            reader = await client.open_ledger(self.ledger_id, password=PASSWORD, recovery=True)
            assert [e.data async for e in reader.read(0, reader.last_entry_id)] == [
                payload(e) for e in range(reader.last_entry_id + 1)
            ]
            return reader.metadata

    async def metadata(self) -> LedgerMetadata:
        return (
            await LedgerManager(self.cluster.store).read_ledger_metadata(self.ledger_id)
        ).metadata


@contextlib.asynccontextmanager
async def open_ledger(ack_quorum: int, written: int) -> AsyncIterator[OpenLedger]:
    """Entries 0..written-1 on all three bookies."""
    async with fake_cluster(3) as cluster:
        a, b, c = cluster.bookies
        ledgers = LedgerManager(cluster.store)
        ledger_id = await ledgers.generate_ledger_id()
        metadata = LedgerMetadata.create(
            ensemble=(a.address, b.address, c.address),
            write_quorum=3,
            ack_quorum=ack_quorum,
            digest_type=DigestType.CRC32C,
            password=PASSWORD,
            ctime_ms=0,
            creator_token=b"gone",
        )
        await ledgers.create_ledger_metadata(ledger_id, metadata)
        ledger = OpenLedger(cluster, ledger_id, a, b, c)
        for entry_id in range(written):
            for bookie in (a, b, c):
                ledger.put(bookie, entry_id)
        yield ledger


def refusing_reads_of(entry_id: int, error: TallyError) -> Callable[[Request], TallyError | None]:
    def refuse(request: Request) -> TallyError | None:
        if isinstance(request, ReadRequest) and request.entry_id == entry_id:
            return error
        return None

    return refuse


async def test_recovery_fences_and_rewrites_an_entry_only_one_bookie_has() -> None:
    async with open_ledger(ack_quorum=2, written=10) as ledger:
        ledger.put(ledger.a, 10)  # never acknowledged, but it may have been: it is kept
        closed = await ledger.recover(PATIENT)  # every bookie answers: no timeout to race
        assert (closed.state, closed.last_entry_id) == (LedgerState.CLOSED, 10)
        assert closed.length == sum(len(payload(e)) for e in range(11))
        for bookie in (ledger.a, ledger.b, ledger.c):
            assert ledger.ledger_id in bookie.fenced
            assert ledger.has(bookie) == list(range(11))


@pytest.mark.parametrize("unknown", ["errors", "a timeout"])
async def test_recovery_never_closes_on_unknown_answers(unknown: str) -> None:
    async with open_ledger(ack_quorum=2, written=10) as ledger:
        ledger.put(ledger.a, 10)
        # Entry 10: a cannot serve its copy now, b has none, c is unknown. One explicit
        # negative is short of WQ - AQ + 1 = 2: entry 10 may have been acknowledged.
        ledger.a.refuse = refusing_reads_of(10, TooManyRequests("overloaded"))
        if unknown == "errors":
            ledger.c.refuse = refusing_reads_of(10, EntryUnreadable("rotten copy"))
        else:
            ledger.c.hold = True
        with pytest.raises(LedgerRecoveryFailed, match="entry 10 is undecidable"):
            await ledger.recover()
        assert (await ledger.metadata()).state is LedgerState.IN_RECOVERY
        # Once the bookies answer, a later recovery finds entry 10: nothing was cut.
        ledger.a.refuse = ledger.c.refuse = lambda request: None
        ledger.c.resume()
        closed = await ledger.recover(PATIENT)  # every bookie answers: no timeout to race
        assert (closed.state, closed.last_entry_id) == (LedgerState.CLOSED, 10)


@pytest.mark.parametrize(
    ("ack_quorum", "closed_at"),
    [(2, 9), (1, None)],  # WQ - AQ + 1 negatives: 2 with AQ = 2, but 3 with AQ = 1
)
async def test_recovery_closes_on_wq_minus_aq_plus_one_explicit_negatives(
    ack_quorum: int, closed_at: int | None
) -> None:
    async with open_ledger(ack_quorum=ack_quorum, written=10) as ledger:
        # Entry 10: b and c say NoSuchEntry, a answers an error.
        ledger.a.refuse = refusing_reads_of(10, TooManyRequests("overloaded"))
        # every bookie answers: no timeout to race on a loaded machine
        if closed_at is None:
            with pytest.raises(LedgerRecoveryFailed, match="entry 10 is undecidable"):
                await ledger.recover(PATIENT)
            assert (await ledger.metadata()).state is LedgerState.IN_RECOVERY
        else:
            closed = await ledger.recover(PATIENT)
            assert (closed.state, closed.last_entry_id) == (LedgerState.CLOSED, closed_at)


async def test_fencing_short_of_quorum_coverage_leaves_the_ledger_in_recovery() -> None:
    async with open_ledger(ack_quorum=2, written=5) as ledger:

        def refuse_fencing(request: Request) -> TallyError | None:
            if isinstance(request, ReadRequest) and request.do_fencing:
                return TooManyRequests("overloaded")
            return None

        # WQ - AQ + 1 = 2 fenced bookies are needed; only a answers.
        ledger.b.refuse = ledger.c.refuse = refuse_fencing
        with pytest.raises(LedgerRecoveryFailed, match="short of quorum coverage"):
            await ledger.recover()
        assert (await ledger.metadata()).state is LedgerState.IN_RECOVERY
        assert ledger.ledger_id in ledger.a.fenced
