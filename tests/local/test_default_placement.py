"""What `tally local up` and `tally demo` create passes their own audit: the auditor's
placement check, run over ledgers of their default shapes on bookies placed as they place
them, finds nothing, before and after a bookie is lost (the demo kills one)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tally
from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.placement_check import placement_check
from tally.autorecovery.process import AutoRecoveryProcess
from tally.cli import cluster_demo
from tally.client.client import Client
from tally.core.errors import NotEnoughBookies
from tally.local.config import DEFAULT_BOOKIES, DEFAULT_RACKS
from tally.local.state import plan_bookies
from tally.metadata.ledger_manager import LedgerRecord
from tests.support.registry import Registry, registered_bookies

LEDGERS = 20
DEADLINE = 30.0


async def _placement_findings(uri: str) -> int:
    """The auto-recovery process's placement check, with its own settings and client."""
    config = AutoRecoveryConfig(metadata=uri)
    client_config = AutoRecoveryProcess(config, "placement-test").client_config()
    async with tally.Client(uri, config=client_config) as auditor:
        return await placement_check(auditor.context, config, lambda: 0)


async def _close(client: Client, record: LedgerRecord) -> None:
    """Closed with entries, as only such ledgers are judged (nothing is written to bookies:
    the check reads the metadata alone)."""
    await client.context.ledgers.write_ledger_metadata(
        record.ledger_id, record.metadata.close(9, 100), record.version
    )


async def _lose_and_repair(client: Client, registry: Registry, lost: str) -> None:
    """`lost` goes; each closed ledger on it gets a new bookie as the replication worker
    chooses one, when there is one to choose."""
    await registry.lose(lost)
    async for page in client.context.ledgers.ledger_pages():
        for record in page.ledgers:
            ensemble = record.metadata.segments[0].ensemble
            if lost not in ensemble:
                continue
            position = ensemble.index(lost)
            try:
                new = await client.context.replace_positions(
                    ensemble, [position], record.metadata.write_quorum
                )
            except NotEnoughBookies:
                continue  # every bookie left is in the ensemble: it stays under-replicated
            await client.context.ledgers.write_ledger_metadata(
                record.ledger_id,
                record.metadata.replace_bookie(0, lost, new[position]),
                record.version,
            )


def _check(tmp_path: Path, bookies: int, racks: int, quorums: tuple[int, int, int] | None) -> None:
    slots = plan_bookies(tmp_path, bookies, racks)

    async def test() -> None:
        racks = {slot.bookie_id: slot.rack for slot in slots}
        async with registered_bookies(racks) as registry, tally.Client(registry.uri) as client:
            for _ in range(LEDGERS):
                if quorums is None:
                    writer = await client.create_ledger()  # the client's default shape
                else:
                    e, wq, aq = quorums
                    writer = await client.create_ledger(
                        ensemble_size=e, write_quorum=wq, ack_quorum=aq
                    )
                await _close(client, writer.metadata)
            assert await _placement_findings(registry.uri) == 0
            await _lose_and_repair(client, registry, slots[1].bookie_id)
            assert await _placement_findings(registry.uri) == 0

    asyncio.run(asyncio.wait_for(test(), DEADLINE))


def test_ledgers_of_the_client_defaults_on_tally_local_up_defaults_pass_the_audit(
    tmp_path: Path,
) -> None:
    _check(tmp_path, DEFAULT_BOOKIES, DEFAULT_RACKS, None)


def test_the_demos_ledgers_pass_the_audit(tmp_path: Path) -> None:
    _check(tmp_path, cluster_demo.BOOKIES, cluster_demo.RACKS, cluster_demo.QUORUMS)


def test_on_two_racks_the_client_defaults_are_refused_rather_than_failing_the_audit(
    tmp_path: Path,
) -> None:
    slots = plan_bookies(tmp_path, 3, 2)

    async def test() -> None:
        racks = {slot.bookie_id: slot.rack for slot in slots}
        async with registered_bookies(racks) as registry, tally.Client(registry.uri) as client:
            with pytest.raises(NotEnoughBookies, match="refusing to place unsafely: E=3 WQ=2"):
                await client.create_ledger()

    asyncio.run(asyncio.wait_for(test(), DEADLINE))
