"""One ledger's turn of repair, under its replication lock: plan, copy, commit, plan again.

The replication worker (replication_worker.py) takes each marked ledger's lock and runs a
`LedgerRepair` for it; what the turn did (a `Turn`) sets the ledger's place in the worker's
repair schedule. The rules of a repair are the worker's module docstring's.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

from tally.autorecovery import replication_metrics as metrics
from tally.autorecovery.config import AutoRecoveryConfig
from tally.client.context import ClientContext
from tally.client.metadata_copies import give_copies
from tally.client.reader import EntryFetcher, FetchedEntry
from tally.client.recovery import recover
from tally.core.answers import Copy
from tally.core.availability import EntryAvailability
from tally.core.digest import LedgerKeys
from tally.core.errors import (
    BadDigest,
    EntryUnreadable,
    MetadataVersionConflict,
    NoSuchLedger,
    TallyError,
)
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.core.protocol import MAX_ENTRIES_PER_READ
from tally.core.replication import (
    BatchReadFailure,
    EntrySources,
    RepairKind,
    Replacement,
    ReplicationPlan,
    SegmentRepair,
    apply_replacements,
    batch_read_failure,
    entry_ranges,
    grace_deadline,
    plan_replication,
    read_batches,
    replacements_of,
    targets_of,
)
from tally.failpoints import afailpoint
from tally.metadata.ledger_manager import LedgerRecord
from tally.metadata.underreplication import ReplicationLock

log = logging.getLogger(__name__)

PLAN_ROUNDS = 3
"""Plan-copy-commit rounds under one lock; the plan after the last copy must be empty."""
CAS_ATTEMPTS = 10

LOST_REASON_ENTRIES = 20
"""Entries described one by one in a lost-entries record's reason and its alert."""

READ_BATCH_BYTES = 1 << 20
"""About the bytes one read of a repair asks a source for (READ_ENTRIES): sixteen entries of
64 KiB, a few milliseconds of the source's event loop."""
BATCHES_IN_FLIGHT = 2
"""Batches of one ledger copied at once: one is read while the other is written."""
ONE_BY_ONE_IN_FLIGHT = 10
"""Entries of one ledger copied alone at once (BookKeeper's rereplicationEntryBatchSize)."""


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
class Turn:
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


class RepairHost(Protocol):
    """What a ledger's repair asks of the worker that runs it."""

    context: ClientContext
    config: AutoRecoveryConfig

    def keys_of(self, metadata: LedgerMetadata) -> LedgerKeys | None: ...

    def now(self) -> float: ...

    async def throttle(self, size: int) -> None: ...

    def count_copy(self, entries: int, size: int) -> None: ...

    reads_one_by_one: set[str]
    """Bookies whose entries are read one request each (not READ_ENTRIES) for now."""


class LedgerRepair:
    """One ledger's turn under its lock."""

    def __init__(self, worker: RepairHost, lock: ReplicationLock) -> None:
        self.worker = worker
        self.context = worker.context
        self.config = worker.config
        self.lock = lock
        self.ledger_id = lock.ledger_id
        self.name = lock.ledger_id.qualified_name
        self.copied = 0
        self.copied_to: set[str] = set()
        """Bookies this turn copied entries onto: given the ledger's metadata copy at its end."""
        self.written_over: dict[str, set[int]] = defaultdict(set)
        """Bad copies (the mark's) this turn has written a verified copy over, per bookie."""
        self._one_by_one = asyncio.Semaphore(ONE_BY_ONE_IN_FLIGHT)
        """Bounds the entries of this ledger copied alone at once."""

    async def run(self) -> Turn:
        try:
            record = await self.context.ledgers.read_ledger_metadata(self.ledger_id)
        except NoSuchLedger:
            log.info("ledger %s: deleted; nothing to repair, removing its mark", self.name)
            return Turn(Outcome.REPLICATED)
        if record.metadata.state is LedgerState.DELETED:
            # Its data is kept for an undelete, not repaired: an undeleted ledger is back in
            # the auditor's checks, which mark it again if it lacks copies.
            log.info("ledger %s: DELETED; not repaired, removing its mark", self.name)
            return Turn(Outcome.REPLICATED)
        keys = self.worker.keys_of(record.metadata)
        if keys is None:
            log.error(
                "ledger %s: its HMAC digest needs the ledger's password to verify copies, "
                "and none of the worker's ledger_passwords is it; it stays marked",
                self.name,
            )
            return Turn(Outcome.FAILED, "HMAC ledger without its password")
        self.keys = keys
        self.fetcher = EntryFetcher(self.context, self.ledger_id, keys)
        for _ in range(PLAN_ROUNDS):
            plan = await self._plan(record)
            if plan.recover_first:
                deadline = grace_deadline(
                    self.lock.mark.first_marked_ms,
                    self.config.open_ledger_rereplication_grace_period,
                )
                if self.worker.now() < deadline:
                    if plan.segments:
                        record, _ = await self._repair(record, plan)
                    log.info(
                        "ledger %s: %s; lost bookie(s) %s in the last segment of the %s ledger: "
                        "its writer has %.1f s more (grace period) to change ensemble",
                        self.name,
                        plan.describe(),
                        sorted(plan.recover_first),
                        record.metadata.state.name,
                        deadline - self.worker.now(),
                    )
                    return Turn(Outcome.DEFERRED, retry_at=deadline, entries_copied=self.copied)
                record = await self._recover(record, plan)
                continue
            if plan.complete:
                if self.copied_to:
                    await give_copies(self.context, record, self.keys.master_key, self.copied_to)
                return Turn(Outcome.REPLICATED, entries_copied=self.copied)
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
                return Turn(Outcome.LOST, entries_copied=self.copied)
        return self._failed(f"still incomplete after {PLAN_ROUNDS} rounds")

    def _failed(self, why: str) -> Turn:
        return Turn(Outcome.FAILED, why, entries_copied=self.copied)

    async def _plan(self, record: LedgerRecord) -> ReplicationPlan:
        available = await self.context.registry.available_bookies()
        registered = available.writable | available.read_only
        # The LAC first: every entry up to it is on its bookies before their lists are
        # taken. Taken after the lists, a LAC that moved on meanwhile would judge entries
        # acknowledged in between as held by none (a chaos run listed such an entry lost).
        last_add_confirmed = await self._open_last_add_confirmed(record.metadata, registered)
        asked = sorted(record.metadata.bookies() & registered)
        answers = await asyncio.gather(
            *(self.context.availability(bookie, self.ledger_id) for bookie in asked)
        )
        availability = {
            bookie: found for bookie, found in zip(asked, answers, strict=True) if found is not None
        }
        bad_copies = {
            bookie: entries.difference(EntryAvailability.from_entries(self.written_over[bookie]))
            for bookie, entries in self.lock.mark.bad_copies.items()
        }
        return plan_replication(
            record.metadata,
            self.lock.mark.missing_bookies,
            registered,
            availability,
            bad_copies,
            last_add_confirmed,
        )

    async def _open_last_add_confirmed(
        self, metadata: LedgerMetadata, registered: frozenset[str]
    ) -> int | None:
        """For a ledger that is not closed, the highest LAC the registered bookies of its
        last segment answer (each is at most the writer's: entries up to it were
        acknowledged); None for a closed ledger, or when none answers."""
        if metadata.state is LedgerState.CLOSED:
            return None
        asked = sorted(set(metadata.segments[-1].ensemble) & registered)
        answers = await asyncio.gather(*(self._read_lac(bookie) for bookie in asked))
        return max((lac for lac in answers if lac is not None), default=None)

    async def _read_lac(self, bookie: str) -> int | None:
        try:
            connection = await self.context.bookies.get(bookie)
            async with asyncio.timeout(self.context.config.read_timeout):
                return await connection.read_lac(self.ledger_id)
        except (TallyError, TimeoutError) as error:
            log.info("ledger %s: no LAC from bookie %s: %s", self.name, bookie, error)
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
            self.copied_to.update(
                new_bookies.get(repair.position, repair.bookie_id) for repair in segment.repairs
            )
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
        """Every entry of the segment's repairs, read from its first source a batch at a time
        (`read_batches`: `rereplication_entry_batch_size` entries at most, about
        READ_BATCH_BYTES), BATCHES_IN_FLIGHT batches at once.

        A semaphore holds the window rather than `asyncio.wait` on the copies in flight,
        which adds and removes a callback on each of them for every batch."""
        tally = _CopyTally()
        window = asyncio.Semaphore(BATCHES_IN_FLIGHT)
        pending: set[asyncio.Task[None]] = set()
        broken: list[asyncio.Task[None]] = []

        def finished(task: asyncio.Task[None]) -> None:
            pending.discard(task)
            window.release()
            if not task.cancelled() and task.exception() is not None:
                broken.append(task)

        try:
            size = self.config.rereplication_entry_batch_size
            for batch in read_batches(segment.entries(), size):
                await window.acquire()
                if broken:
                    broken[0].result()  # a bug, not a bookie's answer: end the turn
                task = asyncio.create_task(self._copy_batch(metadata, batch, new_bookies, tally))
                pending.add(task)
                task.add_done_callback(finished)
            if pending:
                await asyncio.wait(pending)
            if broken:
                broken[0].result()
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

    async def _copy_batch(
        self,
        metadata: LedgerMetadata,
        batch: list[EntrySources],
        new_bookies: dict[int, str],
        tally: _CopyTally,
    ) -> None:
        """Read the batch from its first source in as few requests as its size allows, and
        copy what verifies; after a failed read, `batch_read_failure` says which entries
        are copied alone (`_copy_entry`, which tries their other sources and judges them)."""
        remaining = batch
        source = batch[0].sources[0] if batch[0].sources else ""
        while len(remaining) > 1 and source not in self.worker.reads_one_by_one:
            asked = [sources.entry_id for sources in remaining[:MAX_ENTRIES_PER_READ]]
            try:
                fetched = await self.fetcher.read_batch_from(
                    metadata, source, asked, READ_BATCH_BYTES
                )
            except (TallyError, TimeoutError) as error:
                failure = batch_read_failure(error)
                if failure is not BatchReadFailure.FIRST_ALONE:
                    if failure is BatchReadFailure.SOURCE_ALONE:
                        self.worker.reads_one_by_one.add(source)
                    log.info(
                        "ledger %s: entries %d.. not read from bookie %s in one request "
                        "(%s: %s); copying them one by one",
                        self.name,
                        asked[0],
                        source,
                        type(error).__name__,
                        error,
                    )
                    break
                fetched = []
            if not fetched:  # no usable copy of the first entry here
                await self._copy_entry(metadata, remaining[0], new_bookies, tally)
                remaining = remaining[1:]
                continue
            await self._store(remaining[: len(fetched)], fetched, new_bookies, tally)
            remaining = remaining[len(fetched) :]

        async def alone(sources: EntrySources) -> None:
            async with self._one_by_one:
                await self._copy_entry(metadata, sources, new_bookies, tally)

        if remaining:
            await asyncio.gather(*(alone(sources) for sources in remaining))

    async def _store(
        self,
        batch: list[EntrySources],
        fetched: list[FetchedEntry],
        new_bookies: dict[int, str],
        tally: _CopyTally,
    ) -> None:
        """Write verified copies of a batch's entries (which share their targets) to each
        target, one write of all of them per target."""
        raws = [entry.raw for entry in fetched]
        size = sum(map(len, raws))
        metrics.BYTES_READ.inc(size)
        await self.worker.throttle(size)
        entry_ids = [sources.entry_id for sources in batch]
        targets = targets_of(batch[0], new_bookies)
        written = await asyncio.gather(
            *(self._write_all(bookie, raws, entry_ids) for _, bookie in targets)
        )
        for (repair, bookie), done in zip(targets, written, strict=True):
            for entry_id, ok in zip(entry_ids, done, strict=True):
                if not ok:
                    tally.failed_entries += 1
                    tally.failed_positions.add(repair.position)
                elif bookie == repair.bookie_id:
                    self._wrote_over(bookie, entry_id)
        copied = sum(map(any, zip(*written, strict=True)))
        tally.copied += copied
        self.copied += copied

    def _wrote_over(self, bookie: str, entry_id: int) -> None:
        """A FILL's verified copy is on `bookie`: a bad copy there (the mark's) is repaired."""
        self.written_over[bookie].add(entry_id)
        if entry_id in self.lock.mark.bad_copies.get(bookie, ()):
            metrics.BAD_COPIES_REPAIRED.inc()

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
        bad_sources: list[str] = []
        for bookie in sources.sources:
            try:
                fetched = await self.fetcher.read_from(metadata, bookie, entry_id)
                break
            except (TallyError, TimeoutError) as error:
                answers[bookie] = type(error).__name__
                unknown |= Copy.of(error) is Copy.UNKNOWN
                if isinstance(error, EntryUnreadable | BadDigest):
                    bad_sources.append(bookie)
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
        await self.worker.throttle(len(raw))
        if len(targets) == 1:  # one lost bookie: most repairs, without a gather's futures
            written = [await self._write(targets[0][1], raw, entry_id)]
        else:
            written = await asyncio.gather(
                *(self._write(bookie, raw, entry_id) for _, bookie in targets)
            )
        for (repair, bookie), ok in zip(targets, written, strict=True):
            if not ok:
                tally.failed_entries += 1
                tally.failed_positions.add(repair.position)
            elif bookie == repair.bookie_id:
                self._wrote_over(bookie, entry_id)
        for bookie in bad_sources:  # found bad on the way: repaired with the same copy
            if await self._write(bookie, raw, entry_id):
                metrics.BAD_COPIES_REPAIRED.inc()
                self.written_over[bookie].add(entry_id)
                log.warning(
                    "ledger %s entry %d: the bad copy on bookie %s was written over with a "
                    "verified one",
                    self.name,
                    entry_id,
                    bookie,
                )
        if any(written):
            tally.copied += 1
            self.copied += 1

    async def _write(self, bookie: str, raw: bytes, entry_id: int) -> bool:
        return (await self._write_all(bookie, [raw], [entry_id]))[0]

    async def _write_all(self, bookie: str, raws: list[bytes], entry_ids: list[int]) -> list[bool]:
        """RECOVERY_ADD each of `raws` (entries `entry_ids`) to `bookie`, all sent at once;
        whether each is durable there. A failure is logged once for the lot."""
        answers: list[asyncio.Future[None]] = []
        try:
            await afailpoint("replication.copy")
            connection = await self.context.bookies.get(bookie)
            await connection.drain()  # a slow target: its requests' clocks start when sent
            for raw in raws:
                answers.append(connection.add_nowait(raw, self.fetcher.master_key, recovery=True))
        except (TallyError, OSError) as error:
            for answer in answers:
                answer.cancel()
            self._copy_failed(bookie, entry_ids, len(raws), error)
            return [False] * len(raws)
        results = await asyncio.gather(*answers, return_exceptions=True)
        failures = [result for result in results if result is not None]
        for failure in failures:
            if not isinstance(failure, TallyError | OSError):
                raise failure  # a bug, not the bookie's answer
        if failures:
            self._copy_failed(bookie, entry_ids, len(failures), failures[0])
        ok = [result is None for result in results]
        sizes = [len(raw) for raw, done in zip(raws, ok, strict=True) if done]
        metrics.ENTRIES_WRITTEN.inc(len(sizes))
        metrics.BYTES_WRITTEN.inc(sum(sizes))
        self.worker.count_copy(len(sizes), sum(sizes))
        return ok

    def _copy_failed(
        self, bookie: str, entry_ids: list[int], failed: int, error: BaseException
    ) -> None:
        which = (
            f"entry {entry_ids[0]}"
            if len(entry_ids) == 1
            else f"{failed} of {len(entry_ids)} entries from {entry_ids[0]}"
        )
        log.info("ledger %s %s: copy to bookie %s failed: %s", self.name, which, bookie, error)

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

        await afailpoint("replication.commit")
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
