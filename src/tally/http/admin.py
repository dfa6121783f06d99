"""The admin HTTP app that every long-running tally process serves: health, Prometheus
metrics and read-only views of the cluster, with an OpenAPI document of itself.

FastAPI because the OpenAPI document is generated from the routes, so it cannot drift
from them, and query parameters are typed and validated (a bad one gets a 422 naming it);
uvicorn because its `Server` runs as one more task on the process's own event loop, next
to the bookie, sharing its metadata session.

A process wires it in two lines:

    app = create_app(store, bookie=self, registry=self.metrics.registry)
    self._http, self.http_port = await serve(app, host, port)

and stops it by cancelling the task (`self._http.cancel(); await self._http`), which
closes the listening socket and the open connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Protocol

import uvicorn
from fastapi import FastAPI, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from tally.bookie.config import BookieConfig
from tally.bookie.garbage_collector import GarbageCollector, Orphan
from tally.bookie.ledger_directories import LedgerDirectories
from tally.bookie.scrubber_service import ScrubberServices
from tally.client.client import Client
from tally.core.disk_usage import DiskState
from tally.core.errors import (
    BadRequest,
    ClusterNotInitialised,
    DeleteRefused,
    LedgerDeleted,
    MalformedData,
    MetadataStoreError,
    NoSuchKey,
    NoSuchLedger,
    TallyError,
    Timeout,
)
from tally.core.ids import LedgerId
from tally.metadata.auditor_election import who_is_auditor
from tally.metadata.cluster_settings import read_settings
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.store import MetadataStore
from tally.metadata.underreplication import UnderReplicationManager
from tally.metadata.views import (
    bookie_views,
    ledger_view,
    lost_entries_view,
    under_replicated_view,
)
from tally.version import __version__

MAX_PAGE_SIZE = 10_000
SHUTDOWN_GRACE = 2
"""Seconds open requests get to finish when the server stops."""


class LocalBookie(Protocol):
    """What /api/v1/bookie/info reports of the bookie running in this process."""

    @property
    def bookie_id(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def disk(self) -> DiskState: ...
    @property
    def config(self) -> BookieConfig: ...
    @property
    def garbage_collector(self) -> GarbageCollector: ...
    @property
    def storage(self) -> LedgerDirectories: ...
    @property
    def scrubber(self) -> ScrubberServices: ...


LedgerQuery = Annotated[str, Query(description="Ledger id (42) or qualified name (32 hex digits)")]


class LocalAutoRecovery(Protocol):
    """What /api/v1/autorecovery/process reports of the auditor and worker in this process."""

    def status(self) -> dict[str, Any]: ...


class DelayBody(BaseModel):
    """BookKeeper's body for setting the lost bookie recovery delay."""

    delay_seconds: Annotated[int, Field(ge=0, description="Seconds; 0: mark at once")]


class BookieType(enum.Enum):
    """BookKeeper's filter of the bookie list: read-write, read-only, or both."""

    RW = "rw"
    RO = "ro"
    ALL = "all"


_STATES = {
    BookieType.RW: ("writable",),
    BookieType.RO: ("readonly",),
    BookieType.ALL: ("writable", "readonly"),
}

_ERROR_STATUS: tuple[tuple[tuple[type[TallyError], ...], int], ...] = (
    ((MalformedData,), 500),
    ((BadRequest,), 400),
    ((NoSuchLedger, NoSuchKey, LedgerDeleted), 404),
    ((DeleteRefused,), 409),
    ((ClusterNotInitialised, MetadataStoreError, Timeout), 503),
)
"""The first row whose types match an error gives the status; anything else is 500.
Metadata that does not decode is the server's problem, not a bad request."""


def _status(error: TallyError) -> int:
    for types, status in _ERROR_STATUS:
        if isinstance(error, types):
            return status
    return 500


def _error(status: int, error: str, reason: str) -> JSONResponse:
    return JSONResponse({"error": error, "reason": reason}, status_code=status)


def _documented(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error answers a route may give, for the OpenAPI document."""
    meaning = {
        400: "A parameter is invalid; `reason` says which and why",
        404: "Not found; `reason` says what",
        409: "Refused by the cluster's delete discipline; `reason` says why",
        500: "Stored metadata does not decode; `reason` names the key",
        503: "The metadata store is unreachable",
    }
    return {status: {"description": meaning[status]} for status in statuses}


def create_app(
    store: MetadataStore,
    *,
    bookie: LocalBookie | None = None,
    autorecovery: LocalAutoRecovery | None = None,
    registry: CollectorRegistry = REGISTRY,
) -> FastAPI:
    """The admin app of a process with a session on `store`, running `bookie` and
    `autorecovery` (if any) and exporting the metrics of `registry`."""
    ledgers = LedgerManager(store)
    under_replication = UnderReplicationManager(store)
    app = FastAPI(
        title="tally admin",
        version=__version__,
        description="Health, metrics and read-only views of a tally cluster.",
        docs_url=None,
        redoc_url=None,
    )

    @app.exception_handler(TallyError)
    async def tally_error(request: Request, error: TallyError) -> JSONResponse:
        return _error(_status(error), type(error).__name__, str(error))

    @app.exception_handler(RequestValidationError)
    async def invalid_parameter(request: Request, error: RequestValidationError) -> JSONResponse:
        """FastAPI's 422, with the `reason` every other error answer has."""
        details = jsonable_encoder(error.errors())
        reason = "; ".join(
            f"{'.'.join(str(part) for part in d['loc'])}: {d['msg']}" for d in details
        )
        return JSONResponse(
            {"error": "BadRequest", "reason": reason, "detail": details}, status_code=422
        )

    @app.get("/heartbeat", response_class=PlainTextResponse, summary="Liveness")
    async def heartbeat() -> str:
        """`OK` while the process serves requests."""
        return "OK\n"

    @app.get(
        "/metrics",
        response_class=Response,
        summary="Prometheus metrics",
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}},
    )
    async def metrics() -> Response:
        """The process's metrics in the Prometheus text format."""
        body = await asyncio.to_thread(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/v1/bookie/info", summary="This process's bookie", responses=_documented(404))
    async def bookie_info() -> Any:
        """The bookie running in this process: identity, mode and disk space."""
        if bookie is None:
            return _error(404, "NoBookie", "this process runs no bookie; see /api/v1/bookie/list")
        config = bookie.config
        directories = bookie.storage.directories()
        serving = [Path(d.name) for d in directories if not d.failed]
        usages = await asyncio.to_thread(lambda: [shutil.disk_usage(d) for d in serving])
        return {
            "bookie_id": bookie.bookie_id,
            "address": bookie.address,
            "state": bookie.disk.mode.value,
            "state_reason": bookie.disk.reason,
            "version": __version__,
            "journal_directory": str(config.journal_directory),
            "ledger_directory": str(config.ledger_directories[0]),
            "ledger_directories": [
                {"directory": d.name, "failed": d.failed, "reason": d.reason, "ledgers": d.ledgers}
                for d in directories
            ],
            "total_space": sum(usage.total for usage in usages),
            "free_space": sum(usage.free for usage in usages),
        }

    @app.get("/api/v1/bookie/list", summary="Registered bookies", responses=_documented(503))
    async def bookie_list(
        bookie_type: Annotated[
            BookieType, Query(alias="type", description="rw: writable, ro: read-only, all: both")
        ] = BookieType.ALL,
    ) -> list[dict[str, Any]]:
        """The registered bookies with their state, address, version and rack."""
        return await bookie_views(store, _STATES[bookie_type])

    @app.get("/api/v1/ledger/list", summary="Ledgers, a page at a time", responses=_documented(503))
    async def ledger_list(
        page: Annotated[int, Query(ge=0, description="Page number, from 0")] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description="Ledgers a page")] = 1000,
        print_metadata: Annotated[
            bool, Query(description="Each ledger's metadata too, not only its id")
        ] = False,
    ) -> dict[str, Any]:
        """Ledgers in id order; `next_page` is null on the last page. A key whose metadata
        does not decode takes its place in the order and is listed under `unreadable`."""
        skip, more = page * limit, False
        found: list[dict[str, Any]] = []
        unreadable: list[dict[str, str]] = []
        async for chunk in ledgers.ledger_pages(limit):
            items: list[dict[str, Any]] = [
                ledger_view(r) if print_metadata else _ids(r.ledger_id) for r in chunk.ledgers
            ]
            items += ({"path": u.path, "reason": str(u.error)} for u in chunk.unreadable)
            for index, item in enumerate(items):
                if skip:
                    skip -= 1
                elif len(found) + len(unreadable) == limit:
                    more = True
                    break
                else:
                    (found if index < len(chunk.ledgers) else unreadable).append(item)
            if more:
                break
        return {
            "ledgers": found,
            "unreadable": unreadable,
            "page": page,
            "next_page": page + 1 if more else None,
        }

    @app.get(
        "/api/v1/ledger/metadata",
        summary="One ledger's metadata",
        responses=_documented(400, 404, 500, 503),
    )
    async def ledger_metadata(
        ledger_id: LedgerQuery,
    ) -> dict[str, Any]:
        """The ledger's metadata, with every segment's ensemble of bookies."""
        return ledger_view(await ledgers.read_ledger_metadata(LedgerId.parse(ledger_id)))

    @app.delete(
        "/api/v1/ledger/delete",
        summary="Delete a ledger (the cluster's delete path)",
        responses=_documented(400, 404, 409, 503),
    )
    async def delete_ledger(
        ledger_id: LedgerQuery,
        force: Annotated[bool, Query(description="Recover and close an OPEN ledger first")] = False,
        reason: Annotated[str, Query(description="Why, kept with the deletion")] = (
            "deleted through the admin HTTP API"
        ),
    ) -> dict[str, Any]:
        """Checked on its bookies, then DELETED (undeletable for the cluster's
        ledger_delete_retention), then a tombstone; as `tally shell deleteledger`."""
        async with Client.sharing(store) as client:
            outcome = await client.delete_ledger(
                LedgerId.parse(ledger_id), force=force, reason=reason
            )
        return {
            "ledger_id": str(outcome.ledger_id),
            "deletion": outcome.deletion.to_dict(),
            "tombstoned": outcome.tombstone is not None,
        }

    @app.put(
        "/api/v1/ledger/undelete",
        summary="Undelete a DELETED ledger within its retention",
        responses=_documented(400, 404, 409, 503),
    )
    async def undelete_ledger(
        ledger_id: LedgerQuery,
    ) -> dict[str, Any]:
        """The ledger's metadata, CLOSED again and otherwise as before the delete."""
        async with Client.sharing(store) as client:
            return ledger_view(await client.undelete_ledger(LedgerId.parse(ledger_id)))

    @app.get("/api/v1/cluster/settings", summary="The cluster settings", responses=_documented(503))
    async def cluster_settings() -> dict[str, Any]:
        """The settings every process of the cluster shares (`tally cluster settings`)."""
        return (await read_settings(store)).to_dict()

    @app.put(
        "/api/v1/bookie/gc",
        summary="Run this bookie's garbage collection now",
        responses=_documented(404, 503),
    )
    async def trigger_gc() -> Any:
        """One run, over-replication included; answers when it is done, with what it did."""
        if bookie is None:
            return _error(404, "NoBookie", "this process runs no bookie")
        return (await bookie.garbage_collector.trigger()).to_dict()

    @app.get("/api/v1/bookie/gc_details", summary="This bookie's last GC runs")
    async def gc_details() -> Any:
        """The last runs, newest first."""
        if bookie is None:
            return _error(404, "NoBookie", "this process runs no bookie")
        return bookie.garbage_collector.details()

    @app.get("/api/v1/bookie/gc/orphans", summary="Ledgers held here with no metadata")
    async def gc_orphans() -> Any:
        """Ledgers this bookie holds that have neither metadata nor tombstone: kept until
        an operator deletes them (DELETE on this path)."""
        if bookie is None:
            return _error(404, "NoBookie", "this process runs no bookie")
        return [_orphan_view(orphan) for orphan in await bookie.garbage_collector.orphans()]

    @app.delete("/api/v1/bookie/gc/orphans", summary="Delete this bookie's orphan ledgers")
    async def delete_gc_orphans(
        ledger_id: Annotated[
            list[str] | None,
            Query(description="Only these ledgers (each checked to be an orphan still)"),
        ] = None,
    ) -> Any:
        """Delete the orphans (each looked up once more first); the ledgers deleted."""
        if bookie is None:
            return _error(404, "NoBookie", "this process runs no bookie")
        collector = bookie.garbage_collector
        wanted = (
            [LedgerId.parse(name) for name in ledger_id]
            if ledger_id
            else [orphan.ledger_id for orphan in await collector.orphans()]
        )
        deleted = await collector.delete_orphans(wanted)
        return [str(found) for found in deleted]

    @app.get("/api/v1/bookie/scrub", summary="This bookie's scrub passes")
    async def scrub_status() -> Any:
        """The schedule (interval, rate), the pass under way and the last complete ones,
        newest first, each with its bytes, entries, and the corrupt and unreadable entries
        it found; times are seconds since the epoch."""
        if bookie is None:
            return _error(404, "NoBookie", "this process runs no bookie")
        return await asyncio.to_thread(bookie.scrubber.status)

    @app.put("/api/v1/bookie/scrub", summary="Scrub this bookie now, at full speed")
    async def trigger_scrub(
        wait: Annotated[
            bool, Query(description="Answer once the pass has ended, not once it started")
        ] = False,
    ) -> Any:
        """A pass now at full speed (or the pass under way goes on at full speed); the
        status, as GET gives it."""
        if bookie is None:
            return _error(404, "NoBookie", "this process runs no bookie")
        return await bookie.scrubber.trigger(wait=wait)

    @app.get(
        "/api/v1/bookie/corrupt_entries",
        summary="Entries whose copy on this bookie is marked corrupt",
        responses=_documented(400),
    )
    async def corrupt_entries(
        ledger_id: Annotated[
            str | None, Query(description="Only this ledger's (id or qualified name)")
        ] = None,
    ) -> Any:
        """Each entry found corrupt here (by the scrubber, a read or compaction) and not
        replaced since, with when, by whom and where: what a repair writes over. Reads of
        them answer EntryCorrupt."""
        if bookie is None:
            return _error(404, "NoBookie", "this process runs no bookie")
        wanted = None if ledger_id is None else LedgerId.parse(ledger_id)
        return await asyncio.to_thread(bookie.scrubber.corrupt_entries, wanted)

    @app.get(
        "/api/v1/autorecovery/list_under_replicated_ledger",
        summary="Ledgers marked under-replicated, or on the lost-entries list",
        responses=_documented(500, 503),
    )
    async def list_under_replicated(
        missing_bookie: Annotated[
            str | None, Query(description="Only ledgers whose copies on this bookie are lost")
        ] = None,
        lost: Annotated[
            bool, Query(description="The ledgers with entries no copy is left of instead")
        ] = False,
    ) -> list[dict[str, Any]]:
        """Marked ledgers in id order with the bookies that lost their copies and when they
        were first marked; with `lost`, the entries no worker can copy, and why."""
        if lost:
            return [lost_entries_view(x) async for x in under_replication.list_lost_entries()]
        marks = under_replication.list_under_replicated(missing_bookie=missing_bookie)
        return [under_replicated_view(mark) async for mark in marks]

    @app.get(
        "/api/v1/autorecovery/who_is_auditor",
        summary="The elected auditor",
        responses=_documented(503),
    )
    async def auditor() -> dict[str, str | None]:
        """The id of the auto-recovery process that audits now; null when none runs."""
        return {"auditor": await who_is_auditor(store)}

    @app.put(
        "/api/v1/autorecovery/trigger_audit",
        summary="Run every auditor check now",
        responses={**_documented(503), 409: {"description": "No auditor is elected"}},
    )
    async def trigger_audit() -> Any:
        """Ask the elected auditor to run all its checks at once."""
        elected = await who_is_auditor(store)
        if elected is None:
            return _error(409, "NoAuditor", "no auditor is elected: start tally autorecovery")
        return {"auditor": elected, "requested_ms": await under_replication.request_audit()}

    @app.get(
        "/api/v1/autorecovery/lost_bookie_recovery_delay",
        summary="The lost bookie recovery delay",
        responses=_documented(500, 503),
    )
    async def get_delay() -> dict[str, int | None]:
        """Seconds the auditor waits before it marks a lost bookie's ledgers; null when not
        set in the store (each auditor then uses its configured default)."""
        return {"delay_seconds": await under_replication.lost_bookie_recovery_delay()}

    @app.put(
        "/api/v1/autorecovery/lost_bookie_recovery_delay",
        summary="Set the lost bookie recovery delay",
        responses=_documented(503),
    )
    async def set_delay(body: DelayBody) -> dict[str, int | None]:
        """Set the delay for the whole cluster; the auditor picks it up at once."""
        await under_replication.set_lost_bookie_recovery_delay(body.delay_seconds)
        return {"delay_seconds": body.delay_seconds}

    @app.get(
        "/api/v1/autorecovery/status",
        summary="Whether replication is enabled",
        responses=_documented(503),
    )
    async def replication_status() -> dict[str, bool]:
        return {"enabled": await under_replication.is_replication_enabled()}

    @app.put(
        "/api/v1/autorecovery/status",
        summary="Enable or disable replication cluster-wide",
        responses=_documented(503),
    )
    async def set_replication_status(
        enabled: Annotated[bool, Query(description="true: workers repair; false: they pause")],
    ) -> dict[str, bool]:
        if enabled:
            await under_replication.enable_replication()
        else:
            await under_replication.disable_replication()
        return {"enabled": enabled}

    @app.get(
        "/api/v1/autorecovery/process",
        summary="This process's auditor and replication worker",
        responses=_documented(404),
    )
    async def autorecovery_process() -> Any:
        """Election state, lost bookies, last checks and their findings, and the worker's
        progress, of the auto-recovery running in this process."""
        if autorecovery is None:
            return _error(404, "NoAutoRecovery", "this process runs no auto-recovery")
        return autorecovery.status()

    return app


def _orphan_view(orphan: Orphan) -> dict[str, Any]:
    return {**_ids(orphan.ledger_id), "entries": orphan.entries, "bytes": orphan.bytes}


def _ids(ledger_id: LedgerId) -> dict[str, str]:
    return {"ledger_id": str(ledger_id), "qualified_name": ledger_id.qualified_name}


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves the process's signal handlers to the process."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(app: FastAPI, host: str, port: int) -> tuple[asyncio.Task[None], int]:
    """Serve `app` on host:port (0: any free port) in the running event loop; the serving
    task and the port listened on. Cancelling the task stops the server gracefully."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.create_server((host, port), family=family)
    except OSError as error:
        raise BadRequest(f"admin HTTP: cannot listen on {host}:{port}: {error}") from error
    listener.setblocking(False)
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=SHUTDOWN_GRACE,
    )
    server = _EmbeddedServer(config)
    task = asyncio.create_task(_run(server, listener), name=f"admin-http-{host}:{port}")
    return task, int(listener.getsockname()[1])


async def _run(server: uvicorn.Server, listener: socket.socket) -> None:
    serving = asyncio.ensure_future(server.serve(sockets=[listener]))
    try:
        await asyncio.shield(serving)
    except asyncio.CancelledError:
        server.should_exit = True
        await serving
        raise
    finally:
        listener.close()
