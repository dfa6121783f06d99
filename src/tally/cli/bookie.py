"""`tally bookie`: run one bookie in the foreground until SIGINT or SIGTERM.

Its exit status tells a service manager what to do: 0 after SIGINT or SIGTERM;
EXIT_SESSION_LOST (75) when it stopped on a lost metadata store session, which a restart
cures; 2 when its settings, its directories or the cluster refuse it; 1 on any other
failure (such as a data directory it cannot use).
"""

from __future__ import annotations

import asyncio
import importlib
import signal
from pathlib import Path
from typing import Annotated

import typer
from prometheus_client import CollectorRegistry

from tally.bookie import EXIT_SESSION_LOST
from tally.bookie.config import BookieConfig
from tally.bookie.server import Bookie, tune_garbage_collector
from tally.cli.options import ConfigFile, Metadata
from tally.cli.service_log import log_as_a_service
from tally.config import load
from tally.core.errors import SessionExpired, TallyError
from tally.metadata.store import MetadataStore


def run(
    metadata: Metadata = None,
    data_dir: Annotated[Path | None, typer.Option(help="Journal and ledger storage root.")] = None,
    ledger_dirs: Annotated[
        str | None,
        typer.Option(
            help="Ledger directories, comma-separated, each on a disk of its own "
            "(default: ledgers/ under the data dir)."
        ),
    ] = None,
    listen: Annotated[
        str | None, typer.Option(help="host:port to listen on (port 0: any free one).")
    ] = None,
    advertised_address: Annotated[
        str | None,
        typer.Option(help="host:port clients reach it at, if not where it listens (a proxy)."),
    ] = None,
    bookie_id: Annotated[
        str | None, typer.Option(help="Bookie id; defaults to the advertised host:port.")
    ] = None,
    rack: Annotated[str | None, typer.Option(help="Network location, e.g. /region/rack.")] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="Serve the admin HTTP API and Prometheus /metrics on this port."),
    ] = None,
    config: ConfigFile = None,
) -> None:
    """Run a bookie: the storage server of a tally cluster.

    Exit status: 0 after SIGINT or SIGTERM; 1 on a failure;
    2 when its settings or the cluster refuse it;
    75 when it lost its metadata store session (paused too long): start it again.
    """
    log_as_a_service()
    try:
        settings = load(
            BookieConfig,
            "bookie",
            file=config,
            overrides={
                "metadata": metadata,
                "data_dir": data_dir,
                "ledger_dirs": ledger_dirs,
                "listen": listen,
                "advertised_address": advertised_address,
                "bookie_id": bookie_id,
                "rack": rack,
                "metrics_port": metrics_port,
            },
        )
        if settings.metrics_port is not None:
            # Now, before the store session starts: its seconds of imports, made in the
            # event loop, would hold up the session's heartbeat on a loaded machine.
            importlib.import_module("tally.http.admin")
        lost_session, stop_failures = asyncio.run(_serve(settings))
    except SessionExpired:  # lost while starting: a new start is the cure all the same
        lost_session, stop_failures = True, 0
    except TallyError as error:
        typer.echo(f"tally bookie: {error}", err=True)
        raise typer.Exit(code=2) from None
    if lost_session:
        typer.echo(
            "tally bookie: stopped: it lost its metadata store session (paused or cut off for "
            f"longer than its session timeout of {settings.session_timeout:g}s), so its "
            "registration is gone and it will not serve unseen; start it again "
            f"(exit status {EXIT_SESSION_LOST})",
            err=True,
        )
        raise typer.Exit(code=EXIT_SESSION_LOST)
    if stop_failures:
        typer.echo(
            f"tally bookie: stopped, but {stop_failures} step(s) of its stop failed (logged "
            "above): check its disks before starting it again",
            err=True,
        )
        raise typer.Exit(code=1)


async def _serve(settings: BookieConfig) -> tuple[bool, int]:
    """Serve until stopped; whether it stopped on a lost metadata store session, and how
    many steps of its stop failed."""
    bookie = Bookie(settings, admin_http=admin_http)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: loop.create_task(bookie.stop()))
    try:
        await bookie.start()
    except BaseException:
        await bookie.stop()
        raise
    tune_garbage_collector()
    print(f"bookie {bookie.bookie_id} ready on {bookie.address}", flush=True)
    await bookie.wait_stopped()
    return bookie.lost_session, bookie.stop_failures


async def admin_http(
    store: MetadataStore, bookie: Bookie, registry: CollectorRegistry, host: str, port: int
) -> tuple[asyncio.Task[None], int]:
    """The admin HTTP app (tally.http) for a bookie: what `tally bookie` injects."""
    from tally.http.admin import create_app, serve

    return await serve(create_app(store, bookie=bookie, registry=registry), host, port)
