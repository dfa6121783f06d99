"""A history file of a chaos run (core/chaos/history.py): the run's own, or one writer
process's. Events are written a line at a time and flushed at once, so a process killed
loses at most the line it was writing; times are seconds since the run's `epoch` (wall
clock, shared by every process of the run on one machine)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import IO

from tally.core.chaos.history import Event, encode_event


class HistoryFile:
    def __init__(self, path: Path, epoch: float) -> None:
        self.path = path
        self.epoch = epoch
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self.events = 0

    def now(self) -> float:
        return time.time() - self.epoch

    def write(self, event: Event) -> None:
        self.write_line(encode_event(event))

    def write_line(self, line: str) -> None:
        self._file.write(line + "\n")
        self._file.flush()
        self.events += 1

    def close(self) -> None:
        self._file.close()
