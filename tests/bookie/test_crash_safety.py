"""SIGKILL a real bookie at random moments of a write load: every acknowledged entry survives.

One bookie process, configured so that everything that can be in flight at a crash is:
checkpoints every 200 ms and whenever 2 MiB are cached, journals rolling every 2 MiB (and
released by the checkpoints), entry logs rolling every 4 MiB. The writer, in this process,
pipelines adds over several ledgers (V1 and V2 ids) with payload sizes from 0 bytes to
128 KiB; every payload byte is a function of (ledger, entry), so a read can be checked
byte for byte. Each round writes for a seeded random time after its first acknowledged
add, SIGKILLs the bookie (in some rounds at the moment its entry log grows: in the middle
of a checkpoint), restarts it on the same port and directories, and then:

- reads every entry acknowledged in this and all earlier rounds: exactly the bytes sent;
- finds each in GET_LIST_OF_ENTRIES_OF_LEDGER, and LEDGER_INFO counting at least them,
  with a LAC no lower than any acknowledged add piggy-backed;
- reads every other entry the bookie lists: it must be one that was sent, intact (an add
  that was sent but not acknowledged may or may not survive, never damaged).

Writing then goes on in the same ledgers with new entry ids, so later rounds replay
journals across several restarts. `TALLY_CRASH_SEED=<n>` reruns a failing seed.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tally.client.bookie_connection import BookieConnection
from tally.core.digest import DigestType, master_key
from tally.core.entry_format import decode_entry, encode_entry
from tally.core.errors import TallyError
from tally.core.ids import LedgerId
from tests.support.load import add_until_gone
from tests.support.processes import BookieProcess, init_cluster

SEED = int(os.environ.get("TALLY_CRASH_SEED", "4004"))
ROUNDS = 5
CHECKPOINT_ROUNDS = {1, 3}
"""Rounds that, after their random delay, kill as soon as the entry log grows."""
MIN_DELAY, MAX_DELAY = 0.05, 1.5
CHECKPOINT_WAIT = 2.0
"""How long a checkpoint round waits for the entry log to grow before killing anyway."""
WINDOW = 128
"""Adds in flight."""
READ_BATCH = 256
KEY = master_key(b"crash-safety")
DIGEST = DigestType.CRC32C
LEDGERS = (LedgerId(0, 1), LedgerId(0, 2**63 - 1), LedgerId(7, 3), LedgerId(2**64 - 1, 2**64 - 1))
PAYLOAD_SIZES = (0, 1, 100, 100, 100, 1000, 4096, 10_000, 65_536, 131_072)

BOOKIE_ENV = {
    "TALLY_BOOKIE_FLUSH_INTERVAL": "0.2",
    "TALLY_BOOKIE_WRITE_CACHE_MAX_BYTES": str(2 << 20),
    "TALLY_BOOKIE_JOURNAL_FILE_SIZE": str(2 << 20),
    "TALLY_BOOKIE_JOURNAL_PREALLOCATE_SIZE": str(1 << 20),
    "TALLY_BOOKIE_ENTRY_LOG_SIZE_LIMIT": str(4 << 20),
    "TALLY_BOOKIE_SESSION_TIMEOUT": "2",
}


def payload(ledger_id: LedgerId, entry_id: int) -> bytes:
    """The payload of an entry: its size and every byte follow from (ledger, entry)."""
    rng = random.Random(f"{ledger_id.scope}/{ledger_id.id}/{entry_id}")
    return rng.randbytes(rng.choice(PAYLOAD_SIZES))


@dataclass(frozen=True, slots=True)
class Sent:
    """What the writer put around the payload: enough to rebuild the entry's exact bytes."""

    last_add_confirmed: int
    length: int

    def entry(self, ledger_id: LedgerId, entry_id: int) -> bytes:
        data = payload(ledger_id, entry_id)
        return encode_entry(ledger_id, entry_id, self.last_add_confirmed, self.length, data, DIGEST)


@dataclass
class Ledger:
    ledger_id: LedgerId
    next_entry: int = 0
    length: int = 0
    last_acknowledged: int = -1
    sent: dict[int, Sent] = field(default_factory=dict)
    acknowledged: set[int] = field(default_factory=set)


class Writer:
    """Pipelined adds over one connection at a time; records what was acknowledged."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.ledgers = [Ledger(ledger_id) for ledger_id in LEDGERS]
        self.first_acknowledgement = asyncio.Event()
        """Set by each run's first acknowledged add."""

    async def run(self, address: str) -> None:
        """Add until the bookie goes away."""
        self.first_acknowledgement.clear()
        await add_until_gone(
            address,
            lambda connection: self._add(connection, self.rng.choice(self.ledgers)),
            WINDOW,
        )

    def acknowledged(self) -> int:
        return sum(len(ledger.acknowledged) for ledger in self.ledgers)

    def _add(self, connection: BookieConnection, ledger: Ledger) -> asyncio.Future[None]:
        entry_id = ledger.next_entry
        data = payload(ledger.ledger_id, entry_id)
        ledger.next_entry += 1
        ledger.length += len(data)
        sent = Sent(ledger.last_acknowledged, ledger.length)
        ledger.sent[entry_id] = sent
        entry = encode_entry(
            ledger.ledger_id, entry_id, sent.last_add_confirmed, sent.length, data, DIGEST
        )
        future = connection.add_nowait(entry, KEY)

        def done(future: asyncio.Future[None]) -> None:
            if not future.cancelled() and future.exception() is None:
                ledger.acknowledged.add(entry_id)
                ledger.last_acknowledged = max(ledger.last_acknowledged, entry_id)
                self.first_acknowledgement.set()

        future.add_done_callback(done)
        return future


def entry_log_bytes(bookie: BookieProcess) -> int:
    logs = bookie.data_dir / "ledgers" / "logs"
    with os.scandir(logs) as found:
        return sum(item.stat().st_size for item in found if item.name.endswith(".log"))


async def kill_during_checkpoint(bookie: BookieProcess) -> bool:
    """SIGKILL the bookie as soon as its entry logs grow, which only a checkpoint does (it
    then still has to fdatasync, write the index and release journals). False if no
    checkpoint came within CHECKPOINT_WAIT (the bookie is killed all the same)."""
    before = entry_log_bytes(bookie)
    deadline = time.monotonic() + CHECKPOINT_WAIT
    while time.monotonic() < deadline:
        await asyncio.sleep(0.001)
        if entry_log_bytes(bookie) != before:
            bookie.kill()
            return True
    bookie.kill()
    return False


async def verify(address: str, ledgers: Iterable[Ledger], where: str) -> int:
    """Check every acknowledged entry and every entry listed; returns how many were read."""
    connection = await BookieConnection.connect(address, request_timeout=30)
    checked = 0
    try:
        for ledger in ledgers:
            ledger_id, acked = ledger.ledger_id, ledger.acknowledged
            if not ledger.sent:
                continue
            listed = set(await connection.get_list_of_entries(ledger_id))
            missing = sorted(acked - listed)
            assert not missing, (
                f"{where}: ledger {ledger_id}: {len(missing)} acknowledged entries are not "
                f"listed by GET_LIST_OF_ENTRIES_OF_LEDGER, first {missing[:10]}"
            )
            invented = sorted(listed - ledger.sent.keys())
            assert not invented, f"{where}: ledger {ledger_id} lists unsent entries {invented[:10]}"

            info = await connection.ledger_info(ledger_id)
            assert len(acked) <= info.entry_count <= len(ledger.sent), (
                f"{where}: ledger {ledger_id}: LEDGER_INFO counts {info.entry_count} entries; "
                f"{len(acked)} acknowledged, {len(ledger.sent)} sent"
            )
            assert info.entry_count == len(listed), (
                f"{where}: ledger {ledger_id}: LEDGER_INFO counts {info.entry_count} entries, "
                f"GET_LIST_OF_ENTRIES_OF_LEDGER lists {len(listed)}"
            )
            piggy_backed = max((ledger.sent[e].last_add_confirmed for e in acked), default=-1)
            assert info.last_add_confirmed >= piggy_backed, (
                f"{where}: ledger {ledger_id}: LAC {info.last_add_confirmed} after restart, "
                f"but an acknowledged add carried LAC {piggy_backed}"
            )

            # Every listed entry: the acknowledged ones must be there, the others intact.
            entry_ids = sorted(listed)
            for first in range(0, len(entry_ids), READ_BATCH):
                batch = entry_ids[first : first + READ_BATCH]
                reads = await asyncio.gather(
                    *(connection.read(ledger_id, e) for e in batch), return_exceptions=True
                )
                for entry_id, stored in zip(batch, reads, strict=True):
                    what = f"{where}: ledger {ledger_id} entry {entry_id}" + (
                        " (acknowledged)" if entry_id in acked else " (sent, not acknowledged)"
                    )
                    assert not isinstance(stored, BaseException), f"{what}: read failed: {stored!r}"
                    expected = ledger.sent[entry_id].entry(ledger_id, entry_id)
                    assert stored == expected, (
                        f"{what}: {len(stored)} bytes differ from the {len(expected)} sent"
                    )
                    decoded = decode_entry(stored, DIGEST)
                    assert decoded.payload == payload(ledger_id, entry_id), what
                    checked += 1
    finally:
        await connection.close()
    return checked


@pytest.fixture
def bookie(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterable[BookieProcess]:
    for name, value in BOOKIE_ENV.items():
        monkeypatch.setenv(name, value)
    process = BookieProcess(init_cluster(tmp_path), tmp_path / "bookie")
    try:
        yield process.start()
    finally:
        process.kill()


@pytest.mark.timeout(360)  # 26-34 s on a quiet machine; three times that on a busy one
def test_acknowledged_entries_survive_sigkill(bookie: BookieProcess) -> None:
    asyncio.run(crash_rounds(bookie))


async def crash_rounds(bookie: BookieProcess) -> None:
    rng = random.Random(SEED)
    writer = Writer(random.Random(SEED + 1))  # its draws depend on timing; the delays must not
    during_checkpoint = 0
    for round_number in range(ROUNDS):
        where = f"seed {SEED} (TALLY_CRASH_SEED), round {round_number}"
        delay = rng.uniform(MIN_DELAY, MAX_DELAY)
        before = writer.acknowledged()
        writing = asyncio.create_task(writer.run(bookie.address))
        await asyncio.wait_for(writer.first_acknowledgement.wait(), 30)
        await asyncio.sleep(delay)
        if round_number in CHECKPOINT_ROUNDS:
            in_checkpoint = await kill_during_checkpoint(bookie)
        else:
            bookie.kill()
            in_checkpoint = False
        during_checkpoint += in_checkpoint
        await asyncio.wait_for(writing, 30)
        acknowledged = writer.acknowledged() - before

        started = time.monotonic()
        await asyncio.to_thread(bookie.start)
        restarted = time.monotonic() - started
        try:
            checked = await verify(bookie.address, writer.ledgers, where)
        except (AssertionError, TallyError) as error:
            raise AssertionError(f"{error}\n--- bookie log ---\n{bookie.log()}") from error
        print(
            f"{where}: killed after {delay:.2f} s{' in a checkpoint' * in_checkpoint}, "
            f"{acknowledged} adds acknowledged, restarted in {restarted:.2f} s, "
            f"{checked} entries read back intact"
        )

    assert during_checkpoint >= 1, f"seed {SEED}: no kill landed while a checkpoint ran"
