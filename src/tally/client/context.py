"""What every ledger handle of one client shares: settings, metadata services, bookies."""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass, field

from tally.client.bookie_pool import BookiePool
from tally.client.config import ClientConfig
from tally.core.placement import DEFAULT_RACK, PlacementPolicy
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
