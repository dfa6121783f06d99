"""`scrub`: a bookie's scrub passes (every stored entry read back and checked), and a pass
now, through the admin HTTP app each bookie serves (bookie_admin.py)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from tally.cli.options import Metadata
from tally.cli.shell import output
from tally.cli.shell.bookie_admin import HTTP_TIMEOUT, OptionalBookie, admin_urls, call
from tally.cli.shell.common import Json

COLUMNS = ("started", "ended", "why", "seconds", "entries", "bytes", "corrupt", "unreadable")
SHOWN_CORRUPT = 20
"""Corrupt entries listed per bookie (--json lists them all)."""


def scrub(
    bookie: OptionalBookie = None,
    now: Annotated[
        bool,
        typer.Option(
            "--now",
            help="Start a pass now at full speed (or make the pass under way go on at full "
            "speed) and wait for it to end.",
        ),
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for the pass with --now.")
    ] = HTTP_TIMEOUT,
    metadata: Metadata = None,
    json_output: Json = False,
) -> None:
    """A bookie's (or every bookie's) scrub passes, the pass under way, and the entries
    found corrupt; with --now, a pass now."""
    statuses = {}
    for bookie_id, url in admin_urls(metadata, bookie).items():
        if now:
            call(bookie_id, "PUT", f"{url}/api/v1/bookie/scrub?wait=true", timeout)
        status = call(bookie_id, "GET", f"{url}/api/v1/bookie/scrub")
        status["corrupt"] = call(bookie_id, "GET", f"{url}/api/v1/bookie/corrupt_entries")
        statuses[bookie_id] = status
    if json_output:
        output.print_json(statuses)
        return
    console = output.console()
    for bookie_id, status in statuses.items():
        rows = [_row(status["current"], "under way")] if status["current"] else []
        rows += [_row(done, "complete") for done in status["passes"]]
        title = f"scrub passes of {bookie_id}"
        console.print(output.table(title, COLUMNS, rows))
        typer.echo(f"{bookie_id}: {_schedule(status)}")
        _print_corrupt(bookie_id, status["corrupt"])


def _row(scrub: dict[str, Any], state: str) -> tuple[object, ...]:
    ended = output.local_time(int(scrub["ended"] * 1000)) if scrub["ended"] else state
    return (
        output.local_time(int(scrub["started"] * 1000)),
        ended,
        scrub["trigger"],
        scrub["seconds"],
        f"{scrub['entries']:,}",
        f"{scrub['bytes']:,}",
        scrub["corrupt"],
        scrub["unreadable"],
    )


def _schedule(status: dict[str, Any]) -> str:
    rate = status["rate_bytes_per_second"]
    how = "configured" if status["rate_configured"] else "the ledger disk's size over the interval"
    if not status["interval"]:
        when = "passes only when asked (scrub_interval 0)"
    elif status["current"]:
        when = "a pass is under way"
    elif status["next_pass_due"] <= time.time():
        when = "next pass due now"
    else:
        when = f"next pass due {output.local_time(int(status['next_pass_due'] * 1000))}"
    return (
        f"{when}; every {status['interval']:g} s at {rate:,} bytes/s ({how}); "
        f"{status['corrupt_entries']} entries marked corrupt"
    )


def _print_corrupt(bookie_id: str, corrupt: list[dict[str, Any]]) -> None:
    if not corrupt:
        return
    rows = [
        (
            found["ledger_id"],
            found["entry_id"],
            found["found_by"],
            output.local_time(int(found["found_at"] * 1000)),
        )
        for found in corrupt[:SHOWN_CORRUPT]
    ]
    output.console().print(
        output.table(
            f"entries marked corrupt on {bookie_id}", ("ledger", "entry", "found by", "at"), rows
        )
    )
    if len(corrupt) > SHOWN_CORRUPT:
        typer.echo(f"... and {len(corrupt) - SHOWN_CORRUPT} more (--json lists them all)")
