"""Write a recovery's decisions into a metadata store: the cluster, the cookies, the ledgers,
then the ledger recoveries of those that come back OPEN.

From a snapshot, the cluster settings it recorded too. Into an empty store, or one just
initialised by `tally cluster init` (its new instance id is replaced by the bookies', which
their cookies name); never over another cluster's metadata. Idempotent: a ledger, a cookie
already there as recovered is left as it is (a ledger a previous run recovered and closed
stays closed), so a run cut short is finished by running it again. Ledger ids are never
handed out again: the id sequence goes on past the largest recovered one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.dataset as ds

from tally.audit.recovery.job import (
    COOKIES,
    COOKIES_SCHEMA,
    DECISIONS_SCHEMA,
    LEDGERS,
    SUMMARY_JSON,
)
from tally.audit.schema import CLUSTER_SETTINGS, from_int64
from tally.client.client import Client
from tally.client.config import ClientConfig
from tally.client.recovery import recover
from tally.core.digest import LedgerKeys
from tally.core.errors import (
    CookieMismatch,
    IllegalOperation,
    KeyExists,
    LedgerExists,
    NoSuchLedger,
    TallyError,
)
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.metadata.cluster import ClusterInfo, init_cluster, read_cluster
from tally.metadata.cluster_settings import settings_of, write_settings
from tally.metadata.cookies import Cookie, CookieManager
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.paths import CLUSTER
from tally.metadata.store import MetadataStore

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int | None], None]
"""progress(stage, done, total or None), as work advances."""


@dataclass(slots=True)
class Applied:
    """What a run wrote, and what it could not."""

    cookies_written: int = 0
    ledgers_written: int = 0
    ledgers_present: int = 0
    """Already there (a previous run's): left as they are."""
    recovered: int = 0
    recovery_failed: dict[str, str] = field(default_factory=dict)
    """Ledger -> why its recovery failed (run again once its bookies answer)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "cookies_written": self.cookies_written,
            "ledgers_written": self.ledgers_written,
            "ledgers_present": self.ledgers_present,
            "recovered": self.recovered,
            "recovery_failed": self.recovery_failed,
        }


async def apply_recovery(
    store: MetadataStore,
    report: Path,
    *,
    client_config: ClientConfig | None = None,
    progress: Progress = lambda stage, done, total: None,
) -> Applied:
    summary = json.loads((report / SUMMARY_JSON).read_text())
    applied = Applied()
    await _cluster(store, summary["instance_id"])
    if (settings := summary.get(CLUSTER_SETTINGS)) is not None:  # from a snapshot
        await write_settings(store, settings_of(settings, f"the snapshot's {CLUSTER_SETTINGS}"))
    await _cookies(store, report, applied)
    to_recover = await _ledgers(store, report, applied, progress)
    async with Client.sharing(store, config=client_config) as client:
        for done, ledger_id in enumerate(to_recover, start=1):
            try:
                current = await client.context.ledgers.read_ledger_metadata(ledger_id)
                if current.metadata.state in (LedgerState.OPEN, LedgerState.IN_RECOVERY):
                    metadata = current.metadata
                    keys = LedgerKeys.for_maintenance(
                        metadata.digest_type, metadata.master_key, None
                    )
                    if keys is None:
                        raise IllegalOperation("an HMAC ledger's recovery needs its password")
                    await recover(client.context, current, keys)
                applied.recovered += 1
            except TallyError as error:
                applied.recovery_failed[ledger_id.qualified_name] = str(error)
                log.warning("ledger %s: recovery failed: %s", ledger_id.qualified_name, error)
            progress("recover", done, len(to_recover))
    return applied


async def _cluster(store: MetadataStore, instance_id: str) -> None:
    """The cluster record, with the bookies' instance id."""
    existing = await read_cluster(store)
    if existing is None:
        await init_cluster(store, instance_id=instance_id)
        return
    if existing.instance_id == instance_id:
        return
    if await CookieManager(store).bookie_ids() or await _any_ledger(store):
        raise CookieMismatch(
            f"the store holds cluster {existing.instance_id}, with bookies or ledgers of its "
            f"own; the bookies' cookies name cluster {instance_id}: recover into an empty or "
            "freshly initialised store"
        )
    found = await store.get(CLUSTER)
    replaced = ClusterInfo(instance_id, existing.layout_version, existing.created_ms)
    await store.set(CLUSTER, replaced.to_bytes(), found.version)
    log.info(
        "cluster record %s of a fresh store replaced by the recovered cluster's, %s",
        existing.instance_id,
        instance_id,
    )


async def _any_ledger(store: MetadataStore) -> bool:
    async for page in LedgerManager(store).ledger_pages(page_size=1):
        if page.ledgers or page.unreadable:
            return True
    return False


async def _present(ledgers: LedgerManager, ledger_id: LedgerId) -> bool:
    """Whether the ledger is in the store already (a previous run's, recovered since)."""
    try:
        await ledgers.read_ledger_metadata(ledger_id)
    except NoSuchLedger:
        return False
    return True


async def _cookies(store: MetadataStore, report: Path, applied: Applied) -> None:
    cookies = CookieManager(store)
    rows = ds.dataset(str(report / COOKIES), schema=COOKIES_SCHEMA).to_table().to_pylist()
    for row in rows:
        cookie = Cookie.from_bytes(row["cookie"], f"the recovered cookie of {row['bookie_id']}")
        try:
            await cookies.put(cookie, None)
            applied.cookies_written += 1
        except KeyExists:
            found = await cookies.get(cookie.bookie_id)
            if found is None or found.cookie != cookie:
                raise CookieMismatch(
                    f"bookie {cookie.bookie_id} already has another cookie in the store"
                ) from None


async def _ledgers(
    store: MetadataStore, report: Path, applied: Applied, progress: Progress
) -> list[LedgerId]:
    """Write every ledger with metadata to write back; the ones to recover."""
    ledgers = LedgerManager(store)
    decisions = ds.dataset(str(report / LEDGERS), schema=DECISIONS_SCHEMA)
    total = decisions.count_rows(filter=ds.field("metadata").is_valid())
    to_recover: list[LedgerId] = []
    largest = -1
    done = 0
    for batch in decisions.to_batches(
        columns=["scope", "ledger_id", "metadata", "needs_recovery"],
        filter=ds.field("metadata").is_valid(),
    ):
        for row in batch.to_pylist():
            ledger_id = LedgerId(from_int64(row["scope"]), from_int64(row["ledger_id"]))
            metadata = LedgerMetadata.from_bytes(row["metadata"], ledger_id)
            if await _present(ledgers, ledger_id):
                applied.ledgers_present += 1
            else:
                try:
                    await ledgers.create_ledger_metadata(ledger_id, metadata)
                    applied.ledgers_written += 1
                except LedgerExists:  # created meanwhile
                    applied.ledgers_present += 1
            if row["needs_recovery"]:
                to_recover.append(ledger_id)
            if ledger_id.scope == 0:
                largest = max(largest, ledger_id.id)
            done += 1
            progress("ledgers", done, total)
    if largest >= 0:
        await ledgers.skip_ids_through(largest)
    return to_recover
