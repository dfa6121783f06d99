"""`tally audit synth`: realistic synthetic snapshots with known faults, for the audit's tests
and benchmarks.

A snapshot has the schema of `tally.audit.schema`, and `truth.json` lists every finding the
checks must report, no more, no less, for `min_racks` = MIN_RACKS, a grace period of
GRACE_PERIOD_MS and "now" = NOW_MS (snapshot.json's created_ms; checks take it as now):
the violations by category, and apart from them the over-replicated ledgers.

The healthy majority is generated with numpy, a chunk of ledgers at a time, without a Python
step per ledger: heavy-tailed sizes (most ledgers small, some of 10^7 entries), quorum mixes
(3/3/2, 3/2/2, 5/3/2, as the racks allow), about three segments per ledger whose ensemble
changes replace one or two bookies, a few open ledgers and empty closed ones, and rack-aware
ensembles whose every write set spans min(WQ, racks) racks (patterns of racks found once per
mix and judged by `adherence_of_racks`, so generator and checks cannot disagree). A bookie
keeps its ensemble position while it stays in a ledger, so what it holds is one closed-form
`expected_entries` range: its encoding is computed directly from the arithmetic, and equals
`EntryAvailability.to_bytes` of the same range byte for byte.

Faults are built one ledger at a time with the core's own types (`LedgerMetadata`,
`EntryAvailability`) and each one is verified with `audit_ledger` before it is written: it
must fall in exactly its category (an invalid_metadata ledger is a healthy one, whose first
segment's row then starts at entry 1). Fault ledgers never touch an unresponsive bookie;
every other closed ledger that does is listed as potentially_faulty.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from tally.audit import schema
from tally.audit.snapshot import DatasetWriter, prepare_output, write_json
from tally.core.availability import GROUP_SIZE, HEADER_SIZE, EntryAvailability
from tally.core.digest import MASTER_KEY_SIZE, DigestType
from tally.core.errors import BadRequest
from tally.core.ledger_audit import VIOLATION_CATEGORIES, Category, audit_ledger
from tally.core.ledger_metadata import LedgerMetadata, LedgerState, Segment
from tally.core.placement import PlacementAdherence, adherence_of_racks
from tally.core.schedule import expected_entries
from tally.version import __version__

Progress = Callable[[str, int, int | None], None]
Int64s = npt.NDArray[np.int64]

NOW_MS = 1_700_000_000_000
"""The snapshot's time (2023-11-14): fixed, so that a seed gives the same bytes every time."""
GRACE_PERIOD_MS = 3_600_000
MIN_RACKS = 2
CHUNK_LEDGERS = 100_000
"""Ledgers generated at once: bounds memory (a few hundred MB) and is one row group."""
PART_LEDGERS = 2_500_000
"""Ledgers per Parquet part: a few files per dataset, each of many row groups."""

MIXES = ((3, 3, 2, 0.45), (3, 2, 2, 0.35), (5, 3, 2, 0.20))
"""(E, WQ, AQ, share) of the healthy ledgers; a mix the racks cannot place strictly is left
out and the others share its weight."""
MAX_SEGMENTS = 6
MAX_ENSEMBLE = max(mix[0] for mix in MIXES)
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
READONLY_SHARE = 0.05
DIGESTS = (("CRC32C", 0.85), ("CRC32", 0.10), ("HMAC", 0.05))
MAX_AGE_MS = 30 * 86_400_000

WITHIN_GRACE = "underreplicated_within_grace"
"""A fault key: ledgers marked under-replicated within the grace period, with copies really
missing, which the checks must NOT report (truth.json lists them apart)."""
_LEDGER_FAULTS = (
    Category.NO_REPLICA.value,
    Category.BELOW_ACK_QUORUM.value,
    Category.BELOW_WRITE_QUORUM.value,
    Category.UNDERREPLICATED_TOO_LONG.value,
    WITHIN_GRACE,
    Category.PLACEMENT_FAIL.value,
    Category.PLACEMENT_SOFT.value,
    Category.OVER_REPLICATED.value,
    Category.INVALID_METADATA.value,
)
FAULT_KINDS = (
    *_LEDGER_FAULTS,
    Category.ORPHAN_DATA.value,
    Category.UNRESPONSIVE_REGISTERED_BOOKIE.value,
)
DEFAULT_FAULTS = (
    "no_replica=3,below_ack_quorum=3,below_write_quorum=3,underreplicated_too_long=2,"
    f"{WITHIN_GRACE}=2,placement_fail=2,placement_soft=2,unresponsive_registered_bookie=1,"
    "orphan_data=2,over_replicated=2,invalid_metadata=1"
)
FAULT_ATTEMPTS = 50


def parse_faults(spec: str) -> dict[str, int]:
    """`kind=count,...` (FAULT_KINDS), "default" for DEFAULT_FAULTS, "" for none."""
    spec = spec.strip()
    if spec == "default":
        spec = DEFAULT_FAULTS
    faults: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        kind, equals, count = item.partition("=")
        kind = kind.strip()
        if kind == Category.POTENTIALLY_FAULTY.value:
            raise BadRequest(
                "potentially_faulty is not injected: it follows from unresponsive_registered_bookie"
            )
        if kind not in FAULT_KINDS:
            raise BadRequest(f"unknown fault {kind!r} in {spec!r}; known: {', '.join(FAULT_KINDS)}")
        if not equals or not count.strip().isdecimal():
            raise BadRequest(f"fault {item!r} needs a count: {kind}=N")
        if kind in faults:
            raise BadRequest(f"fault {kind} is given twice in {spec!r}")
        faults[kind] = int(count)
    return faults


def ledger_key(scope: int, ledger_id: int) -> str:
    """truth.json's name of a ledger, from its stored int64 halves: unsigned "scope:id"."""
    return f"{schema.from_int64(scope)}:{schema.from_int64(ledger_id)}"


# -- the availability of one ensemble position, in closed form -----------------------------


def expected_encodings(
    first: Int64s, last: Int64s, ensemble_size: Int64s, write_quorum: Int64s, position: Int64s
) -> tuple[pa.BinaryArray, Int64s]:
    """`expected_entries(...).to_bytes()` of each row, vectorised: the encodings of the rows
    that hold anything, and which rows they are (grouped by layout, not in row order).

    Position p holds a cut first run, one periodic group of whole runs of WQ entries every
    E, and a cut last run (`expected_entries`). In canonical form the cut runs stay groups
    of their own (their sizes are below WQ), except when there are no whole runs and the two
    cut runs have the same size (then they make one group of two runs), and except when
    WQ = E (every run touches the next: one run, one group).
    """
    stop = last + 1
    run = first - (first - position + write_quorum - 1) % ensemble_size
    cut = run < first
    head_size = np.where(cut, np.minimum(run + write_quorum, stop) - first, 0)
    run = np.where(cut, run + ensemble_size, run)
    whole = np.maximum(0, (stop - write_quorum - run) // ensemble_size + 1)
    whole_first = run
    run = run + whole * ensemble_size
    tail_size = np.maximum(stop - run, 0)

    groups = np.zeros((len(first), 3), dtype=_GROUP_DTYPE)
    groups["first"][:, 0] = first
    groups["last"][:, 0] = first
    groups["size"][:, 0] = head_size
    groups["first"][:, 1] = whole_first
    groups["last"][:, 1] = whole_first + np.maximum(whole - 1, 0) * ensemble_size
    groups["size"][:, 1] = write_quorum
    groups["period"][:, 1] = np.where(whole > 1, ensemble_size, 0)
    groups["first"][:, 2] = run
    groups["last"][:, 2] = run
    groups["size"][:, 2] = tail_size
    layout = (head_size > 0) * 1 + (whole > 0) * 2 + (tail_size > 0) * 4

    paired = (layout == 5) & (head_size == tail_size)
    groups["last"][paired, 0] = run[paired]
    groups["period"][paired, 0] = (run - first)[paired]
    layout[paired] = 1
    one_run = (write_quorum == ensemble_size) & (stop > first)
    groups[one_run, 0] = 0
    groups["first"][one_run, 0] = first[one_run]
    groups["last"][one_run, 0] = first[one_run]
    groups["size"][one_run, 0] = (stop - first)[one_run]
    layout[one_run] = 1

    blocks, rows = [], []
    for kind in range(1, 8):
        chosen = np.flatnonzero(layout == kind)
        if chosen.size == 0:
            continue
        columns = [column for column in range(3) if kind >> column & 1]
        block = np.zeros((chosen.size, HEADER_SIZE + GROUP_SIZE * len(columns)), np.uint8)
        block[:, 7] = len(columns)  # the big-endian int32 group count at offset 4
        picked = np.ascontiguousarray(groups[chosen][:, columns])
        block[:, HEADER_SIZE:] = picked.view(np.uint8).reshape(chosen.size, -1)
        blocks.append(block.ravel())
        rows.append(chosen)
    held_rows = np.concatenate(rows) if rows else np.empty(0, np.int64)
    offsets = np.zeros(held_rows.size + 1, dtype=np.int32)
    counts = np.array([1, 1, 2, 1, 2, 2, 3])[layout[held_rows] - 1]
    np.cumsum(HEADER_SIZE + GROUP_SIZE * counts, out=offsets[1:])
    data = np.concatenate(blocks) if blocks else np.empty(0, np.uint8)
    encodings = pa.BinaryArray.from_buffers(
        pa.binary(), held_rows.size, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    return encodings, held_rows


_GROUP_DTYPE = np.dtype([("first", ">i8"), ("last", ">i8"), ("size", ">i4"), ("period", ">i4")])


# -- the cluster ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Mix:
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    weight: float
    patterns: tuple[tuple[int, ...], ...]
    """Rack colours per position (0, 1, ... in order of first use) that meet the placement
    policy strictly in this cluster."""


def _strict_patterns(
    ensemble_size: int, write_quorum: int, racks: int, per_rack: int
) -> tuple[tuple[int, ...], ...]:
    """Every way (up to renaming racks) to give the positions racks so that each write set
    spans min(WQ, racks) racks, using no rack more than `per_rack` times."""
    found = []
    for pattern in _rack_colourings(ensemble_size, min(ensemble_size, racks)):
        if max(pattern.count(colour) for colour in pattern) > per_rack:
            continue
        adherence = adherence_of_racks([str(c) for c in pattern], write_quorum, MIN_RACKS, racks)
        if adherence is PlacementAdherence.MEETS_STRICT:
            found.append(pattern)
    return tuple(found)


def _rack_colourings(length: int, colours: int) -> Iterator[tuple[int, ...]]:
    """Sequences where each colour first appears after all lower ones (restricted growth)."""
    if length == 0:
        yield ()
        return
    for prefix in _rack_colourings(length - 1, colours):
        for colour in range(min(max(prefix, default=-1) + 2, colours)):
            yield (*prefix, colour)


@dataclass(frozen=True)
class _Cluster:
    bookies: int
    racks: int
    names: list[str]
    rack_names: list[str]
    per_rack: Int64s
    unresponsive: frozenset[int]
    readonly: frozenset[int]
    mixes: tuple[_Mix, ...]

    @classmethod
    def make(cls, bookies: int, racks: int, unresponsive: int, rng: random.Random) -> _Cluster:
        if racks < 2:
            raise BadRequest(f"need at least 2 racks (min racks is {MIN_RACKS}), got {racks}")
        if bookies < racks:
            raise BadRequest(f"{bookies} bookies cannot fill {racks} racks")
        per_rack = np.array([len(range(r, bookies, racks)) for r in range(racks)], np.int64)
        mixes = tuple(
            _Mix(e, wq, aq, w, patterns)
            for e, wq, aq, w in MIXES
            if e <= bookies and (patterns := _strict_patterns(e, wq, racks, bookies // racks))
        )
        if not mixes:
            raise BadRequest(f"no ensemble mix places strictly on {bookies} bookies, {racks} racks")
        if unresponsive > bookies // 4:
            raise BadRequest(
                f"{unresponsive} unresponsive bookies of {bookies}: at most a quarter, so that "
                "fault ledgers can avoid them"
            )
        silent = frozenset(rng.sample(range(bookies), unresponsive))
        others = [b for b in range(bookies) if b not in silent]
        readonly = frozenset(rng.sample(others, int(len(others) * READONLY_SHARE)))
        return cls(
            bookies,
            racks,
            [_bookie_name(b % racks, b // racks) for b in range(bookies)],
            [f"/rack-{r:02d}" for r in range(racks)],
            per_rack,
            silent,
            readonly,
            mixes,
        )

    def rack_of(self, bookie: int) -> int:
        return bookie % self.racks

    def responsive_on(self, rack: int) -> list[int]:
        return [b for b in range(rack, self.bookies, self.racks) if b not in self.unresponsive]


def _bookie_name(rack: int, index: int) -> str:
    """host:port, as bookie ids are; the third octet is the rack."""
    return f"10.{rack // 256}.{rack % 256}.{index % 250 + 1}:{3181 + index // 250}"


@dataclass(frozen=True)
class _Patterns:
    """Every mix's patterns in flat tables, for choosing per ledger with numpy."""

    ensemble_size: Int64s
    write_quorum: Int64s
    ack_quorum: Int64s
    weights: npt.NDArray[np.float64]
    first: Int64s
    count: Int64s
    colour: Int64s
    """(pattern, position) -> colour, -1 past E."""
    occurrence: Int64s
    """(pattern, position) -> how many earlier positions have the same colour."""
    uses: Int64s
    """(pattern, colour) -> positions of that colour."""

    @classmethod
    def of(cls, mixes: tuple[_Mix, ...]) -> _Patterns:
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


# -- the healthy majority, a chunk at a time -----------------------------------------------


@dataclass
class _Chunk:
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
    scope: Int64s
    ledger_id: Int64s
    state: npt.NDArray[np.int8]
    """0 CLOSED, 1 OPEN, 2 IN_RECOVERY."""
    ensemble_size: Int64s
    write_quorum: Int64s
    ack_quorum: Int64s
    entries: Int64s
    """Entries written; a closed ledger's last entry id is entries - 1."""
    segment_count: Int64s
    first: Int64s
    last: Int64s
    """Of the entries written, for open ledgers too."""
    ensembles: Int64s

    @property
    def closed(self) -> npt.NDArray[np.bool_]:
        return np.equal(self.state, 0)

    @property
    def segment_valid(self) -> npt.NDArray[np.bool_]:
        return np.arange(MAX_SEGMENTS)[None, :] < self.segment_count[:, None]

    @property
    def position_valid(self) -> npt.NDArray[np.bool_]:
        return np.arange(MAX_ENSEMBLE)[None, :] < self.ensemble_size[:, None]


def _healthy_chunk(
    rng: np.random.Generator,
    start: int,
    count: int,
    cluster: _Cluster,
    patterns: _Patterns,
    skip: set[int],
) -> _Chunk:
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
    return _Chunk(
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
    cluster: _Cluster,
    patterns: _Patterns,
    skip: set[int],
) -> _Shape:
    index = np.arange(start, start + count, dtype=np.int64)
    scoped = rng.random(count) < SCOPED_SHARE
    random_halves = rng.integers(0, 2**64 - 1, (2, count), dtype=np.uint64, endpoint=True)
    kind = rng.random(count)
    state = np.where(kind < OPEN_SHARE, 1, np.where(kind < OPEN_SHARE + RECOVERY_SHARE, 2, 0))
    empty = (state == 0) & (kind < OPEN_SHARE + RECOVERY_SHARE + EMPTY_SHARE)
    mix = rng.choice(len(patterns.weights), count, p=patterns.weights)
    entries = np.minimum(
        MAX_ENTRIES, np.ceil(10 ** rng.exponential(SIZE_SCALE, count)).astype(np.int64)
    )
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
    rng: np.random.Generator, entries: Int64s, segment_count: Int64s
) -> tuple[Int64s, Int64s]:
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
    cluster: _Cluster,
    patterns: _Patterns,
    mix: Int64s,
    ensemble_size: Int64s,
    segment_count: Int64s,
) -> Int64s:
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

    def bookie(rows: Int64s, positions: Int64s, ordinals: Int64s) -> Int64s:
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


def _distinct_draws(rng: np.random.Generator, count: int, population: int, draws: int) -> Int64s:
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
    ensembles: Int64s,
    first: Int64s,
    last: Int64s,
    segment_valid: npt.NDArray[np.bool_],
    position_valid: npt.NDArray[np.bool_],
    with_data: npt.NDArray[np.bool_],
) -> tuple[Int64s, Int64s, Int64s, Int64s, Int64s]:
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


# -- fault ledgers, one at a time, checked by the audit itself -----------------------------


@dataclass(frozen=True)
class _Ledger:
    """A ledger with what each bookie holds of it (bookies holding nothing are absent)."""

    scope: int
    ledger_id: int
    metadata: LedgerMetadata
    held: dict[str, EntryAvailability]
    underreplicated_since_ms: int | None = None
    invalid: bool = False
    """Its rows are written broken (the first segment starting at entry 1): no valid ledger."""


class _Injector:
    """Builds fault ledgers of a cluster; each is checked to fall in exactly its category."""

    def __init__(self, cluster: _Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.racks = {
            name: cluster.rack_names[cluster.rack_of(b)] for b, name in enumerate(cluster.names)
        }

    def eligible(self, kind: str) -> list[_Mix]:
        """The mixes that can hold a `kind` fault; BadRequest, saying why, if none can."""
        mixes = [mix for mix in self.cluster.mixes if _suits(kind, mix, self.cluster.racks)]
        if not mixes:
            placed = ", ".join(
                f"{m.ensemble_size}/{m.write_quorum}/{m.ack_quorum}" for m in self.cluster.mixes
            )
            raise BadRequest(
                f"no ensemble mix that places strictly on {self.cluster.bookies} bookies and "
                f"{self.cluster.racks} racks ({placed}) can hold a {kind} fault"
                + (
                    f" (a write set spans at least min(WQ, {MIN_RACKS}) racks or fails: "
                    "placement_soft needs 3 racks or more)"
                    if kind == Category.PLACEMENT_SOFT.value
                    else ""
                )
            )
        return mixes

    def build(self, kind: str, index: int) -> _Ledger:
        eligible = self.eligible(kind)
        expected = set() if kind in (WITHIN_GRACE, Category.INVALID_METADATA.value) else {kind}
        for _ in range(FAULT_ATTEMPTS):
            ledger = self._attempt(kind, index, self.rng.choice(eligible))
            if ledger is not None and self.categories(ledger) == expected:
                if kind == Category.INVALID_METADATA.value:
                    return dataclasses.replace(ledger, invalid=True)
                return ledger
        raise BadRequest(
            f"could not inject a {kind} fault on {self.cluster.bookies} bookies, "
            f"{self.cluster.racks} racks in {FAULT_ATTEMPTS} attempts"
        )

    def categories(self, ledger: _Ledger) -> set[str]:
        available = {
            b: ledger.held.get(b, EntryAvailability.empty()) for b in ledger.metadata.bookies()
        }
        return {
            violation.category.value
            for violation in audit_ledger(
                ledger.metadata,
                available | ledger.held,
                racks=self.racks,
                min_racks=MIN_RACKS,
                underreplicated_since_ms=ledger.underreplicated_since_ms,
                now_ms=NOW_MS,
                grace_period_ms=GRACE_PERIOD_MS,
                cluster_racks=self.cluster.racks,
            )
        }

    def _attempt(self, kind: str, index: int, mix: _Mix) -> _Ledger | None:
        rng = self.rng
        e, wq = mix.ensemble_size, mix.write_quorum
        ensembles = self._ensembles(mix, rng.randint(2, 3))
        if ensembles is None:
            return None
        if kind in (Category.PLACEMENT_FAIL.value, Category.PLACEMENT_SOFT.value):
            segment = rng.randrange(len(ensembles))
            misplaced = self._misplace(
                ensembles[segment], wq, kind == Category.PLACEMENT_FAIL.value
            )
            if misplaced is None:
                return None
            ensembles[segment] = misplaced
        segments = len(ensembles)
        entries = rng.randint(4 * e * segments, 3000)
        cuts = sorted(rng.randint(0, entries - segments * e) for _ in range(segments - 1))
        firsts = [n * e + cut for n, cut in enumerate([0, *cuts])]
        metadata = LedgerMetadata(
            state=LedgerState.CLOSED,
            ensemble_size=e,
            write_quorum=wq,
            ack_quorum=mix.ack_quorum,
            segments=tuple(
                Segment(f, tuple(self.cluster.names[b] for b in ensemble))
                for f, ensemble in zip(firsts, ensembles, strict=True)
            ),
            digest_type=DigestType.CRC32C,
            master_key=bytes(MASTER_KEY_SIZE),
            ctime_ms=NOW_MS - rng.randrange(60_000, MAX_AGE_MS),
            creator_token=b"",
            last_entry_id=entries - 1,
            length=entries * rng.randrange(64, 4096),
        )
        held = _held(metadata)
        since = self._damage(kind, metadata, held)
        scoped = rng.random() < 0.3
        scope = rng.getrandbits(64) | 1 << 63 if scoped else 0
        ledger_id = rng.getrandbits(64) if scoped else 2 * index
        return _Ledger(scope, ledger_id, metadata, {b: h for b, h in held.items() if h}, since)

    def _ensembles(self, mix: _Mix, segments: int) -> list[list[int]] | None:
        """A strict first ensemble of responsive bookies; each change replaces one position
        with a new bookie of the same rack. None if the racks are too thin."""
        rng = self.rng
        pattern = rng.choice(mix.patterns)
        colour_rack = rng.sample(range(self.cluster.racks), max(pattern) + 1)
        pools = {c: self.cluster.responsive_on(colour_rack[c]) for c in set(pattern)}
        for pool in pools.values():
            rng.shuffle(pool)
        if any(len(pools[c]) < pattern.count(c) for c in pools):
            return None
        ensembles = [[pools[c].pop() for c in pattern]]
        for _ in range(segments - 1):
            ensemble = list(ensembles[-1])
            position = rng.randrange(len(ensemble))
            pool = pools[pattern[position]]
            if pool:
                ensemble[position] = pool.pop()
            ensembles.append(ensemble)
        return ensembles

    def _misplace(self, ensemble: list[int], write_quorum: int, fail: bool) -> list[int] | None:
        """The ensemble with one write set moved onto one rack (fail) or with one position
        moved to the rack of a neighbour in its write sets (soft)."""
        rng, cluster = self.rng, self.cluster
        size = len(ensemble)
        start = rng.randrange(size)
        window = [(start + k) % size for k in range(write_quorum)]
        if fail:
            rack = rng.randrange(cluster.racks)
            others = {ensemble[p] for p in range(size) if p not in window}
            pool = [b for b in cluster.responsive_on(rack) if b not in others]
            if len(pool) < write_quorum:
                return None
            changed = list(ensemble)
            for position, bookie in zip(window, rng.sample(pool, write_quorum), strict=True):
                changed[position] = bookie
            return changed
        position = window[-1]
        rack = cluster.rack_of(ensemble[window[0]])
        pool = [b for b in cluster.responsive_on(rack) if b not in ensemble]
        if not pool:
            return None
        changed = list(ensemble)
        changed[position] = rng.choice(pool)
        return changed

    def _damage(
        self, kind: str, metadata: LedgerMetadata, held: dict[str, EntryAvailability]
    ) -> int | None:
        """Take copies away (or leave extra ones) for `kind`; the under-replication mark."""
        rng = self.rng
        e, wq, aq = metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum
        index = rng.randrange(len(metadata.segments))
        segment, first, last = metadata.segments_with_bounds()[index]
        ensemble = segment.ensemble
        assert last is not None
        entry = rng.randint(first, last)
        one = EntryAvailability.from_entries([entry])
        copies = list(metadata.write_set_bookies(entry))

        def lose(bookies: list[str], entries: EntryAvailability = one) -> None:
            for bookie in bookies:
                held[bookie] = held[bookie].difference(entries)

        if kind == Category.NO_REPLICA.value:
            lose(copies)
        elif kind in (Category.BELOW_ACK_QUORUM.value, WITHIN_GRACE):
            lose(rng.sample(copies, wq - aq + 1))
        elif kind in (Category.BELOW_WRITE_QUORUM.value, Category.UNDERREPLICATED_TOO_LONG.value):
            how = rng.choice(("entry", "segment", "ledger"))
            position = rng.randrange(e)
            if how == "entry":
                lose([rng.choice(copies)])
            elif how == "segment":
                lose([ensemble[position]], expected_entries(first, last, e, wq, position))
            else:
                held[ensemble[position]] = EntryAvailability.empty()
        elif kind == Category.OVER_REPLICATED.value:
            # A bookie that held `position` before it was replaced there keeps its copies:
            # outside the ensemble now, or back at another position (E > WQ: it then holds
            # more than that position's write sets, every entry if E = WQ + 1).
            position = rng.randrange(e)
            left = expected_entries(first, last, e, wq, position)
            responsive = (
                self.cluster.names[b]
                for b in range(self.cluster.bookies)
                if b not in self.cluster.unresponsive
            )
            outsiders = [b for b in responsive if b not in ensemble]
            members = [b for p, b in enumerate(ensemble) if p != position] if e > wq else []
            choices = outsiders + members
            if choices:
                bookie = rng.choice(choices)
                held[bookie] = held.get(bookie, EntryAvailability.empty()).union(left)
        if kind == Category.UNDERREPLICATED_TOO_LONG.value:
            return NOW_MS - GRACE_PERIOD_MS - rng.randrange(60_000, 3 * 86_400_000)
        if kind == WITHIN_GRACE:
            return NOW_MS - rng.randrange(1_000, GRACE_PERIOD_MS - 60_000)
        return None

    def orphan(self) -> dict[str, EntryAvailability]:
        """What bookies still hold of a deleted ledger: a few round-robin copies."""
        rng = self.rng
        responsive = [b for b in range(self.cluster.bookies) if b not in self.cluster.unresponsive]
        bookies = rng.sample(responsive, min(3, len(responsive)))
        last = rng.randint(10, 500)
        return {
            self.cluster.names[b]: expected_entries(0, last, 3, 2, position)
            for position, b in enumerate(bookies)
        }


def _suits(kind: str, mix: _Mix, racks: int) -> bool:
    if kind == Category.BELOW_WRITE_QUORUM.value:
        return mix.write_quorum > mix.ack_quorum
    if kind == Category.PLACEMENT_SOFT.value:
        return min(mix.write_quorum, racks) > MIN_RACKS
    return True


def _held(metadata: LedgerMetadata) -> dict[str, EntryAvailability]:
    """What each bookie of a healthy closed ledger holds: its positions' schedules."""
    held: dict[str, EntryAvailability] = {}
    e, wq = metadata.ensemble_size, metadata.write_quorum
    for segment, first, last in metadata.segments_with_bounds():
        assert last is not None
        for position, bookie in enumerate(segment.ensemble):
            expected = expected_entries(first, last, e, wq, position)
            held[bookie] = held.get(bookie, EntryAvailability.empty()).union(expected)
    return held


def _rows(
    ledger: _Ledger,
) -> tuple[dict[str, list[Any]], dict[str, list[Any]], dict[str, list[Any]]]:
    """The ledger's rows of ledgers/, segments/ and availability/."""
    metadata = ledger.metadata
    scope, ledger_id = schema.to_int64(ledger.scope), schema.to_int64(ledger.ledger_id)
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
    return ledgers, segments, _availability_rows(scope, ledger_id, ledger.held)


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


# -- the whole snapshot --------------------------------------------------------------------


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
    cluster = _Cluster.make(
        bookies, racks, wanted.get(Category.UNRESPONSIVE_REGISTERED_BOOKIE.value, 0), rng
    )
    kinds = [kind for kind in _LEDGER_FAULTS for _ in range(wanted.get(kind, 0))]
    if len(kinds) > ledgers:
        raise BadRequest(f"{len(kinds)} fault ledgers do not fit in {ledgers} ledgers")
    fault_at = dict(zip(rng.sample(range(ledgers), len(kinds)), kinds, strict=True))
    orphan_count = wanted.get(Category.ORPHAN_DATA.value, 0)
    orphans = rng.sample(range(max(ledgers, orphan_count)), orphan_count)
    injector = _Injector(cluster, rng)
    for kind in set(kinds):
        injector.eligible(kind)
    patterns = _Patterns.of(cluster.mixes)

    prepare_output(out, [*schema.SNAPSHOT_PARTS, schema.TRUTH_JSON])
    writers = {
        name: DatasetWriter(out / name, table_schema, name)
        for name, table_schema in (
            (schema.LEDGERS, schema.LEDGERS_SCHEMA),
            (schema.SEGMENTS, schema.SEGMENTS_SCHEMA),
            (schema.AVAILABILITY, schema.AVAILABILITY_SCHEMA),
        )
    }
    truth: dict[str, list[str]] = {category.value: [] for category in Category}
    within_grace: list[str] = []
    report = progress or (lambda stage, done, total: None)
    for start in range(0, ledgers, CHUNK_LEDGERS):
        if start and start % PART_LEDGERS == 0:
            for writer in writers.values():
                writer.next_part()
        count = min(CHUNK_LEDGERS, ledgers - start)
        here = {i: kind for i, kind in fault_at.items() if start <= i < start + count}
        chunk = _healthy_chunk(
            np.random.default_rng([seed, start]), start, count, cluster, patterns, set(here)
        )
        truth[Category.POTENTIALLY_FAULTY.value] += chunk.potentially_faulty
        tables = {
            schema.LEDGERS: [chunk.ledgers],
            schema.SEGMENTS: [chunk.segments],
            schema.AVAILABILITY: [chunk.availability],
        }
        for i, kind in sorted(here.items()):
            ledger = injector.build(kind, i)
            key = ledger_key(schema.to_int64(ledger.scope), schema.to_int64(ledger.ledger_id))
            (within_grace if kind == WITHIN_GRACE else truth[kind]).append(key)
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
    write_json(
        out / schema.TRUTH_JSON,
        {
            "categories": {
                category.value: sorted(truth[category.value]) for category in VIOLATION_CATEGORIES
            },
            Category.OVER_REPLICATED.value: sorted(truth[Category.OVER_REPLICATED.value]),
            WITHIN_GRACE: sorted(within_grace),
            "params": params,
            "now_ms": NOW_MS,
            "grace_period_ms": GRACE_PERIOD_MS,
        },
    )
    summary = {
        "format_version": schema.FORMAT_VERSION,
        "created_ms": NOW_MS,
        "cluster": {"metadata": "synthetic", "instance_id": f"synthetic-seed-{seed}"},
        "tool": {"name": "tally", "version": __version__},
        "counts": {
            "ledgers": writers[schema.LEDGERS].rows,
            "segments": writers[schema.SEGMENTS].rows,
            "bookies": bookies,
            "bookies_responded": bookies - len(cluster.unresponsive),
            "availability": writers[schema.AVAILABILITY].rows,
        },
        "synthetic": params,
    }
    write_json(out / schema.SNAPSHOT_JSON, summary)
    return summary


def _bookie_rows(cluster: _Cluster) -> dict[str, list[Any]]:
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
