"""Measure the client end to end against real bookie processes, beside the physical limits
measured in the same run (issue 5).

Three `tally bookie` processes on loopback, their data directories under a scratch
directory (by default in /tmp, on the same disk as the repository: the run prints both
devices), a sqlite metadata store, and one `tally.Client` in this process. Figures:

- 1 KiB entries on a ledger with E=3 WQ=3 AQ=2, 1,000 appends kept in flight (a sliding
  window: one new `append_nowait` for each add acknowledged): acknowledged adds/s, payload
  MB/s, the p50 / p99 latency of those appends (issue to acknowledgement, under that load),
  and the CPU per add of this process and of the bookies together;
- the p50 / p99 latency of appends paced at a moderate 1,000 appends/s (no queueing),
  measured first, on a new ledger, while the bookies hold only what the paced loads
  wrote (after a load of 1,000 in flight their checkpoints of it would run meanwhile);
- the same for a ledger with E=WQ=AQ=1 (one of the three bookies);
- the E=3 load once more through a task of `await append` per add, as an application
  without `append_nowait` would keep adds in flight: what the coroutine costs;
- the time to open with recovery an open ledger of 10,000 entries whose writer (another
  process, 1,000 adds in flight, no explicit LAC) was SIGKILLed after its last
  acknowledgement. The bookies know only the LAC piggy-backed on the last entry, about
  1,000 short of the end, so recovery fences, reads those entries back, re-writes them and
  closes the ledger. Then the same when the last entry was appended alone (it carries LAC
  9,998): recovery's fixed cost.

Physical references from the same run: a 128-byte write + fdatasync loop and 64 KiB
appends with fdatasync every MiB in the scratch directory (bench/bench_journal.py), the
raw framed request/reply rate over loopback (100 B, 1,000 in flight) and the raw loopback
MB/s (64 KiB frames), both from bench/raw_socket.py.

    python bench/bench_client.py [--dir D] [--seconds S] [--profile]

`--profile` runs the E=3 load once more under cProfile (this process only: the bookies are
other processes) and prints the top costs per add. `main()` returns the figures as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.processes import BookieProcess, init_cluster  # noqa: E402

from bench_journal import quantile, raw_append, raw_fdatasync  # noqa: E402
from raw_socket import loopback_mb_per_s, request_reply_rate  # noqa: E402
from tally.client.client import Client  # noqa: E402
from tally.client.config import ClientConfig  # noqa: E402
from tally.client.reader import EntryFetcher  # noqa: E402
from tally.client.writer import LedgerWriter  # noqa: E402
from tally.core.digest import LedgerKeys  # noqa: E402
from tally.core.ids import LedgerId  # noqa: E402

KIB, MIB = 1 << 10, 1 << 20
ENTRY_SIZE = KIB
WINDOW = 1_000
PACED_RATE = 1_000
RECOVERY_ENTRIES = 10_000
PASSWORD = b"bench-client"
BOOKIES = 3


# -- the loads -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """Acknowledged adds/s (with a window in flight, or paced), the latencies of those
    adds, and the CPU each cost."""

    adds_per_s: float
    latencies: list[float]
    client_cpu_per_add: float
    """Seconds of this process's CPU per acknowledged add: the client's own cost."""
    bookie_cpu_per_add: float
    """Seconds of CPU of all the bookie processes together per acknowledged add."""

    @property
    def mb_per_s(self) -> float:
        return self.adds_per_s * ENTRY_SIZE / 1e6


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU of processes `pids` so far (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


async def windowed(
    writer: LedgerWriter,
    payload: bytes,
    window: int,
    seconds: float,
    bookies: Sequence[int],
    *,
    tasks: bool = False,
) -> Load:
    """Keep `window` appends in flight for `seconds` (after a tenth of that as warm-up) with
    `append_nowait`, or with `tasks` a task of `await append` each; `bookies` are the bookie
    processes' pids, whose CPU is counted too."""
    loop = asyncio.get_running_loop()
    clock = time.perf_counter
    latencies: list[float] = []
    record = latencies.append

    def acknowledged(issued: float, _: object) -> None:
        record(clock() - issued)

    def issue() -> asyncio.Future[int]:
        future = (
            loop.create_task(writer.append(payload)) if tasks else writer.append_nowait(payload)
        )
        future.add_done_callback(partial(acknowledged, clock()))
        return future

    in_flight = deque(issue() for _ in range(window))
    warm_up = clock() + seconds / 10
    while clock() < warm_up:
        await in_flight.popleft()
        in_flight.append(issue())
    latencies.clear()
    acknowledged_count, started = 0, clock()
    cpu, bookie_cpu = time.process_time(), cpu_seconds(bookies)
    deadline = started + seconds
    while True:
        await in_flight.popleft()
        in_flight.append(issue())
        acknowledged_count += 1
        if not acknowledged_count % 100 and clock() >= deadline:
            break
    elapsed, cpu = clock() - started, time.process_time() - cpu
    bookie_cpu = cpu_seconds(bookies) - bookie_cpu
    measured = latencies[:acknowledged_count]
    for future in in_flight:
        await future
    return Load(
        acknowledged_count / elapsed,
        measured,
        cpu / acknowledged_count,
        bookie_cpu / acknowledged_count,
    )


async def paced(writer: LedgerWriter, payload: bytes, rate: float, seconds: float) -> list[float]:
    """Latencies of appends issued at a steady `rate`, each timed until acknowledged."""
    loop = asyncio.get_running_loop()
    count = int(rate * seconds)
    latencies: list[float] = []
    finished = loop.create_future()

    def issue() -> None:
        issued = time.perf_counter()

        def acknowledged(_: object) -> None:
            latencies.append(time.perf_counter() - issued)
            if len(latencies) == count:
                finished.set_result(None)

        writer.append_nowait(payload).add_done_callback(acknowledged)

    first = loop.time() + 0.05
    for i in range(count):
        loop.call_at(first + i / rate, issue)
    await finished
    return latencies


async def measure_paced(
    client: Client, quorums: tuple[int, int, int], seconds: float, bookies: Sequence[int]
) -> Load:
    """Appends paced at PACED_RATE on a new ledger of these quorums: their latencies, and
    the CPU each costs at that rate (far more than under a window: each add wakes every
    process and thread on its way by itself)."""
    ensemble, write, ack = quorums
    writer = await client.create_ledger(
        ensemble_size=ensemble, write_quorum=write, ack_quorum=ack, password=PASSWORD
    )
    started, cpu, bookie_cpu = time.perf_counter(), time.process_time(), cpu_seconds(bookies)
    latencies = await paced(writer, os.urandom(ENTRY_SIZE), PACED_RATE, seconds)
    cpu, bookie_cpu = time.process_time() - cpu, cpu_seconds(bookies) - bookie_cpu
    elapsed = time.perf_counter() - started
    await writer.close()
    count = len(latencies)
    return Load(count / elapsed, latencies, cpu / count, bookie_cpu / count)


async def measure_load(
    client: Client, quorums: tuple[int, int, int], seconds: float, bookies: Sequence[int]
) -> Load:
    """The windowed load on a new ledger of these quorums."""
    ensemble, write, ack = quorums
    writer = await client.create_ledger(
        ensemble_size=ensemble, write_quorum=write, ack_quorum=ack, password=PASSWORD
    )
    load = await windowed(writer, os.urandom(ENTRY_SIZE), WINDOW, seconds, bookies)
    await writer.close()
    return load


async def measure_tasks(client: Client, seconds: float, bookies: Sequence[int]) -> Load:
    """The E=3 windowed load again, through a task of `await append` per add."""
    writer = await client.create_ledger(
        ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
    )
    load = await windowed(writer, os.urandom(ENTRY_SIZE), WINDOW, seconds, bookies, tasks=True)
    await writer.close()
    return load


async def profile_load(
    client: Client, seconds: float, bookies: Sequence[int]
) -> tuple[pstats.Stats, int]:
    """The E=3 windowed load under cProfile; the stats and the adds they cover."""
    payload = os.urandom(ENTRY_SIZE)
    writer = await client.create_ledger(
        ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
    )
    profiler = cProfile.Profile()
    profiler.enable()
    await windowed(writer, payload, WINDOW, seconds, bookies)
    profiler.disable()
    await writer.close()
    return pstats.Stats(profiler, stream=io.StringIO()), writer.last_add_confirmed + 1


# -- recovery ------------------------------------------------------------------------------


async def write_abandoned(metadata: str, quiet_tail: bool) -> None:
    """Child process: write RECOVERY_ENTRIES with WINDOW in flight, report the ledger, and
    wait to be SIGKILLed. With `quiet_tail`, the last entry is appended alone once all the
    others are confirmed, so it carries the LAC just below it. No explicit LAC is sent: the
    bookies know only the LACs piggy-backed on the entries."""
    async with Client(metadata, config=ClientConfig(explicit_lac_interval=0)) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        payload = os.urandom(ENTRY_SIZE)
        in_flight: deque[asyncio.Future[int]] = deque()
        for _ in range(RECOVERY_ENTRIES - 1 if quiet_tail else RECOVERY_ENTRIES):
            if len(in_flight) >= WINDOW:
                await in_flight.popleft()
            in_flight.append(writer.append_nowait(payload))
        for future in in_flight:
            await future
        if quiet_tail:
            await writer.append(payload)
        print(writer.ledger_id.qualified_name, writer.last_add_confirmed, flush=True)
        await asyncio.sleep(3600)


def abandoned_ledger(metadata: str, quiet_tail: bool) -> LedgerId:
    """An OPEN ledger of RECOVERY_ENTRIES confirmed entries whose writer was SIGKILLed."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--write-abandoned", metadata]
        + (["--quiet-tail"] if quiet_tail else []),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline().split()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    if len(line) != 2 or int(line[1]) != RECOVERY_ENTRIES - 1:
        raise RuntimeError(f"the abandoned writer reported {line}")
    return LedgerId.parse(line[0])


@dataclass(frozen=True)
class Recovery:
    seconds: float
    client_cpu: float
    start_lac: int
    """The LAC piggy-backed on the last entry, where recovery starts reading: the entries
    after it were read back and re-written."""
    last_entry_id: int

    @property
    def recovered(self) -> int:
        return self.last_entry_id - self.start_lac


async def time_recovery(client: Client, ledger_id: LedgerId) -> Recovery:
    started, cpu = time.perf_counter(), time.process_time()
    reader = await client.open_ledger(ledger_id, password=PASSWORD, recovery=True)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    if not reader.is_closed or reader.last_entry_id != RECOVERY_ENTRIES - 1:
        raise RuntimeError(f"ledger {ledger_id} is not closed at its last entry after recovery")
    fetcher = EntryFetcher(client.context, ledger_id, LedgerKeys.of_password(PASSWORD))
    last = await fetcher.read_from(
        reader.metadata, reader.metadata.ensemble_at(reader.last_entry_id)[0], -1
    )
    return Recovery(seconds, cpu, last.entry.last_add_confirmed, reader.last_entry_id)


# -- the run -------------------------------------------------------------------------------


@contextmanager
def bookie_cluster(scratch: Path) -> Iterator[tuple[str, list[int]]]:
    """BOOKIES bookie processes on loopback on a new sqlite cluster under `scratch`: its
    metadata URI and the bookies' pids; the bookies are stopped on the way out."""
    metadata = init_cluster(scratch)
    bookies: list[BookieProcess] = []
    try:
        for i in range(BOOKIES):
            bookies.append(BookieProcess(metadata, scratch / f"bookie-{i}").start())
        yield metadata, [bookie.process.pid for bookie in bookies if bookie.process is not None]
    finally:
        for bookie in bookies:
            bookie.stop()


def summarize(
    sync: Sequence[float],
    disk_mb: float,
    raw_rate: float,
    raw_mb: float,
    loads: dict[str, tuple[Load, Load]],
    through_tasks: Load,
    recoveries: Sequence[Recovery],
) -> dict[str, float]:
    figures: dict[str, float] = {
        "raw_fdatasync_per_s": len(sync) / sum(sync),
        "raw_fdatasync_p50_ms": quantile(sync, 0.5) * 1e3,
        "raw_fdatasync_p99_ms": quantile(sync, 0.99) * 1e3,
        "raw_disk_append_mb_per_s": disk_mb,
        "raw_request_reply_per_s": raw_rate,
        "raw_loopback_mb_per_s": raw_mb,
    }
    for name, (load, paced_load) in loads.items():
        figures |= {
            f"{name}_adds_per_s": load.adds_per_s,
            f"{name}_mb_per_s": load.mb_per_s,
            f"{name}_client_cpu_us_per_add": load.client_cpu_per_add * 1e6,
            f"{name}_bookie_cpu_us_per_add": load.bookie_cpu_per_add * 1e6,
            f"{name}_loaded_p50_ms": quantile(load.latencies, 0.5) * 1e3,
            f"{name}_loaded_p99_ms": quantile(load.latencies, 0.99) * 1e3,
            f"{name}_paced_p50_ms": quantile(paced_load.latencies, 0.5) * 1e3,
            f"{name}_paced_p99_ms": quantile(paced_load.latencies, 0.99) * 1e3,
            f"{name}_paced_client_cpu_us_per_add": paced_load.client_cpu_per_add * 1e6,
            f"{name}_paced_bookie_cpu_us_per_add": paced_load.bookie_cpu_per_add * 1e6,
        }
    figures |= {
        "e3_tasks_adds_per_s": through_tasks.adds_per_s,
        "e3_tasks_client_cpu_us_per_add": through_tasks.client_cpu_per_add * 1e6,
    }
    for name, recovery in zip(("recovery", "recovery_quiet_tail"), recoveries, strict=True):
        # The fewest requests it takes: a fencing read to each bookie; a read to each of the
        # WQ bookies of every entry from the LAC to the first missing one; a RECOVERY_ADD to
        # each of the WQ bookies of every entry past the LAC.
        requests = BOOKIES + 3 * (recovery.recovered + 2) + 3 * recovery.recovered
        figures |= {
            f"{name}_ms": recovery.seconds * 1e3,
            f"{name}_client_cpu_ms": recovery.client_cpu * 1e3,
            f"{name}_entries_rewritten": recovery.recovered,
            f"{name}_start_lac": recovery.start_lac,
            f"{name}_requests": requests,
            f"{name}_raw_floor_ms": requests / raw_rate * 1e3,
        }
    return figures


def row(figure: str, value: str, reference: str, ratio: str) -> None:
    print(f"| {figure} | {value} | {reference} | {ratio} |")


def print_table(f: dict[str, float]) -> None:
    sync_rate, disk_mb = f["raw_fdatasync_per_s"], f["raw_disk_append_mb_per_s"]
    raw_rate, raw_mb = f["raw_request_reply_per_s"], f["raw_loopback_mb_per_s"]
    budget = 2 * f["raw_fdatasync_p99_ms"] + 1
    print()
    row("figure", "value", "physical reference (same run)", "ratio")
    print("|---|---|---|---|")
    row(
        "raw 128 B write + fdatasync, scratch directory",
        f"{sync_rate:,.0f}/s",
        f"p50 {f['raw_fdatasync_p50_ms']:.3f} ms, p99 {f['raw_fdatasync_p99_ms']:.3f} ms",
        "",
    )
    row(
        "raw 64 KiB appends, fdatasync every MiB, scratch directory",
        f"{disk_mb:,.0f} MB/s",
        "",
        "",
    )
    row(
        "raw request/reply over loopback, 100 B, 1,000 in flight",
        f"{raw_rate:,.0f}/s",
        f"raw loopback {raw_mb:,.0f} MB/s (64 KiB frames, 64 in flight)",
        "",
    )
    for name, title, copies in (("e3", "E=3 WQ=3 AQ=2", 3), ("e1", "E=WQ=AQ=1", 1)):
        adds = f[f"{name}_adds_per_s"]
        row(
            f"{title}: 1 KiB appends, {WINDOW:,} in flight",
            f"{adds:,.0f} adds/s (CPU per add: client {f[f'{name}_client_cpu_us_per_add']:.0f}"
            f" us, bookies {f[f'{name}_bookie_cpu_us_per_add']:.0f} us)",
            f"{raw_rate:,.0f} raw requests/s; {sync_rate:,.0f} raw fdatasyncs/s",
            f"{adds * copies / raw_rate:.3f} ({copies} request{'s' * (copies > 1)} per add); "
            f"{adds / sync_rate:.1f} adds per raw fdatasync",
        )
        mb = f[f"{name}_mb_per_s"]
        row(
            f"{title}: payload MB/s, same load",
            f"{mb:,.1f} MB/s",
            f"raw disk appends {disk_mb:,.0f} MB/s; raw loopback {raw_mb:,.0f} MB/s",
            f"{mb * copies / disk_mb:.3f} of the disk, {mb * copies / raw_mb:.3f} of loopback "
            f"(counting {copies} cop{'ies' if copies > 1 else 'y'})",
        )
        little = WINDOW / adds * 1e3
        row(
            f"{title}: latency under that load, p50 / p99",
            f"{f[f'{name}_loaded_p50_ms']:.1f} / {f[f'{name}_loaded_p99_ms']:.1f} ms",
            f"window / rate (Little's law): {little:.1f} ms",
            f"{f[f'{name}_loaded_p50_ms'] / little:.2f} (p50)",
        )
        row(
            f"{title}: latency paced at {PACED_RATE:,} appends/s, p50 / p99",
            f"{f[f'{name}_paced_p50_ms']:.2f} / {f[f'{name}_paced_p99_ms']:.2f} ms (CPU per add:"
            f" client {f[f'{name}_paced_client_cpu_us_per_add']:.0f} us,"
            f" bookies {f[f'{name}_paced_bookie_cpu_us_per_add']:.0f} us)",
            f"2 x p99 fdatasync + 1 ms: {budget:.2f} ms",
            f"{f[f'{name}_paced_p99_ms'] / budget:.2f} (p99)",
        )
    tasks = f["e3_tasks_adds_per_s"]
    row(
        f"E=3 WQ=3 AQ=2: the same {WINDOW:,} in flight through a task of `await append` each",
        f"{tasks:,.0f} adds/s (client CPU {f['e3_tasks_client_cpu_us_per_add']:.0f} us per add)",
        "`append_nowait`, above",
        f"{f['e3_tasks_client_cpu_us_per_add'] / f['e3_client_cpu_us_per_add']:.2f} "
        "(client CPU per add)",
    )
    for name, title in (
        ("recovery", f"open with recovery, {RECOVERY_ENTRIES:,} entries, writer SIGKILLed"),
        ("recovery_quiet_tail", "the same, the last entry appended alone (carries LAC 9,998)"),
    ):
        row(
            title,
            f"{f[f'{name}_ms']:,.0f} ms (client CPU {f[f'{name}_client_cpu_ms']:,.0f} ms); "
            f"the {f[f'{name}_entries_rewritten']:,.0f} after LAC "
            f"{f[f'{name}_start_lac']:,.0f} read and re-written",
            f"{f[f'{name}_requests']:,.0f} requests at the raw rate: "
            f"{f[f'{name}_raw_floor_ms']:,.2f} ms",
            f"{f[f'{name}_ms'] / f[f'{name}_raw_floor_ms']:,.0f}",
        )


def print_profile(stats: pstats.Stats, adds: int, top: int = 20) -> None:
    """Own time per module, then the functions with the most own time, as shares of the
    profiled total (cProfile inflates every call alike, so shares carry over; absolute
    microseconds do not) and as calls per acknowledged add."""
    table = stats.stats  # type: ignore[attr-defined]
    total = sum(own for (_, _, own, _, _) in table.values())
    modules: dict[str, float] = {}
    for (path, _, _), (_, _, own, _, _) in table.items():
        module = Path(path).name if path != "~" else "builtins"
        modules[module] = modules.get(module, 0.0) + own
    print(f"\nclient-side profile, E=3 WQ=3 AQ=2, {adds:,} adds (this process only)")
    print("| module | share of own time |")
    print("|---|---|")
    for module, own in sorted(modules.items(), key=lambda item: item[1], reverse=True)[:10]:
        print(f"| {module} | {own / total:.1%} |")
    print("\n| own time | incl. callees | calls per add | function |")
    print("|---|---|---|---|")
    entries = sorted(table.items(), key=lambda item: item[1][2], reverse=True)
    for (path, line, name), (_, calls, own, cumulative, _) in entries[:top]:
        where = f"{Path(path).name}:{line}" if line else "builtin"
        print(
            f"| {own / total:.1%} | {cumulative / total:.1%} | {calls / adds:.2f} "
            f"| {name} ({where}) |"
        )


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each load")
    parser.add_argument("--profile", action="store_true", help="profile the client's adds")
    parser.add_argument("--write-abandoned", metavar="METADATA", help=argparse.SUPPRESS)
    parser.add_argument("--quiet-tail", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write_abandoned:
        asyncio.run(write_abandoned(args.write_abandoned, args.quiet_tail))
        return {}

    scratch = Path(tempfile.mkdtemp(prefix="bench-client-", dir=args.dir))
    print(
        f"scratch {scratch} (device {os.stat(scratch).st_dev:#x}; repository device "
        f"{os.stat(REPO).st_dev:#x}), python {sys.version.split()[0]}, {os.cpu_count()} cores"
    )
    try:
        sync = raw_fdatasync(scratch, min(args.seconds, 2.0), grow=False)
        raw_rate = request_reply_rate(args.seconds * 0.75)
        raw_mb = loopback_mb_per_s(args.seconds * 0.5)
        disk_mb = raw_append(scratch, 64 * MIB)

        async def run(
            metadata: str, pids: list[int]
        ) -> tuple[
            dict[str, tuple[Load, Load]],
            Load,
            list[Recovery],
            tuple[pstats.Stats, int] | None,
        ]:
            async with Client(metadata) as client:
                # The paced loads first: after a load of 1,000 in flight, the bookies'
                # checkpoints of its entries would run during them, and the faster that
                # load, the more there is to checkpoint.
                quorums = {"e3": (3, 3, 2), "e1": (1, 1, 1)}
                paced_loads = {
                    name: await measure_paced(client, sizes, args.seconds, pids)
                    for name, sizes in quorums.items()
                }
                loads = {
                    name: (await measure_load(client, sizes, args.seconds, pids), paced_loads[name])
                    for name, sizes in quorums.items()
                }
                through_tasks = await measure_tasks(client, args.seconds, pids)
                recoveries = [
                    await time_recovery(client, abandoned_ledger(metadata, quiet_tail))
                    for quiet_tail in (False, True)
                ]
                profile = await profile_load(client, args.seconds, pids) if args.profile else None
            return loads, through_tasks, recoveries, profile

        with bookie_cluster(scratch) as (metadata, pids):
            loads, through_tasks, recoveries, profile = asyncio.run(run(metadata, pids))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    figures = summarize(sync, disk_mb, raw_rate, raw_mb, loads, through_tasks, recoveries)
    print_table(figures)
    if profile is not None:
        print_profile(*profile)
    return figures


if __name__ == "__main__":
    main()
