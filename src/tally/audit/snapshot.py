"""`tally audit snapshot`: export a live cluster into the audit schema, once and in bulk.

An online auditor asks every bookie about every ledger; the snapshot instead walks the
metadata once and asks each bookie once for its whole availability (AVAILABILITY_DUMP), so
the Spark checks can join the two offline. The metadata goes first: a ledger closed before
the walk has all its entries on its bookies already, so the dumps that follow can only show
more than the metadata knows (a ledger created meanwhile looks orphaned), never less; the
confirmation pass (`tally.audit.confirm`) drops such skew. Within a range of ids the
tombstones are walked after the ledgers, and a ledger's metadata is replaced by its
tombstone in one transaction, so a ledger the ledger walk misses because it was tombstoned is
in the tombstone walk; one tombstoned between the two walks is in both, and the checks take
its tombstone.

The pieces, each writing its own Parquet part, are shared by the two ways to take one:
`take_snapshot` here, in one process (every id in one range, four bookies dumped at once),
and `tally.audit.snapshot_job`, as Spark tasks (a range of ids or a bookie per task).

Memory stays bounded: ledgers are written a page at a time, and each bookie's dump streams
into its own Parquet part in row batches. A bookie that cannot be reached, or whose dump
fails midway, has its part deleted and is recorded with responded = false, so a partial
dump can never pass for a bookie that lost entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tally.audit import schema
from tally.audit.config import AuditConfig
from tally.client.bookie_connection import BookieConnection
from tally.core.deletion import Tombstone
from tally.core.errors import BadRequest, TallyError
from tally.core.ids import LedgerId
from tally.core.placement import DEFAULT_RACK
from tally.metadata.bookie_registry import (
    AvailableBookies,
    BookiePlacement,
    BookieRegistry,
)
from tally.metadata.cluster import require_cluster
from tally.metadata.cluster_settings import read_settings
from tally.metadata.ledger_manager import LedgerManager, LedgerRecord
from tally.metadata.ledger_tree import Subtree
from tally.metadata.paths import TOMBSTONE_RECORDS
from tally.metadata.store import MetadataStore
from tally.metadata.stores import open_store
from tally.metadata.tombstones import tombstone_pages
from tally.metadata.underreplication import UnderReplicationManager
from tally.version import __version__

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int | None], None]
"""progress(stage, done, total or None when unknown), called as work advances."""

ROW_BATCH = 8192
"""Rows buffered before they are handed to Parquet: what bounds a dump's memory."""
DUMP_CONCURRENCY = 4
"""Bookies dumped at once: enough to overlap their disks, few enough to spare the network."""
LEDGER_PAGE = 1000

_DICTIONARY_COLUMNS = {
    schema.LEDGERS: ["state", "digest_type"],
    schema.SEGMENTS: ["ensemble"],
    schema.BOOKIES: ["rack", "state"],
    schema.AVAILABILITY: ["bookie_id"],
    schema.TOMBSTONES: ["reason", "bookies"],
    schema.UNREADABLE: ["record"],
    schema.VIOLATIONS: ["category", "bookie_id"],
}
"""Columns with few distinct values; ids and encodings gain nothing from a dictionary."""


class DatasetWriter:
    """One Parquet dataset (a directory of part files) written in batches.

    Parts are numbered in the order they are opened; `next_part` starts a new file,
    `discard_part` deletes the current one with its rows. A dataset with no rows at all still
    gets one empty part on `close`, so every reader finds the schema.
    """

    def __init__(
        self, directory: Path, table_schema: pa.Schema, name: str, *, first_part: int = 0
    ) -> None:
        self.directory = directory
        self.schema = table_schema
        self.rows = 0
        self._dictionary = _DICTIONARY_COLUMNS.get(name, [])
        self._part = first_part
        self._part_rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._files = 0
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def _path(self) -> Path:
        return self.directory / f"part-{self._part:05d}.parquet"

    def write(self, table: pa.Table | pa.RecordBatch) -> None:
        if table.num_rows == 0:
            return
        if self._writer is None:
            self._writer = pq.ParquetWriter(
                self._path,
                self.schema,
                compression="snappy",
                use_dictionary=self._dictionary,
            )
            self._files += 1
        if isinstance(table, pa.RecordBatch):
            self._writer.write_batch(table)
        else:
            self._writer.write_table(table)
        self.rows += table.num_rows
        self._part_rows += table.num_rows

    def write_rows(self, columns: dict[str, list[Any]]) -> None:
        self.write(pa.Table.from_pydict(columns, schema=self.schema))

    def next_part(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._part += 1
        self._part_rows = 0

    def discard_part(self) -> None:
        """Delete the current part and forget its rows."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._path.unlink()
            self._files -= 1
        self.rows -= self._part_rows
        self._part_rows = 0

    def close(self) -> None:
        self.next_part()
        if self._files == 0:
            pq.write_table(self.schema.empty_table(), self._path, compression="snappy")
            self._files = 1


def prepare_output(out: Path, names: Iterable[str]) -> None:
    """Create `out`, refusing to mix a new dataset with the files of an old one."""
    taken = [name for name in names if (out / name).exists()]
    if taken:
        raise BadRequest(f"{out} already holds {', '.join(taken)}: choose a new directory")
    out.mkdir(parents=True, exist_ok=True)


def write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class MetadataPart:
    """What the export of one range of ledger ids found (or of several, added up)."""

    ledgers: int = 0
    segments: int = 0
    unreadable_ledgers: int = 0
    tombstones: int = 0
    unreadable_tombstones: int = 0
    underreplicated: int = 0
    named: frozenset[str] = frozenset()
    """Bookies some ensemble of the range names."""

    def __add__(self, other: MetadataPart) -> MetadataPart:
        counts = {
            f.name: getattr(self, f.name) + getattr(other, f.name)
            for f in fields(self)
            if f.name != "named"
        }
        return MetadataPart(**counts, named=self.named | other.named)


@dataclass(frozen=True)
class BookieDump:
    """One bookie's dump: the rows written, or why it did not respond (its part deleted)."""

    bookie_id: str
    rows: int
    failure: str | None = None


@dataclass(frozen=True)
class Registered:
    """The bookies the registry lists when the metadata has been exported, with addresses."""

    available: AvailableBookies
    placements: dict[str, BookiePlacement]
    addresses: dict[str, str]
    unreachable: dict[str, str]
    """Registered bookies whose address could not be read, with why."""

    @property
    def bookies(self) -> list[str]:
        return sorted(self.available.writable | self.available.read_only)


async def take_snapshot(
    metadata_uri: str,
    out: Path,
    *,
    progress: Progress | None = None,
    config: AuditConfig | None = None,
) -> dict[str, Any]:
    """Export the cluster at `metadata_uri` into `out` in this process; returns
    snapshot.json's content.

    The config's `snapshot_bookie_timeout` bounds the wait for each frame of a bookie's
    dump (and for its connection): a bookie silent for longer counts as not responding.
    """
    config = config or AuditConfig()
    report = progress or _no_progress
    prepare_output(out, schema.SNAPSHOT_PARTS)
    created_ms = int(time.time() * 1000)
    async with open_store(metadata_uri, session_timeout=config.snapshot_session_timeout) as store:
        cluster = await require_cluster(store, uri=metadata_uri)
        settings = await read_settings(store)
        found = await export_metadata_range(store, out, 0, None, report)
        registered = await registered_bookies(store)
    limit = asyncio.Semaphore(DUMP_CONCURRENCY)

    async def dump(number: int, bookie: str) -> BookieDump:
        async with limit:
            return await dump_bookie(registered, bookie, out, number, config, report)

    dumps = await asyncio.gather(*(dump(n, b) for n, b in enumerate(registered.bookies)))
    return finish_snapshot(
        out,
        metadata_uri=metadata_uri,
        instance_id=cluster.instance_id,
        created_ms=created_ms,
        settings=settings.to_dict(),
        found=found,
        registered=registered,
        dumps=dumps,
    )


async def ledgers_allocated(metadata_uri: str, config: AuditConfig) -> int:
    """The ledger ids the cluster has handed out: what chooses how to take its snapshot."""
    async with open_store(metadata_uri, session_timeout=config.snapshot_session_timeout) as store:
        await require_cluster(store, uri=metadata_uri)
        return await LedgerManager(store).ids_allocated()


async def registered_bookies(store: MetadataStore) -> Registered:
    """The registry's bookies now, their placements, and where to reach each."""
    registry = BookieRegistry(store)
    available = await registry.available_bookies()
    placements = await registry.placements()
    addresses: dict[str, str] = {}
    unreachable: dict[str, str] = {}

    async def read(bookie: str) -> None:
        try:
            registration = await registry.registration(bookie)
        except TallyError as error:
            unreachable[bookie] = f"{type(error).__name__}: {error}"
            return
        if registration is None:
            unreachable[bookie] = "BookieUnavailable: unregistered before it was asked"
        else:
            addresses[bookie] = registration.info.address

    await asyncio.gather(*(read(bookie) for bookie in available.writable | available.read_only))
    return Registered(available, placements, addresses, unreachable)


async def export_metadata_range(
    store: MetadataStore, out: Path, number: int, within: Subtree | None, report: Progress
) -> MetadataPart:
    """Write the ledgers, segments and tombstones of the ids `within` (all: None) as part
    `number` of each table. The marks go first, then the ledgers, then the tombstones."""
    marks = {
        mark.ledger_id: mark.first_marked_ms
        async for mark in UnderReplicationManager(store).list_under_replicated(within=within)
    }
    bad = _part(out, schema.UNREADABLE, schema.UNREADABLE_SCHEMA, number)
    named, ledgers, segments, unreadable = await _export_ledgers(
        LedgerManager(store), marks, out, number, within, bad, report
    )
    tombstones, unreadable_tombstones = await _export_tombstones(
        store, out, number, within, bad, report
    )
    bad.close()
    return MetadataPart(
        ledgers, segments, unreadable, tombstones, unreadable_tombstones, len(marks), named
    )


def finish_snapshot(
    out: Path,
    *,
    metadata_uri: str,
    instance_id: str,
    created_ms: int,
    settings: dict[str, Any],
    found: MetadataPart,
    registered: Registered,
    dumps: Iterable[BookieDump],
) -> dict[str, Any]:
    """Write bookies/ and snapshot.json once the exports are done; snapshot.json's content."""
    failures = dict(registered.unreachable)
    availability_rows = 0
    for dumped in dumps:
        availability_rows += dumped.rows
        if dumped.failure is not None:
            failures[dumped.bookie_id] = dumped.failure
    if availability_rows == 0:
        _part(out, schema.AVAILABILITY, schema.AVAILABILITY_SCHEMA, 0).close()
    rows = _bookie_rows(found.named, registered.available, registered.placements, failures)
    bookies = DatasetWriter(out / schema.BOOKIES, schema.BOOKIES_SCHEMA, schema.BOOKIES)
    bookies.write_rows(rows)
    bookies.close()
    summary: dict[str, Any] = {
        "format_version": schema.FORMAT_VERSION,
        "created_ms": created_ms,
        "cluster": {"metadata": metadata_uri, "instance_id": instance_id},
        "tool": {"name": "tally", "version": __version__},
        schema.CLUSTER_SETTINGS: settings,
        "counts": {
            "ledgers": found.ledgers,
            "segments": found.segments,
            "unreadable_ledgers": found.unreadable_ledgers,
            "tombstones": found.tombstones,
            "unreadable_tombstones": found.unreadable_tombstones,
            "underreplicated": found.underreplicated,
            "bookies": len(rows["bookie_id"]),
            "bookies_registered": len(registered.bookies),
            "bookies_responded": sum(rows["responded"]),
            "availability": availability_rows,
        },
        "unresponsive_bookies": failures,
    }
    write_json(out / schema.SNAPSHOT_JSON, summary)
    return summary


def _bookie_rows(
    named: frozenset[str],
    available: AvailableBookies,
    placements: dict[str, BookiePlacement],
    failures: dict[str, str],
) -> dict[str, list[Any]]:
    """Every bookie registered or named by an ensemble; only registered ones were asked."""
    rows: dict[str, list[Any]] = empty_rows(schema.BOOKIES_SCHEMA)
    for bookie in sorted(available.writable | available.read_only | named):
        if bookie in available.writable:
            state = schema.BookieState.WRITABLE
        elif bookie in available.read_only:
            state = schema.BookieState.READONLY
        else:
            state = schema.BookieState.UNREGISTERED
        placement = placements.get(bookie)
        rows["bookie_id"].append(bookie)
        rows["rack"].append(placement.rack if placement is not None else DEFAULT_RACK)
        rows["state"].append(state.value)
        rows["responded"].append(
            state is not schema.BookieState.UNREGISTERED and bookie not in failures
        )
    return rows


def _no_progress(stage: str, done: int, total: int | None) -> None:
    """Progress goes nowhere unless the caller shows it."""


async def _export_ledgers(
    manager: LedgerManager,
    marks: dict[LedgerId, int],
    out: Path,
    number: int,
    within: Subtree | None,
    bad: DatasetWriter,
    report: Progress,
) -> tuple[frozenset[str], int, int, int]:
    """Write part `number` of ledgers/ and segments/, and to `bad` the metadata that does not
    decode; (bookies named by any ensemble, ledgers, segments, ledgers whose metadata does
    not decode)."""
    ledgers = _part(out, schema.LEDGERS, schema.LEDGERS_SCHEMA, number)
    segments = _part(out, schema.SEGMENTS, schema.SEGMENTS_SCHEMA, number)
    named: set[str] = set()
    unreadable = 0
    ledger_rows = empty_rows(schema.LEDGERS_SCHEMA)
    segment_rows = empty_rows(schema.SEGMENTS_SCHEMA)
    async for page in manager.ledger_pages(LEDGER_PAGE, within):
        _write_unreadable(bad, "ledger", [(u.ledger_id, u.path, u.error) for u in page.unreadable])
        unreadable += len(page.unreadable)
        for record in page.ledgers:
            _ledger_rows(record, marks.get(record.ledger_id), ledger_rows, segment_rows, named)
        if len(segment_rows["ensemble"]) >= ROW_BATCH:
            ledgers.write_rows(ledger_rows)
            segments.write_rows(segment_rows)
            ledger_rows = empty_rows(schema.LEDGERS_SCHEMA)
            segment_rows = empty_rows(schema.SEGMENTS_SCHEMA)
        report("ledgers", ledgers.rows + len(ledger_rows["ledger_id"]), None)
    ledgers.write_rows(ledger_rows)
    segments.write_rows(segment_rows)
    ledgers.close()
    segments.close()
    return frozenset(named), ledgers.rows, segments.rows, unreadable


def _part(out: Path, name: str, table_schema: pa.Schema, number: int) -> DatasetWriter:
    return DatasetWriter(out / name, table_schema, name, first_part=number)


def empty_rows(table_schema: pa.Schema) -> dict[str, list[Any]]:
    """Rows of `table_schema` to fill: an empty list per column."""
    return {name: [] for name in table_schema.names}


def _ledger_rows(
    record: LedgerRecord,
    marked_ms: int | None,
    ledgers: dict[str, list[Any]],
    segments: dict[str, list[Any]],
    named: set[str],
) -> None:
    metadata = record.metadata
    scope = schema.to_int64(record.ledger_id.scope)
    ledger_id = schema.to_int64(record.ledger_id.id)
    for name, value in (
        ("scope", scope),
        ("ledger_id", ledger_id),
        ("state", metadata.state.name),
        ("ensemble_size", metadata.ensemble_size),
        ("write_quorum", metadata.write_quorum),
        ("ack_quorum", metadata.ack_quorum),
        ("last_entry_id", metadata.last_entry_id),
        ("length", metadata.length),
        ("ctime_ms", metadata.ctime_ms),
        ("digest_type", metadata.digest_type.name),
        ("underreplicated_since_ms", marked_ms),
        ("archived", metadata.archived),
        ("deleted_ms", None if metadata.deletion is None else metadata.deletion.time_ms),
        ("metadata", metadata.to_bytes()),
    ):
        ledgers[name].append(value)
    for index, (segment, first, last) in enumerate(metadata.segments_with_bounds()):
        segments["scope"].append(scope)
        segments["ledger_id"].append(ledger_id)
        segments["segment_index"].append(index)
        segments["first_entry_id"].append(first)
        segments["last_entry_id"].append(-1 if last is None else last)
        segments["ensemble"].append(list(segment.ensemble))
        named.update(segment.ensemble)


def _write_unreadable(
    bad: DatasetWriter, record: str, found: Iterable[tuple[LedgerId | None, str, Exception]]
) -> None:
    """Log each record that does not decode, and write a row of those under a ledger's key
    (a key that names no ledger is only logged and counted)."""
    rows = empty_rows(schema.UNREADABLE_SCHEMA)
    for ledger_id, path, error in found:
        log.error("snapshot: %s: %s", path, error)
        if ledger_id is None:
            continue
        for name, value in (
            ("scope", schema.to_int64(ledger_id.scope)),
            ("ledger_id", schema.to_int64(ledger_id.id)),
            ("record", record),
            ("path", path),
            ("error", str(error)),
        ):
            rows[name].append(value)
    bad.write_rows(rows)


def _tombstone_key(path: str) -> LedgerId | None:
    try:
        return TOMBSTONE_RECORDS.ledger_id(path)
    except BadRequest:
        return None


async def _export_tombstones(
    store: MetadataStore,
    out: Path,
    number: int,
    within: Subtree | None,
    bad: DatasetWriter,
    report: Progress,
) -> tuple[int, int]:
    """Write part `number` of tombstones/, and to `bad` the tombstones that do not decode;
    (tombstones, tombstones that do not decode)."""
    writer = _part(out, schema.TOMBSTONES, schema.TOMBSTONES_SCHEMA, number)
    unreadable = 0
    async for page in tombstone_pages(store, LEDGER_PAGE, within):
        _write_unreadable(
            bad, "tombstone", [(_tombstone_key(path), path, e) for path, e in page.unreadable]
        )
        unreadable += len(page.unreadable)
        rows = empty_rows(schema.TOMBSTONES_SCHEMA)
        for found in page.tombstones:
            add_tombstone_row(rows, found.ledger_id, found.tombstone)
        writer.write_rows(rows)
        report("tombstones", writer.rows, None)
    writer.close()
    return writer.rows, unreadable


def add_tombstone_row(
    rows: dict[str, list[Any]], ledger_id: LedgerId, tombstone: Tombstone
) -> None:
    """Append the tombstone's row of TOMBSTONES_SCHEMA to `rows` (lists by column)."""
    deletion = tombstone.deletion
    for name, value in (
        ("scope", schema.to_int64(ledger_id.scope)),
        ("ledger_id", schema.to_int64(ledger_id.id)),
        ("deleted_ms", deletion.time_ms),
        ("reason", deletion.reason),
        ("violations", deletion.violations),
        ("check_detail", deletion.detail),
        ("tombstoned_ms", tombstone.tombstoned_ms),
        ("last_entry_id", tombstone.last_entry_id),
        ("length", tombstone.length),
        ("bookies", list(tombstone.bookies)),
        ("acknowledged_ms", list(tombstone.bookies.values())),
    ):
        rows[name].append(value)


async def dump_bookie(
    registered: Registered,
    bookie: str,
    out: Path,
    number: int,
    config: AuditConfig,
    report: Progress,
) -> BookieDump:
    """Stream one bookie's AVAILABILITY_DUMP into part `number` of availability/, ROW_BATCH
    rows at a time. A bookie that cannot be reached, or whose dump fails midway, has its part
    deleted and is recorded as not responding: a partial dump never passes for a bookie that
    lost entries. Never retried here: a silent bookie costs one timeout."""
    address = registered.addresses.get(bookie)
    if address is None:
        return BookieDump(bookie, 0, registered.unreachable.get(bookie, "no address"))
    writer = _part(out, schema.AVAILABILITY, schema.AVAILABILITY_SCHEMA, number)
    try:
        await _dump_bookie(address, bookie, writer, config, report)
    except TallyError as error:
        log.warning("snapshot: bookie %s did not respond: %s", bookie, error)
        writer.discard_part()
        return BookieDump(bookie, 0, f"{type(error).__name__}: {error}")
    writer.next_part()
    return BookieDump(bookie, writer.rows)


async def _dump_bookie(
    address: str, bookie: str, writer: DatasetWriter, config: AuditConfig, report: Progress
) -> None:
    stage = f"bookie {bookie}"
    timeout = config.snapshot_bookie_timeout
    connection = await BookieConnection.connect(
        address, connect_timeout=timeout, request_timeout=timeout
    )
    done = 0
    batch = empty_rows(schema.AVAILABILITY_SCHEMA)
    report(stage, 0, None)
    try:
        async with contextlib.aclosing(connection.availability_dump()) as stream:
            async for record in stream:
                batch["bookie_id"].append(bookie)
                batch["scope"].append(schema.to_int64(record.ledger_id.scope))
                batch["ledger_id"].append(schema.to_int64(record.ledger_id.id))
                batch["availability"].append(record.availability)
                if len(batch["availability"]) >= ROW_BATCH:
                    writer.write_rows(batch)
                    done += len(batch["availability"])
                    batch = empty_rows(schema.AVAILABILITY_SCHEMA)
                    report(stage, done, None)
    finally:
        await connection.close()
    writer.write_rows(batch)
    report(stage, done + len(batch["availability"]), done + len(batch["availability"]))
