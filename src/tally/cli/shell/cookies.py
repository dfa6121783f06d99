"""`cookie get` and `cookie delete`: a bookie's identity in the store, deleted only when the
bookie is stopped, so a running bookie never loses the cookie it checks its disks against.
"""

from __future__ import annotations

from typing import Any

import typer

from tally.cli.options import Metadata
from tally.cli.shell import output
from tally.cli.shell.common import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    Bookie,
    Force,
    Json,
    fail,
    with_store,
)
from tally.core.errors import NoSuchKey
from tally.metadata.bookie_registry import BookieRegistry
from tally.metadata.cookies import CookieManager
from tally.metadata.store import MetadataStore


def cookie_get(bookie: Bookie, metadata: Metadata = None, json_output: Json = False) -> None:
    """Print a bookie's cookie: its directories, cluster instance and incarnation."""

    async def read(store: MetadataStore) -> dict[str, Any]:
        found = await CookieManager(store).get(bookie)
        if found is None:
            raise fail(f"bookie {bookie} has no cookie in this cluster", EXIT_NOT_FOUND)
        cookie = found.cookie
        return {
            "bookie_id": cookie.bookie_id,
            "directories": list(cookie.directories),
            "instance_id": cookie.instance_id,
            "incarnation_id": cookie.incarnation_id,
            "version": found.version,
        }

    view = with_store(metadata, read)
    if json_output:
        output.print_json(view)
        return
    view["directories"] = " ".join(view["directories"])
    rows = [(name.replace("_", " "), value) for name, value in view.items()]
    output.console().print(output.table(f"cookie of bookie {bookie}", ("field", "value"), rows))


def cookie_delete(bookie: Bookie, force: Force = False, metadata: Metadata = None) -> None:
    """Delete a stopped bookie's cookie (it formats anew at its next start, a new
    incarnation whose ledgers the auditor marks under-replicated)."""
    if not force:
        raise fail(
            f"refusing to delete the cookie of bookie {bookie} without --force",
            EXIT_USAGE,
        )

    async def delete(store: MetadataStore) -> None:
        if await BookieRegistry(store).registration(bookie) is not None:
            raise fail(
                f"bookie {bookie} is running (registered); stop it before deleting its cookie",
                EXIT_FAILED,
            )
        try:
            await CookieManager(store).delete(bookie)
        except NoSuchKey:
            raise fail(f"bookie {bookie} has no cookie in this cluster", EXIT_NOT_FOUND) from None

    with_store(metadata, delete)
    typer.echo(
        f"deleted the cookie of bookie {bookie}: at its next start it formats anew, and the "
        "auditor marks its ledgers under-replicated"
    )
