"""How Spark's JVM is started for a short job (imports nothing: the CLI reads it at start)."""

from __future__ import annotations

SHORT_JOB_JVM = {"SPARK_SUBMIT_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
"""The environment that starts Spark's JVM for a short job (a small cluster's audit, the
demo's, the tests'): its quick compiler only and one GC thread; an audit of 300 ledgers on
local[2] takes 0.60-0.88 of the time here (bench/bench_audit_jvm.py, docs/benchmarks.md). A
long job wants the default."""
