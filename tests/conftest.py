"""The whole test run: Spark's JVMs, started by many tests for jobs of seconds, start tuned
for short jobs (unless the environment says otherwise)."""

from __future__ import annotations

import os

from tally.audit.jvm import SHORT_JOB_JVM

for name, value in SHORT_JOB_JVM.items():
    os.environ.setdefault(name, value)
