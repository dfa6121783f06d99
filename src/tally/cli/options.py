"""Options that several commands share, defined once: the metadata store, a config file,
Spark settings.

The metadata store's URI comes from `--metadata`, else from $TALLY_METADATA
(tally.config); a component's own variable (TALLY_BOOKIE_METADATA, ...) may still give it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

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


def missing_sqlite_store(uri: str) -> str | None:
    """The path of a sqlite store `uri` names that does not exist (opening it would create an
    empty store where the user expected a cluster); None for any other URI."""
    parts = urlsplit(uri)
    if parts.scheme.lower() == "sqlite" and parts.path and not Path(parts.path).exists():
        return "/" + parts.path.lstrip("/")
    return None


def existing_metadata(uri: str | None) -> str:
    """`required_metadata`, and BadRequest for a sqlite file that does not exist: commands
    that read a cluster never create a store."""
    from tally.core.errors import BadRequest

    found = required_metadata(uri)
    missing = missing_sqlite_store(found)
    if missing is not None:
        raise BadRequest(
            f"no metadata store at {missing}; create a cluster with "
            f"`tally cluster init --metadata {found}`"
        )
    return found
