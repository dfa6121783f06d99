"""`tally local status`: what runs, joined with what the metadata store says about it.

A process can run without being registered (starting, or its session lost) and a dead
bookie stays registered until its session lapses; showing both columns side by side makes
either visible.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tally.local.services import AUTORECOVERY
from tally.local.state import META_DB, BookieSlot, DataDir, ProcessRecord
from tally.metadata.bookie_registry import AvailableBookies, BookiePlacement, BookieRegistry
from tally.metadata.cluster import read_cluster
from tally.metadata.stores import open_store

WRITABLE = "writable"
READ_ONLY = "read-only"
STORE_TIMEOUT = 5.0


@dataclass(frozen=True)
class BookieStatus:
    slot: BookieSlot
    run: ProcessRecord | None
    """Its last run, if it ever ran."""
    running: bool
    registered: str | None
    """WRITABLE, READ_ONLY, or None when the store does not list it."""
    placement: BookiePlacement | None
    """The rack the store holds for it (what placement policies see)."""

    def to_json(self) -> dict[str, Any]:
        return {
            **self.slot.to_json(),
            "pid": None if self.run is None else self.run.pid,
            "running": self.running,
            "exit_code": None if self.run is None else self.run.exit_code,
            "registered": self.registered,
            "registered_rack": None if self.placement is None else self.placement.rack,
        }


@dataclass(frozen=True)
class LocalStatus:
    data_dir: Path
    metadata: str
    instance_id: str | None
    """None when the store holds no cluster yet."""
    supervisor_pid: int | None
    supervisor_running: bool
    bookies: tuple[BookieStatus, ...]
    autorecovery: ProcessRecord | None
    """The auto-recovery process's last run, if it ever ran."""
    autorecovery_running: bool
    api_url: str | None
    """The admin HTTP API and /metrics of the auto-recovery process."""

    def to_json(self) -> dict[str, Any]:
        return {
            "data_dir": str(self.data_dir),
            "metadata": self.metadata,
            "instance_id": self.instance_id,
            "supervisor": {"pid": self.supervisor_pid, "running": self.supervisor_running},
            "bookies": [bookie.to_json() for bookie in self.bookies],
            "autorecovery": {
                "pid": None if self.autorecovery is None else self.autorecovery.pid,
                "running": self.autorecovery_running,
                "exit_code": None if self.autorecovery is None else self.autorecovery.exit_code,
                "api_url": self.api_url,
            },
        }


def read_status(data_dir: DataDir) -> LocalStatus:
    state = data_dir.require()
    instance_id: str | None = None
    available = AvailableBookies(frozenset(), frozenset())
    placements: dict[str, BookiePlacement] = {}
    if (data_dir.root / META_DB).exists():  # else opening the store would create it
        instance_id, available, placements = asyncio.run(_registrations(state.metadata))
    return LocalStatus(
        data_dir=data_dir.root,
        metadata=state.metadata,
        instance_id=instance_id,
        supervisor_pid=None if state.supervisor is None else state.supervisor.pid,
        supervisor_running=state.supervisor_running(),
        bookies=tuple(
            BookieStatus(
                slot=slot,
                run=state.processes.get(slot.name),
                running=state.running(slot.name) is not None,
                registered=_registered(slot.bookie_id, available),
                placement=placements.get(slot.bookie_id),
            )
            for slot in state.bookies
        ),
        autorecovery=state.processes.get(AUTORECOVERY),
        autorecovery_running=state.running(AUTORECOVERY) is not None,
        api_url=state.api_url,
    )


def _registered(bookie_id: str, available: AvailableBookies) -> str | None:
    if bookie_id in available.writable:
        return WRITABLE
    return READ_ONLY if bookie_id in available.read_only else None


async def _registrations(
    uri: str,
) -> tuple[str | None, AvailableBookies, dict[str, BookiePlacement]]:
    async with open_store(uri, connect_timeout=STORE_TIMEOUT) as store:
        info = await read_cluster(store)
        if info is None:
            return None, AvailableBookies(frozenset(), frozenset()), {}
        registry = BookieRegistry(store)
        return info.instance_id, await registry.available_bookies(), await registry.placements()
