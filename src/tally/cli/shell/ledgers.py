"""`listledgers`, `ledgermetadata`, `readledger` and `recover`: one ledger or
all of them, looked at through the store or, for entries and recovery, through a client.
"""

from __future__ import annotations

import base64
import json
import sys
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from tally.cli.options import Metadata
from tally.cli.shell import output
from tally.cli.shell.common import (
    EXIT_FAILED,
    Json,
    Ledger,
    Password,
    open_client,
    run,
    with_store,
)
from tally.client.reader import LedgerReader
from tally.core.ledger_metadata import LedgerState
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.store import MetadataStore
from tally.metadata.views import ledger_view


def list_ledgers(metadata: Metadata = None, json_output: Json = False) -> None:
    """List every ledger (state, quorums, end, size) in id order; --json: all metadata."""

    async def walk(store: MetadataStore) -> tuple[list[dict[str, Any]], list[str]]:
        views: list[dict[str, Any]] = []
        unreadable: list[str] = []
        with output.progress() as progress:
            task = progress.add_task("ledgers", total=None)
            async for page in LedgerManager(store).ledger_pages():
                views += (ledger_view(record) for record in page.ledgers)
                unreadable += (f"{u.path}: {u.error}" for u in page.unreadable)
                progress.advance(task, len(page.ledgers) + len(page.unreadable))
        return views, unreadable

    views, unreadable = with_store(metadata, walk)
    if json_output:
        output.print_json(views)
    else:
        columns = ("ledger", "state", "E/WQ/AQ", "last entry", "bytes")
        rows = [
            (
                v["ledger_id"],
                v["state"],
                f"{v['ensemble_size']}/{v['write_quorum']}/{v['ack_quorum']}",
                v["last_entry_id"],
                v["length"],
            )
            for v in views
        ]
        output.console().print(output.table(f"{len(views)} ledgers", columns, rows))
    if unreadable:
        for line in unreadable:
            typer.echo(f"error: unreadable ledger metadata {line}", err=True)
        raise typer.Exit(EXIT_FAILED)


def ledger_metadata(ledger: Ledger, metadata: Metadata = None, json_output: Json = False) -> None:
    """A ledger's metadata, with every segment's ensemble of bookies."""

    async def read(store: MetadataStore) -> dict[str, Any]:
        return ledger_view(await LedgerManager(store).read_ledger_metadata(ledger))

    view = with_store(metadata, read)
    if json_output:
        output.print_json(view)
        return
    segments = view.pop("segments")
    view["custom_metadata"] = ", ".join(f"{k}={v}" for k, v in view["custom_metadata"].items())
    view["ctime_ms"] = f"{view['ctime_ms']} ({output.local_time(view['ctime_ms'])})"
    console = output.console()
    rows = [(name.replace("_", " "), value) for name, value in view.items()]
    console.print(output.table(f"ledger {ledger}", ("field", "value"), rows))
    bounds = [(s["first_entry_id"], s["last_entry_id"], " ".join(s["ensemble"])) for s in segments]
    console.print(output.table("segments", ("first entry", "last entry", "ensemble"), bounds))


def read_ledger(
    ledger: Ledger,
    metadata: Metadata = None,
    first: Annotated[int, typer.Option("--first", help="First entry to read.")] = 0,
    last: Annotated[
        int | None,
        typer.Option("--last", help="Last entry to read; default the last readable one."),
    ] = None,
    password: Password = "",
    json_output: Annotated[
        bool, typer.Option("--json", help="One JSON object a line: entry_id, size, base64 data.")
    ] = False,
) -> None:
    """Print a ledger's entries, without recovering it (a live writer is left alone)."""

    async def read() -> None:
        async with open_client(metadata) as client:
            reader = await client.open_ledger(ledger, password=password.encode(), recovery=False)
            end = reader.last_entry_id if last is None else last
            if last is None and end < first:
                if not json_output:
                    typer.echo(f"ledger {ledger} has no entries from {first} on", err=True)
                return
            await _print_entries(reader, first, end, json_output)

    run(read)


async def _print_entries(reader: LedgerReader, first: int, last: int, json_lines: bool) -> None:
    table = Table("entry", "bytes", "data", title=f"ledger {reader.ledger_id}")
    with output.progress() as progress:
        task = progress.add_task("entries", total=last - first + 1)
        async for entry in reader.read(first, last):
            if json_lines:
                document = {
                    "entry_id": entry.entry_id,
                    "size": len(entry.data),
                    "data_base64": base64.b64encode(entry.data).decode(),
                }
                sys.stdout.write(json.dumps(document) + "\n")
            else:
                table.add_row(
                    str(entry.entry_id), str(len(entry.data)), Text(output.preview(entry.data))
                )
            progress.advance(task)
    if not json_lines:
        output.console().print(table)


def recover_ledger(
    ledger: Ledger, password: Password = "", metadata: Metadata = None, json_output: Json = False
) -> None:
    """Recover a ledger (fence it, find its end, close it) and print where it ends."""

    async def recover() -> dict[str, Any]:
        async with open_client(metadata) as client:
            before = await client.context.ledgers.read_ledger_metadata(ledger)
            reader = await client.open_ledger(ledger, password=password.encode(), recovery=True)
            return {
                "ledger_id": str(ledger),
                "qualified_name": ledger.qualified_name,
                "state_before": before.metadata.state.name,
                "state": reader.metadata.state.name,
                "last_entry_id": reader.last_entry_id,
                "length": reader.metadata.length,
            }

    view = run(recover)
    if json_output:
        output.print_json(view)
        return
    already = " (it was already closed)" if view["state_before"] == LedgerState.CLOSED.name else ""
    typer.echo(
        f"ledger {ledger} is {view['state']}{already}: last entry {view['last_entry_id']}, "
        f"{view['length']} bytes"
    )
