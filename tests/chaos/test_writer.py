"""The chaos writer process's own logic, without a cluster: what it records of an add
refused at once by a writer that has stopped."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from tally.chaos.history_file import HistoryFile
from tally.chaos.writer import ChaosWriter
from tally.core.errors import NotEnoughBookies


class StoppedWriter:
    """A ledger writer that stopped: no bookies could replace a failed one."""

    def append_nowait(self, data: bytes, entry_id: int | None = None) -> asyncio.Future[int]:
        raise NotEnoughBookies("no bookies can replace 127.0.0.1:1 at position 0")


async def test_an_add_refused_at_once_is_recorded_failed_and_ends_the_ledger(
    tmp_path: Path,
) -> None:
    """Two long chaos runs saw writer processes die of it (exit status 1) and be taken
    over as if killed: the refusal must end the ledger like a failed add, not the process."""
    history = HistoryFile(tmp_path / "writer.jsonl", epoch=0.0)
    writer = ChaosWriter(None, history, "log-0", seed=1, rate=1000.0)  # type: ignore[arg-type]
    failed = await writer.append_all(StoppedWriter(), "7", count=5)  # type: ignore[arg-type]
    history.close()
    assert failed
    (event,) = [json.loads(line) for line in (tmp_path / "writer.jsonl").read_text().splitlines()]
    assert (event["kind"], event["outcome"], event["entry"]) == ("added", "failed", None)
    assert "no bookies can replace" in event["error"]
