"""What a short ledger costs end to end, create -> first add -> close, against real bookie
processes (issue 18: the metadata copies a writer gives its bookies are sent here, once per
bookie at the first add and once more at the close).

Three `tally bookie` processes on loopback, a sqlite metadata store, one `tally.Client` in
this process. Ledgers E=3 WQ=3 AQ=2, one at a time and `--concurrent` at a time: create,
append one 1 KiB entry, close. Figures: ledgers per second, and the p50 / p99 of the three
steps (create, first add, close). Physical reference from the same run: a 128-byte write +
fdatasync loop in the scratch directory (a ledger's life needs at least three of those in
a row: the store's create, the journal's add, the store's close).

    python bench/bench_ledger_lifecycle.py [--dir D] [--ledgers N] [--concurrent C]

Run it on two trees to compare (the A/B in docs/benchmarks.md): `PYTHONPATH=<tree>/src`.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.processes import BookieProcess, init_cluster  # noqa: E402

from bench_journal import quantile, raw_fdatasync  # noqa: E402
from tally.client.client import Client  # noqa: E402

PASSWORD = b"bench-lifecycle"
PAYLOAD = bytes(1024)
BOOKIES = 3


async def one_ledger(client: Client, steps: dict[str, list[float]]) -> None:
    clock = time.perf_counter
    started = clock()
    writer = await client.create_ledger(
        ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
    )
    created = clock()
    await writer.append(PAYLOAD)
    added = clock()
    await writer.close()
    closed = clock()
    steps["create"].append(created - started)
    steps["first add"].append(added - created)
    steps["close"].append(closed - added)


async def lifecycles(uri: str, ledgers: int, concurrent: int) -> dict[str, float]:
    steps: dict[str, list[float]] = {"create": [], "first add": [], "close": []}
    async with Client(uri) as client:
        for _ in range(5):  # warm up: connections dialled, code paths hot
            await one_ledger(client, {"create": [], "first add": [], "close": []})
        semaphore = asyncio.Semaphore(concurrent)

        async def bounded() -> None:
            async with semaphore:
                await one_ledger(client, steps)

        started = time.perf_counter()
        await asyncio.gather(*(bounded() for _ in range(ledgers)))
        seconds = time.perf_counter() - started
    figures = {"ledgers_per_s": ledgers / seconds}
    for step, values in steps.items():
        figures[f"{step}_p50_ms"] = quantile(values, 0.5) * 1e3
        figures[f"{step}_p99_ms"] = quantile(values, 0.99) * 1e3
    return figures


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    parser.add_argument("--ledgers", type=int, default=300, help="ledgers per load")
    parser.add_argument("--concurrent", type=int, default=16, help="ledgers at a time")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-lifecycle-", dir=args.dir))
    try:
        fsyncs = raw_fdatasync(scratch, 2.0, grow=False)
        uri = init_cluster(scratch / "metadata")
        bookies = [BookieProcess(uri, scratch / f"bookie-{n}") for n in range(BOOKIES)]
        for bookie in bookies:
            bookie.start()
        try:
            one = asyncio.run(lifecycles(uri, args.ledgers, 1))
            many = asyncio.run(lifecycles(uri, args.ledgers, args.concurrent))
        finally:
            for bookie in bookies:
                bookie.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    fsync_p50 = statistics.median(fsyncs) * 1e3
    print(f"tally from {Path(sys.modules['tally'].__file__ or '').parent}")
    print(f"128-byte write + fdatasync in the scratch directory: p50 {fsync_p50:.2f} ms")
    print("| load | ledgers/s | create p50 / p99 ms | first add p50 / p99 | close p50 / p99 |")
    print("|---|---|---|---|---|")
    for name, figures in (("one at a time", one), (f"{args.concurrent} at a time", many)):
        print(
            f"| {name} | {figures['ledgers_per_s']:,.0f} | "
            + " | ".join(
                f"{figures[f'{step}_p50_ms']:.2f} / {figures[f'{step}_p99_ms']:.2f}"
                for step in ("create", "first add", "close")
            )
            + " |"
        )
    return {
        "fsync_p50_ms": fsync_p50,
        **{f"one_{key}": value for key, value in one.items()},
        **{f"many_{key}": value for key, value in many.items()},
    }


if __name__ == "__main__":
    main()
