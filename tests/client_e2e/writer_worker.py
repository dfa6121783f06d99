"""A ledger writer in its own OS process, for tests that kill, pause or fence it for real.

    python writer_worker.py --metadata URI --ensemble 3 --write-quorum 3 --ack-quorum 2 \
        --password pw --seed 7 [--window 32] [--interval 0] [--add-timeout 10] [--commands]

It creates a ledger and prints, one flushed line each (the test reads them as they come):

    LEDGER <qualified name>
    ACK <entry id> <payload hex>            once the add was acknowledged by an ack quorum
    ERROR <entry id> <error type> <message> the first append that failed; no more are sent
    CLOSED <last add confirmed>             or CLOSE-ERROR <error type> <message>
    DONE <last add confirmed>               (--commands) a command is finished

By default it appends pipelined (`--window` adds in flight) until it is killed or an
append fails, then tries to close. With `--commands` it reads lines from stdin instead:
`append N` appends N entries, `close` closes, `exit` leaves. Payloads are `payload(seed,
entry id)`, so a test also knows the bytes of entries it never saw acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys

import tally
from tally.client.writer import LedgerWriter
from tally.core.errors import TallyError


def payload(seed: int, entry_id: int) -> bytes:
    """The bytes of entry `entry_id` of the worker run with `seed`; some are empty."""
    rng = random.Random(seed * 1_000_003 + entry_id)
    return rng.randbytes(rng.choice((0, rng.randint(1, 64), rng.randint(64, 700))))


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Appender:
    """Issues appends in entry order and reports each outcome; stops at the first error."""

    def __init__(self, writer: LedgerWriter, seed: int) -> None:
        self.writer = writer
        self.seed = seed
        self.issued = 0
        self.failed = False
        self.in_flight: set[asyncio.Task[None]] = set()

    def issue(self) -> None:
        entry_id = self.issued
        self.issued += 1
        task = asyncio.get_running_loop().create_task(self._one(entry_id))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    async def _one(self, expected: int) -> None:
        data = payload(self.seed, expected)
        try:
            entry_id = await self.writer.append(data)
        except TallyError as error:
            if not self.failed:
                self.failed = True
                say(f"ERROR {expected} {type(error).__name__} {error}")
            return
        if entry_id != expected:
            say(f"MISMATCH {expected} {entry_id}")
        say(f"ACK {entry_id} {data.hex()}")

    async def drain(self) -> None:
        while self.in_flight:
            await asyncio.wait(set(self.in_flight))


async def close(writer: LedgerWriter) -> None:
    try:
        await writer.close()
    except TallyError as error:
        say(f"CLOSE-ERROR {type(error).__name__} {error}")
    else:
        say(f"CLOSED {writer.last_add_confirmed}")


async def stream(appender: Appender, window: int, interval: float) -> None:
    while not appender.failed:
        while len(appender.in_flight) >= window and not appender.failed:
            await asyncio.wait(set(appender.in_flight), return_when=asyncio.FIRST_COMPLETED)
        if appender.failed:
            break
        appender.issue()
        await asyncio.sleep(interval)
    await appender.drain()
    await close(appender.writer)


async def commands(appender: Appender) -> None:
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        verb, *args = line.split()
        if verb == "append":
            for _ in range(int(args[0])):
                appender.issue()
            await appender.drain()
        elif verb == "close":
            await close(appender.writer)
        elif verb == "exit":
            return
        say(f"DONE {appender.writer.last_add_confirmed}")


async def main(options: argparse.Namespace) -> None:
    config = tally.ClientConfig(add_entry_timeout=options.add_timeout)
    async with tally.Client(options.metadata, config=config) as client:
        writer = await client.create_ledger(
            ensemble_size=options.ensemble,
            write_quorum=options.write_quorum,
            ack_quorum=options.ack_quorum,
            password=options.password.encode(),
        )
        say(f"LEDGER {writer.ledger_id.qualified_name}")
        appender = Appender(writer, options.seed)
        if options.commands:
            await commands(appender)
        else:
            await stream(appender, options.window, options.interval)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metadata", required=True)
    parser.add_argument("--ensemble", type=int, required=True)
    parser.add_argument("--write-quorum", type=int, required=True)
    parser.add_argument("--ack-quorum", type=int, required=True)
    parser.add_argument("--password", default="")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=32, help="appends in flight")
    parser.add_argument("--interval", type=float, default=0.0, help="seconds between appends")
    parser.add_argument("--add-timeout", type=float, default=10.0)
    parser.add_argument("--commands", action="store_true", help="take commands on stdin")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
