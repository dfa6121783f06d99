"""The chaos run's fault schedule: from the seed alone, and within what the cluster is
built to survive."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.chaos.schedule import (
    AT_REST_FAULTS,
    AUTORECOVERY,
    BOOKIE_FAULTS,
    DISK_FAULTS,
    JOURNAL,
    LEDGER_DISKS,
    ZOOKEEPER,
    ZOOKEEPER_FAULTS,
    FaultKind,
    at_rest_bookie,
    plan_faults,
)

BOOKIES = [f"127.0.0.1:{port}" for port in range(4000, 4005)]
LOGS = ["log-0", "log-1", "log-2"]


def test_the_same_seed_plans_the_same_faults() -> None:
    assert plan_faults(7, 120, BOOKIES, LOGS) == plan_faults(7, 120, BOOKIES, LOGS)
    assert plan_faults(7, 120, BOOKIES, LOGS) != plan_faults(8, 120, BOOKIES, LOGS)


def test_a_long_run_plans_every_kind() -> None:
    every = plan_faults(3, 600, BOOKIES, LOGS, zookeeper=True, disks=True)
    assert set(Counter(fault.kind for fault in every)) == set(FaultKind)
    embedded = plan_faults(3, 600, BOOKIES, LOGS)
    assert not {fault.kind for fault in embedded} & (ZOOKEEPER_FAULTS | DISK_FAULTS)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.floats(10, 900), st.integers(1, 2))
def test_faults_stay_within_what_the_cluster_survives(
    seed: int, duration: float, max_down: int
) -> None:
    planned = plan_faults(
        seed, duration, BOOKIES, LOGS, max_bookies_down=max_down, zookeeper=True, disks=True
    )
    assert [f.start for f in planned] == sorted(f.start for f in planned)
    for fault in planned:
        assert 0 < fault.start <= fault.end <= duration
        bookie_fault = fault.kind in BOOKIE_FAULTS | AT_REST_FAULTS
        assert fault.target in (BOOKIES if bookie_fault else [*LOGS, AUTORECOVERY, ZOOKEEPER])
        if fault.kind in AT_REST_FAULTS:
            assert fault.target == at_rest_bookie(seed, BOOKIES)
        if fault.kind in DISK_FAULTS:
            disks = (
                LEDGER_DISKS
                if fault.kind is FaultKind.FAIL_LEDGER_DIR
                else (JOURNAL, *LEDGER_DISKS)
            )
            assert fault.detail in disks
        down = {
            f.target for f in planned if f.kind in BOOKIE_FAULTS and f.start <= fault.start < f.end
        }
        assert len(down) <= max_down, fault
        overlapping = [
            f
            for f in planned
            if f is not fault
            and f.target == fault.target
            and f.start < fault.end
            and fault.start < f.end
        ]
        assert not overlapping, (fault, overlapping)
    assert len({f.target for f in planned if f.kind in AT_REST_FAULTS}) <= 1
