"""Several ledger storages' figures as one: their counters for the bookie's metrics (the
last complete scrub pass is the oldest directory's last one: all have had one since), and
their garbage collection reports of one run."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable

from tally.bookie.compactor import GcReport, GcStats
from tally.bookie.index import FoundBy
from tally.bookie.ledger_storage import LedgerStorageStats
from tally.bookie.scrubber import ScrubStats
from tally.core.compaction import CompactionKind


def summed(found: list[LedgerStorageStats]) -> LedgerStorageStats:
    """The counters of several directories' storages, as one."""
    total = {
        field.name: sum(getattr(stats, field.name) for stats in found)
        for field in dataclasses.fields(LedgerStorageStats)
        if field.name
        not in ("gc", "checkpoints", "last_checkpoint_seconds", "scrub", "corrupt_marked")
    }
    gc = GcStats(
        runs=max(stats.gc.runs for stats in found),
        deleted_entry_logs=sum(stats.gc.deleted_entry_logs for stats in found),
        released_journal_files=sum(stats.gc.released_journal_files for stats in found),
        compacted_entry_logs=_counts(stats.gc.compacted_entry_logs for stats in found),
        compacted_journal_files=_counts(stats.gc.compacted_journal_files for stats in found),
        reclaimed_deletion_bytes=sum(stats.gc.reclaimed_deletion_bytes for stats in found),
        reclaimed_compaction_bytes=sum(stats.gc.reclaimed_compaction_bytes for stats in found),
        moved_entries=sum(stats.gc.moved_entries for stats in found),
        moved_bytes=sum(stats.gc.moved_bytes for stats in found),
        last_compaction_bytes_per_second=max(
            stats.gc.last_compaction_bytes_per_second for stats in found
        ),
        last_files=tuple(f for stats in found for f in stats.gc.last_files),
    )
    scrub = ScrubStats(
        bytes=sum(stats.scrub.bytes for stats in found),
        entries=sum(stats.scrub.entries for stats in found),
        corrupt=sum(stats.scrub.corrupt for stats in found),
        unreadable=sum(stats.scrub.unreadable for stats in found),
        passes=sum(stats.scrub.passes for stats in found),
        last_complete=None
        if any(stats.scrub.last_complete is None for stats in found)
        else min(stats.scrub.last_complete or 0.0 for stats in found),
    )
    corrupt_marked: dict[FoundBy, int] = defaultdict(int)
    for stats in found:
        for by, count in stats.corrupt_marked.items():
            corrupt_marked[by] += count
    return LedgerStorageStats(
        **total,
        scrub=scrub,
        corrupt_marked=dict(corrupt_marked),
        checkpoints=max(stats.checkpoints for stats in found),
        last_checkpoint_seconds=max(stats.last_checkpoint_seconds for stats in found),
        gc=gc,
    )


def _counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = defaultdict(int)
    for one in counts:
        for name, count in one.items():
            total[name] += count
    return dict(total)


_COMPACTION_ORDER = (CompactionKind.NONE, CompactionKind.MINOR, CompactionKind.MAJOR)


def combined(reports: list[GcReport]) -> GcReport:
    """The reports of one garbage collection run over several directories, as one."""
    return GcReport(
        now=reports[0].now,
        seconds=sum(r.seconds for r in reports),
        compaction=max((r.compaction for r in reports), key=_COMPACTION_ORDER.index),
        finished=all(r.finished for r in reports),
        suspended=next((r.suspended for r in reports if r.suspended), None),
        deleted_entry_logs=tuple(i for r in reports for i in r.deleted_entry_logs),
        released_journal_files=tuple(i for r in reports for i in r.released_journal_files),
        compacted_entry_logs=tuple(i for r in reports for i in r.compacted_entry_logs),
        compacted_journal_files=tuple(i for r in reports for i in r.compacted_journal_files),
        reclaimed_bytes=sum(r.reclaimed_bytes for r in reports),
        moved_entries=sum(r.moved_entries for r in reports),
        moved_bytes=sum(r.moved_bytes for r in reports),
        compaction_seconds=sum(r.compaction_seconds for r in reports),
        files=tuple(f for r in reports for f in r.files),
        failures=tuple(f for r in reports for f in r.failures),
    )
