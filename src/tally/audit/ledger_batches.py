"""Rows sorted by ledger, as Spark's `mapInArrow` hands them over: batches whose last ledger
may go on in the next one. The Spark passes (the audit, the metadata recovery) judge whole
ledgers, so the rows of a batch's last ledger wait for the next batch."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa


def ledger_starts(table: pa.Table) -> np.ndarray:
    """Row indexes where a ledger's rows begin (by `scope` and `ledger_id`), then the row
    count."""
    scopes = table.column("scope").to_numpy()
    ids = table.column("ledger_id").to_numpy()
    changes = np.flatnonzero((scopes[1:] != scopes[:-1]) | (ids[1:] != ids[:-1])) + 1
    return np.concatenate(([0], changes, [table.num_rows])).astype(np.int64)


def whole_ledgers(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.Table]:
    """The rows of `batches` (sorted by ledger) as tables of whole ledgers."""
    pending: pa.Table | None = None
    for batch in batches:
        table = pa.Table.from_batches([batch])
        if pending is not None and pending.num_rows:
            table = pa.concat_tables([pending, table])
        starts = ledger_starts(table)
        pending = table.slice(int(starts[-2]))
        if len(starts) > 2:
            yield table.slice(0, int(starts[-2]))
    if pending is not None and pending.num_rows:
        yield pending
