"""The consoles of the Spark commands (`tally audit`, `tally cluster recover`), how they end on
a tally error, and their progress bars."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tally.core.errors import TallyError

out = Console(soft_wrap=True, highlight=False)
err = Console(stderr=True, soft_wrap=True, highlight=False)


@contextlib.contextmanager
def failures() -> Iterator[None]:
    """A tally error ends the command with its message and status 1, not a traceback."""
    try:
        yield
    except TallyError as error:
        err.print(f"error: {error}", markup=False)
        raise typer.Exit(1) from None


@contextlib.contextmanager
def stage_progress() -> Iterator[Callable[[str, int, int | None], None]]:
    """A progress callback (stage, done, total) drawing one bar per stage."""
    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    )
    tasks: dict[str, Any] = {}

    def report(stage: str, done: int, total: int | None) -> None:
        if stage not in tasks:
            tasks[stage] = bars.add_task(stage, total=total)
        bars.update(tasks[stage], completed=done, total=total)

    with bars:
        yield report
