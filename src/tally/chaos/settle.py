"""After the faults: let the cluster settle, check that it did, and read every ledger back.

Settling is what an operator waits for after an incident: every bookie scrubbed (so rot
the run left is found), no ledger marked under-replicated, no copy marked corrupt, and the
data of every deleted ledger dropped by its bookies. Then the cluster is judged as the
invariants ask: the online replicas check and the Spark audit both clean, no deleted
ledger's data left; and each ledger of the history is read back whole (`final` events).
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.replicas_check import replicas_check
from tally.chaos.cluster import ChaosCluster
from tally.chaos.history_file import HistoryFile
from tally.chaos.writer import PASSWORD
from tally.client.client import Client
from tally.core.chaos.history import Final, Settled, content_digest
from tally.core.errors import LedgerDeleted, NoSuchLedger, TallyError
from tally.core.ids import LedgerId
from tally.local.services import tally_command
from tally.metadata.tombstones import tombstone_pages
from tally.metadata.underreplication import UnderReplicationManager

log = logging.getLogger(__name__)

POLL = 1.0
HTTP_TIMEOUT = 120.0


@dataclass
class Settling:
    under_replicated: int = 0
    lost_entries: int = 0
    corrupt_copies: int = 0
    tombstones_pending: int = 0
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def settled(self) -> bool:
        return not (self.under_replicated or self.corrupt_copies or self.tombstones_pending)


async def scrub_all(cluster: ChaosCluster, timeout: float) -> dict[str, str]:
    """A pass at full speed on every bookie, one after the other, each waited for up to
    what is left of `timeout`: rot is found before judging. A bookie whose pass did not end
    is named (its corrupt copies, if any, still count: `look` asks for them)."""
    deadline = time.monotonic() + timeout
    unfinished = {}
    for bookie_id, bookie in cluster.bookies.items():
        url = f"{bookie.admin_url}/api/v1/bookie/scrub?wait=true"
        try:
            await asyncio.to_thread(_http, "PUT", url, max(1.0, deadline - time.monotonic()))
        except OSError as error:
            log.warning("chaos: the scrub of bookie %s did not end: %s", bookie_id, error)
            unfinished[f"scrub of {bookie_id}"] = str(error)
    return unfinished


def _http(method: str, url: str, timeout: float = HTTP_TIMEOUT) -> Any:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


async def look(client: Client, cluster: ChaosCluster) -> Settling:
    """How far the cluster is from settled, now."""
    store = client.context.ledgers.store
    marks = UnderReplicationManager(store)
    found = Settling()
    async for _ in marks.list_under_replicated():
        found.under_replicated += 1
    async for _ in marks.list_lost_entries():
        found.lost_entries += 1
    for bookie_id, bookie in cluster.bookies.items():
        try:
            corrupt = await asyncio.to_thread(
                _http, "GET", f"{bookie.admin_url}/api/v1/bookie/corrupt_entries"
            )
        except OSError as error:
            found.detail[f"corrupt_entries of {bookie_id}"] = str(error)
            found.corrupt_copies += 1  # unknown counts against settling
            continue
        found.corrupt_copies += len(corrupt)
    async for page in tombstone_pages(store):
        found.tombstones_pending += sum(1 for record in page.tombstones if record.tombstone.pending)
    return found


async def settle(
    client: Client, cluster: ChaosCluster, history: HistoryFile, timeout: float
) -> Settling:
    """Wait until settled or `timeout`; what was left."""
    started = time.monotonic()
    unfinished = await scrub_all(cluster, timeout)
    while True:
        found = await look(client, cluster)
        if found.settled or time.monotonic() - started > timeout:
            found.detail.update(unfinished, seconds=round(time.monotonic() - started, 1))
            return found
        await asyncio.sleep(POLL)


async def judge(
    client: Client,
    cluster: ChaosCluster,
    history: HistoryFile,
    settling: Settling,
    deleted: Iterable[str],
    out: Path,
    audit: bool,
    metadata: str,
) -> None:
    """The checks of a settled cluster, as the history's `settled` event."""
    report = await replicas_check(client.context, AutoRecoveryConfig())
    findings = [f for f in report.findings if f.ledger_id is not None]
    left = await _deleted_data_left(client, cluster, deleted)
    violations, audit_detail = await _audit(metadata, out) if audit else (0, "not run")
    history.write(
        Settled(
            t=history.now(),
            seconds=float(settling.detail.get("seconds", 0.0)),
            under_replicated=settling.under_replicated + settling.lost_entries,
            replicas_check_findings=len(findings),
            audit_violations=violations,
            corrupt_copies=settling.corrupt_copies,
            deleted_data_left=left,
            detail={
                **{k: v for k, v in settling.detail.items() if k != "seconds"},
                "lost_entries_listed": settling.lost_entries,
                "tombstones_pending": settling.tombstones_pending,
                "replicas_check": [f"{f.ledger_id}: {f.detail}" for f in findings[:20]],
                "replicas_check_ledgers": report.ledgers_checked,
                "audit": audit_detail,
            },
        )
    )


async def _deleted_data_left(client: Client, cluster: ChaosCluster, deleted: Iterable[str]) -> int:
    """(ledger, bookie) pairs where a bookie still holds entries of a deleted ledger."""
    left = 0
    for name in deleted:
        for bookie in cluster.bookies:
            held = await client.context.availability(bookie, LedgerId.parse(name))
            if held is None or held:
                left += 1
                log.warning("chaos: bookie %s still holds ledger %s after its delete", bookie, name)
    return left


async def _audit(uri: str, out: Path) -> tuple[int, str]:
    """The Spark audit of a snapshot taken now: its violations, and where its report is."""
    snapshot, report = out / "audit" / "snapshot", out / "audit" / "report"
    for argv in (
        tally_command("audit", "snapshot", "--metadata", uri, "--out", str(snapshot)),
        tally_command(
            "audit",
            "run",
            "--snapshot",
            str(snapshot),
            "--out",
            str(report),
            "--master",
            "local[2]",
        ),
    ):
        done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True)
        if done.returncode not in (0, 1):
            return 1, f"{' '.join(argv[3:5])} failed: {done.stderr.strip()[-500:]}"
    summary = json.loads((report / "summary.json").read_text())
    categories = summary.get("categories", {})
    return sum(categories.values()), f"{report}: {categories}"


async def read_back(client: Client, history: HistoryFile, ledgers: Iterable[str]) -> None:
    """Each ledger as the cluster has it now, read whole: the history's `final` events."""
    for name in ledgers:
        history.write(await _final(client, history, name))


async def _final(client: Client, history: HistoryFile, name: str) -> Final:
    try:
        record = await client.context.ledgers.read_ledger_metadata(LedgerId.parse(name))
    except (NoSuchLedger, LedgerDeleted):
        return Final(
            t=history.now(), ledger=name, state="GONE", last_entry=-1, length=0, digests=()
        )
    if record.metadata.deletion is not None:
        metadata = record.metadata
        return Final(
            t=history.now(), ledger=name, state="DELETED", last_entry=metadata.last_entry_id,
            length=metadata.length, digests=(),
        )  # fmt: skip
    reader = await client.open_ledger(name, password=PASSWORD)  # recovers one left open
    digests: list[str | None] = []
    for entry in range(reader.last_entry_id + 1):
        try:
            digests.append(content_digest((await reader.read_entry(entry)).data))
        except TallyError as error:
            log.warning("chaos: ledger %s entry %d unreadable: %s", name, entry, error)
            digests.append(None)
    return Final(
        t=history.now(),
        ledger=name,
        state=reader.metadata.state.name,
        last_entry=reader.last_entry_id,
        length=reader.metadata.length,
        digests=tuple(digests),
    )
