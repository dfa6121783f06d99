"""A bookie's export: what it holds that a metadata recovery needs, as one Parquet file.

The rows are a dump WITH_STATE's records (core/protocol/dump.py), the cookie first: one
row of kind `cookie`, one of kind `ledger` per ledger held (availability, fenced, LAC,
master key, metadata copy, the name of the digest type its entries tell when it has no
copy, and whether it is in limbo), one of kind `deleted` per ledger deleted under its
tombstone.
Every row names the bookie (from its cookie), so that a directory of exports is one table.
Ledger id halves are stored as audit/schema.py stores them (to_int64).

A file is written under a temporary name and renamed once complete, so a directory of
exports never holds a cut one that would pass for a bookie that lost ledgers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tally.audit.schema import to_int64
from tally.client.bookie_connection import BookieConnection
from tally.core.errors import BadRequest, MalformedData
from tally.core.protocol import StateKind, StateRecord
from tally.metadata.cookies import Cookie

EXPORT_SUFFIX = ".export.parquet"
ROW_BATCH = 8192
"""Rows handed to Parquet at once: what bounds an export's memory."""

EXPORT_SCHEMA = pa.schema(
    [
        pa.field("bookie_id", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("scope", pa.int64(), nullable=False),
        pa.field("ledger_id", pa.int64(), nullable=False),
        pa.field("availability", pa.binary(), nullable=False),
        pa.field("fenced", pa.bool_(), nullable=False),
        pa.field("last_add_confirmed", pa.int64(), nullable=False),
        pa.field("master_key", pa.binary(), nullable=True),
        pa.field("metadata_copy", pa.binary(), nullable=True),
        pa.field("digest_type", pa.string(), nullable=True),
        pa.field("in_limbo", pa.bool_(), nullable=False),
        pa.field("deleted_ms", pa.int64(), nullable=True),
        pa.field("cookie", pa.binary(), nullable=True),
    ]
)
KINDS = {StateKind.COOKIE: "cookie", StateKind.LEDGER: "ledger", StateKind.DELETED: "deleted"}


@dataclass(frozen=True, slots=True)
class ExportCounts:
    bookie_id: str
    ledgers: int
    deleted: int
    path: Path


class ExportWriter:
    """Writes one bookie's records into `path`, the cookie first; `finish` makes the file
    appear, `abandon` leaves nothing behind."""

    def __init__(self, path: Path, source: str) -> None:
        """`source` names where the records come from, in errors."""
        self.path = path
        self._source = source
        self._partial = path.with_name(path.name + ".partial")
        self._writer: pq.ParquetWriter | None = None
        self._rows: list[dict[str, Any]] = []
        self._bookie_id: str | None = None
        self._ledgers = 0
        self._deleted = 0

    def add(self, record: StateRecord) -> None:
        if self._bookie_id is None:
            if record.kind is not StateKind.COOKIE:
                raise MalformedData(f"{self._source}: its dump does not start with its cookie")
            self._bookie_id = Cookie.from_bytes(record.cookie, self._source).bookie_id
            self._partial.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self._partial, EXPORT_SCHEMA)
        elif record.kind is StateKind.COOKIE:
            raise MalformedData(f"{self._source}: its dump holds a second cookie")
        self._ledgers += record.kind is StateKind.LEDGER
        self._deleted += record.kind is StateKind.DELETED
        self._rows.append(
            {
                "bookie_id": self._bookie_id,
                "kind": KINDS[record.kind],
                "scope": to_int64(record.ledger_id.scope),
                "ledger_id": to_int64(record.ledger_id.id),
                "availability": record.availability,
                "fenced": record.fenced,
                "last_add_confirmed": record.last_add_confirmed,
                "master_key": record.master_key,
                "metadata_copy": record.metadata_copy,
                "digest_type": None if record.digest_type is None else record.digest_type.name,
                "in_limbo": record.in_limbo,
                "deleted_ms": record.deleted_ms if record.kind is StateKind.DELETED else None,
                "cookie": record.cookie if record.kind is StateKind.COOKIE else None,
            }
        )
        if len(self._rows) >= ROW_BATCH:
            self._flush()

    def finish(self) -> ExportCounts:
        if self._bookie_id is None or self._writer is None:
            raise MalformedData(f"{self._source}: its dump was empty (not even its cookie)")
        self._flush()
        self._writer.close()
        with open(self._partial, "rb") as file:
            os.fsync(file.fileno())
        self._partial.replace(self.path)
        return ExportCounts(self._bookie_id, self._ledgers, self._deleted, self.path)

    def abandon(self) -> None:
        if self._writer is not None:
            self._writer.close()
        with contextlib.suppress(FileNotFoundError):
            self._partial.unlink()

    def _flush(self) -> None:
        if self._rows and self._writer is not None:
            self._writer.write_table(pa.Table.from_pylist(self._rows, EXPORT_SCHEMA))
            self._rows = []


def export_path(directory: Path, bookie: str) -> Path:
    """Where the export of `bookie` (an id or an address) goes in `directory`."""
    return directory / f"{bookie.replace(':', '_').replace('/', '_')}{EXPORT_SUFFIX}"


@contextlib.contextmanager
def _writing(path: Path, source: str) -> Iterator[ExportWriter]:
    """An export being written: abandoned, leaving nothing, if anything goes wrong."""
    writer = ExportWriter(path, source)
    try:
        yield writer
    except BaseException:
        writer.abandon()
        raise


def write_export(records: Iterable[StateRecord], path: Path, source: str) -> ExportCounts:
    with _writing(path, source) as writer:
        for record in records:
            writer.add(record)
        return writer.finish()


async def export_running_bookie(
    address: str, path: Path, *, request_timeout: float = 60.0
) -> ExportCounts:
    """Ask the bookie at `address` for its dump WITH_STATE and write it into `path`."""
    connection = await BookieConnection.connect(address, request_timeout=request_timeout)
    try:
        with _writing(path, f"bookie {address}") as writer:
            async for record in connection.state_dump():
                writer.add(record)
            return writer.finish()
    finally:
        await connection.close()


def export_files(directory: Path) -> list[Path]:
    """The exports in `directory`; BadRequest if there are none."""
    found = sorted(directory.glob(f"*{EXPORT_SUFFIX}")) if directory.is_dir() else []
    if not found:
        raise BadRequest(f"no bookie exports (*{EXPORT_SUFFIX}) in {directory}")
    return found
