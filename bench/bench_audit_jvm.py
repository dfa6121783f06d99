"""Measure what Spark's JVM start costs a short audit: `tally audit run` of a small
synthetic snapshot on local[2], as a user runs it (a process each), started with the JVM's
defaults and with SHORT_JOB_JVM (its quick compiler only, one GC thread), in alternate
turns so that a noisy machine weighs on both alike.

    python bench/bench_audit_jvm.py [--ledgers N] [--turns T]

The reference is the same command with the JVM's defaults: the figure is the ratio of the
medians. `main()` returns the figures as a dict.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from tally.audit.jvm import SHORT_JOB_JVM


def tally(*args: str, env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "tally.cli.main", *args],
        check=True,
        capture_output=True,
        env=env,
    )


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ledgers", type=int, default=300)
    parser.add_argument("--turns", type=int, default=2)
    options = parser.parse_args(argv)
    default = {k: v for k, v in os.environ.items() if k not in SHORT_JOB_JVM}
    short = {**default, **SHORT_JOB_JVM}
    seconds: dict[str, list[float]] = {"default JVM": [], "short-job JVM": []}
    with tempfile.TemporaryDirectory() as scratch:
        snapshot = Path(scratch) / "snapshot"
        tally(
            *("audit", "synth", "--ledgers", str(options.ledgers), "--bookies", "6"),
            *("--racks", "3", "--faults", "default", "--seed", "5", "--out", str(snapshot)),
            env=short,
        )
        for turn in range(options.turns):
            for name, env in (("default JVM", default), ("short-job JVM", short)):
                out = Path(scratch) / f"out-{turn}-{len(seconds[name])}"
                started = time.perf_counter()
                tally(
                    *("audit", "run", "--snapshot", str(snapshot), "--out", str(out)),
                    *("--master", "local[2]", "--grace-period", "1ms"),
                    env=env,
                )
                seconds[name].append(time.perf_counter() - started)
                print(f"turn {turn + 1}: {name}: {seconds[name][-1]:.1f} s", flush=True)
    medians = {name: statistics.median(times) for name, times in seconds.items()}
    figures: dict[str, object] = {
        "ledgers": options.ledgers,
        "seconds": seconds,
        "median_seconds": medians,
        "short_job_over_default": medians["short-job JVM"] / medians["default JVM"],
    }
    print(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
