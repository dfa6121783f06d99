"""The bookie process: the wire protocol served over the journal and the ledger storage.

Start-up, in this order: the store must hold a cluster; the listening socket is bound (a
port of 0 becomes a real one, which is the bookie id unless one is configured); the
cookie check proves the directories belong to this bookie of this cluster; the journal
is replayed into ledger storage from the last checkpoint (the checkpoint loop writes the
replayed records out later, while the bookie serves); then the bookie serves, and only
then registers, so no client finds it before it can answer.

The add path runs without a coroutine per request: admission (tally.core.admission),
the entry into the write cache (which verifies the client's CRC32C first), a journal
record (its header and the entry as two buffers), and the reply from the callback the
journal calls when its group commit has fdatasync'ed the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import shutil
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry

from tally.bookie import journal_records
from tally.bookie.config import BookieConfig
from tally.bookie.cookie_check import verify_or_format
from tally.bookie.journal import Journal
from tally.bookie.journal_entries import KEPT_ENTRY_SIZE, JournalEntries, kept_location
from tally.bookie.journal_format import JournalMark
from tally.bookie.ledger_storage import LedgerStorage
from tally.bookie.limbo import LimboWatch, describe, ledgers_to_limbo
from tally.bookie.metrics import BookieMetrics
from tally.core import protocol
from tally.core.addresses import join_host_port, split_host_port
from tally.core.admission import admit_add, admit_fencing_read, admit_write, admit_write_lac
from tally.core.disk_usage import BookieMode, DiskPolicy, DiskState
from tally.core.errors import (
    BadRequest,
    MalformedData,
    TallyError,
    WriteFailed,
)
from tally.core.ids import LedgerId
from tally.core.receive_arenas import ReceiveArenas
from tally.metadata.bookie_registry import BookieInfo, BookiePlacement, BookieRegistry
from tally.metadata.cluster import require_cluster
from tally.metadata.cookies import CookieManager
from tally.metadata.store import MetadataStore
from tally.metadata.stores import open_store
from tally.version import __version__

log = logging.getLogger(__name__)

AdminHttp = Callable[
    [MetadataStore, "Bookie", CollectorRegistry, str, int],
    Awaitable[tuple["asyncio.Task[None]", int]],
]
"""Starts a process's admin HTTP app (the face provides it: layers import downwards):
(store, bookie, metrics registry, host, port) -> (serving task, port)."""

DUMP_LEDGERS_PER_TURN = 64
"""AVAILABILITY_DUMP reads this many ledgers between two yields to the event loop."""

# Looked up once: an Enum member or name looked up per request costs 0.3 us in Python 3.11.
_OPERATION_NAMES = {operation: operation.name for operation in protocol.Operation}


class Bookie:
    """One bookie: call `start`, then `wait_stopped`; `stop` from a signal handler."""

    def __init__(self, config: BookieConfig, *, admin_http: AdminHttp | None = None) -> None:
        self.config = config
        self._admin_http = admin_http
        self.metrics = BookieMetrics()
        self.disk = DiskState(
            DiskPolicy(config.disk_usage_threshold, config.disk_usage_lwm_threshold)
        )
        self.address = ""
        self.bookie_id = ""
        self.metrics_port: int | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._store: MetadataStore | None = None
        self._registry: BookieRegistry | None = None
        self._server: asyncio.Server | None = None
        self._journal: Journal | None = None
        self._storage: LedgerStorage | None = None
        self._keeps_entries = False
        """Whether large entries stay in the journal (`keep_large_entries_in_journal`)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._connections: set[BookieConnectionHandler] = set()
        self._pending_fences: dict[LedgerId, asyncio.Future[JournalMark]] = {}
        self._stopping = False
        self._stopped = asyncio.Event()
        self.lost_session = False
        """Whether it stopped because its metadata store session was lost, not on request."""
        self._registered_mode: BookieMode | None = None
        retained = min(2 * config.write_cache_max_bytes, MAX_RETAINED_ARENA_BYTES)
        self.receive_arenas = ReceiveArenas(RECEIVE_ARENA_SIZE, retained // RECEIVE_ARENA_SIZE)
        """Shared by the connections. The write cache holds views of them (large entries)
        and lets go of about its size at each checkpoint, while as much again arrives."""

    @property
    def journal(self) -> Journal:
        assert self._journal is not None, "bookie not started"
        return self._journal

    @property
    def storage(self) -> LedgerStorage:
        assert self._storage is not None, "bookie not started"
        return self._storage

    # -- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        config = self.config
        if not config.metadata:
            raise BadRequest("a bookie needs --metadata URI (or TALLY_BOOKIE_METADATA)")
        self._store = open_store(config.metadata, session_timeout=config.session_timeout)
        await self._store.start()
        cluster = await require_cluster(self._store, uri=config.metadata)

        host, port = split_host_port(config.listen, port_zero=True)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: BookieConnectionHandler(self),
            host,
            port,
            ssl=_server_ssl(config),
            start_serving=False,
            reuse_address=True,
        )
        self.address = join_host_port(host, self._server.sockets[0].getsockname()[1])
        self.bookie_id = config.bookie_id or self.address

        journal_dir, ledger_dir = config.journal_directory, config.ledger_directory
        cookie = await verify_or_format(
            CookieManager(self._store),
            self.bookie_id,
            [journal_dir, ledger_dir],
            cluster.instance_id,
        )
        keep = config.keep_large_entries_in_journal
        if keep is None:
            keep = journal_dir.stat().st_dev == ledger_dir.stat().st_dev
        self._keeps_entries = keep
        log.info(
            "bookie %s: entries of %d bytes or more %s",
            self.bookie_id,
            KEPT_ENTRY_SIZE,
            "stay in the journal (it shares a disk with the ledgers, or the setting says so)"
            if keep
            else "are copied into entry logs at each checkpoint",
        )
        self._storage = LedgerStorage(
            ledger_dir,
            log_size_limit=config.entry_log_size_limit,
            direct_io=config.direct_io,
            journal_entries=JournalEntries(journal_dir) if keep else None,
        )
        self._journal = Journal(
            journal_dir,
            file_size=config.journal_file_size,
            preallocate_size=config.journal_preallocate_size,
            max_batch_delay=config.journal_max_batch_delay,
            max_batch_bytes=config.journal_max_batch_bytes,
            direct_io=config.direct_io,
        )
        started = time.perf_counter()
        replayed = await asyncio.to_thread(self._replay)
        await self._journal.start()
        log.info(
            "bookie %s (incarnation %s): replayed %d journal records in %.2fs",
            self.bookie_id,
            cookie.incarnation_id,
            replayed,
            time.perf_counter() - started,
        )

        self.metrics.watch(
            lambda: self.journal.stats, lambda: self.storage.stats(), ledger_dir / "index"
        )
        if config.metrics_port is not None and self._admin_http is not None:
            self._http_task, self.metrics_port = await self._admin_http(
                self._store, self, self.metrics.registry, host, config.metrics_port
            )
        self._refresh_disk_usage()
        await self._server.start_serving()
        self._registry = BookieRegistry(self._store)
        if config.rack:
            await self._registry.set_placement(self.bookie_id, _placement(config.rack))
        await self._register()
        self._store.on_session_lost(self._session_lost)
        limbo = LimboWatch(
            self.storage,
            self._store,
            self.bookie_id,
            config.limbo_check_interval,
            self.metrics.ledgers_in_limbo.set,
        )
        self._tasks = [
            asyncio.create_task(self._checkpoint_loop(), name="checkpoint"),
            asyncio.create_task(self._disk_loop(), name="disk-check"),
            asyncio.create_task(limbo.run(), name="limbo"),
        ]
        log.info(
            "bookie %s serving on %s (%s)%s",
            self.bookie_id,
            self.address,
            self.disk.mode.value,
            f", admin HTTP and /metrics on :{self.metrics_port}" if self.metrics_port else "",
        )

    def _replay(self) -> int:
        """Re-apply the journal after the last checkpoint to ledger storage (worker thread).

        No checkpoint follows before serving: the replayed records wait in the write cache,
        served from there, until the checkpoint loop writes them out (at once, if they fill
        the cache). The journal keeps its files meanwhile, since only a checkpoint lets them
        go, and the first one's mark, in the journal file that `start` writes next, comes
        after every replayed record. A crash before it replays the same records again.

        Damage in the journal puts the ledgers that may have lost records in limbo
        (limbo.py) before the bookie serves anything.
        """
        mark_bytes = self.storage.last_checkpoint_mark()
        start = JournalMark.from_bytes(mark_bytes) if mark_bytes else None
        count = 0
        ledgers_by_file: dict[int, set[LedgerId]] = {}
        for mark, record in self.journal.replay(start):
            ledger_id = journal_records.apply(
                record, self.storage, mark if self._keeps_entries else None
            )
            ledgers_by_file.setdefault(mark.file_id, set()).add(ledger_id)
            count += 1
        damage = self.journal.damage
        if damage:
            limbo = ledgers_to_limbo(damage, ledgers_by_file, self.storage.known_ledgers)
            self.storage.enter_limbo(limbo)
            log.error(
                "bookie %s: its journal is damaged (%s): %d ledger(s) that may have lost "
                "acknowledged entries are in limbo, fenced and answering 'unknown' for what "
                "they lack until repaired: %s",
                self.bookie_id,
                "; ".join(f"file {d.file_id:016x} [{d.start}, {d.end})" for d in damage),
                len(limbo),
                describe(limbo),
            )
        self.metrics.ledgers_in_limbo.set(len(self.storage.limbo_ledgers()))
        return count

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        """Stop serving, make everything durable, deregister; idempotent."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            self._server.close()
            for connection in list(self._connections):
                connection.close()
        if self._journal is not None:
            await self._journal.close()
            if self._storage is not None:
                await asyncio.to_thread(self._checkpoint_now)
        if self._storage is not None:
            self._storage.close()
        if self._registry is not None:
            with contextlib.suppress(TallyError):
                await self._registry.unregister(self.bookie_id)
        if self._store is not None:
            await self._store.close()
        if self._http_task is not None:
            self._http_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._http_task
        self._stopped.set()
        log.info("bookie %s stopped", self.bookie_id)

    def _session_lost(self) -> None:
        """Without a session the bookie's registration is gone: stop rather than serve
        unseen (a supervisor restarts it with a new session)."""
        log.error("bookie %s lost its metadata store session; stopping", self.bookie_id)
        self.lost_session = True
        asyncio.get_running_loop().create_task(self.stop())

    # -- background work ---------------------------------------------------------------

    async def _checkpoint_loop(self) -> None:
        interval = self.config.flush_interval
        last = time.monotonic()
        while True:
            await asyncio.sleep(min(0.1, interval))
            full = self.storage.stats().cache_bytes >= self.config.write_cache_max_bytes
            if not full and time.monotonic() - last < interval:
                continue
            try:
                await asyncio.to_thread(self._checkpoint_now)
            except WriteFailed as error:
                self._io_error(f"checkpoint failed: {error}")
            last = time.monotonic()

    def _checkpoint_now(self) -> None:
        """Checkpoint up to the journal's last durable record, then drop older journals.

        Every durable record was applied to storage before it was journaled, so the
        mark never covers something storage lacks."""
        mark = self.journal.last_mark()
        self.storage.checkpoint(mark.to_bytes())
        self.journal.release_before(mark, keep=self.storage.kept_journal_files())

    async def _disk_loop(self) -> None:
        """Check the disks, and register the mode whenever it differs from the registered
        one: after a change here or after an I/O error, and again after a failed attempt."""
        while True:
            await asyncio.sleep(self.config.disk_check_interval)
            self._refresh_disk_usage()
            try:
                await self._register()
            except TallyError as error:
                log.warning(
                    "bookie %s: registering as %s failed, retrying: %s",
                    self.bookie_id,
                    self.disk.mode.value,
                    error,
                )

    def _refresh_disk_usage(self) -> None:
        """Feed the fullest data disk's usage in."""
        used = max(
            _used_fraction(d) for d in (self.config.journal_directory, self.config.ledger_directory)
        )
        self.disk = self.disk.with_usage(used)

    def _io_error(self, description: str) -> None:
        before = self.disk.mode
        self.disk = self.disk.with_io_error(description)
        if self.disk.mode is not before:
            log.error("bookie %s is now read-only: %s", self.bookie_id, description)
            asyncio.get_running_loop().create_task(self._register())

    async def _register(self) -> None:
        mode = self.disk.mode
        if mode is self._registered_mode or self._registry is None:
            return
        info = BookieInfo(
            address=self.address,
            http_port=self.metrics_port,
            version=__version__,
            start_time_ms=int(time.time() * 1000),
        )
        await self._registry.register(self.bookie_id, info, read_only=mode is BookieMode.READ_ONLY)
        self._registered_mode = mode
        self.metrics.read_only.set(1 if mode is BookieMode.READ_ONLY else 0)
        log.info("bookie %s registered %s (%s)", self.bookie_id, mode.value, self.disk.reason)

    # -- requests ----------------------------------------------------------------------

    def dispatch(self, request: protocol.Request, connection: BookieConnectionHandler) -> None:
        """Answer one request; errors become error responses, never a dropped connection."""
        handler = self._handlers.get(type(request))
        try:
            if handler is None:
                raise BadRequest(f"{request.operation.name} is not served by a bookie")
            handler(self, request, connection)
        except Exception as error:
            self._raised(request, connection, error)

    def _raised(
        self, request: protocol.Request, connection: BookieConnectionHandler, error: Exception
    ) -> None:
        """Answer a request whose handling raised: a TallyError as itself, anything else
        as an internal error, logged with its traceback."""
        if not isinstance(error, TallyError):
            log.error("bookie %s failed on %r", self.bookie_id, request, exc_info=error)
            error = TallyError(f"internal error: {error!r}")
        self._fail(request, connection, error)

    def _count(self, request: protocol.Request, result: str) -> None:
        self.metrics.requests.inc(_operation_label(request), result)

    def _fail(
        self, request: protocol.Request, connection: BookieConnectionHandler, error: TallyError
    ) -> None:
        self._count(request, type(error).__name__)
        connection.send(protocol.ErrorResponse.answering(request, error).encode())

    def _ok(
        self, request: protocol.Request, connection: BookieConnectionHandler, frame: bytes
    ) -> None:
        self._count(request, "ok")
        connection.send(frame)

    def _journal_then(
        self,
        record: bytes,
        done: Callable[[], None],
        request: protocol.Request,
        connection: BookieConnectionHandler,
    ) -> None:
        """Journal `record`; once it is durable call `done`, or answer with the failure."""
        self.journal.append_then(record, b"", partial(self._journaled, done, request, connection))

    def _journaled(
        self,
        done: Callable[[], None],
        request: protocol.Request,
        connection: BookieConnectionHandler,
        _: JournalMark | None,
        error: BaseException | None,
    ) -> None:
        if error is None:
            try:
                done()
            except TallyError as failure:
                self._fail(request, connection, failure)
            return
        self._journal_failed(request, connection, error)

    def _journal_failed(
        self, request: protocol.Request, connection: BookieConnectionHandler, error: BaseException
    ) -> None:
        if not isinstance(error, TallyError):
            error = WriteFailed(f"journal write failed: {error!r}")
        if isinstance(error, WriteFailed):
            self._io_error(str(error))
        self._fail(request, connection, error)

    def _journal_master_key(self, ledger_id: LedgerId, master_key: bytes) -> None:
        """Journal a ledger's first master key. Nobody waits on it: the record that needs
        it (entry, fence, LAC) is journaled right after, in the same or a later group
        commit, so its reply already implies this one is durable, and its failure reports
        the journal's."""
        self.journal.append_then(
            journal_records.master_key_record(ledger_id, master_key), b"", _ignore
        )

    def _add(self, request: protocol.AddRequest, connection: BookieConnectionHandler) -> None:
        started = time.perf_counter()
        admit_write(self.disk, self.bookie_id, recovery=request.recovery)
        ledger_id = request.ledger_id
        storage = self.storage
        admission = admit_add(
            ledger_id,
            storage.ledger_access(ledger_id),
            request.master_key,
            recovery=request.recovery,
        )
        storage.add_entry(
            ledger_id, request.entry_id, request.crc32c, request.entry, request.last_add_confirmed
        )
        if admission.record_master_key:
            storage.set_master_key(ledger_id, request.master_key)
            self._journal_master_key(ledger_id, request.master_key)
        head = journal_records.entry_record_head(
            ledger_id, request.entry_id, request.last_add_confirmed, request.crc32c
        )
        self.journal.append_then(  # add_entry has just checked the entry's CRC32C
            head, request.entry, partial(self._added, request, connection, started), request.crc32c
        )

    def _added(
        self,
        request: protocol.AddRequest,
        connection: BookieConnectionHandler,
        started: float,
        mark: JournalMark | None,
        error: Exception | None,
    ) -> None:
        """Acknowledge an add whose journal record is durable (or answer its failure)."""
        if mark is None:
            self._journal_failed(request, connection, error or WriteFailed("journal lost it"))
            return
        if self._keeps_entries:
            location = kept_location(mark, len(request.entry), request.crc32c)
            if location is not None:
                self.storage.keep_in_journal(request.ledger_id, request.entry_id, location)
        response = protocol.AddResponse(request.request_id, request.ledger_id, request.entry_id)
        self._ok(request, connection, response.encode())
        self.metrics.add_entry_seconds.observe(time.perf_counter() - started)

    def _read(self, request: protocol.ReadRequest, connection: BookieConnectionHandler) -> None:
        started = time.perf_counter()
        ledger_id = request.ledger_id

        def answer() -> None:
            _, data = self.storage.get_entry(ledger_id, request.entry_id)
            response = protocol.ReadResponse(request.request_id, ledger_id, request.entry_id, data)
            self._ok(request, connection, response.encode())
            self.metrics.read_entry_seconds.observe(time.perf_counter() - started)

        if request.master_key is None:
            answer()
            return
        self._fence(request, request.master_key, answer, connection)

    def _fence(
        self,
        request: protocol.ReadRequest,
        master_key: bytes,
        then: Callable[[], None],
        connection: BookieConnectionHandler,
    ) -> None:
        """Fence the ledger durably, then run `then`: the fence is in the journal before
        any reply, including replies to fencing reads racing a fence still in flight."""
        ledger_id = request.ledger_id
        admit_write(self.disk, self.bookie_id, recovery=True)
        admission = admit_fencing_read(ledger_id, self.storage.ledger_access(ledger_id), master_key)
        if admission.record_master_key:
            self.storage.set_master_key(ledger_id, master_key)
            self._journal_master_key(ledger_id, master_key)
        if admission.record_fence:
            self.storage.set_fenced(ledger_id)
            future = self.journal.append_nowait(journal_records.fence_record(ledger_id))
            self._pending_fences[ledger_id] = future
            future.add_done_callback(lambda _: self._pending_fences.pop(ledger_id, None))
        else:
            pending = self._pending_fences.get(ledger_id)
            if pending is None:
                then()
                return
            future = pending
        future.add_done_callback(
            lambda done: self._journaled(then, request, connection, None, done.exception())
        )

    def _read_lac(
        self, request: protocol.ReadLacRequest, connection: BookieConnectionHandler
    ) -> None:
        lac = self.storage.last_add_confirmed(request.ledger_id)
        response = protocol.ReadLacResponse(request.request_id, request.ledger_id, lac)
        self._ok(request, connection, response.encode())

    def _write_lac(
        self, request: protocol.WriteLacRequest, connection: BookieConnectionHandler
    ) -> None:
        ledger_id = request.ledger_id
        admission = admit_write_lac(
            ledger_id, self.storage.ledger_access(ledger_id), request.master_key
        )
        if admission.record_master_key:
            self.storage.set_master_key(ledger_id, request.master_key)
            self._journal_master_key(ledger_id, request.master_key)
        self.storage.set_explicit_lac(ledger_id, request.last_add_confirmed)
        record = journal_records.explicit_lac_record(ledger_id, request.last_add_confirmed)
        response = protocol.WriteLacResponse(request.request_id, ledger_id).encode()
        self._journal_then(
            record, lambda: self._ok(request, connection, response), request, connection
        )

    def _list_entries(
        self, request: protocol.GetListOfEntriesOfLedgerRequest, connection: BookieConnectionHandler
    ) -> None:
        availability = self.storage.availability(request.ledger_id)
        response = protocol.GetListOfEntriesOfLedgerResponse(
            request.request_id, request.ledger_id, availability.to_bytes()
        )
        self._ok(request, connection, response.encode())

    def _ledger_info(
        self, request: protocol.LedgerInfoRequest, connection: BookieConnectionHandler
    ) -> None:
        info = self.storage.ledger_info(request.ledger_id)
        response = protocol.LedgerInfoResponse(request.request_id, request.ledger_id, info)
        self._ok(request, connection, response.encode())

    def _dump(
        self, request: protocol.AvailabilityDumpRequest, connection: BookieConnectionHandler
    ) -> None:
        connection.start_task(self._stream_dump(request, connection))

    async def _stream_dump(
        self, request: protocol.AvailabilityDumpRequest, connection: BookieConnectionHandler
    ) -> None:
        """Every ledger with its availability, a frame at a time, pausing for the reader.

        A failure midway (a ledger too large for a frame, a storage error) ends the stream
        with an error response, so the reader is not left waiting for the rest."""
        encoder = protocol.AvailabilityDumpEncoder(
            request.request_id, budget=self.config.max_frame_size
        )
        try:
            for count, (ledger_id, held) in enumerate(self.storage.iter_availability(), start=1):
                frame = encoder.add(protocol.LedgerAvailability(ledger_id, held.to_bytes()))
                if frame is not None:
                    connection.send(frame)
                    await connection.writable()
                if count % DUMP_LEDGERS_PER_TURN == 0:
                    await asyncio.sleep(0)
        except Exception as error:
            self._raised(request, connection, error)
            return
        self._ok(request, connection, encoder.finish())

    _handlers: ClassVar[dict[type, Callable[..., None]]] = {
        protocol.AddRequest: _add,
        protocol.ReadRequest: _read,
        protocol.ReadLacRequest: _read_lac,
        protocol.WriteLacRequest: _write_lac,
        protocol.GetListOfEntriesOfLedgerRequest: _list_entries,
        protocol.LedgerInfoRequest: _ledger_info,
        protocol.AvailabilityDumpRequest: _dump,
    }


class BookieConnectionHandler(asyncio.BufferedProtocol):
    """One client connection: frames in, requests to the bookie, responses out.

    Responses sent in one event-loop turn leave in one write: a group commit answers
    hundreds of adds at once, and a send per answer was a sixth of the CPU of an add
    (bench/bench_bookie.py, docs/benchmarks.md).
    """

    def __init__(self, bookie: Bookie) -> None:
        self._bookie = bookie
        self._reader = protocol.RequestReader(bookie.config.max_frame_size, bookie.receive_arenas)
        self._transport: asyncio.Transport | None = None
        self._peer = "?"
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._outbox: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._bookie._connections.add(self)
        self._bookie.metrics.connections.inc()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._outbox.clear()
        self._bookie._connections.discard(self)
        self._bookie.metrics.connections.dec()
        for task in self._tasks:
            task.cancel()
        if self._reader.pending_bytes:
            # A frame cut short by the end of the stream is a malformed frame too.
            self._bookie.metrics.malformed_frames.inc()
            log.warning(
                "connection from %s closed with %d bytes of an unfinished frame",
                self._peer,
                self._reader.pending_bytes,
            )
        self._reader.release()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            requests = self._reader.buffer_updated(nbytes)
        except MalformedData as error:
            log.warning("closing connection from %s: %s", self._peer, error)
            self._bookie.metrics.malformed_frames.inc()
            self.close()
            return
        for request in requests:
            self._bookie.dispatch(request, self)

    def send(self, frame: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._outbox.append(frame)
            if len(self._outbox) == 1:
                asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        frames, self._outbox = self._outbox, []
        if frames and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(frames))

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    async def writable(self) -> None:
        self._flush()
        await self._can_write.wait()
        if self._transport is None:
            raise asyncio.CancelledError

    def start_task(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()


RECEIVE_ARENA_SIZE = 1 << 20
"""A bookie's receive arenas: a 64 KiB frame that straddles two is copied into the next,
so a sixteenth of them are, where with asyncio's 256 KiB reads a quarter were."""
MAX_RETAINED_ARENA_BYTES = 256 << 20
"""The most that retired arenas may hold, free or still viewed, for reuse."""

GC_YOUNG_THRESHOLD = 10_000
"""Allocations between two collections of the youngest generation (Python's default: 700)."""


def tune_garbage_collector() -> None:
    """Fit the cyclic garbage collector to a bookie process (call once it serves), which
    allocates some ten objects per request and keeps a few of them until the journal has
    synced them (measured in docs/benchmarks.md, bookie section).

    What start-up made (modules, classes, replayed state) lives as long as the process:
    frozen, it is left out of the full collections, which otherwise walked it every few
    tens of thousands of adds, pausing the event loop 50-130 ms each time. And collecting
    the youngest generation every 10,000 allocations rather than 700 cuts the collector's
    share of an add from about 1.1 us to 0.2. Process-wide, so `tally bookie` calls it,
    not the Bookie class, which tests and tools also run inside processes of their own.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def _ignore(mark: JournalMark | None, error: Exception | None) -> None:
    """A journal record nobody waits on (a master key: see `_journal_master_key`)."""


def _operation_label(request: protocol.Request) -> str:
    """The metrics' operation: a fencing read is counted as FENCE, apart from plain reads,
    since fences are what recovery's progress and an old writer's refusals hang on."""
    if isinstance(request, protocol.ReadRequest) and request.do_fencing:
        return "FENCE"
    return _OPERATION_NAMES[request.operation]


def _placement(rack: str) -> BookiePlacement:
    """A network location /zone/rack (BookKeeper's /region/rack); a bare /rack is in the
    default zone, as BookKeeper puts it in /default-region."""
    parts = rack.strip("/").split("/")
    zone = f"/{parts[0]}" if len(parts) > 1 else "/default-zone"
    return BookiePlacement(rack, zone)


def _server_ssl(config: BookieConfig) -> ssl.SSLContext | None:
    if config.tls_cert is None or config.tls_key is None:
        return None  # the config refuses one without the other
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert, config.tls_key)
    if config.tls_client_ca is not None:
        context.load_verify_locations(config.tls_client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _used_fraction(directory: Path) -> float:
    usage = shutil.disk_usage(directory)
    return usage.used / usage.total if usage.total else 0.0
