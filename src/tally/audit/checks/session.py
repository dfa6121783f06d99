"""The Spark session every part of tally that runs Spark starts, set up once for the audit."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from pyspark.sql import SparkSession

from tally.audit.executors import ship_tally

PYTHON_SETTING = "spark.pyspark.python"
"""The setting that names the executors' Python interpreter."""
BATCH_ROWS = 20_000
"""Rows per Arrow batch handed to Python: large enough to amortise the per-batch cost."""


def spark_session(
    master: str = "local[*]", *, memory: str = "4g", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A session for the audit: no UI, quiet logs, Arrow on, tally shipped to the executors.

    Every part of tally that runs Spark starts its session here. `memory` sizes the driver
    (which is also the executor in local mode); it only takes effect if this call starts
    the JVM. `conf` is any Spark setting, applied last (`--conf KEY=VALUE`); its
    `spark.pyspark.python` names the executors' interpreter.
    """
    settings = dict(conf or {})
    cores = os.cpu_count() or 2
    builder: Any = SparkSession.builder.master(master).appName("tally-audit")
    defaults = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "ERROR",
        "spark.driver.memory": memory,
        "spark.sql.shuffle.partitions": str(max(4, 2 * cores)),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(BATCH_ROWS),
    }
    if _on_this_machine(master):
        defaults["spark.driver.host"] = "127.0.0.1"
        defaults["spark.driver.bindAddress"] = "127.0.0.1"
    for key, value in {**defaults, **settings}.items():
        builder = builder.config(key, value)
    with _python_workers(master, settings.get(PYTHON_SETTING)):
        session: SparkSession = builder.getOrCreate()
    ship_tally(session.sparkContext)
    return session


def _on_this_machine(master: str) -> bool:
    """A local master, or a cluster manager on loopback: its executors reach the driver
    on 127.0.0.1. Anywhere else the driver is left to advertise its host's address."""
    if master.startswith("local"):
        return True
    host = urlsplit(master).hostname
    return host in ("127.0.0.1", "localhost", "::1")


@contextlib.contextmanager
def _python_workers(master: str, python: str | None) -> Iterator[None]:
    """The executors' interpreter: the one `spark.pyspark.python` names, else for a local
    master this one (which can import tally), else the cluster's `python3`.

    PySpark takes the workers' interpreter from PYSPARK_PYTHON when the context starts, or
    else `python3` from the workers' PATH, and ignores `spark.pyspark.python` in-process.
    An explicit PYSPARK_PYTHON is left as it is unless the setting names another.
    """
    if python is None and (not master.startswith("local") or os.environ.get("PYSPARK_PYTHON")):
        yield
        return
    previous = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = python or sys.executable
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = previous
