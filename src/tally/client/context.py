"""What every ledger handle of one client shares: settings, metadata services, bookies."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from prometheus_client import Counter

from tally.client.bookie_pool import BookiePool
from tally.client.config import ClientConfig
from tally.core.availability import EntryAvailability
from tally.core.errors import NoSuchLedger, TallyError
from tally.core.ids import LedgerId
from tally.core.placement import (
    DEFAULT_RACK,
    BookieQuarantine,
    PlacementPolicy,
    preferring_healthy,
    racks_in_cluster,
)
from tally.metadata.bad_copies import BadCopyReports
from tally.metadata.bookie_registry import BookieRegistry
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.underreplication import UnderReplicationManager

log = logging.getLogger(__name__)

BAD_COPIES_FILED = Counter(
    "client_bad_copies_filed",
    "Bad entry copies a client's reads found and filed for repair (under-replication marks)",
)


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
    bad_copies: BadCopyReports = field(init=False)

    def __post_init__(self) -> None:
        self.quarantine = BookieQuarantine(self.config.bookie_quarantine_time)
        self.bad_copies = BadCopyReports(self.under_replication, BAD_COPIES_FILED.inc)

    def quarantined(self) -> frozenset[str]:
        return self.quarantine.active(time.monotonic())

    def bookie_failed(self, bookie: str) -> None:
        self.quarantine.add(bookie, time.monotonic())

    async def availability(self, bookie: str, ledger_id: LedgerId) -> EntryAvailability | None:
        """What `bookie` holds of the ledger (empty when it knows none of it); None when it
        did not answer within read_timeout: unknown, never nothing."""
        try:
            connection = await self.bookies.get(bookie)
            async with asyncio.timeout(self.config.read_timeout):
                return await connection.get_list_of_entries(ledger_id)
        except NoSuchLedger:
            return EntryAvailability.empty()
        except (TallyError, TimeoutError) as error:
            log.info("ledger %s: no availability from bookie %s: %s", ledger_id, bookie, error)
            return None

    async def new_ensemble(
        self, ensemble_size: int, write_quorum: int, ack_quorum: int
    ) -> tuple[str, ...]:
        """The placement policy's ensemble of writable bookies, out of quarantine while
        enough are."""
        racks, barred, cluster_racks = await self._placement_view()

        def choose(avoid: frozenset[str]) -> tuple[str, ...]:
            return self.policy.new_ensemble(
                ensemble_size,
                write_quorum,
                ack_quorum,
                racks,
                barred | avoid,
                self.rng,
                cluster_racks,
            )

        return preferring_healthy(choose, self.quarantined())

    async def replace_positions(
        self, ensemble: Sequence[str], positions: Collection[int], write_quorum: int
    ) -> tuple[str, ...]:
        """The ensemble with the placement policy's writable bookies at `positions`, out of
        quarantine if they fit (the writer's ensemble change, recovery's, the worker's)."""
        racks, barred, cluster_racks = await self._placement_view(also=ensemble)

        def choose(avoid: frozenset[str]) -> tuple[str, ...]:
            return self.policy.replace_positions(
                ensemble, positions, write_quorum, racks, barred | avoid, self.rng, cluster_racks
            )

        return preferring_healthy(choose, self.quarantined())

    async def _placement_view(
        self, also: Collection[str] = ()
    ) -> tuple[dict[str, str], frozenset[str], int]:
        """Every registered bookie with its rack (BookKeeper's /default-rack when unknown),
        plus the bookies in `also` (an ensemble's own members, which placement must see at
        their real racks even when they are down); those of them that take no new copies
        (read-only or gone); and the racks of the cluster, as the audits count them."""
        available = await self.registry.available_bookies()
        placements = await self.registry.placements()
        registered = available.writable | available.read_only
        racks = {
            bookie: placements[bookie].rack if bookie in placements else DEFAULT_RACK
            for bookie in {*registered, *also}
        }
        barred = frozenset(racks.keys() - available.writable)
        return racks, barred, racks_in_cluster(racks, registered)
