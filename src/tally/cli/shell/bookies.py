"""`listbookies` and `bookieinfo`: the cluster's bookies as the store knows them
(registration, placement, cookie), so an operator sees a bookie that is down as well as one
that is up.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import typer

from tally.cli.options import Metadata
from tally.cli.shell import output
from tally.cli.shell.common import EXIT_NOT_FOUND, EXIT_USAGE, Bookie, Json, fail, with_store
from tally.client.bookie_connection import BookieConnection
from tally.core.errors import TallyError
from tally.metadata.bookie_registry import BookieRegistry
from tally.metadata.cookies import CookieManager
from tally.metadata.store import MetadataStore
from tally.metadata.views import bookie_view, bookie_views

PROBE_TIMEOUT = 2.0
"""Seconds bookieinfo waits for a bookie to accept a connection."""


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
        raise fail("give at most one of --writable, --readonly and --all", EXIT_USAGE)
    states = (
        ("writable",)
        if writable
        else ("readonly",)
        if readonly
        else ("writable", "readonly", "down")
        if all_bookies
        else ("writable", "readonly")
    )
    views = with_store(metadata, lambda store: bookie_views(store, states))
    if json_output:
        output.print_json(views)
        return
    columns = ("bookie", "state", "address", "version", "started", "rack")
    rows = [
        (
            v["bookie_id"],
            v["state"],
            v["address"],
            v["version"],
            output.local_time(v["start_time_ms"]),
            v["rack"],
        )
        for v in views
    ]
    output.console().print(output.table(f"{len(views)} bookies", columns, rows))


def bookie_info(bookie: Bookie, metadata: Metadata = None, json_output: Json = False) -> None:
    """A bookie's registration (with its failed ledger directories), placement and cookie,
    and whether it accepts connections."""

    async def look(store: MetadataStore) -> dict[str, Any]:
        registry = BookieRegistry(store)
        registration, placement, cookie = await asyncio.gather(
            registry.registration(bookie),
            registry.placement(bookie),
            CookieManager(store).get(bookie),
        )
        if registration is None and cookie is None:
            raise fail(
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

    view = with_store(metadata, look)
    if json_output:
        output.print_json(view)
        return
    view["start_time_ms"] = output.local_time(view["start_time_ms"])
    view["directories"] = " ".join(view["directories"] or ())
    view["failed_ledger_dirs"] = " ".join(view["failed_ledger_dirs"] or ()) or "-"
    rows = [(name.replace("_", " "), value) for name, value in view.items()]
    output.console().print(output.table(f"bookie {bookie}", ("field", "value"), rows))


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
