"""How `tally shell` commands print: one JSON document for scripts, tables and a progress bar
for people, so every command reads the same whichever it is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

PREVIEW_CHARS = 60


def print_json(document: object) -> None:
    typer.echo(json.dumps(document, indent=2))


def console() -> Console:
    return Console(highlight=False)


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> Table:
    """A table whose first column (the ids a person copies) is never cut, and whose other
    cells fold rather than lose characters on a narrow terminal."""
    made = Table(title=title)
    for index, column in enumerate(columns):
        made.add_column(column, overflow="fold", no_wrap=index == 0)
    for row in rows:
        made.add_row(*(Text("-") if v is None else Text(str(v)) for v in row))
    return made


def progress() -> Progress:
    """A progress bar on stderr, shown only to a person at a terminal."""
    stderr = Console(stderr=True)
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        disable=not stderr.is_terminal,
    )


def local_time(ms: int | None) -> str | None:
    if ms is None:
        return None
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def preview(data: bytes) -> str:
    """The start of an entry as text when it is printable UTF-8, else as hex."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = None
    if text is not None and text.isprintable():
        return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"
    shown = data[: PREVIEW_CHARS // 2].hex()
    return f"0x{shown}" + ("…" if len(data) > PREVIEW_CHARS // 2 else "")
