"""Measure a side-by-side peer, etcd, beside tally with the same record size and the same
number of writes in flight, and the disk's raw fdatasync measured in the same run (issue 21).

etcd is a durable, replicated store that users pick for small records: each put goes
through Raft and is acknowledged once a majority has it in its write-ahead log, fdatasynced.
Three members of Debian's `etcd` (3.4) on loopback, each with its own data directory under
a scratch directory (by default in /tmp, the disk bench_client uses: the run prints the
devices) and fresh client and peer ports, all on etcd's defaults: the WAL fdatasynced once
per Raft batch (every entry of a batch, on each member, before it counts towards the
majority), the bbolt backend committed every 100 ms or 10,000 writes, heartbeat 100 ms,
election timeout 1 s, a snapshot every 100,000 entries, no auto-compaction.

The load generator is h2load (Debian's nghttp2-client: C, event-driven, threads of its
own), sending the gRPC call `etcdserverpb.KV/Put` (a `--size`-byte value under an 8-byte
key, the same key each time as etcd's own `benchmark put` does by default) to the leader
with `--concurrency` puts in flight (connections x streams) for `--seconds` after a tenth of
that as warm-up; its per-request log gives the latencies. etcd's revision must have moved by
at least the puts acknowledged (an error under HTTP 200 would not move it). That h2load is
not the bound is shown twice in each run: its own CPU (a small share of one core), and the
same load again from twice the threads and connections (the same puts in flight), which
must not go faster.

tally: bench_client's three bookie processes and windowed load, one ledger with E=3 WQ=3
AQ=2, the same size and in-flight count; the writer is a `tally.Client` in this process (the
client library is tally's replication: its CPU counts as tally's, like the members' as
etcd's). Then the p50 / p99 latency of both paced at about 1,000 writes/s: h2load's timing
script drifts late, so the run prints the rate it achieved and paces tally at that rate.
Last, with both clusters stopped, raw_replicated.py's bare Python replicated writes at the
same size and in-flight count: the floor of tally's design in Python on this machine, so
the run shows how far tally is from what Python allows, not only from etcd; and again with
the storage work that design adds to each write (`--storage`: digests, an entry log, an
index key).

    python bench/bench_etcd_peer.py [--dir D] [--seconds S] [--size B] [--concurrency N]

Needs `etcd` and `h2load` (scripts/ensure-etcd.sh). `main()` returns the figures as a dict.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.processes import free_port, stop_process  # noqa: E402

from bench_client import PASSWORD, Load, bookie_cluster, cpu_seconds, paced, windowed  # noqa: E402
from bench_journal import quantile, raw_fdatasync  # noqa: E402
from raw_replicated import replicated_floor  # noqa: E402
from tally.client.client import Client  # noqa: E402

KIB = 1 << 10
MEMBERS = 3
KEY = b"benchkey"
PACED_RATE = 1_000
PACED_CLIENTS = 4
HEALTH_TIMEOUT = 30.0
PUT = "/etcdserverpb.KV/Put"
GRPC = Path("/usr/lib/python3/dist-packages/grpc")
"""Debian's python3-grpcio, for --python-client only."""


# -- an etcd cluster on loopback ----------------------------------------------------------


@dataclass
class Member:
    name: str
    data_dir: Path
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, initial_cluster: str, token: str) -> None:
        self.data_dir.mkdir(parents=True)
        self.process = subprocess.Popen(
            [
                "etcd", "--name", self.name, "--data-dir", str(self.data_dir),
                "--listen-client-urls", self.client_url,
                "--advertise-client-urls", self.client_url,
                "--listen-peer-urls", self.peer_url,
                "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", initial_cluster,
                "--initial-cluster-state", "new", "--initial-cluster-token", token,
                "--logger", "zap", "--log-level", "warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log_path.open("ab"),
            start_new_session=True,
        )  # fmt: skip

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.name}.log"

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def call(self, path: str, body: dict[str, object] | None = None) -> dict[str, object]:
        """GET `path` of the member's HTTP API, or POST `body` to its gRPC-JSON gateway."""
        data = None if body is None else json.dumps(body).encode()
        with urllib.request.urlopen(self.client_url + path, data, timeout=5) as reply:
            answer: dict[str, object] = json.loads(reply.read())
            return answer

    def healthy(self) -> bool:
        try:
            return self.call("/health").get("health") == "true"
        except OSError:
            return False

    def status(self) -> dict[str, object]:
        return self.call("/v3/maintenance/status", {})


def revision(member: Member) -> int:
    header = member.status()["header"]
    assert isinstance(header, dict)
    return int(header["revision"])


@contextmanager
def etcd_cluster(scratch: Path) -> Iterator[list[Member]]:
    """MEMBERS etcd members on loopback, healthy (a leader elected, polled for); stopped
    on the way out."""
    members = [Member(f"m{i}", scratch / f"m{i}") for i in range(MEMBERS)]
    initial = ",".join(f"{member.name}={member.peer_url}" for member in members)
    try:
        for member in members:
            member.start(initial, f"bench-{os.getpid()}")
        deadline = time.monotonic() + HEALTH_TIMEOUT
        while not all(member.healthy() for member in members):
            for member in members:
                assert member.process is not None
                if member.process.poll() is not None:
                    raise RuntimeError(f"etcd {member.name} exited:\n{member.log()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd not healthy in {HEALTH_TIMEOUT:.0f} s")
            time.sleep(0.05)
        yield members
    finally:
        for member in members:
            if member.process is not None:
                stop_process(member.process, member.log)


def leader(members: Sequence[Member]) -> Member:
    for member in members:
        status = member.status()
        header = status["header"]
        assert isinstance(header, dict)
        if status["leader"] == header["member_id"]:
            return member
    raise RuntimeError("no member says it is the leader")


# -- the load: h2load speaking gRPC --------------------------------------------------------


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])


def put_request(size: int) -> bytes:
    """An `etcdserverpb.PutRequest` in protobuf: field 1 the key, field 2 the value."""
    value = os.urandom(size)
    return b"\x0a" + varint(len(KEY)) + KEY + b"\x12" + varint(len(value)) + value


def grpc_message(message: bytes) -> bytes:
    """`message` as gRPC sends it over HTTP/2: uncompressed, length-prefixed."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


@dataclass(frozen=True)
class Generated:
    """What one load from a generator (h2load, or the Python client) measured."""

    puts_per_s: float
    latencies: list[float]
    acknowledged: int
    generator_cpu: float
    """Seconds of the generator's CPU (user + system), warm-up included."""
    seconds: float
    """The generator's whole run, warm-up included: `generator_cpu / seconds` is its share
    of one core."""


def h2load(
    url: str,
    body: Path,
    scratch: Path,
    *,
    connections: int,
    streams: int,
    threads: int,
    seconds: float | None = None,
    script: Path | None = None,
) -> Generated:
    """Puts from h2load: `connections` x `streams` in flight for `seconds` after a tenth of
    that as warm-up, or at the times of a timing `script`, on each connection."""
    log = scratch / "h2load.log"
    command = [
        "h2load", "-c", str(connections), "-m", str(streams), "-t", str(threads),
        "-H", "content-type: application/grpc", "-H", "te: trailers",
        "-d", str(body), "--log-file", str(log),
    ]  # fmt: skip
    if script is not None:
        command += ["--timing-script-file", str(script)]
    else:
        assert seconds is not None
        command += ["-D", f"{seconds * 1e3:.0f}ms", "--warm-up-time", f"{seconds * 1e2:.0f}ms"]
        command.append(url)
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    counts = re.search(
        r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", result.stdout
    )
    if result.returncode != 0 or counts is None or counts[1] != counts[2]:
        raise RuntimeError(f"h2load failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    rows = [line.split("\t") for line in log.read_text().splitlines()]
    log.unlink()
    latencies = [int(row[2]) / 1e6 for row in rows]
    # h2load logs only what completed in the main duration; a timing script's is its span
    starts = sorted(int(row[0]) for row in rows)
    duration = seconds if seconds is not None else (starts[-1] - starts[0]) / 1e6
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return Generated(len(rows) / duration, latencies, len(rows), cpu, elapsed)


def timing_script(scratch: Path, url: str, rate: float, seconds: float) -> Path:
    """One connection's share of `rate` puts/s for `seconds` (PACED_CLIENTS connections each
    run the whole script)."""
    interval_ms = PACED_CLIENTS / rate * 1e3
    path = scratch / "timing-script.tsv"
    count = int(rate * seconds / PACED_CLIENTS)
    path.write_text("".join(f"{i * interval_ms:.3f}\t{url}\n" for i in range(count)))
    return path


@dataclass(frozen=True)
class EtcdLoad:
    generated: Generated
    member_cpu_per_put: float
    """Seconds of CPU of the three members together per put."""
    generator_cpu_per_put: float


def etcd_load(members: Sequence[Member], generate: Callable[[], Generated]) -> EtcdLoad:
    """A generator's puts with the members' CPU, and etcd's revision checked to have moved
    by at least the puts acknowledged."""
    pids = [member.process.pid for member in members if member.process is not None]
    first, cpu = revision(members[0]), cpu_seconds(pids)
    load = generate()
    cpu, revisions = cpu_seconds(pids) - cpu, revision(members[0]) - first
    if revisions < load.acknowledged:
        raise RuntimeError(f"{load.acknowledged} puts acknowledged, revision +{revisions}")
    return EtcdLoad(load, cpu / revisions, load.generator_cpu / revisions)


@dataclass(frozen=True)
class Turn:
    etcd: EtcdLoad
    wider: EtcdLoad
    """The same puts in flight from 2 threads and twice the connections."""
    tally: Load


async def measure(
    scratch: Path,
    members: Sequence[Member],
    metadata: str,
    bookies: Sequence[int],
    args: argparse.Namespace,
) -> tuple[list[Turn], Generated, list[float], EtcdLoad | None]:
    """Turns of etcd's load (from 1 thread, and wider), then tally's; both paced; with
    --python-client, etcd's load from a Python gRPC client."""
    body = scratch / "put-request"
    body.write_bytes(grpc_message(put_request(args.size)))
    url = leader(members).client_url + PUT
    connections = math.gcd(args.concurrency, 10)
    streams = args.concurrency // connections
    split = 2 if streams % 2 == 0 else 1  # the same in flight over more connections
    shapes = {
        "narrow": {"connections": connections, "streams": streams, "threads": 1},
        "wider": {
            "connections": connections * split,
            "streams": streams // split,
            "threads": min(2, connections * split),
        },
    }
    payload = os.urandom(args.size)
    async with Client(metadata) as client:
        writer = await client.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD
        )
        turns = []
        for turn in range(args.turns):
            etcd = {}
            for name in sorted(shapes, reverse=turn % 2 == 1):  # each first in turn
                h2load_puts = partial(h2load, url, body, scratch, seconds=args.seconds)
                etcd[name] = await asyncio.to_thread(
                    etcd_load, members, partial(h2load_puts, **shapes[name])
                )
            tally = await windowed(writer, payload, args.concurrency, args.seconds, bookies)
            turns.append(Turn(etcd["narrow"], etcd["wider"], tally))
        script = timing_script(scratch, url, PACED_RATE, args.seconds)
        etcd_paced = await asyncio.to_thread(
            h2load, url, body, scratch, connections=PACED_CLIENTS, streams=args.concurrency,
            threads=1, script=script,
        )  # fmt: skip
        tally_paced = await paced(writer, payload, etcd_paced.puts_per_s, args.seconds)
        await writer.close()
        python = None
        if args.python_client:
            load = partial(python_client_load, url, args.size, args.concurrency, args.seconds)
            python = await asyncio.to_thread(etcd_load, members, load)
    return turns, etcd_paced, tally_paced, python


def python_client_load(url: str, size: int, concurrency: int, seconds: float) -> Generated:
    """The same puts from Python: Debian's python3-grpcio (grpc.aio, one channel),
    `concurrency` coroutines each putting in a loop, for `seconds` after a tenth of that as
    warm-up. Run while tally's client is idle, so this process's CPU is the generator's."""
    sys.path.append(str(GRPC.parent))  # after the venv's: for grpc alone
    import grpc  # type: ignore[import-untyped]

    message, target = put_request(size), url.removeprefix("http://")
    latencies: list[float] = []
    clock = time.perf_counter

    async def run() -> tuple[int, float, float]:
        async with grpc.aio.insecure_channel(target) as channel:
            put = channel.unary_unary(PUT)  # bytes in, bytes out
            measuring, stop = clock() + seconds / 10, clock() + seconds * 1.1

            async def putter() -> None:
                while (started := clock()) < stop:
                    await put(message)
                    if started >= measuring:
                        latencies.append(clock() - started)

            cpu, started = time.process_time(), clock()
            await asyncio.gather(*(putter() for _ in range(concurrency)))
            return len(latencies), time.process_time() - cpu, clock() - started

    count, cpu, elapsed = asyncio.run(run())
    return Generated(count / seconds, latencies, count, cpu, elapsed)


# -- the run -------------------------------------------------------------------------------


def generator_figures(name: str, etcd: EtcdLoad) -> dict[str, float]:
    return {
        f"{name}_puts_per_s": etcd.generated.puts_per_s,
        f"{name}_p50_ms": quantile(etcd.generated.latencies, 0.5) * 1e3,
        f"{name}_p99_ms": quantile(etcd.generated.latencies, 0.99) * 1e3,
        f"{name}_members_cpu_us_per_put": etcd.member_cpu_per_put * 1e6,
        f"{name}_generator_cpu_us_per_put": etcd.generator_cpu_per_put * 1e6,
        f"{name}_generator_core_share": etcd.generated.generator_cpu / etcd.generated.seconds,
    }


def summarize(
    sync: Sequence[float],
    turns: Sequence[Turn],
    etcd_paced: Generated,
    tally_paced: list[float],
    python: EtcdLoad | None,
) -> dict[str, float]:
    figures = generator_figures("python_client", python) if python is not None else {}
    figures |= {
        "raw_fdatasync_per_s": len(sync) / sum(sync),
        "raw_fdatasync_p50_ms": quantile(sync, 0.5) * 1e3,
        "raw_fdatasync_p99_ms": quantile(sync, 0.99) * 1e3,
        "etcd_paced_puts_per_s": etcd_paced.puts_per_s,
        "etcd_paced_p50_ms": quantile(etcd_paced.latencies, 0.5) * 1e3,
        "etcd_paced_p99_ms": quantile(etcd_paced.latencies, 0.99) * 1e3,
        "tally_paced_p50_ms": quantile(tally_paced, 0.5) * 1e3,
        "tally_paced_p99_ms": quantile(tally_paced, 0.99) * 1e3,
    }
    for i, turn in enumerate(turns, 1):
        figures |= generator_figures(f"turn{i}_etcd", turn.etcd)
        figures |= generator_figures(f"turn{i}_etcd_wider", turn.wider)
        figures |= {
            f"turn{i}_tally_adds_per_s": turn.tally.adds_per_s,
            f"turn{i}_tally_p50_ms": quantile(turn.tally.latencies, 0.5) * 1e3,
            f"turn{i}_tally_p99_ms": quantile(turn.tally.latencies, 0.99) * 1e3,
            f"turn{i}_tally_client_cpu_us_per_add": turn.tally.client_cpu_per_add * 1e6,
            f"turn{i}_tally_bookie_cpu_us_per_add": turn.tally.bookie_cpu_per_add * 1e6,
        }
    return figures


def row(*cells: str) -> None:
    print(f"| {' | '.join(cells)} |")


def print_table(f: dict[str, float], turns: int, size: int, concurrency: int) -> None:
    sync_rate = f["raw_fdatasync_per_s"]
    print(
        f"\nraw 128 B write + fdatasync, scratch directory: {sync_rate:,.0f}/s, "
        f"p50 {f['raw_fdatasync_p50_ms']:.3f} ms, p99 {f['raw_fdatasync_p99_ms']:.3f} ms\n"
    )
    row(
        f"{size:,} B writes, {concurrency:,} in flight",
        "etcd, 3 members (Raft)",
        "tally, 3 bookies (E=3 WQ=3 AQ=2)",
        "tally / etcd",
    )
    print("|---|---|---|---|")
    for i in range(1, turns + 1):
        etcd, tally = f[f"turn{i}_etcd_puts_per_s"], f[f"turn{i}_tally_adds_per_s"]
        row(
            f"turn {i}: acknowledged/s",
            f"{etcd:,.0f} puts/s",
            f"{tally:,.0f} adds/s",
            f"**{tally / etcd:.2f}**",
        )
        etcd_p50, tally_p50 = f[f"turn{i}_etcd_p50_ms"], f[f"turn{i}_tally_p50_ms"]
        row(
            f"turn {i}: latency under that load, p50 / p99",
            f"{etcd_p50:.1f} / {f[f'turn{i}_etcd_p99_ms']:.1f} ms",
            f"{tally_p50:.1f} / {f[f'turn{i}_tally_p99_ms']:.1f} ms",
            f"{tally_p50 / etcd_p50:.2f} (p50)",
        )
        etcd_cpu = f[f"turn{i}_etcd_members_cpu_us_per_put"]
        client_cpu = f[f"turn{i}_tally_client_cpu_us_per_add"]
        tally_cpu = client_cpu + f[f"turn{i}_tally_bookie_cpu_us_per_add"]
        row(
            f"turn {i}: CPU per write (etcd: the members; tally: client + bookies)",
            f"{etcd_cpu:.0f} µs",
            f"{tally_cpu:.0f} µs (client {client_cpu:.0f} µs)",
            f"{tally_cpu / etcd_cpu:.2f}",
        )
        row(
            f"turn {i}: writes per raw fdatasync",
            f"{etcd / sync_rate:.2f}",
            f"{tally / sync_rate:.2f}",
            "",
        )
    for kind, what in (
        ("floor", "no protocol"),
        ("storage_floor", "with digests, an entry log and a RocksDB key per write"),
    ):
        floor = f[f"{kind}_writes_per_s"]
        client_cpu = f[f"{kind}_client_cpu_us_per_write"]
        floor_cpu = client_cpu + f[f"{kind}_bookies_cpu_us_per_write"]
        row(
            "reference, after the turns: bare Python replicated writes (raw_replicated.py: E3 "
            f"WQ3 AQ2, a client and 3 bookies, {what}); CPU per write",
            f"floor / etcd (last turn): {floor / f[f'turn{turns}_etcd_puts_per_s']:.2f}",
            f"{floor:,.0f}/s; {floor_cpu:.0f} µs (client {client_cpu:.0f} µs)",
            f"tally / floor (last turn): {f[f'turn{turns}_tally_adds_per_s'] / floor:.2f}",
        )
    row(
        f"paced at about {PACED_RATE:,}/s ({f['etcd_paced_puts_per_s']:,.0f}/s achieved by "
        "h2load, tally paced at that rate): p50 / p99",
        f"{f['etcd_paced_p50_ms']:.2f} / {f['etcd_paced_p99_ms']:.2f} ms",
        f"{f['tally_paced_p50_ms']:.2f} / {f['tally_paced_p99_ms']:.2f} ms",
        f"{f['tally_paced_p99_ms'] / f['etcd_paced_p99_ms']:.2f} (p99)",
    )
    print()
    row("the load generator, h2load", "1 thread (the figures above)", "2 threads, 2x connections",
        "2 threads / 1")  # fmt: skip
    print("|---|---|---|---|")
    for i in range(1, turns + 1):
        narrow, wider = f[f"turn{i}_etcd_puts_per_s"], f[f"turn{i}_etcd_wider_puts_per_s"]
        row(
            f"turn {i}: puts/s; h2load's CPU (share of one core, per put); the members' per put",
            *(
                f"{f[f'turn{i}_{name}_puts_per_s']:,.0f}; "
                f"{f[f'turn{i}_{name}_generator_core_share']:.0%}, "
                f"{f[f'turn{i}_{name}_generator_cpu_us_per_put']:.0f} µs; "
                f"{f[f'turn{i}_{name}_members_cpu_us_per_put']:.0f} µs"
                for name in ("etcd", "etcd_wider")
            ),
            f"{wider / narrow:.2f}",
        )
    if "python_client_puts_per_s" in f:
        python = f["python_client_puts_per_s"]
        row(
            "a Python gRPC client instead (grpc.aio, one channel), after the turns: puts/s; "
            "its CPU (share of one core, per put); the members' per put",
            f"{python:,.0f}; {f['python_client_generator_core_share']:.0%}, "
            f"{f['python_client_generator_cpu_us_per_put']:.0f} µs; "
            f"{f['python_client_members_cpu_us_per_put']:.0f} µs",
            f"p50 / p99 {f['python_client_p50_ms']:.1f} / {f['python_client_p99_ms']:.1f} ms",
            f"{python / f[f'turn{turns}_etcd_puts_per_s']:.2f} (of h2load's last turn)",
        )


def missing_tools() -> list[str]:
    return [tool for tool in ("etcd", "h2load") if shutil.which(tool) is None]


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (temp)")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each load")
    parser.add_argument("--turns", type=int, default=3, help="etcd and tally, alternating")
    parser.add_argument("--size", type=int, default=KIB, help="bytes per record")
    parser.add_argument("--concurrency", type=int, default=1_000, help="writes in flight")
    parser.add_argument(
        "--python-client",
        action="store_true",
        help="etcd's load once more from Python (needs Debian's python3-grpcio)",
    )
    args = parser.parse_args(argv)
    if min(args.turns, args.size, args.concurrency) < 1 or args.seconds <= 0:
        parser.error("--turns, --size, --concurrency and --seconds must be positive")
    missing = missing_tools()
    if missing:
        print(f"{' and '.join(missing)} not found: run scripts/ensure-etcd.sh", file=sys.stderr)
        raise SystemExit(2)
    if args.python_client and not GRPC.is_dir():
        print(f"--python-client: no {GRPC}: apt-get install python3-grpcio", file=sys.stderr)
        raise SystemExit(2)

    scratch = Path(tempfile.mkdtemp(prefix="bench-etcd-peer-", dir=args.dir))
    version = subprocess.run(["etcd", "--version"], capture_output=True, text=True, check=False)
    print(
        f"scratch {scratch} (device {os.stat(scratch).st_dev:#x}; repository device "
        f"{os.stat(REPO).st_dev:#x}), {os.cpu_count()} cores, {version.stdout.splitlines()[0]}"
    )
    try:
        sync = raw_fdatasync(scratch, min(args.seconds, 2.0), grow=False)
        with (
            etcd_cluster(scratch / "etcd") as members,
            bookie_cluster(scratch / "tally") as (metadata, bookies),
        ):
            turns, etcd_paced, tally_paced, python = asyncio.run(
                measure(scratch, members, metadata, bookies, args)
            )
        floor = replicated_floor(scratch, args.size, args.concurrency, args.seconds)
        storage_floor = replicated_floor(
            scratch, args.size, args.concurrency, args.seconds, storage=True
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    figures = summarize(sync, turns, etcd_paced, tally_paced, python)
    figures |= {f"floor_{name}": value for name, value in floor.items()}
    figures |= {f"storage_floor_{name}": value for name, value in storage_floor.items()}
    print_table(figures, args.turns, args.size, args.concurrency)
    return figures


if __name__ == "__main__":
    main()
