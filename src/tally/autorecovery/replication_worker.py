"""The replication worker: repairs under-replicated ledgers, one at a time, under their lock.

For each marked ledger that is not backing off and not on the lost-entries list at its
current mark version, the worker takes the ledger's lock, reads its metadata, asks every
registered bookie of it for its availability and lets `tally.core.replication` plan the
repair. It then picks new bookies for lost ones with the placement policy, copies the
entries with RECOVERY_ADD (rate-limited, a batch in flight), CASes the new ensembles into
the metadata and plans again: only a plan with nothing left to do removes the mark, with
the version check that keeps a re-mark made meanwhile. The lock is given back on every path.

Copies are the entries' bytes as stored, so their digest travels with them; each copy is
verified (digest, ledger and entry id) before it is written, and the write carries its
CRC32C for the target bookie's end-to-end check. A corrupt copy is never written: the next
bookie of the write set is asked.

The ledger's keys. Bookies accept adds and fencing reads only with the ledger's master
key, which the metadata keeps (`digest.LedgerKeys`), so no password is needed to copy or
fence. Verifying a copy before writing it needs no key either for the CRC digests; an HMAC
digest needs the MAC key, which derives from the password alone, so HMAC ledgers are
repaired only with their password among `ledger_passwords` (BookKeeper's
bookieRecoveryPasswd); without it such a ledger stays marked, with an error log, rather
than being copied unverified.

An OPEN ledger whose last segment has a lost bookie is the writer's to fix by an ensemble
change: the worker waits `open_ledger_rereplication_grace_period` after the mark, then, if
the metadata still holds the lost bookie in the last segment, moves the ledger to
IN_RECOVERY by CAS on the version it just read (so a writer's change in between wins),
recovers it (fence, close) and repairs it as a closed ledger.

An entry that no bookie of its write set has a readable copy of (each declared lost, or
saying it has none, or holding a corrupt one) cannot be repaired: the ledger goes on the
lost-entries list with its mark's version, an ALERT is logged, and the worker does not try
it again until it is marked again. Other failures back off exponentially per ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tally.autorecovery import replication_metrics as metrics
from tally.autorecovery.config import AutoRecoveryConfig
from tally.client.context import ClientContext
from tally.client.reader import EntryFetcher, FetchedEntry
from tally.client.recovery import recover
from tally.core.answers import Copy
from tally.core.availability import EntryAvailability
from tally.core.digest import DigestType, LedgerKeys, mac_key, master_key
from tally.core.errors import (
    MetadataVersionConflict,
    NoSuchLedger,
    TallyError,
)
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.core.replication import (
    EntrySources,
    RepairKind,
    RepairSchedule,
    Replacement,
    ReplicationPlan,
    SegmentRepair,
    TokenBucket,
    apply_replacements,
    entry_ranges,
    grace_deadline,
    plan_replication,
    replacements_of,
    targets_of,
)
from tally.metadata.ledger_manager import LedgerRecord
from tally.metadata.underreplication import ReplicationLock

log = logging.getLogger(__name__)

PLAN_ROUNDS = 3
"""Plan-copy-commit rounds under one lock; the plan after the last copy must be empty."""
CAS_ATTEMPTS = 10
RATE_BURST_SECONDS = 0.1
"""The rate limit's burst, in seconds of its rate."""
LOST_REASON_ENTRIES = 20
"""Entries described one by one in a lost-entries record's reason and its alert."""


class _SegmentChanged(Exception):
    """A segment being repaired changed in the metadata before its new bookies were in."""


class Outcome(enum.Enum):
    REPLICATED = "replicated"
    """Every copy is back (or the ledger is gone): the mark is removed."""
    REMARKED = "remarked"
    """Repaired, but marked again meanwhile: the mark stays for another turn."""
    DEFERRED = "deferred"
    """An open ledger's writer still has its grace period to change ensemble."""
    LOST = "lost"
    """Entries with no readable copy anywhere: on the lost-entries list."""
    FAILED = "failed"
    """Not repaired yet (bookies unreachable, no password, metadata changed): backs off."""


@dataclass
class _Turn:
    """What one ledger's turn did: its outcome, and when to try again if it is deferred."""

    outcome: Outcome
    why: str = ""
    retry_at: float | None = None
    entries_copied: int = 0


@dataclass
class _CopyTally:
    """The copies of one segment, as they finish."""

    copied: int = 0
    failed_positions: set[int] = field(default_factory=set)
    failed_entries: int = 0
    lost: dict[int, str] = field(default_factory=dict)
    """Lost entry id -> what its write set answered."""
    segment_changed: bool = False
    """A repaired segment changed in the metadata before its new bookies were committed."""


class ReplicationWorker:
    """One worker on the session of `context`; run it with `run()`, many per cluster."""

    def __init__(
        self,
        context: ClientContext,
        config: AutoRecoveryConfig,
        worker_id: str,
        *,
        passwords: Iterable[bytes] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.context = context
        self.config = config
        self.worker_id = worker_id
        self._passwords = {master_key(password): password for password in passwords}
        self._clock = clock
        self._enabled = False
        self._wake = asyncio.Event()
        self._schedule = RepairSchedule(
            config.replication_backoff_initial, config.replication_backoff_max
        )
        self._current: LedgerId | None = None
        self._counts = dict.fromkeys(Outcome, 0)
        self._looks = 0
        """Looks at the marks (or at the switch, while replication is disabled) so far."""
        self._entries_copied = 0
        self._bytes_copied = 0
        self._bucket = (
            TokenBucket(
                config.replication_rate_by_bytes,
                config.replication_rate_by_bytes * RATE_BURST_SECONDS,
                time.monotonic(),
            )
            if config.replication_rate_by_bytes > 0
            else None
        )

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Repair marked ledgers until cancelled; return at once when the session is lost
        (its locks are gone with it: the process opens a new session and runs again)."""
        store = self.context.ledgers.store
        work = asyncio.ensure_future(self._work())
        lost = asyncio.ensure_future(store.session_lost.wait())
        try:
            await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, lost):
                task.cancel()
            await asyncio.gather(work, lost, return_exceptions=True)
        if store.session_lost.is_set():
            log.warning(
                "replication worker %s: metadata session lost; stopping (locks released with it)",
                self.worker_id,
            )
            return
        work.result()

    async def _work(self) -> None:
        watcher = await self.context.under_replication.watch_replication_enabled(self._switch)
        try:
            while True:
                self._looks += 1
                if not (self._enabled and await self._pass()):
                    await self._idle()
        finally:
            watcher.cancel()

    def _switch(self, enabled: bool) -> None:
        if enabled != self._enabled:
            log.info(
                "replication worker %s: replication %s",
                self.worker_id,
                "enabled" if enabled else "disabled; no ledger is taken until it is enabled",
            )
        self._enabled = enabled
        self._wake.set()

    async def _idle(self) -> None:
        """Sleep until the next poll, a backoff's end, or a switch of the replication flag."""
        delay = self.config.under_replicated_poll_interval
        if self._enabled:
            delay = self._schedule.next_look(self._clock(), delay)
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    async def _pass(self) -> bool:
        """One look at every mark, repairing those that are due, one at a time; True when a
        ledger was marked again while it was repaired, so another pass is due at once."""
        manager = self.context.under_replication
        try:
            marks = [mark async for mark in manager.list_under_replicated()]
            on_lost_list = {
                lost.ledger_id: lost.mark_version async for lost in manager.list_lost_entries()
            }
        except TallyError as error:
            log.warning("replication worker %s: cannot list marks: %s", self.worker_id, error)
            return False
        metrics.LOST_ENTRIES.set(len(on_lost_list))
        self._schedule.marks_seen([mark.ledger_id for mark in marks])
        again = False
        for mark in marks:
            if not self._enabled:
                break
            due = self._schedule.is_due(
                mark.ledger_id,
                self._clock(),
                mark_version=mark.version,
                lost_at=on_lost_list.get(mark.ledger_id),
            )
            if due:
                again |= await self._take(mark.ledger_id) is Outcome.REMARKED
        return again

    async def _take(self, ledger_id: LedgerId) -> Outcome | None:
        """Lock the ledger, repair it, give it back; the outcome (None: not taken, another
        worker has it or it was repaired meanwhile) sets its backoff."""
        manager = self.context.under_replication
        started = time.perf_counter()
        try:
            lock = await manager.acquire(ledger_id)
        except TallyError as error:
            log.warning("ledger %s: cannot take its replication lock: %s", ledger_id, error)
            self._note(ledger_id, _Turn(Outcome.FAILED, str(error)))
            return Outcome.FAILED
        if lock is None:
            return None
        self._current = ledger_id
        held = True
        try:
            turn = await _LedgerRepair(self, lock).run()
            if turn.outcome is Outcome.REPLICATED:
                held = False
                if not await manager.mark_replicated(lock):
                    turn = _Turn(
                        Outcome.REMARKED, entries_copied=turn.entries_copied
                    )  # the mark stays, with the newly missing bookies
                    log.info(
                        "ledger %s: repaired, but marked again meanwhile; the mark stays for "
                        "another turn",
                        ledger_id.qualified_name,
                    )
                else:
                    await manager.clear_lost_entries(ledger_id)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning(
                "ledger %s: replication failed: %s: %s",
                ledger_id.qualified_name,
                type(error).__name__,
                error,
                exc_info=not isinstance(error, TallyError),
            )
            turn = _Turn(Outcome.FAILED, f"{type(error).__name__}: {error}")
        finally:
            self._current = None
            if held:
                with contextlib.suppress(TallyError):
                    await manager.release(lock)
        if turn.entries_copied:
            metrics.LEDGERS_REPLICATED.inc()
        metrics.REREPLICATE_OP_SECONDS.labels(turn.outcome.value).observe(
            time.perf_counter() - started
        )
        self._note(ledger_id, turn)
        return turn.outcome

    def _note(self, ledger_id: LedgerId, turn: _Turn) -> None:
        self._counts[turn.outcome] += 1
        if turn.outcome is Outcome.FAILED:
            backoff = self._schedule.failed(ledger_id, self._clock())
            log.info(
                "ledger %s: not repaired (%s); try %d failed, next in %.1f s",
                ledger_id.qualified_name,
                turn.why,
                backoff.failures,
                backoff.retry_at - self._clock(),
            )
        elif turn.outcome is Outcome.DEFERRED:
            assert turn.retry_at is not None
            self._schedule.deferred(ledger_id, turn.retry_at)
        else:
            self._schedule.done(ledger_id)

    def _keys_of(self, metadata: LedgerMetadata) -> LedgerKeys | None:
        """The ledger's keys; None for an HMAC ledger whose password the worker lacks."""
        if metadata.digest_type is not DigestType.HMAC:
            return LedgerKeys(metadata.master_key, mac_key(b""))  # the MAC key goes unused
        password = self._passwords.get(metadata.master_key)
        return None if password is None else LedgerKeys.of_password(password)

    def _count_copy(self, size: int) -> None:
        self._entries_copied += 1
        self._bytes_copied += size

    async def _throttle(self, size: int) -> None:
        """Wait for the rate limit to allow `size` more bytes (one entry's copy)."""
        if self._bucket is not None:
            delay = self._bucket.reserve(size, time.monotonic())
            if delay > 0:
                await asyncio.sleep(delay)

    def status(self) -> dict[str, Any]:
        """A JSON-ready view for the HTTP endpoint and the CLI."""
        return {
            "worker_id": self.worker_id,
            "replication_enabled": self._enabled,
            "looks": self._looks,
            "current_ledger": None if self._current is None else self._current.qualified_name,
            **{outcome.value: count for outcome, count in self._counts.items()},
            "entries_copied": self._entries_copied,
            "bytes_copied": self._bytes_copied,
            "backoffs": [
                {
                    "ledger": ledger_id.qualified_name,
                    "failures": backoff.failures,
                    "retry_at_ms": int(backoff.retry_at * 1000),
                }
                for ledger_id, backoff in self._schedule.backoffs()
            ],
        }


class _LedgerRepair:
    """One ledger's turn under its lock."""

    def __init__(self, worker: ReplicationWorker, lock: ReplicationLock) -> None:
        self.worker = worker
        self.context = worker.context
        self.config = worker.config
        self.lock = lock
        self.ledger_id = lock.ledger_id
        self.name = lock.ledger_id.qualified_name
        self.copied = 0

    async def run(self) -> _Turn:
        try:
            record = await self.context.ledgers.read_ledger_metadata(self.ledger_id)
        except NoSuchLedger:
            log.info("ledger %s: deleted; nothing to repair, removing its mark", self.name)
            return _Turn(Outcome.REPLICATED)
        keys = self.worker._keys_of(record.metadata)
        if keys is None:
            log.error(
                "ledger %s: its HMAC digest needs the ledger's password to verify copies, "
                "and none of the worker's ledger_passwords is it; it stays marked",
                self.name,
            )
            return _Turn(Outcome.FAILED, "HMAC ledger without its password")
        self.keys = keys
        self.fetcher = EntryFetcher(self.context, self.ledger_id, keys)
        for _ in range(PLAN_ROUNDS):
            plan = await self._plan(record)
            if plan.recover_first:
                deadline = grace_deadline(
                    self.lock.mark.first_marked_ms,
                    self.config.open_ledger_rereplication_grace_period,
                )
                if self.worker._clock() < deadline:
                    if plan.segments:
                        record, _ = await self._repair(record, plan)
                    log.info(
                        "ledger %s: %s; lost bookie(s) %s in the last segment of the %s ledger: "
                        "its writer has %.1f s more (grace period) to change ensemble",
                        self.name,
                        plan.describe(),
                        sorted(plan.recover_first),
                        record.metadata.state.name,
                        deadline - self.worker._clock(),
                    )
                    return _Turn(Outcome.DEFERRED, retry_at=deadline, entries_copied=self.copied)
                record = await self._recover(record, plan)
                continue
            if plan.complete:
                return _Turn(Outcome.REPLICATED, entries_copied=self.copied)
            if not plan.segments:
                return self._failed(f"bookies {sorted(plan.unjudged)} cannot be judged")
            log.info("ledger %s: %s", self.name, plan.describe())
            record, tally = await self._repair(record, plan)
            if tally.segment_changed:
                return self._failed("a repaired segment changed meanwhile; copied in vain")
            if tally.failed_entries:
                # unknown answers first: an entry is only listed lost once every answer is in
                return self._failed(
                    f"{tally.failed_entries} entries could not be copied"
                    + (f", {len(tally.lost)} have no copy so far" if tally.lost else "")
                )
            if tally.lost:
                await self._record_lost(tally.lost)
                return _Turn(Outcome.LOST, entries_copied=self.copied)
        return self._failed(f"still incomplete after {PLAN_ROUNDS} rounds")

    def _failed(self, why: str) -> _Turn:
        return _Turn(Outcome.FAILED, why, entries_copied=self.copied)

    async def _plan(self, record: LedgerRecord) -> ReplicationPlan:
        available = await self.context.registry.available_bookies()
        registered = available.writable | available.read_only
        asked = sorted(record.metadata.bookies() & registered)
        answers = await asyncio.gather(*(self._availability(bookie) for bookie in asked))
        availability = {
            bookie: found for bookie, found in zip(asked, answers, strict=True) if found is not None
        }
        return plan_replication(
            record.metadata, self.lock.mark.missing_bookies, registered, availability
        )

    async def _availability(self, bookie: str) -> EntryAvailability | None:
        try:
            connection = await self.context.bookies.get(bookie)
            async with asyncio.timeout(self.context.config.read_timeout):
                return await connection.get_list_of_entries(self.ledger_id)
        except NoSuchLedger:
            return EntryAvailability.empty()
        except (TallyError, TimeoutError) as error:
            log.info("ledger %s: no availability from bookie %s: %s", self.name, bookie, error)
            return None

    async def _recover(self, record: LedgerRecord, plan: ReplicationPlan) -> LedgerRecord:
        """Fence and close the ledger, unless its writer changes its metadata first."""
        log.warning(
            "ledger %s: its writer kept lost bookie(s) %s in the last segment for %.0f s after "
            "the mark; fencing and closing the ledger to repair it",
            self.name,
            sorted(plan.recover_first),
            self.config.open_ledger_rereplication_grace_period,
        )
        if record.metadata.state is LedgerState.OPEN:
            try:
                record = await self.context.ledgers.write_ledger_metadata(
                    self.ledger_id, record.metadata.start_recovery(), record.version
                )
            except MetadataVersionConflict:
                log.info(
                    "ledger %s: its writer changed the metadata first; planning again", self.name
                )
                return await self.context.ledgers.read_ledger_metadata(self.ledger_id)
        closed = await recover(self.context, record, self.keys)
        metrics.OPEN_LEDGERS_FENCED.inc()
        return closed

    async def _repair(
        self, record: LedgerRecord, plan: ReplicationPlan
    ) -> tuple[LedgerRecord, _CopyTally]:
        """Copy every segment of the plan, committing each one's new bookies as it ends."""
        total = _CopyTally()
        for segment in plan.segments:
            new_bookies = await self._choose(segment)
            tally = await self._copy(record.metadata, segment, new_bookies)
            total.failed_entries += tally.failed_entries
            total.lost.update(tally.lost)
            replacements = replacements_of(segment, new_bookies, tally.failed_positions)
            if replacements:
                committed = await self._commit(record, replacements)
                if committed is None:
                    total.segment_changed = True
                    return await self.context.ledgers.read_ledger_metadata(self.ledger_id), total
                record = committed
        return record, total

    async def _choose(self, segment: SegmentRepair) -> dict[int, str]:
        """A new bookie for every lost position, by the placement policy."""
        positions = [r.position for r in segment.repairs if r.kind is RepairKind.REPLACE]
        if not positions:
            return {}
        ensemble = await self.context.replace_positions(
            segment.ensemble, positions, segment.write_quorum
        )
        return {position: ensemble[position] for position in positions}

    async def _copy(
        self, metadata: LedgerMetadata, segment: SegmentRepair, new_bookies: dict[int, str]
    ) -> _CopyTally:
        """Every entry of the segment's repairs, `rereplication_entry_batch_size` at a time."""
        tally = _CopyTally()
        window = self.config.rereplication_entry_batch_size
        pending: set[asyncio.Task[None]] = set()
        try:
            for sources in segment.entries():
                if len(pending) >= window:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()  # a bug, not a bookie's answer: end the turn
                pending.add(
                    asyncio.create_task(self._copy_entry(metadata, sources, new_bookies, tally))
                )
            if pending:
                done, pending = await asyncio.wait(pending)
                for task in done:
                    task.result()
        finally:
            for task in pending:
                task.cancel()
        for repair in segment.repairs:
            target = new_bookies.get(repair.position, repair.bookie_id)
            log.info(
                "ledger %s segment %d (%d..%d) position %d: %s %s -> %s, %d entries%s",
                self.name,
                segment.index,
                segment.first_entry_id,
                segment.last_entry_id,
                repair.position,
                repair.kind.value,
                repair.bookie_id,
                target,
                len(repair.entries),
                " (some copies failed)" if repair.position in tally.failed_positions else "",
            )
        return tally

    async def _copy_entry(
        self,
        metadata: LedgerMetadata,
        sources: EntrySources,
        new_bookies: dict[int, str],
        tally: _CopyTally,
    ) -> None:
        entry_id = sources.entry_id
        targets = targets_of(sources, new_bookies)
        answers = dict.fromkeys(sources.without_copy, "no copy")
        answers.update(dict.fromkeys(sources.unknown, "absent, not declared lost"))
        fetched: FetchedEntry | None = None
        unknown = bool(sources.unknown)
        for bookie in sources.sources:
            try:
                fetched = await self.fetcher.read_from(metadata, bookie, entry_id)
                break
            except (TallyError, TimeoutError) as error:
                answers[bookie] = type(error).__name__
                unknown |= Copy.of(error) is Copy.UNKNOWN
        if fetched is None:
            metrics.ENTRIES_UNABLE_TO_READ.inc()
            described = ", ".join(f"{bookie} {answer}" for bookie, answer in answers.items())
            if unknown:
                tally.failed_entries += 1
                tally.failed_positions.update(repair.position for repair, _ in targets)
                log.info(
                    "ledger %s entry %d: not read this time (%s)", self.name, entry_id, described
                )
            else:
                tally.lost[entry_id] = described
            return
        raw = fetched.raw
        metrics.BYTES_READ.inc(len(raw))
        await self.worker._throttle(len(raw))
        written = await asyncio.gather(
            *(self._write(bookie, raw, entry_id) for _, bookie in targets)
        )
        for (repair, _), ok in zip(targets, written, strict=True):
            if not ok:
                tally.failed_entries += 1
                tally.failed_positions.add(repair.position)
        if any(written):
            tally.copied += 1
            self.copied += 1

    async def _write(self, bookie: str, raw: bytes, entry_id: int) -> bool:
        try:
            connection = await self.context.bookies.get(bookie)
            await connection.add(raw, self.fetcher.master_key, recovery=True)
        except TallyError as error:
            log.info(
                "ledger %s entry %d: copy to bookie %s failed: %s",
                self.name,
                entry_id,
                bookie,
                error,
            )
            return False
        metrics.ENTRIES_WRITTEN.inc()
        metrics.BYTES_WRITTEN.inc(len(raw))
        self.worker._count_copy(len(raw))
        return True

    async def _commit(
        self, record: LedgerRecord, replacements: tuple[Replacement, ...]
    ) -> LedgerRecord | None:
        """CAS the replacements into the metadata; None if a replaced segment changed."""
        planned = record.metadata

        def replace(current: LedgerMetadata) -> LedgerMetadata:
            updated = apply_replacements(current, planned, replacements)
            if updated is None:
                raise _SegmentChanged
            return current if updated == current else updated

        try:
            committed = await self.context.ledgers.update(
                self.ledger_id, replace, current=record, attempts=CAS_ATTEMPTS
            )
        except _SegmentChanged:
            log.info("ledger %s: a repaired segment changed meanwhile; planning again", self.name)
            return None
        if committed.version == record.version:
            return committed  # nothing to write: already in
        for replacement in replacements:
            metrics.BOOKIES_REPLACED.inc()
            log.info(
                "ledger %s segment %d position %d: bookie %s replaced by %s in the metadata",
                self.name,
                replacement.segment_index,
                replacement.position,
                replacement.old,
                replacement.new,
            )
        return committed

    async def _record_lost(self, lost: dict[int, str]) -> None:
        ranges = entry_ranges(lost)
        shown = "; ".join(
            f"entry {entry_id}: {answers}"
            for entry_id, answers in sorted(lost.items())[:LOST_REASON_ENTRIES]
        )
        more = len(lost) - LOST_REASON_ENTRIES
        reason = f"no readable copy on any bookie of the write set: {shown}" + (
            f"; and {more} more" if more > 0 else ""
        )
        await self.context.under_replication.record_lost_entries(
            self.ledger_id, ranges, reason, mark_version=self.lock.mark.version
        )
        metrics.LOST_ENTRIES.set(
            len([lost async for lost in self.context.under_replication.list_lost_entries()])
        )
        log.error(
            "ALERT ledger %s: %d entries (%s) have no readable copy anywhere: %s. The ledger is "
            "on the lost-entries list and is not retried until it is marked again",
            self.name,
            len(lost),
            ", ".join(
                f"{first}..{last}" if first != last else str(first) for first, last in ranges
            ),
            reason,
        )
