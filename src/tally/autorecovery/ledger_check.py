"""The auditor's ledger check (BookKeeper's checkAllLedgers): read entries of every bounded
segment from each registered bookie of their write sets, and mark the ledgers some bookie
cannot give an entry of, naming that bookie. A bookie that answers with a bad copy (its
own check finds the entry corrupt, or it answers another entry) is read on, and every bad
copy found is put in the mark (`bad_copies`), so that the worker writes verified copies
over them (issue 17): the index says those entries are there, so nothing else would.

The first and last entry of a segment are read, or `auditor_ledger_verification_percentage`
of them. Bookies that are not registered are left to the lost-bookie handling, so that
their `lost_bookie_recovery_delay` holds. A DELETED ledger is not checked: it keeps its data
for an undelete, not for readers, as the replicas check and the audit leave it too. Before
marking, the ledger's metadata is read again: a deleted ledger is left alone, a changed one
is checked again first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from tally.autorecovery import auditor_metrics as metrics
from tally.autorecovery.bounded import for_each
from tally.autorecovery.config import AutoRecoveryConfig
from tally.client.context import ClientContext
from tally.core.entry_format import peek_header
from tally.core.errors import EntryUnreadable, NoSuchLedger, TallyError
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerState
from tally.core.schedule import entries_to_verify
from tally.metadata.ledger_manager import LedgerRecord
from tally.metadata.underreplication import AuditorCheck

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _ReadFailure:
    segment_first: int
    entry_id: int
    error: str
    bad_copy: bool
    """The bookie answered, with a copy that is corrupt or of another entry."""


async def ledger_check(
    context: ClientContext,
    config: AutoRecoveryConfig,
    registered: Collection[str],
    now_ms: Callable[[], int],
) -> int:
    """Check every ledger; the number of ledgers marked."""
    return await _LedgerCheck(context, config, registered, now_ms).run()


class _LedgerCheck:
    def __init__(
        self,
        context: ClientContext,
        config: AutoRecoveryConfig,
        registered: Collection[str],
        now_ms: Callable[[], int],
    ) -> None:
        self.context = context
        self.config = config
        self.registered = registered
        self.now_ms = now_ms
        self.requests = asyncio.Semaphore(config.auditor_max_concurrent_bookie_requests)
        self.marked = 0

    async def run(self) -> int:
        async for page in self.context.ledgers.ledger_pages():
            for unreadable in page.unreadable:
                log.error(
                    "ledger check: metadata at %s does not decode: %s",
                    unreadable.path,
                    unreadable.error,
                )
            await for_each(
                [r for r in page.ledgers if r.metadata.state is not LedgerState.DELETED],
                self.config.auditor_max_concurrent_bookie_requests,
                self._verify,
            )
        return self.marked

    async def _verify(self, record: LedgerRecord) -> None:
        """Check one ledger; confirm failures on its current metadata before marking."""
        failures, bad_copies = await self._read_segments(record)
        if not failures:
            return
        try:
            current = await self.context.ledgers.read_ledger_metadata(record.ledger_id)
        except NoSuchLedger:
            return  # deleted meanwhile: its bookies may well have dropped it
        if current.metadata.state is LedgerState.DELETED:
            return  # deleted meanwhile: its data is kept for an undelete, not judged
        if current.version != record.version:
            failures, bad_copies = await self._read_segments(current)
            if not failures:
                return
        name = record.ledger_id.qualified_name
        for bookie, failure in sorted(failures.items()):
            log.warning(
                "ledger check: ledger %s segment at entry %d: bookie %s cannot give entry "
                "%d: %s; marking the ledger under-replicated",
                name,
                failure.segment_first,
                bookie,
                failure.entry_id,
                failure.error,
            )
        for bookie, entries in sorted(bad_copies.items()):
            log.warning(
                "ledger check: ledger %s: bookie %s holds bad copies of %d entries %s",
                name,
                bookie,
                len(entries),
                sorted(entries)[:20],
            )
        await self.context.under_replication.mark_under_replicated(
            record.ledger_id, failures, bad_copies=bad_copies, now_ms=self.now_ms()
        )
        metrics.UNDER_REPLICATED_LEDGERS_MARKED.labels(AuditorCheck.CHECK_ALL_LEDGERS.value).inc()
        self.marked += 1

    async def _read_segments(
        self, record: LedgerRecord
    ) -> tuple[dict[str, _ReadFailure], dict[str, set[int]]]:
        """The first failure of each bookie that could not give an entry it should hold,
        and the entries each bookie answered with a bad copy."""
        metadata = record.metadata
        failures: dict[str, _ReadFailure] = {}
        bad_copies: dict[str, set[int]] = {}
        percentage = self.config.auditor_ledger_verification_percentage

        def reads() -> Iterable[tuple[int, int, str]]:
            for _, first, last in metadata.segments_with_bounds():
                if last is None:
                    continue  # an open ledger's last segment is still being written
                for entry_id in entries_to_verify(first, last, percentage):
                    for bookie in metadata.write_set_bookies(entry_id):
                        if bookie in self.registered:
                            yield first, entry_id, bookie

        async def read(item: tuple[int, int, str]) -> None:
            first, entry_id, bookie = item
            if bookie in failures and bookie not in bad_copies:
                return  # one failure is enough to name the bookie; bad copies are listed
            async with self.requests:
                failure = await self._read_entry(record.ledger_id, bookie, first, entry_id)
            if failure is None:
                return
            if failure.bad_copy:
                bad_copies.setdefault(bookie, set()).add(entry_id)
            if bookie not in failures:
                failures[bookie] = failure
                metrics.BOOKIE_REQUEST_FAILURES.labels(failure.error.split(":", 1)[0]).inc()

        plan = reads()
        limit = self.config.auditor_max_concurrent_bookie_requests
        await for_each(plan if percentage else list(plan), limit, read)
        return failures, bad_copies

    async def _read_entry(
        self, ledger_id: LedgerId, bookie: str, segment_first: int, entry_id: int
    ) -> _ReadFailure | None:
        """None when the bookie gives the entry; else why not (error name first)."""
        timeout = self.context.config.read_timeout
        try:
            async with asyncio.timeout(timeout):
                connection = await self.context.bookies.get(bookie)
                raw = await connection.read(ledger_id, entry_id)
            header = peek_header(raw)
        except TimeoutError:
            why = f"Timeout: no answer within {timeout:g}s"
            return _ReadFailure(segment_first, entry_id, why, bad_copy=False)
        except TallyError as error:
            why = f"{type(error).__name__}: {error}"
            return _ReadFailure(segment_first, entry_id, why, isinstance(error, EntryUnreadable))
        if header.ledger_id != ledger_id or header.entry_id != entry_id:
            why = (
                f"MisplacedEntry: answered ledger {header.ledger_id.qualified_name} entry "
                f"{header.entry_id}"
            )
            return _ReadFailure(segment_first, entry_id, why, bad_copy=True)
        return None
