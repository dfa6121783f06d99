"""The client against bookies that die, hang and rot, four real bookie processes: ensemble
changes, write errors after the ack quorum, recovery with bookies down, corrupt copies.

Each test starts from four running, registered bookies (`healthy`)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

import tally
import tally.client.writer as writer_module
from tally.client.bookie_connection import BookieConnection
from tally.core.digest import DigestType, mac_key, master_key
from tally.core.entry_format import Buffer, EntryEncoder, decode_entry, encode_entry
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerState
from tally.core.schedule import write_set
from tally.errors import (
    BadDigest,
    BookieUnavailable,
    EntryUnreadable,
    LedgerRecoveryFailed,
    NoSuchEntry,
    NotEnoughBookies,
)
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.underreplication import UnderReplicationManager
from tests.client_e2e.conftest import (
    FAST,
    Cluster,
    eventually_writable,
    extra_copies,
    read_all,
    replica_copies,
    running_cluster,
    store_session,
    writer_process,
)
from tests.client_e2e.writer_worker import payload
from tests.support.polling import until

BOOKIES = 4
PASSWORD = b"faults"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("faults"), BOOKIES) as cluster:
        yield cluster


async def test_bookie_killed_mid_stream_writer_changes_ensemble(healthy: Cluster) -> None:
    cluster = healthy
    payloads = [random.Random(i).randbytes(i % 300) for i in range(2500)]
    async with tally.Client(cluster.uri, config=FAST) as client:
        w = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        first_ensemble = w.metadata.metadata.segments[0].ensemble
        victim = first_ensemble[1]

        acked = 0

        async def append(data: bytes) -> int:
            nonlocal acked
            entry_id = await w.append(data)
            acked += 1
            return entry_id

        tasks = []
        for data in payloads:
            tasks.append(asyncio.create_task(append(data)))
            if len(tasks) % 100 == 0:
                await asyncio.sleep(0.005)  # a steady stream rather than one burst
            if len(tasks) == 800:
                # Mid-stream: after some adds were acknowledged, so the new ensemble starts
                # a segment of its own (before any, it would take the first one's place).
                await until(lambda: acked >= 100, "the first acknowledgements")
                cluster.kill(victim)
        assert await asyncio.gather(*tasks) == list(range(2500))
        # Acknowledged by the other two, the adds may all be done before the writer hears
        # of the dead bookie; it replaces it once it does.
        await until(lambda: len(w.metadata.metadata.segments) >= 2, "the ensemble change")
        segments = w.metadata.metadata.segments
        assert victim not in segments[-1].ensemble
        assert victim in segments[0].ensemble
        await w.close()

    async with tally.Client(cluster.uri, config=FAST) as other:
        r = await other.open_ledger(w.ledger_id, password=PASSWORD, recovery=True)
        assert r.last_entry_id == 2499
        assert r.metadata.segments == segments
        assert await read_all(r) == dict(enumerate(payloads))
    # The newcomer got the entries from its segment's first on, nothing below it; what the
    # killed bookie may hold past its segment would be extra copies left from its position.
    live = {b.address for b in cluster.bookies} - {victim}
    assert await extra_copies(w.ledger_id, r.metadata, live) == []


async def test_write_error_after_ack_quorum_changes_ensemble_and_marks(healthy: Cluster) -> None:
    cluster = healthy
    config = dataclasses.replace(FAST, add_entry_timeout=1.0)
    async with tally.Client(cluster.uri, config=config) as client:
        w = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        ensemble = w.metadata.metadata.segments[0].ensemble
        for i in range(5):
            await w.append(b"before %d" % i)
        slow = ensemble[0]
        cluster.pause(slow)
        started = time.monotonic()
        for i in range(5, 10):
            assert await w.append(b"acked by two %d" % i) == i
        assert time.monotonic() - started < config.add_entry_timeout  # no wait for the third

        # The slow bookie's adds time out after they were acknowledged: the writer replaces
        # it before any later add, from LAC + 1 on.
        deadline = time.monotonic() + 10
        while len(w.metadata.metadata.segments) < 2:
            assert time.monotonic() < deadline, "no ensemble change"
            await asyncio.sleep(0.05)
        first, second = w.metadata.metadata.segments
        assert second.first_entry_id == 10
        assert first.ensemble == ensemble
        # Only the slow bookie's position changes, to a bookie new to the ledger.
        assert second.ensemble[1:] == ensemble[1:]
        assert second.ensemble[0] not in ensemble
        for i in range(10, 15):
            assert await w.append(b"after %d" % i) == i
        await w.close()

    expected = {
        i: (b"before %d" if i < 5 else b"acked by two %d" if i < 10 else b"after %d") % i
        for i in range(15)
    }
    async with store_session(cluster.uri) as store:
        mark = await UnderReplicationManager(store).under_replicated(w.ledger_id)
        record = await LedgerManager(store).read_ledger_metadata(w.ledger_id)
    assert mark is not None, "the ledger was not marked under-replicated"
    assert slow in mark.missing_bookies
    assert record.metadata.state is LedgerState.CLOSED
    assert record.metadata.last_entry_id == 14
    async with tally.Client(cluster.uri, config=FAST) as other:
        r = await other.open_ledger(w.ledger_id, password=PASSWORD)
        assert await read_all(r) == expected


async def test_close_bounds_its_wait_for_a_stalled_third_copy_and_marks_it(
    healthy: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = healthy
    # The adds' own timeout is far: the close's bound is what ends the wait.
    config = dataclasses.replace(FAST, add_entry_timeout=30.0, close_copies_timeout=1.0)
    async with tally.Client(cluster.uri, config=config) as client:
        w = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        stalled = w.metadata.metadata.segments[0].ensemble[2]
        await w.append(b"warm-up")  # every connection open before the pause
        cluster.pause(stalled)
        futures = [w.append_nowait(b"entry %d" % i) for i in range(1, 300)]
        assert await asyncio.gather(*futures) == list(range(1, 300))
        started = time.monotonic()
        await w.close()
        assert 1.0 <= time.monotonic() - started < 5.0
    async with store_session(cluster.uri) as store:
        mark = await UnderReplicationManager(store).under_replicated(w.ledger_id)
        record = await LedgerManager(store).read_ledger_metadata(w.ledger_id)
    assert (record.metadata.state, record.metadata.last_entry_id) == (LedgerState.CLOSED, 299)
    assert len(record.metadata.segments) == 1
    assert mark is not None
    assert mark.missing_bookies == {stalled}
    assert not [r for r in caplog.records if "failed entry" in r.getMessage()]


async def test_recovery_aborts_with_too_many_bookies_down_and_never_closes_early(
    healthy: Cluster, worker_log: Path
) -> None:
    """b3 misses entries 10..19 (paused, then killed); b1 and b2 have them. With only b3
    up recovery must abort, not close at 9; with b2 back (b1 still down) it ends at 19."""
    cluster = healthy
    seed = 11
    async with writer_process(
        cluster.uri,
        (3, 3, 2),
        seed=seed,
        password=PASSWORD.decode(),
        stderr=worker_log,
        options=("--commands", "--add-timeout", "60"),
    ) as worker:
        ledger_id = worker.ledger_id
        assert ledger_id is not None
        assert await worker.command("append 10") == "DONE 9"
        async with store_session(cluster.uri) as store:
            ensemble = (
                (await LedgerManager(store).read_ledger_metadata(ledger_id))
                .metadata.segments[0]
                .ensemble
            )
        b1, b2, b3 = ensemble
        await _until_held(b3, ledger_id, 9)  # acknowledged by two: b3 may still be journaling
        cluster.pause(b3)
        assert await worker.command("append 10") == "DONE 19"
        await worker.kill()
        cluster.kill(b3)  # the adds it had not read yet die with it
        cluster.restart([b3])
        assert await _held(b3, ledger_id, 19) == list(range(10))

        cluster.kill(b1)
        cluster.kill(b2)
        async with tally.Client(cluster.uri, config=FAST) as client:
            with pytest.raises(LedgerRecoveryFailed):
                await client.open_ledger(ledger_id, password=PASSWORD, recovery=True)
            async with store_session(cluster.uri) as store:
                record = await LedgerManager(store).read_ledger_metadata(ledger_id)
            assert record.metadata.state is LedgerState.IN_RECOVERY
            # Still only b3: a retry aborts again rather than settle for what b3 has.
            with pytest.raises(LedgerRecoveryFailed):
                await client.open_ledger(ledger_id, password=PASSWORD, recovery=True)

            await asyncio.to_thread(cluster.restart, [b2])  # the loop keeps the session alive
            r = await client.open_ledger(ledger_id, password=PASSWORD, recovery=True)
            assert r.is_closed
            assert r.last_entry_id == 19
            assert max(worker.acked) == 19
            entries = await read_all(r)
            assert entries == {e: payload(seed, e) for e in range(20)}
            assert all(entries[e] == data for e, data in worker.acked.items())
            assert r.metadata.length == sum(map(len, entries.values()))

        # The recovered end holds when every bookie is back.
        cluster.restart([b1])
        async with tally.Client(cluster.uri, config=FAST) as client:
            again = await client.open_ledger(ledger_id, password=PASSWORD, recovery=True)
            assert again.last_entry_id == 19


async def test_recovery_with_one_bookie_down_completes(healthy: Cluster, worker_log: Path) -> None:
    cluster = healthy
    seed = 12
    async with writer_process(
        cluster.uri,
        (3, 3, 2),
        seed=seed,
        password=PASSWORD.decode(),
        stderr=worker_log,
        options=("--window", "64"),
    ) as worker:
        ledger_id = worker.ledger_id
        assert ledger_id is not None
        await worker.until_acked(300)
        await worker.kill()
        async with store_session(cluster.uri) as store:
            ensemble = (
                (await LedgerManager(store).read_ledger_metadata(ledger_id))
                .metadata.segments[-1]
                .ensemble
            )
        cluster.kill(ensemble[0])
        async with tally.Client(cluster.uri, config=FAST) as client:
            r = await client.open_ledger(ledger_id, password=PASSWORD, recovery=True)
            assert max(worker.acked) <= r.last_entry_id
            entries = await read_all(r)
            assert entries == {e: payload(seed, e) for e in range(r.last_entry_id + 1)}


async def test_recovery_replaces_a_dead_bookie_that_an_unconfirmed_entry_needs(
    healthy: Cluster,
) -> None:
    """E3 WQ2 AQ2, writer gone: entry 9 is past the LAC the bookies know (8) and one bookie
    of its write set is dead, so its re-write reaches one copy of two. Recovery replaces
    that bookie from entry 9 on, as BookKeeper's does, instead of staying IN_RECOVERY."""
    cluster = healthy
    quiet = dataclasses.replace(FAST, explicit_lac_interval=0)
    async with tally.Client(cluster.uri, config=quiet) as abandoned:
        writer = await abandoned.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
        )
        for entry_id in range(10):
            await writer.append(payload(5, entry_id))
        ledger_id = writer.ledger_id
        ensemble = writer.metadata.metadata.segments[0].ensemble
    victim = ensemble[write_set(9, 3, 2)[0]]
    cluster.kill(victim)
    async with tally.Client(cluster.uri, config=FAST) as client:
        r = await client.open_ledger(ledger_id, password=PASSWORD, recovery=True)
        assert r.is_closed
        assert r.last_entry_id == 9
        first, second = r.metadata.segments
        assert (first.first_entry_id, second.first_entry_id) == (0, 9)
        assert victim in first.ensemble
        assert victim not in second.ensemble
        assert await read_all(r) == {e: payload(5, e) for e in range(10)}
    holders = [second.ensemble[p] for p in write_set(9, 3, 2)]
    assert victim not in holders
    for bookie in holders:  # the re-written entry is on both bookies of its new write set
        connection = await BookieConnection.connect(bookie, request_timeout=5.0)
        try:
            raw = await connection.read(ledger_id, 9)
        finally:
            await connection.close()
        decoded = decode_entry(raw, DigestType.CRC32C, mac_key(PASSWORD))
        assert decoded.payload == payload(5, 9)
    # The re-write went to the new segment's write set only, not to any other bookie.
    live = {b.address for b in cluster.bookies} - {victim}
    assert await extra_copies(ledger_id, r.metadata, live) == []


async def test_a_bookie_that_failed_is_kept_out_of_new_ensembles_while_registered(
    healthy: Cluster,
) -> None:
    """A dead bookie stays registered until its session lapses; the client that saw it
    fail (its quarantine) keeps it out of new ensembles meanwhile."""
    cluster = healthy
    async with tally.Client(cluster.uri, config=FAST) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        victim = writer.metadata.metadata.segments[0].ensemble[0]
        cluster.kill(victim)
        for entry_id in range(5):
            await writer.append(payload(6, entry_id))
        assert victim not in writer.metadata.metadata.segments[-1].ensemble
        assert victim in await client.context.registry.writable_bookies(), "not lapsed yet"
        for _ in range(8):
            other = await client.create_ledger(
                ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
            )
            assert victim not in other.metadata.metadata.segments[0].ensemble
        await writer.close()


async def test_corrupt_copy_is_read_from_another_replica_and_reported(
    healthy: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = healthy
    payloads = [random.Random(f"rot {i}").randbytes(64) for i in range(20)]
    async with tally.Client(cluster.uri, config=FAST) as client:
        w = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=3, password=PASSWORD
        )
        await asyncio.gather(*(w.append(p) for p in payloads))
        await w.close()
    metadata = w.metadata.metadata
    target = 7
    ensemble = metadata.ensemble_at(target)
    rotten = ensemble[write_set(target, 3, 3)[0]]  # the replica a read asks first

    bookie = cluster.bookie(rotten)
    assert bookie.stop() == 0  # a clean stop checkpoints the entries into the entry logs
    logs = sorted((bookie.data_dir / "ledgers" / "logs").glob("*.log"))
    hits = [(path, path.read_bytes().find(payloads[target])) for path in logs]
    hits = [(path, offset) for path, offset in hits if offset >= 0]
    assert len(hits) == 1, hits
    path, offset = hits[0]
    with path.open("r+b") as log_file:
        log_file.seek(offset + 10)
        byte = log_file.read(1)
        log_file.seek(offset + 10)
        log_file.write(bytes([byte[0] ^ 0x40]))
    cluster.restart([rotten])

    # The bookie knows its copy is rotten: it says so rather than "no such entry".
    connection = await BookieConnection.connect(rotten, request_timeout=5.0)
    try:
        with pytest.raises(EntryUnreadable):
            await connection.read(w.ledger_id, target)
        assert await connection.read(w.ledger_id, target + 1)
    finally:
        await connection.close()

    before = _corrupt_copies()
    caplog.set_level(logging.ERROR, logger="tally.client.reader")
    async with tally.Client(cluster.uri, config=FAST) as client:
        r = await client.open_ledger(w.ledger_id, password=PASSWORD)
        assert (await r.read_entry(target)).data == payloads[target]
        assert await read_all(r) == dict(enumerate(payloads))
    assert _corrupt_copies() - before >= 1
    reports = [
        rec.getMessage()
        for rec in caplog.records
        if rec.name == "tally.client.reader" and rec.levelno == logging.ERROR
    ]
    assert any(
        f"entry {target} " in m and rotten in m and str(w.ledger_id) in m for m in reports
    ), reports

    copies = await replica_copies(w.ledger_id, metadata, PASSWORD, 19)
    assert copies[target][rotten] == "EntryCorrupt", "marked corrupt by the bookie's read"
    assert [c for b, c in copies[target].items() if b != rotten] == [payloads[target]] * 2


async def test_copies_failing_the_client_digest_fail_over_then_raise_bad_digest(
    healthy: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Copies whose CRC32C is sound (the bookie stores them) but whose HMAC is not the
    ledger's: the client's own digest check is the last line of defence."""
    cluster = healthy
    async with tally.Client(cluster.uri, config=FAST) as client:
        w = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=3, password=PASSWORD, digest="hmac"
        )
        for i in range(5):
            await w.append(b"genuine %d" % i)
        await w.close()
        ensemble = w.metadata.metadata.ensemble_at(2)
        replicas = [ensemble[p] for p in write_set(2, 3, 3)]
        forged = encode_entry(
            w.ledger_id, 2, 1, 100, b"forged", DigestType.HMAC, mac_key(b"not the password")
        )

        async def forge(bookie: str) -> None:
            connection = await BookieConnection.connect(bookie, request_timeout=5.0)
            try:  # a re-add replaces the copy, as a replication worker's would
                await connection.add(forged, master_key(PASSWORD), recovery=True)
            finally:
                await connection.close()

        caplog.set_level(logging.ERROR, logger="tally.client.reader")
        await forge(replicas[0])
        before = _corrupt_copies()
        r = await client.open_ledger(w.ledger_id, password=PASSWORD)
        assert (await r.read_entry(2)).data == b"genuine 2"
        assert _corrupt_copies() - before == 1
        assert any(replicas[0] in rec.getMessage() for rec in caplog.records)

        for bookie in replicas[1:]:
            await forge(bookie)
        with pytest.raises(BadDigest):
            await r.read_entry(2)
        assert _corrupt_copies() - before == 4
        assert (await r.read_entry(3)).data == b"genuine 3"


async def test_not_enough_bookies_to_create_or_to_change_ensemble(healthy: Cluster) -> None:
    cluster = healthy
    down = cluster.bookies[0].address
    cluster.kill(down)
    alive = {b.address for b in cluster.bookies} - {down}
    await eventually_writable(cluster.uri, alive)
    async with tally.Client(cluster.uri, config=FAST) as client:
        with pytest.raises(NotEnoughBookies):
            await client.create_ledger(ensemble_size=4, write_quorum=2, ack_quorum=2)
        w = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        assert set(w.metadata.metadata.segments[0].ensemble) == alive
        for i in range(10):
            await w.append(b"%d" % i)

        async def append_until_refused() -> None:
            for i in range(10, 1000):
                await w.append(b"%d" % i)

        cluster.kill(sorted(alive)[0])
        with pytest.raises(NotEnoughBookies):
            await append_until_refused()
        last = w.last_add_confirmed
        assert last >= 9
        await w.close()
        r = await client.open_ledger(w.ledger_id, password=PASSWORD)
        assert r.last_entry_id == last
        assert await read_all(r) == {i: b"%d" % i for i in range(last + 1)}


def _corrupt_copies() -> float:
    return REGISTRY.get_sample_value("client_read_corrupt_copies_total") or 0.0


async def _held(bookie: str, ledger_id: LedgerId, last: int) -> list[int]:
    """The entries 0..last the bookie has."""
    connection = await BookieConnection.connect(bookie, request_timeout=5.0)
    try:
        held = []
        for entry_id in range(last + 1):
            try:
                await connection.read(ledger_id, entry_id)
            except (tally.errors.NoSuchEntry, tally.errors.NoSuchLedger):
                continue
            held.append(entry_id)
        return held
    finally:
        await connection.close()


async def _until_held(bookie: str, ledger_id: LedgerId, last: int, timeout: float = 10.0) -> None:
    """Wait until the bookie has every entry 0..last."""
    deadline = time.monotonic() + timeout
    while (held := await _held(bookie, ledger_id, last)) != list(range(last + 1)):
        assert time.monotonic() < deadline, f"{bookie} holds only {held} of 0..{last}"
        await asyncio.sleep(0.05)


async def test_tail_reader_follows_the_writer_across_ensemble_changes(healthy: Cluster) -> None:
    """Both bookies of an E=2 ledger are replaced one after the other while a reader
    follows without recovery: it must learn the new segments to go on reading."""
    cluster = healthy
    config = dataclasses.replace(FAST, explicit_lac_interval=0.2)
    async with (
        tally.Client(cluster.uri, config=config) as a,
        tally.Client(cluster.uri, config=FAST) as b,
    ):
        w = await a.create_ledger(ensemble_size=2, write_quorum=2, ack_quorum=2, password=PASSWORD)
        first, second = w.metadata.metadata.segments[0].ensemble
        for i in range(10):
            await w.append(b"%d" % i)
        tail = await b.open_ledger(w.ledger_id, password=PASSWORD, recovery=False)
        assert await tail.wait_for(9, timeout=10) == 9

        for victim, start in ((first, 10), (second, 20)):
            cluster.kill(victim)
            for i in range(start, start + 10):
                assert await w.append(b"%d" % i) == i
        assert len(w.metadata.metadata.segments) == 3
        assert not {first, second} & set(w.metadata.metadata.segments[-1].ensemble)

        assert await tail.wait_for(29, timeout=10) == 29
        # Entries 0..9 had both their copies on the two dead bookies; the rest is readable.
        assert [(e.entry_id, e.data) async for e in tail.read(10, 29)] == [
            (i, b"%d" % i) for i in range(10, 30)
        ]
        await w.close()
        assert await tail.update_last_add_confirmed() == 29
        assert tail.is_closed


async def test_a_late_dial_failure_to_a_replaced_bookie_does_not_wedge_the_writer(
    healthy: Cluster,
) -> None:
    """A dial to a dead bookie can fail after the writer has already replaced it (a SYN
    to a host that is gone takes its time). That stale failure must not count against
    the replacement at the same position: with WQ = AQ the entry would never confirm."""
    cluster = healthy
    async with tally.Client(cluster.uri, config=FAST) as client:
        w = await client.create_ledger(
            ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
        )
        victim = w.metadata.metadata.segments[0].ensemble[0]
        pool = client.context.bookies
        real_get = pool.get
        dials = 0

        async def get(bookie: str) -> BookieConnection:
            nonlocal dials
            if bookie != victim:
                return await real_get(bookie)
            dials += 1
            if dials > 1:  # the later dials fail only once the victim was replaced
                while victim in w.metadata.metadata.segments[-1].ensemble:
                    await asyncio.sleep(0.001)
            raise BookieUnavailable(f"bookie {victim}: cannot connect (injected)")

        pool.get = get  # type: ignore[method-assign]
        appended = await asyncio.wait_for(
            asyncio.gather(*(w.append(b"%d" % i) for i in range(10))), 10
        )
        assert appended == list(range(10))
        assert dials > 1
        assert victim not in w.metadata.metadata.segments[-1].ensemble
        await w.close()
        r = await client.open_ledger(w.ledger_id, password=PASSWORD)
        assert await read_all(r) == {i: b"%d" % i for i in range(10)}


async def test_an_entry_changed_in_the_writer_after_its_digest_is_refused_by_every_bookie(
    healthy: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 002's white-box test: the entry's bytes change in the client after its digest
    was computed (and before the frame's CRC32C): the bookies check the CRC32C digest on
    the way in, the add fails, the writer stops, and no copy of it exists anywhere."""
    cluster = healthy

    class Corrupting(EntryEncoder):
        __slots__ = ()

        def encode(
            self, entry_id: int, last_add_confirmed: int, length: int, payload: Buffer
        ) -> bytes:
            encoded = bytearray(super().encode(entry_id, last_add_confirmed, length, payload))
            if entry_id == 3:
                encoded[-1] ^= 0x04
            return bytes(encoded)

    monkeypatch.setattr(writer_module, "EntryEncoder", Corrupting)
    async with tally.Client(cluster.uri, config=FAST) as client:
        w = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        for i in range(3):
            await w.append(b"sound %d" % i)
        with pytest.raises(BadDigest):
            await w.append(b"changed after its digest")
    for bookie in w.metadata.metadata.ensemble_at(3):
        connection = await BookieConnection.connect(bookie, request_timeout=5.0)
        try:
            with pytest.raises(NoSuchEntry):
                await connection.read(w.ledger_id, 3)
            assert await connection.read(w.ledger_id, 2)
        finally:
            await connection.close()
    async with tally.Client(cluster.uri, config=FAST) as client:
        reader = await client.open_ledger(w.ledger_id, password=PASSWORD)
        assert reader.last_entry_id == 2
