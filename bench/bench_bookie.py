"""Measure one bookie process end to end, beside the physical limits measured in the same run.

The bookie runs as a real process (`tally bookie`, its data in the scratch directory: /tmp
unless --dir says otherwise; the run prints its device beside the repository's); this
process is the load generator, with `BookieConnection`, on the same 2-core machine.
Figures (issue 4):

- 64 KiB entries, pipelined: sustained MB/s, against the raw rate of appending 64 KiB
  blocks with fdatasync every 1 MiB to the same disk, the better of that rate measured
  before and after the 64 KiB loads (goal >= 50 %);
- 100-byte entries, pipelined: acknowledged adds/s (goal >= 30,000), beside the machine's
  raw framed request/reply rate over loopback and the client's own ceiling;
- p99 add latency at a paced 1,000 adds/s, against 2 x the disk's p99 fdatasync latency
  + 1 ms, that p99 measured just before (goal: at most that);
- restart time with a 1 GiB journal to replay: checkpoints are held off while ~1 GiB of
  64 KiB entries is written (the bookie's write cache then holds it all in memory), the
  bookie is SIGKILLed and, once its metadata session has expired, restarted with a cold
  page cache and the default settings; timed until it prints "ready", with the replay
  apart, and the checkpoint of the replayed entries that the bookie then runs while it
  serves timed too.

Each throughput figure runs on a fresh bookie with the default settings, so the sustained
figures include the checkpoints that the default write cache (64 MiB) triggers;
diagnostics run beside them: 64 KiB copied into entry logs (LARGE_RUNS) and with
checkpoints held off, and 100 B with WIDE_WINDOW in flight. Each also gives the bookie
process's CPU time per add (all its threads), which other work on a shared machine does
not inflate the way it slows the rates; the CPU pressure printed with the table says how
shared the machine was. Entries are encoded before the timed window (so the client's CPU
is the connection's, as in bench/raw_socket.py): the load generator shares the two cores
with the bookie.

    python bench/bench_bookie.py [--dir D] [--quick] [--profile]

`--quick` shortens every run and restarts with a 256 MiB journal (extrapolated to 1 GiB).
`--profile` runs the loads once more against a bookie under cProfile (started by this
file's own `--serve-profiled` mode; the event loop's thread only) and prints where its time
goes. `main()` returns the figures as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import os
import pstats
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

from bench_journal import drop_cache, quantile, raw_append, raw_direct_writers, raw_fdatasync
from raw_socket import add_nowait_rate, request_reply_rate
from tally.bookie.journal_files import journal_files
from tally.client.bookie_connection import BookieConnection
from tally.core.digest import DigestType, master_key
from tally.core.entry_format import encode_entry
from tally.core.ids import LedgerId
from tally.metadata.cluster import init_cluster
from tally.metadata.stores import open_store

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
SMALL, LARGE = 100, 64 * KIB
SMALL_WINDOW, LARGE_WINDOW = 1_000, 64
WIDE_WINDOW = 4_000
"""A second run of the 100-byte load with more in flight: with 1,000 the whole window fits
in one read of the bookie's socket and one group commit, so client and bookie take turns;
with more, one works on a window while the other answers the previous one."""
PACED_RATE = 1_000
KEY = master_key(b"bench-bookie")
SESSION_TIMEOUT = 2.0
"""The restarted bookie's metadata session timeout: a restarted bookie waits for its dead
predecessor's session to expire before registering, and the restart figure is the bookie's
own work. The other bookies keep the default (10 s): a shorter one renews its lease, an
fsync'ed sqlite write, more often, on the journal's disk."""
NO_CHECKPOINTS = {
    "TALLY_BOOKIE_FLUSH_INTERVAL": str(24 * 3600),
    "TALLY_BOOKIE_WRITE_CACHE_MAX_BYTES": str(64 * GIB),
}
LARGE_RUNS: dict[str, dict[str, str] | None] = {
    "bookie_64k": None,
    "bookie_64k_copied": {"TALLY_BOOKIE_KEEP_LARGE_ENTRIES_IN_JOURNAL": "false"},
    "bookie_64k_no_checkpoints": NO_CHECKPOINTS,
}
"""The 64 KiB loads: the default bookie (large entries stay in the journal, which shares
the disk), and two diagnostics: entries copied into entry logs at each checkpoint (written
twice, as BookKeeper does), and checkpoints held off."""
_REPLAYED = re.compile(rb"replayed (\d+) journal records in ([0-9.]+)s")


# -- the bookie process ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class BookieServer:
    """A bookie process on a fixed port and directory, restartable, with its metrics port."""

    metadata: str
    data_dir: Path
    settings: dict[str, str] = field(default_factory=dict)
    profile: Path | None = None
    """Run under cProfile (this file's --serve-profiled mode), dumping stats here at stop."""
    program: tuple[str, ...] = ("tally.cli.main", "bookie")
    """The module run with `python -m` (unprofiled), and its arguments before the options."""
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "bookie.log"

    def start(self) -> float:
        """Start the bookie; returns the seconds until it printed that it is ready."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        arguments = [
            "--metadata", self.metadata,
            "--data-dir", str(self.data_dir),
            "--listen", self.address,
            "--metrics-port", str(self.metrics_port),
        ]  # fmt: skip
        if self.profile is None:
            command = [sys.executable, "-m", *self.program, *arguments]
        else:
            command = [sys.executable, __file__, "--serve-profiled", str(self.profile), *arguments]
        environment = {**os.environ, **self.settings}
        started = time.perf_counter()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command, env=environment, stdout=subprocess.PIPE, stderr=log
            )
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if b" ready on " in line:
                return time.perf_counter() - started
        self.process.wait()
        raise RuntimeError(f"the bookie exited with {self.process.returncode}:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def replay_seconds(self) -> tuple[int, float]:
        """(records, seconds) of the last start's journal replay, from its log."""
        found = _REPLAYED.findall(self.log_path.read_bytes())
        records, seconds = found[-1]
        return int(records), float(seconds)

    def metrics(self) -> dict[str, float]:
        """The bookie's unlabelled Prometheus samples."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        samples = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if line and not line.startswith("#") and "{" not in name:
                samples[name] = float(value)
        return samples

    def cpu_seconds(self) -> float:
        """CPU time the bookie process has used, all its threads."""
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def running(server: BookieServer) -> Iterator[BookieServer]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


def serve_profiled(profile: Path, arguments: Sequence[str]) -> None:
    """Child process: `tally bookie ARGUMENTS` under cProfile until SIGTERM."""
    from tally.cli.main import app

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        app(["bookie", *arguments], standalone_mode=False)
    finally:
        profiler.disable()
        profiler.dump_stats(profile)


def init_metadata(scratch: Path) -> str:
    uri = f"sqlite:///{scratch / 'meta.db'}"

    async def init() -> None:
        store = open_store(uri)
        await store.start()
        try:
            await init_cluster(store)
        finally:
            await store.close()

    asyncio.run(init())
    return uri


# -- the load ----------------------------------------------------------------------------


def entries(ledger_id: LedgerId, size: int) -> Iterator[bytes]:
    """The entries of a ledger from entry 0 on, each with its own id, LAC and length."""
    payload = os.urandom(size)
    entry_id = 0
    while True:
        yield encode_entry(
            ledger_id, entry_id, entry_id - 1, (entry_id + 1) * size, payload, DigestType.CRC32C
        )
        entry_id += 1


def encoded(ledger_id: LedgerId, size: int, count: int) -> Iterator[bytes]:
    """The entries `pipelined` sends for `count` adds (its warm-up's too), encoded now."""
    return iter(list(islice(entries(ledger_id, size), count + count // 10)))


async def pipelined(address: str, load: Iterator[bytes], window: int, count: int) -> float:
    """Seconds to have `count` adds acknowledged, `window` in flight, after a warm-up of a
    tenth as many."""
    connection = await BookieConnection.connect(address, request_timeout=120)
    add = connection.add_nowait
    try:
        in_flight = deque(add(next(load), KEY) for _ in range(window))
        for _ in range(count // 10):
            await in_flight.popleft()
            in_flight.append(add(next(load), KEY))
        started = time.perf_counter()
        for _ in range(count - window):
            await in_flight.popleft()
            in_flight.append(add(next(load), KEY))
        for future in in_flight:
            await future
        return time.perf_counter() - started
    finally:
        await connection.close()


async def paced(address: str, rate: float, seconds: float) -> list[float]:
    """Latencies of 100-byte adds issued at a steady `rate`, each timed until acknowledged."""
    connection = await BookieConnection.connect(address)
    loop = asyncio.get_running_loop()
    load = entries(LedgerId(0, 3), SMALL)
    count = int(rate * seconds)
    latencies: list[float] = []
    finished = loop.create_future()

    def issue() -> None:
        issued = time.perf_counter()

        def acknowledged(future: asyncio.Future[None]) -> None:
            future.result()
            latencies.append(time.perf_counter() - issued)
            if len(latencies) == count:
                finished.set_result(None)

        connection.add_nowait(next(load), KEY).add_done_callback(acknowledged)

    try:
        await pipelined(address, entries(LedgerId(0, 4), SMALL), 1, 100)  # warm-up
        first = loop.time() + 0.05
        for i in range(count):
            loop.call_at(first + i / rate, issue)
        await finished
    finally:
        await connection.close()
    return latencies


async def fill(address: str, total: int) -> int:
    """Write about `total` bytes of 64 KiB entries (warm-up included); returns how many."""
    count = total // LARGE * 10 // 11
    await pipelined(address, entries(LedgerId(0, 5), LARGE), LARGE_WINDOW, count)
    return count + count // 10


# -- the run -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    large_count: int
    small_count: int
    paced_seconds: float
    reference_seconds: float
    restart_bytes: int
    direct_bytes: int


FULL = Sizes(8192, 200_000, 5.0, 3.0, GIB, 256 * MIB)
QUICK = Sizes(2048, 60_000, 2.0, 1.5, 256 * MIB, 64 * MIB)


@dataclass(frozen=True)
class Run:
    """One pipelined load: its timed window, and the bookie's side of the whole run."""

    seconds: float
    adds: int
    """Every add acknowledged, the warm-up's included."""
    bookie_cpu: float
    samples: dict[str, float]

    @property
    def bookie_cpu_us_per_add(self) -> float:
        return self.bookie_cpu / self.adds * 1e6

    @property
    def entries_per_fdatasync(self) -> float:
        batches = max(1.0, self.samples["bookie_journal_batches_total"])
        return self.samples["bookie_journal_records_total"] / batches


def run_pipelined(server: BookieServer, load: Iterator[bytes], window: int, count: int) -> Run:
    before = server.cpu_seconds()
    seconds = asyncio.run(pipelined(server.address, load, window, count))
    cpu = server.cpu_seconds() - before
    return Run(seconds, count + count // 10, cpu, server.metrics())


def measure(metadata: str, scratch: Path, sizes: Sizes, profile: Path | None) -> dict[str, float]:
    """The load figures, each on a fresh bookie (profiled into `profile`.* if given)."""
    figures: dict[str, float] = {}

    def bookie(name: str, settings: dict[str, str] | None = None) -> BookieServer:
        if profile is None:
            return BookieServer(metadata, scratch / name, settings or {})
        return BookieServer(
            metadata,
            scratch / f"profiled-{name}",
            settings or {},
            profile=profile.with_suffix(f".{name}"),
        )

    # Each disk reference next to its figure: on a shared machine the disk's rate and tail
    # change by the minute. The raw append rate swung six-fold between runs minutes apart,
    # so it is measured before and after the 64 KiB loads, and the better of the two is
    # the limit the bookie is held to.
    before = raw_append(scratch, 256 * MIB)
    for key, settings in LARGE_RUNS.items():
        with running(bookie(key, settings)) as server:
            load = encoded(LedgerId(0, 1), LARGE, sizes.large_count)
            run = run_pipelined(server, load, LARGE_WINDOW, sizes.large_count)
        figures[f"{key}_mb_per_s"] = sizes.large_count * LARGE / run.seconds / 1e6
        figures[f"{key}_entries_per_fdatasync"] = run.entries_per_fdatasync
        figures[f"{key}_cpu_us_per_add"] = run.bookie_cpu_us_per_add
        figures[f"{key}_checkpoints"] = run.samples["bookie_checkpoints_total"]
    after = raw_append(scratch, 256 * MIB)
    figures["raw_append_64k_before_mb_per_s"] = before
    figures["raw_append_64k_after_mb_per_s"] = after
    figures["raw_append_64k_mb_per_s"] = max(before, after)
    # What the disk gives journal and entry logs written at once, beside one writer alone:
    # the ceiling of a bookie that writes every byte twice is half the larger.
    for writers in (1, 2):
        figures[f"disk_direct_{writers}_writers_mb_per_s"] = raw_direct_writers(
            scratch, writers, sizes.direct_bytes
        )

    for window in (SMALL_WINDOW, WIDE_WINDOW):
        with running(bookie(f"small-{window}")) as server:
            load = encoded(LedgerId(0, 2), SMALL, sizes.small_count)
            run = run_pipelined(server, load, window, sizes.small_count)
        key = "bookie_100b" if window == SMALL_WINDOW else f"bookie_100b_{window}_in_flight"
        figures[f"{key}_adds_per_s"] = sizes.small_count / run.seconds
        figures[f"{key}_entries_per_fdatasync"] = run.entries_per_fdatasync
        figures[f"{key}_cpu_us_per_add"] = run.bookie_cpu_us_per_add

    sync = raw_fdatasync(scratch, sizes.reference_seconds, grow=False)
    figures["raw_fdatasync_p99_ms"] = quantile(sync, 0.99) * 1e3
    with running(bookie("paced")) as server:
        latencies = asyncio.run(paced(server.address, PACED_RATE, sizes.paced_seconds))
        samples = server.metrics()
    figures["paced_p50_ms"] = quantile(latencies, 0.5) * 1e3
    figures["paced_p99_ms"] = quantile(latencies, 0.99) * 1e3
    figures["paced_journal_fdatasync_p99_ms"] = samples["bookie_journal_sync_seconds_p99"] * 1e3
    return figures


def measure_restart(metadata: str, scratch: Path, total: int) -> dict[str, float]:
    """Fill a journal with checkpoints held off, SIGKILL, restart cold; time it."""
    restart_settings = {"TALLY_BOOKIE_SESSION_TIMEOUT": str(SESSION_TIMEOUT)}
    server = BookieServer(metadata, scratch / "restart", {**NO_CHECKPOINTS, **restart_settings})
    server.start()
    try:
        written = asyncio.run(fill(server.address, total))
        server.kill()
        journal = [path for _, path in journal_files(server.data_dir / "journal")]
        journal_bytes = sum(path.stat().st_size for path in journal)
        drop_cache(journal)
        time.sleep(SESSION_TIMEOUT * 1.5)  # the dead bookie's session expires meanwhile
        server.settings = restart_settings
        ready = server.start()
        records, replay = server.replay_seconds()
        checkpoint = first_checkpoint_seconds(server)
    finally:
        server.stop()
    if records < written:
        raise RuntimeError(f"replayed {records} records, but {written} entries were written")
    scale = GIB / (written * LARGE)
    return {
        "restart_journal_mib": journal_bytes / MIB,
        "restart_entries": written,
        "restart_ready_s": ready,
        "restart_replay_s": replay,
        "restart_checkpoint_s": checkpoint,
        # Start-up (interpreter, store, registration) does not grow with the journal.
        "restart_ready_1gib_s": ready - replay + replay * scale,
    }


def first_checkpoint_seconds(server: BookieServer, timeout: float = 600) -> float:
    """How long the bookie's first checkpoint took, once it has finished."""
    deadline = time.monotonic() + timeout
    while True:
        samples = server.metrics()
        if samples["bookie_checkpoints_total"] >= 1:
            return samples["bookie_checkpoint_last_seconds"]
        if time.monotonic() > deadline:
            raise RuntimeError(f"no checkpoint within {timeout} s of the restart")
        time.sleep(0.1)


def cpu_pressure() -> float:
    """Percent of the last 60 s in which some runnable task waited for a CPU (PSI), or -1:
    other work on the machine shows here, and every figure but the disk's suffers from it."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return -1.0
    return float(line.split()[2].partition("=")[2])


def print_profiles(profile: Path) -> None:
    for path in sorted(profile.parent.glob(profile.name + ".*")):
        stream = io.StringIO()
        stats = pstats.Stats(str(path), stream=stream)
        stats.sort_stats("tottime").print_stats(25)
        print(f"\n--- bookie profile, {path.suffix[1:]} load (by own time) ---")
        print(stream.getvalue().split("\n", 6)[-1])


def row(figure: str, measured: str, reference: str, ratio: str, goal: str, met: str) -> None:
    print(f"| {figure} | {measured} | {reference} | {ratio} | {goal} | {met} |")


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    parser.add_argument("--quick", action="store_true", help="smaller runs, 256 MiB restart")
    parser.add_argument("--profile", action="store_true", help="also profile the bookie")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    scratch = Path(tempfile.mkdtemp(prefix="bench-bookie-", dir=args.dir))
    repository = Path(__file__).resolve().parent.parent
    print(
        f"scratch {scratch} (device {os.stat(scratch).st_dev:#x}; the repository's is "
        f"{os.stat(repository).st_dev:#x}), python {sys.version.split()[0]}, "
        f"{os.cpu_count()} cores"
    )
    figures = {"cpu_pressure_before_pct": cpu_pressure()}
    try:
        figures["raw_request_reply_per_s"] = request_reply_rate(sizes.reference_seconds)
        figures["client_add_nowait_per_s"] = add_nowait_rate(sizes.reference_seconds)
        metadata = init_metadata(scratch)
        figures.update(measure(metadata, scratch, sizes, None))
        figures.update(measure_restart(metadata, scratch, sizes.restart_bytes))
        figures["cpu_pressure_after_pct"] = cpu_pressure()
        if args.profile:
            profiled = measure(metadata, scratch, sizes, scratch / "profile")
            figures.update({f"profiled_{name}": value for name, value in profiled.items()})
            print_profiles(scratch / "profile")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(figures)
    return figures


def print_table(figures: dict[str, float]) -> None:
    budget = 2 * figures["raw_fdatasync_p99_ms"] + 1
    raw_append_rate = figures["raw_append_64k_mb_per_s"]
    large_ratio = figures["bookie_64k_mb_per_s"] / raw_append_rate
    p99 = figures["paced_p99_ms"]
    print(
        f"\nCPU pressure (PSI some, avg60): {figures['cpu_pressure_before_pct']:.0f}% before, "
        f"{figures['cpu_pressure_after_pct']:.0f}% after the loads (0: the machine was ours)"
    )
    print("| figure | measured | physical reference (same run) | ratio | goal | met? |")
    print("|---|---|---|---|---|---|")
    for key, what in (
        ("bookie_64k", f"64 KiB entries, pipelined ({LARGE_WINDOW} in flight)"),
        ("bookie_64k_copied", "the same, every entry copied into entry logs (diagnostic)"),
        ("bookie_64k_no_checkpoints", "the same, kept, with checkpoints held off (diagnostic)"),
    ):
        ratio = figures[f"{key}_mb_per_s"] / raw_append_rate
        row(
            what,
            f"{figures[f'{key}_mb_per_s']:,.0f} MB/s "
            f"({figures[f'{key}_entries_per_fdatasync']:.1f} entries per fdatasync, "
            f"{figures[f'{key}_checkpoints']:.0f} checkpoints, bookie CPU "
            f"{figures[f'{key}_cpu_us_per_add']:.0f} us per add)",
            f"raw 64 KiB appends, fdatasync every 1 MiB: {raw_append_rate:,.0f} MB/s (the "
            f"better of {figures['raw_append_64k_before_mb_per_s']:,.0f} before and "
            f"{figures['raw_append_64k_after_mb_per_s']:,.0f} after)",
            f"{ratio:.2f}",
            ">= 0.50" if key == "bookie_64k" else "",
            ("yes" if large_ratio >= 0.5 else "NO") if key == "bookie_64k" else "",
        )
    row(
        "the disk: O_DIRECT writes of 1 MiB, each followed by fdatasync (reference)",
        f"one writer {figures['disk_direct_1_writers_mb_per_s']:,.0f} MB/s, two at once "
        f"{figures['disk_direct_2_writers_mb_per_s']:,.0f} MB/s in all",
        "writing every byte twice caps a bookie at half the larger",
        "",
        "",
        "",
    )
    for key, window in (
        ("bookie_100b", SMALL_WINDOW),
        (f"bookie_100b_{WIDE_WINDOW}_in_flight", WIDE_WINDOW),
    ):
        adds = figures[f"{key}_adds_per_s"]
        cpu = figures[f"{key}_cpu_us_per_add"]
        headline = window == SMALL_WINDOW
        row(
            f"100 B entries, pipelined ({window:,} in flight)"
            + ("" if headline else " (diagnostic)"),
            f"{adds:,.0f} adds/s ({figures[f'{key}_entries_per_fdatasync']:.0f} entries per "
            f"fdatasync; bookie CPU {cpu:.1f} us per add: {1e6 / cpu:,.0f} adds per CPU-second)",
            f"raw framed request/reply: {figures['raw_request_reply_per_s']:,.0f}/s; the client "
            f"alone (fake bookie): {figures['client_add_nowait_per_s']:,.0f}/s",
            f"{adds / figures['raw_request_reply_per_s']:.3f} of raw",
            ">= 30,000/s" if headline else "",
            ("yes" if adds >= 30_000 else "NO") if headline else "",
        )
    row(
        f"p99 add latency at {PACED_RATE:,} adds/s",
        f"{p99:.3f} ms (p50 {figures['paced_p50_ms']:.3f}; the bookie's journal fdatasync "
        f"p99 {figures['paced_journal_fdatasync_p99_ms']:.3f})",
        f"2 x p99 fdatasync + 1 ms = {budget:.3f} ms",
        f"{p99 / budget:.2f}",
        "<= 1",
        "yes" if p99 <= budget else "NO",
    )
    mib = figures["restart_journal_mib"]
    row(
        f"restart with a {mib:,.0f} MiB journal ({figures['restart_entries']:,.0f} entries "
        "of 64 KiB), cold page cache",
        f"ready in {figures['restart_ready_s']:.2f} s, of which replay "
        f"{figures['restart_replay_s']:.2f} s; then, while serving, the checkpoint of the "
        f"replayed entries {figures['restart_checkpoint_s']:.2f} s",
        "",
        "",
        "reported",
        f"1 GiB: ~{figures['restart_ready_1gib_s']:.1f} s (extrapolated)"
        if abs(mib - 1024) > 64
        else "",
    )
    if "profiled_bookie_64k_mb_per_s" in figures:
        print(
            f"\nunder cProfile: 64 KiB {figures['profiled_bookie_64k_mb_per_s']:,.0f} MB/s, "
            f"100 B {figures['profiled_bookie_100b_adds_per_s']:,.0f} adds/s, "
            f"paced p99 {figures['profiled_paced_p99_ms']:.3f} ms"
        )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-profiled":
        serve_profiled(Path(sys.argv[2]), sys.argv[3:])
    else:
        main()
