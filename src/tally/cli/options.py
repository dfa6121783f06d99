"""Options that several commands share, defined once: the metadata store, a config file,
Spark settings.

The metadata store's URI comes from `--metadata`, else from $TALLY_METADATA
(tally.config); a component's own variable (TALLY_BOOKIE_METADATA, ...) may still give it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Metadata = Annotated[
    str | None,
    typer.Option(
        "--metadata",
        help="Metadata store URI: sqlite:///path/meta.db, zk://host:port\\[/chroot] or "
        "memory://; default: $TALLY_METADATA.",
        show_default=False,
    ),
]
ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="TOML file with a section per component: \\[bookie], \\[client], "
        "\\[autorecovery], \\[local], \\[audit].",
        show_default=False,
    ),
]

SparkConf = Annotated[
    list[str] | None,
    typer.Option(
        "--conf",
        help="A Spark setting as KEY=VALUE, applied after tally's own; repeat for more "
        "(--conf spark.executor.memory=2g --conf spark.pyspark.python=/usr/bin/python3.11).",
        show_default=False,
    ),
]


def required_metadata(uri: str | None) -> str:
    """The metadata URI a command cannot go without (after $TALLY_METADATA)."""
    from tally.config import metadata_uri

    found = metadata_uri(uri)
    if found is None:
        raise typer.BadParameter(
            "give the metadata store with --metadata URI or $TALLY_METADATA",
            param_hint="--metadata",
        )
    return found
