"""The healthy majority of a synthetic snapshot, a chunk of ledgers at a time, with numpy and
no Python step per ledger, so that snapshots of tens of millions of ledgers can be made.

Heavy-tailed sizes (most ledgers small, some of 10^7 entries), the cluster's quorum mixes,
about three segments per ledger whose ensemble changes replace one or two bookies, a few
open ledgers and empty closed ones, and ensembles on the mixes' strict rack patterns. A
bookie keeps its ensemble position while it stays in a ledger, so what it holds is one
`expected_entries` range, encoded by `expected_encodings`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from tally.audit import schema
from tally.audit.synth.cluster import MAX_ENSEMBLE, Cluster, Mix
from tally.audit.synth.encodings import expected_encodings
from tally.audit.synth.truth import MAX_AGE_MS, NOW_MS, ledger_key
from tally.core.availability import Int64Array

MAX_SEGMENTS = 6
MAX_ENTRIES = 10_000_000
SIZE_SCALE = 1.15
"""Ledger sizes are 10^x entries with x exponential of this mean (median ~6, 0.2% at 10^7)."""
MEAN_ENSEMBLE_CHANGES = 2.0
SECOND_REPLACEMENT = 0.3
"""Chance that an ensemble change replaces two bookies rather than one."""
SCOPED_SHARE = 0.05
OPEN_SHARE = 0.004
RECOVERY_SHARE = 0.001
EMPTY_SHARE = 0.003
DIGESTS = (("CRC32C", 0.85), ("CRC32", 0.10), ("HMAC", 0.05))


@dataclass(frozen=True)
class Patterns:
    """Every mix's patterns in flat tables, for choosing per ledger with numpy."""

    ensemble_size: Int64Array
    write_quorum: Int64Array
    ack_quorum: Int64Array
    weights: npt.NDArray[np.float64]
    first: Int64Array
    count: Int64Array
    colour: Int64Array
    """(pattern, position) -> colour, -1 past E."""
    occurrence: Int64Array
    """(pattern, position) -> how many earlier positions have the same colour."""
    uses: Int64Array
    """(pattern, colour) -> positions of that colour."""

    @classmethod
    def of(cls, mixes: tuple[Mix, ...]) -> Patterns:
        flat = [pattern for mix in mixes for pattern in mix.patterns]
        colour = np.full((len(flat), MAX_ENSEMBLE), -1, np.int64)
        occurrence = np.zeros((len(flat), MAX_ENSEMBLE), np.int64)
        uses = np.zeros((len(flat), MAX_ENSEMBLE), np.int64)
        for row, pattern in enumerate(flat):
            for position, c in enumerate(pattern):
                colour[row, position] = c
                occurrence[row, position] = pattern[:position].count(c)
                uses[row, c] += 1
        counts = np.array([len(mix.patterns) for mix in mixes], np.int64)
        weights = np.array([mix.weight for mix in mixes])
        return cls(
            np.array([mix.ensemble_size for mix in mixes], np.int64),
            np.array([mix.write_quorum for mix in mixes], np.int64),
            np.array([mix.ack_quorum for mix in mixes], np.int64),
            weights / weights.sum(),
            np.cumsum(counts) - counts,
            counts,
            colour,
            occurrence,
            uses,
        )


@dataclass
class Chunk:
    """A chunk's rows of the three ledger datasets, and its closed ledgers that touch a
    bookie that did not answer (potentially_faulty in truth.json)."""

    ledgers: pa.Table
    segments: pa.Table
    availability: pa.Table
    potentially_faulty: list[str]


@dataclass(frozen=True)
class _Shape:
    """A chunk of healthy ledgers as arrays: per ledger, per (ledger, segment) and per
    (ledger, segment, position)."""

    keep: npt.NDArray[np.bool_]
    """Not a fault ledger (those are built apart)."""
    scope: Int64Array
    ledger_id: Int64Array
    state: npt.NDArray[np.int8]
    """0 CLOSED, 1 OPEN, 2 IN_RECOVERY."""
    ensemble_size: Int64Array
    write_quorum: Int64Array
    ack_quorum: Int64Array
    entries: Int64Array
    """Entries written; a closed ledger's last entry id is entries - 1."""
    segment_count: Int64Array
    first: Int64Array
    last: Int64Array
    """Of the entries written, for open ledgers too."""
    ensembles: Int64Array

    @property
    def closed(self) -> npt.NDArray[np.bool_]:
        return np.equal(self.state, 0)

    @property
    def segment_valid(self) -> npt.NDArray[np.bool_]:
        return np.arange(MAX_SEGMENTS)[None, :] < self.segment_count[:, None]

    @property
    def position_valid(self) -> npt.NDArray[np.bool_]:
        return np.arange(MAX_ENSEMBLE)[None, :] < self.ensemble_size[:, None]


def healthy_chunk(
    rng: np.random.Generator,
    start: int,
    count: int,
    cluster: Cluster,
    patterns: Patterns,
    skip: set[int],
) -> Chunk:
    """Ledgers start .. start+count-1, except those in `skip` (the fault ledgers)."""
    shape = _shape(rng, start, count, cluster, patterns, skip)
    silent = np.zeros(cluster.bookies, dtype=bool)
    silent[list(cluster.unresponsive)] = True
    touches = silent[np.maximum(shape.ensembles, 0)] & shape.position_valid[:, None, :]
    faulty = (
        shape.keep
        & shape.closed
        & (shape.entries > 0)
        & (touches.any(axis=2) & shape.segment_valid).any(axis=1)
    )
    names = pa.array(cluster.names)
    return Chunk(
        _ledger_table(rng, shape),
        _segment_table(shape, names),
        _availability_table(shape, names, silent),
        [
            ledger_key(s, i)
            for s, i in zip(
                shape.scope[faulty].tolist(), shape.ledger_id[faulty].tolist(), strict=True
            )
        ],
    )


def _shape(
    rng: np.random.Generator,
    start: int,
    count: int,
    cluster: Cluster,
    patterns: Patterns,
    skip: set[int],
) -> _Shape:
    index = np.arange(start, start + count, dtype=np.int64)
    scoped = rng.random(count) < SCOPED_SHARE
    random_halves = rng.integers(0, 2**64 - 1, (2, count), dtype=np.uint64, endpoint=True)
    kind = rng.random(count)
    state = np.where(kind < OPEN_SHARE, 1, np.where(kind < OPEN_SHARE + RECOVERY_SHARE, 2, 0))
    empty = (state == 0) & (kind < OPEN_SHARE + RECOVERY_SHARE + EMPTY_SHARE)
    mix = rng.choice(len(patterns.weights), count, p=patterns.weights)
    sizes = np.minimum(10 ** rng.exponential(SIZE_SCALE, count), MAX_ENTRIES)
    entries = np.ceil(sizes).astype(np.int64)  # capped first: past int64 a cast wraps around
    entries[empty] = 0
    segment_count = np.minimum(
        1 + np.minimum(rng.poisson(MEAN_ENSEMBLE_CHANGES, count), MAX_SEGMENTS - 1),
        np.maximum(entries, 1),
    )
    first, last = _segment_bounds(rng, entries, segment_count)
    keep = np.ones(count, dtype=bool)
    keep[[i - start for i in skip]] = False
    ensemble_size = patterns.ensemble_size[mix]
    return _Shape(
        keep=keep,
        scope=np.where(scoped, random_halves[0] | np.uint64(1), 0).view(np.int64),
        ledger_id=np.where(scoped, random_halves[1].view(np.int64), 2 * index),
        state=state.astype(np.int8),
        ensemble_size=ensemble_size,
        write_quorum=patterns.write_quorum[mix],
        ack_quorum=patterns.ack_quorum[mix],
        entries=entries,
        segment_count=segment_count,
        first=first,
        last=last,
        ensembles=_ensembles(rng, cluster, patterns, mix, ensemble_size, segment_count),
    )


def _ledger_table(rng: np.random.Generator, shape: _Shape) -> pa.Table:
    count, keep, closed = len(shape.keep), shape.keep, shape.closed
    return pa.table(
        {
            "scope": shape.scope[keep],
            "ledger_id": shape.ledger_id[keep],
            "state": _labels(shape.state[keep], ["CLOSED", "OPEN", "IN_RECOVERY"]),
            "ensemble_size": shape.ensemble_size[keep].astype(np.int32),
            "write_quorum": shape.write_quorum[keep].astype(np.int32),
            "ack_quorum": shape.ack_quorum[keep].astype(np.int32),
            "last_entry_id": np.where(closed, shape.entries - 1, -1)[keep],
            "length": np.where(closed, shape.entries * rng.integers(64, 4096, count), 0)[keep],
            "ctime_ms": (NOW_MS - rng.integers(60_000, MAX_AGE_MS, count))[keep],
            "digest_type": _labels(
                rng.choice(len(DIGESTS), count, p=[share for _, share in DIGESTS])[keep],
                [name for name, _ in DIGESTS],
            ),
            "underreplicated_since_ms": pa.nulls(int(keep.sum()), pa.int64()),
            "archived": np.zeros(int(keep.sum()), np.bool_),
            "deleted_ms": pa.nulls(int(keep.sum()), pa.int64()),
            "metadata": pa.nulls(int(keep.sum()), pa.binary()),
        },
        schema=schema.LEDGERS_SCHEMA,
    )


def _segment_table(shape: _Shape, names: pa.Array) -> pa.Table:
    """An open ledger's last segment has no end yet: its last entry id is -1."""
    ledger, segment = np.nonzero(shape.segment_valid & shape.keep[:, None])
    last = shape.last.copy()
    tail = np.arange(len(last)), shape.segment_count - 1
    last[tail] = np.where(shape.closed, last[tail], -1)
    members = shape.ensembles[ledger, segment][shape.position_valid[ledger]]
    offsets = np.concatenate([[0], np.cumsum(shape.ensemble_size[ledger])]).astype(np.int32)
    return pa.table(
        {
            "scope": shape.scope[ledger],
            "ledger_id": shape.ledger_id[ledger],
            "segment_index": segment.astype(np.int32),
            "first_entry_id": shape.first[ledger, segment],
            "last_entry_id": last[ledger, segment],
            "ensemble": pa.ListArray.from_arrays(pa.array(offsets), names.take(pa.array(members))),
        },
        schema=schema.SEGMENTS_SCHEMA,
    )


def _availability_table(shape: _Shape, names: pa.Array, silent: npt.NDArray[np.bool_]) -> pa.Table:
    """What every answering bookie holds: exactly its schedule (nothing of empty ledgers)."""
    ledger, bookie, first, last, position = _held_ranges(
        shape.ensembles,
        shape.first,
        shape.last,
        shape.segment_valid,
        shape.position_valid,
        shape.keep & (shape.entries > 0),
    )
    answering = ~silent[bookie]
    ledger, bookie = ledger[answering], bookie[answering]
    encodings, holders = expected_encodings(
        first[answering],
        last[answering],
        shape.ensemble_size[ledger],
        shape.write_quorum[ledger],
        position[answering],
    )
    owner = ledger[holders]
    return pa.table(
        {
            "bookie_id": names.take(pa.array(bookie[holders])),
            "scope": shape.scope[owner],
            "ledger_id": shape.ledger_id[owner],
            "availability": encodings,
        },
        schema=schema.AVAILABILITY_SCHEMA,
    )


def _labels(codes: npt.NDArray[np.integer[Any]], names: list[str]) -> pa.Array:
    return pa.DictionaryArray.from_arrays(
        pa.array(codes.astype(np.int8)), pa.array(names)
    ).dictionary_decode()


def _segment_bounds(
    rng: np.random.Generator, entries: Int64Array, segment_count: Int64Array
) -> tuple[Int64Array, Int64Array]:
    """(first, last) entry per ledger and segment: every segment holds at least one entry
    (an empty ledger's only segment holds none: last = first - 1)."""
    count = len(entries)
    valid = np.arange(MAX_SEGMENTS)[None, :] < segment_count[:, None]
    weights = np.where(valid, rng.random((count, MAX_SEGMENTS)) + 0.1, 0.0)
    spare = np.maximum(entries - segment_count, 0)
    lengths = np.where(
        valid, 1 + np.floor(weights / weights.sum(axis=1, keepdims=True) * spare[:, None]), 0
    ).astype(np.int64)
    lengths[np.arange(count), segment_count - 1] += entries - lengths.sum(axis=1)
    first = np.cumsum(lengths, axis=1) - lengths
    return first, first + lengths - 1


def _ensembles(
    rng: np.random.Generator,
    cluster: Cluster,
    patterns: Patterns,
    mix: Int64Array,
    ensemble_size: Int64Array,
    segment_count: Int64Array,
) -> Int64Array:
    """(ledger, segment, position) -> bookie, -1 past E.

    The first ensemble follows a strict pattern on randomly chosen racks; the k-th bookie a
    ledger uses on a rack is (base + k) mod the rack's size, so bookies never repeat within
    a ledger. Each change replaces one or two positions by a new bookie of the same rack
    (the pattern stays strict); when a rack has no new bookie left, the position is kept.
    """
    count = len(mix)
    racks = cluster.racks
    colours = min(MAX_ENSEMBLE, racks)
    chosen = patterns.first[mix] + np.floor(rng.random(count) * patterns.count[mix]).astype(
        np.int64
    )
    colour = patterns.colour[chosen]
    valid = colour >= 0
    colour_rack = _distinct_draws(rng, count, racks, colours)
    rack = np.take_along_axis(colour_rack, np.maximum(colour, 0), axis=1)
    size = cluster.per_rack[colour_rack]
    base = np.floor(rng.random((count, colours)) * size).astype(np.int64)
    uses = patterns.uses[chosen][:, :colours]
    ordinal = patterns.occurrence[chosen]

    def bookie(rows: Int64Array, positions: Int64Array, ordinals: Int64Array) -> Int64Array:
        c = colour[rows, positions]
        k = (base[rows, c] + ordinals) % size[rows, c]
        return rack[rows, positions] + racks * k

    ensembles = np.full((count, MAX_SEGMENTS, MAX_ENSEMBLE), -1, np.int64)
    rows, positions = np.nonzero(valid)
    ensembles[rows, 0, positions] = bookie(rows, positions, ordinal[rows, positions])
    replaced = np.zeros((count, colours), np.int64)
    for segment in range(1, MAX_SEGMENTS):
        current = ensembles[:, segment - 1].copy()
        changing = segment_count > segment
        first_position = np.floor(rng.random(count) * ensemble_size).astype(np.int64)
        second_position = (
            first_position + 1 + np.floor(rng.random(count) * (ensemble_size - 1)).astype(np.int64)
        ) % ensemble_size
        twice = changing & (rng.random(count) < SECOND_REPLACEMENT)
        for position, change in ((first_position, changing), (second_position, twice)):
            rows = np.flatnonzero(change)
            positions = position[rows]
            c = colour[rows, positions]
            ordinals = uses[rows, c] + replaced[rows, c]
            fresh = ordinals < size[rows, c]
            rows, positions, c, ordinals = rows[fresh], positions[fresh], c[fresh], ordinals[fresh]
            current[rows, positions] = bookie(rows, positions, ordinals)
            replaced[rows, c] += 1
        ensembles[:, segment] = np.where(changing[:, None], current, -1)
    return ensembles


def _distinct_draws(
    rng: np.random.Generator, count: int, population: int, draws: int
) -> Int64Array:
    """`draws` distinct values of range(population) per row, in random order: the j-th is
    the t-th value not drawn yet, t uniform (the earlier draws are skipped in order)."""
    chosen = np.empty((count, draws), np.int64)
    for j in range(draws):
        pick = rng.integers(0, population - j, count)
        for earlier in np.sort(chosen[:, :j], axis=1).T:
            pick += pick >= earlier
        chosen[:, j] = pick
    return chosen


def _held_ranges(
    ensembles: Int64Array,
    first: Int64Array,
    last: Int64Array,
    segment_valid: npt.NDArray[np.bool_],
    position_valid: npt.NDArray[np.bool_],
    with_data: npt.NDArray[np.bool_],
) -> tuple[Int64Array, Int64Array, Int64Array, Int64Array, Int64Array]:
    """(ledger, bookie, first, last, position) per bookie of each ledger: a bookie stays at
    its position over consecutive segments, so what it holds is one range at one position."""
    by_position = ensembles.transpose(0, 2, 1)
    valid = position_valid[:, :, None] & segment_valid[:, None, :] & with_data[:, None, None]
    ledger, position, segment = np.nonzero(valid)
    bookie = by_position[valid]
    starts = np.ones(len(bookie), dtype=bool)
    starts[1:] = (segment[1:] == 0) | (bookie[1:] != bookie[:-1])
    begin = np.flatnonzero(starts)
    end = np.append(begin[1:], len(bookie)) - 1
    return (
        ledger[begin],
        bookie[begin],
        first[ledger[begin], segment[begin]],
        last[ledger[end], segment[end]],
        position[begin],
    )
