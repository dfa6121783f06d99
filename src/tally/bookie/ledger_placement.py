"""The record of which ledger directory holds each ledger, and of the directories that failed.

It lives in the journal directory (`ledger-placement.db`, SQLite), not in a ledger
directory: a bookie must still be able to list the ledgers of a ledger directory whose disk
is gone, and a bookie without its journal does not start anyway.

What it holds is kept true by the order of writes (ledger_directories.py): a placement is
written after the checkpoint that puts the ledger into its directory's index, and deleted
before the ledger is deleted from it. So a ledger in an index but not here was placed just
before a crash (it is placed there again at start-up), and a ledger placed here that its
directory's index lacks was lost with the directory's data (a disk replaced by an empty one).
"""

from __future__ import annotations

import sqlite3
import struct
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tally.core.errors import WriteFailed
from tally.core.ids import LedgerId

FILE_NAME = "ledger-placement.db"
_LEDGER = struct.Struct(">QQ")
"""A ledger id as a key: SQLite's integers are signed, the halves of an id are not."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS placement (
    ledger BLOB PRIMARY KEY,
    directory TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS failed_directories (
    directory TEXT PRIMARY KEY,
    reason TEXT NOT NULL,
    failed_ms INTEGER NOT NULL
);
"""


def recorded_failures(journal_dir: Path) -> dict[str, str]:
    """The failed directories of the record in `journal_dir`, if it has one (without
    creating it: a new bookie's directories must stay empty until it is formatted)."""
    if not (journal_dir / FILE_NAME).exists():
        return {}
    record = PlacementRecord(journal_dir)
    try:
        return record.failed_directories()
    finally:
        record.close()


class PlacementRecord:
    """The record in `journal_dir`; thread-safe (the bookie writes it from its event loop
    and from its checkpoints' thread). Every write is durable when it returns; a failure to
    write is WriteFailed (the journal's disk is failing)."""

    def __init__(self, journal_dir: Path) -> None:
        self.path = journal_dir / FILE_NAME
        self._lock = threading.Lock()
        try:
            journal_dir.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA synchronous = FULL")
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as error:
            raise WriteFailed(
                f"cannot open the ledger placement record {self.path}: {error}"
            ) from error

    def placements(self) -> dict[LedgerId, str]:
        """Every ledger with the directory it is placed on."""
        with self._reading() as db:
            rows = db.execute("SELECT ledger, directory FROM placement").fetchall()
        return {LedgerId(*_LEDGER.unpack(key)): directory for key, directory in rows}

    def failed_directories(self) -> dict[str, str]:
        """Each failed directory with why it failed."""
        with self._reading() as db:
            rows = db.execute("SELECT directory, reason FROM failed_directories").fetchall()
        return dict(rows)

    def place(self, placements: Mapping[LedgerId, str]) -> None:
        rows = [(_LEDGER.pack(ledger.scope, ledger.id), d) for ledger, d in placements.items()]
        with self._transaction() as db:
            db.executemany("INSERT OR REPLACE INTO placement VALUES (?, ?)", rows)

    def forget(self, ledger_ids: Iterable[LedgerId]) -> None:
        rows = [(_LEDGER.pack(ledger.scope, ledger.id),) for ledger in ledger_ids]
        with self._transaction() as db:
            db.executemany("DELETE FROM placement WHERE ledger = ?", rows)

    def mark_failed(self, directory: str, reason: str, now_ms: int) -> None:
        with self._transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO failed_directories VALUES (?, ?, ?)",
                (directory, reason, now_ms),
            )

    def clear_failed(self, directory: str) -> bool:
        """The directory is in service again (a replaced disk); whether it was failed."""
        with self._transaction() as db:
            deleted = db.execute(
                "DELETE FROM failed_directories WHERE directory = ?", (directory,)
            ).rowcount
        return bool(deleted)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                yield self._db
            except sqlite3.Error as error:
                raise WriteFailed(
                    f"cannot read the ledger placement record {self.path}: {error}"
                ) from error

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as error:
                raise WriteFailed(
                    f"cannot write the ledger placement record {self.path}: {error}"
                ) from error
