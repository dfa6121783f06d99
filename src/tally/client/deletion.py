"""What the delete path needs bookies for: the last durability check, forced recovery, and
telling the ledger's bookies of a delete or an undelete.

The check at deletion (seed 002, "At the Deletion: validate durability contract") is the
online replicas check of one ledger: each bookie of its segments says which entries it
holds, and `core.replicas_decisions.judge_ledger` compares that with the schedule. A
bookie that does not answer leaves the verdict open ("potentially faulty"), never clean.
"""

from __future__ import annotations

import asyncio

from tally.client.context import ClientContext
from tally.client.metadata_copies import give_copies
from tally.client.recovery import recover
from tally.core.digest import LedgerKeys
from tally.core.errors import Unauthorized
from tally.core.replicas_decisions import bookies_to_ask, checkable, describe, judge_ledger
from tally.metadata.deletion import Recover
from tally.metadata.ledger_manager import LedgerRecord


async def check_before_delete(context: ClientContext, record: LedgerRecord) -> tuple[int, str]:
    """(copies missing from their write sets, the verdict in a sentence)."""
    metadata = record.metadata
    if not checkable(metadata):
        return 0, "nothing to check: the ledger has no entries"
    bookies = sorted(bookies_to_ask(metadata))
    held = await asyncio.gather(*(context.availability(b, record.ledger_id) for b in bookies))
    answers = {b: entries for b, entries in zip(bookies, held, strict=True) if entries is not None}
    judgement = judge_ledger(metadata, answers)
    missing = sum(len(finding.missing) for finding in judgement.durability.findings)
    verdict = describe(metadata, judgement)
    if judgement.unresponsive_bookies:
        return missing, f"incomplete: {verdict}"
    if missing:
        return missing, f"{missing} copies missing: {verdict}"
    return 0, f"every entry on its {metadata.write_quorum} bookies: {verdict}"


def recovery_for_delete(context: ClientContext, password: bytes | None) -> Recover:
    """The `recover` the delete path calls on an open ledger it was forced to delete."""

    async def recover_it(record: LedgerRecord) -> LedgerRecord:
        metadata = record.metadata
        keys = LedgerKeys.for_maintenance(metadata.digest_type, metadata.master_key, password)
        if keys is None:
            raise Unauthorized(
                f"ledger {record.ledger_id} uses HMAC digests: recovering it before the delete "
                "takes its password"
            )
        if password is not None:
            metadata.check_password(password, record.ledger_id)
        return await recover(context, record, keys)

    return recover_it


async def give_deletion_copies(context: ClientContext, record: LedgerRecord) -> None:
    """Give every bookie of the ledger a copy of its metadata as a delete or an undelete left
    it, so that a metadata recovery brings a soft-deleted ledger back DELETED, and an
    undeleted one CLOSED (best effort, as every copy)."""
    metadata = record.metadata
    await give_copies(context, record, metadata.master_key, metadata.bookies())
