"""The root of the `tally` command; each face registers its sub-commands here.

A command that fails ends in one line on stderr (tally.cli.failures), not a traceback.
"""

from __future__ import annotations

from typing import Annotated

import typer

from tally.cli import (
    audit,
    autorecovery,
    bench,
    bookie,
    chaos,
    cluster,
    cluster_demo,
    demo,
    local,
    shell,
)
from tally.cli.failures import OneLineFailures

app = typer.Typer(
    cls=OneLineFailures,
    name="tally",
    help="tally: a durable, replicated log store built on the design of Apache BookKeeper.",
    no_args_is_help=True,
    add_completion=False,
)
app.command("demo")(cluster_demo.run)
app.command("tour")(demo.run)
app.command("bench")(bench.run)
app.add_typer(cluster.app, name="cluster")
app.command("bookie")(bookie.run)
app.command("autorecovery")(autorecovery.run)
app.add_typer(local.app, name="local")
app.add_typer(shell.app, name="shell")
app.add_typer(audit.app, name="audit")
app.add_typer(chaos.app, name="chaos")


@app.callback()
def main(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            envvar="TALLY_DEBUG",
            help="Show a failed command's traceback instead of its one-line message.",
        ),
    ] = False,
) -> None:
    """tally: a durable, replicated log store built on the design of Apache BookKeeper."""


if __name__ == "__main__":
    app()
