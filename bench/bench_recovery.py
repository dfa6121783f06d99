"""Measure the metadata recovery's job (issue 18): the time to decide N ledgers from the exports
of 4 bookies on Spark (local[2]), against the time to read the same exports (pyarrow, every
column of every row: the least a pass over them takes), in the same run.

    python bench/bench_recovery.py [--ledgers N] [--dir D]

The exports are made up: closed ledgers of 100 entries, E3 WQ2 over 4 bookies round-robin,
each bookie holding what the schedule gives it and the ledger's metadata copy, as a
healthy cluster's bookies would. `main()` returns the figures as a dict.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow.dataset as ds

from tally.audit.checks import spark_session
from tally.audit.recovery.exports import export_files, export_path, write_export
from tally.audit.recovery.job import run_recovery
from tally.core.digest import DigestType
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.protocol import StateRecord
from tally.core.schedule import expected_entries
from tally.metadata.cookies import Cookie

BOOKIES = [f"10.0.0.{n}:3181" for n in range(1, 5)]
ENTRIES = 100
INSTANCE = "bench-cluster"


def ledger(number: int) -> LedgerMetadata:
    ensemble = tuple(BOOKIES[(number + k) % len(BOOKIES)] for k in range(3))
    created = LedgerMetadata.create(
        ensemble=ensemble,
        write_quorum=2,
        ack_quorum=2,
        digest_type=DigestType.CRC32C,
        password=b"bench",
        ctime_ms=1_700_000_000_000 + number,
        creator_token=number.to_bytes(8, "big"),
    )
    return created.close(ENTRIES - 1, ENTRIES * 100)


def records(bookie: str, count: int) -> Iterator[StateRecord]:
    yield StateRecord.cookie_of(Cookie(bookie, ("/j", "/l"), INSTANCE, "inc").to_bytes())
    for number in range(1, count + 1):
        metadata = ledger(number)
        ensemble = metadata.segments[0].ensemble
        if bookie not in ensemble:
            continue
        held = expected_entries(0, ENTRIES - 1, 3, 2, ensemble.index(bookie))
        yield StateRecord.held(
            LedgerId(0, number),
            held.to_bytes(),
            fenced=False,
            last_add_confirmed=ENTRIES - 2,
            master_key=metadata.master_key,
            metadata_copy=metadata.to_bytes(),
        )


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledgers", type=int, default=100_000)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(dir=args.dir, prefix="bench-recovery-"))
    try:
        exports = scratch / "exports"
        started = time.perf_counter()
        for bookie in BOOKIES:
            write_export(records(bookie, args.ledgers), export_path(exports, bookie), bookie)
        made = time.perf_counter() - started
        started = time.perf_counter()
        dataset = ds.dataset([str(path) for path in export_files(exports)])
        rows = sum(batch.num_rows for batch in dataset.to_batches())
        read = time.perf_counter() - started
        spark = spark_session("local[2]")
        try:
            started = time.perf_counter()
            summary = run_recovery(spark, exports, scratch / "report")
            decided = time.perf_counter() - started
        finally:
            spark.stop()
        assert summary["ledgers"]["exact"] == args.ledgers, summary
        figures = {
            "ledgers": args.ledgers,
            "export_rows": rows,
            "exports_made_s": round(made, 2),
            "exports_read_s": round(read, 3),
            "recovery_job_s": round(decided, 2),
            "ledgers_per_s": round(args.ledgers / decided),
            "job_over_read": round(decided / read, 1),
        }
        print(json.dumps(figures, indent=2))
        return figures
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
