"""A bookie's Prometheus metrics, named after BookKeeper's where it has the figure.

Request counters and latencies are updated on the request path, in plain ints and floats
that the scrape reads: prometheus_client's labelled counter and histogram take a lock and
run Python checks per update, a noticeable part of an add (docs/benchmarks.md).
They are updated from the event loop's thread only. The journal's and the ledger storage's
own counters are read only when Prometheus scrapes, so the hot path pays nothing for them.
The journal's batch size is `rate(bookie_journal_records_total) /
rate(bookie_journal_batches_total)`.
"""

from __future__ import annotations

import shutil
from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import accumulate
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from tally.bookie.compactor import GcStats
from tally.bookie.journal import JournalStats
from tally.bookie.ledger_directories import LedgerDirectory
from tally.bookie.ledger_storage import LedgerStorageStats
from tally.core.compaction import FileKind
from tally.core.receive_limits import ReceiveBudget

_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
_LIVE_FRACTION_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class BookieMetrics:
    """Every metric of one bookie, in a registry of its own (several bookies per test)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = RequestCounter(
            "bookie_requests",
            "Requests answered, by operation (FENCE: a fencing read) and result (ok or the "
            "error's name)",
        )
        self.add_entry_seconds = LatencyHistogram(
            "bookie_add_entry_seconds",
            "ADD: from the request's arrival to its acknowledgement (after fdatasync)",
        )
        self.read_entry_seconds = LatencyHistogram(
            "bookie_read_entry_seconds", "READ: from the request's arrival to the answer"
        )
        for collector in (self.requests, self.add_entry_seconds, self.read_entry_seconds):
            self.registry.register(collector)
        self.malformed_frames = Counter(
            "bookie_malformed_frames",
            "Connections closed because a frame was too large, truncated or malformed",
            registry=self.registry,
        )
        self.connections = Gauge(
            "bookie_connections", "Open client connections", registry=self.registry
        )
        self.read_only = Gauge(
            "bookie_read_only", "1 while the bookie refuses writes", registry=self.registry
        )
        self.receive_buffer_bytes = Gauge(
            "bookie_receive_buffer_bytes",
            "Bytes held for frames begun and not yet complete, over all connections "
            "(receive_buffer_limit_bytes at most)",
            registry=self.registry,
        )
        self.receive_paused_connections = Gauge(
            "bookie_receive_paused_connections",
            "Connections not read until the receive budget has room for their frame",
            registry=self.registry,
        )
        self.receive_stalled_connections = Counter(
            "bookie_receive_stalled_connections",
            "Connections closed because their unfinished frame got no byte for "
            "receive_stall_timeout",
            registry=self.registry,
        )
        self.journal_failed = Gauge(
            "bookie_journal_failed",
            "1 while the journal takes no records (a write failed; out of room, it is retried "
            "in a new file every journal_retry_interval)",
            registry=self.registry,
        )
        self.corrupt_entries_reported = Counter(
            "bookie_corrupt_entries_reported",
            "Copies marked corrupt here and filed for repair (named in their ledger's "
            "under-replication mark); a copy filed again after a restart counts again",
            registry=self.registry,
        )
        self.recovery_adds_kept = Counter(
            "bookie_recovery_add_entry_kept",
            "Recovery adds acknowledged without writing: the entry's copy here checked out "
            "intact with the same CRC32C (a repair writes over bad copies only)",
            registry=self.registry,
        )
        self.ledgers_in_limbo = Gauge(
            "bookie_ledgers_in_limbo",
            "Ledgers whose entries this bookie may have lost (a damaged journal): it answers "
            "'unknown' for the entries it lacks until they are repaired",
            registry=self.registry,
        )

    def watch_receive_budget(self, budget: ReceiveBudget[Any]) -> None:
        """Read the receive budget's bytes held and waiters at scrape time."""
        self.receive_buffer_bytes.set_function(lambda: budget.held)
        self.receive_paused_connections.set_function(lambda: budget.waiting)

    def watch(
        self,
        journal: Callable[[], JournalStats],
        storage: Callable[[], LedgerStorageStats],
        directories: Callable[[], list[LedgerDirectory]],
    ) -> None:
        """Export the journal's, the storage's and the ledger directories' figures at scrape
        time."""
        self.registry.register(_StorageCollector(journal, storage, directories))


class RequestCounter(Collector):
    """A counter by (operation, result), exported as `<name>_total{operation, result}`."""

    def __init__(self, name: str, documentation: str) -> None:
        self._name = name
        self._documentation = documentation
        self._counts: dict[tuple[str, str], int] = {}

    def inc(self, operation: str, result: str, count: int = 1) -> None:
        key = (operation, result)
        self._counts[key] = self._counts.get(key, 0) + count

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            self._name, self._documentation, labels=("operation", "result")
        )
        for labels, count in sorted(dict(self._counts).items()):
            family.add_metric(labels, count)
        yield family


class LatencyHistogram(Collector):
    """A histogram of seconds over `_LATENCY_BUCKETS`, exported as Prometheus's histograms
    are (`<name>_bucket{le}`, `<name>_count`, `<name>_sum`)."""

    def __init__(self, name: str, documentation: str) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = (*_LATENCY_BUCKETS, float("inf"))
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0

    def observe(self, seconds: float, count: int = 1) -> None:
        """`count` events that each took `seconds` (the adds answered together)."""
        self._counts[bisect_left(self._bounds, seconds)] += count
        self._sum += seconds * count

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative = accumulate(list(self._counts))
        buckets = [
            (_le(bound), count) for bound, count in zip(self._bounds, cumulative, strict=True)
        ]
        yield HistogramMetricFamily(
            self._name, self._documentation, buckets=buckets, sum_value=self._sum
        )


class _StorageCollector(Collector):
    def __init__(
        self,
        journal: Callable[[], JournalStats],
        storage: Callable[[], LedgerStorageStats],
        directories: Callable[[], list[LedgerDirectory]],
    ) -> None:
        self._journal = journal
        self._storage = storage
        self._directories = directories

    def collect(
        self,
    ) -> Iterator[CounterMetricFamily | GaugeMetricFamily | GaugeHistogramMetricFamily]:
        journal = self._journal()
        yield CounterMetricFamily(
            "bookie_journal_records", "Records made durable", value=journal.records
        )
        yield CounterMetricFamily(
            "bookie_journal_batches", "Group commits (one fdatasync each)", value=journal.batches
        )
        yield CounterMetricFamily(
            "bookie_journal_bytes", "Bytes written to the journal", value=journal.bytes_written
        )
        yield CounterMetricFamily(
            "bookie_journal_write_failures",
            "Journal failures: a write, fdatasync, preallocation or new file that failed and "
            "stopped the journal, or a failed attempt to resume it in a new file",
            value=journal.write_failures,
        )
        # Quantiles of the journal's window of recent fdatasyncs. Not a summary: its count and
        # sum would shrink as the window slides, which Prometheus reads as counter resets.
        for q in (0.5, 0.99):
            yield GaugeMetricFamily(
                f"bookie_journal_sync_seconds_p{round(q * 100)}",
                f"Journal fdatasync latency, {q:.0%} quantile of the recent group commits",
                value=journal.fdatasync_quantile(q),
            )
        storage = self._storage()
        yield CounterMetricFamily(
            "bookie_ledger_storage_entries_added", "Entries stored", value=storage.entries_added
        )
        yield CounterMetricFamily(
            "bookie_ledger_storage_bytes_added", "Entry bytes stored", value=storage.bytes_added
        )
        yield CounterMetricFamily(
            "bookie_ledger_storage_read_errors",
            "Reads of indexed entries whose bytes were unreadable or corrupt",
            value=storage.read_errors,
        )
        yield GaugeMetricFamily(
            "bookie_write_cache_bytes",
            "Entry bytes awaiting a checkpoint",
            value=storage.cache_bytes,
        )
        yield CounterMetricFamily(
            "bookie_checkpoints", "Checkpoints completed", value=storage.checkpoints
        )
        yield CounterMetricFamily(
            "bookie_entries_kept_in_journal",
            "Checkpointed entries indexed where the journal holds them, not copied",
            value=storage.entries_kept_in_journal,
        )
        yield GaugeMetricFamily(
            "bookie_kept_journal_files",
            "Journal files kept because the index points into them",
            value=storage.kept_journal_files,
        )
        yield GaugeMetricFamily(
            "bookie_checkpoint_last_seconds",
            "Duration of the last checkpoint",
            value=storage.last_checkpoint_seconds,
        )
        directories = self._directories()
        serving = [Path(d.name) for d in directories if not d.failed]
        yield GaugeMetricFamily(
            "bookie_index_bytes",
            "Size of the entry indexes on disk",
            value=sum(_size(d / "index") for d in serving),
        )
        yield GaugeMetricFamily(
            "bookie_ledger_disk_usage_ratio",
            "Used fraction of the fullest ledger disk in service",
            value=max((_used(d) for d in serving), default=0.0),
        )
        failed = GaugeMetricFamily(
            "bookie_ledger_dir_failed",
            "1 for a ledger directory out of service since its disk failed",
            labels=("dir",),
        )
        ledgers = GaugeMetricFamily(
            "bookie_ledger_dir_ledgers", "Ledgers placed on each ledger directory", labels=("dir",)
        )
        for directory in directories:
            failed.add_metric((directory.name,), 1 if directory.failed else 0)
            ledgers.add_metric((directory.name,), directory.ledgers)
        yield failed
        yield ledgers
        yield from _gc_metrics(storage.gc)
        yield from _scrub_metrics(storage)


def _scrub_metrics(
    storage: LedgerStorageStats,
) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """The scrubber's figures (BookKeeper-like names), and the corrupt marks."""
    scrub = storage.scrub
    for name, what, value in (
        (
            "bookie_scrub_bytes",
            "Bytes of entry logs and journal files read by the scrubber",
            scrub.bytes,
        ),
        ("bookie_scrub_entries", "Entries read back and checked by the scrubber", scrub.entries),
        (
            "bookie_scrub_corrupt_entries",
            "Entries the scrubber found corrupt (each pass that finds one counts it)",
            scrub.corrupt,
        ),
        (
            "bookie_scrub_unreadable_entries",
            "Entries the scrubber could not read (an I/O error, a missing file): not marked",
            scrub.unreadable,
        ),
        ("bookie_scrub_passes", "Scrub passes completed", scrub.passes),
    ):
        yield CounterMetricFamily(name, what, value=value)
    yield GaugeMetricFamily(
        "bookie_scrub_last_complete_pass_time_seconds",
        "When the last complete scrub pass ended, seconds since the epoch (0: never)",
        value=scrub.last_complete or 0.0,
    )
    yield GaugeMetricFamily(
        "bookie_corrupt_entries",
        "Entries whose copy here is marked corrupt (answered EntryCorrupt until replaced)",
        value=storage.corrupt_entries,
    )
    marked = CounterMetricFamily(
        "bookie_corrupt_entries_marked",
        "Copies marked corrupt since the bookie started, by who found them",
        labels=("found_by",),
    )
    for found_by, count in sorted(storage.corrupt_marked.items(), key=lambda item: item[0].value):
        marked.add_metric((found_by.value,), count)
    yield marked


def _gc_metrics(
    gc: GcStats,
) -> Iterator[CounterMetricFamily | GaugeMetricFamily | GaugeHistogramMetricFamily]:
    """Garbage collection's figures (BookKeeper's bookie_gc_* in its words)."""
    yield CounterMetricFamily("bookie_gc_runs", "Garbage collection runs", value=gc.runs)
    reclaimed = CounterMetricFamily(
        "bookie_gc_reclaimed_bytes",
        "Disk bytes given back by garbage collection: by deletion of files with no live entry, "
        "by compaction of sparse ones (journal files go at the journal's next release)",
        labels=("by",),
    )
    reclaimed.add_metric(("deletion",), gc.reclaimed_deletion_bytes)
    reclaimed.add_metric(("compaction",), gc.reclaimed_compaction_bytes)
    yield reclaimed
    yield CounterMetricFamily(
        "bookie_gc_deleted_entry_logs",
        "Entry logs deleted for holding no entry of a ledger in the index",
        value=gc.deleted_entry_logs,
    )
    yield CounterMetricFamily(
        "bookie_gc_released_journal_files",
        "Journal files let go for holding no kept entry of a ledger in the index",
        value=gc.released_journal_files,
    )
    for name, what, counts in (
        ("bookie_gc_compacted_entry_logs", "Entry logs", gc.compacted_entry_logs),
        ("bookie_gc_compacted_journal_files", "Kept journal files", gc.compacted_journal_files),
    ):
        family = CounterMetricFamily(
            name, f"{what} compacted (live entries copied away, then deleted)", labels=("type",)
        )
        for compaction, count in sorted(counts.items()):
            family.add_metric((compaction,), count)
        yield family
    yield CounterMetricFamily(
        "bookie_gc_moved_bytes", "Live entry bytes copied by compaction", value=gc.moved_bytes
    )
    yield CounterMetricFamily(
        "bookie_gc_moved_entries", "Live entries copied by compaction", value=gc.moved_entries
    )
    yield GaugeMetricFamily(
        "bookie_gc_compaction_bytes_per_second",
        "Live bytes moved per second by the last compaction",
        value=gc.last_compaction_bytes_per_second,
    )
    live = GaugeHistogramMetricFamily(
        "bookie_gc_live_fraction",
        "Live fraction of the entry logs and kept journal files, as the last garbage "
        "collection counted them",
        labels=("kind",),
    )
    for kind in FileKind:
        fractions = [f.live_fraction for f in gc.last_files if f.kind is kind]
        buckets = [
            (_le(bound), sum(1 for fraction in fractions if fraction <= bound))
            for bound in (*_LIVE_FRACTION_BUCKETS, float("inf"))
        ]
        live.add_metric((kind.value,), buckets, gsum_value=sum(fractions))
    yield live
    for name, what, value in (
        ("bookie_gc_live_bytes", "Live bytes", sum(f.live_bytes for f in gc.last_files)),
        ("bookie_gc_file_bytes", "Disk bytes", sum(f.total_bytes for f in gc.last_files)),
    ):
        yield GaugeMetricFamily(
            name,
            f"{what} of the entry logs and kept journal files that the last garbage "
            "collection looked at",
            value=value,
        )


def _le(bound: float) -> str:
    """A bucket's bound as Prometheus's client libraries write it."""
    return "+Inf" if bound == float("inf") else repr(bound)


def _used(directory: Path) -> float:
    try:
        usage = shutil.disk_usage(directory)
    except OSError:  # failing just now: the next scrape leaves it out
        return 0.0
    return usage.used / usage.total if usage.total else 0.0


def _size(directory: Path) -> int:
    total = 0
    for path in directory.rglob("*"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # a compaction removed it meanwhile
            continue
    return total
