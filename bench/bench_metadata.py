"""Measure the ledger manager on sqlite and on ZooKeeper, and a walk over 1,000,000 ledgers.

Figures, each beside its reference from the same run:

- ledger-metadata create / read / CAS-update per second on each store, pipelined
  (CONCURRENCY requests in flight, best of ROUNDS runs), beside the store's raw rate for
  the same request (create / get / CAS-set of a key holding the same bytes): the limit the
  manager builds on. A ledger create is two writes in a row (the id from the sequence,
  then the metadata), so it runs at about half the raw create rate; an update at the raw
  set rate; a read at the raw get rate less the decoding, which on sqlite also holds the
  GIL that the store's worker thread needs. Both stores sync every write to disk (sqlite
  `synchronous=FULL`, ZooKeeper `forceSync=yes`).
- the time to iterate the metadata of 1,000,000 ledgers on sqlite (goal: under 60 s),
  beside its two parts measured alone: walking the tree and fetching the bytes (the store)
  and decoding as many metadata (the CPU).

    python bench/bench_metadata.py [--ledgers 1000000] [--ops 2000]

`main()` returns the figures as a dict for other tools.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from tally.core.digest import DigestType
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata
from tally.metadata import Create, MetadataStore, open_store
from tally.metadata.cluster import init_cluster
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.ledger_tree import walk
from tally.metadata.paths import LEDGER_METADATA
from tally.metadata.store import parent_of
from tally.metadata.zk_server import ZooKeeperServer

CONCURRENCY = 64
ROUNDS = 3
POPULATE_BATCH = 5_000
"""Ledger keys per transaction while filling the store for the walk."""


def sample_metadata() -> LedgerMetadata:
    return LedgerMetadata.create(
        ensemble=("10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"),
        write_quorum=3,
        ack_quorum=2,
        digest_type=DigestType.CRC32C,
        password=b"bench",
        ctime_ms=int(time.time() * 1000),
        creator_token=secrets.token_bytes(16),
    )


async def best_rate(count: int, op: Callable[[int, int], Awaitable[object]]) -> float:
    """Operations per second of the best of ROUNDS runs of op(round, 0 .. count-1), each
    with CONCURRENCY in flight: the run least disturbed by the machine (or a checkpoint)."""

    async def worker(round_number: int, indices: Iterator[int]) -> None:
        for index in indices:
            await op(round_number, index)

    best = 0.0
    for round_number in range(ROUNDS):
        indices = iter(range(count))
        started = time.perf_counter()
        await asyncio.gather(*(worker(round_number, indices) for _ in range(CONCURRENCY)))
        best = max(best, count / (time.perf_counter() - started))
    return best


async def round_trips(store: MetadataStore, ops: int) -> dict[str, dict[str, float]]:
    """Raw store rates and the ledger manager's, for create, read and CAS update.

    Reads and updates go to the keys and ledgers of the first create round; each update
    round moves every key on by one version.
    """
    await init_cluster(store)
    data = sample_metadata().to_bytes()
    await store.create("/bench-raw")
    raw = {
        "create": await best_rate(ops, lambda r, i: store.create(f"/bench-raw/k{r}-{i}", data)),
        "read": await best_rate(ops, lambda r, i: store.get(f"/bench-raw/k0-{i}")),
        "update": await best_rate(ops, lambda r, i: store.set(f"/bench-raw/k0-{i}", data, r)),
    }
    manager = LedgerManager(store)
    ids: list[list[LedgerId]] = [[] for _ in range(ROUNDS)]
    metadata = sample_metadata()

    async def create(round_number: int, _: int) -> None:
        ledger_id = await manager.generate_ledger_id()
        ids[round_number].append(ledger_id)
        await manager.create_ledger_metadata(ledger_id, metadata)

    closed = metadata.close(99, 1 << 20)
    ledger = {
        "create": await best_rate(ops, create),
        "read": await best_rate(ops, lambda r, i: manager.read_ledger_metadata(ids[0][i])),
        "update": await best_rate(
            ops, lambda r, i: manager.write_ledger_metadata(ids[0][i], closed, r)
        ),
    }
    return {"raw": raw, "ledger": ledger}


async def populate(store: MetadataStore, count: int) -> float:
    """Seconds to store `count` ledgers (ids 1..count) in batched transactions."""
    await init_cluster(store)
    started = time.perf_counter()
    data = sample_metadata().to_bytes()
    paths = [LEDGER_METADATA.path(LedgerId.classic(i)) for i in range(1, count + 1)]
    for parent in sorted({parent_of(path) for path in paths}):
        await store.create(parent, make_parents=True)
    for start in range(0, count, POPULATE_BATCH):
        batch = paths[start : start + POPULATE_BATCH]
        await store.transaction([Create(path, data) for path in batch])
    return time.perf_counter() - started


async def iteration(store: MetadataStore, count: int) -> dict[str, float]:
    """Seconds to iterate every ledger's metadata, and its two parts alone."""
    started = time.perf_counter()
    seen = 0
    async for page in LedgerManager(store).ledger_pages():
        seen += len(page.ledgers)
        assert not page.unreadable, page.unreadable[:3]
    iterate = time.perf_counter() - started
    if seen != count:
        raise AssertionError(f"iterated {seen} ledgers, stored {count}")
    started = time.perf_counter()
    fetched = [len(page.ledgers) async for page in walk(store, LEDGER_METADATA)]
    fetch = time.perf_counter() - started
    assert sum(fetched) == count
    data = sample_metadata().to_bytes()
    started = time.perf_counter()
    for _ in range(count):
        LedgerMetadata.from_bytes(data)
    decode = time.perf_counter() - started
    return {"iterate_s": iterate, "walk_and_fetch_s": fetch, "decode_s": decode}


def print_rates(name: str, figures: dict[str, dict[str, float]]) -> None:
    print(f"\n{name}: requests/s with {CONCURRENCY} in flight")
    print(f"  {'':8} {'ledger manager':>15} {'raw store':>12}")
    for op in ("create", "read", "update"):
        print(f"  {op:8} {figures['ledger'][op]:>15,.0f} {figures['raw'][op]:>12,.0f}")


async def run(ledgers: int, ops: int, workdir: Path) -> dict[str, object]:
    figures: dict[str, object] = {}
    async with open_store(f"sqlite://{workdir / 'rates.db'}") as store:
        figures["sqlite"] = await round_trips(store, ops)
    print_rates("sqlite", figures["sqlite"])  # type: ignore[arg-type]

    server = ZooKeeperServer(workdir / "zookeeper", force_sync=True)
    server.start()
    try:
        async with open_store(server.uri("/bench")) as store:
            figures["zookeeper"] = await round_trips(store, ops)
    finally:
        server.stop()
    print_rates("ZooKeeper (forceSync=yes)", figures["zookeeper"])  # type: ignore[arg-type]

    async with open_store(f"sqlite://{workdir / 'walk.db'}") as store:
        populate_s = await populate(store, ledgers)
        walk_figures = await iteration(store, ledgers)
    figures["iteration"] = {"ledgers": ledgers, "populate_s": populate_s, **walk_figures}
    print(f"\nsqlite, {ledgers:,} ledgers (stored in {populate_s:.1f} s):")
    print(f"  iterate every ledger's metadata  {walk_figures['iterate_s']:6.1f} s  (goal < 60 s)")
    print(f"  of which, alone: walk and fetch  {walk_figures['walk_and_fetch_s']:6.1f} s")
    print(f"                   decode          {walk_figures['decode_s']:6.1f} s")
    return figures


def main(ledgers: int = 1_000_000, ops: int = 2_000) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="tally-bench-metadata-") as workdir:
        return asyncio.run(run(ledgers, ops, Path(workdir)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledgers", type=int, default=1_000_000)
    parser.add_argument("--ops", type=int, default=2_000)
    arguments = parser.parse_args()
    main(arguments.ledgers, arguments.ops)
