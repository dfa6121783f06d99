"""`tally shell ...`: an operator's commands on a running cluster, named as in BookKeeper's shell.

Each command opens its own session on the metadata store (and, to read or write entries,
a client), does one thing and says what it found: a rich table for people, or with
`--json` one JSON document (a list, `[]` when empty) for scripts. The exit code tells a
script what happened without parsing any message (see `HELP`).

The JSON views are those of the admin HTTP app (tally.metadata.views): one shape for a
script whichever face it asks.

This module builds the command tree; each group of commands lives in its own module.
"""

from __future__ import annotations

import typer

from tally.cli.shell import (
    autorecovery,
    bookies,
    cookies,
    deletes,
    gc,
    ledgers,
    scrub,
    simpletest,
)
from tally.cli.shell.common import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    shell_options,
)

HELP = f"""Inspect and operate a running tally cluster (BookKeeper's shell commands).

Every command takes --metadata URI; without it, $TALLY_METADATA, else the local
cluster under ./.tally (sqlite:///$PWD/.tally/meta.db). A LEDGER is a classic id
(42) or a 128-bit qualified name (32 hex digits). --json prints one JSON document
for scripts (readledger: one JSON object a line).

\b
Exit codes:
  {EXIT_OK}  done
  {EXIT_FAILED}  the operation failed (a verify mismatch, unreachable bookies, a wrong password)
  {EXIT_USAGE}  bad usage or arguments
  {EXIT_NOT_FOUND}  not found: no such ledger, bookie or cookie
  {EXIT_UNAVAILABLE}  the metadata store is unreachable, or holds no cluster (`tally cluster init`)
"""

app = typer.Typer(name="shell", help=HELP, no_args_is_help=True)
app.callback()(shell_options)
app.command("listbookies")(bookies.list_bookies)
app.command("bookieinfo")(bookies.bookie_info)
app.command("listledgers")(ledgers.list_ledgers)
app.command("ledgermetadata")(ledgers.ledger_metadata)
app.command("readledger")(ledgers.read_ledger)
app.command("deleteledger")(deletes.delete_ledger)
app.command("undeleteledger")(deletes.undelete_ledger)
app.command("setarchived")(deletes.set_archived)
app.command("recover")(ledgers.recover_ledger)
app.command("simpletest")(simpletest.simple_test)
app.command("triggergc")(gc.trigger_gc)
app.command("gcstatus")(gc.gc_status)
app.command("scrub")(scrub.scrub)
app.command("whoisauditor")(autorecovery.who_is_the_auditor)
app.command("listunderreplicated")(autorecovery.list_under_replicated)
app.command("triggeraudit")(autorecovery.trigger_audit)

cookie_app = typer.Typer(
    name="cookie", help="A bookie's cookie in the store.", no_args_is_help=True
)
cookie_app.command("get")(cookies.cookie_get)
cookie_app.command("update")(cookies.cookie_update)
cookie_app.command("delete")(cookies.cookie_delete)
app.add_typer(cookie_app)

gc_app = typer.Typer(
    name="gc", help="A bookie's garbage collection: what it keeps.", no_args_is_help=True
)
gc_app.command("orphans")(gc.gc_orphans)
app.add_typer(gc_app)

delay_app = typer.Typer(
    name="lostbookierecoverydelay",
    help="Seconds the auditor waits before it marks a lost bookie's ledgers under-replicated.",
    no_args_is_help=True,
)
delay_app.command("get")(autorecovery.delay_get)
delay_app.command("set")(autorecovery.delay_set)
app.add_typer(delay_app)
