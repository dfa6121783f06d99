"""The online replicas check (BP-34): every closed ledger's copies against its schedule.

For each closed ledger with entries, every bookie of its segments is asked once what it
holds of the ledger, and `tally.core` compares the answers with the round-robin schedule:
a ledger whose bookies answered exactly their schedule's encoding is healthy
(`holds_schedule_exactly`), any other is judged in full (`judge_ledger`). A run goes in
three steps, so that no finding is reported on stale information:

1. The walk: the ledgers' metadata page by page, PAGES_IN_FLIGHT pages at a time; each
   bookie is asked once per page for all its ledgers of the page
   (GET_LIST_OF_ENTRIES_OF_LEDGERS; per ledger, GET_LIST_OF_ENTRIES_OF_LEDGER, for a bookie
   too old to know it). A ledger already marked under-replicated is skipped (the worker has
   it), or noted as marked too long. A ledger whose bookies did not all answer (a failed
   list, an error record, an answer that does not decode) is set aside for the retry.
2. Before reporting, each finding is confirmed: a ledger marked meanwhile is left to the
   worker, and a ledger whose metadata changed (its version differs) is checked again on
   the new metadata rather than reported, a bounded number of times.
3. The retry, after `auditor_replicas_check_retry_delay`: the set-aside ledgers are asked
   again. A bookie that still does not answer while registered (writable or read-only) is
   reported as an unresponsive registered bookie and its ledgers as potentially faulty;
   one that is no longer registered is lost, and its ledgers are judged by the copies on
   the bookies that answered. Findings are confirmed as in step 2.

Reported durability findings are marked under-replicated, naming the answering bookies
that lack copies, so that a replication worker repairs them. The counts per category are
published as gauges once, at the end of a full run.

Extra copies (entries on an answering bookie that no write set puts there) are
over-replication, the very rows the Spark job writes (`ledger_audit.over_replicated`),
confirmed like findings but counted apart: in the report's `over_replicated`, logged at info
level and published as their own gauges, never in the counts per category, never marked.
Only the ledger's own bookies are asked, so copies left on a bookie that no segment of the
ledger names any more are the Spark job's to see.

Load on the cluster is bounded. Ledger metadata and mark reads in flight never exceed
`auditor_max_concurrent_metadata_reads` (N): the walk reads pages of N // 2 keys, at most
two pages at a time (it reads one ahead), and the confirmations come after the walk, never
alongside a page read, with at most N reads or marks in flight (with N = 1 the read-ahead
makes it 2; a bookie's address, read when the pool first dials it, is not counted).
Requests to bookies in flight (a list of a page's ledgers is one), over all bookies,
never exceed `auditor_max_concurrent_bookie_requests`. A bookie that fails to answer is not
asked again in the same step, so a dead or stalled bookie costs one timeout per step, not
one per ledger.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tally.autorecovery import replicas_check_metrics as metrics
from tally.autorecovery.config import AutoRecoveryConfig
from tally.client.context import ClientContext
from tally.core.availability import EntryAvailability
from tally.core.errors import BookieUnavailable, MalformedData, NoSuchLedger, TallyError
from tally.core.ids import LedgerId
from tally.core.ledger_audit import Category, OverReplication, Violation, marked_too_long
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.protocol import MAX_LEDGERS_PER_LIST
from tally.core.replicas_decisions import (
    REPLICAS_CATEGORIES,
    ReplicasJudgement,
    bookies_to_ask,
    checkable,
    describe,
    holds_schedule_exactly,
    judge_ledger,
)
from tally.metadata.ledger_manager import LedgerRecord
from tally.metadata.underreplication import UnderReplicatedLedger

log = logging.getLogger(__name__)

METADATA_CHANGE_ATTEMPTS = 3
"""Checks of one ledger whose metadata keeps changing before its findings are dropped for
this run (the next run sees the settled metadata)."""

PAGES_IN_FLIGHT = 4
"""Pages of the walk whose bookies are being asked at once: while one page's lists are
answered, the next pages are read and judged."""

_T = TypeVar("_T")
_NOTHING = EntryAvailability.empty().to_bytes()
"""A bookie's answer for a ledger it does not know: it holds none of its entries."""


@dataclass(frozen=True)
class ReplicasFinding:
    """One reported ledger (`ledger_id`), or one unresponsive registered bookie (`bookie_id`)."""

    categories: tuple[Category, ...]
    """Worst first."""
    ledger_id: LedgerId | None
    bookie_id: str | None
    detail: str
    """The log line's explanation: quorums, fewest copies, what each bookie lacks."""
    marked: frozenset[str] = frozenset()
    """The bookies the ledger was marked under-replicated for (empty: not marked)."""


@dataclass(frozen=True)
class ReplicasCheckReport:
    started_ms: int
    duration_s: float
    ledgers_checked: int
    """Ledgers whose bookies were asked (marked ledgers are skipped, not checked)."""
    counts: Mapping[str, int]
    """Ledgers per category, and bookies for unresponsive_registered_bookie; every
    category of `REPLICAS_CATEGORIES` is present, 0 included."""
    findings: tuple[ReplicasFinding, ...]
    over_replicated: tuple[tuple[LedgerId, Violation], ...] = ()
    """The extra copies found, as the audit's over_replicated rows, by ledger: not findings."""

    @property
    def over_replication(self) -> OverReplication:
        return OverReplication.of(self.over_replicated)


@dataclass(frozen=True)
class _Suspect:
    """A ledger with findings, not yet confirmed."""

    ledger_id: LedgerId
    version: int
    judgement: ReplicasJudgement


@dataclass(frozen=True)
class _Answers:
    """What the bookies of one ledger answered, and which of them did not."""

    answers: dict[str, EntryAvailability]
    unanswered: frozenset[str]


async def replicas_check(
    context: ClientContext,
    config: AutoRecoveryConfig,
    *,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> ReplicasCheckReport:
    """Run one full replicas check and publish its gauges. `clock` gives the time (seconds
    since the epoch) that marks are compared with and made at; `sleep` waits the retry
    delay."""
    return await _ReplicasCheck(context, config, clock, sleep).run()


class _ReplicasCheck:
    """One run's state: what was found, what waits for the retry, which bookies failed."""

    def __init__(
        self,
        context: ClientContext,
        config: AutoRecoveryConfig,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[object]],
    ) -> None:
        self._context = context
        self._config = config
        self._clock = clock
        self._sleep = sleep
        self._page_size = max(1, config.auditor_max_concurrent_metadata_reads // 2)
        self._metadata_slots = asyncio.Semaphore(config.auditor_max_concurrent_metadata_reads)
        self._bookie_slots = asyncio.Semaphore(config.auditor_max_concurrent_bookie_requests)
        self._grace_period_ms = round(config.underreplicated_ledger_recovery_grace_period * 1000)
        self._failed: dict[str, str] = {}
        """Bookies that did not answer in the current step, with the first error."""
        self._registered: frozenset[str] | None = None
        """Registered bookies, read in the retry step; None before it."""
        self._listing: set[str] = set()
        """Bookies that answered a list of entries of ledgers in this run."""
        self._one_by_one: set[str] = set()
        """Bookies that do not know the list of entries of ledgers: asked per ledger."""
        self._unresponsive: dict[str, list[LedgerId]] = {}
        """Registered bookies that did not answer in the retry step, with their ledgers."""
        self._checked = 0
        self._findings: list[ReplicasFinding] = []
        self._over_replicated: list[tuple[LedgerId, Violation]] = []
        self._counts = dict.fromkeys((category.value for category in REPLICAS_CATEGORIES), 0)

    async def run(self) -> ReplicasCheckReport:
        started_ms = self._now_ms()
        started = time.monotonic()
        overdue: list[UnderReplicatedLedger] = []
        suspects: list[_Suspect] = []
        retry: list[LedgerId] = []
        marks = {
            mark.ledger_id: mark
            async for mark in self._context.under_replication.list_under_replicated(
                page_size=self._page_size
            )
        }
        looking: deque[asyncio.Future[None]] = deque()
        try:
            async for page in self._context.ledgers.ledger_pages(self._page_size):
                for unreadable in page.unreadable:
                    log.warning(
                        "replicas check: skipping %s: %s", unreadable.path, unreadable.error
                    )
                fresh = []
                for record in page.ledgers:
                    if not checkable(record.metadata):
                        continue
                    mark = marks.get(record.ledger_id)
                    if mark is None:
                        fresh.append(record)
                    elif marked_too_long(
                        mark.first_marked_ms, self._now_ms(), self._grace_period_ms
                    ):
                        overdue.append(mark)
                looking.append(asyncio.ensure_future(self._first_look(fresh, suspects, retry)))
                if len(looking) >= PAGES_IN_FLIGHT:
                    await looking.popleft()
            while looking:
                await looking.popleft()
        finally:
            for task in looking:
                task.cancel()
            await asyncio.gather(*looking, return_exceptions=True)
        await _all(self._report_overdue(mark) for mark in overdue)
        confirmed = await _all(self._confirm(suspect) for suspect in suspects)
        retry += [ledger_id for ledger_id in confirmed if ledger_id is not None]
        if retry:
            await self._retry(retry)
        duration_s = time.monotonic() - started
        over_replication = OverReplication.of(self._over_replicated)
        metrics.record_run(self._counts, over_replication, duration_s)
        found = {name: count for name, count in self._counts.items() if count}
        log.info(
            "replicas check: %d ledgers checked in %.1f s; findings: %s; over-replication "
            "(not a violation): %s",
            self._checked,
            duration_s,
            found or "none",
            over_replication.to_dict() if over_replication.rows else "none",
        )
        return ReplicasCheckReport(
            started_ms=started_ms,
            duration_s=duration_s,
            ledgers_checked=self._checked,
            counts=dict(self._counts),
            findings=tuple(sorted(self._findings, key=_finding_order)),
            over_replicated=tuple(
                sorted(self._over_replicated, key=lambda pair: pair[0].qualified_name)
            ),
        )

    # -- step 1: the walk ----------------------------------------------------------------

    async def _first_look(
        self, records: list[LedgerRecord], suspects: list[_Suspect], retry: list[LedgerId]
    ) -> None:
        """Judge a page's unmarked ledgers, each bookie asked once for all its ledgers."""
        asked = {record.ledger_id: sorted(bookies_to_ask(record.metadata)) for record in records}
        wanted: dict[str, list[LedgerId]] = {}
        for ledger_id, bookies in asked.items():
            for bookie in bookies:
                wanted.setdefault(bookie, []).append(ledger_id)
        held = dict(
            zip(
                wanted,
                await _all(self._held_on(bookie, ids) for bookie, ids in wanted.items()),
                strict=True,
            )
        )
        for record in records:
            ledger_id = record.ledger_id
            self._checked += 1
            metrics.REPLICAS_CHECK_LEDGERS.inc()
            encoded = {
                bookie: held[bookie][ledger_id]
                for bookie in asked[ledger_id]
                if ledger_id in held[bookie]
            }
            if len(encoded) < len(asked[ledger_id]):
                retry.append(ledger_id)
                continue
            if holds_schedule_exactly(record.metadata, encoded):
                continue
            answers = self._decoded(ledger_id, encoded)
            if answers is None:
                retry.append(ledger_id)
                continue
            judgement = judge_ledger(record.metadata, answers)
            if judgement.noteworthy:
                suspects.append(_Suspect(ledger_id, record.version, judgement))

    async def _report_overdue(self, mark: UnderReplicatedLedger) -> None:
        """Report a ledger marked too long, if it still is (repaired meanwhile: not)."""
        current = await self._mark_of(mark.ledger_id)
        now_ms = self._now_ms()
        if current is None or not marked_too_long(
            current.first_marked_ms, now_ms, self._grace_period_ms
        ):
            return
        missing = sorted(current.missing_bookies) or "every copy to be checked"
        self._report(
            ReplicasFinding(
                (Category.UNDERREPLICATED_TOO_LONG,),
                current.ledger_id,
                None,
                f"marked under-replicated at {current.first_marked_ms} ms, "
                f"{(now_ms - current.first_marked_ms) / 1000:.0f} s ago (missing bookies: "
                f"{missing}), longer than the grace period of "
                f"{self._grace_period_ms / 1000:g} s",
            )
        )

    # -- step 2: confirming before reporting ---------------------------------------------

    async def _confirm(self, suspect: _Suspect) -> LedgerId | None:
        """Report the suspect's findings if its metadata is unchanged, else check it again.

        Returns the ledger id when a check again met a bookie that did not answer and the
        retry is still to come (the ledger then waits for it).
        """
        ledger_id = suspect.ledger_id
        for _ in range(METADATA_CHANGE_ATTEMPTS):
            if await self._mark_of(ledger_id) is not None:
                return None  # marked meanwhile: the worker has it
            record = await self._read_ledger(ledger_id)
            if record is None:
                return None
            if record.version == suspect.version:
                await self._report_ledger(record, suspect.judgement)
                return None
            if not checkable(record.metadata):
                return None
            asked = await self._ask(ledger_id, record.metadata)
            if asked.unanswered and self._registered is None:
                return ledger_id
            judgement = self._judge(record.metadata, asked)
            if not judgement.noteworthy:
                return None
            suspect = _Suspect(ledger_id, record.version, judgement)
        log.warning(
            "replicas check: ledger %s: its metadata changed at each of %d checks; not judged "
            "in this run",
            ledger_id.qualified_name,
            METADATA_CHANGE_ATTEMPTS,
        )
        return None

    async def _report_ledger(self, record: LedgerRecord, judgement: ReplicasJudgement) -> None:
        ledger_id = record.ledger_id
        name = ledger_id.qualified_name
        for row in judgement.over_replicated:
            self._over_replicated.append((ledger_id, row))
            log.info("replicas check: ledger %s over-replicated: %s", name, row.detail)
        if not judgement.categories:
            return
        detail = describe(record.metadata, judgement)
        if judgement.mark_bookies:
            bookies = judgement.mark_bookies
            await self._metadata(
                lambda: self._context.under_replication.mark_under_replicated(
                    ledger_id, bookies, now_ms=self._now_ms()
                )
            )
            detail += f"; marked under-replicated for {sorted(bookies)}"
        self._report(
            ReplicasFinding(judgement.categories, ledger_id, None, detail, judgement.mark_bookies)
        )
        for bookie in judgement.unresponsive_bookies:
            self._unresponsive.setdefault(bookie, []).append(ledger_id)

    # -- step 3: the retry ---------------------------------------------------------------

    async def _retry(self, ledger_ids: list[LedgerId]) -> None:
        delay = self._config.auditor_replicas_check_retry_delay
        log.info(
            "replicas check: %d ledgers had bookies that did not answer (%s); asking again in %g s",
            len(ledger_ids),
            ", ".join(f"{bookie}: {error}" for bookie, error in sorted(self._failed.items())),
            delay,
        )
        await self._sleep(delay)
        self._failed = {}
        looks = await _all(self._look_again(ledger_id) for ledger_id in ledger_ids)
        available = await self._context.registry.available_bookies()
        self._registered = available.writable | available.read_only
        suspects = []
        for look in looks:
            if look is None:
                continue
            record, asked = look
            judgement = self._judge(record.metadata, asked)
            if judgement.noteworthy:
                suspects.append(_Suspect(record.ledger_id, record.version, judgement))
        await _all(self._confirm(suspect) for suspect in suspects)
        for bookie, ledgers in sorted(self._unresponsive.items()):
            state = "read-only" if bookie in available.read_only else "writable"
            shown = ", ".join(ledger_id.qualified_name for ledger_id in sorted(ledgers)[:5])
            self._report(
                ReplicasFinding(
                    (Category.UNRESPONSIVE_REGISTERED_BOOKIE,),
                    None,
                    bookie,
                    f"bookie {bookie} is registered ({state}) but did not answer for "
                    f"{len(ledgers)} ledgers ({shown}{', ...' if len(ledgers) > 5 else ''}), "
                    f"also {delay:g} s later: {self._failed.get(bookie, 'no answer')}",
                )
            )

    async def _look_again(self, ledger_id: LedgerId) -> tuple[LedgerRecord, _Answers] | None:
        record = await self._read_ledger(ledger_id)
        if record is None or not checkable(record.metadata):
            return None
        return record, await self._ask(ledger_id, record.metadata)

    # -- bookies, metadata, findings -----------------------------------------------------

    def _judge(self, metadata: LedgerMetadata, asked: _Answers) -> ReplicasJudgement:
        """Judge on the answers; before the retry's registry read every bookie answered."""
        lost = asked.unanswered - (self._registered or frozenset())
        return judge_ledger(metadata, asked.answers, lost)

    async def _ask(self, ledger_id: LedgerId, metadata: LedgerMetadata) -> _Answers:
        bookies = sorted(bookies_to_ask(metadata))
        held = await _all(self._entries_on(bookie, ledger_id) for bookie in bookies)
        answers = {b: e for b, e in zip(bookies, held, strict=True) if e is not None}
        return _Answers(answers, frozenset(bookies) - answers.keys())

    async def _held_on(self, bookie: str, ledger_ids: list[LedgerId]) -> dict[LedgerId, bytes]:
        """The availability encoding of each ledger `bookie` answered for, asked in lists of
        MAX_LEDGERS_PER_LIST; a ledger it did not answer for is absent. A bookie whose first
        list fails with its connection closed is taken for one too old to know the
        operation, and asked one ledger at a time for the rest of the run."""
        held: dict[LedgerId, bytes] = {}
        if bookie in self._failed:
            return held
        if bookie in self._one_by_one:
            return await self._held_one_by_one(bookie, ledger_ids)
        async with self._bookie_slots:
            remaining = ledger_ids
            try:
                connection = await self._context.bookies.get(bookie)
                while remaining and bookie not in self._failed:
                    records = await connection.get_lists_of_entries(
                        remaining[:MAX_LEDGERS_PER_LIST]
                    )
                    self._listing.add(bookie)
                    for record in records:
                        error = record.error()
                        if error is None:
                            held[record.ledger_id] = record.availability
                        elif isinstance(error, NoSuchLedger):
                            held[record.ledger_id] = _NOTHING
                        else:
                            self._fail(bookie, record.ledger_id, error)
                    remaining = remaining[len(records) :]
                return held
            except BookieUnavailable as error:
                if bookie in self._listing or bookie in self._failed:
                    self._fail(bookie, remaining[0], error)
                    return held
                log.info(
                    "replicas check: bookie %s closed the connection on a list of entries of "
                    "ledgers (%s); asking it one ledger at a time in this run",
                    bookie,
                    error,
                )
                self._one_by_one.add(bookie)
            except TallyError as error:
                self._fail(bookie, remaining[0], error)
                return held
        return await self._held_one_by_one(bookie, ledger_ids)

    async def _held_one_by_one(
        self, bookie: str, ledger_ids: list[LedgerId]
    ) -> dict[LedgerId, bytes]:
        held = await _all(self._entries_on(bookie, ledger_id) for ledger_id in ledger_ids)
        return {
            ledger_id: entries.to_bytes()
            for ledger_id, entries in zip(ledger_ids, held, strict=True)
            if entries is not None
        }

    def _decoded(
        self, ledger_id: LedgerId, encoded: Mapping[str, bytes]
    ) -> dict[str, EntryAvailability] | None:
        """The answers decoded; None when a bookie's does not decode (that bookie failed)."""
        answers = {}
        for bookie, availability in encoded.items():
            try:
                answers[bookie] = EntryAvailability.from_bytes(availability)
            except MalformedData as error:
                self._fail(bookie, ledger_id, error)
                return None
        return answers

    async def _entries_on(self, bookie: str, ledger_id: LedgerId) -> EntryAvailability | None:
        """What `bookie` holds of the ledger; None when it did not answer."""
        if bookie in self._failed:
            return None
        async with self._bookie_slots:
            if bookie in self._failed:
                return None
            try:
                connection = await self._context.bookies.get(bookie)
                return await connection.get_list_of_entries(ledger_id)
            except NoSuchLedger:
                return EntryAvailability.empty()
            except TallyError as error:
                self._fail(bookie, ledger_id, error)
                return None

    def _fail(self, bookie: str, ledger_id: LedgerId, error: TallyError) -> None:
        """Note that `bookie` did not answer: it is not asked again in this step."""
        if bookie in self._failed:
            return
        self._failed[bookie] = f"{type(error).__name__}: {error}"
        log.info(
            "replicas check: bookie %s did not answer for ledger %s (%s); not asked again in "
            "this step",
            bookie,
            ledger_id.qualified_name,
            self._failed[bookie],
        )

    async def _read_ledger(self, ledger_id: LedgerId) -> LedgerRecord | None:
        """The ledger's metadata now; None when deleted or unreadable (logged)."""
        try:
            return await self._metadata(
                lambda: self._context.ledgers.read_ledger_metadata(ledger_id)
            )
        except NoSuchLedger:
            return None
        except MalformedData as error:
            log.warning("replicas check: skipping ledger %s: %s", ledger_id.qualified_name, error)
            return None

    async def _mark_of(self, ledger_id: LedgerId) -> UnderReplicatedLedger | None:
        """The ledger's mark now; None when unmarked, or when the mark is unreadable (logged:
        marking the ledger again replaces it)."""
        try:
            return await self._metadata(
                lambda: self._context.under_replication.under_replicated(ledger_id)
            )
        except MalformedData as error:
            log.warning("replicas check: ledger %s: %s", ledger_id.qualified_name, error)
            return None

    async def _metadata(self, operation: Callable[[], Awaitable[_T]]) -> _T:
        async with self._metadata_slots:
            return await operation()

    def _report(self, finding: ReplicasFinding) -> None:
        self._findings.append(finding)
        for category in finding.categories:
            self._counts[category.value] += 1
        subject = (
            f"ledger {finding.ledger_id.qualified_name}"
            if finding.ledger_id is not None
            else f"bookie {finding.bookie_id}"
        )
        log.warning(
            "replicas check: %s %s: %s",
            subject,
            "+".join(category.value for category in finding.categories),
            finding.detail,
        )

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _finding_order(finding: ReplicasFinding) -> tuple[bool, str, str]:
    ledger = finding.ledger_id.qualified_name if finding.ledger_id is not None else ""
    return finding.ledger_id is None, ledger, finding.bookie_id or ""


async def _all(coroutines: Iterable[Coroutine[Any, Any, _T]]) -> list[_T]:
    """Run concurrently; on a failure, cancel the rest and raise it (not a group)."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
