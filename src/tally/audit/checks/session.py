"""The Spark session every part of tally that runs Spark starts, set up once for the audit."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from pyspark.sql import SparkSession

BATCH_ROWS = 20_000
"""Rows per Arrow batch handed to Python: large enough to amortise the per-batch cost."""


def spark_session(master: str = "local[*]", *, memory: str = "4g") -> SparkSession:
    """A session for the audit: no UI, quiet logs, Arrow on, workers on this interpreter.

    Every part of tally that runs Spark starts its session here. `memory` sizes the driver
    (which is also the executor in local mode); it only takes effect if this call starts
    the JVM.
    """
    cores = os.cpu_count() or 2
    builder: Any = SparkSession.builder
    with _python_workers(master):
        session: SparkSession = (
            builder.master(master)
            .appName("tally-audit")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.log.level", "ERROR")
            .config("spark.driver.memory", memory)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", str(max(4, 2 * cores)))
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(BATCH_ROWS))
            .getOrCreate()
        )
    return session


@contextlib.contextmanager
def _python_workers(master: str) -> Iterator[None]:
    """Local Spark workers run on this interpreter, which can import tally.

    PySpark takes the workers' interpreter from PYSPARK_PYTHON when the context starts, or
    else `python3` from PATH, which need not be this environment's (it ignores
    `spark.pyspark.python` in-process). An explicit PYSPARK_PYTHON is left as it is.
    """
    if not master.startswith("local") or os.environ.get("PYSPARK_PYTHON"):
        yield
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        yield
    finally:
        os.environ.pop("PYSPARK_PYTHON", None)
