"""`tally cluster recover` and `tally cluster export-bookie`: rebuild a lost metadata store
from what the bookies hold (issue 18; README: the metadata store was lost)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from tally.cli.console import err, failures, out, stage_progress
from tally.cli.options import ConfigFile, Metadata, SparkConf, required_metadata
from tally.core.errors import BadRequest

SHOWN = 20
"""Ledgers listed by name per verdict that needs an operator's eye; the rest are counted."""


def export_bookie(
    out_path: Annotated[
        Path,
        typer.Option(
            "--out",
            help="A directory (the export is named after the bookie) or a *.export.parquet file.",
        ),
    ],
    data_dir: Annotated[
        Path | None, typer.Option(help="The stopped bookie's journal and ledger root.")
    ] = None,
    ledger_dirs: Annotated[
        str | None, typer.Option(help="Its ledger directories, comma-separated, if not default.")
    ] = None,
    config: ConfigFile = None,
) -> None:
    """Export a stopped bookie's files for `tally cluster recover --exports` (Parquet)."""
    from tally.audit.recovery.exports import EXPORT_SUFFIX, export_path, write_export
    from tally.audit.recovery.stopped_bookie import bookie_cookie, stopped_bookie_records
    from tally.bookie.config import BookieConfig
    from tally.config import load

    with failures():
        settings = load(
            BookieConfig,
            "bookie",
            file=config,
            overrides={"data_dir": data_dir, "ledger_dirs": ledger_dirs},
        )
        cookie = bookie_cookie(settings)
        if out_path.name.endswith(EXPORT_SUFFIX):
            path = out_path
        elif out_path.suffix:
            raise BadRequest(f"--out {out_path}: give a directory, or a file *{EXPORT_SUFFIX}")
        else:
            path = export_path(out_path, cookie.bookie_id)
        with err.status(f"exporting bookie {cookie.bookie_id}"):
            counts = write_export(stopped_bookie_records(settings), path, str(settings.data_dir))
    out.print(
        f"bookie {counts.bookie_id}: {counts.ledgers:,} ledgers, {counts.deleted:,} deleted "
        f"ledgers remembered; written to {counts.path}",
        markup=False,
    )


def recover(
    metadata: Metadata = None,
    bookies: Annotated[
        str | None,
        typer.Option(help="Running bookies to ask, comma-separated addresses (host:port)."),
    ] = None,
    exports: Annotated[
        Path | None,
        typer.Option(
            help="A directory of exports (`tally cluster export-bookie`); with --bookies, "
            "theirs are added to it."
        ),
    ] = None,
    report: Annotated[
        Path,
        typer.Option(
            help="Directory for the decisions and the summary (and, without "
            "--exports, the bookies' exports)."
        ),
    ] = Path("recovery-report"),
    from_snapshot: Annotated[
        Path | None,
        typer.Option(
            help="An older `tally audit snapshot` of this cluster: its ledgers' metadata, "
            "tombstones and settings, superseded by what changed on the bookies since."
        ),
    ] = None,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            help="Write the recovered metadata into the store (empty or freshly initialised), "
            "then recover the ledgers that come back open. Without it: a report only.",
        ),
    ] = False,
    master: Annotated[str, typer.Option(help="Spark master URL.")] = "local[*]",
    conf: SparkConf = None,
) -> None:
    """Rebuild a lost metadata store from the bookies: a report, then (--apply) the store.

    Every ledger comes back from the copy of its metadata its bookies keep (exact), or is
    inferred from which bookie holds which entries; ledgers not closed come back open and
    are recovered by fencing, never closed from a guess; ledgers a bookie deleted under
    their tombstone stay deleted. With --from-snapshot, an older snapshot's metadata stands
    in where the bookies hold no newer copy. Running it again finishes a run cut short.
    """
    from tally.audit.config import parse_spark_conf
    from tally.audit.recovery.exports import export_path, export_running_bookie

    uri = required_metadata(metadata) if apply else metadata
    with failures():
        spark_conf = parse_spark_conf(conf or ())
    if bookies is None and exports is None:
        raise typer.BadParameter("give --bookies, --exports or both", param_hint="--bookies")
    with failures():
        if bookies is not None:
            if exports is None:
                exports = report / "exports"
                shutil.rmtree(exports, ignore_errors=True)  # a previous run's
            addresses = [address.strip() for address in bookies.split(",") if address.strip()]
            with stage_progress() as progress:
                for done, address in enumerate(addresses, start=1):
                    asyncio.run(export_running_bookie(address, export_path(exports, address)))
                    progress("bookies exported", done, len(addresses))
        assert exports is not None
        summary = _decide(exports, report, master, spark_conf, from_snapshot)
        _print_summary(summary, report)
        if apply:
            assert uri is not None
            _apply(uri, report)


def _decide(
    exports: Path, report: Path, master: str, conf: dict[str, str], snapshot: Path | None
) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from tally.audit.checks import spark_session
    from tally.audit.recovery.job import read_cookies, read_snapshot, run_recovery
    from tally.core.metadata_recovery import cluster_instance

    # Before Spark starts: exports of two clusters, or a snapshot of another, are refused in
    # a second, not a minute.
    instance_id = cluster_instance(
        {bookie: cookie.instance_id for bookie, cookie in read_cookies(exports).items()}
    )
    if snapshot is not None:
        read_snapshot(snapshot, instance_id)

    started_here = SparkSession.getActiveSession() is None
    with err.status(f"starting Spark ({master})"):
        spark = spark_session(master, conf=conf)
    try:
        with err.status(f"deciding every ledger of the exports in {exports}"):
            return run_recovery(spark, exports, report, snapshot)
    finally:
        if started_here:
            spark.stop()


def _apply(uri: str, report: Path) -> None:
    from tally.audit.recovery.apply import apply_recovery
    from tally.metadata.stores import open_store

    async def run() -> Any:
        async with open_store(uri) as store:
            with stage_progress() as progress:
                return await apply_recovery(store, report, progress=progress)

    applied = asyncio.run(run())
    out.print(
        f"written into {uri}: {applied.cookies_written} cookies, {applied.ledgers_written:,} "
        f"ledgers ({applied.ledgers_present:,} already there); {applied.recovered:,} ledgers "
        "recovered and closed",
        markup=False,
    )
    if applied.recovery_failed:
        err.print(
            f"{len(applied.recovery_failed)} recoveries failed (they stay open; run again once "
            "their bookies answer):",
            markup=False,
        )
        for ledger, why in list(applied.recovery_failed.items())[:SHOWN]:
            err.print(f"  {ledger}: {why}", markup=False)
        raise typer.Exit(1)
    out.print("start the bookies again: they find their cluster and cookies", markup=False)


def _print_summary(summary: dict[str, Any], report: Path) -> None:
    table = Table(box=box.SIMPLE, title=f"ledgers of cluster {summary['instance_id']}")
    table.add_column("verdict")
    table.add_column("ledgers", justify="right")
    for verdict, count in summary["ledgers"].items():
        table.add_row(verdict, f"{count:,}")
    out.print(table)
    out.print(
        f"{summary['needs_recovery']:,} come back open, for recovery; {summary['incomplete']:,} "
        f"lack entries no bookie holds ({summary['lost_entries']:,} entries); from "
        f"{len(summary['bookies'])} bookies. Decisions: {report / 'ledgers'}",
        markup=False,
    )
    _list_notable(report)


def _list_notable(report: Path) -> None:
    """Name the ledgers an operator must look at: not recoverable, soft-deleted, incomplete."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from tally.audit.recovery.job import DECISIONS_SCHEMA, LEDGERS
    from tally.audit.schema import from_int64
    from tally.core.ids import LedgerId
    from tally.core.metadata_recovery import SOFT_DELETED

    decisions = ds.dataset(str(report / LEDGERS), schema=DECISIONS_SCHEMA)
    notable = (
        (ds.field("verdict") == "not_recoverable")
        | (ds.field("lost_entries") > 0)
        | pc.starts_with(ds.field("reason"), SOFT_DELETED)
    )
    rows = decisions.to_table(filter=notable).slice(0, SHOWN).to_pylist()
    for row in rows:
        name = LedgerId(from_int64(row["scope"]), from_int64(row["ledger_id"])).qualified_name
        lost = f"; {row['lost_entries']:,} entries held by no bookie" if row["lost_entries"] else ""
        out.print(f"  ledger {name}: {row['verdict']}: {row['reason'] or '-'}{lost}", markup=False)
