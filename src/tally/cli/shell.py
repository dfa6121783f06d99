"""`tally shell ...`: an operator's commands on a running cluster, named as in BookKeeper's shell.

Each command opens its own session on the metadata store (and, to read or write entries,
a client), does one thing and says what it found: a rich table for people, or with
`--json` one JSON document (a list, `[]` when empty) for scripts. The exit code tells a
script what happened without parsing any message (see `HELP`).

The JSON views are those of the admin HTTP app (tally.metadata.views): one shape for a
script whichever face it asks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import os
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from tally.cli.options import ConfigFile, Metadata
from tally.client.bookie_connection import BookieConnection
from tally.client.client import Client
from tally.client.config import ClientConfig
from tally.client.reader import LedgerReader
from tally.client.writer import LedgerWriter
from tally.config import load, metadata_uri
from tally.core.errors import (
    BadRequest,
    ClusterNotInitialised,
    InvalidMetadataTransition,
    KeyExists,
    MalformedData,
    MetadataStoreError,
    NoSuchKey,
    NoSuchLedger,
    NotEmpty,
    TallyError,
)
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerState
from tally.core.schedule import check_quorums
from tally.metadata.auditor_election import who_is_auditor
from tally.metadata.bookie_registry import BookieRegistry
from tally.metadata.cluster import require_cluster
from tally.metadata.cookies import CookieManager
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.store import MetadataStore
from tally.metadata.stores import open_store
from tally.metadata.underreplication import UnderReplicationManager
from tally.metadata.views import (
    bookie_view,
    bookie_views,
    ledger_view,
    lost_entries_view,
    under_replicated_view,
)

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNAVAILABLE = 4

HELP = f"""Inspect and operate a running tally cluster (BookKeeper's shell commands).

Every command takes --metadata URI; without it, $TALLY_METADATA, else the local
cluster under ./.tally (sqlite:///$PWD/.tally/meta.db). A LEDGER is a classic id
(42) or a 128-bit qualified name (32 hex digits). --json prints one JSON document
for scripts (readledger: one JSON object a line).

\b
Exit codes:
  {EXIT_OK}  done
  {EXIT_FAILED}  the operation failed (a verify mismatch, unreachable bookies, a wrong password)
  {EXIT_USAGE}  bad usage or arguments
  {EXIT_NOT_FOUND}  not found: no such ledger, bookie or cookie
  {EXIT_UNAVAILABLE}  the metadata store is unreachable, or holds no cluster (`tally cluster init`)
"""

LOCAL_METADATA = Path(".tally") / "meta.db"
"""Where `tally local` keeps the embedded store, relative to the working directory."""
WRITE_WINDOW = 256
"""Entries simpletest keeps in flight: enough to pipeline, few enough to bound memory."""
PREVIEW_CHARS = 60
PROBE_TIMEOUT = 2.0
"""Seconds bookieinfo waits for a bookie to accept a connection."""

app = typer.Typer(name="shell", help=HELP, no_args_is_help=True)
cookie_app = typer.Typer(
    name="cookie", help="A bookie's cookie in the store.", no_args_is_help=True
)
delay_app = typer.Typer(
    name="lostbookierecoverydelay",
    help="Seconds the auditor waits before it marks a lost bookie's ledgers under-replicated.",
    no_args_is_help=True,
)
app.add_typer(cookie_app)
app.add_typer(delay_app)


_config_file: list[Path | None] = [None]
"""The shell's --config (its [client] section), for the command that runs."""


@app.callback()
def _shell_options(config: ConfigFile = None) -> None:
    _config_file[0] = config
    # kazoo logs every failed connection attempt; the command reports the outcome once.
    logging.getLogger("kazoo").setLevel(logging.ERROR)


def _parse_ledger(value: str) -> LedgerId:
    try:
        return LedgerId.parse(value)
    except BadRequest as error:
        raise typer.BadParameter(str(error)) from None


Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
Ledger = Annotated[
    LedgerId,
    typer.Argument(
        parser=_parse_ledger,
        help="Ledger id (42) or qualified name (32 hex digits).",
        show_default=False,
    ),
]
Bookie = Annotated[str, typer.Argument(help="Bookie id (host:port).")]
Password = Annotated[
    str, typer.Option("--password", help="The ledger's password (as text, UTF-8).")
]
Force = Annotated[bool, typer.Option("--force", help="Required: confirms the deletion.")]


# --- running a command ----------------------------------------------------------------------

_EXIT_CODES: tuple[tuple[tuple[type[TallyError], ...], int], ...] = (
    ((NoSuchLedger, NoSuchKey), EXIT_NOT_FOUND),
    ((KeyExists, NotEmpty), EXIT_FAILED),
    ((ClusterNotInitialised, MetadataStoreError), EXIT_UNAVAILABLE),
    ((MalformedData, InvalidMetadataTransition), EXIT_FAILED),
    ((BadRequest,), EXIT_USAGE),
)
"""The first row whose types match an error gives the exit code; anything else is 1."""


def exit_code(error: TallyError) -> int:
    for types, code in _EXIT_CODES:
        if isinstance(error, types):
            return code
    return EXIT_FAILED


def _fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _run(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the command's coroutine; a tally error ends the command with its exit code."""
    try:
        return asyncio.run(work())
    except TallyError as error:
        raise _fail(str(error), exit_code(error)) from None


def _resolve(metadata: str | None) -> str:
    """The store to use, refusing a sqlite file that does not exist (opening it would
    create an empty store where the user expected a cluster)."""
    given = metadata_uri(metadata)
    uri = given or f"sqlite://{Path.cwd() / LOCAL_METADATA}"
    parts = urlsplit(uri)
    if parts.scheme.lower() == "sqlite" and parts.path and not Path(parts.path).exists():
        origin = "" if given else " (the default without --metadata or TALLY_METADATA)"
        raise _fail(
            f"no metadata store at {parts.path}{origin}; create a cluster with "
            f"`tally cluster init --metadata {uri}`",
            EXIT_UNAVAILABLE,
        )
    return uri


async def _started(start: Awaitable[None], uri: str) -> None:
    """Await a store's or client's start; failing to reach the store is exit code 4."""
    try:
        await start
    except (BadRequest, ClusterNotInitialised):
        raise
    except TallyError as error:
        raise MetadataStoreError(f"cannot use the metadata store {uri}: {error}") from error


@contextlib.asynccontextmanager
async def _store(metadata: str | None) -> AsyncIterator[MetadataStore]:
    uri = _resolve(metadata)
    store = open_store(uri)
    await _started(store.start(), uri)
    try:
        await require_cluster(store, uri=uri)
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def _client(metadata: str | None) -> AsyncIterator[Client]:
    uri = _resolve(metadata)
    client = Client(uri, config=load(ClientConfig, "client", file=_config_file[0]))
    try:
        await _started(client.start(), uri)
        yield client
    finally:
        await client.close()


def _with_store(metadata: str | None, work: Callable[[MetadataStore], Awaitable[T]]) -> T:
    async def run() -> T:
        async with _store(metadata) as store:
            return await work(store)

    return _run(run)


# --- output ---------------------------------------------------------------------------------


def _print_json(document: object) -> None:
    typer.echo(json.dumps(document, indent=2))


def _console() -> Console:
    return Console(highlight=False)


def _table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> Table:
    """A table whose first column (the ids a person copies) is never cut, and whose other
    cells fold rather than lose characters on a narrow terminal."""
    table = Table(title=title)
    for index, column in enumerate(columns):
        table.add_column(column, overflow="fold", no_wrap=index == 0)
    for row in rows:
        table.add_row(*(Text("-") if v is None else Text(str(v)) for v in row))
    return table


def _progress() -> Progress:
    """A progress bar on stderr, shown only to a person at a terminal."""
    console = Console(stderr=True)
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def _time(ms: int | None) -> str | None:
    if ms is None:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def _preview(data: bytes) -> str:
    """The start of an entry as text when it is printable UTF-8, else as hex."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"
    shown = data[: PREVIEW_CHARS // 2].hex()
    return f"0x{shown}" + ("…" if len(data) > PREVIEW_CHARS // 2 else "")


# --- bookies --------------------------------------------------------------------------------


@app.command("listbookies")
def list_bookies(
    metadata: Metadata = None,
    writable: Annotated[bool, typer.Option("--writable", help="Only writable bookies.")] = False,
    readonly: Annotated[bool, typer.Option("--readonly", help="Only read-only bookies.")] = False,
    all_bookies: Annotated[
        bool, typer.Option("--all", help="Also bookies that are down (formatted, unregistered).")
    ] = False,
    json_output: Json = False,
) -> None:
    """List the registered bookies: state, address, version, rack."""
    if writable + readonly + all_bookies > 1:
        raise _fail("give at most one of --writable, --readonly and --all", EXIT_USAGE)
    states = (
        ("writable",)
        if writable
        else ("readonly",)
        if readonly
        else ("writable", "readonly", "down")
        if all_bookies
        else ("writable", "readonly")
    )
    views = _with_store(metadata, lambda store: bookie_views(store, states))
    if json_output:
        _print_json(views)
        return
    columns = ("bookie", "state", "address", "version", "started", "rack")
    rows = [
        (
            v["bookie_id"],
            v["state"],
            v["address"],
            v["version"],
            _time(v["start_time_ms"]),
            v["rack"],
        )
        for v in views
    ]
    _console().print(_table(f"{len(views)} bookies", columns, rows))


@app.command("bookieinfo")
def bookie_info(bookie: Bookie, metadata: Metadata = None, json_output: Json = False) -> None:
    """A bookie's registration, placement and cookie, and whether it accepts connections."""

    async def look(store: MetadataStore) -> dict[str, Any]:
        registry = BookieRegistry(store)
        registration, placement, cookie = await asyncio.gather(
            registry.registration(bookie),
            registry.placement(bookie),
            CookieManager(store).get(bookie),
        )
        if registration is None and cookie is None:
            raise _fail(
                f"bookie {bookie} is not registered and has no cookie: not a bookie of "
                "this cluster",
                EXIT_NOT_FOUND,
            )
        view = bookie_view(bookie, registration, placement)
        view["zone"] = placement.zone if placement else None
        view["incarnation_id"] = cookie.cookie.incarnation_id if cookie else None
        view["directories"] = list(cookie.cookie.directories) if cookie else None
        view["connect_ms"] = (
            await _probe(registration.info.address) if registration is not None else None
        )
        return view

    view = _with_store(metadata, look)
    if json_output:
        _print_json(view)
        return
    view["start_time_ms"] = _time(view["start_time_ms"])
    view["directories"] = " ".join(view["directories"] or ())
    rows = [(name.replace("_", " "), value) for name, value in view.items()]
    _console().print(_table(f"bookie {bookie}", ("field", "value"), rows))


async def _probe(address: str) -> float | None:
    """Milliseconds the bookie took to accept a connection; None if it did not."""
    started = time.perf_counter()
    try:
        connection = await BookieConnection.connect(address, connect_timeout=PROBE_TIMEOUT)
    except TallyError:
        return None
    elapsed = round((time.perf_counter() - started) * 1000, 3)
    await connection.close()
    return elapsed


# --- ledgers --------------------------------------------------------------------------------


@app.command("listledgers")
def list_ledgers(metadata: Metadata = None, json_output: Json = False) -> None:
    """List every ledger (state, quorums, end, size) in id order; --json: all metadata."""

    async def walk(store: MetadataStore) -> tuple[list[dict[str, Any]], list[str]]:
        views: list[dict[str, Any]] = []
        unreadable: list[str] = []
        with _progress() as progress:
            task = progress.add_task("ledgers", total=None)
            async for page in LedgerManager(store).ledger_pages():
                views += (ledger_view(record) for record in page.ledgers)
                unreadable += (f"{u.path}: {u.error}" for u in page.unreadable)
                progress.advance(task, len(page.ledgers) + len(page.unreadable))
        return views, unreadable

    views, unreadable = _with_store(metadata, walk)
    if json_output:
        _print_json(views)
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
        _console().print(_table(f"{len(views)} ledgers", columns, rows))
    if unreadable:
        for line in unreadable:
            typer.echo(f"error: unreadable ledger metadata {line}", err=True)
        raise typer.Exit(EXIT_FAILED)


@app.command("ledgermetadata")
def ledger_metadata(ledger: Ledger, metadata: Metadata = None, json_output: Json = False) -> None:
    """A ledger's metadata, with every segment's ensemble of bookies."""

    async def read(store: MetadataStore) -> dict[str, Any]:
        return ledger_view(await LedgerManager(store).read_ledger_metadata(ledger))

    view = _with_store(metadata, read)
    if json_output:
        _print_json(view)
        return
    segments = view.pop("segments")
    view["custom_metadata"] = ", ".join(f"{k}={v}" for k, v in view["custom_metadata"].items())
    view["ctime_ms"] = f"{view['ctime_ms']} ({_time(view['ctime_ms'])})"
    console = _console()
    rows = [(name.replace("_", " "), value) for name, value in view.items()]
    console.print(_table(f"ledger {ledger}", ("field", "value"), rows))
    bounds = [(s["first_entry_id"], s["last_entry_id"], " ".join(s["ensemble"])) for s in segments]
    console.print(_table("segments", ("first entry", "last entry", "ensemble"), bounds))


@app.command("readledger")
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
        async with _client(metadata) as client:
            reader = await client.open_ledger(ledger, password=password.encode(), recovery=False)
            end = reader.last_entry_id if last is None else last
            if last is None and end < first:
                if not json_output:
                    typer.echo(f"ledger {ledger} has no entries from {first} on", err=True)
                return
            await _print_entries(reader, first, end, json_output)

    _run(read)


async def _print_entries(reader: LedgerReader, first: int, last: int, json_lines: bool) -> None:
    table = Table("entry", "bytes", "data", title=f"ledger {reader.ledger_id}")
    with _progress() as progress:
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
                table.add_row(str(entry.entry_id), str(len(entry.data)), Text(_preview(entry.data)))
            progress.advance(task)
    if not json_lines:
        _console().print(table)


@app.command("deleteledger")
def delete_ledger(ledger: Ledger, force: Force = False, metadata: Metadata = None) -> None:
    """Delete a ledger's metadata; its bookies' garbage collection then frees the data."""
    if not force:
        raise _fail(
            f"refusing to delete ledger {ledger} without --force: its entries become unreachable",
            EXIT_USAGE,
        )
    _with_store(metadata, lambda store: LedgerManager(store).remove_ledger_metadata(ledger))
    typer.echo(f"deleted ledger {ledger}")


@app.command("recover")
def recover_ledger(
    ledger: Ledger, password: Password = "", metadata: Metadata = None, json_output: Json = False
) -> None:
    """Recover a ledger (fence it, find its end, close it) and print where it ends."""

    async def recover() -> dict[str, Any]:
        async with _client(metadata) as client:
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

    view = _run(recover)
    if json_output:
        _print_json(view)
        return
    already = " (it was already closed)" if view["state_before"] == LedgerState.CLOSED.name else ""
    typer.echo(
        f"ledger {ledger} is {view['state']}{already}: last entry {view['last_entry_id']}, "
        f"{view['length']} bytes"
    )


# --- simpletest -----------------------------------------------------------------------------


def _payload(seed: bytes, entry_id: int, size: int) -> bytes:
    """Entry `entry_id`'s bytes: derived, so the read-back needs no copy of what was written."""
    return hashlib.shake_128(seed + entry_id.to_bytes(8, "big")).digest(size)


async def _write_entries(writer: LedgerWriter, seed: bytes, entries: int, size: int) -> None:
    """Append the entries, WRITE_WINDOW in flight, then close the ledger."""
    pending: deque[asyncio.Task[int]] = deque()
    with _progress() as progress:
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
    with _progress() as progress:
        task = progress.add_task("reading", total=entries)
        async for entry in reader.read(0, entries - 1):
            if entry.data != _payload(seed, entry.entry_id, size):
                mismatched.append(entry.entry_id)
            progress.advance(task)
    return mismatched


@app.command("simpletest")
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
        raise _fail(str(error), EXIT_USAGE) from None
    seed = os.urandom(16)
    password = seed.hex()

    async def test() -> dict[str, Any]:
        async with _client(metadata) as client:
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
                raise _fail(
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

    summary = _run(test)
    if json_output:
        _print_json(summary)
        return
    summary["ensemble"] = " ".join(summary["ensemble"])
    rows = [(name.replace("_", " "), value) for name, value in summary.items()]
    _console().print(_table("simpletest passed", ("", ""), rows))


# --- cookies --------------------------------------------------------------------------------


@cookie_app.command("get")
def cookie_get(bookie: Bookie, metadata: Metadata = None, json_output: Json = False) -> None:
    """Print a bookie's cookie: its directories, cluster instance and incarnation."""

    async def read(store: MetadataStore) -> dict[str, Any]:
        found = await CookieManager(store).get(bookie)
        if found is None:
            raise _fail(f"bookie {bookie} has no cookie in this cluster", EXIT_NOT_FOUND)
        cookie = found.cookie
        return {
            "bookie_id": cookie.bookie_id,
            "directories": list(cookie.directories),
            "instance_id": cookie.instance_id,
            "incarnation_id": cookie.incarnation_id,
            "version": found.version,
        }

    view = _with_store(metadata, read)
    if json_output:
        _print_json(view)
        return
    view["directories"] = " ".join(view["directories"])
    rows = [(name.replace("_", " "), value) for name, value in view.items()]
    _console().print(_table(f"cookie of bookie {bookie}", ("field", "value"), rows))


@cookie_app.command("delete")
def cookie_delete(bookie: Bookie, force: Force = False, metadata: Metadata = None) -> None:
    """Delete a stopped bookie's cookie (it formats anew at its next start)."""
    if not force:
        raise _fail(
            f"refusing to delete the cookie of bookie {bookie} without --force",
            EXIT_USAGE,
        )

    async def delete(store: MetadataStore) -> None:
        if await BookieRegistry(store).registration(bookie) is not None:
            raise _fail(
                f"bookie {bookie} is running (registered); stop it before deleting its cookie",
                EXIT_FAILED,
            )
        try:
            await CookieManager(store).delete(bookie)
        except NoSuchKey:
            raise _fail(f"bookie {bookie} has no cookie in this cluster", EXIT_NOT_FOUND) from None

    _with_store(metadata, delete)
    typer.echo(f"deleted the cookie of bookie {bookie}")


# --- auto-recovery --------------------------------------------------------------------------


@app.command("whoisauditor")
def who_is_the_auditor(metadata: Metadata = None, json_output: Json = False) -> None:
    """The bookie that is the elected auditor now, if any."""
    auditor = _with_store(metadata, who_is_auditor)
    if json_output:
        _print_json({"auditor": auditor})
    elif auditor is None:
        typer.echo("no auditor is elected")
    else:
        typer.echo(f"auditor: {auditor}")


@app.command("listunderreplicated")
def list_under_replicated(
    metadata: Metadata = None,
    missing_bookie: Annotated[
        str | None,
        typer.Option("--missing-bookie", help="Only ledgers whose copies on this bookie are lost."),
    ] = None,
    lost: Annotated[
        bool,
        typer.Option(
            "--lost", help="The ledgers with entries no copy is left of, which no worker retries."
        ),
    ] = False,
    json_output: Json = False,
) -> None:
    """List the ledgers marked under-replicated, with the bookies that lost their copies."""

    async def walk(store: MetadataStore) -> list[dict[str, Any]]:
        views: list[dict[str, Any]] = []
        manager = UnderReplicationManager(store)
        with _progress() as progress:
            task = progress.add_task("lost entries" if lost else "marks", total=None)
            if lost:
                async for record in manager.list_lost_entries():
                    views.append(lost_entries_view(record))
                    progress.advance(task)
                return views
            async for mark in manager.list_under_replicated(missing_bookie=missing_bookie):
                views.append(under_replicated_view(mark))
                progress.advance(task)
        return views

    views = _with_store(metadata, walk)
    if json_output:
        _print_json(views)
        return
    if lost:
        lost_rows = [
            (
                v["ledger_id"],
                ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in v["entries"]),
                v["reason"],
                _time(v["recorded_ms"]),
            )
            for v in views
        ]
        title = f"{len(views)} ledgers with lost entries"
        _console().print(_table(title, ("ledger", "entries", "why", "recorded"), lost_rows))
        return
    rows = [
        (v["ledger_id"], " ".join(v["missing_bookies"]) or "(all)", _time(v["first_marked_ms"]))
        for v in views
    ]
    columns = ("ledger", "missing bookies", "first marked")
    _console().print(_table(f"{len(views)} under-replicated ledgers", columns, rows))


@app.command("triggeraudit")
def trigger_audit(metadata: Metadata = None, json_output: Json = False) -> None:
    """Ask the elected auditor to run every check now (exit 4 when no auditor runs)."""

    async def trigger(store: MetadataStore) -> tuple[str | None, int | None]:
        auditor = await who_is_auditor(store)
        if auditor is None:
            return None, None
        return auditor, await UnderReplicationManager(store).request_audit()

    auditor, requested_ms = _with_store(metadata, trigger)
    if auditor is None:
        raise _fail(
            "no auditor is elected: start `tally autorecovery` (tally local up starts one)",
            EXIT_UNAVAILABLE,
        )
    if json_output:
        _print_json({"auditor": auditor, "requested_ms": requested_ms})
    else:
        typer.echo(f"audit requested from auditor {auditor}")


@delay_app.command("get")
def delay_get(metadata: Metadata = None, json_output: Json = False) -> None:
    """Print the delay (unset: the auditor uses its configured default)."""
    seconds = _with_store(
        metadata, lambda store: UnderReplicationManager(store).lost_bookie_recovery_delay()
    )
    if json_output:
        _print_json({"seconds": seconds})
    elif seconds is None:
        typer.echo("lost bookie recovery delay: not set (the auditor's configured default)")
    else:
        typer.echo(f"lost bookie recovery delay: {seconds} s")


@delay_app.command("set")
def delay_set(
    seconds: Annotated[int, typer.Argument(min=0, help="Seconds (0: at once).")],
    metadata: Metadata = None,
) -> None:
    """Set the delay for the whole cluster; a running auditor picks it up."""
    _with_store(
        metadata,
        lambda store: UnderReplicationManager(store).set_lost_bookie_recovery_delay(seconds),
    )
    typer.echo(f"lost bookie recovery delay set to {seconds} s")
