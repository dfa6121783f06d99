"""Writing a synthetic snapshot: healthy chunks with the fault ledgers among them, in ledger
order, into the snapshot's Parquet datasets (a tombstoned fault ledger as a tombstone row),
then the bookies, truth.json and snapshot.json."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tally.audit import schema
from tally.audit.snapshot import (
    DatasetWriter,
    Progress,
    add_tombstone_row,
    empty_rows,
    prepare_output,
    write_json,
)
from tally.audit.synth.cluster import Cluster
from tally.audit.synth.faults import LEDGER_FAULTS, FaultLedger, Injector, parse_faults
from tally.audit.synth.healthy import Patterns, healthy_chunk
from tally.audit.synth.truth import (
    MIN_RACKS,
    NOW_MS,
    SETTINGS,
    UNREPORTED,
    ledger_key,
    write_truth,
)
from tally.core.availability import EntryAvailability
from tally.core.errors import BadRequest
from tally.core.ids import LedgerId
from tally.core.ledger_audit import Category
from tally.version import __version__

CHUNK_LEDGERS = 100_000
"""Ledgers generated at once: bounds memory and is one row group."""
PART_LEDGERS = 2_500_000
"""Ledgers per Parquet part: a few files per dataset, each of many row groups."""


def synthesize(
    out: Path,
    *,
    ledgers: int,
    bookies: int,
    racks: int,
    faults: str = "",
    seed: int = 0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Write a synthetic snapshot and its truth.json into `out`; returns snapshot.json."""
    if ledgers < 0 or seed < 0:
        raise BadRequest(f"ledgers and seed must be >= 0, got {ledgers} and {seed}")
    wanted = parse_faults(faults)
    rng = random.Random(seed)
    cluster = Cluster.make(
        bookies, racks, wanted.get(Category.UNRESPONSIVE_REGISTERED_BOOKIE.value, 0), rng
    )
    kinds = [kind for kind in LEDGER_FAULTS for _ in range(wanted.get(kind, 0))]
    if len(kinds) > ledgers:
        raise BadRequest(f"{len(kinds)} fault ledgers do not fit in {ledgers} ledgers")
    fault_at = dict(zip(rng.sample(range(ledgers), len(kinds)), kinds, strict=True))
    orphan_count = wanted.get(Category.ORPHAN_DATA.value, 0)
    orphans = rng.sample(range(max(ledgers, orphan_count)), orphan_count)
    injector = Injector(cluster, rng)
    for kind in set(kinds):
        injector.eligible(kind)
    patterns = Patterns.of(cluster.mixes)

    prepare_output(out, [*schema.SNAPSHOT_PARTS, schema.TRUTH_JSON])
    writers = {
        name: DatasetWriter(out / name, table_schema, name)
        for name, table_schema in (
            (schema.LEDGERS, schema.LEDGERS_SCHEMA),
            (schema.SEGMENTS, schema.SEGMENTS_SCHEMA),
            (schema.AVAILABILITY, schema.AVAILABILITY_SCHEMA),
            (schema.TOMBSTONES, schema.TOMBSTONES_SCHEMA),
            (schema.UNREADABLE, schema.UNREADABLE_SCHEMA),
        )
    }
    truth: dict[str, list[str]] = {category.value: [] for category in Category}
    unreported: dict[str, list[str]] = {key: [] for key in UNREPORTED}
    report = progress or (lambda stage, done, total: None)
    for start in range(0, ledgers, CHUNK_LEDGERS):
        if start and start % PART_LEDGERS == 0:
            for writer in writers.values():
                writer.next_part()
        count = min(CHUNK_LEDGERS, ledgers - start)
        here = {i: kind for i, kind in fault_at.items() if start <= i < start + count}
        chunk = healthy_chunk(
            np.random.default_rng([seed, start]), start, count, cluster, patterns, set(here)
        )
        truth[Category.POTENTIALLY_FAULTY.value] += chunk.potentially_faulty
        tables = {
            schema.LEDGERS: [chunk.ledgers],
            schema.SEGMENTS: [chunk.segments],
            schema.AVAILABILITY: [chunk.availability],
            schema.TOMBSTONES: [schema.TOMBSTONES_SCHEMA.empty_table()],
        }
        for i, kind in sorted(here.items()):
            ledger = injector.build(kind, i)
            key = ledger_key(schema.to_int64(ledger.scope), schema.to_int64(ledger.ledger_id))
            (unreported[kind] if kind in unreported else truth[kind]).append(key)
            for name, rows in zip(tables, _rows(ledger), strict=True):
                tables[name].append(pa.Table.from_pydict(rows, schema=writers[name].schema))
        for name, parts in tables.items():
            writers[name].write(pa.concat_tables(parts).combine_chunks())
        report("ledgers", start + count, ledgers)
    for index in orphans:
        held = injector.orphan()
        truth[Category.ORPHAN_DATA.value].append(ledger_key(0, 2 * index + 1))
        writers[schema.AVAILABILITY].write_rows(_availability_rows(0, 2 * index + 1, held))
    for writer in writers.values():
        writer.close()
    truth[Category.UNRESPONSIVE_REGISTERED_BOOKIE.value] = [
        cluster.names[b] for b in cluster.unresponsive
    ]
    bookie_rows = _bookie_rows(cluster)
    bookies_writer = DatasetWriter(out / schema.BOOKIES, schema.BOOKIES_SCHEMA, schema.BOOKIES)
    bookies_writer.write_rows(bookie_rows)
    bookies_writer.close()

    params = {
        "ledgers": ledgers,
        "bookies": bookies,
        "racks": racks,
        "faults": wanted,
        "seed": seed,
        "min_racks": MIN_RACKS,
        "cluster_racks": racks,
    }
    write_truth(out, truth, unreported, params)
    summary = {
        "format_version": schema.FORMAT_VERSION,
        "created_ms": NOW_MS,
        "cluster": {"metadata": "synthetic", "instance_id": f"synthetic-seed-{seed}"},
        "tool": {"name": "tally", "version": __version__},
        schema.CLUSTER_SETTINGS: SETTINGS.to_dict(),
        "counts": {
            "ledgers": writers[schema.LEDGERS].rows,
            "segments": writers[schema.SEGMENTS].rows,
            "tombstones": writers[schema.TOMBSTONES].rows,
            "bookies": bookies,
            "bookies_responded": bookies - len(cluster.unresponsive),
            "availability": writers[schema.AVAILABILITY].rows,
        },
        "synthetic": params,
    }
    write_json(out / schema.SNAPSHOT_JSON, summary)
    return summary


def _rows(
    ledger: FaultLedger,
) -> tuple[dict[str, list[Any]], dict[str, list[Any]], dict[str, list[Any]], dict[str, list[Any]]]:
    """The ledger's rows of ledgers/, segments/, availability/ and tombstones/: a tombstoned
    ledger has no metadata left, only its tombstone."""
    metadata = ledger.metadata
    scope, ledger_id = schema.to_int64(ledger.scope), schema.to_int64(ledger.ledger_id)
    held = _availability_rows(scope, ledger_id, ledger.held)
    if ledger.tombstone is not None:
        tombstones = empty_rows(schema.TOMBSTONES_SCHEMA)
        add_tombstone_row(tombstones, LedgerId(ledger.scope, ledger.ledger_id), ledger.tombstone)
        return (
            empty_rows(schema.LEDGERS_SCHEMA),
            empty_rows(schema.SEGMENTS_SCHEMA),
            held,
            tombstones,
        )
    ledgers: dict[str, list[Any]] = {
        "scope": [scope],
        "ledger_id": [ledger_id],
        "state": [metadata.state.name],
        "ensemble_size": [metadata.ensemble_size],
        "write_quorum": [metadata.write_quorum],
        "ack_quorum": [metadata.ack_quorum],
        "last_entry_id": [metadata.last_entry_id],
        "length": [metadata.length],
        "ctime_ms": [metadata.ctime_ms],
        "digest_type": [metadata.digest_type.name],
        "underreplicated_since_ms": [ledger.underreplicated_since_ms],
        "archived": [metadata.archived],
        "deleted_ms": [None if metadata.deletion is None else metadata.deletion.time_ms],
        "metadata": [None],  # a healthy chunk's ledgers have none either
    }
    bounds = metadata.segment_bounds()
    firsts = [first for first, _ in bounds]
    if ledger.invalid:
        firsts[0] = 1
    segments: dict[str, list[Any]] = {
        "scope": [scope] * len(bounds),
        "ledger_id": [ledger_id] * len(bounds),
        "segment_index": list(range(len(bounds))),
        "first_entry_id": firsts,
        "last_entry_id": [last for _, last in bounds],
        "ensemble": [list(segment.ensemble) for segment in metadata.segments],
    }
    return ledgers, segments, held, empty_rows(schema.TOMBSTONES_SCHEMA)


def _availability_rows(
    scope: int, ledger_id: int, held: dict[str, EntryAvailability]
) -> dict[str, list[Any]]:
    bookies = sorted(held)
    return {
        "bookie_id": bookies,
        "scope": [scope] * len(bookies),
        "ledger_id": [ledger_id] * len(bookies),
        "availability": [held[b].to_bytes() for b in bookies],
    }


def _bookie_rows(cluster: Cluster) -> dict[str, list[Any]]:
    states = [
        schema.BookieState.READONLY.value
        if b in cluster.readonly
        else schema.BookieState.WRITABLE.value
        for b in range(cluster.bookies)
    ]
    return {
        "bookie_id": cluster.names,
        "rack": [cluster.rack_names[cluster.rack_of(b)] for b in range(cluster.bookies)],
        "state": states,
        "responded": [b not in cluster.unresponsive for b in range(cluster.bookies)],
    }
