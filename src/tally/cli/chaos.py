"""`tally chaos`: the durability test suite of issue 19.

`tally chaos --duration 10m --seed N [--out DIR]` runs a local cluster under faults from the
seed (tally.chaos.run), checks its history and writes its report; `tally chaos check
HISTORY` judges the history a chaos run wrote against the invariants of
BookKeeper's protocol (tally.core.chaos.checker), so a run made elsewhere is checked here.
Each behaviour of the group is a command (or the group's callback) of `app`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from tally.cli.console import err, failures, out
from tally.core.chaos.checker import Verdict, Violation, check_history
from tally.core.chaos.history import decode_history
from tally.core.errors import BadRequest, MalformedData

if TYPE_CHECKING:  # the run's modules are imported when a run starts, not at every command
    from tally.chaos.run import ChaosOutcome, ChaosSettings

app = typer.Typer(
    name="chaos",
    help="The chaos suite: a cluster under faults, and the check of what its run saw.",
    no_args_is_help=True,
)

EXIT_TERMINATED = 128 + signal.SIGTERM
LISTED = 50
"""Violations the summary lists; --json lists them all."""
RANGES_SHOWN = 8
"""Runs of consecutive entries a listed violation shows before it just counts them."""


@app.callback(invoke_without_command=True)
def run(
    ctx: typer.Context,
    duration: Annotated[
        str, typer.Option(help="How long the faults go on (then it settles): 90s, 10m, 1h.")
    ] = "10m",
    seed: Annotated[int, typer.Option(help="Decides the faults, the workload and the data.")] = 1,
    metadata: Annotated[
        str, typer.Option(help="The metadata store: sqlite, or zk (a 3-member ensemble).")
    ] = ("sqlite"),
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out", help="Directory for the history, the logs and the report (a new one)."
        ),
    ] = None,
    bookies: Annotated[int, typer.Option(min=4, help="Bookie processes.")] = 5,
    writers: Annotated[int, typer.Option(min=1, help="Writer processes, a log each.")] = 3,
    rate: Annotated[float, typer.Option(help="Adds per second each writer offers.")] = 50.0,
    audit: Annotated[bool, typer.Option(help="Run the Spark audit of the settled cluster.")] = True,
    keep: Annotated[
        bool, typer.Option(help="Keep the cluster's data after a run that passed.")
    ] = False,
    disk_faults: Annotated[
        bool | None,
        typer.Option(
            "--disk-faults/--no-disk-faults",
            help="Fill and fail one bookie's disks (loop-mounted: needs root). "
            "Default: when this process may.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a local cluster under faults, then check that no acknowledged entry was lost.

    Exits 0 when every invariant holds, 1 when any is broken (the history, every log and
    the cluster's data are kept for the post-mortem).
    """
    if ctx.invoked_subcommand is not None:
        return
    from tally.chaos.report import Finding, write_report
    from tally.chaos.run import HISTORY, ChaosSettings, clean
    from tally.cli.audit import parse_duration

    where = out_dir or Path("chaos-runs") / f"seed-{seed}-{time.strftime('%Y%m%dT%H%M%S')}"
    settings = ChaosSettings(
        duration=parse_duration(duration),
        seed=seed,
        out=where,
        metadata=metadata,
        bookies=bookies,
        writers=writers,
        rate=rate,
        audit=audit,
        disk_faults=disk_faults,
    )
    where.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=where / "harness.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    with failures():
        outcome = asyncio.run(_until_stopped(settings))
        verdict = _check(where / HISTORY)
    findings = [
        Finding(str(v.invariant), v.ledger, _entries(v.entries), v.detail)
        for v in verdict.violations
    ]
    page = write_report(where, outcome.history, findings, _counts(verdict))
    _print_verdict(outcome.history, verdict)
    out.print(f"report: {page}", markup=False)
    if verdict.ok and not keep:
        clean(where)
    raise typer.Exit(0 if verdict.ok else 1)


async def _until_stopped(settings: ChaosSettings) -> ChaosOutcome:
    """The run; SIGTERM ends it as Ctrl-C does, through its clean-up (every process it
    started stopped, its disks unmounted)."""
    from tally.chaos.run import run_chaos

    task = asyncio.ensure_future(run_chaos(settings, lambda text: err.print(text, markup=False)))
    terminated = asyncio.Event()

    def terminate() -> None:
        terminated.set()
        task.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminate)
    try:
        return await task
    except asyncio.CancelledError:
        if not terminated.is_set():
            raise
        err.print(f"stopped by SIGTERM before its verdict: what it saw is in {settings.out}")
        raise typer.Exit(EXIT_TERMINATED) from None


def _counts(verdict: Verdict) -> dict[str, int]:
    """How much the verdict checked: for the report and for --json."""
    return {
        "operations": verdict.operations,
        "acknowledged": verdict.acknowledged,
        "ledgers": verdict.ledgers,
        "reads_checked": verdict.reads_checked,
    }


@app.command("check")
def check(
    history: Annotated[
        Path, typer.Argument(help="The JSON-lines history a chaos run wrote.", show_default=False)
    ],
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print the verdict, every violation, as one JSON object."),
    ] = False,
) -> None:
    """Check a chaos run's history against the invariants of BookKeeper's protocol.

    Exits 0 when every invariant holds, 1 when any is broken (or the history is unreadable).
    """
    with failures():
        verdict = _check(history)
    if as_json:
        typer.echo(json.dumps(_as_json(verdict), sort_keys=True))
    else:
        _print_verdict(history, verdict)
    raise typer.Exit(0 if verdict.ok else 1)


def _check(history: Path) -> Verdict:
    """The verdict on a history file, streamed; a line that is no event ends it with what
    to do about that line."""
    try:
        return check_history(decode_history(_lines(history), source=str(history)))
    except MalformedData as error:
        raise MalformedData(
            f"{error}; a history holds one JSON event per line, as a chaos run writes it: fix "
            "or delete that line (a run killed while writing leaves its last line cut short)"
        ) from None


def _lines(path: Path) -> Iterator[str]:
    """The history's lines, read as they are checked, so that a history of millions of
    events is never held whole; what cannot be read is a one-line error saying what to do."""
    try:
        file = path.open("rb")
    except OSError as error:
        raise BadRequest(
            f"cannot read the history {path}: {error.strerror}: give the path of the JSON-lines "
            "file a chaos run wrote"
        ) from None
    with file:
        for number, line in enumerate(file, start=1):
            try:
                yield line.decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedData(f"{path} line {number}: not UTF-8 text") from None


def _as_json(verdict: Verdict) -> dict[str, Any]:
    """The verdict for programs: its counts and every violation."""
    return {
        "ok": verdict.ok,
        **_counts(verdict),
        "faults": dict(verdict.faults),
        "violations": [
            {
                "invariant": str(v.invariant),
                "ledger": v.ledger,
                "entries": list(v.entries),
                "detail": v.detail,
            }
            for v in verdict.violations
        ],
    }


def _print_verdict(history: Path, verdict: Verdict) -> None:
    """The counts that say how much was checked, then the violations, at most LISTED."""
    counts = ", ".join(
        (
            _counted(verdict.operations, "operation"),
            _counted(verdict.acknowledged, "acknowledged add"),
            _counted(verdict.ledgers, "ledger"),
            _counted(verdict.reads_checked, "read") + " checked",
        )
    )
    out.print(f"{history}: {counts}", markup=False)
    faults = ", ".join(f"{kind} {count:,}" for kind, count in sorted(verdict.faults.items()))
    out.print(f"faults: {faults or 'none'}", markup=False)
    if verdict.ok:
        out.print(Text("no violation: every invariant holds", style="bold green"))
        return
    by_invariant = Counter(str(v.invariant) for v in verdict.violations)
    tally = ", ".join(f"{name} {count:,}" for name, count in by_invariant.most_common())
    count = len(verdict.violations)
    out.print(Text(f"{_counted(count, 'violation')} ({tally}):", style="bold red"))
    for violation in verdict.violations[:LISTED]:
        out.print(_line(violation))
    if count > LISTED:
        out.print(f"... and {count - LISTED:,} more: --json lists them all", markup=False)


def _counted(count: int, noun: str) -> str:
    """ "1 ledger", "2 ledgers": a count that reads as English."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def _line(violation: Violation) -> Text:
    """One violation: the invariant, the ledger, the entries and the detail."""
    line = Text("  ")
    line.append(str(violation.invariant), style="bold")
    if violation.ledger:
        line.append(f" ledger {violation.ledger}")
    if violation.entries:
        line.append(f" entries {_entries(violation.entries)}")
    line.append(f": {violation.detail}")
    return line


def _entries(entries: Sequence[int]) -> str:
    """Ascending entries as runs, "0..4, 7", the first RANGES_SHOWN of them."""
    runs: list[tuple[int, int]] = []
    for entry in entries:
        if runs and entry == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], entry)
        else:
            runs.append((entry, entry))
    shown = ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs[:RANGES_SHOWN])
    if len(runs) > RANGES_SHOWN:
        shown += f", ... ({len(entries):,} entries)"
    return shown
