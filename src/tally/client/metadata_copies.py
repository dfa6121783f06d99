"""Copies of a ledger's metadata given to its bookies, for metadata recovery (issue 18):
the writer gives one to each bookie of a segment ahead of the segment's first add on its
connection (writer.py), and a copy of the metadata as it now is to the last segment's
bookies when the ledger closes (writer.py, recovery.py) and to the bookies a repair copied
entries onto (the replication worker). Best effort throughout: a bookie without a copy only
makes a metadata recovery infer what the copy would have said."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from tally.client.context import ClientContext
from tally.core.errors import TallyError
from tally.core.ids import LedgerId
from tally.metadata.ledger_manager import LedgerRecord

log = logging.getLogger(__name__)

_slow: set[asyncio.Task[None]] = set()
"""Copies still unanswered when `give_copies` stopped waiting."""


async def give_copies(
    context: ClientContext,
    record: LedgerRecord,
    master_key: bytes,
    bookies: Iterable[str] | None = None,
    *,
    wait: bool = True,
) -> None:
    """Give `bookies` (the last segment's by default) a copy of the ledger's metadata as it
    now is, and wait for their answers up to `close_copies_timeout`, or (not `wait`) not at
    all: best effort, a failure is logged, not raised, and the answers that come later are
    taken in the background."""
    copy = record.metadata.to_bytes()
    targets = sorted(set(record.metadata.segments[-1].ensemble if bookies is None else bookies))

    async def give(bookie: str) -> None:
        try:
            connection = await context.bookies.get(bookie)
            await connection.metadata_copy_nowait(record.ledger_id, master_key, copy)
        except TallyError as error:
            _no_copy(record.ledger_id, bookie, error)

    tasks = [asyncio.create_task(give(bookie)) for bookie in targets]
    if not tasks:
        return
    slow = set(tasks)
    if wait:
        _, slow = await asyncio.wait(tasks, timeout=context.config.close_copies_timeout)
    for task in slow:  # kept referenced until they end
        _slow.add(task)
        task.add_done_callback(_slow.discard)


def copy_answered(ledger_id: LedgerId, bookie: str, future: asyncio.Future[object]) -> None:
    """The answer to a copy sent without waiting: a failure is logged."""
    if not future.cancelled() and (error := future.exception()) is not None:
        _no_copy(ledger_id, bookie, error)


def _no_copy(ledger_id: LedgerId, bookie: str, error: BaseException) -> None:
    log.info("ledger %s: no metadata copy on bookie %s: %s", ledger_id, bookie, error)
