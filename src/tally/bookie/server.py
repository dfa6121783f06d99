"""The bookie's life cycle: start, background work (checkpoints, disk checks), stop.

Start-up, in this order: the store must hold a cluster; the listening socket is bound (a
port of 0 becomes a real one, which is the bookie id unless one is configured); the
cookie check proves the directories belong to this bookie of this cluster; the journal
is replayed into ledger storage from the last checkpoint (the checkpoint loop writes the
replayed records out later, while the bookie serves); then the bookie serves, and only
then registers, so no client finds it before it can answer. Its requests are answered by
requests.py, over connections of connection.py.

A journal that cannot write (its disk full at start-up or later) turns the bookie read-only,
not down: it serves reads, and the disk check loop tries a new journal file until one fits
(tally.core.disk_usage decides when, and what mode follows).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import shutil
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from tally.bookie import journal_records
from tally.bookie.config import BookieConfig
from tally.bookie.connection import BookieConnectionHandler, close_stalled
from tally.bookie.cookie_check import store_lost, verify_or_format
from tally.bookie.garbage_collector import GarbageCollector, GcMetrics
from tally.bookie.journal import Journal, out_of_space
from tally.bookie.journal_entries import KEPT_ENTRY_SIZE
from tally.bookie.ledger_dir_health import errno_of
from tally.bookie.ledger_directories import LedgerDirectories
from tally.bookie.ledger_placement import recorded_failures
from tally.bookie.limbo import LimboWatch, describe
from tally.bookie.metrics import BookieMetrics
from tally.bookie.read_workers import ReadWorkers
from tally.bookie.requests import BookieRequestProcessor
from tally.bookie.scrubber_service import ScrubberService, ScrubberServices
from tally.core import protocol
from tally.core.addresses import join_host_port, split_host_port
from tally.core.disk_usage import BookieMode, DiskPolicy, DiskState
from tally.core.errors import (
    BadRequest,
    ClusterNotInitialised,
    EntryUnreadable,
    TallyError,
    WriteFailed,
)
from tally.core.ids import LedgerId
from tally.core.ledger_dirs import DiskError, classify_error
from tally.core.receive_arenas import ReceiveArenas
from tally.core.receive_limits import ReceiveBudget
from tally.metadata.bad_copies import BadCopyReports
from tally.metadata.bookie_registry import BookieInfo, BookiePlacement, BookieRegistry
from tally.metadata.cluster import require_cluster
from tally.metadata.cookies import CookieManager
from tally.metadata.store import MetadataStore
from tally.metadata.stores import open_store
from tally.metadata.underreplication import UnderReplicationManager
from tally.version import __version__

log = logging.getLogger(__name__)

AdminHttp = Callable[
    [MetadataStore, "Bookie", CollectorRegistry, str, int],
    Awaitable[tuple["asyncio.Task[None]", int]],
]
"""Starts a process's admin HTTP app (the face provides it: layers import downwards):
(store, bookie, metrics registry, host, port) -> (serving task, port)."""


class Bookie:
    """One bookie: call `start`, then `wait_stopped`; `stop` from a signal handler."""

    def __init__(self, config: BookieConfig, *, admin_http: AdminHttp | None = None) -> None:
        self.config = config
        self._admin_http = admin_http
        self.metrics = BookieMetrics()
        self.address = ""
        """Where clients reach it (registered): the advertised address, else `listening`."""
        self.listening = ""
        self.bookie_id = ""
        self.metrics_port: int | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._store: MetadataStore | None = None
        self._bad_copies: BadCopyReports | None = None
        self._registry: BookieRegistry | None = None
        self._server: asyncio.Server | None = None
        self._journal: Journal | None = None
        self._storage: LedgerDirectories | None = None
        self._keeps_entries = False
        """Whether large entries stay in the journal (`keep_large_entries_in_journal`)."""
        self._requests: BookieRequestProcessor | None = None
        self._reads: ReadWorkers[tuple[bytes, int]] | None = None
        self._gc: GarbageCollector | None = None
        self._scrubber: ScrubberServices | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limbo: LimboWatch | None = None
        self._probe_wanted = asyncio.Event()
        """Set by an error that asks for a probe of a ledger directory: the disk check
        then runs at once."""
        self._failures: set[asyncio.Task[None]] = set()
        """What follows the failures of ledger directories (marks, registration)."""
        self._checkpointing = threading.Lock()
        """Held by a checkpoint from taking its mark to the journal's release: two at once
        could write an older mark after the newer one's release deleted its journal file."""
        self._tasks: list[asyncio.Task[None]] = []
        self.stop_failures = 0
        """Steps of `stop` that failed (logged): `tally bookie` then exits 1."""
        self._connections: set[BookieConnectionHandler] = set()
        self._stopping = False
        self._stopped = asyncio.Event()
        self.lost_session = False
        """Whether it stopped because its metadata store session was lost, not on request."""
        self._registered: tuple[BookieMode, tuple[str, ...]] | None = None
        """The mode and failed ledger directories of the registration in the store."""
        self._registering = asyncio.Lock()
        retained = min(2 * config.write_cache_max_bytes, MAX_RETAINED_ARENA_BYTES)
        self.receive_arenas = ReceiveArenas(RECEIVE_ARENA_SIZE, retained // RECEIVE_ARENA_SIZE)
        """Shared by the connections. The write cache holds views of them (large entries)
        and lets go of about its size at each checkpoint, while as much again arrives."""
        self.receive_budget: ReceiveBudget[BookieConnectionHandler] = ReceiveBudget(
            config.receive_buffer_limit_bytes
        )
        """What the connections' unfinished frames may hold, together."""
        self.metrics.watch_receive_budget(self.receive_budget)

    @property
    def journal(self) -> Journal:
        assert self._journal is not None, "bookie not started"
        return self._journal

    @property
    def storage(self) -> LedgerDirectories:
        assert self._storage is not None, "bookie not started"
        return self._storage

    @property
    def garbage_collector(self) -> GarbageCollector:
        assert self._gc is not None, "bookie not started"
        return self._gc

    @property
    def scrubber(self) -> ScrubberServices:
        assert self._scrubber is not None, "bookie not started"
        return self._scrubber

    @property
    def disk(self) -> DiskState:
        """The bookie's mode and why, kept by its request processor, which admits writes by it."""
        assert self._requests is not None, "bookie not started"
        return self._requests.disk

    @disk.setter
    def disk(self, state: DiskState) -> None:
        assert self._requests is not None, "bookie not started"
        self._requests.disk = state

    # -- life cycle -------------------------------------------------------------------

    async def start(self) -> None:
        config = self.config
        if not config.metadata:
            raise BadRequest("a bookie needs --metadata URI (or TALLY_BOOKIE_METADATA)")
        self._store = open_store(config.metadata, session_timeout=config.session_timeout)
        await self._store.start()
        try:
            cluster = await require_cluster(self._store, uri=config.metadata)
        except ClusterNotInitialised as problem:
            raise store_lost(config.journal_directory, config.metadata, problem) from None

        host, port = split_host_port(config.listen, port_zero=True)
        loop = self._loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._new_connection,
            host,
            port,
            ssl=_server_ssl(config),
            start_serving=False,
            reuse_address=True,
        )
        self.listening = join_host_port(host, self._server.sockets[0].getsockname()[1])
        self.address = config.advertised_address or self.listening
        self.bookie_id = config.bookie_id or self.address

        journal_dir, ledger_dirs = config.journal_directory, config.ledger_directories
        cookie = await verify_or_format(
            CookieManager(self._store),
            self.bookie_id,
            [journal_dir, *ledger_dirs],
            cluster.instance_id,
            failed=recorded_failures(journal_dir),
        )
        self._storage = LedgerDirectories(
            ledger_dirs,
            journal_dir,
            keeps_entries=config.keeps_entries,
            log_size_limit=config.entry_log_size_limit,
            direct_io=config.direct_io,
            gc=config.gc_settings,
            on_corrupt=self._corrupt_found,
            on_failure=lambda *failure: _call_soon(loop, self._directory_failed, *failure),
            on_unclear_error=lambda: _call_soon(loop, self._probe_wanted.set),
        )
        self._keeps_entries = keep = self._storage.keeps_entries
        log.info(
            "bookie %s: entries of %d bytes or more %s",
            self.bookie_id,
            KEPT_ENTRY_SIZE,
            "stay in the journal (it shares a disk with the ledgers, or the setting says so)"
            if keep
            else "are copied into entry logs at each checkpoint",
        )
        _warn_if_the_journal_disk_is_small(self.bookie_id, journal_dir, config.journal_file_size)
        self._journal = Journal(
            journal_dir,
            file_size=config.journal_file_size,
            preallocate_size=config.journal_preallocate_size,
            max_batch_delay=config.journal_max_batch_delay,
            max_batch_bytes=config.journal_max_batch_bytes,
            direct_io=config.direct_io,
            on_failure=self._journal_failed,
        )
        policy = DiskPolicy(
            config.disk_usage_threshold,
            config.disk_usage_lwm_threshold,
            config.journal_retry_interval,
        )
        self._reads = ReadWorkers(config.read_threads)
        self._requests = BookieRequestProcessor(
            self.bookie_id,
            self._journal,
            self._storage,
            self.metrics,
            DiskState(policy),
            keeps_entries=keep,
            max_frame_size=config.max_frame_size,
            reads=self._reads,
            cookie=cookie.to_bytes(),
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
            lambda: self.journal.stats, lambda: self.storage.stats(), self.storage.directories
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
        self._bad_copies = BadCopyReports(
            UnderReplicationManager(self._store), self.metrics.corrupt_entries_reported.inc
        )
        limbo = self._limbo = LimboWatch(
            self.storage,
            self._store,
            self.bookie_id,
            config.limbo_check_interval,
            self.metrics.ledgers_in_limbo.set,
        )
        if self.storage.lost_at_start:
            self._after_failure(self.storage.lost_at_start)
        self._gc = GarbageCollector(
            self.storage,
            self._store,
            self.bookie_id,
            wait_time=config.gc_wait_time,
            overreplicated_wait_time=config.gc_overreplicated_ledger_wait_time,
            tombstone_retention=config.tombstone_retention,
            checkpoint=lambda: asyncio.to_thread(self._checkpoint_now),
            metrics=GcMetrics(self.metrics.registry),
        )
        self._scrubber = ScrubberServices(
            {
                name: ScrubberService(
                    storage,
                    self.bookie_id,
                    config.scrub_policy,
                    disk_bytes=_disk_size(path),
                )
                for name, path, storage in self.storage.storages()
            }
        )
        self._tasks = [
            asyncio.create_task(self._checkpoint_loop(), name="checkpoint"),
            asyncio.create_task(self._disk_loop(), name="disk-check"),
            asyncio.create_task(limbo.run(), name="limbo"),
            asyncio.create_task(self._gc.run(), name="gc"),
            asyncio.create_task(
                close_stalled(self._connections, config.receive_stall_timeout),
                name="receive-stalls",
            ),
            asyncio.create_task(self._scrubber.run(), name="scrub"),
            asyncio.create_task(self._corrupt_loop(), name="corrupt-copies"),
        ]
        log.info(
            "bookie %s serving on %s (%s)%s",
            self.bookie_id,
            self.listening
            if self.address == self.listening
            else f"{self.listening}, advertised as {self.address}",
            self.disk.mode.value,
            f", admin HTTP and /metrics on :{self.metrics_port}" if self.metrics_port else "",
        )

    def _new_connection(self) -> BookieConnectionHandler:
        """A new client connection's protocol (asyncio asks for one only once serving)."""
        assert self._requests is not None, "bookie not started"
        reader = protocol.RequestReader(self.config.max_frame_size, self.receive_arenas)
        return BookieConnectionHandler(
            self._requests.dispatch_all,
            reader,
            self._connections,
            self.metrics,
            self.receive_budget,
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
        replayed = journal_records.replay_into(
            self.journal, self.storage, keeps_entries=self._keeps_entries
        )
        if replayed.damage:
            log.error(
                "bookie %s: its journal is damaged (%s): %d ledger(s) that may have lost "
                "acknowledged entries are in limbo, fenced and answering 'unknown' for what "
                "they lack until repaired: %s",
                self.bookie_id,
                "; ".join(f"file {d.file_id:016x} [{d.start}, {d.end})" for d in replayed.damage),
                len(replayed.limbo),
                describe(replayed.limbo),
            )
        self.metrics.ledgers_in_limbo.set(len(self.storage.limbo_ledgers()))
        return replayed.records

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def stop(self) -> None:
        """Stop serving, make everything durable, deregister; idempotent.

        Every step is tried whatever the one before did (a background task that had died
        with an error, an index that cannot close on a vanished disk): a failed step is
        logged and counted in `stop_failures`, and the bookie stops all the same; it used
        to hang, alive and unregistered, until SIGKILL."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        try:
            for task in [*self._tasks, *self._failures]:
                task.cancel()
            for task in [*self._tasks, *self._failures]:
                await self._stop_step(f"its {task.get_name()} task", _finished(task))
            if self._server is not None:
                self._server.close()
                for connection in list(self._connections):
                    connection.close()
            if self._reads is not None:
                await self._stop_step("its reads under way", asyncio.to_thread(self._reads.close))
            if self._journal is not None:
                await self._stop_step("closing its journal", self._journal.close())
                if self._storage is not None:
                    await self._stop_step("its last checkpoint", self._last_checkpoint())
            if self._storage is not None:
                await self._stop_step("closing its storage", _now(self._storage.close))
            if self._registry is not None:
                await self._stop_step("unregistering", self._registry.unregister(self.bookie_id))
            if self._bad_copies is not None:
                await self._stop_step("recording bad copies", self._bad_copies.flush())
            if self._store is not None:
                await self._stop_step("closing its store session", self._store.close())
            if self._http_task is not None:
                self._http_task.cancel()
                await self._stop_step("its admin HTTP server", _finished(self._http_task))
        finally:
            self._stopped.set()
        if self.bookie_id:  # else it never got as far as its identity: nothing to report
            log.info("bookie %s stopped", self.bookie_id)

    async def _last_checkpoint(self) -> None:
        try:
            await asyncio.to_thread(self._checkpoint_now)
        except WriteFailed as error:  # the journal keeps what it could not write: no failure
            log.error("bookie %s: last checkpoint failed: %s", self.bookie_id, error)

    async def _stop_step(self, what: str, step: Awaitable[object]) -> None:
        try:
            await step
        except Exception as error:  # stopping goes on: logged, and counted
            self.stop_failures += 1
            log.error("bookie %s: stopping: %s failed: %r", self.bookie_id, what, error)

    def _corrupt_found(self, ledger_id: LedgerId, entry_ids: list[int]) -> None:
        """Ledger storage marked entries corrupt (from a read, or the scrubber's thread):
        `on_corrupt` hears of them on the event loop."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.on_corrupt, ledger_id, entry_ids)

    def on_corrupt(self, ledger_id: LedgerId, entry_ids: list[int]) -> None:
        """Entries of `ledger_id` whose copy here was found corrupt and marked: their repair
        is filed, a mark on the ledger naming this bookie and the entries (`bad_copies`),
        which a replication worker writes verified copies over (issue 17, part 3)."""
        log.error(
            "bookie %s: %d entr%s of ledger %s found corrupt here and marked (%s); filing "
            "their repair from another replica (reads answer EntryCorrupt until then)",
            self.bookie_id,
            len(entry_ids),
            "y" if len(entry_ids) == 1 else "ies",
            ledger_id.qualified_name,
            _entry_list(entry_ids),
        )
        assert self._bad_copies is not None
        self._bad_copies.report(ledger_id, self.bookie_id, entry_ids)

    async def _corrupt_loop(self) -> None:
        """File every copy still marked corrupt here, at start and every
        `limbo_check_interval`: a filing lost to a store error or a restart is made again
        (a mark that already names them is left as it is)."""
        while True:
            found = await asyncio.to_thread(self.storage.corrupt_entries)
            by_ledger: dict[LedgerId, list[int]] = {}
            for corrupt in found:
                by_ledger.setdefault(corrupt.ledger_id, []).append(corrupt.entry_id)
            for ledger_id, entry_ids in by_ledger.items():
                assert self._bad_copies is not None
                self._bad_copies.report(ledger_id, self.bookie_id, entry_ids)
            await asyncio.sleep(self.config.limbo_check_interval)

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
        failed = False
        while True:
            await asyncio.sleep(min(0.1, interval))
            full = self.storage.stats().cache_bytes >= self.config.write_cache_max_bytes
            # A full cache is checkpointed at once, but not again just after a checkpoint
            # failed (it gave its entries back: the cache is as full as before): a disk out
            # of room is tried every `interval`, not at every turn of this loop.
            if (failed or not full) and time.monotonic() - last < interval:
                continue
            try:
                await asyncio.to_thread(self._checkpoint_now)
            except (WriteFailed, EntryUnreadable) as error:  # an index read fails it too
                failed = True
                if classify_error(errno_of(error)) is DiskError.FULL:
                    self._checkpoint_out_of_room(error)
                else:
                    self._io_error(f"checkpoint failed: {error}")
            else:
                failed = False
                if self.disk.checkpoint_out_of_room is not None:
                    self._change_disk(self.disk.with_checkpoint_done())
                    log.warning(
                        "bookie %s: a checkpoint succeeded again (room on the ledger disks)",
                        self.bookie_id,
                    )
            last = time.monotonic()

    def _checkpoint_now(self) -> None:
        """Checkpoint up to the journal's last durable record, then drop older journals.

        Every durable record was applied to storage before it was journaled, so the
        mark never covers something storage lacks."""
        with self._checkpointing:  # the loop's and the GC's: a mark never goes back
            mark = self.journal.last_mark()
            if mark.file_id == 0:  # no journal file yet (a start on a full disk): no mark
                return
            self.storage.checkpoint(mark.to_bytes())
            self.journal.release_before(mark, keep=self.storage.kept_journal_files())

    async def _disk_loop(self) -> None:
        """Check the disks (a probe of each ledger directory in service, then the usage),
        try a new journal file when one is due, and register the mode and the failed ledger
        directories whenever they differ from the registered ones: after a change here or
        after an I/O error, and again after a failed attempt. An error that asks for a probe
        starts a check at once."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._probe_wanted.wait(), self.config.disk_check_interval)
            self._probe_wanted.clear()
            await self._probe_ledger_dirs()
            self._refresh_disk_usage()
            await self._retry_journal()
            try:
                await self._register()
            except TallyError as error:
                log.warning(
                    "bookie %s: registering as %s failed, retrying: %s",
                    self.bookie_id,
                    self.disk.mode.value,
                    error,
                )

    async def _probe_ledger_dirs(self) -> None:
        """Probe each ledger directory in service in a worker thread; one that does not
        answer within LEDGER_DIR_PROBE_TIMEOUT has failed (its thread is left to hang)."""
        for directory in self.storage.directories():
            if directory.failed:
                continue
            try:
                await asyncio.wait_for(
                    asyncio.to_thread(self.storage.probe, directory.name),
                    LEDGER_DIR_PROBE_TIMEOUT,
                )
            except TimeoutError:
                self.storage.probe_unfinished(directory.name, LEDGER_DIR_PROBE_TIMEOUT)

    def _refresh_disk_usage(self) -> None:
        """Feed the fullest data disk's usage in: the journal's or a ledger directory's in
        service."""
        ledgers = self.storage.refresh_usage(self.config.disk_usage_threshold)
        try:
            journal = _used_fraction(self.config.journal_directory)
        except OSError as error:  # the journal's own writes report its disk's failure
            log.warning("bookie %s: the journal's disk usage is unknown: %s", self.bookie_id, error)
            journal = 0.0
        self.disk = self.disk.with_usage(max(journal, ledgers))

    def _directory_failed(self, name: str, reason: str, ledgers: list[LedgerId]) -> None:
        """A ledger directory failed (the event loop): its scrubber stops, the bookie
        registers anew (its failed directories are in its registration), the ledgers placed
        again elsewhere are marked for repair, and its storage is closed. With none left in
        service the bookie turns read-only."""
        if self._stopping:
            return
        if self._scrubber is not None:
            self._scrubber.stop(name)
        if all(d.failed for d in self.storage.directories()):
            self._io_error(f"every ledger directory failed; the last, {name}: {reason}")
        self._after_failure(ledgers)

    def _after_failure(self, ledgers: list[LedgerId]) -> None:
        async def follow_up() -> None:
            with contextlib.suppress(TallyError):  # the disk check registers it again
                await self._register()
            if self._limbo is not None:
                await self._limbo.mark_lost(ledgers)
            await asyncio.to_thread(self.storage.close_failed)  # may wait on a hung disk

        task = asyncio.get_running_loop().create_task(follow_up(), name="ledger-dir-failed")
        self._failures.add(task)
        task.add_done_callback(self._failures.discard)

    def _checkpoint_out_of_room(self, error: TallyError) -> None:
        """Read-only, serving reads, until a checkpoint succeeds: the write cache cannot be
        emptied, so adds would only pile up in it and in the journal."""
        if self._change_disk(self.disk.with_checkpoint_out_of_room(str(error))):
            log.error(
                "bookie %s is read-only, serving reads: a checkpoint found no room on a ledger "
                "disk (%s); free space there: it turns writable by itself at the first "
                "checkpoint that succeeds (tried every %gs)",
                self.bookie_id,
                error,
                self.config.flush_interval,
            )

    def _io_error(self, description: str) -> None:
        if self._change_disk(self.disk.with_io_error(description)):
            log.error("bookie %s is now read-only: %s", self.bookie_id, description)

    def _journal_failed(self, error: TallyError) -> None:
        """The journal stopped taking records: read-only, serving reads, until a new journal
        file is written and synced (`_retry_journal`)."""
        self.metrics.journal_failed.set(1)
        self._change_disk(self.disk.with_journal_failure(str(error), now=time.monotonic()))
        log.error(
            "bookie %s is read-only, serving reads: its journal %s (%s); %s (%s), and it turns "
            "writable by itself at the first new journal file written (tried every %gs)",
            self.bookie_id,
            "is out of room" if out_of_space(error) else "failed",
            error,
            "free space on the journal's disk"
            if out_of_space(error)
            else "check the journal's disk",
            self.config.journal_directory,
            self.config.journal_retry_interval,
        )

    async def _retry_journal(self) -> None:
        """Try a new journal file, if one is due while the journal cannot write."""
        if not self.disk.journal_retry_due(time.monotonic()):
            return
        try:
            await self.journal.resume()
        except TallyError as error:
            self._change_disk(self.disk.with_journal_failure(str(error), now=time.monotonic()))
            log.warning(
                "bookie %s: the journal still cannot write: %s; read-only, next try in %gs",
                self.bookie_id,
                error,
                self.config.journal_retry_interval,
            )
            return
        self.metrics.journal_failed.set(0)
        self._change_disk(self.disk.with_journal_writing())
        log.info(
            "bookie %s: its journal writes again, in a new file; the bookie is %s (%s)",
            self.bookie_id,
            self.disk.mode.value,
            self.disk.reason,
        )

    def _change_disk(self, state: DiskState) -> bool:
        """Take the new state; register the mode anew if it changed (whether it did)."""
        before = self.disk.mode
        self.disk = state
        if state.mode is before:
            return False
        asyncio.get_running_loop().create_task(self._register())
        return True

    async def _register(self) -> None:
        async with self._registering:  # a change's and the disk loop's: one write per change
            await self._register_mode()

    async def _register_mode(self) -> None:
        mode = self.disk.mode
        failed = tuple(sorted(self.storage.failed_directories()))
        if (mode, failed) == self._registered or self._registry is None:
            return
        info = BookieInfo(
            address=self.address,
            http_port=self.metrics_port,
            version=__version__,
            start_time_ms=int(time.time() * 1000),
            failed_ledger_dirs=failed,
        )
        await self._registry.register(self.bookie_id, info, read_only=mode is BookieMode.READ_ONLY)
        self._registered = (mode, failed)
        self.metrics.read_only.set(1 if mode is BookieMode.READ_ONLY else 0)
        log.info("bookie %s registered %s (%s)", self.bookie_id, mode.value, self.disk.reason)


RECEIVE_ARENA_SIZE = 1 << 20
"""A bookie's receive arenas: a 64 KiB frame that straddles two is copied into the next,
so a sixteenth of them are, where with asyncio's 256 KiB reads a quarter were."""
MAX_RETAINED_ARENA_BYTES = 256 << 20
"""The most that retired arenas may hold, free or still viewed, for reuse."""
LEDGER_DIR_PROBE_TIMEOUT = 30.0
"""Seconds a probe of a ledger directory may take before the directory counts as failed
(a disk that hangs)."""

GC_YOUNG_THRESHOLD = 10_000
"""Allocations between two collections of the youngest generation (Python's default: 700)."""


def tune_garbage_collector() -> None:
    """Fit the cyclic garbage collector to a bookie process (call once it serves), which
    allocates several objects per request and keeps a few of them until the journal has
    synced them (docs/benchmarks.md, bookie section, has the figures).

    What start-up made (modules, classes, replayed state) lives as long as the process:
    frozen, it is left out of the full collections, which would otherwise walk it again
    and again, pausing the event loop each time. And the youngest generation, which every
    request fills, is collected less often. Process-wide, so `tally bookie` calls it, not
    the Bookie class, which tests and tools also run inside processes of their own.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def _call_soon(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: object
) -> None:
    """Call `callback` on the bookie's loop, from any thread; nothing once it has closed."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


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


def _entry_list(entry_ids: list[int], shown: int = 20) -> str:
    more = len(entry_ids) - shown
    listed = ", ".join(str(entry_id) for entry_id in entry_ids[:shown])
    return f"{listed} and {more} more" if more > 0 else listed


def _warn_if_the_journal_disk_is_small(bookie_id: str, journal_dir: Path, file_size: int) -> None:
    """A journal file is let go only once the next one is written: a disk that cannot hold
    two fills up with the one, and the bookie stays read-only until an operator frees room."""
    size = shutil.disk_usage(journal_dir).total
    if size < 2 * file_size:
        log.warning(
            "bookie %s: the journal's disk (%d MiB) cannot hold two journal files of "
            "journal_file_size (%d MiB): once it fills up with one, the bookie stays read-only "
            "until room is freed; set journal_file_size to less than half of the disk",
            bookie_id,
            size >> 20,
            file_size >> 20,
        )


async def _finished(task: asyncio.Task[None]) -> None:
    """Wait for a cancelled task; its own error, if it had died of one, is raised."""
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _now(close: Callable[[], None]) -> None:
    close()


def _disk_size(directory: Path) -> Callable[[], int]:
    return lambda: shutil.disk_usage(directory).total


def _used_fraction(directory: Path) -> float:
    usage = shutil.disk_usage(directory)
    return usage.used / usage.total if usage.total else 0.0
