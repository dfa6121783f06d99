"""`deleteledger`, `undeleteledger` and `setarchived`: the delete lifecycle of a ledger.

Every delete takes the cluster's one delete path (tally.metadata.deletion) through a
client, which checks the ledger on its bookies once more before it goes.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Any

import typer

from tally.cli.options import Metadata
from tally.cli.shell import output
from tally.cli.shell.common import Json, Ledger, Password, open_client, run, with_store
from tally.core.deletion import DeletePlan
from tally.metadata import deletion
from tally.metadata.cluster_settings import read_settings
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.store import MetadataStore

ForceOpen = Annotated[
    bool,
    typer.Option(
        "--force", help="Delete an OPEN ledger too: recover and close it first (its writer stops)."
    ),
]
Reason = Annotated[str, typer.Option("--reason", help="Why: kept with the deletion.")]


def _when(time_ms: int) -> str:
    return datetime.datetime.fromtimestamp(time_ms / 1000, datetime.UTC).isoformat(
        timespec="seconds"
    )


def delete_ledger(
    ledger: Ledger,
    force: ForceOpen = False,
    reason: Reason = "deleted with tally shell",
    password: Password = "",
    metadata: Metadata = None,
    json_output: Json = False,
) -> None:
    """Delete a ledger: checked on its bookies, DELETED (undeletable for the cluster's
    ledger_delete_retention), then a tombstone, and its bookies free the space."""

    async def delete() -> dict[str, Any]:
        async with open_client(metadata) as client:
            outcome = await client.delete_ledger(
                ledger, force=force, reason=reason, password=password.encode() or None
            )
            settings = await read_settings(client.context.ledgers.store)
        return {
            "ledger_id": str(ledger),
            "deletion": outcome.deletion.to_dict(),
            "already_deleted": outcome.plan is DeletePlan.ALREADY_DELETED,
            "tombstoned": outcome.tombstone is not None,
            "undeletable_until_ms": outcome.deletion.time_ms
            + settings.ledger_delete_retention * 1000,
        }

    view = run(delete)
    if json_output:
        output.print_json(view)
        return
    done = view["deletion"]
    verb = "was already deleted" if view["already_deleted"] else "deleted"
    if view["tombstoned"]:
        after = "its tombstone is written; its bookies now drop its data"
    else:
        after = (
            f"undelete it with `tally shell undeleteledger {ledger}` until "
            f"{_when(view['undeletable_until_ms'])}"
        )
    typer.echo(f"ledger {ledger} {verb} ({done['reason']}): {after}")
    typer.echo(f"check at deletion: {done['detail']}")


def undelete_ledger(ledger: Ledger, metadata: Metadata = None) -> None:
    """Bring a DELETED ledger back, unchanged, while it is within its retention."""

    async def undelete() -> str:
        async with open_client(metadata) as client:
            record = await client.undelete_ledger(ledger)
        return record.metadata.state.name

    state = run(undelete)
    typer.echo(f"ledger {ledger} undeleted: it is {state} again")


def set_archived(ledger: Ledger, metadata: Metadata = None) -> None:
    """Set a closed ledger's archival bit, once it has been copied elsewhere."""

    async def archive(store: MetadataStore) -> bool:
        ledgers = LedgerManager(store)
        before = (await deletion.read_existing(ledgers, ledger)).metadata.archived
        await deletion.set_archived(ledgers, ledger)
        return before

    already = with_store(metadata, archive)
    typer.echo(f"ledger {ledger} {'was already' if already else 'is now'} archived")
