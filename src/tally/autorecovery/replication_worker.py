"""The replication worker: repairs under-replicated ledgers under their locks,
`rereplication_ledgers_in_parallel` at a time.

For each marked ledger that is not backing off and not on the lost-entries list at its
current mark version, the worker takes the ledger's lock, reads its metadata, asks every
registered bookie of it for its availability and lets `tally.core.replication` plan the
repair. It then picks new bookies for lost ones with the placement policy, copies the
entries with RECOVERY_ADD (rate-limited, batches in flight), CASes the new ensembles into
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
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from tally.autorecovery import replication_metrics as metrics
from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.ledger_repair import LedgerRepair, Outcome, Turn
from tally.client.context import ClientContext
from tally.core.digest import LedgerKeys, master_key
from tally.core.errors import (
    TallyError,
)
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.replication import (
    RepairSchedule,
    TokenBucket,
)
from tally.failpoints import afailpoint

log = logging.getLogger(__name__)

RATE_BURST_SECONDS = 0.1
"""The rate limit's burst, in seconds of its rate."""


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
        self._marked = False
        """A mark was made or changed since the current pass listed the marks."""
        self._schedule = RepairSchedule(
            config.replication_backoff_initial, config.replication_backoff_max
        )
        self._current: set[LedgerId] = set()
        self.reads_one_by_one: set[str] = set()
        """Bookies whose READ_ENTRIES failed this pass (a closed connection: an older bookie
        that does not know it, or one that is down): read one entry a request until the
        next pass."""
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
        manager = self.context.under_replication
        switch = await manager.watch_replication_enabled(self._switch)
        marks = await manager.watch_marks(self._marks_changed)
        try:
            while True:
                self._looks += 1
                if not (self._enabled and await self._pass()):
                    await self._idle()
        finally:
            switch.cancel()
            marks.cancel()

    def _marks_changed(self, _: int | None) -> None:
        """A mark was made or changed: look now rather than at the next poll."""
        self._marked = True
        self._wake.set()

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
        """Sleep until the next poll, a backoff's end, a switch of the replication flag, or a
        mark made or changed (`LAST_MARKED`'s watch)."""
        delay = self.config.under_replicated_poll_interval
        if self._enabled:
            delay = self._schedule.next_look(self._clock(), delay)
        if self._marked and self._enabled:  # during the pass that just ended: look again
            return
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    async def _pass(self) -> bool:
        """One look at every mark, repairing those that are due, several at once; True when
        a ledger was marked again while it was repaired, so another pass is due at once."""
        manager = self.context.under_replication
        self._marked = False
        self.reads_one_by_one.clear()
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
        outcomes: list[Outcome | None] = []
        broken: list[BaseException] = []
        taking: set[asyncio.Task[Outcome | None]] = set()

        def taken(task: asyncio.Task[Outcome | None]) -> None:
            taking.discard(task)
            if task.cancelled():
                return
            error = task.exception()
            if error is not None:
                broken.append(error)  # a bug, not a ledger's failure
            else:
                outcomes.append(task.result())

        try:
            for mark in marks:
                if len(taking) >= self.config.rereplication_ledgers_in_parallel:
                    await asyncio.wait(taking, return_when=asyncio.FIRST_COMPLETED)
                if broken:
                    raise broken[0]
                if not self._enabled:
                    break
                due = self._schedule.is_due(
                    mark.ledger_id,
                    self._clock(),
                    mark_version=mark.version,
                    lost_at=on_lost_list.get(mark.ledger_id),
                )
                if due:
                    task = asyncio.create_task(self._take(mark.ledger_id))
                    taking.add(task)
                    task.add_done_callback(taken)
            if taking:
                await asyncio.wait(taking)
            if broken:
                raise broken[0]
        finally:
            for task in taking:
                task.cancel()  # each gives its lock back on its way out
            await asyncio.gather(*taking, return_exceptions=True)
        return Outcome.REMARKED in outcomes

    async def _take(self, ledger_id: LedgerId) -> Outcome | None:
        """Lock the ledger, repair it, give it back; the outcome (None: not taken, another
        worker has it or it was repaired meanwhile) sets its backoff."""
        manager = self.context.under_replication
        started = time.perf_counter()
        try:
            lock = await manager.acquire(ledger_id)
        except TallyError as error:
            log.warning("ledger %s: cannot take its replication lock: %s", ledger_id, error)
            self._note(ledger_id, Turn(Outcome.FAILED, str(error)))
            return Outcome.FAILED
        if lock is None:
            return None
        self._current.add(ledger_id)
        held = True
        try:
            turn = await LedgerRepair(self, lock).run()
            if turn.outcome is Outcome.REPLICATED:
                await afailpoint("replication.unmark")
                replicated = await manager.mark_replicated(lock)
                # Given back with its answer; a store error leaves it to `finally`, or the
                # ledger would stay locked, never repaired, as long as this session lives.
                held = False
                if not replicated:
                    turn = Turn(
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
            turn = Turn(Outcome.FAILED, f"{type(error).__name__}: {error}")
        finally:
            self._current.discard(ledger_id)
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

    def _note(self, ledger_id: LedgerId, turn: Turn) -> None:
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

    def now(self) -> float:
        return self._clock()

    def keys_of(self, metadata: LedgerMetadata) -> LedgerKeys | None:
        """The ledger's keys; None for an HMAC ledger whose password the worker lacks."""
        password = self._passwords.get(metadata.master_key)
        return LedgerKeys.for_maintenance(metadata.digest_type, metadata.master_key, password)

    def count_copy(self, entries: int, size: int) -> None:
        """`entries` more copies written, of `size` bytes together."""
        self._entries_copied += entries
        self._bytes_copied += size

    async def throttle(self, size: int) -> None:
        """Wait for the rate limit to allow `size` more bytes (the copies read together)."""
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
            "current_ledgers": sorted(ledger_id.qualified_name for ledger_id in self._current),
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
