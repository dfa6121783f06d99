"""`whoisauditor`, `listunderreplicated`, `triggeraudit` and `lostbookierecoverydelay`: what
auto-recovery is doing and the one setting an operator changes while it runs, all through
the store, where the auditor and the replication workers read and leave their state.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tally.cli.options import Metadata
from tally.cli.shell import output
from tally.cli.shell.common import EXIT_UNAVAILABLE, Json, fail, with_store
from tally.metadata.auditor_election import who_is_auditor
from tally.metadata.store import MetadataStore
from tally.metadata.underreplication import UnderReplicationManager
from tally.metadata.views import lost_entries_view, under_replicated_view


def who_is_the_auditor(metadata: Metadata = None, json_output: Json = False) -> None:
    """The bookie that is the elected auditor now, if any."""
    auditor = with_store(metadata, who_is_auditor)
    if json_output:
        output.print_json({"auditor": auditor})
    elif auditor is None:
        typer.echo("no auditor is elected")
    else:
        typer.echo(f"auditor: {auditor}")


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
        with output.progress() as progress:
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

    views = with_store(metadata, walk)
    if json_output:
        output.print_json(views)
        return
    if lost:
        lost_rows = [
            (
                v["ledger_id"],
                ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in v["entries"]),
                v["reason"],
                output.local_time(v["recorded_ms"]),
            )
            for v in views
        ]
        title = f"{len(views)} ledgers with lost entries"
        output.console().print(
            output.table(title, ("ledger", "entries", "why", "recorded"), lost_rows)
        )
        return
    rows = [
        (
            v["ledger_id"],
            " ".join(v["missing_bookies"]) or "(all)",
            output.local_time(v["first_marked_ms"]),
        )
        for v in views
    ]
    columns = ("ledger", "missing bookies", "first marked")
    output.console().print(output.table(f"{len(views)} under-replicated ledgers", columns, rows))


def trigger_audit(metadata: Metadata = None, json_output: Json = False) -> None:
    """Ask the elected auditor to run every check now (exit 4 when no auditor runs)."""

    async def trigger(store: MetadataStore) -> tuple[str | None, int | None]:
        auditor = await who_is_auditor(store)
        if auditor is None:
            return None, None
        return auditor, await UnderReplicationManager(store).request_audit()

    auditor, requested_ms = with_store(metadata, trigger)
    if auditor is None:
        raise fail(
            "no auditor is elected: start `tally autorecovery` (tally local up starts one)",
            EXIT_UNAVAILABLE,
        )
    if json_output:
        output.print_json({"auditor": auditor, "requested_ms": requested_ms})
    else:
        typer.echo(f"audit requested from auditor {auditor}")


def delay_get(metadata: Metadata = None, json_output: Json = False) -> None:
    """Print the delay (unset: the auditor uses its configured default)."""
    seconds = with_store(
        metadata, lambda store: UnderReplicationManager(store).lost_bookie_recovery_delay()
    )
    if json_output:
        output.print_json({"seconds": seconds})
    elif seconds is None:
        typer.echo("lost bookie recovery delay: not set (the auditor's configured default)")
    else:
        typer.echo(f"lost bookie recovery delay: {seconds} s")


def delay_set(
    seconds: Annotated[int, typer.Argument(min=0, help="Seconds (0: at once).")],
    metadata: Metadata = None,
) -> None:
    """Set the delay for the whole cluster; a running auditor picks it up."""
    with_store(
        metadata,
        lambda store: UnderReplicationManager(store).set_lost_bookie_recovery_delay(seconds),
    )
    typer.echo(f"lost bookie recovery delay set to {seconds} s")
