"""The auto-recovery process: an auditor candidate and a replication worker on one session.

Both live as long as their metadata store session: the auditor's vote and the worker's lock
are ephemeral, so when the session is lost another process may already audit or hold the
lock, and neither may go on. The process then starts both again on a new session (a
"generation") instead of exiting, so one lost session (a paused VM, a store failover) does
not leave a cluster without auto-recovery. A component that fails unexpectedly ends its
generation the same way, after a short pause, with the traceback in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tally.autorecovery.auditor import Auditor
from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.replication_worker import ReplicationWorker
from tally.client.client import Client
from tally.client.config import ClientConfig
from tally.core.errors import TallyError
from tally.metadata.store import MetadataStore

log = logging.getLogger(__name__)

RESTART_PAUSE = 1.0
"""Seconds between a generation's end and the next one's start."""

AdminHttp = Callable[
    [MetadataStore, "AutoRecoveryProcess", int], Awaitable[tuple[asyncio.Task[None], int]]
]
"""Serves the admin HTTP app for this process on a port (0: any); the task and the port."""
ReplicasCheck = Callable[[], Awaitable[object]]


class AutoRecoveryProcess:
    """Runs generations of (auditor, worker) until `stop()`."""

    def __init__(
        self,
        config: AutoRecoveryConfig,
        process_id: str,
        *,
        client_config: ClientConfig | None = None,
        admin_http: AdminHttp | None = None,
        replicas_check: Callable[[Client], ReplicasCheck] | None = None,
    ) -> None:
        self.config = config
        self._client_config = client_config or ClientConfig()
        self.process_id = process_id
        self.http_port: int | None = None
        self.generation = 0
        self.store: MetadataStore | None = None
        """The current generation's session."""
        self._admin_http = admin_http
        self._replicas_check = replicas_check
        self._auditor: Auditor | None = None
        self._worker: ReplicationWorker | None = None
        self._stopping = asyncio.Event()
        self._started_ms = int(time.time() * 1000)

    def client_config(self) -> ClientConfig:
        """The client settings of the worker and the checks, on this process's session."""
        return dataclasses.replace(self._client_config, session_timeout=self.config.session_timeout)

    async def run(self, on_ready: Callable[[AutoRecoveryProcess], None] | None = None) -> None:
        """Serve until `stop()`; `on_ready` is called once the first generation runs."""
        while not self._stopping.is_set():
            self.generation += 1
            try:
                await self._run_generation(on_ready)
            except TallyError as error:
                log.error("auto-recovery generation %d failed: %s", self.generation, error)
            except Exception:
                log.exception("auto-recovery generation %d failed", self.generation)
            on_ready = None
            if not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), RESTART_PAUSE)

    async def stop(self) -> None:
        self._stopping.set()

    def status(self) -> dict[str, Any]:
        """JSON-ready state of this process, for /api/v1/autorecovery/process."""
        return {
            "process_id": self.process_id,
            "generation": self.generation,
            "started_ms": self._started_ms,
            "auditor": None if self._auditor is None else self._auditor.status(),
            "worker": None if self._worker is None else self._worker.status(),
        }

    async def _run_generation(self, on_ready: Callable[[AutoRecoveryProcess], None] | None) -> None:
        async with Client(self.config.metadata, config=self.client_config()) as client:
            context = client.context
            store = self.store = context.ledgers.store
            check = None if self._replicas_check is None else self._replicas_check(client)
            self._auditor = Auditor(context, self.config, self.process_id, replicas_check=check)
            self._worker = ReplicationWorker(
                context,
                self.config,
                self.process_id,
                passwords=[p.encode() for p in self.config.ledger_passwords],
            )
            http: asyncio.Task[None] | None = None
            tasks = [
                asyncio.create_task(self._auditor.run(), name="auditor"),
                asyncio.create_task(self._worker.run(), name="replication-worker"),
            ]
            try:
                if self._admin_http is not None and self.config.http_port is not None:
                    port = self.http_port if self.http_port is not None else self.config.http_port
                    http, self.http_port = await self._admin_http(store, self, port)
                log.info(
                    "auto-recovery %s generation %d running on session %#x%s",
                    self.process_id,
                    self.generation,
                    store.session_id,
                    f", admin HTTP on :{self.http_port}" if http is not None else "",
                )
                if on_ready is not None:
                    on_ready(self)
                await self._until_over(store, tasks)
            finally:
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                if http is not None:
                    http.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await http

    async def _until_over(self, store: MetadataStore, tasks: list[asyncio.Task[None]]) -> None:
        """Wait for a stop, a lost session or a component's end, and say which it was."""
        stop = asyncio.create_task(self._stopping.wait())
        lost = asyncio.create_task(store.session_lost.wait())
        try:
            await asyncio.wait([stop, lost, *tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            lost.cancel()
        if self._stopping.is_set():
            log.info("auto-recovery %s stopping", self.process_id)
        elif store.session_lost.is_set():
            log.error(
                "auto-recovery %s lost its metadata session: auditing and replication "
                "stopped; standing again on a new session",
                self.process_id,
            )
        else:
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            ended = [task.get_name() for task in tasks if task.done()]
            log.error("auto-recovery %s: %s ended on its own", self.process_id, ended)
