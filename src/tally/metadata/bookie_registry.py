"""The bookie registry: which bookies are up (writable or read-only), and where they stand.

A bookie registers with an ephemeral key bound to its store session, so a bookie that
dies or is partitioned away for longer than its session timeout disappears from the
lists by itself. The key's value is the bookie's advertised info (JSON). Moving between
writable and read-only replaces one key by the other in a single transaction, so the
bookie is never listed in both nor in neither.

A restarted bookie may find its previous incarnation's key still there, held by the old
session until it expires: registration waits for it to go (up to `previous_session_wait`),
as BookKeeper does, and refuses if it stays, for then another live bookie has this id.

Racks and zones are persistent: set by configuration or an operator, kept while the
bookie is down, so placement can still reason about the bookie's copies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from tally.core.errors import BadRequest, KeyExists, NoSuchKey
from tally.metadata import json_records
from tally.metadata.key_ops import Watcher, delete_if_present, put
from tally.metadata.paths import (
    RACKS,
    READONLY,
    WRITABLE,
    rack_path,
    readonly_path,
    writable_path,
)
from tally.metadata.store import (
    Create,
    Delete,
    MetadataStore,
    Op,
    SetData,
    WatchKind,
    join,
)

PREVIOUS_SESSION_POLL = 0.05
"""Seconds between two looks at a registration held by another session."""

_INFO_KIND = "bookie-info"
_INFO_FIELDS = frozenset({"address", "http_port", "version", "start_time_ms", "failed_ledger_dirs"})
_PLACEMENT_KIND = "bookie-placement"
_PLACEMENT_FIELDS = frozenset({"rack", "zone"})


@dataclass(frozen=True)
class BookieInfo:
    """What a bookie advertises while registered."""

    address: str
    """host:port that clients connect to."""
    http_port: int | None
    """The admin HTTP port, if the bookie serves one."""
    version: str
    start_time_ms: int
    failed_ledger_dirs: tuple[str, ...] = ()
    """Its ledger directories out of service since their disks failed."""

    def __post_init__(self) -> None:
        for name in ("address", "version"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise BadRequest(f"bookie {name} must be a non-empty str, got {value!r}")
        port = self.http_port
        if port is not None and (
            not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536
        ):
            raise BadRequest(f"http port must be in 1..65535 or None, got {port!r}")
        if not isinstance(self.start_time_ms, int) or self.start_time_ms < 0:
            raise BadRequest(f"start time must be a non-negative int, got {self.start_time_ms!r}")
        if not isinstance(self.failed_ledger_dirs, tuple) or not all(
            isinstance(d, str) and d for d in self.failed_ledger_dirs
        ):
            raise BadRequest(
                f"failed ledger dirs must be a tuple of paths, got {self.failed_ledger_dirs!r}"
            )

    def to_bytes(self) -> bytes:
        return json_records.encode(
            _INFO_KIND,
            {
                "address": self.address,
                "http_port": self.http_port,
                "version": self.version,
                "start_time_ms": self.start_time_ms,
                "failed_ledger_dirs": list(self.failed_ledger_dirs),
            },
        )

    @classmethod
    def from_bytes(cls, data: bytes, source: str) -> BookieInfo:
        record = json_records.decode(data, _INFO_KIND, _INFO_FIELDS, source)
        with json_records.building(source):
            return cls(
                address=record.text("address"),
                http_port=record.optional_integer("http_port"),
                version=record.text("version"),
                start_time_ms=record.integer("start_time_ms"),
                # absent from the registrations of bookies older than the field
                failed_ledger_dirs=record.texts("failed_ledger_dirs")
                if "failed_ledger_dirs" in record.names
                else (),
            )


@dataclass(frozen=True)
class BookieRegistration:
    """A registered bookie as the store has it."""

    bookie_id: str
    info: BookieInfo
    read_only: bool
    session_id: int
    """The store session the registration lives and dies with."""


@dataclass(frozen=True)
class AvailableBookies:
    writable: frozenset[str]
    read_only: frozenset[str]


@dataclass(frozen=True)
class BookiePlacement:
    """Where a bookie stands, for the placement policy: its rack, and the zone around it."""

    rack: str
    zone: str

    def __post_init__(self) -> None:
        for name in ("rack", "zone"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or not value.isprintable():
                raise BadRequest(f"bookie {name} must be a non-empty printable str: {value!r}")

    def to_bytes(self) -> bytes:
        return json_records.encode(_PLACEMENT_KIND, {"rack": self.rack, "zone": self.zone})

    @classmethod
    def from_bytes(cls, data: bytes, source: str) -> BookiePlacement:
        record = json_records.decode(data, _PLACEMENT_KIND, _PLACEMENT_FIELDS, source)
        with json_records.building(source):
            return cls(rack=record.text("rack"), zone=record.text("zone"))


class BookieRegistry:
    """Bookie registrations and placements on one store session."""

    def __init__(self, store: MetadataStore, *, previous_session_wait: float | None = None):
        self.store = store
        self.previous_session_wait = (
            2 * store.session_timeout if previous_session_wait is None else previous_session_wait
        )

    # -- registration --------------------------------------------------------------------

    async def register(self, bookie_id: str, info: BookieInfo, *, read_only: bool = False) -> None:
        """Register (or re-register, or switch to/from read-only) this session's bookie.

        KeyExists if another session keeps a registration of this id beyond the wait.
        """
        target = readonly_path(bookie_id) if read_only else writable_path(bookie_id)
        other = writable_path(bookie_id) if read_only else readonly_path(bookie_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.previous_session_wait
        while True:
            current, previous = await self.store.get_many([target, other])
            holders = {
                found.stat.ephemeral_owner
                for found in (current, previous)
                if found is not None and found.stat.ephemeral_owner != self.store.session_id
            }
            if holders:
                if loop.time() >= deadline:
                    owners = ", ".join(f"{h:#x}" if h else "none (persistent)" for h in holders)
                    raise KeyExists(
                        f"bookie {bookie_id} is registered by another session ({owners}) that "
                        f"did not go within {self.previous_session_wait}s: is another bookie "
                        "running with this id?"
                    )
                await asyncio.sleep(PREVIOUS_SESSION_POLL)
                continue
            ops: list[Op] = [] if previous is None else [Delete(other)]
            if current is None:
                ops.append(Create(target, info.to_bytes(), ephemeral=True))
            else:
                ops.append(SetData(target, info.to_bytes(), current.version))
            try:
                await self.store.transaction(ops)
                return
            except (KeyExists, NoSuchKey):
                continue  # changed meanwhile: look again

    async def unregister(self, bookie_id: str) -> None:
        """Remove this session's registration of `bookie_id`, if any (others' stay)."""
        paths = [writable_path(bookie_id), readonly_path(bookie_id)]
        for path, found in zip(paths, await self.store.get_many(paths), strict=True):
            if found is not None and found.stat.ephemeral_owner == self.store.session_id:
                await delete_if_present(self.store, path)

    async def registration(self, bookie_id: str) -> BookieRegistration | None:
        """The bookie's registration, or None when it is not registered."""
        paths = [writable_path(bookie_id), readonly_path(bookie_id)]
        for read_only, (path, found) in enumerate(
            zip(paths, await self.store.get_many(paths), strict=True)
        ):
            if found is not None:
                return BookieRegistration(
                    bookie_id,
                    BookieInfo.from_bytes(found.data, f"registration {path}"),
                    bool(read_only),
                    found.stat.ephemeral_owner or 0,
                )
        return None

    async def writable_bookies(self) -> list[str]:
        return await self.store.children(WRITABLE)

    async def readonly_bookies(self) -> list[str]:
        return await self.store.children(READONLY)

    async def available_bookies(self) -> AvailableBookies:
        writable, read_only = await asyncio.gather(self.writable_bookies(), self.readonly_bookies())
        return AvailableBookies(frozenset(writable), frozenset(read_only))

    async def watch_bookies(
        self, callback: Callable[[AvailableBookies], object]
    ) -> Watcher[AvailableBookies]:
        """Call `callback` with the registered bookies now and after every change."""
        return await Watcher.start(
            self.store,
            [(WRITABLE, WatchKind.CHILDREN), (READONLY, WatchKind.CHILDREN)],
            self.available_bookies,
            callback,
            "available bookies",
        )

    # -- placement -----------------------------------------------------------------------

    async def set_placement(self, bookie_id: str, placement: BookiePlacement) -> None:
        await put(self.store, rack_path(bookie_id), placement.to_bytes())

    async def placement(self, bookie_id: str) -> BookiePlacement | None:
        path = rack_path(bookie_id)
        try:
            found = await self.store.get(path)
        except NoSuchKey:
            return None
        return BookiePlacement.from_bytes(found.data, f"placement {path}")

    async def placements(self) -> dict[str, BookiePlacement]:
        """Every bookie's placement that was set, registered or not."""
        names = await self.store.children(RACKS)
        paths = [join(RACKS, name) for name in names]
        values = await self.store.get_many(paths)
        return {
            name: BookiePlacement.from_bytes(found.data, f"placement {path}")
            for name, path, found in zip(names, paths, values, strict=True)
            if found is not None
        }

    async def remove_placement(self, bookie_id: str) -> bool:
        """Forget the bookie's placement; False if none was set."""
        return await delete_if_present(self.store, rack_path(bookie_id))
