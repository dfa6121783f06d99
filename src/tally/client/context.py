"""What every ledger handle of one client shares: settings, metadata services, bookies."""

from __future__ import annotations

import random
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from tally.client.bookie_pool import BookiePool
from tally.client.config import ClientConfig
from tally.core.placement import (
    DEFAULT_RACK,
    BookieQuarantine,
    PlacementPolicy,
    preferring_healthy,
)
from tally.metadata.bookie_registry import BookieRegistry
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.underreplication import UnderReplicationManager


@dataclass
class ClientContext:
    config: ClientConfig
    ledgers: LedgerManager
    registry: BookieRegistry
    under_replication: UnderReplicationManager
    bookies: BookiePool
    policy: PlacementPolicy
    rng: random.Random = field(default_factory=random.Random)
    quarantine: BookieQuarantine = field(init=False)

    def __post_init__(self) -> None:
        self.quarantine = BookieQuarantine(self.config.bookie_quarantine_time)

    def quarantined(self) -> frozenset[str]:
        return self.quarantine.active(time.monotonic())

    def bookie_failed(self, bookie: str) -> None:
        self.quarantine.add(bookie, time.monotonic())

    def new_ensemble(
        self, ensemble_size: int, write_quorum: int, ack_quorum: int, racks: Mapping[str, str]
    ) -> tuple[str, ...]:
        """The placement policy's ensemble, of bookies out of quarantine while enough are."""

        def choose(avoid: frozenset[str]) -> tuple[str, ...]:
            return self.policy.new_ensemble(
                ensemble_size, write_quorum, ack_quorum, racks, avoid, self.rng
            )

        return preferring_healthy(choose, self.quarantined())

    def replacement(
        self,
        ensemble: Sequence[str],
        position: int,
        write_quorum: int,
        racks: Mapping[str, str],
        exclude: Collection[str],
    ) -> str:
        """The placement policy's bookie for `position`, out of quarantine if one fits."""

        def choose(avoid: frozenset[str]) -> str:
            return self.policy.replace_bookie(
                ensemble, position, write_quorum, racks, {*exclude, *avoid}, self.rng
            )

        return preferring_healthy(choose, self.quarantined())

    async def racks(self, also: Collection[str] = ()) -> dict[str, str]:
        """Every writable bookie with its rack (BookKeeper's /default-rack when unknown),
        plus the bookies in `also` (an ensemble's own members, which placement must see at
        their real racks even when they are down; the caller excludes them)."""
        writable = await self.registry.writable_bookies()
        placements = await self.registry.placements()
        return {
            bookie: placements[bookie].rack if bookie in placements else DEFAULT_RACK
            for bookie in {*writable, *also}
        }
