"""Two writers: the ledger's writer process is paused (SIGSTOP) while another client
recovers the ledger; resumed, its adds fail with LedgerFenced. No reader, and no replica,
ever holds another value for an entry than the one the writer had acknowledged."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import tally
from tally.core.ledger_metadata import LedgerState
from tests.client_e2e.conftest import (
    FAST,
    Cluster,
    read_all,
    replica_copies,
    running_cluster,
    writer_process,
)
from tests.client_e2e.writer_worker import payload
from tests.support.polling import until

PASSWORD = b"two writers"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("two-writers"), 5) as cluster:
        yield cluster


def stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (its /proc state is T)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.parametrize(
    ("quorums", "seed"),
    [((3, 3, 2), 1), ((3, 2, 2), 2), ((5, 3, 2), 3)],
    ids=["E3-WQ3-AQ2", "E3-WQ2-AQ2", "E5-WQ3-AQ2"],
)
async def test_paused_writer_is_fenced_and_every_reader_agrees(
    cluster: Cluster, quorums: tuple[int, int, int], seed: int, worker_log: Path
) -> None:
    async with writer_process(
        cluster.uri,
        quorums,
        seed=seed,
        password=PASSWORD.decode(),
        stderr=worker_log,
        options=("--window", "16", "--interval", "0.002"),
    ) as worker:
        ledger_id = worker.ledger_id
        assert ledger_id is not None
        async with tally.Client(cluster.uri, config=FAST) as client:
            await worker.until_acked(100)
            # A reader of the open ledger, following the live writer.
            tail = await client.open_ledger(ledger_id, password=PASSWORD, recovery=False)
            seen_by_tail = await read_all(tail)
            assert len(seen_by_tail) >= 50

            worker.signal(signal.SIGSTOP)
            try:
                await until(lambda: stopped(worker.process.pid), "the writer stopped")
                recovered = await client.open_ledger(ledger_id, password=PASSWORD, recovery=True)
            finally:
                worker.signal(signal.SIGCONT)
            assert recovered.is_closed
            assert await worker.finish() == 0

            error = next(line for line in worker.lines if line.startswith("ERROR"))
            assert error.split()[2] == "LedgerFenced", error
            assert any(line.startswith("CLOSE-ERROR LedgerFenced") for line in worker.lines)
            assert not any(line.startswith(("MISMATCH", "CLOSED")) for line in worker.lines)

            last = recovered.last_entry_id
            acked = worker.acked
            assert max(acked) <= last, f"acknowledged {max(acked)}, closed at {last}"
            final = await read_all(recovered)
            assert final == {e: payload(seed, e) for e in range(last + 1)}
            for entry_id, data in acked.items():
                assert final[entry_id] == data
            for entry_id, data in seen_by_tail.items():
                assert final[entry_id] == data

            # The resumed writer changed nothing: same end, same segments.
            again = await client.open_ledger(ledger_id, password=PASSWORD, recovery=False)
            assert again.metadata.state is LedgerState.CLOSED
            assert again.metadata == recovered.metadata

            # Every replica of every entry's write set holds that value or nothing.
            copies = await replica_copies(ledger_id, recovered.metadata, PASSWORD, last)
            for entry_id, held in copies.items():
                present = [c for c in held.values() if isinstance(c, bytes)]
                assert set(present) == {final[entry_id]}, f"entry {entry_id}: {held}"
                assert len(present) >= quorums[2], f"entry {entry_id}: {held}"
                assert set(held.values()) <= {final[entry_id], "NoSuchEntry"}, held
