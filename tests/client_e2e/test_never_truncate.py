"""Never truncate: a writer process is SIGKILLed at a random moment, another client
recovers its ledger, and every entry the writer saw acknowledged is inside the recovered
end with its exact bytes (seed 003). TALLY_SOAK_SEEDS=N runs N seeds per configuration.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

import tally
from tally.metadata.ledger_manager import LedgerManager
from tests.client_e2e.conftest import (
    FAST,
    Cluster,
    read_all,
    replica_copies,
    running_cluster,
    store_session,
    writer_process,
)
from tests.client_e2e.writer_worker import payload

SEEDS = int(os.environ.get("TALLY_SOAK_SEEDS", "4"))
QUORUMS = [(3, 3, 2), (3, 2, 2), (5, 3, 2)]
PASSWORD = "never truncate"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("truncate"), 5) as cluster:
        yield cluster


@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.parametrize("quorums", QUORUMS, ids=lambda q: "E{}-WQ{}-AQ{}".format(*q))
async def test_killed_writer_loses_no_acknowledged_entry(
    healthy: Cluster, quorums: tuple[int, int, int], seed: int, worker_log: Path
) -> None:
    rng = random.Random(f"{quorums}-{seed}")
    window = rng.choice((1, 8, 64, 256))
    kill_after = rng.choice((0, rng.randint(1, 30), rng.randint(30, 600)))
    extra_delay = rng.uniform(0, 0.03)
    async with writer_process(
        healthy.uri,
        quorums,
        seed=seed,
        password=PASSWORD,
        stderr=worker_log,
        options=("--window", str(window)),
    ) as worker:
        await worker.until_acked(kill_after)
        await asyncio.sleep(extra_delay)
        await worker.kill()
        assert not any(line.startswith(("ERROR", "MISMATCH")) for line in worker.lines), (
            worker.lines
        )
        acked = worker.acked
        assert worker.ledger_id is not None

        async with tally.Client(healthy.uri, config=FAST) as client:
            reader = await client.open_ledger(worker.ledger_id, password=PASSWORD.encode())
            last = reader.last_entry_id
            assert reader.is_closed
            assert max(acked, default=-1) <= last, (
                f"truncated: acked {max(acked)}, closed at {last}"
            )
            entries = await read_all(reader)
            for entry_id, data in acked.items():
                assert entries[entry_id] == data, f"entry {entry_id} changed"
            # Entries recovered beyond the acknowledged ones are the writer's too, and the
            # recovered length is theirs summed.
            assert entries == {e: payload(seed, e) for e in range(last + 1)}
            assert reader.metadata.length == sum(map(len, entries.values()))

            # Every entry of the recovered ledger has at least an ack quorum of copies.
            ack_quorum = quorums[2]
            copies = await replica_copies(
                worker.ledger_id, reader.metadata, PASSWORD.encode(), last
            )
            for entry_id, held in copies.items():
                present = [c for c in held.values() if isinstance(c, bytes)]
                assert len(present) >= ack_quorum, f"entry {entry_id}: {held}"
                assert set(present) == {payload(seed, entry_id)}, f"entry {entry_id}: {held}"

            # The end stands: recovering again changes nothing.
            again = await client.open_ledger(worker.ledger_id, password=PASSWORD.encode())
            assert (again.last_entry_id, again.metadata.length) == (last, reader.metadata.length)
            await client.delete_ledger(worker.ledger_id)


@pytest.mark.parametrize("seed", [100, 101])
async def test_concurrent_recoveries_agree_on_the_end(
    healthy: Cluster, seed: int, worker_log: Path
) -> None:
    async with writer_process(
        healthy.uri,
        (3, 3, 2),
        seed=seed,
        password=PASSWORD,
        stderr=worker_log,
        options=("--window", "128"),
    ) as worker:
        await worker.until_acked(200)
        await worker.kill()
        assert worker.ledger_id is not None
        async with (
            tally.Client(healthy.uri, config=FAST) as a,
            tally.Client(healthy.uri, config=FAST) as b,
        ):
            first, second = await asyncio.gather(
                a.open_ledger(worker.ledger_id, password=PASSWORD.encode()),
                b.open_ledger(worker.ledger_id, password=PASSWORD.encode()),
            )
            assert first.metadata == second.metadata
            assert max(worker.acked) <= first.last_entry_id
            entries = await read_all(second)
            assert all(entries[e] == data for e, data in worker.acked.items())


@pytest.mark.parametrize("seed", range(200, 200 + max(2, SEEDS // 2)))
@pytest.mark.parametrize("quorums", [(3, 3, 2), (3, 2, 2)], ids=["E3-WQ3-AQ2", "E3-WQ2-AQ2"])
async def test_writer_killed_after_an_ensemble_change(
    healthy: Cluster, quorums: tuple[int, int, int], seed: int, worker_log: Path
) -> None:
    """The writer replaced a dead bookie, then died itself: recovery spans both segments."""
    rng = random.Random(seed)
    async with writer_process(
        healthy.uri,
        quorums,
        seed=seed,
        password=PASSWORD,
        stderr=worker_log,
        options=("--window", str(rng.choice((8, 64)))),
    ) as worker:
        assert worker.ledger_id is not None
        await worker.until_acked(rng.randint(20, 200))
        async with store_session(healthy.uri) as store:
            record = await LedgerManager(store).read_ledger_metadata(worker.ledger_id)
        healthy.kill(rng.choice(record.metadata.segments[0].ensemble))
        async with store_session(healthy.uri) as store:
            while len(record.metadata.segments) < 2:  # the writer noticed, and replaced it
                await asyncio.sleep(0.02)
                record = await LedgerManager(store).read_ledger_metadata(worker.ledger_id)
        await worker.until_acked(len(worker.acked) + rng.randint(1, 200))
        await asyncio.sleep(rng.uniform(0, 0.02))
        await worker.kill()

        async with tally.Client(healthy.uri, config=FAST) as client:
            reader = await client.open_ledger(worker.ledger_id, password=PASSWORD.encode())
            assert len(reader.metadata.segments) >= 2
            assert max(worker.acked) <= reader.last_entry_id
            entries = await read_all(reader)
            assert entries == {e: payload(seed, e) for e in range(reader.last_entry_id + 1)}
            assert all(entries[e] == data for e, data in worker.acked.items())
            assert reader.metadata.length == sum(map(len, entries.values()))
