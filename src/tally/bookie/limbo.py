"""The ledgers in limbo on one bookie: which enter at start-up, and the watch that lets them out.

A journal replay that finds damage (a stretch of acknowledged records that no longer reads)
cannot know which records it lost; `tally.core.limbo.ledgers_to_limbo` says which ledgers
go into limbo (ledger_storage.py), fenced and answering "unknown" for what they lack.

A ledger directory whose disk fails puts its ledgers in limbo too, on the directories still
in service (ledger_directories.py), and `mark_lost` marks them at once, open ones included,
so that the bounded segments of an open ledger are repaired without waiting for its close.

The watch then looks at each ledger in limbo every `limbo_check_interval` seconds and lets
`tally.core.limbo` judge it against its metadata: a closed ledger whose entries this bookie
all holds leaves limbo; one that lacks entries is marked under-replicated, naming this
bookie, so that a replication worker copies them back (FILL); an open one waits for its
close. A ledger whose metadata is gone stays in limbo: absence proves nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection

from tally.bookie.ledger_directories import BookieStorage
from tally.core.errors import NoSuchLedger, TallyError
from tally.core.ids import LedgerId
from tally.core.limbo import LimboVerdict, check_limbo
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.store import MetadataStore
from tally.metadata.underreplication import UnderReplicationManager

log = logging.getLogger(__name__)

SHOWN_LEDGERS = 20
"""Ledgers named one by one in the start-up log line."""


def describe(ledger_ids: Collection[LedgerId]) -> str:
    names = [ledger_id.qualified_name for ledger_id in sorted(ledger_ids)]
    shown = ", ".join(names[:SHOWN_LEDGERS])
    return shown + (f" and {len(names) - SHOWN_LEDGERS} more" if len(names) > SHOWN_LEDGERS else "")


class LimboWatch:
    """Marks the ledgers in limbo for repair and lets out the whole ones; `run` until cancelled."""

    def __init__(
        self,
        storage: BookieStorage,
        store: MetadataStore,
        bookie_id: str,
        interval: float,
        on_change: Callable[[int], object] = lambda count: None,
    ) -> None:
        self._storage = storage
        self._ledgers = LedgerManager(store)
        self._marks = UnderReplicationManager(store)
        self._bookie_id = bookie_id
        self._interval = interval
        self._on_change = on_change

    async def run(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self._interval)

    async def check_all(self) -> None:
        """One look at every ledger in limbo; a metadata error leaves a ledger for next time."""
        for ledger_id in sorted(self._storage.limbo_ledgers()):
            try:
                await self._check(ledger_id)
            except TallyError as error:
                log.warning(
                    "bookie %s: ledger %s in limbo: cannot check it now: %s",
                    self._bookie_id,
                    ledger_id.qualified_name,
                    error,
                )
        self._on_change(len(self._storage.limbo_ledgers()))

    async def _check(self, ledger_id: LedgerId) -> None:
        try:
            record = await self._ledgers.read_ledger_metadata(ledger_id)
        except NoSuchLedger:
            return
        held = await asyncio.to_thread(self._storage.availability, ledger_id)
        check = check_limbo(record.metadata, self._bookie_id, held)
        if check.verdict is LimboVerdict.WHOLE:
            self._storage.leave_limbo(ledger_id)
            log.info(
                "bookie %s: ledger %s leaves limbo: it holds every entry its closed metadata "
                "gives this bookie",
                self._bookie_id,
                ledger_id.qualified_name,
            )
        elif check.verdict is LimboVerdict.MISSING and await self._mark(ledger_id):
            log.warning(
                "bookie %s: ledger %s in limbo lacks %d entries here: marked "
                "under-replicated for their repair",
                self._bookie_id,
                ledger_id.qualified_name,
                len(check.missing),
            )

    async def mark_lost(self, ledger_ids: Collection[LedgerId]) -> None:
        """Mark ledgers this bookie lost with a failed disk under-replicated, naming this
        bookie; a metadata error leaves a ledger to the watch's next look (once closed)."""
        marked = 0
        for ledger_id in sorted(ledger_ids):
            try:
                marked += await self._mark(ledger_id)
            except TallyError as error:
                log.warning(
                    "bookie %s: ledger %s, lost with a failed disk: cannot mark it now: %s",
                    self._bookie_id,
                    ledger_id.qualified_name,
                    error,
                )
        if ledger_ids:
            log.warning(
                "bookie %s: %d ledgers lost with a failed disk marked under-replicated for "
                "their repair (%d newly): %s",
                self._bookie_id,
                len(ledger_ids),
                marked,
                describe(ledger_ids),
            )
        self._on_change(len(self._storage.limbo_ledgers()))

    async def _mark(self, ledger_id: LedgerId) -> bool:
        """Mark the ledger under-replicated naming this bookie; whether it was not yet."""
        mark = await self._marks.under_replicated(ledger_id)
        if mark is not None and self._bookie_id in mark.missing_bookies:
            return False
        await self._marks.mark_under_replicated(ledger_id, {self._bookie_id})
        return True
