"""How Spark's JVM is started for a short job (imports nothing: the CLI reads it at start)."""

from __future__ import annotations

SHORT_JOB_JVM = {"SPARK_SUBMIT_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
"""The environment that starts Spark's JVM for a short job (a small cluster's audit, the
demo's, the tests'): its quick compiler only and one GC thread, 35-40 % less time for an
audit of 300 ledgers on local[2] here (docs/benchmarks.md); a long job wants the default."""
