"""`triggergc`, `gcstatus` and `gc orphans`: a bookie's garbage collection, through the
admin HTTP app each bookie serves (its `metrics_port`), found from its registration."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Annotated, Any

import typer

from tally.cli.options import Metadata
from tally.cli.shell import output
from tally.cli.shell.common import EXIT_FAILED, EXIT_NOT_FOUND, Json, fail, with_store
from tally.core.addresses import join_host_port, split_host_port
from tally.metadata.views import bookie_views

HTTP_TIMEOUT = 600.0
"""Seconds a GC run may take before the command gives up waiting (it goes on)."""

OptionalBookie = Annotated[
    str | None,
    typer.Option("--bookie", help="Bookie id (host:port); every registered bookie without it."),
]


def _admin_urls(metadata: str | None, bookie: str | None) -> dict[str, str]:
    """Each wanted bookie's admin HTTP base URL, by bookie id."""
    views = with_store(metadata, bookie_views)
    if bookie is not None:
        views = [view for view in views if view["bookie_id"] == bookie]
        if not views:
            raise fail(f"bookie {bookie} is not registered (is it running?)", EXIT_NOT_FOUND)
    urls = {}
    for view in views:
        if view["http_port"] is None:
            raise fail(
                f"bookie {view['bookie_id']} serves no admin HTTP; start it with a "
                "metrics_port to run its garbage collection from here",
                EXIT_FAILED,
            )
        host, _ = split_host_port(view["address"])
        urls[view["bookie_id"]] = f"http://{join_host_port(host, view['http_port'])}"
    return urls


def _call(bookie_id: str, method: str, url: str) -> Any:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as error:
        raise fail(
            f"bookie {bookie_id}: {method} {url} answered {error.code}", EXIT_FAILED
        ) from None
    except OSError as error:
        raise fail(f"bookie {bookie_id}: cannot reach {url}: {error}", EXIT_FAILED) from None


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
        bookie_id: _call(bookie_id, "PUT", f"{url}/api/v1/bookie/gc")
        for bookie_id, url in _admin_urls(metadata, bookie).items()
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
        bookie_id: _call(bookie_id, "GET", f"{url}/api/v1/bookie/gc_details")
        for bookie_id, url in _admin_urls(metadata, bookie).items()
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
    ((bookie_id, url),) = _admin_urls(metadata, bookie).items()
    orphans = _call(bookie_id, "GET", f"{url}/api/v1/bookie/gc/orphans")
    deleted = None
    if delete and orphans:
        listed = urllib.parse.urlencode([("ledger_id", o["ledger_id"]) for o in orphans])
        deleted = _call(bookie_id, "DELETE", f"{url}/api/v1/bookie/gc/orphans?{listed}")
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
