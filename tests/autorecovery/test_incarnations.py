"""A bookie wiped and formatted anew under its old id (issue 17 §4), with real processes.

The bookie stops, its directories are wiped, an operator deletes its cookie with the shell,
and it starts again under the same id: it formats itself (a new incarnation) and registers,
empty, well within `lost_bookie_recovery_delay`, so the lost-bookie path marks nothing.
The auditor sees the new incarnation in the cookie and marks every ledger with a segment on
the bookie; the replication worker copies the entries back onto it; nothing is lost. An idle
ledger left open by its writer gets its acknowledged entries (up to the LAC) back too,
without waiting for its close, and its writer goes on.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tally.client.client import Client
from tally.core.schedule import write_set
from tally.metadata.cookies import CookieManager
from tally.metadata.incarnations import RememberedIncarnations
from tests.autorecovery.test_end_to_end import (
    PASSWORD,
    assert_fully_replicated,
    autorecovery,
    most_used_bookie,
    payload,
    records,
    wait_repaired,
    write_ledgers,
)
from tests.bookie.conftest import scrape
from tests.support.cluster import Cluster, eventually_writable, running_cluster
from tests.support.polling import until
from tests.support.processes import tally

WAIT = 30.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path, 4) as found:
        yield found


def checks_done(port: int) -> bool:
    """Every periodic check of the auditor has run once (they all run at its election): the
    incident comes after, so that no check races with the bookie's stop."""
    url = f"http://127.0.0.1:{port}/api/v1/autorecovery/process"
    with urllib.request.urlopen(url, timeout=5) as answer:
        checks = json.load(answer)["auditor"]["checks"]
    return all(check["last_run_ms"] for check in checks.values() if check["enabled"])


async def test_a_bookie_wiped_and_formatted_anew_under_its_id_is_marked_and_repaired(
    cluster: Cluster,
) -> None:
    ledgers = await write_ledgers(cluster.uri, 12, 20, write_quorum=3)
    before = await records(cluster.uri, ledgers)
    victim = most_used_bookie(before)
    on_victim = [x for x, record in before.items() if victim in record.metadata.bookies()]
    assert on_victim
    everyone = {bookie.address for bookie in cluster.bookies}
    with autorecovery(cluster, "ar-incarnations", lost_bookie_recovery_delay="3600") as process:
        async with Client(cluster.uri) as client, Client(cluster.uri) as writing:
            idle = await writing.create_ledger(  # every bookie is in its ensemble
                ensemble_size=4, write_quorum=3, ack_quorum=2, password=PASSWORD
            )
            await asyncio.gather(
                *(idle.append_nowait(payload(idle.ledger_id, e, 100)) for e in range(20))
            )
            on_victim.append(idle.ledger_id)
            store = client.context.ledgers.store
            cookies = CookieManager(store)
            old = (await cookies.incarnations())[victim]

            async def all_remembered() -> bool:
                return (await RememberedIncarnations(store).all()).keys() == everyone

            await until(all_remembered, "every bookie's incarnation remembered", timeout=WAIT)
            await until(lambda: checks_done(process.http_port), "the first checks", timeout=WAIT)

            bookie = cluster.bookie(victim)
            await asyncio.to_thread(bookie.stop)
            await eventually_writable(cluster.uri, everyone - {victim})
            for directory in ("journal", "ledgers"):
                await asyncio.to_thread(shutil.rmtree, bookie.data_dir / directory)
            deleted = await asyncio.to_thread(
                tally, "shell", "cookie", "delete", victim, "--force", "--metadata", cluster.uri
            )
            assert deleted.returncode == 0, deleted.stderr
            await asyncio.to_thread(cluster.restart, [victim])
            new = (await cookies.incarnations())[victim]
            assert new != old, "the bookie formatted itself anew"

            def marked() -> float:
                found = scrape(process.http_port)
                cause = frozenset({("cause", "incarnation_changed")})
                return found.get(("auditor_num_under_replicated_ledgers_marked_total", cause), 0.0)

            await until(
                lambda: marked() == len(on_victim), "the victim's ledgers marked", timeout=WAIT
            )
            # The auditor marks the ledgers first, then remembers the new incarnation, counts
            # and logs it: wait for that, not only for the marks.
            announced = f"bookie {victim} is a new incarnation {new} (was {old})"
            await until(lambda: announced in process.log(), "the change logged", timeout=WAIT)
            assert (
                scrape(process.http_port)[
                    ("auditor_bookie_incarnations_changed_total", frozenset())
                ]
                == 1
            )
            assert f"marked its {len(on_victim)} ledgers" in process.log()

            await wait_repaired(cluster.uri, ledgers, lost=None)
            (segment,) = (await records(cluster.uri, {idle.ledger_id: 19}))[
                idle.ledger_id
            ].metadata.segments
            others = [bookie for bookie in segment.ensemble if bookie != victim]
            lac = max(
                [
                    await (await client.context.bookies.get(b)).read_lac(idle.ledger_id)
                    for b in others
                ]
            )
            assert lac >= 10
            position = segment.ensemble.index(victim)
            owed = {e for e in range(lac + 1) if position in write_set(e, 4, 3)}
            held = await client.context.availability(victim, idle.ledger_id)
            assert held is not None
            assert owed <= set(held), "the open ledger's acknowledged entries are back"
            assert await idle.append(payload(idle.ledger_id, 20, 100)) == 20
            await idle.close()
            remembered = await RememberedIncarnations(store).all()
            assert remembered[victim].incarnation_id == new
            assert [x async for x in client.context.under_replication.list_lost_entries()] == []
    after = await records(cluster.uri, ledgers)
    for ledger_id in ledgers:
        assert after[ledger_id].metadata.segments == before[ledger_id].metadata.segments, (
            "copied back onto the new incarnation, in place"
        )
    await assert_fully_replicated(cluster.uri, ledgers)
