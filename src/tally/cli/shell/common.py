"""What every `tally shell` command shares: its arguments, its exit codes, and running it on
a session of the metadata store or a client, so each command ends the same way on an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from tally.bookie.config import BookieConfig
from tally.cli.options import ConfigFile, missing_sqlite_store
from tally.client.client import Client
from tally.client.config import ClientConfig
from tally.config import load, metadata_uri
from tally.core.errors import (
    BadRequest,
    ClusterNotInitialised,
    InvalidMetadataTransition,
    KeyExists,
    LedgerDeleted,
    MalformedData,
    MetadataStoreError,
    NoSuchKey,
    NoSuchLedger,
    NotEmpty,
    TallyError,
)
from tally.core.ids import LedgerId
from tally.metadata.cluster import require_cluster
from tally.metadata.store import MetadataStore
from tally.metadata.stores import open_store

T = TypeVar("T")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNAVAILABLE = 4

LOCAL_METADATA = Path(".tally") / "meta.db"
"""Where `tally local` keeps the embedded store, relative to the working directory."""


_config_file: list[Path | None] = [None]
"""The shell's --config (its [client] section), for the command that runs."""


def shell_options(config: ConfigFile = None) -> None:
    """Keep the shell's --config for the client a command opens (open_client)."""
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
    ((NoSuchLedger, NoSuchKey, LedgerDeleted), EXIT_NOT_FOUND),
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


def fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def run(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the command's coroutine; a tally error ends the command with its exit code."""
    try:
        return asyncio.run(work())
    except TallyError as error:
        raise fail(str(error), exit_code(error)) from None


def _resolve(metadata: str | None) -> str:
    """The store to use, refusing a sqlite file that does not exist (opening it would
    create an empty store where the user expected a cluster)."""
    given = metadata_uri(metadata)
    uri = given or f"sqlite://{Path.cwd() / LOCAL_METADATA}"
    missing = missing_sqlite_store(uri)
    if missing is not None:
        origin = "" if given else " (the default without --metadata or TALLY_METADATA)"
        raise fail(
            f"no metadata store at {missing}{origin}; create a cluster with "
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


def bookie_config(overrides: dict[str, Any]) -> BookieConfig:
    """A bookie's configuration as `tally bookie` loads it: the [bookie] section of the
    shell's --config, TALLY_BOOKIE_* variables, then `overrides` (flags; None: not given)."""
    return load(BookieConfig, "bookie", file=_config_file[0], overrides=overrides)


@contextlib.asynccontextmanager
async def open_client(metadata: str | None) -> AsyncIterator[Client]:
    uri = _resolve(metadata)
    client = Client(uri, config=load(ClientConfig, "client", file=_config_file[0]))
    try:
        await _started(client.start(), uri)
        yield client
    finally:
        await client.close()


def with_store(metadata: str | None, work: Callable[[MetadataStore], Awaitable[T]]) -> T:
    async def run_on_store() -> T:
        async with _store(metadata) as store:
            return await work(store)

    return run(run_on_store)
