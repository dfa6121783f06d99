"""The bookie's background scrubber (BookKeeper's ScrubberService): scrub passes over ledger
storage, one every `scrub_interval`, at a bounded rate, and one at full speed when an
operator asks (`tally shell scrub --now`, `PUT /api/v1/bookie/scrub`). Each ledger
directory has its own (`ScrubberServices` holds them).

`tally.core.scrub` decides when a pass is due and how fast it reads; ledger storage does a
step of it at a time in a worker thread (scrubber.py); between two steps this task waits
out the rate (a token bucket), so no thread is held while it waits and a request for a pass
now is heard at once. The passes, the one under way and the corrupt marks are in the index:
a restart resumes the schedule where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from tally.bookie.ledger_storage import CorruptEntry, LedgerStorage
from tally.core.errors import IllegalOperation, TallyError
from tally.core.ids import LedgerId
from tally.core.replication import TokenBucket
from tally.core.scrub import (
    ScrubAction,
    ScrubPass,
    ScrubPolicy,
    next_pass_at,
    plan_scrub,
    scrub_rate,
    step_bytes,
)

log = logging.getLogger(__name__)

RETRY_AFTER = 60.0
"""Seconds before a step that failed (the index could not be written, say) is tried again."""


class ScrubberService:
    """One bookie's scrubber; `run` until cancelled, `trigger` for a pass now."""

    def __init__(
        self,
        storage: LedgerStorage,
        bookie_id: str,
        policy: ScrubPolicy,
        *,
        disk_bytes: Callable[[], int],
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`disk_bytes` measures the ledger disk (the default rate is its size over the
        interval); `clock` is wall-clock seconds, `monotonic` paces the rate."""
        self._storage = storage
        self._bookie_id = bookie_id
        self.policy = policy
        self._disk_bytes = disk_bytes
        self._clock = clock
        self._monotonic = monotonic
        self._requested = False
        self._wake = asyncio.Event()
        self._ended = asyncio.Condition()
        """Notified whenever a pass ends."""
        self._bucket: TokenBucket | None = None

    # -- control ---------------------------------------------------------------------

    async def run(self) -> None:
        """Scrub as the schedule (and the operator) says, until cancelled or closed."""
        while True:
            current, passes = self._storage.scrub_passes()
            plan = plan_scrub(
                passes[-1] if passes else None,
                current,
                self.policy,
                self._clock(),
                requested=self._requested,
            )
            if plan.action is ScrubAction.WAIT:
                await self._sleep(plan.wait)
                continue
            self._requested = False  # the pass under way is the operator's from here on
            rate = None if plan.full_speed else scrub_rate(self.policy, self._disk_bytes())
            budget = step_bytes(rate)
            try:
                step = await asyncio.to_thread(
                    self._storage.scrub, budget, full_speed=plan.full_speed
                )
            except IllegalOperation:
                return  # the storage is closing
            except TallyError as error:
                log.error(
                    "bookie %s: a scrub step failed; trying again in %.0f s: %s",
                    self._bookie_id,
                    RETRY_AFTER,
                    error,
                )
                await self._sleep(RETRY_AFTER)
                continue
            if step.scrub.complete:
                async with self._ended:
                    self._ended.notify_all()
            if rate is not None:
                await self._sleep(self._pace(rate, budget, step.bytes))

    def _pace(self, rate: float, burst: int, spent: int) -> float:
        """Seconds to wait before the next step, having read `spent` bytes at `rate`."""
        now = self._monotonic()
        if self._bucket is None or self._bucket.rate != rate:
            self._bucket = TokenBucket(rate, burst, now)
        return self._bucket.reserve(spent, now)

    async def _sleep(self, seconds: float | None) -> None:
        """Wait `seconds` (None: until woken), or less if an operator asks for a pass."""
        if seconds is not None and seconds <= 0:
            await asyncio.sleep(0)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()

    async def trigger(self, *, wait: bool = False) -> dict[str, Any]:
        """Ask for a pass now, at full speed (or the one under way to go on at full speed);
        with `wait`, answer once it has ended. The status, as `status` gives it."""
        async with self._ended:
            self._requested = True
            self._wake.set()
            if wait:
                await self._ended.wait()
        return self.status()

    # -- what it did --------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The schedule, the pass under way and the last complete ones (newest first)."""
        current, passes = self._storage.scrub_passes()
        due = next_pass_at(passes[-1] if passes else None, self.policy)
        return {
            "interval": self.policy.interval,
            "rate_bytes_per_second": round(scrub_rate(self.policy, self._disk_bytes())),
            "rate_configured": self.policy.rate_bytes > 0,
            "requested": self._requested,
            "current": None if current is None else pass_view(current),
            "passes": [pass_view(done) for done in reversed(passes)],
            "next_pass_due": None if due is None else max(due, 0.0),
            "corrupt_entries": self._storage.stats().corrupt_entries,
        }

    def corrupt_entries(self, ledger_id: LedgerId | None = None) -> list[dict[str, Any]]:
        """The entries marked corrupt (of `ledger_id`, or all), as the admin HTTP shows them."""
        return [corrupt_view(found) for found in self._storage.corrupt_entries(ledger_id)]


class ScrubberServices:
    """The scrubbers of a bookie's ledger directories, one each (every disk is scrubbed at
    its own rate, all at once), as one for the operator: a pass now is a pass of each, and
    the status of several adds theirs up, each under `ledger_dirs`."""

    def __init__(self, services: dict[str, ScrubberService]) -> None:
        """`services`: by ledger directory."""
        self._services = dict(services)
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        """Run every directory's scrubber until cancelled (or until its storage closes)."""
        self._tasks = {
            name: asyncio.create_task(service.run(), name=f"scrub {name}")
            for name, service in self._services.items()
        }
        try:
            ended = await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        finally:
            for task in self._tasks.values():
                task.cancel()
        for error in ended:
            if isinstance(error, Exception):
                log.error("a ledger directory's scrubber failed", exc_info=error)

    def stop(self, name: str) -> None:
        """Stop the scrubber of a directory taken out of service."""
        self._services.pop(name, None)
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()

    async def trigger(self, *, wait: bool = False) -> dict[str, Any]:
        """A pass now, of every directory (`ScrubberService.trigger`)."""
        await asyncio.gather(*(s.trigger(wait=wait) for s in self._services.values()))
        return self.status()

    def status(self) -> dict[str, Any]:
        """As `ScrubberService.status` for one directory; for several, theirs added up (the
        rates summed, the passes all listed, the pass under way any one's, the next due
        the soonest), with each under `ledger_dirs`."""
        statuses = {name: service.status() for name, service in self._services.items()}
        if len(statuses) == 1:
            return next(iter(statuses.values()))
        dues = [s["next_pass_due"] for s in statuses.values() if s["next_pass_due"] is not None]
        passes = [done for s in statuses.values() for done in s["passes"]]
        first = next(iter(statuses.values()), None)
        return {
            "interval": first["interval"] if first else 0.0,
            "rate_bytes_per_second": sum(s["rate_bytes_per_second"] for s in statuses.values()),
            "rate_configured": bool(first and first["rate_configured"]),
            "requested": any(s["requested"] for s in statuses.values()),
            "current": next((s["current"] for s in statuses.values() if s["current"]), None),
            "passes": sorted(passes, key=lambda done: done["ended"], reverse=True),
            "next_pass_due": min(dues) if dues else None,
            "corrupt_entries": sum(s["corrupt_entries"] for s in statuses.values()),
            "ledger_dirs": statuses,
        }

    def corrupt_entries(self, ledger_id: LedgerId | None = None) -> list[dict[str, Any]]:
        return [
            found
            for service in self._services.values()
            for found in service.corrupt_entries(ledger_id)
        ]


def pass_view(scrub: ScrubPass) -> dict[str, Any]:
    return {
        "started": scrub.started,
        "ended": scrub.ended,
        "trigger": scrub.trigger.value,
        "seconds": round((scrub.ended or scrub.started) - scrub.started, 3),
        "bytes": scrub.bytes,
        "entries": scrub.entries,
        "corrupt": scrub.corrupt,
        "unreadable": scrub.unreadable,
    }


def corrupt_view(found: CorruptEntry) -> dict[str, Any]:
    location = found.mark.location
    return {
        "ledger_id": str(found.ledger_id),
        "qualified_name": found.ledger_id.qualified_name,
        "entry_id": found.entry_id,
        "found_at": found.mark.found_at,
        "found_by": found.mark.found_by.value,
        "location": location._asdict(),
    }
