"""Bad copies that a client's reads ran into, filed as repair requests.

A read that gets a copy failing its digest, or the bookie's own check (EntryUnreadable),
uses another copy; the bad one is repaired by the replication worker once the ledger's
under-replication mark names it (`bad_copies`), as a scrub or the auditor's ledger check
would file it (issue 17). Reports are gathered and filed by one task: a read through many
rotten entries makes one mark update per ledger, not one per entry, and no read waits for
the metadata store.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import Counter

from tally.core.errors import TallyError
from tally.core.ids import LedgerId
from tally.core.replication import entry_ranges
from tally.metadata.underreplication import UnderReplicationManager

log = logging.getLogger(__name__)

BAD_COPIES_FILED = Counter(
    "client_bad_copies_filed",
    "Bad entry copies a client's reads found and filed for repair (under-replication marks)",
)


class BadCopyReports:
    """The bad copies found since the last filing, and the task filing them."""

    def __init__(self, marks: UnderReplicationManager) -> None:
        self._marks = marks
        self._pending: dict[LedgerId, dict[str, set[int]]] = {}
        self._filing: asyncio.Task[None] | None = None

    def report(self, ledger_id: LedgerId, bookie: str, entry_id: int) -> None:
        """Note that `bookie`'s copy of the entry is bad; it is filed shortly."""
        self._pending.setdefault(ledger_id, {}).setdefault(bookie, set()).add(entry_id)
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
                        "ledger %s: bad copies (%s) could not be filed for repair: %s; a "
                        "scrub of those bookies or the auditor's ledger check will find them",
                        ledger_id,
                        described,
                        error,
                    )
                    continue
                BAD_COPIES_FILED.inc(sum(map(len, copies.values())))
                log.warning("ledger %s: bad copies filed for repair: %s", ledger_id, described)
