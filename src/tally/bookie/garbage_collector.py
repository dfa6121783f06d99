"""The bookie's garbage collection: drop what the delete path and the repairs say may go.

A run (every `gc_wait_time` seconds, or when an operator asks) takes these steps, each
skipped, deleting nothing, when the metadata store cannot be read:

1. **Tombstones**: every tombstone is read; the data of each tombstoned ledger this bookie
   holds is dropped from its index (`core.garbage_collection.on_tombstone`), a checkpoint
   makes that durable past the journal (so that a replay cannot bring the ledger back),
   and then the bookie acknowledges the tombstone.
2. **Over-replication**, every `gc_overreplicated_ledger_wait_time` seconds: each ledger
   held here is looked up; a CLOSED ledger whose ensembles no longer name this bookie, or
   entries outside its write sets, are dropped (`overreplication_trim`), under the
   ledger's replication lock and on metadata read again under it, as BookKeeper does, so
   that no repair copies to this bookie meanwhile. Ledgers with neither metadata nor
   tombstone are orphans: counted, logged, kept (`tally shell gc orphans`).

3. **Space**: ledger storage deletes the entry logs (and releases the kept journal files)
   that hold no entry of a ledger still in its index, and compacts the sparse ones when a
   minor or major compaction is due (`LedgerStorage.collect_garbage`, compactor.py); an
   operator's run forces a major compaction.

Steps 1 and 2 drop ledgers from the index only; step 3 gives the disk space back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from tally.bookie.index import DeletedLedger
from tally.bookie.ledger_directories import BookieStorage
from tally.core.availability import EntryAvailability
from tally.core.errors import MalformedData, NoSuchLedger, TallyError
from tally.core.garbage_collection import (
    TombstoneAction,
    due,
    on_tombstone,
    overreplication_trim,
)
from tally.core.ids import LedgerId
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.store import MetadataStore
from tally.metadata.tombstones import acknowledge_tombstone, read_tombstone, tombstone_pages
from tally.metadata.underreplication import UnderReplicationManager

log = logging.getLogger(__name__)

KEPT_RUNS = 10
"""Runs `details` remembers."""
SHOWN_LEDGERS = 20


class GcMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.runs = Counter("bookie_gc_runs", "Garbage collection runs", registry=registry)
        self.ledgers_deleted = Counter(
            "bookie_gc_ledgers_deleted",
            "Ledgers dropped by garbage collection, by reason (tombstone, overreplicated)",
            ["reason"],
            registry=registry,
        )
        self.entries_trimmed = Counter(
            "bookie_gc_overreplicated_entries_deleted",
            "Entries dropped because no write set of this bookie's position holds them",
            registry=registry,
        )
        self.tombstones_acknowledged = Counter(
            "bookie_gc_tombstones_acknowledged",
            "Tombstones this bookie acknowledged after dropping the ledger's data",
            registry=registry,
        )
        self.orphan_ledgers = Gauge(
            "bookie_gc_orphan_ledgers",
            "Ledgers held here with neither metadata nor tombstone, at the last look: kept "
            "until an operator deletes them",
            registry=registry,
        )
        self.skipped_steps = Counter(
            "bookie_gc_skipped_steps",
            "GC steps skipped because the metadata store could not be read",
            registry=registry,
        )
        self.last_run_seconds = Gauge(
            "bookie_gc_last_run_seconds", "Duration of the last run", registry=registry
        )
        self.running = Gauge(
            "bookie_gc_running", "1 while a garbage collection run is under way", registry=registry
        )


@dataclass
class GcRun:
    """What one run did, for `gcstatus` and `GET /api/v1/bookie/gc_details`."""

    started_ms: int
    trigger: str
    seconds: float = 0.0
    tombstones_read: int = 0
    ledgers_deleted: list[str] = field(default_factory=list)
    tombstones_acknowledged: int = 0
    overreplication_checked: bool = False
    ledgers_trimmed: list[str] = field(default_factory=list)
    entries_trimmed: int = 0
    orphans: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Steps not taken, with why (a metadata store error, typically)."""
    storage: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "started_ms": self.started_ms,
            "trigger": self.trigger,
            "seconds": round(self.seconds, 3),
            "tombstones_read": self.tombstones_read,
            "ledgers_deleted": self.ledgers_deleted,
            "tombstones_acknowledged": self.tombstones_acknowledged,
            "overreplication_checked": self.overreplication_checked,
            "ledgers_trimmed": self.ledgers_trimmed,
            "entries_trimmed": self.entries_trimmed,
            "orphans": self.orphans,
            "skipped": self.skipped,
            "storage": self.storage,
        }


@dataclass(frozen=True)
class Orphan:
    ledger_id: LedgerId
    entries: int
    bytes: int


class GarbageCollector:
    """One bookie's collector; `run` until cancelled, `trigger` for a run now."""

    def __init__(
        self,
        storage: BookieStorage,
        store: MetadataStore,
        bookie_id: str,
        *,
        wait_time: float,
        overreplicated_wait_time: float,
        tombstone_retention: float,
        checkpoint: Callable[[], Awaitable[None]],
        metrics: GcMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._storage = storage
        self._store = store
        self._ledgers = LedgerManager(store)
        self._marks = UnderReplicationManager(store)
        self._bookie_id = bookie_id
        self._wait_time = wait_time
        self._overreplicated_wait_time = overreplicated_wait_time
        self._tombstone_retention = tombstone_retention
        self._checkpoint = checkpoint
        self._metrics = metrics
        self._clock = clock
        self._last_overreplication: float | None = None
        self._runs: list[GcRun] = []
        self._requests: list[tuple[asyncio.Future[GcRun], bool]] = []
        self._wake = asyncio.Event()
        self._running = asyncio.Lock()

    # -- control ---------------------------------------------------------------------

    async def run(self) -> None:
        """Collect every `wait_time` seconds, and whenever triggered."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._wait_time)
            self._wake.clear()
            requests, self._requests = self._requests, []
            forced = any(everything for _, everything in requests)
            try:
                done = await self.collect("operator" if requests else "timer", everything=forced)
            except Exception as error:
                log.exception("bookie %s: garbage collection failed", self._bookie_id)
                for future, _ in requests:
                    if not future.done():
                        future.set_exception(error)
                continue
            for future, _ in requests:
                if not future.done():
                    future.set_result(done)

    async def trigger(self, *, everything: bool = True) -> GcRun:
        """Ask for a run now and wait for it; `everything` includes the over-replication
        step even when it is not due (BookKeeper's forced GC)."""
        future: asyncio.Future[GcRun] = asyncio.get_running_loop().create_future()
        self._requests.append((future, everything))
        self._wake.set()
        return await future

    def details(self) -> list[dict[str, Any]]:
        """The last runs, newest first."""
        return [run.to_dict() for run in reversed(self._runs)]

    # -- one run ---------------------------------------------------------------------

    async def collect(self, trigger: str = "operator", *, everything: bool = False) -> GcRun:
        async with self._running:
            with self._metrics.running.track_inprogress():
                return await self._collect(trigger, everything=everything)

    async def _collect(self, trigger: str, *, everything: bool) -> GcRun:
        started = self._clock()
        run = GcRun(int(started * 1000), trigger)
        await self._step(run, "tombstones", self._tombstones(run))
        if everything or due(self._last_overreplication, self._overreplicated_wait_time, started):
            await self._step(run, "over-replication", self._overreplication(run))
            self._last_overreplication = started
        await self._step(run, "space", self._reclaim(run, started, force_major=everything))
        run.seconds = self._clock() - started
        self._runs = [*self._runs[-(KEPT_RUNS - 1) :], run]
        self._metrics.runs.inc()
        self._metrics.last_run_seconds.set(run.seconds)
        log.info(
            "bookie %s: GC run (%s) in %.2fs: %d tombstones read, %d ledgers deleted, "
            "%d acknowledged%s; %d bytes reclaimed%s",
            self._bookie_id,
            trigger,
            run.seconds,
            run.tombstones_read,
            len(run.ledgers_deleted),
            run.tombstones_acknowledged,
            (
                f"; over-replication: {len(run.ledgers_trimmed)} ledgers and "
                f"{run.entries_trimmed} entries dropped, {len(run.orphans)} orphans"
            )
            if run.overreplication_checked
            else "",
            run.storage.get("reclaimed_bytes", 0),
            f"; skipped: {'; '.join(run.skipped)}" if run.skipped else "",
        )
        return run

    async def _step(self, run: GcRun, name: str, work: Awaitable[None]) -> None:
        """Run a step; a metadata error skips the rest of it, having deleted nothing more."""
        try:
            await work
        except (TallyError, OSError) as error:  # WriteFailed, a metadata store error
            self._metrics.skipped_steps.inc()
            run.skipped.append(f"{name}: {type(error).__name__}: {error}")
            log.warning(
                "bookie %s: GC step %s skipped, nothing more deleted: %s",
                self._bookie_id,
                name,
                error,
            )

    async def _tombstones(self, run: GcRun) -> None:
        local = await asyncio.to_thread(self._storage.known_ledgers)
        to_acknowledge: list[LedgerId] = []
        dropped: list[LedgerId] = []
        async for page in tombstone_pages(self._store):
            for found in page.tombstones:
                run.tombstones_read += 1
                action = on_tombstone(found.tombstone, self._bookie_id, found.ledger_id in local)
                drop = action is TombstoneAction.DROP_THEN_ACKNOWLEDGE
                if drop and await self._drop(
                    found.ledger_id, DeletedLedger(found.tombstone.deletion.time_ms, self._clock())
                ):
                    dropped.append(found.ledger_id)
                    log.info(
                        "bookie %s: ledger %s deleted: its tombstone says so (%s, deleted at "
                        "%d ms)",
                        self._bookie_id,
                        found.ledger_id.qualified_name,
                        found.tombstone.deletion.reason,
                        found.tombstone.deletion.time_ms,
                    )
                if action is not TombstoneAction.NOTHING:
                    to_acknowledge.append(found.ledger_id)
        if dropped:
            # Durable past the journal first: a replay from an older mark would re-add them.
            await self._checkpoint()
            run.ledgers_deleted += [ledger_id.qualified_name for ledger_id in dropped]
            self._metrics.ledgers_deleted.labels("tombstone").inc(len(dropped))
        for ledger_id in to_acknowledge:
            now_ms = int(self._clock() * 1000)
            if await acknowledge_tombstone(self._store, ledger_id, self._bookie_id, now_ms):
                run.tombstones_acknowledged += 1
                self._metrics.tombstones_acknowledged.inc()
        forgotten = await asyncio.to_thread(
            self._storage.forget_deleted, self._clock() - self._tombstone_retention
        )
        if forgotten:
            log.info(
                "bookie %s: %d deleted ledgers forgotten: their tombstone retention is over",
                self._bookie_id,
                forgotten,
            )

    async def _drop(self, ledger_id: LedgerId, tombstone: DeletedLedger | None = None) -> bool:
        try:
            await asyncio.to_thread(self._storage.delete_ledger, ledger_id, tombstone)
        except NoSuchLedger:
            return False
        return True

    async def _overreplication(self, run: GcRun) -> None:
        run.overreplication_checked = True
        local = await asyncio.to_thread(self._storage.known_ledgers)
        in_limbo = self._storage.limbo_ledgers()
        orphans: list[LedgerId] = []
        trimmed_any = False
        for ledger_id in sorted(local - in_limbo):
            try:
                record = await self._ledgers.read_ledger_metadata(ledger_id)
            except NoSuchLedger:
                if await read_tombstone(self._store, ledger_id) is None:
                    orphans.append(ledger_id)
                continue
            except MalformedData as error:
                log.warning(
                    "bookie %s: GC keeps ledger %s: its metadata does not decode: %s",
                    self._bookie_id,
                    ledger_id.qualified_name,
                    error,
                )
                continue
            held = await asyncio.to_thread(self._held, ledger_id)
            if held is None or overreplication_trim(record.metadata, self._bookie_id, held) is None:
                continue
            trimmed_any |= await self._trim_under_lock(run, ledger_id)
        if trimmed_any:
            await self._checkpoint()
        self._report_orphans(run, orphans)

    async def _reclaim(self, run: GcRun, now: float, *, force_major: bool) -> None:
        report = await asyncio.to_thread(
            self._storage.collect_garbage, now, force_major=force_major
        )
        if report.released_journal_files:
            await self._checkpoint()  # the journal deletes released files at its release
        run.storage = {
            "compaction": report.compaction.value,
            "finished": report.finished,
            "suspended": report.suspended,
            "deleted_entry_logs": list(report.deleted_entry_logs),
            "released_journal_files": list(report.released_journal_files),
            "compacted_entry_logs": list(report.compacted_entry_logs),
            "compacted_journal_files": list(report.compacted_journal_files),
            "reclaimed_bytes": report.reclaimed_bytes,
            "moved_bytes": report.moved_bytes,
            "compaction_bytes_per_second": round(report.compaction_bytes_per_second),
            "failures": list(report.failures),
        }

    def _held(self, ledger_id: LedgerId) -> EntryAvailability | None:
        try:
            return self._storage.availability(ledger_id)
        except NoSuchLedger:
            return None

    async def _trim_under_lock(self, run: GcRun, ledger_id: LedgerId) -> bool:
        """Drop the ledger's extra copies, decided again on what is read under its lock."""
        async with self._marks.held_unmarked(ledger_id) as held_lock:
            if not held_lock:
                return False
            record = await self._ledgers.read_ledger_metadata(ledger_id)
            held = await asyncio.to_thread(self._held, ledger_id)
            trim = (
                None
                if held is None
                else overreplication_trim(record.metadata, self._bookie_id, held)
            )
            if trim is None:
                return False
            name = ledger_id.qualified_name
            if trim.whole_ledger:
                if not await self._drop(ledger_id):
                    return False
                run.ledgers_trimmed.append(name)
                self._metrics.ledgers_deleted.labels("overreplicated").inc()
                log.info(
                    "bookie %s: ledger %s deleted: no segment of the closed ledger names this "
                    "bookie any more (its copies were moved)",
                    self._bookie_id,
                    name,
                )
                return True
            count = await asyncio.to_thread(
                self._storage.forget_entries, ledger_id, list(trim.entries)
            )
            run.entries_trimmed += count
            self._metrics.entries_trimmed.inc(count)
            log.info(
                "bookie %s: ledger %s: %d entries outside this bookie's write sets deleted",
                self._bookie_id,
                name,
                count,
            )
            return count > 0

    def _report_orphans(self, run: GcRun, orphans: list[LedgerId]) -> None:
        run.orphans = [ledger_id.qualified_name for ledger_id in orphans]
        self._metrics.orphan_ledgers.set(len(orphans))
        if orphans:
            names = run.orphans[:SHOWN_LEDGERS]
            more = len(orphans) - len(names)
            log.warning(
                "bookie %s holds %d ledger(s) with neither metadata nor tombstone: %s%s. Kept: "
                "absence of metadata is never a reason to delete; `tally shell gc orphans "
                "--bookie %s` lists them, and with --delete deletes them",
                self._bookie_id,
                len(orphans),
                ", ".join(names),
                f" and {more} more" if more else "",
                self._bookie_id,
            )

    # -- orphans, for the operator -----------------------------------------------------

    async def orphans(self) -> list[Orphan]:
        """The ledgers held here with neither metadata nor tombstone, read now."""
        local = await asyncio.to_thread(self._storage.known_ledgers)
        found = []
        for ledger_id in sorted(local):
            if await self._is_orphan(ledger_id):
                info = await asyncio.to_thread(self._storage.ledger_info, ledger_id)
                found.append(Orphan(ledger_id, info.entry_count, info.byte_count))
        return found

    async def delete_orphans(self, ledger_ids: list[LedgerId]) -> list[LedgerId]:
        """Delete these ledgers' data if each is still an orphan now (an operator's order)."""
        deleted = []
        async with self._running:
            for ledger_id in ledger_ids:
                if not await self._is_orphan(ledger_id):
                    continue
                if await self._drop(ledger_id):
                    deleted.append(ledger_id)
                    self._metrics.ledgers_deleted.labels("orphan").inc()
                    log.warning(
                        "bookie %s: orphan ledger %s deleted on an operator's order",
                        self._bookie_id,
                        ledger_id.qualified_name,
                    )
            if deleted:
                await self._checkpoint()
        return deleted

    async def _is_orphan(self, ledger_id: LedgerId) -> bool:
        """Neither metadata (of any state) nor a tombstone; errors propagate, never True."""
        try:
            await self._ledgers.read_ledger_metadata(ledger_id)
        except NoSuchLedger:
            return await read_tombstone(self._store, ledger_id) is None
        except MalformedData:
            return False
        return False
