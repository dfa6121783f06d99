"""`tally autorecovery`: run an auditor candidate and a replication worker until SIGINT or
SIGTERM. Run several: one is elected auditor, all of them replicate."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from typing import TYPE_CHECKING, Annotated

import typer

from tally.autorecovery.config import AutoRecoveryConfig
from tally.cli.options import ConfigFile, Metadata
from tally.cli.service_log import log_as_a_service
from tally.client.config import ClientConfig
from tally.config import load
from tally.core.errors import TallyError

if TYPE_CHECKING:
    from tally.autorecovery.process import AutoRecoveryProcess
    from tally.client.client import Client
    from tally.metadata.store import MetadataStore


def run(
    metadata: Metadata = None,
    http_port: Annotated[
        int | None,
        typer.Option(help="Serve the admin HTTP API and Prometheus /metrics on this port."),
    ] = None,
    process_id: Annotated[
        str | None,
        typer.Option(
            "--id", help="This process's name in the auditor election (default: host-pid)."
        ),
    ] = None,
    config: ConfigFile = None,
) -> None:
    """Run auto-recovery: the auditor (when elected) and a replication worker."""
    log_as_a_service()
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    try:
        settings = load(
            AutoRecoveryConfig,
            "autorecovery",
            file=config,
            overrides={"metadata": metadata, "http_port": http_port},
        )
        client_settings = load(ClientConfig, "client", file=config)
        name = process_id or f"autorecovery-{socket.gethostname()}-{os.getpid()}"
        asyncio.run(_serve(settings, client_settings, name))
    except TallyError as error:
        typer.echo(f"tally autorecovery: {error}", err=True)
        raise typer.Exit(code=2) from None


async def _serve(settings: AutoRecoveryConfig, client: ClientConfig, name: str) -> None:
    from tally.autorecovery.process import AutoRecoveryProcess  # the client stack, when run

    if settings.http_port is not None:
        # Before the metadata session starts: on a loaded machine, importing FastAPI inside
        # it stalled the event loop past a short session timeout.
        import tally.http.admin  # noqa: F401

    replicas_check = None
    if settings.auditor_replicas_check_mode == "spark":
        from tally.audit.in_cluster import SparkReplicasCheck  # Spark, only when asked for

        def replicas_check(client: Client) -> SparkReplicasCheck:
            return SparkReplicasCheck(client.context, settings)

    process = AutoRecoveryProcess(
        settings,
        name,
        client_config=client,
        admin_http=admin_http,
        replicas_check=replicas_check,
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, lambda: loop.create_task(process.stop()))

    def ready(running: AutoRecoveryProcess) -> None:
        where = "" if running.http_port is None else f" (admin HTTP on :{running.http_port})"
        print(f"autorecovery {running.process_id} ready{where}", flush=True)

    await process.run(on_ready=ready)


async def admin_http(
    store: MetadataStore, process: AutoRecoveryProcess, port: int
) -> tuple[asyncio.Task[None], int]:
    """The admin HTTP app (tally.http) for the auto-recovery process."""
    from tally.http.admin import create_app, serve

    app = create_app(store, autorecovery=process)
    return await serve(app, process.config.http_host, port)
