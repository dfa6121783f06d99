"""`tally audit snapshot | run | confirm | synth`: the cluster audit pipeline on Spark."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table

from tally.audit.config import AuditConfig
from tally.cli.console import err as _err
from tally.cli.console import failures as _failures
from tally.cli.console import out as _out
from tally.cli.console import stage_progress as _progress
from tally.cli.options import ConfigFile, Metadata, SparkConf, existing_metadata
from tally.config import load

if TYPE_CHECKING:
    from tally.audit.snapshot import Progress

app = typer.Typer(
    name="audit",
    help="Audit a whole cluster on Spark: snapshot it, check every ledger, confirm, report.",
    no_args_is_help=True,
)


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86_400}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")


def parse_duration(text: str) -> float:
    """A duration such as "1h", "30m", "90s", "250ms", "2d" or "1h30m", in seconds."""
    compact = text.strip().replace(" ", "")
    if compact == "0":
        return 0.0
    parts = _DURATION.findall(compact)
    if not compact or "".join(number + unit for number, unit in parts) != compact:
        raise typer.BadParameter(
            f"{text!r} is not a duration: use a number and a unit (ms, s, m, h, d), e.g. 1h or 90s"
        )
    return float(sum(int(number) * _UNITS[unit] for number, unit in parts))


_FLAGS = {
    "spark_conf": "--conf",
    "spark_master": "--master",
    "min_num_racks_per_write_quorum": "--min-racks",
}
"""The flags of the settings whose flag is not named after them."""


def _settings(config: Path | None, **overrides: Any) -> AuditConfig:
    with _failures():
        return load(AuditConfig, "audit", file=config, overrides=overrides, flags=_FLAGS)


@app.command("snapshot")
def snapshot(
    out: Annotated[Path, typer.Option("--out", help="Directory to write the snapshot into.")],
    metadata: Metadata = None,
    master: Annotated[
        str | None,
        typer.Option(
            help="Take it as a Spark job on this master (local[2], spark://host:7077, ...): "
            "ranges of ledgers and the bookies' dumps exported by parallel tasks. Default: "
            "in this process, or on spark_master from spark_snapshot_from ledgers on."
        ),
    ] = None,
    conf: SparkConf = None,
    config: ConfigFile = None,
) -> None:
    """Export the cluster's metadata and every bookie's availability as Parquet.

    On Spark, the executors must reach the metadata store and the bookies, and see --out
    at the same path as this driver.
    """
    from tally.audit.snapshot import ledgers_allocated, take_snapshot

    with _failures():
        uri = existing_metadata(metadata)
    settings = _settings(
        config,
        metadata=uri,
        spark_conf=None if conf is None else tuple(conf),
    )
    with _failures():
        if master is None:
            allocated = asyncio.run(ledgers_allocated(settings.metadata, settings))
            if allocated >= settings.spark_snapshot_from:
                master = settings.spark_master
                _err.print(
                    f"{allocated:,} ledger ids handed out (spark_snapshot_from = "
                    f"{settings.spark_snapshot_from:,}): taking the snapshot as a Spark job "
                    f"on {master}",
                    markup=False,
                )
    with _progress() as progress, _failures():
        if master is None:
            summary = asyncio.run(
                take_snapshot(settings.metadata, out, progress=progress, config=settings)
            )
        else:
            summary = _spark_snapshot(settings, master, out, progress)
    _print_counts("snapshot", summary.get("counts", {}))
    _out.print(f"snapshot written to {out}", markup=False)


def _spark_snapshot(
    settings: AuditConfig, master: str, out: Path, progress: Progress
) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from tally.audit.checks import spark_session
    from tally.audit.snapshot_job import take_snapshot_on_spark

    started_here = SparkSession.getActiveSession() is None
    spark = spark_session(master, memory=settings.spark_memory, conf=settings.spark_settings)
    try:
        return take_snapshot_on_spark(
            spark, settings.metadata, out, config=settings, progress=progress
        )
    finally:
        if started_here:
            spark.stop()


@app.command("run")
def run(
    snapshot: Annotated[Path, typer.Option("--snapshot", help="A snapshot directory.")],
    out: Annotated[Path, typer.Option("--out", help="Directory for violations and the report.")],
    master: Annotated[
        str | None, typer.Option(help="Spark master URL (default: local[*]).")
    ] = None,
    grace_period: Annotated[
        str | None,
        typer.Option(
            help="How long a ledger may stay marked under-replicated before it is reported: "
            "1h, 30m; 0 never reports it (as the auditor's grace period of 0). Default: 1h."
        ),
    ] = None,
    min_racks: Annotated[
        int | None,
        typer.Option(min=1, help="Racks every write set must span (capped at WQ; default 2)."),
    ] = None,
    conf: SparkConf = None,
    config: ConfigFile = None,
) -> None:
    """Check every closed ledger of a snapshot on Spark; write violations and a report.

    Any master runs it, with executors that do not have tally installed (see `tally audit
    executors`); the snapshot and --out must be at the same path on the driver and every
    executor. A Spark session already running in this process is used (and left running).
    """
    from pyspark.sql import SparkSession

    from tally.audit import schema
    from tally.audit.checks import run_audit, spark_session

    settings = _settings(
        config,
        spark_master=master,
        grace_period=None if grace_period is None else parse_duration(grace_period),
        min_num_racks_per_write_quorum=min_racks,
        spark_conf=None if conf is None else tuple(conf),
    )
    with _failures():
        schema.require_snapshot(snapshot)
        started_here = SparkSession.getActiveSession() is None
        with _err.status(f"starting Spark ({settings.spark_master})"):
            spark = spark_session(
                settings.spark_master,
                memory=settings.spark_memory,
                conf=settings.spark_settings,
            )
        try:
            with _err.status(f"auditing {snapshot}"):
                summary = run_audit(
                    spark,
                    snapshot,
                    out,
                    grace_period_ms=int(settings.grace_period * 1000),
                    min_racks=settings.min_num_racks_per_write_quorum,
                )
        finally:
            if started_here:
                spark.stop()
    _print_summary(summary)
    _out.print(f"report: {out / schema.REPORT_HTML}", markup=False)


@app.command("confirm")
def confirm(
    report: Annotated[Path, typer.Option("--report", help="The output directory of a run.")],
    metadata: Metadata = None,
    config: ConfigFile = None,
) -> None:
    """Re-check each reported ledger against the live cluster and drop what has changed.

    The run's own grace period and racks (in its summary.json) are the rules; the live
    cluster is read with the client's settings (the config file's [client] section)."""
    from tally.audit.confirm import confirm as confirm_report
    from tally.client.config import ClientConfig

    with _failures():
        uri = existing_metadata(metadata)
    settings = _settings(config, metadata=uri)
    params = _run_params(report)
    with _failures():
        client = load(ClientConfig, "client", file=config)
    with _progress() as progress, _failures():
        summary = asyncio.run(
            confirm_report(
                report,
                settings.metadata,
                progress=progress,
                grace_period_ms=params.get("grace_period_ms"),
                min_racks=params.get("min_racks", settings.min_num_racks_per_write_quorum),
                client=client,
            )
        )
    table = Table(box=box.SIMPLE, title="confirmed findings")
    table.add_column("category")
    table.add_column("confirmed", justify="right")
    for category, count in summary.get("categories", {}).items():
        table.add_row(category, f"{count:,}")
    _out.print(table)
    _out.print(
        f"{summary.get('confirmed', 0):,} findings confirmed, {summary.get('dropped', 0):,} "
        "dropped as changed since the snapshot",
        markup=False,
    )


@app.command("synth")
def synth(
    ledgers: Annotated[int, typer.Option(min=0, help="Ledgers to generate.")],
    bookies: Annotated[int, typer.Option(min=1, help="Bookies in the cluster.")],
    racks: Annotated[int, typer.Option(min=1, help="Racks they stand in.")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write the snapshot into.")],
    faults: Annotated[
        str, typer.Option(help='Faults to inject: "kind=count,...", or "default".')
    ] = "",
    seed: Annotated[int, typer.Option(min=0, help="Seed: the same seed, the same bytes.")] = 0,
) -> None:
    """Write a synthetic snapshot with known faults (listed in truth.json)."""
    from tally.audit.synth import synthesize

    with _progress() as progress, _failures():
        summary = synthesize(
            out,
            ledgers=ledgers,
            bookies=bookies,
            racks=racks,
            faults=faults,
            seed=seed,
            progress=progress,
        )
    _print_counts("synthetic snapshot", summary.get("counts", {}))
    _out.print(f"snapshot and truth.json written to {out}", markup=False)


@app.command("executors")
def executors() -> None:
    """What the executors of a Spark cluster need to run the audit: tally itself is shipped
    by every job; the rest is their image's to have."""
    import pyspark

    from tally.audit.executors import executor_requirements, python_version

    _out.print(
        "# Executors of tally's Spark jobs (audit snapshot --master, audit run, cluster "
        "recover):\n"
        f"# Spark {pyspark.__version__} on the workers, Python {python_version()} as their "
        "python3 (or --conf spark.pyspark.python=PATH),\n"
        "# and these packages (pip install -r this file); tally's code is shipped by the job.",
        markup=False,
    )
    for requirement in executor_requirements():
        _out.print(requirement, markup=False)


def _run_params(report: Path) -> dict[str, Any]:
    """The parameters a run recorded in its summary.json, if it can be read."""
    from tally.audit import schema

    try:
        params = json.loads((report / schema.SUMMARY_JSON).read_text()).get("params", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return params if isinstance(params, dict) else {}


def _print_counts(title: str, counts: Mapping[str, Any]) -> None:
    table = Table(box=box.SIMPLE, title=title)
    table.add_column("rows of")
    table.add_column("count", justify="right")
    for name, count in counts.items():
        table.add_row(name, f"{count:,}" if isinstance(count, int) else str(count))
    _out.print(table)


def _print_summary(summary: Mapping[str, Any]) -> None:
    table = Table(box=box.SIMPLE, title="audit findings")
    table.add_column("category")
    table.add_column("count", justify="right")
    for category, count in summary["categories"].items():
        style = "bold red" if count else "green"
        table.add_row(category, f"[{style}]{count:,}[/]")
    _out.print(table)
    extra = summary.get("over_replication") or {}
    if extra.get("rows"):
        _out.print(
            f"over-replication, not a violation: {extra['entries']:,} extra copies (about "
            f"{extra['bytes']:,} bytes) on {extra['ledgers']:,} ledgers",
            markup=False,
        )
    timings = ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in summary["timings"].items())
    _out.print(f"{summary['ledgers_checked']:,} ledgers checked ({timings})", markup=False)
