"""What every ledger handle of one client shares: settings, metadata services, bookies."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tally.client.bookie_pool import BookiePool
from tally.client.config import ClientConfig
from tally.core.placement import PlacementPolicy
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

    async def racks(self) -> dict[str, str]:
        """Every writable bookie with its rack (BookKeeper's /default-rack when unknown)."""
        writable = await self.registry.writable_bookies()
        placements = await self.registry.placements()
        return {
            bookie: placements[bookie].rack if bookie in placements else "/default-rack"
            for bookie in writable
        }
