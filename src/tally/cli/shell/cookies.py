"""`cookie get`, `cookie update` and `cookie delete`: a bookie's identity in the store,
changed only while the bookie is stopped, so a running bookie never loses the cookie it
checks its disks against.

`cookie update` is how an operator adds ledger directories to a bookie or brings back one
whose disk was replaced: it runs on the bookie's machine, with the bookie's configuration
(the [bookie] section of --config, TALLY_BOOKIE_* variables, or its flags), since it
formats the directories as well as the stored cookie.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tally.bookie.cookie_check import DirectoriesUpdate, update_directories
from tally.cli.options import Metadata
from tally.cli.shell import output
from tally.cli.shell.common import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    Bookie,
    Force,
    Json,
    bookie_config,
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


def cookie_update(
    bookie: Bookie,
    data_dir: Annotated[
        Path | None, typer.Option(help="The bookie's --data-dir, unless its config says.")
    ] = None,
    ledger_dirs: Annotated[
        str | None,
        typer.Option(help="The bookie's ledger directories, comma-separated, all of them."),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Confirms bringing back a ledger directory found empty that had not failed, "
            "or dropping one (the bookie's copies of their ledgers are then repaired from "
            "the other copies), or bringing a failed one back with its data.",
        ),
    ] = False,
    metadata: Metadata = None,
) -> None:
    """Make a stopped bookie's cookie list the ledger directories of its configuration:
    new, empty ones are formatted (more disks), and so are empty ones standing for a failed
    disk that was replaced (its ledgers are repaired onto the bookie from their other
    copies). With --force, a failed directory whose ledgers had nowhere else to go comes
    back with its data, once its disk was checked. Restart the bookie afterwards; no ledger
    moves."""

    async def update(store: MetadataStore) -> DirectoriesUpdate:
        if await BookieRegistry(store).registration(bookie) is not None:
            raise fail(
                f"bookie {bookie} is running (registered); stop it before updating its cookie",
                EXIT_FAILED,
            )
        config = bookie_config({"data_dir": data_dir, "ledger_dirs": ledger_dirs})
        return await update_directories(
            CookieManager(store),
            bookie,
            config.journal_directory,
            config.ledger_directories,
            force=force,
        )

    done = with_store(metadata, update)
    changes = [
        f"{what} {directory}"
        for what, directories in (
            ("added", done.added),
            ("brought back empty", done.replaced),
            ("brought back with its data", done.restored),
            ("dropped", done.removed),
            ("still failed", done.still_failed),
        )
        for directory in directories
    ]
    typer.echo(
        f"cookie of bookie {bookie}: {'; '.join(changes) or 'nothing to change'}; "
        f"ledger directories {', '.join(done.cookie.directories[1:])}"
    )


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
