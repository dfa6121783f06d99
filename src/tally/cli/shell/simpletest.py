"""`simpletest`: an end-to-end check of a cluster, writing entries derived from a seed so the
read-back verifies every byte without keeping a copy of what was written.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections import deque
from typing import Annotated, Any

import typer

from tally.cli.options import Metadata
from tally.cli.shell import output
from tally.cli.shell.common import EXIT_FAILED, EXIT_USAGE, Json, fail, open_client, run
from tally.client.reader import LedgerReader
from tally.client.writer import LedgerWriter
from tally.core.errors import BadRequest
from tally.core.schedule import check_quorums

WRITE_WINDOW = 256
"""Entries simpletest keeps in flight: enough to pipeline, few enough to bound memory."""


def _payload(seed: bytes, entry_id: int, size: int) -> bytes:
    """Entry `entry_id`'s bytes: derived, so the read-back needs no copy of what was written."""
    return hashlib.shake_128(seed + entry_id.to_bytes(8, "big")).digest(size)


async def _write_entries(writer: LedgerWriter, seed: bytes, entries: int, size: int) -> None:
    """Append the entries, WRITE_WINDOW in flight, then close the ledger."""
    pending: deque[asyncio.Task[int]] = deque()
    with output.progress() as progress:
        task = progress.add_task("writing", total=entries)
        try:
            for entry_id in range(entries):
                pending.append(asyncio.create_task(writer.append(_payload(seed, entry_id, size))))
                if len(pending) >= WRITE_WINDOW:
                    await pending.popleft()
                    progress.advance(task)
            while pending:
                await pending.popleft()
                progress.advance(task)
        finally:
            for add in pending:
                add.cancel()
    await writer.close()


async def _mismatched_entries(
    reader: LedgerReader, seed: bytes, entries: int, size: int
) -> list[int]:
    """The ids of the entries whose bytes read back are not those written."""
    mismatched: list[int] = []
    with output.progress() as progress:
        task = progress.add_task("reading", total=entries)
        async for entry in reader.read(0, entries - 1):
            if entry.data != _payload(seed, entry.entry_id, size):
                mismatched.append(entry.entry_id)
            progress.advance(task)
    return mismatched


def simple_test(
    metadata: Metadata = None,
    entries: Annotated[int, typer.Option("--entries", min=1, help="Entries to write.")] = 100,
    entry_size: Annotated[int, typer.Option("--entry-size", min=1, help="Bytes per entry.")] = 1024,
    ensemble: Annotated[int, typer.Option("--ensemble", "-e", help="Ensemble size E.")] = 3,
    write_quorum: Annotated[int, typer.Option("--write-quorum", "-w", help="Write quorum.")] = 2,
    ack_quorum: Annotated[int, typer.Option("--ack-quorum", "-a", help="Ack quorum.")] = 2,
    json_output: Json = False,
) -> None:
    """Create a ledger, write entries, read them back and verify them, delete it."""
    try:
        check_quorums(ensemble, write_quorum, ack_quorum)
    except BadRequest as error:
        raise fail(str(error), EXIT_USAGE) from None
    seed = os.urandom(16)
    password = seed.hex()

    async def test() -> dict[str, Any]:
        async with open_client(metadata) as client:
            writer = await client.create_ledger(
                ensemble_size=ensemble,
                write_quorum=write_quorum,
                ack_quorum=ack_quorum,
                password=password.encode(),
            )
            ledger = writer.ledger_id
            try:
                started = time.perf_counter()
                await _write_entries(writer, seed, entries, entry_size)
                written = time.perf_counter() - started
                started = time.perf_counter()
                reader = await client.open_ledger(ledger, password=password.encode())
                mismatched = await _mismatched_entries(reader, seed, entries, entry_size)
                read = time.perf_counter() - started
            except BaseException:
                typer.echo(
                    f"simpletest: ledger {ledger} left in place (password {password})", err=True
                )
                raise
            if mismatched:
                raise fail(
                    f"ledger {ledger}: {len(mismatched)} entries read back differ from what "
                    f"was written (first: {mismatched[:10]}); the ledger is left in place "
                    f"(password {password})",
                    EXIT_FAILED,
                )
            await client.delete_ledger(ledger)
            mib = entries * entry_size / 2**20
            return {
                "ledger_id": str(ledger),
                "ensemble": list(writer.metadata.metadata.segments[0].ensemble),
                "ensemble_size": ensemble,
                "write_quorum": write_quorum,
                "ack_quorum": ack_quorum,
                "entries": entries,
                "entry_size": entry_size,
                "write_seconds": round(written, 3),
                "writes_per_second": round(entries / written, 1),
                "write_mib_per_second": round(mib / written, 3),
                "read_seconds": round(read, 3),
                "reads_per_second": round(entries / read, 1),
                "verified": True,
                "deleted": True,
            }

    summary = run(test)
    if json_output:
        output.print_json(summary)
        return
    summary["ensemble"] = " ".join(summary["ensemble"])
    rows = [(name.replace("_", " "), value) for name, value in summary.items()]
    output.console().print(output.table("simpletest passed", ("", ""), rows))
