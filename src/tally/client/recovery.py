"""Closing another writer's ledger safely: fence, find the end, re-write, close.

1. CAS the metadata OPEN -> IN_RECOVERY, so the old writer can no longer change ensembles.
2. Fencing reads (the last entry, DO_FENCING, with the password's key) to the last
   segment's ensemble until fencing has quorum coverage (`FencingTracker`): the old writer
   can then confirm nothing more. The highest LAC they report is where reading starts.
3. Recovery reads from there, each carrying DO_FENCING: an entry is recoverable on one
   verified copy, unrecoverable on WQ - AQ + 1 explicit negatives of its write set
   (`decide_recovery_read`); timeouts and errors are unknown. When neither can be decided
   the recovery aborts and the ledger stays IN_RECOVERY for a later attempt: it is never
   closed early, which would truncate it.
4. Every recovered entry past the reported LAC is re-written with RECOVERY_ADD to its
   write set (an ack quorum each), then the ledger is CASed CLOSED at the last one.
"""

from __future__ import annotations

import asyncio
import logging

from tally.client.context import ClientContext
from tally.client.metadata_copies import give_copies
from tally.client.reader import EntryFetcher, FetchedEntry
from tally.core.answers import Answer
from tally.core.digest import LedgerKeys
from tally.core.errors import (
    LedgerRecoveryFailed,
    MetadataVersionConflict,
    TallyError,
)
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.core.quorum import (
    FencingTracker,
    RecoveryRead,
    RecoveryReadDecision,
)
from tally.metadata.ledger_manager import LedgerRecord

log = logging.getLogger(__name__)


async def recover(context: ClientContext, record: LedgerRecord, keys: LedgerKeys) -> LedgerRecord:
    """Recover and close the ledger of `record`; returns its CLOSED record.

    `keys` must be the ledger's (the caller checked the password, or took the master key
    from the metadata). LedgerRecoveryFailed when the end cannot be decided yet (bookies
    down or silent)."""
    ledger_id = record.ledger_id
    if record.metadata.state is LedgerState.CLOSED:
        return record
    record = await _start_recovery(context, record)
    if record.metadata.state is LedgerState.CLOSED:
        return record
    fetcher = EntryFetcher(context, ledger_id, keys)
    metadata = record.metadata
    confirmed = await _fence(fetcher, metadata)
    start = max(confirmed, metadata.segments[-1].first_entry_id - 1)
    recovered = await _read_to_the_end(fetcher, metadata, start, confirmed)
    last, length = start, 0
    if recovered:
        last, length = recovered[-1].entry.entry_id, recovered[-1].entry.length
    elif start >= 0:
        raise LedgerRecoveryFailed(f"ledger {ledger_id}: entry {start} could not be read")
    record = await _rewrite(fetcher, record, [r for r in recovered if r.entry.entry_id > confirmed])
    closed = await _close(context, record, last, length)
    await give_copies(context, closed, keys.master_key)
    log.info(
        "ledger %s recovered: closed at entry %d (%d bytes), %d entries past LAC %d re-written",
        ledger_id,
        closed.metadata.last_entry_id,
        closed.metadata.length,
        sum(1 for r in recovered if r.entry.entry_id > confirmed),
        confirmed,
    )
    return closed


async def _start_recovery(context: ClientContext, record: LedgerRecord) -> LedgerRecord:
    """IN_RECOVERY, unless another recovery closed the ledger first."""

    def start(metadata: LedgerMetadata) -> LedgerMetadata:
        return metadata if metadata.state is LedgerState.CLOSED else metadata.start_recovery()

    return await context.ledgers.update(record.ledger_id, start, current=record)


async def _fence(fetcher: EntryFetcher, metadata: LedgerMetadata) -> int:
    """Fence the last segment's ensemble to quorum coverage; the highest LAC reported."""
    ensemble = metadata.segments[-1].ensemble
    tracker = FencingTracker(metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum)

    async def fence(position: int) -> tuple[int, Answer, int | None]:
        try:
            fetched = await fetcher.read_from(metadata, ensemble[position], -1, fencing=True)
        except (TallyError, TimeoutError) as error:
            return position, Answer.of(error), None
        return position, Answer.POSITIVE, fetched.entry.last_add_confirmed

    tasks = [asyncio.create_task(fence(p)) for p in range(len(ensemble))]
    try:
        for next_done in asyncio.as_completed(tasks):
            position, response, lac = await next_done
            tracker.record(position, response, lac)
            if tracker.is_complete:
                break
            if not tracker.can_still_complete:
                break
    finally:
        for task in tasks:
            task.cancel()
    if not tracker.is_complete:
        raise LedgerRecoveryFailed(
            f"ledger {fetcher.ledger_id}: fencing reached only {sorted(tracker.fenced)} of "
            f"{list(ensemble)}, short of quorum coverage; the ledger stays IN_RECOVERY"
        )
    return tracker.max_lac


async def _read_to_the_end(
    fetcher: EntryFetcher, metadata: LedgerMetadata, start: int, confirmed: int
) -> list[FetchedEntry]:
    """Recovery-read from `start` until the first unrecoverable entry, a window at a time."""
    window = fetcher.context.config.max_outstanding_reads
    first = max(start, 0)
    found: list[FetchedEntry] = []
    pending: dict[int, asyncio.Task[tuple[RecoveryReadDecision, FetchedEntry | None]]] = {}
    next_to_start = first
    try:
        entry_id = first
        while True:
            while next_to_start < entry_id + window:
                pending[next_to_start] = asyncio.create_task(
                    _recovery_read(fetcher, metadata, next_to_start)
                )
                next_to_start += 1
            decision, fetched = await pending.pop(entry_id)
            if decision is RecoveryReadDecision.RECOVERABLE:
                assert fetched is not None
                found.append(fetched)
                entry_id += 1
                continue
            if decision is RecoveryReadDecision.UNRECOVERABLE and entry_id > confirmed:
                return found
            raise LedgerRecoveryFailed(
                f"ledger {fetcher.ledger_id}: entry {entry_id} is "
                + (
                    f"missing although the LAC {confirmed} covers it: durability violation, "
                    "refusing to close below an acknowledged entry"
                    if decision is RecoveryReadDecision.UNRECOVERABLE
                    else "undecidable (too many bookies silent or failing); "
                    "the ledger stays IN_RECOVERY, retry later"
                )
            )
    finally:
        for task in pending.values():
            task.cancel()


async def _recovery_read(
    fetcher: EntryFetcher, metadata: LedgerMetadata, entry_id: int
) -> tuple[RecoveryReadDecision, FetchedEntry | None]:
    """Ask the entry's write set (fencing) until `RecoveryRead` reaches a verdict."""
    ensemble = metadata.ensemble_at(entry_id)
    fencing = entry_id >= metadata.segments[-1].first_entry_id
    verdict = RecoveryRead(
        entry_id, metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum
    )

    async def ask(position: int) -> tuple[int, FetchedEntry | None, BaseException | None]:
        try:
            return (
                position,
                await fetcher.read_from(metadata, ensemble[position], entry_id, fencing=fencing),
                None,
            )
        except (TallyError, TimeoutError) as error:
            return position, None, error

    tasks = [asyncio.create_task(ask(p)) for p in verdict.write_set]
    try:
        for next_done in asyncio.as_completed(tasks):
            position, fetched, error = await next_done
            decision = verdict.record(position, Answer.of(error))
            if decision is RecoveryReadDecision.RECOVERABLE:
                return decision, fetched
            if decision is not RecoveryReadDecision.WAIT:
                return decision, None
    finally:
        for task in tasks:
            task.cancel()
    return verdict.decision, None


async def _rewrite(
    fetcher: EntryFetcher, record: LedgerRecord, entries: list[FetchedEntry]
) -> LedgerRecord:
    """RECOVERY_ADD each entry to its write set; every entry needs an ack quorum.

    Bookies that leave an entry short of its ack quorum are replaced by an ensemble change
    from the first such entry, as the writer would have done, and the entries from there
    are written again to the new ensemble; the record as it ends up.
    """
    context = fetcher.context
    pending = entries
    for _ in range(context.config.ensemble_change_retries):
        short = await _rewrite_once(fetcher, record.metadata, pending)
        if not short:
            return record
        first = min(short)
        record = await _replace_in_recovery(context, record, first, set().union(*short.values()))
        pending = [fetched for fetched in entries if fetched.entry.entry_id >= first]
    raise LedgerRecoveryFailed(
        f"ledger {fetcher.ledger_id}: re-writes still short of the ack quorum after "
        f"{context.config.ensemble_change_retries} ensemble changes; it stays IN_RECOVERY"
    )


async def _rewrite_once(
    fetcher: EntryFetcher, metadata: LedgerMetadata, entries: list[FetchedEntry]
) -> dict[int, set[str]]:
    """Write each entry to its write set once; the entries short of an ack quorum, with
    the bookies that failed them."""
    context = fetcher.context
    short: dict[int, set[str]] = {}

    async def add(bookie: str, raw: bytes) -> bool:
        try:
            connection = await context.bookies.get(bookie)
            await connection.add(raw, fetcher.master_key, recovery=True)
        except TallyError as error:
            log.warning(
                "ledger %s: recovery add to %s failed: %s", fetcher.ledger_id, bookie, error
            )
            return False
        return True

    async def rewrite(fetched: FetchedEntry) -> None:
        entry_id = fetched.entry.entry_id
        bookies = list(metadata.write_set_bookies(entry_id))
        acks = await asyncio.gather(*(add(bookie, fetched.raw) for bookie in bookies))
        if sum(acks) < metadata.ack_quorum:
            short[entry_id] = {bookie for bookie, ok in zip(bookies, acks, strict=True) if not ok}

    await asyncio.gather(*(rewrite(f) for f in entries))
    return short


async def _replace_in_recovery(
    context: ClientContext, record: LedgerRecord, first: int, failed: set[str]
) -> LedgerRecord:
    """The record with `failed` replaced in a new segment from entry `first` on."""
    metadata = record.metadata
    if first < metadata.segments[-1].first_entry_id:
        raise LedgerRecoveryFailed(
            f"ledger {record.ledger_id}: entry {first} falls short of its ack quorum in an "
            f"earlier segment, whose ensemble cannot change; the ledger stays IN_RECOVERY"
        )
    last = metadata.segments[-1].ensemble
    positions = [position for position, bookie in enumerate(last) if bookie in failed]
    for position in positions:
        context.bookie_failed(last[position])
    ensemble = await context.replace_positions(last, positions, metadata.write_quorum)
    changed = metadata.with_ensemble_change(first, ensemble, recovering=True)
    try:
        updated = await context.ledgers.write_ledger_metadata(
            record.ledger_id, changed, record.version
        )
    except MetadataVersionConflict:
        raise LedgerRecoveryFailed(
            f"ledger {record.ledger_id}: its metadata changed during recovery (another "
            "recovery?); try again"
        ) from None
    log.info(
        "ledger %s: recovery replaced %s from entry %d: ensemble %s",
        record.ledger_id,
        sorted(failed),
        first,
        ensemble,
    )
    return updated


async def _close(
    context: ClientContext, record: LedgerRecord, last: int, length: int
) -> LedgerRecord:
    def close(metadata: LedgerMetadata) -> LedgerMetadata:
        if metadata.state is LedgerState.CLOSED:
            return metadata  # another recovery closed it first: its end stands
        return metadata.close(last, length)

    return await context.ledgers.update(record.ledger_id, close, current=record)
