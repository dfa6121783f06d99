"""Measure embedded key-value engines for the bookie's entry index.

The index maps (scope, ledger, entry) to an entry's location in the interleaved entry logs.
It is written in one batch per journal group commit, made durable only at checkpoints (the
journal is replayed from the last checkpoint after a crash), scanned per ledger
(GET_LIST_OF_ENTRIES_OF_LEDGER) and in full (AVAILABILITY_DUMP), and loses whole ledgers at
once. Each workload below is that pattern, run on every engine that imports, beside two
yardsticks measured in the same run: raw sequential write with fdatasync of the same byte
volume on the same disk, and a Python dict fed the same keys.

    python bench/bench_index_engines.py [--entries N] [--ledgers L] [--repeats R] [--dir D]
                                        [--engine NAME]...

Engines: rocksdict (RocksDB), lmdb (py-lmdb), plyvel (LevelDB). One that does not import
is skipped with a note. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from pathlib import Path
from typing import Any, ClassVar, cast

INDEX_KEY = struct.Struct(">QQQ")  # scope, ledger, entry id (i64 stored as u64)
LOCATION = struct.Struct(">IQI")  # entry log id, offset in that log, entry size
U64_MASK = (1 << 64) - 1
SCOPE = 0
FIRST_LEDGER = 1
BATCH = 1000  # index updates per journal group commit
CHECKPOINT_LOAD = 100_000  # unflushed inserts before a timed checkpoint
GET_COUNT = 200_000
CONTENDED_OPS = 50_000  # gets, and entries written, beside a busy Python thread
CONTENDED_SECONDS = 2.0  # ... or fewer, if a GIL convoy makes them this slow
PROBED_BATCH = 20_000  # entries in the one big batch written while the GIL is watched
CRASH_CHECKPOINT_EVERY = 20  # batches between checkpoints in the crash child
CRASH_CHECKPOINTS = 3  # checkpoints the crash child completes before the kill


def index_key(ledger: int, entry: int) -> bytes:
    return INDEX_KEY.pack(SCOPE, ledger, entry & U64_MASK)


def location(ledger: int, entry: int) -> bytes:
    """A deterministic location, so any value read back can be checked without a table."""
    serial = ledger * 1_000_003 + entry
    return LOCATION.pack(serial >> 16, serial * 131, 64 + serial % 4000)


def ledger_bounds(ledger: int) -> tuple[bytes, bytes]:
    """Half-open key range holding every entry of one ledger, in numeric order."""
    return INDEX_KEY.pack(SCOPE, ledger, 0), INDEX_KEY.pack(SCOPE, ledger + 1, 0)


def appends(ledgers: int, first_entry: int, rounds: int) -> tuple[list[bytes], list[bytes]]:
    """Entries in the order a bookie indexes them: round robin over the open ledgers."""
    keys: list[bytes] = []
    values: list[bytes] = []
    for entry in range(first_entry, first_entry + rounds):
        for ledger in range(FIRST_LEDGER, FIRST_LEDGER + ledgers):
            keys.append(index_key(ledger, entry))
            values.append(location(ledger, entry))
    return keys, values


# --------------------------------------------------------------------------- engines


class IndexEngine(ABC):
    """The operations the entry index needs, each done the way its engine does it best."""

    name: ClassVar[str]
    module: ClassVar[str]
    checkpoint_call: ClassVar[str]
    ledger_delete: ClassVar[str]
    reclaim_call: ClassVar[str]

    @abstractmethod
    def __init__(self, path: Path) -> None: ...

    @abstractmethod
    def prepare(
        self, keys: Sequence[bytes], values: Sequence[bytes], sync: bool
    ) -> Callable[[], None]:
        """Build one batch; the call returned applies it atomically, durably if `sync`."""

    def write_batch(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """One group commit's index updates, not forced to disk (a checkpoint does that)."""
        self.prepare(keys, values, sync=False)()

    def sync_write(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        """The alternative to checkpoints: every batch durable before it returns."""
        self.prepare(keys, values, sync=True)()

    @abstractmethod
    def checkpoint(self) -> None:
        """Make every write so far survive a machine crash."""

    @abstractmethod
    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """One point lookup per key (no multi-get): a bookie read asks for one entry."""

    @abstractmethod
    def scan(self, lo: bytes, hi: bytes) -> list[bytes]:
        """Keys in [lo, hi) in order."""

    @abstractmethod
    def all_keys(self) -> Iterator[bytes]:
        """Every key in order."""

    @abstractmethod
    def all_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every key and value in order."""

    @abstractmethod
    def delete_range(self, lo: bytes, hi: bytes) -> None:
        """Drop every key in [lo, hi)."""

    @abstractmethod
    def reclaim(self) -> None:
        """Give the space of deleted keys back to the file system."""

    @abstractmethod
    def close(self) -> None: ...

    @staticmethod
    @abstractmethod
    def open_from_other_process(path: Path, lo: bytes, hi: bytes) -> list[str]:
        """Try every read-only way to open a live DB; one line per way, with the keys seen."""


class RocksDictEngine(IndexEngine):
    """RocksDB with its write-ahead log; a checkpoint fsyncs the WAL."""

    name = "rocksdict"
    module = "rocksdict"
    checkpoint_call = "flush_wal(sync=True)"
    ledger_delete = "delete_range (one tombstone)"
    reclaim_call = "compact_range(None, None)"
    disable_wal: ClassVar[bool] = False

    def __init__(self, path: Path) -> None:
        rocksdict = importlib.import_module("rocksdict")
        self._rocksdict = rocksdict
        self.db = rocksdict.Rdict(str(path), rocksdict.Options(raw_mode=True))
        self.write_options = {}
        for sync in (False, True):
            options = rocksdict.WriteOptions()
            options.sync = sync
            options.disable_wal = self.disable_wal and not sync  # RocksDB syncs only via WAL
            self.write_options[sync] = options

    def prepare(
        self, keys: Sequence[bytes], values: Sequence[bytes], sync: bool
    ) -> Callable[[], None]:
        batch = self._rocksdict.WriteBatch(raw_mode=True)
        put = batch.put
        for key, value in zip(keys, values, strict=True):
            put(key, value)
        return partial(self.db.write, batch, self.write_options[sync])

    def checkpoint(self) -> None:
        self.db.flush_wal(True)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        get = self.db.get
        return [get(key) for key in keys]

    def scan(self, lo: bytes, hi: bytes) -> list[bytes]:
        read_options = self._rocksdict.ReadOptions()
        read_options.set_iterate_upper_bound(hi)
        return list(self.db.keys(from_key=lo, read_opt=read_options))

    def all_keys(self) -> Iterator[bytes]:
        return iter(self.db.keys())

    def all_items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(self.db.items())

    def delete_range(self, lo: bytes, hi: bytes) -> None:
        self.db.delete_range(lo, hi)

    def reclaim(self) -> None:
        self.db.compact_range(None, None)

    def close(self) -> None:
        self.db.close()

    @staticmethod
    def open_from_other_process(path: Path, lo: bytes, hi: bytes) -> list[str]:
        rocksdict = importlib.import_module("rocksdict")
        lines = []
        with tempfile.TemporaryDirectory(dir=path.parent) as secondary:
            modes = {
                "read_only": rocksdict.AccessType.read_only(),
                "secondary": rocksdict.AccessType.secondary(secondary),
            }
            for mode, access in modes.items():
                try:
                    db = rocksdict.Rdict(
                        str(path), rocksdict.Options(raw_mode=True), access_type=access
                    )
                    read_options = rocksdict.ReadOptions()
                    read_options.set_iterate_upper_bound(hi)
                    seen = sum(1 for _ in db.keys(from_key=lo, read_opt=read_options))
                    db.close()
                    lines.append(f"{mode}: opened, {seen} keys")
                except Exception as error:
                    lines.append(f"{mode}: refused ({first_line(error)})")
        return lines


class RocksDictNoWalEngine(RocksDictEngine):
    """RocksDB without its WAL (the journal already is one); a checkpoint flushes memtables."""

    name = "rocksdict-nowal"
    checkpoint_call = "flush(wait=True)"
    disable_wal = True

    def checkpoint(self) -> None:
        self.db.flush(True)


class LmdbEngine(IndexEngine):
    """LMDB with sync=False: commits reach the page cache; a checkpoint is env.sync(True)."""

    name = "lmdb"
    module = "lmdb"
    checkpoint_call = "env.sync(True)"
    ledger_delete = "cursor walk + delete per key"
    reclaim_call = "copy(compact=True) + swap files"
    map_size: ClassVar[int] = 4 << 30  # fixed up front; ~20M entries of this workload fit
    writemap: ClassVar[bool] = False

    def __init__(self, path: Path) -> None:
        self._lmdb = importlib.import_module("lmdb")
        self.path = path
        self.env = self._open(path)

    def _open(self, path: Path) -> Any:
        return self._lmdb.open(
            str(path),
            map_size=self.map_size,
            sync=False,
            writemap=self.writemap,
            readahead=False,
            max_dbs=0,
        )

    def prepare(
        self, keys: Sequence[bytes], values: Sequence[bytes], sync: bool
    ) -> Callable[[], None]:
        pairs = list(zip(keys, values, strict=True))

        def apply() -> None:
            with self.env.begin(write=True) as txn:
                txn.cursor().putmulti(pairs)
            if sync:
                self.env.sync(True)

        return apply

    def checkpoint(self) -> None:
        self.env.sync(True)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        with self.env.begin() as txn:
            get = txn.get
            return [get(key) for key in keys]

    def scan(self, lo: bytes, hi: bytes) -> list[bytes]:
        found: list[bytes] = []
        with self.env.begin() as txn:
            cursor = txn.cursor()
            if cursor.set_range(lo):
                for key in cursor.iternext(keys=True, values=False):
                    if key >= hi:
                        break
                    found.append(key)
        return found

    def all_keys(self) -> Iterator[bytes]:
        with self.env.begin() as txn:
            yield from txn.cursor().iternext(keys=True, values=False)

    def all_items(self) -> Iterator[tuple[bytes, bytes]]:
        with self.env.begin() as txn:
            yield from txn.cursor().iternext()

    def delete_range(self, lo: bytes, hi: bytes) -> None:
        with self.env.begin(write=True) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(lo):
                return
            while cursor.key() and cursor.key() < hi:
                cursor.delete()

    def reclaim(self) -> None:
        """LMDB reuses freed pages by itself; only a compacting copy shrinks the file."""
        compacted = self.path.with_name(self.path.name + ".compact")
        compacted.mkdir()
        self.env.copy(str(compacted), compact=True)
        self.env.close()
        shutil.rmtree(self.path)
        compacted.rename(self.path)
        self.env = self._open(self.path)

    def close(self) -> None:
        self.env.close()

    @staticmethod
    def open_from_other_process(path: Path, lo: bytes, hi: bytes) -> list[str]:
        lmdb = importlib.import_module("lmdb")
        try:
            env = lmdb.open(str(path), readonly=True, lock=True)
            with env.begin() as txn:
                cursor = txn.cursor()
                seen = 0
                if cursor.set_range(lo):
                    for key in cursor.iternext(values=False):
                        if key >= hi:
                            break
                        seen += 1
            env.close()
        except Exception as error:
            return [f"readonly: refused ({first_line(error)})"]
        return [f"readonly: opened, {seen} keys"]


class LmdbWritemapEngine(LmdbEngine):
    """LMDB writing dirty pages straight into the shared map instead of malloc'd copies.

    Each batch of this workload touches one leaf per ledger, so the copy-on-write cost per
    batch is ~1000 pages; writing them in place is what makes the difference.
    """

    name = "lmdb-writemap"
    writemap = True


class PlyvelEngine(IndexEngine):
    """LevelDB: unsynced batch writes; a checkpoint is one sync=True write, which fsyncs the log."""

    name = "plyvel"
    module = "plyvel"
    checkpoint_call = "put(marker, sync=True)"
    ledger_delete = "iterator + delete per key"
    reclaim_call = "compact_range(start=b'', stop=b'\\xff' * 32)"
    checkpoint_marker: ClassVar[bytes] = b"\xff" * 25  # sorts after every 24-byte index key

    def __init__(self, path: Path) -> None:
        plyvel = importlib.import_module("plyvel")
        self.db = plyvel.DB(str(path), create_if_missing=True)
        self.checkpoints = 0

    def prepare(
        self, keys: Sequence[bytes], values: Sequence[bytes], sync: bool
    ) -> Callable[[], None]:
        batch = self.db.write_batch(sync=sync)
        put = batch.put
        for key, value in zip(keys, values, strict=True):
            put(key, value)
        return cast("Callable[[], None]", batch.write)

    def checkpoint(self) -> None:
        self.checkpoints += 1
        self.db.put(self.checkpoint_marker, self.checkpoints.to_bytes(8, "big"), sync=True)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        get = self.db.get
        return [get(key) for key in keys]

    def scan(self, lo: bytes, hi: bytes) -> list[bytes]:
        return list(self.db.iterator(start=lo, stop=hi, include_value=False))

    def all_keys(self) -> Iterator[bytes]:
        return iter(self.db.iterator(stop=self.checkpoint_marker, include_value=False))

    def all_items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(self.db.iterator(stop=self.checkpoint_marker))

    def delete_range(self, lo: bytes, hi: bytes) -> None:
        with self.db.write_batch() as batch:
            for key in self.db.iterator(start=lo, stop=hi, include_value=False):
                batch.delete(key)

    def reclaim(self) -> None:
        """Bounds are explicit: compact_range() without them left deleted data on disk."""
        self.db.compact_range(start=b"", stop=b"\xff" * 32)

    def close(self) -> None:
        self.db.close()

    @staticmethod
    def open_from_other_process(path: Path, lo: bytes, hi: bytes) -> list[str]:
        plyvel = importlib.import_module("plyvel")
        try:
            db = plyvel.DB(str(path))
            seen = sum(1 for _ in db.iterator(start=lo, stop=hi, include_value=False))
            db.close()
        except Exception as error:
            return [f"open: refused ({first_line(error)})"]
        return [f"open: opened, {seen} keys"]


ENGINES: tuple[type[IndexEngine], ...] = (
    RocksDictEngine,
    RocksDictNoWalEngine,
    LmdbEngine,
    LmdbWritemapEngine,
    PlyvelEngine,
)


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:110]


def engine_named(name: str) -> type[IndexEngine]:
    for engine in ENGINES:
        if engine.name == name:
            return engine
    raise SystemExit(f"unknown engine {name!r}")


# --------------------------------------------------------------------------- measuring


@dataclass
class Samples:
    """Repeated timings of one thing; rates are best (highest) and median."""

    seconds: list[float] = field(default_factory=list)

    def add(self, seconds: float) -> None:
        self.seconds.append(max(seconds, 1e-9))

    def rate(self, count: float) -> str:
        best = count / min(self.seconds)
        if len(self.seconds) == 1:
            return si(best)
        return f"{si(best)} ({si(count / statistics.median(self.seconds))})"

    def millis(self) -> str:
        best = 1000 * min(self.seconds)
        if len(self.seconds) == 1:
            return f"{best:.1f} ms"
        return f"{best:.1f} ({1000 * statistics.median(self.seconds):.1f}) ms"


def si(value: float) -> str:
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.2f}{suffix}"
    return f"{value:.1f}"


def mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def disk_bytes(path: Path) -> int:
    """Allocated bytes (du), not apparent size: what the disk really holds."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def timed(operation: Callable[[], object]) -> float:
    start = time.perf_counter()
    operation()
    return time.perf_counter() - start


def spin_until(flag: threading.Event) -> int:
    spins = 0
    while not flag.is_set():
        spins += 1
    return spins


def gil_probe(operation: Callable[[], object]) -> tuple[float, float]:
    """Run `operation` in a thread; return its seconds and how far the main thread got.

    The main thread spins a counter; its rate during the operation over its rate alone
    (measured just before) is ~1 when the binding releases the GIL, ~0 when it holds it.
    """
    alone = threading.Event()
    threading.Timer(0.2, alone.set).start()
    baseline = spin_until(alone) / 0.2
    finished = threading.Event()
    seconds: list[float] = []

    def run() -> None:
        seconds.append(timed(operation))
        finished.set()

    worker = threading.Thread(target=run)
    start = time.perf_counter()
    worker.start()
    spins = spin_until(finished)
    wall = time.perf_counter() - start
    worker.join()
    return seconds[0], min(1.0, spins / wall / baseline)


# --------------------------------------------------------------------------- yardsticks


def raw_disk_write(directory: Path, size: int, repeats: int) -> tuple[Samples, Samples]:
    """Sequential 1 MiB writes + one fdatasync of `size` bytes; and 4 KiB write+fdatasync."""
    chunk = os.urandom(1 << 20)
    bulk = Samples()
    target = directory / "raw-write"
    for _ in range(repeats):
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        start = time.perf_counter()
        left = size
        while left > 0:
            left -= os.write(fd, chunk[: min(left, len(chunk))])
        os.fdatasync(fd)
        bulk.add(time.perf_counter() - start)
        os.close(fd)
        target.unlink()
    small = Samples()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for _ in range(20):
        start = time.perf_counter()
        os.write(fd, chunk[:4096])
        os.fdatasync(fd)
        small.add(time.perf_counter() - start)
    os.close(fd)
    target.unlink()
    return bulk, small


def dict_insert(keys: Sequence[bytes], values: Sequence[bytes], repeats: int) -> Samples:
    samples = Samples()
    for _ in range(repeats):
        table: dict[bytes, bytes] = {}
        start = time.perf_counter()
        for first in range(0, len(keys), BATCH):
            for key, value in zip(
                keys[first : first + BATCH], values[first : first + BATCH], strict=True
            ):
                table[key] = value
        samples.add(time.perf_counter() - start)
    return samples


# --------------------------------------------------------------------------- workloads


@dataclass
class Workload:
    ledgers: int
    rounds: int
    repeats: int
    keys: list[bytes]
    values: list[bytes]

    @property
    def entries(self) -> int:
        return len(self.keys)

    @cached_property
    def bounds(self) -> list[tuple[bytes, bytes]]:
        return [ledger_bounds(FIRST_LEDGER + i) for i in range(self.ledgers)]


@dataclass
class EngineResult:
    """Table cells by row label, and longer remarks printed under the table."""

    rows: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def write_all(engine: IndexEngine, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
    for first in range(0, len(keys), BATCH):
        engine.write_batch(keys[first : first + BATCH], values[first : first + BATCH])


def note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure_inserts(
    kind: type[IndexEngine], work: Workload, path: Path, result: EngineResult
) -> IndexEngine:
    """Workloads 1 and 7; each repeat on a fresh DB, the last one is kept for the rest."""
    inserts = Samples()
    engine: IndexEngine | None = None
    for attempt in range(work.repeats):
        if engine is not None:
            engine.close()
            shutil.rmtree(path)
        engine = kind(path)
        inserts.add(timed(partial(write_all, engine, work.keys, work.values)))
        note(f"  {kind.name}: insert {attempt + 1}/{work.repeats} done")
    assert engine is not None
    result.rows["1 insert [entries/s]"] = inserts.rate(work.entries)
    result.rows["6 checkpoint right after 1"] = f"{1000 * timed(engine.checkpoint):.1f} ms"
    loaded = disk_bytes(path)
    result.rows["7 disk after 1 + checkpoint"] = mib(loaded)
    result.rows["7   per entry"] = f"{loaded / work.entries:.0f} B"
    return engine


def measure_reads(engine: IndexEngine, work: Workload, result: EngineResult) -> None:
    """Workloads 2, 3 and 4, each result checked against what was written."""
    rng = random.Random(7)
    picks = [rng.randrange(work.entries) for _ in range(GET_COUNT)]
    hit_keys = [work.keys[i] for i in picks]
    expected = [work.values[i] for i in picks]
    beyond_last = [
        index_key(FIRST_LEDGER + rng.randrange(work.ledgers), work.rounds + rng.randrange(1 << 20))
        for _ in range(GET_COUNT // 2)
    ]
    unknown_ledger = [
        index_key(FIRST_LEDGER + work.ledgers + rng.randrange(1 << 20), rng.randrange(work.rounds))
        for _ in range(GET_COUNT // 2)
    ]
    miss_keys = [key for pair in zip(beyond_last, unknown_ledger, strict=True) for key in pair]
    hits, misses, scans, full = Samples(), Samples(), Samples(), Samples()
    for _ in range(work.repeats):
        start = time.perf_counter()
        found = engine.get_many(hit_keys)
        hits.add(time.perf_counter() - start)
        if found != expected:
            raise AssertionError(f"{engine.name}: a point get returned a wrong location")
        start = time.perf_counter()
        missing = engine.get_many(miss_keys)
        misses.add(time.perf_counter() - start)
        if any(value is not None for value in missing):
            raise AssertionError(f"{engine.name}: a key never written was found")
    for _ in range(work.repeats):
        start = time.perf_counter()
        counts = [len(engine.scan(lo, hi)) for lo, hi in work.bounds]
        scans.add(time.perf_counter() - start)
        if set(counts) != {work.rounds}:
            raise AssertionError(f"{engine.name}: ledger scans found {sorted(set(counts))}")
    for _ in range(work.repeats):
        start = time.perf_counter()
        seen = sum(1 for _ in engine.all_keys())
        full.add(time.perf_counter() - start)
        if seen != work.entries:
            raise AssertionError(f"{engine.name}: full scan saw {seen} of {work.entries} keys")
    result.rows["2 get existing [gets/s]"] = hits.rate(len(hit_keys))
    result.rows["2 get missing [gets/s]"] = misses.rate(len(miss_keys))
    result.rows["3 ledger scans [ledgers/s]"] = scans.rate(work.ledgers)
    result.rows["3 ledger scans [entries/s]"] = scans.rate(work.entries)
    result.rows["4 full scan [keys/s]"] = full.rate(work.entries)


def measure_other_process(
    kind: type[IndexEngine], work: Workload, path: Path, result: EngineResult
) -> None:
    """Open the DB read-only from a second process while this one holds it for writing."""
    lo, hi = work.bounds[0]
    child = subprocess.run(
        [sys.executable, __file__, "--read-only-child", kind.name, str(path), lo.hex(), hi.hex()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = child.stdout.strip().splitlines() or [f"child failed: {child.stderr[-200:]}"]
    complete = f"opened, {work.rounds} keys"
    result.rows["admin process opens live DB"] = ", ".join(
        line.split(":")[0] + (" ok" if line.endswith(complete) else " NO") for line in lines
    )
    result.notes.extend(f"second process, {line}" for line in lines)


def measure_checkpoints(engine: IndexEngine, work: Workload, result: EngineResult) -> int:
    """Workload 6: checkpoints after runs of unflushed appends, the sync-per-batch
    alternative, and whether long calls let other threads run. Returns rounds now indexed."""
    rounds = work.rounds

    def next_appends(count: int) -> tuple[list[bytes], list[bytes]]:
        nonlocal rounds
        more = appends(work.ledgers, rounds, count)
        rounds += count
        return more

    per_checkpoint = max(1, CHECKPOINT_LOAD // work.ledgers)
    load = f"{per_checkpoint * work.ledgers // 1000}k"
    checkpoints = Samples()
    for _ in range(work.repeats):
        write_all(engine, *next_appends(per_checkpoint))
        checkpoints.add(timed(engine.checkpoint))
    result.rows[f"6 checkpoint after {load}"] = checkpoints.millis()
    probed = max(1, PROBED_BATCH // work.ledgers)
    alone = timed(engine.prepare(*next_appends(probed), sync=False))
    seconds, ran = gil_probe(engine.prepare(*next_appends(probed), sync=False))
    result.rows[f"  one {probed * work.ledgers // 1000}k batch: main ran"] = (
        f"{100 * ran:.0f}% of {1000 * seconds:.0f} ms (alone {1000 * alone:.0f})"
    )
    seconds, ran = gil_probe(engine.checkpoint)
    result.rows["  a checkpoint: main ran"] = f"{100 * ran:.0f}% of {1000 * seconds:.0f} ms"
    per_batch = max(1, BATCH // work.ledgers)
    syncs = Samples()
    for _ in range(20):
        keys, values = next_appends(per_batch)
        syncs.add(timed(partial(engine.sync_write, keys, values)))
    result.rows["6 sync=True batch instead"] = syncs.millis()
    return rounds


def measure_contention(
    engine: IndexEngine, work: Workload, rounds: int, result: EngineResult
) -> int:
    """Gets and batch writes beside another busy Python thread (as the event loop is), and
    the same alone just before, on the same DB state.

    A binding that drops the GIL around every short call must win it back each time from
    the busy thread, which keeps it for up to the switch interval (5 ms): a convoy. Each
    run stops after CONTENDED_SECONDS, so a convoy cannot stall the benchmark.
    Returns rounds now indexed.
    """
    rng = random.Random(11)
    per_batch = max(1, BATCH // work.ledgers)

    def rate(step: Callable[[], int]) -> float:
        done = 0
        start = time.perf_counter()
        deadline = start + CONTENDED_SECONDS
        while done < CONTENDED_OPS and time.perf_counter() < deadline:
            done += step()
        return done / (time.perf_counter() - start)

    def get_chunk() -> int:
        keys = [work.keys[rng.randrange(work.entries)] for _ in range(BATCH)]
        engine.get_many(keys)
        return len(keys)

    def insert_batch() -> int:
        nonlocal rounds
        keys, values = appends(work.ledgers, rounds, per_batch)
        rounds += per_batch
        engine.write_batch(keys, values)
        return len(keys)

    alone = rate(get_chunk), rate(insert_batch)
    busy = threading.Event()
    spinner = threading.Thread(target=spin_until, args=(busy,))
    spinner.start()
    try:
        beside = rate(get_chunk), rate(insert_batch)
    finally:
        busy.set()
        spinner.join()
    result.rows["2 get, busy thread (alone)"] = f"{si(beside[0])} ({si(alone[0])})"
    result.rows["1 insert, busy thread (alone)"] = f"{si(beside[1])} ({si(alone[1])})"
    return rounds


def measure_delete(
    engine: IndexEngine, work: Workload, path: Path, rounds: int, result: EngineResult
) -> None:
    """Workload 5: drop every other ledger whole, reclaim the space, check the survivors."""
    before = disk_bytes(path)
    doomed = work.bounds[::2]
    deleting = timed(lambda: [engine.delete_range(lo, hi) for lo, hi in doomed])
    seconds, progress = gil_probe(engine.reclaim)
    after = disk_bytes(path)
    counts = [len(engine.scan(lo, hi)) for lo, hi in work.bounds]
    if any(counts[::2]) or set(counts[1::2]) != {rounds}:
        raise AssertionError(f"{engine.name}: wrong ledgers survived the delete")
    result.rows[f"5 delete {len(doomed)} ledgers"] = f"{deleting:.2f} s"
    result.rows["5 reclaim"] = f"{seconds:.2f} s"
    result.rows["  reclaim: main ran"] = f"{100 * progress:.0f}%"
    result.rows["5 disk before -> after"] = f"{mib(before)} -> {mib(after)}"


def bench_engine(kind: type[IndexEngine], work: Workload, scratch: Path) -> EngineResult:
    result = EngineResult()
    path = scratch / kind.name
    engine = measure_inserts(kind, work, path, result)
    measure_reads(engine, work, result)
    note(f"  {kind.name}: reads done")
    measure_other_process(kind, work, path, result)
    rounds = measure_checkpoints(engine, work, result)
    rounds = measure_contention(engine, work, rounds, result)
    measure_delete(engine, work, path, rounds, result)
    engine.close()
    shutil.rmtree(path)
    note(f"  {kind.name}: checkpoint, delete, reclaim done")
    crash_test(kind, work.ledgers, scratch, result)
    result.notes.append(
        f"checkpoint = {kind.checkpoint_call}; ledger delete = {kind.ledger_delete}; "
        f"reclaim = {kind.reclaim_call}"
    )
    return result


def crash_test(kind: type[IndexEngine], ledgers: int, scratch: Path, result: EngineResult) -> None:
    """Workload 6b: SIGKILL a loading child, reopen, and check what survived.

    Passing means: the DB opens, every entry up to the last completed checkpoint is there
    with its location, nothing is wrong or invented, and what is there is a gap-free prefix
    of the write order made of whole batches (batches are atomic).
    """
    path = scratch / f"{kind.name}-crash"
    child = subprocess.Popen(
        [sys.executable, __file__, "--crash-child", kind.name, str(path), str(ledgers)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    synced = written = checkpoints = 0
    killed = False
    for line in child.stdout:  # read on to EOF: the child may have got further than seen
        what, _, count = line.partition(" ")
        if what == "synced":
            synced, checkpoints = int(count), checkpoints + 1
        elif what == "wrote":
            written = int(count)
        if not killed and checkpoints >= CRASH_CHECKPOINTS and written >= synced + 7 * BATCH:
            child.send_signal(signal.SIGKILL)
            killed = True
    child.wait()
    row = "6 SIGKILL mid-load"
    if child.returncode != -signal.SIGKILL:
        result.rows[row] = f"FAILED: child exit {child.returncode}"
        return
    keys, values = appends(ledgers, 0, written // ledgers + 2)
    order = {key: position for position, key in enumerate(keys)}
    try:
        engine = kind(path)
    except Exception as error:
        result.rows[row] = "FAILED: no reopen"
        result.notes.append(f"SIGKILL: reopen failed: {first_line(error)}")
        return
    present: list[int] = []
    wrong = 0
    for key, value in engine.all_items():
        position = order.get(key)
        if position is None or values[position] != value:
            wrong += 1
        else:
            present.append(position)
    engine.close()
    shutil.rmtree(path)
    present.sort()
    gap_free = present == list(range(len(present)))
    whole = len(present) % BATCH == 0
    ok = not wrong and gap_free and whole and len(present) >= synced
    written = max(written, len(present))  # the batch in flight may have landed unreported
    result.rows[row] = "ok" if ok else "FAILED"
    result.rows["  unsynced that survived"] = f"{len(present) - synced} of {written - synced}"
    result.notes.append(
        f"SIGKILL: {synced} entries checkpointed, {written} written, {len(present)} back after "
        f"reopen; wrong {wrong}, gap-free {gap_free}, whole batches {whole}"
    )


def crash_child(name: str, path: Path, ledgers: int) -> None:
    """Load until killed: checkpoint every few batches, tell the parent what is durable."""
    engine = engine_named(name)(path)
    per_batch = max(1, BATCH // ledgers)
    written = 0
    for batches, rounds in enumerate(range(0, 10_000, per_batch), start=1):
        keys, values = appends(ledgers, rounds, per_batch)
        engine.write_batch(keys, values)
        written += len(keys)
        if batches % CRASH_CHECKPOINT_EVERY == 0:
            engine.checkpoint()
            print("synced", written, flush=True)
        print("wrote", written, flush=True)


def read_only_child(name: str, path: Path, lo: str, hi: str) -> None:
    kind = engine_named(name)
    for line in kind.open_from_other_process(path, bytes.fromhex(lo), bytes.fromhex(hi)):
        print(line)


# --------------------------------------------------------------------------- report


def engine_version(kind: type[IndexEngine]) -> str:
    module = importlib.import_module(kind.module)
    version = f"{kind.module} {importlib.metadata.version(kind.module)}"
    if kind.module == "plyvel":
        version += f" (LevelDB {module.__leveldb_version__}, bundled in the wheel)"
    elif kind.module == "lmdb":
        version += " (LMDB " + ".".join(str(part) for part in module.version()) + ")"
    return version


def print_table(columns: dict[str, EngineResult]) -> None:
    names = list(columns)
    found: list[str] = []
    for result in columns.values():
        found.extend(label for label in result.rows if label not in found)
    groups: list[list[str]] = []  # a numbered row and the indented rows under it
    for label in found:
        if label.startswith(" ") and groups:
            groups[-1].append(label)
        else:
            groups.append([label])
    groups.sort(key=lambda group: group[0][0] if group[0][0].isdigit() else "~")
    labels = [label for group in groups for label in group]
    cells = [[label, *(columns[name].rows.get(label, "-") for name in names)] for label in labels]
    header = ["workload", *names]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
    print(" | ".join(text.ljust(width) for text, width in zip(header, widths, strict=True)))
    print("-|-".join("-" * width for width in widths))
    for row in cells:
        print(" | ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)))
    for name, result in columns.items():
        for remark in result.notes:
            print(f"{name}: {remark}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000, help="entries to index")
    parser.add_argument("--ledgers", type=int, default=1000, help="ledgers written round robin")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each timed workload")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    parser.add_argument("--engine", action="append", help="run only this engine (repeatable)")
    parser.add_argument("--crash-child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--read-only-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.crash_child:
        name, path, ledgers = args.crash_child
        crash_child(name, Path(path), int(ledgers))
        return
    if args.read_only_child:
        name, path, lo, hi = args.read_only_child
        read_only_child(name, Path(path), lo, hi)
        return

    started = time.perf_counter()
    rounds = max(1, args.entries // args.ledgers)
    keys, values = appends(args.ledgers, 0, rounds)
    encoding = time.perf_counter() - started
    work = Workload(args.ledgers, rounds, args.repeats, keys, values)
    scratch = Path(tempfile.mkdtemp(prefix="index-engines-", dir=args.dir))
    volume = work.entries * (INDEX_KEY.size + LOCATION.size)
    print(
        f"{work.entries} entries = {work.ledgers} ledgers x {rounds}, round robin, batches of "
        f"{BATCH}; {work.repeats} repeats; figures are best (median) where repeated"
    )
    device = os.stat(scratch).st_dev
    print(f"scratch {scratch} (device {device:#x}), python {sys.version.split()[0]}")
    try:
        bulk, small = raw_disk_write(scratch, volume, work.repeats)
        table = dict_insert(keys, values, work.repeats)
        print(
            f"yardstick: sequential write + fdatasync of {mib(volume)} (same bytes): "
            f"{bulk.rate(volume / (1 << 20))} MiB/s = {bulk.rate(work.entries)} entries/s"
        )
        print(f"yardstick: 4 KiB write + fdatasync: {small.millis()}")
        print(f"yardstick: python dict insert, same keys: {table.rate(work.entries)} entries/s")
        print(f"yardstick: python key + location encoding: {si(work.entries / encoding)} entries/s")
        columns: dict[str, EngineResult] = {}
        for kind in ENGINES:
            if args.engine and kind.name not in args.engine:
                continue
            try:
                version = engine_version(kind)
            except ImportError as error:
                print(f"skipped {kind.name}: not importable ({first_line(error)})")
                continue
            print(f"engine {kind.name}: {version}")
            note(f"{kind.name}: {version}")
            begun = time.perf_counter()
            columns[kind.name] = bench_engine(kind, work, scratch)
            note(f"  {kind.name}: {time.perf_counter() - begun:.0f} s")
        print()
        print_table(columns)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
