"""The short chaos run on a 3-member ZooKeeper ensemble `make test` runs (issue 19): its
members paused and its leader killed among the other faults. The audit is left to the
sqlite run (it does not depend on the store), which keeps the suite's time down."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.short_runs import DISK_FAULTS, check_short_run


@pytest.mark.timeout(600)
def test_a_short_chaos_run_on_zookeeper_keeps_every_acknowledged_entry(tmp_path: Path) -> None:
    check_short_run(
        tmp_path / "run",
        *("--metadata", "zk", "--duration", "30s", "--seed", "130", "--no-audit"),
        faults=DISK_FAULTS | {"kill_zookeeper_leader"},
    )
