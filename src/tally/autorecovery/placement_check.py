"""The auditor's placement check: every segment holding entries of every closed ledger
against the placement policy. It counts the ledgers whose worst segment fails the policy or
meets it only softly (gauges), logs each such segment with its bookies' racks, and with
`repaired_placement_policy_not_adhering_bookie_enable` marks the failing ledgers for repair,
naming the bookies that crowd a rack (BookKeeper's placement policy check)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from tally.autorecovery import auditor_metrics as metrics
from tally.autorecovery.config import AutoRecoveryConfig
from tally.client.context import ClientContext
from tally.core.ledger_metadata import LedgerState, Segment
from tally.core.placement import (
    PlacementAdherence,
    crowded_bookies,
    rack_of,
    racks_in_cluster,
    worst_segments,
)
from tally.metadata.ledger_manager import LedgerRecord
from tally.metadata.underreplication import AuditorCheck

log = logging.getLogger(__name__)


async def placement_check(
    context: ClientContext, config: AutoRecoveryConfig, now_ms: Callable[[], int]
) -> int:
    """The number of ledgers that fail the policy or meet it only softly."""
    registry = context.registry
    racks = {bookie: p.rack for bookie, p in (await registry.placements()).items()}
    available = await registry.available_bookies()
    cluster_racks = racks_in_cluster(racks, available.writable | available.read_only)
    repair = config.repaired_placement_policy_not_adhering_bookie_enable
    failing = softly = 0
    async for page in context.ledgers.ledger_pages():
        for record in page.ledgers:
            metadata = record.metadata
            if metadata.state is not LedgerState.CLOSED:
                continue
            shapes = [
                (segment.ensemble, last is None or last >= first)
                for segment, first, last in metadata.segments_with_bounds()
            ]
            worst, indexes = worst_segments(
                context.policy, shapes, metadata.write_quorum, racks, cluster_racks
            )
            if worst is PlacementAdherence.MEETS_STRICT:
                continue
            segments = [metadata.segments[i] for i in indexes]
            fails = worst is PlacementAdherence.FAIL
            for segment in segments:
                log.warning(
                    "placement check: ledger %s segment at entry %d: ensemble %s on racks "
                    "%s %s the placement policy (WQ=%d, %d racks in the cluster)%s",
                    record.ledger_id.qualified_name,
                    segment.first_entry_id,
                    list(segment.ensemble),
                    [rack_of(racks, bookie) for bookie in segment.ensemble],
                    "fails" if fails else "meets only softly",
                    metadata.write_quorum,
                    cluster_racks,
                    "; marking it for repair" if repair and fails else "",
                )
            if not fails:
                softly += 1
                continue
            failing += 1
            if repair:
                await _mark_for_placement(context, record, segments, racks, now_ms())
    metrics.LEDGERS_NOT_ADHERING.set(failing)
    metrics.LEDGERS_SOFTLY_ADHERING.set(softly)
    return failing + softly


async def _mark_for_placement(
    context: ClientContext,
    record: LedgerRecord,
    segments: list[Segment],
    racks: Mapping[str, str],
    now_ms: int,
) -> None:
    """Name the bookies to move (empty: the worker looks at every copy)."""
    crowded: set[str] = set()
    for segment in segments:
        crowded |= crowded_bookies(segment.ensemble, record.metadata.write_quorum, racks)
    await context.under_replication.mark_under_replicated(record.ledger_id, crowded, now_ms=now_ms)
    metrics.UNDER_REPLICATED_LEDGERS_MARKED.labels(AuditorCheck.PLACEMENT_POLICY.value).inc()
