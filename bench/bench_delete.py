"""Measure what deleting a ledger costs (issue 16): the delete path, its check, its tombstone.

Three `tally bookie` processes on loopback, a sqlite metadata store (every write synced),
and one `tally.Client` in this process. LEDGERS closed ledgers (E=3 WQ=2, 10 entries of
100 B) are written, then deleted through the delete path, CONCURRENCY at a time:

- soft delete (ledger_delete_retention > 0): read the metadata and the cluster settings,
  ask each of the ledger's bookies what it holds (the check at deletion), CAS the metadata
  to DELETED;
- delete with retention 0: the same, then the tombstone written in one transaction with the
  removal of the metadata.

The references, from the same run and the same store and bookies, are what the path cannot
do without: the raw store operations (a read and a CAS set of the same metadata; and for
the tombstone one transaction deleting one key and creating another) and the raw
availability requests to the three bookies (GET_LIST_OF_ENTRIES, one round trip each, in
parallel, as the check sends them).

    python bench/bench_delete.py [--dir D] [--ledgers N]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.processes import BookieProcess, init_cluster  # noqa: E402

from tally.client.client import Client  # noqa: E402
from tally.core.deletion import ClusterSettings  # noqa: E402
from tally.core.ids import LedgerId  # noqa: E402
from tally.metadata.cluster_settings import write_settings  # noqa: E402
from tally.metadata.paths import LEDGER_METADATA  # noqa: E402
from tally.metadata.store import Create, Delete  # noqa: E402

CONCURRENCY = 16
ENTRIES = 10


async def timed(items: list[LedgerId], work: Callable[[LedgerId], Awaitable[object]]) -> float:
    """Seconds per item, CONCURRENCY items in flight."""
    queue = list(items)

    async def worker() -> None:
        while queue:
            await work(queue.pop())

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return (time.perf_counter() - started) / len(items)


async def write_ledgers(client: Client, count: int) -> list[LedgerId]:
    async def one(_: object) -> LedgerId:
        writer = await client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2)
        for entry_id in range(ENTRIES):
            writer.append_nowait(b"%99d" % entry_id)
        await writer.close()
        return writer.ledger_id

    made: list[LedgerId] = []
    for start in range(0, count, CONCURRENCY):
        made += await asyncio.gather(
            *(one(i) for i in range(start, min(count, start + CONCURRENCY)))
        )
    return made


async def run(uri: str, ledgers: int) -> dict[str, float]:
    async with Client(uri) as client:
        store = client.context.ledgers.store
        manager = client.context.ledgers
        figures: dict[str, float] = {}

        sample = await write_ledgers(client, ledgers)

        async def raw_read_and_set(ledger_id: LedgerId) -> None:
            found = await store.get(LEDGER_METADATA.path(ledger_id))
            await store.set(LEDGER_METADATA.path(ledger_id), found.data, found.version)

        figures["raw store: read + CAS set"] = await timed(sample, raw_read_and_set)

        async def raw_check(ledger_id: LedgerId) -> None:
            record = await manager.read_ledger_metadata(ledger_id)
            bookies = sorted(record.metadata.bookies())
            connections = [await client.context.bookies.get(b) for b in bookies]
            await asyncio.gather(*(c.get_list_of_entries(ledger_id) for c in connections))

        figures["raw: 3 availability requests (+ a read)"] = await timed(sample, raw_check)

        await write_settings(store, ClusterSettings(ledger_delete_retention=3600))
        figures["soft delete (delete path)"] = await timed(
            sample, lambda ledger_id: client.delete_ledger(ledger_id)
        )

        others = await write_ledgers(client, ledgers)
        scratch = [LedgerId(7, ledger_id.id) for ledger_id in others]
        for source, copy in zip(others, scratch, strict=True):
            found = await store.get(LEDGER_METADATA.path(source))
            await store.create(LEDGER_METADATA.path(copy), found.data, make_parents=True)

        async def raw_transaction(ledger_id: LedgerId) -> None:
            path = LEDGER_METADATA.path(ledger_id)
            found = await store.get(path)
            await store.transaction([Delete(path, found.version), Create(path + "t", found.data)])

        figures["raw store: read + transaction (delete + create)"] = await timed(
            scratch, raw_transaction
        )
        await write_settings(store, ClusterSettings(ledger_delete_retention=0))
        figures["delete with tombstone (retention 0)"] = await timed(
            others, lambda ledger_id: client.delete_ledger(ledger_id)
        )
        return figures


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--ledgers", type=int, default=500)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-delete-", dir=args.dir))
    bookies: list[BookieProcess] = []
    try:
        uri = init_cluster(root)
        bookies = [BookieProcess(uri, root / f"bookie-{i}").start() for i in range(3)]
        figures = asyncio.run(run(uri, args.ledgers))
    finally:
        for bookie in bookies:
            bookie.kill()
        shutil.rmtree(root, ignore_errors=True)
    soft = figures["soft delete (delete path)"]
    hard = figures["delete with tombstone (retention 0)"]
    floor_soft = (
        figures["raw store: read + CAS set"] + figures["raw: 3 availability requests (+ a read)"]
    )
    floor_hard = floor_soft + figures["raw store: read + transaction (delete + create)"]
    print(f"{args.ledgers} ledgers, {CONCURRENCY} deletes in flight, per ledger:")
    for name, seconds in figures.items():
        print(f"  {name:48} {seconds * 1e6:9.0f} µs")
    print(f"  soft delete / its raw parts:                     {soft / floor_soft:.2f} x")
    print(f"  delete with tombstone / its raw parts:           {hard / floor_hard:.2f} x")
    return figures


if __name__ == "__main__":
    main()
