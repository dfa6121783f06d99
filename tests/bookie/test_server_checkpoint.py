"""A bookie checkpoints from two threads (its checkpoint loop's and the garbage collector's);
the marks it writes never go back, or a later start would replay from a journal file the
newer checkpoint's release had already deleted. A checkpoint that fails is tried again."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from tally.bookie.journal_format import JournalMark
from tally.core.errors import EntryUnreadable
from tests.bookie.conftest import KEY, connected, entry, in_process_bookie, new_ledger
from tests.support.polling import until

OVERTAKE_WINDOW = 1.0
"""How long the first checkpoint holds its mark, giving a second one the chance to pass."""


async def test_two_checkpoints_at_once_never_write_an_older_mark(tmp_path: Path) -> None:
    async with in_process_bookie(tmp_path / "bookie", flush_interval=3600) as node:
        bookie = node.bookie
        storage_checkpoint = bookie.storage.checkpoint
        journal_last_mark = bookie.journal.last_mark
        written: list[JournalMark] = []
        first_holds_its_mark = threading.Event()
        second_took_its_mark = threading.Event()

        def last_mark() -> JournalMark:
            if first_holds_its_mark.is_set():
                second_took_its_mark.set()
            return journal_last_mark()

        def checkpoint(mark: bytes) -> None:
            if not first_holds_its_mark.is_set():
                first_holds_its_mark.set()
                second_took_its_mark.wait(OVERTAKE_WINDOW)
            written.append(JournalMark.from_bytes(mark))
            storage_checkpoint(mark)

        bookie.journal.last_mark = last_mark  # type: ignore[method-assign]
        bookie.storage.checkpoint = checkpoint  # type: ignore[method-assign]
        ledger_id = new_ledger()
        async with connected(bookie.address) as connection:
            await connection.add(entry(ledger_id, 0), KEY)
            first = asyncio.create_task(asyncio.to_thread(bookie._checkpoint_now))
            await asyncio.to_thread(first_holds_its_mark.wait, 5)
            await connection.add(entry(ledger_id, 1), KEY)  # the journal moves on
            second = asyncio.create_task(asyncio.to_thread(bookie._checkpoint_now))
            await asyncio.gather(first, second)
        assert len(written) == 2
        assert written[0] < written[1], f"checkpoint marks went back: {written}"


async def test_a_checkpoint_that_cannot_read_its_index_is_tried_again(tmp_path: Path) -> None:
    """An index read failing inside a checkpoint (EntryUnreadable, not WriteFailed) must
    not end the checkpoint loop: the bookie would stop checkpointing, unseen."""
    async with in_process_bookie(tmp_path / "bookie", flush_interval=0.2) as node:
        bookie = node.bookie
        storage_checkpoint = bookie.storage.checkpoint
        tries: list[str] = []

        def checkpoint(mark: bytes) -> None:
            if not tries:
                tries.append("failed")
                raise EntryUnreadable("an index read failed during the checkpoint")
            tries.append("done")
            storage_checkpoint(mark)

        bookie.storage.checkpoint = checkpoint  # type: ignore[method-assign]
        async with connected(bookie.address) as connection:
            await connection.add(entry(new_ledger(), 0), KEY)
        await until(lambda: "done" in tries, "a checkpoint after the failed one", timeout=10)
