"""Measure the audit snapshot (issue 20): a local cluster of N ledgers (sqlite store, 4 bookie
processes) snapshotted in one process and as a Spark job on local[2], beside the raw rates of
its two halves in the same run: iterating the store's ledgers alone, and reading every
bookie's availability dump alone (all four at once, counting records).

    python bench/bench_snapshot.py [--ledgers 1000000] [--master local[2]] [--dir D]

The metadata is bulk-loaded (closed ledgers of one entry, E3 WQ2 AQ2 over the 4 bookies in
turn, thousands per store transaction); each ledger's entry is written by the client's
connection to the two bookies of its write set, pipelined. `main()` returns the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.processes import BookieProcess, init_cluster  # noqa: E402

from tally.audit.checks import spark_session  # noqa: E402
from tally.audit.snapshot import take_snapshot  # noqa: E402
from tally.audit.snapshot_job import take_snapshot_on_spark  # noqa: E402
from tally.client.bookie_connection import BookieConnection  # noqa: E402
from tally.core.digest import DigestType, master_key  # noqa: E402
from tally.core.entry_format import encode_entry  # noqa: E402
from tally.core.ids import LedgerId  # noqa: E402
from tally.core.ledger_metadata import LedgerMetadata  # noqa: E402
from tally.core.schedule import write_set  # noqa: E402
from tally.metadata.ledger_manager import LedgerManager  # noqa: E402
from tally.metadata.paths import LEDGER_METADATA  # noqa: E402
from tally.metadata.store import Create, parent_of  # noqa: E402
from tally.metadata.stores import open_store  # noqa: E402

BOOKIES = 4
BATCH = 5_000
"""Ledgers per store transaction while bulk-loading."""
IN_FLIGHT = 2_000
"""Adds in flight per bookie connection while writing the entries."""
PASSWORD = b"bench-snapshot"
PAYLOAD = b"x" * 100
T = TypeVar("T")


def ledger(number: int, bookies: list[str]) -> LedgerMetadata:
    ensemble = tuple(bookies[(number + k) % len(bookies)] for k in range(3))
    created = LedgerMetadata.create(
        ensemble=ensemble,
        write_quorum=2,
        ack_quorum=2,
        digest_type=DigestType.CRC32C,
        password=PASSWORD,
        ctime_ms=1_700_000_000_000 + number,
        creator_token=number.to_bytes(8, "big"),
    )
    return created.close(0, len(PAYLOAD))


async def bulk_load(uri: str, count: int, bookies: list[str]) -> None:
    """`count` closed ledgers' metadata, BATCH per transaction, parents made first."""
    async with open_store(uri) as store:
        paths = [LEDGER_METADATA.path(LedgerId.classic(n)) for n in range(1, count + 1)]
        for parent in sorted({parent_of(path) for path in paths}):
            await store.create(parent, make_parents=True)
        for start in range(1, count + 1, BATCH):
            numbers = range(start, min(start + BATCH, count + 1))
            await store.transaction(
                [Create(paths[n - 1], ledger(n, bookies).to_bytes()) for n in numbers]
            )
        await LedgerManager(store).skip_ids_through(count)


async def write_entries(count: int, bookies: list[str]) -> None:
    """Each ledger's one entry to the two bookies of its write set, pipelined."""
    key = master_key(PASSWORD)
    connections = {b: await BookieConnection.connect(b, request_timeout=120) for b in bookies}
    try:

        async def to(index: int) -> None:
            """The entries of the ledgers whose write set holds bookie `index`: ledger n's
            ensemble starts at bookie n % BOOKIES (see `ledger`)."""
            pending: set[asyncio.Future[None]] = set()
            connection = connections[bookies[index]]
            for n in range(1, count + 1):
                if index not in ((n + p) % len(bookies) for p in write_set(0, 3, 2)):
                    continue
                entry = encode_entry(
                    LedgerId.classic(n), 0, -1, len(PAYLOAD), PAYLOAD, DigestType.CRC32C, key
                )
                pending.add(connection.add_nowait(entry, key))
                if len(pending) >= IN_FLIGHT:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for future in done:
                        future.result()
            for future in asyncio.as_completed(pending):
                await future

        await asyncio.gather(*(to(index) for index in range(len(bookies))))
    finally:
        for connection in connections.values():
            await connection.close()


async def iterate_store(uri: str) -> int:
    async with open_store(uri, session_timeout=60) as store:
        return sum([len(page.ledgers) async for page in LedgerManager(store).ledger_pages()])


async def read_dumps(bookies: list[str]) -> int:
    async def one(bookie: str) -> int:
        connection = await BookieConnection.connect(bookie, request_timeout=60)
        try:
            async with contextlib.aclosing(connection.availability_dump()) as stream:
                return sum([1 async for _ in stream])
        finally:
            await connection.close()

    return sum(await asyncio.gather(*(one(b) for b in bookies)))


def timed(action: Callable[[], T]) -> tuple[float, T]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


@contextlib.contextmanager
def cluster(root: Path) -> Iterator[tuple[str, list[str]]]:
    uri = init_cluster(root)
    processes = [BookieProcess(uri, root / f"bookie{n}") for n in range(BOOKIES)]
    try:
        for process in processes:
            process.start()
        yield uri, [process.address for process in processes]
    finally:
        for process in processes:
            process.stop()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledgers", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dir", type=Path, help="where the cluster and snapshots go")
    args = parser.parse_args(argv)
    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    figures: dict[str, float] = {}
    try:
        with cluster(root / "cluster") as (uri, bookies):
            seconds, _ = timed(lambda: asyncio.run(bulk_load(uri, args.ledgers, bookies)))
            print(f"bulk-loaded {args.ledgers:,} ledgers in {seconds:.1f} s")
            seconds, _ = timed(lambda: asyncio.run(write_entries(args.ledgers, bookies)))
            print(f"wrote {2 * args.ledgers:,} copies of their entries in {seconds:.1f} s")
            spark = spark_session(args.master)
            try:
                # Warm both paths once (the bookies' first dumps, Spark's first job).
                asyncio.run(take_snapshot(uri, root / "warm-alone"))
                take_snapshot_on_spark(spark, uri, root / "warm-spark")
                store_s, ledgers = timed(lambda: asyncio.run(iterate_store(uri)))
                dumps_s, rows = timed(lambda: asyncio.run(read_dumps(bookies)))
                alone_s, alone = timed(lambda: asyncio.run(take_snapshot(uri, root / "alone")))
                spark_s, by_spark = timed(
                    lambda: take_snapshot_on_spark(spark, uri, root / "spark")
                )
            finally:
                spark.stop()
        assert alone["counts"] == by_spark["counts"], (alone, by_spark)
        assert ledgers == args.ledgers, ledgers
        assert rows == 2 * args.ledgers, rows
        figures = {
            "store_iteration_s": store_s,
            "dumps_read_s": dumps_s,
            "snapshot_in_process_s": alone_s,
            "snapshot_spark_s": spark_s,
        }
        count = args.ledgers
        print(f"snapshot of {count:,} ledgers, {BOOKIES} bookies ({rows:,} availability rows)")
        for what, seconds, rate in (
            ("iterating the store alone", store_s, f"{count / store_s:,.0f} ledgers/s"),
            ("reading the bookies' dumps alone", dumps_s, f"{rows / dumps_s:,.0f} rows/s"),
            ("snapshot in one process", alone_s, f"{count / alone_s:,.0f} ledgers/s"),
            (
                f"snapshot as Spark tasks, {args.master}",
                spark_s,
                f"{count / spark_s:,.0f} ledgers/s",
            ),
        ):
            print(f"  {what:<40} {seconds:7.1f} s  ({rate})")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return figures


if __name__ == "__main__":
    main()
