"""Which faults a chaos run injects, when, and where: all of it from the seed (issue 19).

The schedule is decided before the run and kept within what the cluster is built to
survive, so that a violation is tally's fault and not the schedule's: at most
`max_bookies_down` bookies faulty at once (killed, paused or cut off by the network; with
WQ copies on distinct bookies, fewer than WQ of them), at most one fault per process at a
time, and the faults of data at rest (bytes flipped, a disk full, a ledger disk failed and
replaced by an empty one) on one bookie only (two rotten copies of one entry would be a
loss no replication survives). Every fault ends by `duration`; the run then settles.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass


class FaultKind(enum.Enum):
    KILL_BOOKIE = "kill_bookie"
    PAUSE_BOOKIE = "pause_bookie"
    NETWORK_DELAY = "network_delay"
    NETWORK_STALL = "network_stall"
    NETWORK_CUT = "network_cut"
    NETWORK_RESET = "network_reset"
    NETWORK_PARTITION = "network_partition"
    FLIP_BYTES = "flip_bytes"
    KILL_AUTORECOVERY = "kill_autorecovery"
    PAUSE_AUTORECOVERY = "pause_autorecovery"
    KILL_WRITER = "kill_writer"
    PAUSE_WRITER = "pause_writer"
    PAUSE_ZOOKEEPER = "pause_zookeeper"
    """SIGSTOP of one member of the metadata store's ensemble."""
    KILL_ZOOKEEPER_LEADER = "kill_zookeeper_leader"
    DISK_FULL = "disk_full"
    """One of the at-rest bookie's disks (its journal's or a ledger disk) filled up."""
    FAIL_LEDGER_DIR = "fail_ledger_dir"
    """One of its ledger disks failed (remounted read-only by the kernel); at the end the
    operator's repair: bookie stopped, an empty disk in its place, cookie updated."""


BOOKIE_FAULTS = frozenset(
    {
        FaultKind.KILL_BOOKIE,
        FaultKind.PAUSE_BOOKIE,
        FaultKind.NETWORK_DELAY,
        FaultKind.NETWORK_STALL,
        FaultKind.NETWORK_CUT,
        FaultKind.NETWORK_RESET,
        FaultKind.NETWORK_PARTITION,
        FaultKind.DISK_FULL,
        FaultKind.FAIL_LEDGER_DIR,
    }
)
"""Faults that take a bookie (or the way to it, or its writes, or a disk's copies) out while
they last."""
DISK_FAULTS = frozenset({FaultKind.DISK_FULL, FaultKind.FAIL_LEDGER_DIR})
AT_REST_FAULTS = DISK_FAULTS | {FaultKind.FLIP_BYTES}
"""Faults of one bookie only: `at_rest_bookie`."""
JOURNAL = "journal"
LEDGER_DISKS = ("ledgers-0", "ledgers-1")
"""The at-rest bookie's disks, by name, when the run has disk faults."""
WRITER_FAULTS = frozenset({FaultKind.KILL_WRITER, FaultKind.PAUSE_WRITER})
AUTORECOVERY_FAULTS = frozenset({FaultKind.KILL_AUTORECOVERY, FaultKind.PAUSE_AUTORECOVERY})
ZOOKEEPER_FAULTS = frozenset({FaultKind.PAUSE_ZOOKEEPER, FaultKind.KILL_ZOOKEEPER_LEADER})
"""One member at a time: the ensemble keeps its quorum."""
WEIGHTS = {
    FaultKind.KILL_BOOKIE: 4,
    FaultKind.PAUSE_BOOKIE: 2,
    FaultKind.NETWORK_DELAY: 2,
    FaultKind.NETWORK_STALL: 2,
    FaultKind.NETWORK_CUT: 2,
    FaultKind.NETWORK_RESET: 1,
    FaultKind.NETWORK_PARTITION: 2,
    FaultKind.FLIP_BYTES: 2,
    FaultKind.KILL_AUTORECOVERY: 1,
    FaultKind.PAUSE_AUTORECOVERY: 1,
    FaultKind.KILL_WRITER: 3,
    FaultKind.PAUSE_WRITER: 1,
    FaultKind.PAUSE_ZOOKEEPER: 2,
    FaultKind.KILL_ZOOKEEPER_LEADER: 2,
    FaultKind.DISK_FULL: 2,
    FaultKind.FAIL_LEDGER_DIR: 1,
}
AUTORECOVERY = "autorecovery"
ZOOKEEPER = "zookeeper"
FIRST_FAULT_AT = 3.0
LONGEST = 12.0
SHORTEST = 1.0


@dataclass(frozen=True, slots=True)
class PlannedFault:
    start: float
    end: float
    """Equal to start for an instant fault (bytes flipped, a writer killed and replaced)."""
    kind: FaultKind
    target: str
    """A bookie id, a writer's log name, or AUTORECOVERY."""
    detail: str = ""
    """The network fault's direction or delay, the number of bytes flipped, the disk."""


def at_rest_bookie(seed: int, bookies: Sequence[str]) -> str | None:
    """The one bookie whose data at rest the run harms (bytes, disks)."""
    return random.Random(f"at-rest/{seed}").choice(sorted(bookies)) if bookies else None


def plan_faults(
    seed: int,
    duration: float,
    bookies: Sequence[str],
    logs: Sequence[str],
    *,
    mean_gap: float = 3.0,
    max_bookies_down: int = 1,
    zookeeper: bool = False,
    disks: bool = False,
) -> list[PlannedFault]:
    """The run's faults, by start time; faults of the ZooKeeper ensemble when the run's
    metadata store is one, and of disks when the at-rest bookie has disks of its own."""
    rng = random.Random(f"faults/{seed}")
    rotting = at_rest_bookie(seed, bookies)
    busy_until: dict[str, float] = {}
    planned: list[PlannedFault] = []
    t = FIRST_FAULT_AT
    while True:
        t += rng.expovariate(1 / mean_gap)
        if t >= duration - SHORTEST:
            return planned
        kind = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
        if (kind in ZOOKEEPER_FAULTS and not zookeeper) or (kind in DISK_FAULTS and not disks):
            continue
        end = min(duration, t + rng.uniform(SHORTEST, LONGEST))
        target = _target(
            kind, t, rng, bookies, logs, rotting, busy_until, planned, max_bookies_down
        )
        if target is None:
            continue
        instant = kind in (FaultKind.FLIP_BYTES, FaultKind.KILL_WRITER)
        fault = PlannedFault(t, t if instant else end, kind, target, _detail(kind, rng))
        busy_until[target] = fault.end
        planned.append(fault)


def _target(
    kind: FaultKind,
    t: float,
    rng: random.Random,
    bookies: Sequence[str],
    logs: Sequence[str],
    rotting: str | None,
    busy_until: dict[str, float],
    planned: list[PlannedFault],
    max_bookies_down: int,
) -> str | None:
    """A target free at `t` that this kind may hit, or None (the fault is skipped)."""
    if kind in AT_REST_FAULTS:
        candidates = [rotting] if rotting is not None else []
    elif kind in AUTORECOVERY_FAULTS:
        candidates = [AUTORECOVERY]
    elif kind in ZOOKEEPER_FAULTS:
        candidates = [ZOOKEEPER]
    elif kind in WRITER_FAULTS:
        candidates = list(logs)
    else:
        candidates = list(bookies)
    if kind in BOOKIE_FAULTS:
        down = {f.target for f in planned if f.kind in BOOKIE_FAULTS and f.start <= t < f.end}
        if len(down) >= max_bookies_down:
            return None
    free = sorted(c for c in candidates if busy_until.get(c, -1.0) <= t)
    return rng.choice(free) if free else None


def _detail(kind: FaultKind, rng: random.Random) -> str:
    if kind is FaultKind.NETWORK_DELAY:
        return f"{rng.choice((0.05, 0.2, 0.5, 1.5))}"
    if kind is FaultKind.NETWORK_PARTITION:
        return rng.choice(("to_target", "to_client"))
    if kind is FaultKind.NETWORK_RESET:
        return f"{rng.choice((0.01, 0.1, 0.5))}"
    if kind is FaultKind.FLIP_BYTES:
        return f"{rng.randint(1, 8)}"
    if kind is FaultKind.DISK_FULL:
        return rng.choice((JOURNAL, *LEDGER_DISKS))
    if kind is FaultKind.FAIL_LEDGER_DIR:
        return rng.choice(LEDGER_DISKS)
    return ""
