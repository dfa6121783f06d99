"""A chaos writer: one process keeping one segmented log, as a message broker keeps a topic.

    python -m tally.chaos.writer --metadata URI --log NAME --seed N --history FILE
        --epoch WALL [--takeover LEDGER] [--rate ADDS_PER_S]

It writes a chain of ledgers (create, append, close, create the next), with entries of
random sizes whose bytes follow from the seed (`entry_payload`), and appends each outcome
to its own history file, a line as soon as it is known (a SIGKILL loses at most the line
being written). With `--takeover` it first takes the log over from a writer that died:
its last ledger is recovered (fenced and closed), then the chain goes on. An add that
fails ends its ledger: the writer closes it (or, failing that, recovers it itself) before
the next one, so a log never has two ledgers open. SIGTERM: the ledger is closed, and the
process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tally.chaos.history_file import HistoryFile
from tally.client.client import Client
from tally.client.config import ClientConfig
from tally.client.writer import LedgerWriter
from tally.core.chaos.history import (
    Added,
    Closed,
    LedgerOpened,
    Outcome,
    Recovered,
    content_digest,
)
from tally.core.errors import TallyError
from tally.core.ids import LedgerId

PASSWORD = b"chaos"
QUORUMS = ((3, 2, 2), (3, 3, 2), (4, 3, 2))
"""(E, WQ, AQ) a ledger takes, by the seed."""
ENTRIES_PER_LEDGER = (20, 300)
WINDOW = 16
"""Adds in flight at once."""
SIZES = ((0.05, 0, 0), (0.75, 1, 1024), (0.18, 1024, 16 * 1024), (0.02, 16 * 1024, 256 * 1024))
"""(share, smallest, largest) of entry sizes: mostly small, a few large, some empty."""
RETRY_DELAY = 0.5
CONFIG = ClientConfig(add_entry_timeout=3.0, read_timeout=3.0)


def entry_payload(seed: int, log: str, ledger: str, entry: int) -> bytes:
    """The bytes of an entry: anyone with the seed can tell what it must read back as."""
    rng = random.Random(f"{seed}/{log}/{ledger}/{entry}")
    pick, total = rng.random(), 0.0
    for share, smallest, largest in SIZES:
        total += share
        if pick <= total:
            return rng.randbytes(rng.randint(smallest, largest))
    return b""


class ChaosWriter:
    def __init__(self, client: Client, history: HistoryFile, log_name: str, seed: int, rate: float):
        self.client = client
        self.history = history
        self.log = log_name
        self.seed = seed
        self.rng = random.Random(f"{seed}/{log_name}/writer")
        self.actor = f"writer:{log_name}:{seed}"
        self.rate = rate
        self.stopping = asyncio.Event()

    async def run(self, takeover: LedgerId | None) -> None:
        if takeover is not None:
            await self.recover(takeover)
        while not self.stopping.is_set():
            await self.one_ledger()

    async def recover(self, ledger_id: LedgerId) -> None:
        """Fence and close the ledger, retried until it is done (the next may not open) or
        the writer stops (the harness recovers what is left open)."""
        while not self.stopping.is_set():
            started = self.history.now()
            try:
                reader = await self.client.open_ledger(ledger_id, password=PASSWORD)
            except TallyError as error:
                self._ended(
                    Recovered, started, ledger_id.qualified_name, "failed", error=str(error)
                )
                await asyncio.sleep(RETRY_DELAY)
                continue
            self._ended(Recovered, started, ledger_id.qualified_name, "ok", reader.last_entry_id)
            return

    async def one_ledger(self) -> None:
        ensemble, write_quorum, ack_quorum = self.rng.choice(QUORUMS)
        try:
            writer = await self.client.create_ledger(
                ensemble_size=ensemble,
                write_quorum=write_quorum,
                ack_quorum=ack_quorum,
                password=PASSWORD,
                custom_metadata={"log": self.log.encode()},
            )
        except TallyError:
            await asyncio.sleep(RETRY_DELAY)  # not enough bookies now: try again
            return
        name = writer.ledger_id.qualified_name
        self.history.write(
            LedgerOpened(
                t=self.history.now(),
                actor=self.actor,
                log=self.log,
                ledger=name,
                ensemble_size=ensemble,
                write_quorum=write_quorum,
                ack_quorum=ack_quorum,
            )
        )
        failed = await self.append_all(writer, name, self.rng.randint(*ENTRIES_PER_LEDGER))
        await self.close(writer, name, failed)

    async def append_all(self, writer: LedgerWriter, name: str, count: int) -> bool:
        """Append up to `count` entries, WINDOW in flight, paced at `rate`; whether one
        failed (which ends the ledger)."""
        failures: list[BaseException] = []
        in_flight: set[asyncio.Future[int]] = set()
        started = time.monotonic()
        for entry in range(count):
            if failures or self.stopping.is_set():
                break
            while len(in_flight) >= WINDOW:
                _, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            pause = started + entry / self.rate - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            payload = entry_payload(self.seed, self.log, name, entry)
            added = self._on_added(name, entry, payload, failures)
            try:
                future = writer.append_nowait(payload, None)
            except TallyError as error:  # refused at once: the writer stopped (no bookies)
                refused: asyncio.Future[int] = asyncio.get_running_loop().create_future()
                refused.set_exception(error)
                refused.add_done_callback(added)
                in_flight.add(refused)
                break
            future.add_done_callback(added)
            in_flight.add(future)
        if in_flight:
            await asyncio.wait(in_flight)
        return bool(failures)

    def _on_added(
        self, name: str, entry: int, payload: bytes, failures: list[BaseException]
    ) -> Callable[[asyncio.Future[int]], None]:
        issued = self.history.now()

        def added(future: asyncio.Future[int]) -> None:
            error = None if future.cancelled() else future.exception()
            if future.cancelled():
                error = TallyError("cancelled")
            if error is not None:
                failures.append(error)
            self.history.write(
                Added(
                    t=self.history.now(),
                    t_start=issued,
                    actor=self.actor,
                    log=self.log,
                    ledger=name,
                    entry=entry if error is None else None,
                    digest=content_digest(payload),
                    size=len(payload),
                    outcome="ok" if error is None else "failed",
                    error="" if error is None else str(error),
                )
            )

        return added

    async def close(self, writer: LedgerWriter, name: str, failed: bool) -> None:
        started = self.history.now()
        try:
            await writer.close()
        except TallyError as error:
            self._ended(Closed, started, name, "failed", error=str(error))
            await self.recover(writer.ledger_id)  # the log's next ledger waits for its end
            return
        early = "an add failed: closed early" if failed else ""
        self._ended(Closed, started, name, "ok", writer.last_add_confirmed, early)

    def _ended(
        self,
        kind: type[Closed | Recovered],
        started: float,
        name: str,
        outcome: Outcome,
        last_entry: int = -1,
        error: str = "",
    ) -> None:
        """Record a close of the ledger, or its recovery, and how it went."""
        self.history.write(
            kind(
                t=self.history.now(),
                t_start=started,
                actor=self.actor,
                log=self.log,
                ledger=name,
                outcome=outcome,
                last_entry=last_entry,
                error=error,
            )
        )


async def _main(arguments: argparse.Namespace) -> None:
    history = HistoryFile(Path(arguments.history), arguments.epoch)
    async with Client(arguments.metadata, config=CONFIG) as client:
        writer = ChaosWriter(client, history, arguments.log, arguments.seed, arguments.rate)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, writer.stopping.set)
        takeover = None if arguments.takeover is None else LedgerId.parse(arguments.takeover)
        await writer.run(takeover)
    history.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--epoch", type=float, required=True)
    parser.add_argument("--takeover")
    parser.add_argument("--rate", type=float, default=100.0)
    arguments = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(_main(arguments))
    sys.exit(0)


if __name__ == "__main__":
    main()
