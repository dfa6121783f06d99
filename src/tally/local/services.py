"""The processes of a local cluster, each described the same way so one supervisor runs all.

A `Service` says how to start a process, where its output goes and which line it prints
once it serves. The supervisor needs nothing else: it starts, waits for, watches and stops
every service alike. A new kind of process (the auto-recovery process, the admin HTTP
server) is a function building its Service from the state, added to `services`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tally.bookie import EXIT_SESSION_LOST
from tally.local.processes import log_since
from tally.local.state import BookieSlot, LocalState, ProcessRecord


@dataclass(frozen=True)
class Service:
    name: str
    """Its key in `local.json`'s processes ("bookie-2")."""
    argv: tuple[str, ...]
    log: Path
    """Its stdout and stderr, appended run after run."""
    ready_text: str
    """What its output holds once it serves (and not before)."""
    restart_hint: str
    """How an operator starts it again after it died."""
    restart_on: Mapping[int, str] = field(default_factory=dict)
    """The exit statuses after which a new start is the cure, each with what it means: the
    supervisor starts it again by itself (a bounded number of times)."""

    def is_ready(self, run: ProcessRecord) -> bool:
        """True once this run (whose output starts at its log offset) said it serves."""
        return self.ready_text in log_since(self.log, run.log_offset)


def tally_command(*args: str) -> tuple[str, ...]:
    """The tally CLI in this interpreter, so children run the same tally as the supervisor."""
    return (sys.executable, "-m", "tally.cli.main", *args)


def bookie_service(state: LocalState, slot: BookieSlot, data_dir: Path) -> Service:
    """The bookie of `slot`; other settings come from TALLY_BOOKIE_* variables, inherited."""
    argv = tally_command(
        "bookie",
        "--metadata", state.metadata,
        "--data-dir", str(slot.data_dir),
        "--listen", slot.bookie_id,
        "--rack", slot.rack,
        "--metrics-port", str(slot.metrics_port),
    )  # fmt: skip
    return Service(
        name=slot.name,
        argv=argv,
        log=slot.log,
        ready_text=f"bookie {slot.bookie_id} ready on ",
        restart_hint=f"tally local start-bookie {slot.index} --data-dir {data_dir}",
        restart_on={EXIT_SESSION_LOST: "It lost its metadata store session"},
    )


AUTORECOVERY = "autorecovery"
AUTORECOVERY_ID = "local-autorecovery"


def autorecovery_service(state: LocalState, data_dir: Path) -> Service:
    """The auditor and replication worker, whose admin HTTP app is the cluster's API."""
    argv = tally_command("autorecovery", "--metadata", state.metadata, "--id", AUTORECOVERY_ID)
    if state.autorecovery_port is not None:
        argv += ("--http-port", str(state.autorecovery_port))
    return Service(
        name=AUTORECOVERY,
        argv=argv,
        log=data_dir / "logs" / f"{AUTORECOVERY}.log",
        ready_text=f"autorecovery {AUTORECOVERY_ID} ready",
        restart_hint=f"tally local start {AUTORECOVERY} --data-dir {data_dir}",
    )


def services(state: LocalState, data_dir: Path) -> dict[str, Service]:
    """Every process of the local cluster by name, in start order: the bookies first, so
    the auditor's first look finds them all registered."""
    found = {slot.name: bookie_service(state, slot, data_dir) for slot in state.bookies}
    found[AUTORECOVERY] = autorecovery_service(state, data_dir)
    return found
