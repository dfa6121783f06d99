"""`tally cluster init | nuke | settings | recover | export-bookie`: create a cluster in a
metadata store, wipe it, show and change the settings its processes share, or rebuild a lost
store from the bookies (cluster_recovery.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, TypeVar
from urllib.parse import urlsplit

import typer

from tally.cli import cluster_recovery
from tally.cli.options import Metadata, existing_metadata, required_metadata
from tally.core.deletion import parse_seconds
from tally.core.errors import TallyError
from tally.metadata.cluster import (
    InitResult,
    init_cluster,
    nuke_cluster,
    read_cluster,
    require_cluster,
)
from tally.metadata.cluster_settings import read_settings, write_settings
from tally.metadata.store import DEFAULT_CONNECT_TIMEOUT, MetadataStore
from tally.metadata.stores import open_store
from tally.metadata.underreplication import UnderReplicationManager

T = TypeVar("T")

app = typer.Typer(
    name="cluster",
    help="Create a tally cluster in a metadata store, or wipe one.",
    no_args_is_help=True,
)

app.command("recover")(cluster_recovery.recover)
app.command("export-bookie")(cluster_recovery.export_bookie)

ConnectTimeout = Annotated[
    float, typer.Option("--timeout", help="Seconds to wait for the metadata store to answer.")
]


def _with_store(uri: str, timeout: float, action: Callable[[MetadataStore], Awaitable[T]]) -> T:
    """Run `action` on a session of the store at `uri`; a tally error ends the command."""

    async def run() -> T:
        async with open_store(uri, connect_timeout=timeout) as store:
            return await action(store)

    try:
        return asyncio.run(run())
    except TallyError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


@app.command("init")
def init(metadata: Metadata = None, timeout: ConnectTimeout = DEFAULT_CONNECT_TIMEOUT) -> None:
    """Create a new cluster (with a random instance id); a no-op where one exists."""
    metadata = required_metadata(metadata)
    parts = urlsplit(metadata)
    if parts.scheme == "sqlite" and parts.path not in ("", "/"):
        # A new embedded store's directory is created here, and only here: elsewhere a
        # missing directory means a wrong URI.
        Path(parts.path).parent.mkdir(parents=True, exist_ok=True)
    result: InitResult = _with_store(metadata, timeout, init_cluster)
    info = result.info
    if result.created:
        typer.echo(
            f"initialised cluster {info.instance_id} (metadata layout version "
            f"{info.layout_version}) in {metadata}"
        )
    else:
        typer.echo(f"cluster {info.instance_id} already exists in {metadata}; nothing changed")


@app.command("nuke")
def nuke(
    metadata: Metadata = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Required: confirms that every ledger's metadata goes."),
    ] = False,
    timeout: ConnectTimeout = DEFAULT_CONNECT_TIMEOUT,
) -> None:
    """Delete the cluster and everything in it: ledgers, bookies, cookies, marks."""
    metadata = existing_metadata(metadata)
    if not force:
        typer.echo(
            f"refusing to nuke the cluster in {metadata} without --force: it deletes the "
            "metadata of every ledger, and the data on the bookies becomes unreachable",
            err=True,
        )
        raise typer.Exit(1)

    async def wipe(store: MetadataStore) -> str:
        info = await read_cluster(store)
        deleted = await nuke_cluster(store, force=True)
        if info is None:
            return f"no cluster in {metadata}; deleted {deleted} leftover keys"
        return f"nuked cluster {info.instance_id} in {metadata}: deleted {deleted} keys"

    typer.echo(_with_store(metadata, timeout, wipe))


LOST_BOOKIE_RECOVERY_DELAY = "lost_bookie_recovery_delay"
SettingChanges = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="KEY=VALUE: change a setting (repeat for several).", show_default=False
    ),
]


@app.command("settings")
def settings(
    metadata: Metadata = None,
    changes: SettingChanges = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    timeout: ConnectTimeout = DEFAULT_CONNECT_TIMEOUT,
) -> None:
    """Show the cluster settings (delete retention, archival, tombstones, lost bookie
    recovery delay), or change them with --set KEY=VALUE; durations are in seconds."""
    uri = existing_metadata(metadata)
    wanted: dict[str, str] = {}
    for change in changes or []:
        key, sep, value = change.partition("=")
        if not sep or not key.strip():
            typer.echo(f"error: --set takes KEY=VALUE, got {change!r}", err=True)
            raise typer.Exit(2)
        wanted[key.strip()] = value
    delay_text = wanted.pop(LOST_BOOKIE_RECOVERY_DELAY, None)

    async def apply(store: MetadataStore) -> dict[str, object]:
        await require_cluster(store, uri=uri)
        under_replication = UnderReplicationManager(store)
        current = await read_settings(store)
        updated = current.with_text_values(wanted)
        if delay_text is not None:
            delay = parse_seconds(LOST_BOOKIE_RECOVERY_DELAY, delay_text)
            await under_replication.set_lost_bookie_recovery_delay(delay)
        if updated != current:
            await write_settings(store, updated)
        delay_now = await under_replication.lost_bookie_recovery_delay()
        return {**updated.to_dict(), LOST_BOOKIE_RECOVERY_DELAY: delay_now}

    shown = _with_store(uri, timeout, apply)
    if json_output:
        typer.echo(json.dumps(shown, indent=2))
        return
    for name, shown_value in shown.items():
        text = str(shown_value).lower() if isinstance(shown_value, bool) else str(shown_value)
        if name == LOST_BOOKIE_RECOVERY_DELAY and shown_value is None:
            text = "unset (each auditor uses its configured default)"
        typer.echo(f"{name} = {text}")
