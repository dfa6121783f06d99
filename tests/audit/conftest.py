"""One real local Spark session for the audit tests: starting one costs seconds."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tally.audit.checks import spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", memory="2g")
    yield session
    session.stop()
