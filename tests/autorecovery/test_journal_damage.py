"""A bookie SIGKILLed before its checkpoint, its journal damaged in the middle (issue 15,
defect 6): after the restart it never answers NoSuchEntry for an entry it acknowledged, a
recovery of an open ledger over it does not truncate, and auto-recovery repairs it.

Before the fix, replay stopped at the damaged record as if it were a torn tail, dropped
every acknowledged record after it, and the bookie answered NoSuchEntry for them.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import tally
from tally.bookie.journal_entries import RecordType
from tally.bookie.journal_files import journal_files
from tally.bookie.journal_format import HEADER_SIZE, scan_records
from tally.client.bookie_connection import BookieConnection
from tally.core.answers import Answer
from tally.core.digest import mac_key
from tally.core.entry_format import decode_entry
from tally.core.errors import LedgerInLimbo, TallyError
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.schedule import write_set
from tests.autorecovery.test_end_to_end import (
    PASSWORD,
    autorecovery,
    payload,
    records,
    write_ledgers,
)
from tests.client_e2e.conftest import FAST, writer_process
from tests.client_e2e.writer_worker import payload as worker_payload
from tests.support.cluster import running_cluster
from tests.support.processes import environment

NO_CHECKPOINT = {
    "TALLY_BOOKIE_FLUSH_INTERVAL": str(3600),
    "TALLY_BOOKIE_WRITE_CACHE_MAX_BYTES": str(1 << 30),
    "TALLY_BOOKIE_LIMBO_CHECK_INTERVAL": "0.5",
}
"""Everything the bookies acknowledge stays in their journals: no checkpoint before the kill."""
WORKER_PASSWORD = "limbo"
WORKER_SEED = 15
REPAIR_TIMEOUT = 90.0


def damage_an_entry_record_mid_journal(journal: Path) -> None:
    """Flip a byte in the payload of an entry record in the middle of the journal's records,
    with valid records after it."""
    (file_id, path), *_ = journal_files(journal)
    data = bytearray(path.read_bytes())
    found = list(
        scan_records(memoryview(bytes(data)), file_id, HEADER_SIZE, len(data), end_recorded=False)
    )
    starts = [HEADER_SIZE] + [mark.offset for mark, _ in found[:-1]]
    entries = [
        (start, mark.offset)
        for start, (mark, record) in zip(starts, found, strict=True)
        if record[0] == RecordType.ENTRY
    ]
    assert len(entries) > 100, f"only {len(entries)} entry records in {path}"
    start, end = entries[len(entries) // 2]
    data[(start + end) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


async def answers_of(
    bookie: str, ledgers: dict[LedgerId, tuple[LedgerMetadata, bytes, dict[int, bytes]]]
) -> dict[tuple[LedgerId, int], bytes | TallyError]:
    """What `bookie` answers for every entry its write sets give it: the verified payload,
    which must be the one acknowledged, or the error."""
    connection = await BookieConnection.connect(bookie, request_timeout=5.0)
    found: dict[tuple[LedgerId, int], bytes | TallyError] = {}
    try:
        for ledger_id, (metadata, password, acked) in ledgers.items():
            for entry_id, expected in acked.items():
                ensemble = metadata.ensemble_at(entry_id)
                holders = write_set(entry_id, metadata.ensemble_size, metadata.write_quorum)
                if bookie not in [ensemble[p] for p in holders]:
                    continue
                try:
                    raw = await connection.read(ledger_id, entry_id)
                except TallyError as error:
                    found[ledger_id, entry_id] = error
                    continue
                entry = decode_entry(raw, metadata.digest_type, mac_key(password))
                assert entry.payload == expected, (ledger_id, entry_id)
                found[ledger_id, entry_id] = entry.payload
    finally:
        await connection.close()
    return found


def negatives(answers: dict[tuple[LedgerId, int], bytes | TallyError]) -> list[str]:
    return [
        f"{ledger_id} entry {entry_id}: {answer!r}"
        for (ledger_id, entry_id), answer in answers.items()
        if isinstance(answer, TallyError) and Answer.of(answer) is Answer.NEGATIVE
    ]


async def test_a_damaged_journal_answers_unknown_never_no_such_entry_until_repaired(
    tmp_path: Path,
) -> None:
    with environment(NO_CHECKPOINT), running_cluster(tmp_path, 3) as cluster:
        closed = await write_ledgers(cluster.uri, 2, 150)
        async with writer_process(
            cluster.uri,
            (3, 3, 2),
            seed=WORKER_SEED,
            password=WORKER_PASSWORD,
            stderr=tmp_path / "writer.stderr",
        ) as worker:
            await worker.until_acked(300)
            await worker.kill()
        open_ledger = worker.ledger_id
        assert open_ledger is not None
        acked_open = dict(worker.acked)

        victim = cluster.bookies[0]
        victim.kill()
        damage_an_entry_record_mid_journal(victim.data_dir / "journal")
        victim.start()
        assert "its journal is damaged" in victim.log()

        found = await records(cluster.uri, {**closed, open_ledger: 0})
        ledgers = {
            ledger_id: (
                found[ledger_id].metadata,
                PASSWORD,
                {e: payload(ledger_id, e, 100) for e in range(last + 1)},
            )
            for ledger_id, last in closed.items()
        }
        ledgers[open_ledger] = (
            found[open_ledger].metadata,
            WORKER_PASSWORD.encode(),
            acked_open,
        )
        answers = await answers_of(victim.address, ledgers)
        assert not negatives(answers)
        unknown = [a for a in answers.values() if isinstance(a, TallyError)]
        assert unknown, "the damaged record's entry is lost on this bookie"
        assert all(isinstance(a, LedgerInLimbo) for a in unknown), unknown

        # Recovery over the bookie in limbo does not truncate the open ledger.
        async with tally.Client(cluster.uri, config=FAST) as client:
            reader = await client.open_ledger(open_ledger, password=WORKER_PASSWORD.encode())
            assert reader.is_closed
            assert max(acked_open) <= reader.last_entry_id
            async for entry in reader.read(0, reader.last_entry_id):
                assert entry.data == worker_payload(WORKER_SEED, entry.entry_id)
            ledgers[open_ledger] = (
                reader.metadata,
                WORKER_PASSWORD.encode(),
                {e: worker_payload(WORKER_SEED, e) for e in range(reader.last_entry_id + 1)},
            )

        # The bookie marks what it lacks; a replication worker fills it; it leaves limbo.
        with autorecovery(cluster, "ar-limbo"):
            deadline = time.monotonic() + REPAIR_TIMEOUT
            while True:
                answers = await answers_of(victim.address, ledgers)
                assert not negatives(answers)
                missing = [k for k, a in answers.items() if not isinstance(a, bytes)]
                left = victim.log().count("leaves limbo")
                if not missing and left == len(ledgers):
                    break
                assert time.monotonic() < deadline, (
                    f"not repaired: {missing[:5]}, {left} ledgers out of limbo"
                )
                await asyncio.sleep(0.5)
