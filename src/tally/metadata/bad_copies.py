"""Bad copies found by a client's reads or a bookie's own checks, filed as repair requests.

A bad copy is repaired by the replication worker once the ledger's under-replication mark
names it (`bad_copies`): a client files the copies its reads met before a good one, a
bookie those its scrubber, reads or compaction marked corrupt, the auditor's ledger check
those it read (issue 17). Reports are gathered and filed by one task: many rotten entries
make one mark update per ledger, not one per entry, and nobody waits for the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from tally.core.errors import TallyError
from tally.core.ids import LedgerId
from tally.core.replication import entry_ranges
from tally.metadata.underreplication import UnderReplicationManager

log = logging.getLogger(__name__)


class BadCopyReports:
    """The bad copies found since the last filing, and the task filing them."""

    def __init__(
        self, marks: UnderReplicationManager, filed: Callable[[int], object] = lambda count: None
    ) -> None:
        """`filed` counts the copies each filing names."""
        self._marks = marks
        self._filed = filed
        self._pending: dict[LedgerId, dict[str, set[int]]] = {}
        self._filing: asyncio.Task[None] | None = None

    def report(self, ledger_id: LedgerId, bookie: str, entry_ids: Iterable[int]) -> None:
        """Note that `bookie`'s copies of the entries are bad; they are filed shortly."""
        self._pending.setdefault(ledger_id, {}).setdefault(bookie, set()).update(entry_ids)
        if self._filing is None or self._filing.done():
            self._filing = asyncio.get_running_loop().create_task(self._file())

    async def flush(self) -> None:
        """Wait until every report so far is filed (or failed to be)."""
        while self._filing is not None and not self._filing.done():
            await asyncio.shield(self._filing)

    async def _file(self) -> None:
        while self._pending:
            pending, self._pending = self._pending, {}
            for ledger_id, copies in pending.items():
                described = "; ".join(
                    f"{bookie} entries {list(entry_ranges(entries))}"
                    for bookie, entries in sorted(copies.items())
                )
                try:
                    await self._marks.mark_under_replicated(
                        ledger_id, copies.keys(), bad_copies=copies
                    )
                except (TallyError, OSError) as error:
                    log.error(
                        "ledger %s: bad copies (%s) could not be filed for repair: %s; they "
                        "are found again by the next look (a scrub, a read, a check)",
                        ledger_id,
                        described,
                        error,
                    )
                    continue
                self._filed(sum(map(len, copies.values())))
                log.warning("ledger %s: bad copies filed for repair: %s", ledger_id, described)
