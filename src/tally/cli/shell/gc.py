"""`triggergc`, `gcstatus` and `gc orphans`: a bookie's garbage collection, through the
admin HTTP app each bookie serves (bookie_admin.py)."""

from __future__ import annotations

import urllib.parse
from typing import Annotated, Any

import typer

from tally.cli.options import Metadata
from tally.cli.shell import output
from tally.cli.shell.bookie_admin import OptionalBookie, admin_urls, call
from tally.cli.shell.common import Json


def _summary(run: dict[str, Any]) -> str:
    text = (
        f"{run['tombstones_read']} tombstones read, {len(run['ledgers_deleted'])} ledgers "
        f"deleted, {run['tombstones_acknowledged']} acknowledged"
    )
    if run["overreplication_checked"]:
        text += (
            f"; over-replication: {len(run['ledgers_trimmed'])} ledgers and "
            f"{run['entries_trimmed']} entries dropped, {len(run['orphans'])} orphans"
        )
    storage = run["storage"]
    if storage:
        deleted, compacted = storage["deleted_entry_logs"], storage["compacted_entry_logs"]
        text += (
            f"; {storage['reclaimed_bytes']:,} bytes reclaimed ({len(deleted)} entry logs "
            f"deleted, {len(compacted)} compacted)"
        )
    if run["skipped"]:
        text += f"; skipped: {'; '.join(run['skipped'])}"
    return text


def trigger_gc(
    bookie: OptionalBookie = None, metadata: Metadata = None, json_output: Json = False
) -> None:
    """Run garbage collection now on a bookie (or every bookie) and say what it did."""
    runs = {
        bookie_id: call(bookie_id, "PUT", f"{url}/api/v1/bookie/gc")
        for bookie_id, url in admin_urls(metadata, bookie).items()
    }
    if json_output:
        output.print_json(runs)
        return
    for bookie_id, run in runs.items():
        typer.echo(f"{bookie_id}: {_summary(run)} ({run['seconds']} s)")


def gc_status(
    bookie: OptionalBookie = None, metadata: Metadata = None, json_output: Json = False
) -> None:
    """The last garbage collection runs of a bookie (or every bookie), newest first."""
    details = {
        bookie_id: call(bookie_id, "GET", f"{url}/api/v1/bookie/gc_details")
        for bookie_id, url in admin_urls(metadata, bookie).items()
    }
    if json_output:
        output.print_json(details)
        return
    rows = [
        (bookie_id, output.local_time(run["started_ms"]), run["trigger"], _summary(run))
        for bookie_id, runs in details.items()
        for run in runs
    ]
    output.console().print(output.table("GC runs", ("bookie", "started", "why", "did"), rows))


def gc_orphans(
    bookie: Annotated[str, typer.Option("--bookie", help="Bookie id (host:port).")],
    delete: Annotated[
        bool, typer.Option("--delete", help="Delete them (each looked up once more first).")
    ] = False,
    metadata: Metadata = None,
    json_output: Json = False,
) -> None:
    """List the ledgers a bookie holds with neither metadata nor tombstone; --delete
    deletes them. Without --delete nothing changes (a dry run)."""
    ((bookie_id, url),) = admin_urls(metadata, bookie).items()
    orphans = call(bookie_id, "GET", f"{url}/api/v1/bookie/gc/orphans")
    deleted = None
    if delete and orphans:
        listed = urllib.parse.urlencode([("ledger_id", o["ledger_id"]) for o in orphans])
        deleted = call(bookie_id, "DELETE", f"{url}/api/v1/bookie/gc/orphans?{listed}")
    elif delete:
        deleted = []
    if json_output:
        output.print_json({"orphans": orphans, "deleted": deleted})
        return
    rows = [(o["ledger_id"], o["entries"], o["bytes"]) for o in orphans]
    output.console().print(
        output.table(f"orphan ledgers on {bookie_id}", ("ledger", "entries", "bytes"), rows)
    )
    if deleted is None:
        typer.echo(f"{len(orphans)} orphan ledger(s); nothing deleted (give --delete)")
    else:
        typer.echo(f"deleted {len(deleted)} orphan ledger(s): {', '.join(deleted) or 'none'}")
