"""The auditor: one elected in the cluster, it finds the ledgers that lost copies and marks
them under-replicated for the replication workers.

While elected it does three things side by side, so that a check of a big cluster (hours)
never delays the reaction to a lost bookie:

- lost bookies: it watches the registered bookies and feeds `tally.core.lost_bookies`;
  when a lost bookie is due (after `lost_bookie_recovery_delay`, or at once when several
  are lost), it scans all ledger metadata and marks every ledger with a segment on it;
- incarnations: it watches the cookies and the registrations and compares each cookie's
  incarnation with the one it remembers in the store (`tally.core.incarnations`); a bookie
  formatted anew under its old id lost every copy it held, registered or not, so the
  ledgers with a segment on it are marked, then the new incarnation is remembered;
- periodic checks, one at a time: the bookie check, the ledger check, the placement check
  and the replicas check, each when its interval has passed since its last run as kept in
  the store (so a successor keeps the cadence), or at once on an operator's audit request.

A check's run is recorded (its start time, in the store) only once it has completed: a
check cut short by a lost session or an error is run again by whoever audits next.
Losing the store session stops everything at once: another candidate may already audit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from tally.autorecovery import auditor_metrics as metrics
from tally.autorecovery.bounded import for_each
from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.ledger_check import ledger_check
from tally.autorecovery.placement_check import placement_check
from tally.client.context import ClientContext
from tally.core.errors import KeyExists, MetadataVersionConflict, SessionExpired, TallyError
from tally.core.ids import LedgerId
from tally.core.incarnations import IncarnationChange, review_incarnations
from tally.core.lost_bookies import (
    LostBookie,
    LostBookies,
    LostBookiesChange,
    LostBookieState,
    bookies_holding_entries,
)
from tally.metadata.auditor_election import AuditorElection
from tally.metadata.bookie_registry import AvailableBookies
from tally.metadata.cookies import CookieManager
from tally.metadata.deletion import sweep_deletions
from tally.metadata.incarnations import RememberedIncarnations
from tally.metadata.key_ops import Watcher
from tally.metadata.paths import check_bookie_id
from tally.metadata.underreplication import AuditorCheck

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_DELAY = 60.0
"""Seconds before a failed check (or failed marking of a lost bookie's ledgers) is tried
again; a check's interval caps it."""
START_RETRY_DELAY = 5.0
"""Seconds before an elected auditor tries again to set up its watches after a store error."""


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


@dataclass
class _CheckState:
    """One periodic check as this auditor sees it."""

    check: AuditorCheck
    interval: float
    last_run_ms: int | None = None
    retry_at: float | None = None
    running: bool = False
    duration_s: float | None = None
    findings: int | None = None
    error: str | None = None

    @property
    def enabled(self) -> bool:
        return self.interval > 0

    def due_at(self, requested_ms: int | None) -> float:
        """When the check should run next: its interval after its last run, or now (0) if
        it never ran or an audit was requested since; never before a failure's retry."""
        due = 0.0 if self.last_run_ms is None else self.last_run_ms / 1000 + self.interval
        if requested_ms is not None and (
            self.last_run_ms is None or requested_ms > self.last_run_ms
        ):
            due = 0.0
        return due if self.retry_at is None else max(due, self.retry_at)


class Auditor:
    """A candidate for auditor; audits the cluster while elected. See the module doc."""

    def __init__(
        self,
        context: ClientContext,
        config: AutoRecoveryConfig,
        candidate_id: str,
        *,
        replicas_check: Callable[[], Awaitable[object]] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`clock` (Unix seconds) and `sleep` pace the scheduler, so a test can run days of
        intervals at once; durations are measured on the event loop's clock."""
        self.context = context
        self.config = config
        self.candidate_id = check_bookie_id(candidate_id)
        self._replicas_check = replicas_check
        self._clock = clock
        self._sleep = sleep
        self._elected = False
        self._lost = LostBookies(config.lost_bookie_recovery_delay)
        self._ledgers_marked: dict[str, int] = {}
        """Ledgers marked for each lost bookie, for `status`."""
        self._requested_ms: int | None = None
        self._bookies_changed = asyncio.Event()
        self._checks_changed = asyncio.Event()
        self._incarnations_changed = asyncio.Event()
        self._reviewing_incarnations = asyncio.Lock()
        intervals = {
            AuditorCheck.BOOKIES: config.auditor_periodic_bookie_check_interval,
            AuditorCheck.CHECK_ALL_LEDGERS: config.auditor_periodic_check_interval,
            AuditorCheck.PLACEMENT_POLICY: config.auditor_periodic_placement_policy_check_interval,
            AuditorCheck.REPLICAS: config.auditor_replicas_check_interval,
            AuditorCheck.DELETIONS: config.auditor_deletion_check_interval,
        }
        self._checks = {check: _CheckState(check, seconds) for check, seconds in intervals.items()}

    # -- election ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Stand for election and audit while elected; return (vote withdrawn) when
        cancelled, and at once when the store session is lost."""
        store = self.context.ledgers.store
        election = AuditorElection(store, self.candidate_id)
        try:
            try:
                await election.start()
            except SessionExpired as error:
                log.error("auditor candidate %s cannot stand: %s", self.candidate_id, error)
                return
            while not self._session_lost(election):
                await self._first(election.elected.wait(), *self._lost_events(election))
                if self._session_lost(election):
                    break
                try:
                    await self._audit(election)
                except TallyError as error:
                    if self._session_lost(election):
                        break
                    log.error(
                        "auditor %s could not start auditing: %s; again in %gs",
                        self.candidate_id,
                        error,
                        START_RETRY_DELAY,
                    )
                    await self._first(self._sleep(START_RETRY_DELAY), *self._lost_events(election))
            log.error(
                "auditor candidate %s lost its metadata session %#x: auditing stopped at once "
                "(another candidate takes over)",
                self.candidate_id,
                store.session_id,
            )
        finally:
            self._set_elected(False)
            with contextlib.suppress(TallyError):
                await election.stop()

    def _session_lost(self, election: AuditorElection) -> bool:
        return election.lost.is_set() or self.context.ledgers.store.session_lost.is_set()

    def _lost_events(self, election: AuditorElection) -> tuple[Awaitable[Any], ...]:
        return election.lost.wait(), self.context.ledgers.store.session_lost.wait()

    @staticmethod
    async def _first(*awaitables: Awaitable[Any]) -> None:
        """Wait until the first of `awaitables` is done; cancel the others."""
        tasks = [asyncio.ensure_future(a) for a in awaitables]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _set_elected(self, elected: bool) -> None:
        self._elected = elected
        metrics.ELECTED.set(int(elected))

    async def _audit(self, election: AuditorElection) -> None:
        """Audit until the session is lost (the caller's cue to return)."""
        self._set_elected(True)
        log.info("auditor %s elected (vote %s)", self.candidate_id, election.vote)
        self._lost = LostBookies(self._lost.delay)
        self._ledgers_marked.clear()
        watchers: list[Watcher[Any]] = []
        tasks: list[asyncio.Task[None]] = []
        try:
            under_replication = self.context.under_replication
            watchers.append(await self.context.registry.watch_bookies(self._registered_changed))
            cookies = CookieManager(self.context.ledgers.store)
            watchers.append(
                await cookies.watch_incarnations(lambda _: self._incarnations_changed.set())
            )
            watchers.append(
                await under_replication.watch_lost_bookie_recovery_delay(self._delay_changed)
            )
            watchers.append(await under_replication.watch_audit_requests(self._audit_requested))
            tasks = [
                asyncio.create_task(self._lost_bookie_loop(), name="auditor-lost-bookies"),
                asyncio.create_task(self._incarnation_loop(), name="auditor-incarnations"),
                asyncio.create_task(self._check_loop(), name="auditor-checks"),
            ]
            await self._first(*self._lost_events(election), *tasks)
            for task in tasks:
                if task.done() and not task.cancelled():
                    task.result()  # a loop ends only on a bug: let it show
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for watcher in watchers:
                watcher.cancel()
            self._set_elected(False)

    # -- what the watches deliver --------------------------------------------------------------

    def _registered_changed(self, available: AvailableBookies) -> None:
        registered = available.writable | available.read_only
        self._report(self._lost.registered_changed(registered, self._clock()))
        # A bookie registers after its format: look at its cookie again, should a cookie
        # have been rewritten in place (which no watch of the cookies' names sees).
        self._incarnations_changed.set()

    def _delay_changed(self, seconds: int | None) -> None:
        delay = self.config.lost_bookie_recovery_delay if seconds is None else seconds
        if delay == self._lost.delay:
            return
        log.info(
            "lost_bookie_recovery_delay is now %gs (%s)",
            delay,
            "configured default" if seconds is None else "set in the metadata store",
        )
        self._report(self._lost.delay_changed(delay, self._clock()))

    def _audit_requested(self, requested_ms: int | None) -> None:
        if requested_ms is None:
            return
        self._requested_ms = requested_ms
        log.info(
            "audit requested at %s: every check that has not run since runs now",
            _when(requested_ms / 1000),
        )
        self._checks_changed.set()

    def _report(self, change: LostBookiesChange) -> None:
        """Log what changed among the lost bookies and wake the loop that marks them."""
        delay = self._lost.delay
        for bookie in change.lost:
            log.warning(
                "bookie %s is lost (neither writable nor read-only) since %s; its ledgers "
                "will be marked under-replicated %s",
                bookie.bookie_id,
                _when(bookie.since),
                self._at(bookie),
            )
        for bookie in change.escalated:
            log.warning(
                "bookie %s (lost since %s): marking its ledgers at once, as %d bookies are "
                "lost together",
                bookie.bookie_id,
                _when(bookie.since),
                sum(b.state is LostBookieState.PENDING for b in self._lost.lost.values()),
            )
        for bookie in change.rescheduled:
            log.info(
                "bookie %s (lost since %s): with lost_bookie_recovery_delay %gs its ledgers "
                "will be marked %s",
                bookie.bookie_id,
                _when(bookie.since),
                delay,
                self._at(bookie),
            )
        for bookie in change.returned:
            self._ledgers_marked.pop(bookie.bookie_id, None)
            log.info(
                "bookie %s is back after %.1fs lost: %s",
                bookie.bookie_id,
                self._clock() - bookie.since,
                "nothing marked"
                if bookie.state is LostBookieState.PENDING
                else "its ledgers were already marked (the workers find their copies there)",
            )
        for bookie in change.forgotten:
            self._ledgers_marked.pop(bookie.bookie_id, None)
            log.info("lost bookie %s is forgotten: no ledger names it any more", bookie.bookie_id)
        metrics.LOST_BOOKIES.set(len(self._lost.lost))
        self._bookies_changed.set()

    def _at(self, bookie: LostBookie) -> str:
        if bookie.escalated_at is not None and bookie.deadline == bookie.escalated_at:
            return "at once (several bookies are lost)"
        if bookie.deadline <= bookie.since:
            return "at once (lost_bookie_recovery_delay 0)"
        return f"at {_when(bookie.deadline)} (lost_bookie_recovery_delay {self._lost.delay:g}s)"

    async def _wait(self, event: asyncio.Event, until: float | None) -> None:
        """Until `event` is set or the clock reaches `until` (None: no time limit)."""
        if event.is_set():
            return
        if until is None:
            await event.wait()
            return
        delay = until - self._clock()
        if delay > 0:
            await self._first(event.wait(), self._sleep(delay))

    # -- lost bookies --------------------------------------------------------------------------

    async def _lost_bookie_loop(self) -> None:
        """Learn the bookies every ledger needs (a successor must find the bookies lost
        before it was elected), then mark each lost bookie's ledgers when it is due."""
        retry_at: float | None = None
        learned = False
        while True:
            self._bookies_changed.clear()
            now = self._clock()
            due = self._lost.due(now)
            if (due or not learned) and (retry_at is None or now >= retry_at):
                try:
                    if due:
                        await self._mark_lost_bookies(due)
                    else:
                        named, _ = await self._scan(lambda _: False)
                        self._report(self._lost.named_in_metadata(named, self._clock()))
                    learned, retry_at = True, None
                except TallyError as error:
                    retry_at = self._clock() + RETRY_DELAY
                    log.error(
                        "could not %s: %s; again at %s",
                        f"mark the ledgers of lost bookies {[b.bookie_id for b in due]}"
                        if due
                        else "scan the ledgers' metadata for the bookies they need",
                        error,
                        _when(retry_at),
                    )
                continue
            deadline = self._lost.next_deadline()
            if retry_at is not None:
                deadline = retry_at if deadline is None else max(deadline, retry_at)
            await self._wait(self._bookies_changed, deadline)

    async def _mark_lost_bookies(self, due: tuple[LostBookie, ...]) -> None:
        wanted = {bookie.bookie_id for bookie in due}
        named, holders = await self._scan(wanted.__contains__)
        self._report(self._lost.named_in_metadata(named, self._clock()))
        still = {bookie for bookie in wanted if self._lost.is_lost(bookie)}
        counts = await self._mark_ledgers(holders, still, "lost_bookie")
        self._ledgers_marked.update(counts)
        for bookie in self._lost.marked(still, self._clock()):
            log.warning(
                "lost bookie %s (lost since %s): marked %d ledgers under-replicated",
                bookie.bookie_id,
                _when(bookie.since),
                counts[bookie.bookie_id],
            )

    async def _scan(
        self, wanted: Callable[[str], bool]
    ) -> tuple[frozenset[str], dict[LedgerId, frozenset[str]]]:
        """One pass over every ledger's metadata: the bookies holding any ledger's entries,
        and the ledgers that each `wanted` bookie holds entries of (with those bookies)."""
        named: set[str] = set()
        holders: dict[LedgerId, frozenset[str]] = {}
        async for page in self.context.ledgers.ledger_pages():
            for unreadable in page.unreadable:
                log.error(
                    "ledger metadata at %s does not decode, its bookies are unknown: %s",
                    unreadable.path,
                    unreadable.error,
                )
            for record in page.ledgers:
                bookies = bookies_holding_entries(record.metadata)
                named |= bookies
                lost_here = frozenset(b for b in bookies if wanted(b))
                if lost_here:
                    holders[record.ledger_id] = lost_here
        return frozenset(named), holders

    async def _mark_ledgers(
        self, holders: Mapping[LedgerId, frozenset[str]], bookies: set[str], cause: str
    ) -> dict[str, int]:
        """Mark every ledger held by some of `bookies`, naming those; the count per bookie."""
        marks = [(ledger, found & bookies) for ledger, found in holders.items() if found & bookies]
        counts = dict.fromkeys(bookies, 0)

        async def mark(item: tuple[LedgerId, frozenset[str]]) -> None:
            ledger_id, missing = item
            await self.context.under_replication.mark_under_replicated(
                ledger_id, missing, now_ms=_ms(self._clock())
            )
            metrics.UNDER_REPLICATED_LEDGERS_MARKED.labels(cause).inc()
            for bookie in missing:
                counts[bookie] += 1

        await for_each(marks, self.config.auditor_max_concurrent_metadata_reads, mark)
        return counts

    # -- incarnations --------------------------------------------------------------------------

    async def _incarnation_loop(self) -> None:
        """Review the incarnations at once, then at every change of the cookies or the
        registrations (and after a failure, once RETRY_DELAY has passed)."""
        retry_at: float | None = None
        while True:
            self._incarnations_changed.clear()
            if retry_at is None or self._clock() >= retry_at:
                try:
                    await self._review_incarnations()
                    retry_at = None
                except TallyError as error:
                    retry_at = self._clock() + RETRY_DELAY
                    log.error(
                        "could not compare the bookies' incarnations with the remembered "
                        "ones: %s; again at %s",
                        error,
                        _when(retry_at),
                    )
            await self._wait(self._incarnations_changed, retry_at)

    async def _review_incarnations(self) -> None:
        """Mark the ledgers of every bookie whose cookie's incarnation is not the remembered
        one, then remember it; remember the bookies seen for the first time."""
        async with self._reviewing_incarnations:
            store = self.context.ledgers.store
            memory = RememberedIncarnations(store)
            remembered = await memory.all()
            current = await CookieManager(store).incarnations()
            available = await self.context.registry.available_bookies()
            review = review_incarnations(
                {bookie: r.incarnation_id for bookie, r in remembered.items()},
                current,
                available.writable | available.read_only,
            )
            if not review:
                return
            counts: dict[str, int] = {}
            if review.changed:
                changed = {change.bookie_id for change in review.changed}
                _, holders = await self._scan(changed.__contains__)
                counts = await self._mark_ledgers(holders, changed, "incarnation_changed")
            for change in review.first_seen:
                if await self._remember(memory, change, None):
                    log.info(
                        "bookie %s: incarnation %s remembered (first seen by the auditor)",
                        change.bookie_id,
                        change.current,
                    )
            for change in review.changed:
                if await self._remember(memory, change, remembered[change.bookie_id].version):
                    metrics.INCARNATIONS_CHANGED.inc()
                    log.warning(
                        "bookie %s is a new incarnation %s (was %s): it was formatted anew "
                        "under the same id, so every copy it held is gone; marked its %d "
                        "ledgers under-replicated",
                        change.bookie_id,
                        change.current,
                        change.remembered or "unknown: its record does not decode",
                        counts[change.bookie_id],
                    )

    async def _remember(
        self, memory: RememberedIncarnations, change: IncarnationChange, version: int | None
    ) -> bool:
        """Remember the bookie's current incarnation; False (and another review to come)
        if its record changed since it was read."""
        try:
            await memory.remember(
                change.bookie_id, change.current, expected_version=version, now_ms=self._now_ms()
            )
        except (KeyExists, MetadataVersionConflict):
            # Another auditor (one whose session is ending) wrote it meanwhile: look again
            # rather than overwrite what it saw.
            self._incarnations_changed.set()
            return False
        return True

    # -- periodic checks -----------------------------------------------------------------------

    async def _check_loop(self) -> None:
        """Run each enabled check when due, one at a time."""
        await self._load_check_times()
        while True:
            self._checks_changed.clear()
            now = self._clock()
            enabled = [state for state in self._checks.values() if state.enabled]
            if not enabled:
                await self._checks_changed.wait()
                continue
            state = min(enabled, key=lambda s: s.due_at(self._requested_ms))
            due_at = state.due_at(self._requested_ms)
            if due_at <= now:
                await self._run_check(state)
            else:
                await self._wait(self._checks_changed, due_at)

    async def _load_check_times(self) -> None:
        """The checks' last-run times from the store, so a successor keeps the cadence."""
        while True:
            try:
                for state in self._checks.values():
                    state.last_run_ms = await self.context.under_replication.check_time(state.check)
                    if state.last_run_ms is not None:
                        metrics.LAST_CHECK_TIME.labels(state.check.value).set(
                            state.last_run_ms / 1000
                        )
                return
            except TallyError as error:
                log.error("cannot read the checks' last-run times: %s; again soon", error)
                await self._sleep(START_RETRY_DELAY)

    async def _run_check(self, state: _CheckState) -> None:
        check = state.check
        started = self._clock()
        loop = asyncio.get_running_loop()
        began = loop.time()
        state.running = True
        log.info("auditor: %s starting", check.value)
        try:
            findings = await self._check(check)
            await self.context.under_replication.set_check_time(check, _ms(started))
        except asyncio.CancelledError:
            metrics.CHECK_RUNS.labels(check.value, "cancelled").inc()
            raise
        except Exception as error:  # a store failure or a check's bug: the others go on
            state.retry_at = self._clock() + min(RETRY_DELAY, state.interval)
            state.error = f"{type(error).__name__}: {error}"
            metrics.CHECK_RUNS.labels(check.value, "failed").inc()
            log.error(
                "auditor: %s failed: %s; again at %s",
                check.value,
                state.error,
                _when(state.retry_at),
                exc_info=not isinstance(error, TallyError),
            )
            return
        finally:
            state.running = False
        duration = loop.time() - began
        state.last_run_ms, state.retry_at, state.error = _ms(started), None, None
        state.duration_s = duration
        state.findings = findings
        metrics.CHECK_RUNS.labels(check.value, "ok").inc()
        metrics.LAST_CHECK_TIME.labels(check.value).set(started)
        if findings is not None:
            metrics.CHECK_FINDINGS.labels(check.value).set(findings)
        log.info(
            "auditor: %s done in %.2fs: %s findings; next at %s",
            check.value,
            duration,
            "no count of" if findings is None else findings,
            _when(state.due_at(self._requested_ms)),
        )

    async def _check(self, check: AuditorCheck) -> int | None:
        if check is AuditorCheck.BOOKIES:
            with metrics.BOOKIE_CHECK_TIME.time():
                return await self._bookie_check()
        if check is AuditorCheck.CHECK_ALL_LEDGERS:
            with metrics.CHECK_ALL_LEDGERS_TIME.time():
                return await self._ledger_check()
        if check is AuditorCheck.PLACEMENT_POLICY:
            with metrics.PLACEMENT_POLICY_CHECK_TIME.time():
                return await placement_check(self.context, self.config, self._now_ms)
        if check is AuditorCheck.DELETIONS:
            return await self._deletion_check()
        return await self._run_replicas_check()

    async def _deletion_check(self) -> int:
        """Tombstone what is past its retention, remove old tombstones; the stuck ones."""
        report = await sweep_deletions(self.context.ledgers, self._now_ms())
        metrics.DELETED_LEDGERS.set(report.deleted_ledgers)
        metrics.TOMBSTONES.set(report.tombstones)
        metrics.TOMBSTONES_PENDING.set(report.tombstones_pending)
        metrics.DELETIONS_STUCK.set(len(report.stuck))
        metrics.TOMBSTONES_WITH_VIOLATIONS.set(len(report.with_violations))
        for ledger_id in report.stuck:
            log.warning(
                "deletion check: ledger %s is deletion_stuck: bookies still hold its data "
                "past deletion_stuck_after (see its tombstone)",
                ledger_id,
            )
        log.info(
            "deletion check: %d tombstoned, %d tombstones removed; %d DELETED within their "
            "retention, %d tombstones (%d pending, %d stuck, %d with violations at deletion)",
            len(report.tombstoned),
            len(report.tombstones_removed),
            report.deleted_ledgers,
            report.tombstones,
            report.tombstones_pending,
            len(report.stuck),
            len(report.with_violations),
        )
        return len(report.stuck)

    def _now_ms(self) -> int:
        return _ms(self._clock())

    async def _ledger_check(self) -> int:
        return await ledger_check(self.context, self.config, self._lost.registered, self._now_ms)

    # -- the bookie check ------------------------------------------------------------------

    async def _bookie_check(self) -> int:
        """Every bookie that metadata names against the registered ones; marks the ledgers
        of the lost bookies past their deadline (again, for those marked already: a mark
        lost or removed too early comes back). Reviews the incarnations too, should a watch
        have missed a change. The number of lost bookies."""
        await self._review_incarnations()
        registered = self._lost.registered
        named, holders = await self._scan(lambda bookie: bookie not in registered)
        now = self._clock()
        self._report(self._lost.named_in_metadata(named, now))
        # Only bookies already gone when the scan began: the scan found all their ledgers.
        overdue = {
            bookie.bookie_id
            for bookie in self._lost.past_deadline(now)
            if bookie.bookie_id not in registered
        }
        counts = await self._mark_ledgers(holders, overdue, "bookie_check")
        self._ledgers_marked.update(counts)
        self._lost.marked(overdue, self._clock())
        for bookie in sorted(self._lost.lost.values(), key=lambda b: b.bookie_id):
            holding = sum(bookie.bookie_id in found for found in holders.values())
            if bookie.bookie_id in overdue:
                log.warning(
                    "bookie check: bookie %s is lost (since %s): %d ledgers marked "
                    "under-replicated",
                    bookie.bookie_id,
                    _when(bookie.since),
                    counts[bookie.bookie_id],
                )
            else:
                log.warning(
                    "bookie check: bookie %s is lost (since %s): its %d ledgers will be marked %s",
                    bookie.bookie_id,
                    _when(bookie.since),
                    holding,
                    self._at(bookie),
                )
        return len(self._lost.lost)

    # -- the replicas check ----------------------------------------------------------------

    async def _run_replicas_check(self) -> int | None:
        """The injected check (the Spark pipeline), or the online one. Its findings are its
        report's: one per reported ledger or bookie (else the sum of its counts)."""
        if self._replicas_check is not None:
            report = await self._replicas_check()
        else:
            from tally.autorecovery.replicas_check import replicas_check

            report = await replicas_check(
                self.context, self.config, clock=self._clock, sleep=self._sleep
            )
        findings = getattr(report, "findings", None)
        if isinstance(findings, tuple | list):
            return len(findings)
        # The online check's report has `counts`; the Spark pipeline's summary is a dict.
        counts = (
            report.get("counts") if isinstance(report, Mapping) else getattr(report, "counts", None)
        )
        if isinstance(counts, Mapping):
            return sum(int(value) for value in counts.values())
        return None

    # -- status ----------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """JSON-ready: election, lost bookies with their deadlines, and each check's last
        run (times in Unix ms)."""
        requested = self._requested_ms
        return {
            "candidate_id": self.candidate_id,
            "elected": self._elected,
            "lost_bookie_recovery_delay": self._lost.delay,
            "audit_requested_ms": requested,
            "lost_bookies": [
                {
                    "bookie_id": bookie.bookie_id,
                    "state": bookie.state.value,
                    "since_ms": _ms(bookie.since),
                    "deadline_ms": _ms(bookie.deadline),
                    "escalated": bookie.escalated_at is not None,
                    "marked_ms": None if bookie.marked_at is None else _ms(bookie.marked_at),
                    "ledgers_marked": self._ledgers_marked.get(bookie.bookie_id, 0),
                }
                for bookie in sorted(self._lost.lost.values(), key=lambda b: b.bookie_id)
            ],
            "checks": {
                state.check.value: {
                    "enabled": state.enabled,
                    "interval_s": state.interval,
                    "running": state.running,
                    "last_run_ms": state.last_run_ms,
                    "next_run_ms": _ms(state.due_at(requested)) if state.enabled else None,
                    "last_duration_s": state.duration_s,
                    "last_findings": state.findings,
                    "last_error": state.error,
                }
                for state in self._checks.values()
            },
        }
