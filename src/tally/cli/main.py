"""The root of the `tally` command; each face registers its sub-commands here."""

from __future__ import annotations

import typer

from tally.cli import cluster, demo

app = typer.Typer(
    name="tally",
    help="tally: a durable, replicated log store built on the design of Apache BookKeeper.",
    no_args_is_help=True,
    add_completion=False,
)
app.command("demo")(demo.run)
app.add_typer(cluster.app, name="cluster")


@app.callback()
def main() -> None:
    """Keeps `tally` a group of commands even while it has only one."""


if __name__ == "__main__":
    app()
