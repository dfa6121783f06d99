"""The short chaos run `make test` runs (issue 19): a fixed seed, the embedded store, the
command a user runs. Every invariant must hold; the Spark audit judges the settled cluster.
`make chaos` runs the long ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.short_runs import DISK_FAULTS, check_short_run


@pytest.mark.timeout(600)
def test_a_short_chaos_run_on_sqlite_keeps_every_acknowledged_entry(tmp_path: Path) -> None:
    check_short_run(
        tmp_path / "run",
        *("--metadata", "sqlite", "--duration", "40s", "--seed", "1636"),
        faults=DISK_FAULTS | {"flip_bytes"},
    )
