"""`tally local up | status | stop | start-bookie | start`: a whole cluster on this machine."""

from __future__ import annotations

import contextlib
import json
from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tally.cli.options import ConfigFile
from tally.config import load
from tally.core.errors import TallyError
from tally.local.config import DEFAULT_BOOKIES, DEFAULT_RACKS, LocalConfig
from tally.local.control import Started, start_bookie, start_process, stop_cluster
from tally.local.processes import describe_exit, signal_name
from tally.local.services import AUTORECOVERY
from tally.local.state import DataDir, LocalState
from tally.local.status import BookieStatus, read_status
from tally.local.supervisor import Supervisor
from tally.metadata.cluster import InitResult

app = typer.Typer(
    name="local",
    help="Run a whole tally cluster on this machine, with no other service needed.",
    no_args_is_help=True,
)

DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Holds the metadata store, the bookies' data and logs, local.json (default .tally).",
        show_default=False,
    ),
]


def _settings(config: Path | None, **overrides: object) -> LocalConfig:
    try:
        return load(LocalConfig, "local", file=config, overrides=overrides)
    except TallyError as error:
        raise _fail(error) from None


_out = Console(soft_wrap=True, highlight=False)
_err = Console(stderr=True, soft_wrap=True, highlight=False)


def _say(message: str, *, alarm: bool = False) -> None:
    """Print a line; a closed terminal must not keep the supervisor from stopping its bookies."""
    with contextlib.suppress(OSError):
        _out.print(message, markup=False, style="bold red" if alarm else None)


def _fail(error: TallyError) -> typer.Exit:
    _err.print(f"error: {error}", markup=False)
    return typer.Exit(1)


@app.command("up")
def up(
    bookies: Annotated[
        int | None,
        typer.Option(help=f"Bookies to run (default {DEFAULT_BOOKIES}; fixed at the first up)."),
    ] = None,
    racks: Annotated[
        int | None,
        typer.Option(help=f"Racks to spread them over, round-robin (default {DEFAULT_RACKS})."),
    ] = None,
    data_dir: DataDirOption = None,
    config: ConfigFile = None,
) -> None:
    """Start the cluster in the foreground and supervise it until Ctrl-C or SIGTERM."""
    settings = _settings(config, bookies=bookies, racks=racks, data_dir=data_dir)
    where = DataDir.at(settings.data_dir)
    try:
        code = Supervisor(where, _say, settings).run(
            settings.bookies, settings.racks, partial(_print_summary, where)
        )
    except TallyError as error:
        raise _fail(error) from None
    raise typer.Exit(code)


def _print_summary(data_dir: DataDir, state: LocalState, init: InitResult) -> None:
    cluster = init.info.instance_id
    made = "initialised now" if init.created else "existing"
    _out.print(
        f"[bold green]tally local cluster ready[/]: {len(state.bookies)} bookies on "
        f"{state.racks} racks, cluster {cluster} ({made})"
    )
    _out.print(f"  metadata  {escape(state.metadata)}")
    for slot in state.bookies:
        run = state.processes[slot.name]
        _out.print(
            f"  [bold]{slot.name}[/]  {slot.bookie_id}  rack {escape(slot.rack)}  pid {run.pid}"
        )
        _out.print(f"            metrics {slot.metrics_url}")
        _out.print(f"            log     {escape(str(slot.log))}")
    auto = state.processes.get(AUTORECOVERY)
    _out.print(
        f"  [bold]{AUTORECOVERY}[/]  auditor candidate + replication worker"
        + ("" if auto is None else f"  pid {auto.pid}")
    )
    if state.api_url is not None:
        _out.print(f"            admin API {state.api_url}/api/v1/  (OpenAPI: /openapi.json)")
        _out.print(f"            metrics   {state.api_url}/metrics")
    where = escape(str(data_dir.root))
    _out.print(f"status: tally local status --data-dir {where}")
    _out.print(f"stop:   Ctrl-C here, or tally local stop --data-dir {where}")


@app.command("status")
def status(
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    config: ConfigFile = None,
) -> None:
    """Show the cluster's processes and registrations; exit code 1 when it is not running."""
    settings = _settings(config, data_dir=data_dir)
    try:
        found = read_status(DataDir.at(settings.data_dir))
    except TallyError as error:
        raise _fail(error) from None
    if as_json:
        typer.echo(json.dumps(found.to_json(), indent=2))
    else:
        where = escape(str(found.data_dir))
        if found.supervisor_running:
            _out.print(f"[green]running[/] in {where}, supervisor pid {found.supervisor_pid}")
        else:
            _out.print(f"[red]not running[/] in {where}: start it with `tally local up`")
        _out.print(f"metadata {escape(found.metadata)}, cluster {found.instance_id or '(none)'}")
        table = Table("#", "bookie id", "pid", "process", "registered", "rack", box=box.SIMPLE)
        for bookie in found.bookies:
            table.add_row(
                str(bookie.slot.index),
                bookie.slot.bookie_id,
                "" if bookie.run is None else str(bookie.run.pid),
                _process_state(bookie),
                bookie.registered or "-",
                bookie.slot.rack,
            )
        _out.print(table)
        auto = found.autorecovery
        state = "running" if found.autorecovery_running else "down"
        if auto is None:
            state = "never started"
        elif not found.autorecovery_running and auto.exit_code is not None:
            state = f"down ({describe_exit(auto.exit_code)})"
        pid = "" if auto is None else f", pid {auto.pid}"
        _out.print(f"autorecovery: {state}{pid}; admin API {found.api_url or '-'}")
    if not found.supervisor_running:
        raise typer.Exit(1)


def _process_state(bookie: BookieStatus) -> str:
    if bookie.running:
        return "running"
    if bookie.run is None:
        return "never started"
    code = bookie.run.exit_code
    if code is None:
        return "down"
    return f"down ({signal_name(-code)})" if code < 0 else f"down (exit {code})"


@app.command("stop")
def stop(data_dir: DataDirOption = None, config: ConfigFile = None) -> None:
    """Stop the cluster started by `tally local up`, from any shell."""
    settings = _settings(config, data_dir=data_dir)
    where = DataDir.at(settings.data_dir)
    try:
        stopped = stop_cluster(where, _say, settings)
    except TallyError as error:
        raise _fail(error) from None
    _say(f"local cluster in {where.root} stopped" if stopped else f"nothing runs in {where.root}")


@app.command("start-bookie")
def start_bookie_command(
    index: Annotated[int, typer.Argument(help="The bookie's number, 1 for bookie-1.")],
    data_dir: DataDirOption = None,
    config: ConfigFile = None,
) -> None:
    """Start one bookie again (same id, port, rack and data); returns once it serves."""
    settings = _settings(config, data_dir=data_dir)
    try:
        started = start_bookie(DataDir.at(settings.data_dir), index, settings)
    except TallyError as error:
        raise _fail(error) from None
    _say_started(started)


@app.command("start")
def start_command(
    name: Annotated[str, typer.Argument(help="The process: autorecovery, or bookie-N.")],
    data_dir: DataDirOption = None,
    config: ConfigFile = None,
) -> None:
    """Start one process of the cluster again; returns once it serves."""
    settings = _settings(config, data_dir=data_dir)
    try:
        started = start_process(DataDir.at(settings.data_dir), name, settings)
    except TallyError as error:
        raise _fail(error) from None
    _say_started(started)


def _say_started(started: Started) -> None:
    if started.already:
        _say(f"{started.name} is already running (pid {started.run.pid})")
    else:
        _say(f"{started.name} is back (pid {started.run.pid})")
