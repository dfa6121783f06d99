"""`tally demo`: a whole local cluster at work, end to end, in about a minute.

It runs what a newcomer would type, for real: `tally local up` (bookie processes and the
auto-recovery process on a sqlite metadata store), ledgers written through `tally.Client`,
a bookie SIGKILLed in the middle of the writes (the writers change their ensembles and go
on), one writer abandoned and its ledger recovered by a second client (which fences the
first), the auditor marking the lost bookie's ledgers and the replication worker copying
them back to full replication, a replicas check finding nothing missing, every entry read
back and compared byte for byte, an audit of the whole cluster on Spark (`tally audit
snapshot` and `tally audit run`, with its HTML report), bytes flipped on a bookie's disk
found by a scrub (`tally shell scrub --now`) and repaired from another replica by the
replication worker, most ledgers deleted through the
delete path and their disk space given back by the bookies' garbage collection (`tally
shell deleteledger`, `tally shell triggergc`), and `tally local stop`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from tally.audit.jvm import SHORT_JOB_JVM
from tally.autorecovery.config import AutoRecoveryConfig
from tally.autorecovery.replicas_check import replicas_check
from tally.client.client import Client
from tally.client.config import ClientConfig
from tally.client.writer import LedgerWriter
from tally.config import load
from tally.core.digest import mac_key
from tally.core.entry_format import decode_entry
from tally.core.errors import LedgerFenced, TallyError
from tally.core.ids import LedgerId
from tally.local.state import DataDir, LocalState
from tally.local.status import WRITABLE, read_status
from tally.metadata.ledger_manager import LedgerRecord

LEDGERS = 4
BOOKIES = 4
RACKS = 2
QUORUMS = (3, 3, 2)
"""E, WQ, AQ of the demo's ledgers: on two racks every write set of WQ=3 holds both, before
and after a bookie is lost (an E=3 WQ=2 ring cannot: the client would refuse it)."""
ENTRIES = 1500
PASSWORD = b"demo"
WINDOW = 200
START_TIMEOUT = 90.0
REREPLICATION_TIMEOUT = 90.0
"""Seconds for auto-recovery to repair every ledger: the lost bookie's session must lapse
(10 s by default) before the auditor sees it gone."""


DEMO_BOOKIE_SETTINGS = {
    "TALLY_BOOKIE_ENTRY_LOG_SIZE_LIMIT": str(256 << 10),
    "TALLY_BOOKIE_FLUSH_INTERVAL": "1",
}
"""Entry logs of 256 KiB (1 GiB by default) and a checkpoint every second (a minute), so
that a minute's data spans several entry logs and the space of deleted ledgers can come
back before the demo ends."""
KEPT_LEDGERS = 1
"""Ledgers the demo does not delete at its end."""
ROTTEN_ENTRIES = 5
"""Entries whose bytes the demo flips on one bookie's disk."""


def payload(ledger: LedgerId, entry_id: int) -> bytes:
    """Deterministic bytes per entry, so the read-back can check every byte."""
    seed = hashlib.sha256(f"{ledger.qualified_name}/{entry_id}".encode()).digest()
    return seed * (1 + entry_id % 8)


def run(data_dir: Path | None = None) -> None:
    """Start a local cluster, write, kill a bookie, recover, verify every byte, stop."""
    console = Console()
    started = time.monotonic()
    root = data_dir or Path(tempfile.mkdtemp(prefix="tally-demo-"))
    console.rule("[bold cyan]tally demo[/]: a local cluster, a lost bookie, a recovered ledger")
    supervisor = _local_up(console, root)
    try:
        state = DataDir.at(root).require()
        ok = asyncio.run(_exercise(console, state, root))
        ok = _audit(console, state, root) and ok
        ok = asyncio.run(_rot_and_repair(console, state)) and ok
        ok = _delete_and_reclaim(console, state) and ok
    finally:
        _local_stop(console, root, supervisor)
    elapsed = time.monotonic() - started
    verdict = (
        "[bold green]every acknowledged entry was read back intact[/]"
        if ok
        else ("[bold red]VERIFICATION FAILED[/]")
    )
    console.rule(f"{verdict} — {elapsed:.0f} s")
    if not ok:
        raise SystemExit(1)


def _local_up(console: Console, root: Path) -> subprocess.Popen[bytes]:
    console.print(f"\n$ tally local up --bookies {BOOKIES} --racks {RACKS} --data-dir {root}")
    log = (root / "local-up.log").open("ab") if root.exists() else None
    if log is None:
        root.mkdir(parents=True)
        log = (root / "local-up.log").open("ab")
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "tally.cli.main", "local", "up", "--bookies", str(BOOKIES),
         "--racks", str(RACKS), "--data-dir", str(root)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, **DEMO_BOOKIE_SETTINGS},
    )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if supervisor.poll() is not None:
            raise SystemExit(f"tally local up exited with {supervisor.returncode}; see {log.name}")
        if DataDir.at(root).read() is not None:
            status = read_status(DataDir.at(root))
            if status.bookies and all(b.registered == WRITABLE for b in status.bookies):
                table = Table("bookie", "rack", "pid", "registered")
                for bookie in status.bookies:
                    table.add_row(
                        bookie.slot.bookie_id,
                        bookie.slot.rack,
                        str(bookie.run.pid if bookie.run else "-"),
                        bookie.registered or "-",
                    )
                console.print(f"metadata store: {status.metadata}")
                console.print(table)
                return supervisor
        time.sleep(0.2)
    supervisor.send_signal(signal.SIGTERM)
    raise SystemExit(f"the local cluster did not come up in {START_TIMEOUT:.0f}s; see {log.name}")


def _audit(console: Console, state: LocalState, root: Path) -> bool:
    """The cluster's audit on Spark, as an operator runs it: a snapshot, then the checks."""
    console.print("\n[bold]Audit[/]: the whole cluster's durability, checked on Spark")
    snapshot, report = root / "audit" / "snapshot", root / "audit" / "report"
    for args in (
        ("audit", "snapshot", "--metadata", state.metadata, "--out", str(snapshot)),
        ("audit", "run", "--snapshot", str(snapshot), "--out", str(report), "--master", "local[2]"),
    ):
        result = _tally(console, *args)
        console.print(result.stdout.rstrip(), markup=False, highlight=False)
        if result.returncode != 0:
            console.print(f"[bold red]tally {args[1]} failed[/]: {result.stderr.strip()[-2000:]}")
            return False
    summary = json.loads((report / "summary.json").read_text())
    clean = all(count == 0 for count in summary["categories"].values())
    console.print(
        "audit verdict: " + ("[green]no violation[/]" if clean else "[red]violations found[/]")
    )
    return bool(clean)


def _tally(console: Console, *args: str, show: bool = True) -> subprocess.CompletedProcess[str]:
    if show:
        console.print(f"$ tally {' '.join(args)}")
    return subprocess.run(
        [sys.executable, "-m", "tally.cli.main", *args],
        capture_output=True, text=True, check=False, timeout=300,
        env={**SHORT_JOB_JVM, **os.environ},  # the demo's audit is a short job
    )  # fmt: skip


def _entry_log_bytes(state: LocalState) -> dict[str, int]:
    """Each bookie's entry logs' bytes on disk (its journal's preallocated files and its
    index are about constant)."""
    return {
        slot.bookie_id: sum(
            path.stat().st_blocks * 512
            for path in (slot.data_dir / "ledgers" / "logs").glob("*.log")
        )
        for slot in state.bookies
    }


def _delete_and_reclaim(console: Console, state: LocalState) -> bool:
    """Delete all but one ledger through the delete path; the bookies give the space back."""
    console.print("\n[bold]Deleting[/]: ledgers deleted, their disk space given back")
    metadata = ("--metadata", state.metadata)
    listed = _tally(console, "shell", "listledgers", "--json", *metadata, show=False)
    ledgers = [view["ledger_id"] for view in json.loads(listed.stdout or "[]")]
    doomed = ledgers[KEPT_LEDGERS:]
    # A throwaway cluster: no undelete window, so the tombstones are written at once.
    steps: list[tuple[str, ...]] = [
        ("cluster", "settings", *metadata, "--set", "ledger_delete_retention=0")
    ]
    steps += [("shell", "deleteledger", ledger, "--reason", "demo", *metadata) for ledger in doomed]
    before = _entry_log_bytes(state)
    for args in steps:
        result = _tally(console, *args)
        console.print(result.stdout.rstrip(), markup=False, highlight=False)
        if result.returncode != 0:
            console.print(f"[bold red]failed[/]: {result.stderr.strip()}")
            return False
    result = _tally(console, "shell", "triggergc", *metadata)
    console.print(result.stdout.rstrip(), markup=False, highlight=False)
    if result.returncode != 0:
        console.print(f"[bold red]triggergc failed[/]: {result.stderr.strip()}")
        return False
    after = _entry_log_bytes(state)
    listed = _tally(console, "shell", "listbookies", "--json", *metadata, show=False)
    running = {view["bookie_id"] for view in json.loads(listed.stdout or "[]")}
    table = Table(
        "bookie",
        "entry logs before",
        "after",
        title=f"{len(doomed)} of {len(ledgers)} ledgers deleted",
    )
    for bookie, size in before.items():
        note = "" if bookie in running else " (down: its GC runs when it is back)"
        table.add_row(bookie, f"{size / 2**10:,.0f} KiB", f"{after[bookie] / 2**10:,.0f} KiB{note}")
    console.print(table)
    held = [bookie for bookie, size in before.items() if size and bookie in running]
    return bool(held) and all(after[bookie] < before[bookie] for bookie in held)


async def _rot_and_repair(console: Console, state: LocalState) -> bool:
    """Bit rot on one bookie: bytes flipped in its entry logs, found by a scrub, filed by
    the bookie for repair, and written over by the replication worker."""
    console.print("\n[bold]Bit rot[/]: bytes flipped on a bookie's disk, found and repaired")
    async with Client(state.metadata, config=load(ClientConfig, "client")) as client:
        running = set((await client.context.registry.available_bookies()).writable)
        record = min(
            [r async for page in client.context.ledgers.ledger_pages() for r in page.ledgers],
            key=lambda found: found.ledger_id,
        )
        # Early entries: long checkpointed into entry logs no longer written.
        bookie_id = next(b for b in record.metadata.segments[0].ensemble if b in running)
        slot = next(s for s in state.bookies if s.bookie_id == bookie_id)
        rotten = [
            entry_id
            for entry_id in range(ROTTEN_ENTRIES * 3)
            if bookie_id in record.metadata.write_set_bookies(entry_id)
        ][:ROTTEN_ENTRIES]
        flipped = [e for e in rotten if _flip_payload(slot.data_dir, payload(record.ledger_id, e))]
        console.print(
            f"  flipped a byte of {len(flipped)} entries of ledger {record.ledger_id} in "
            f"{bookie_id}'s entry logs, under the running bookie"
        )
        result = _tally(console, "shell", "scrub", "--bookie", bookie_id, "--now",
                        "--metadata", state.metadata)  # fmt: skip
        console.print(result.stdout.rstrip(), markup=False, highlight=False)
        if result.returncode != 0 or not flipped:
            console.print(f"[bold red]scrub failed[/]: {result.stderr.strip()}")
            return False
        started = time.monotonic()
        connection = await client.context.bookies.get(bookie_id)
        key = mac_key(PASSWORD)
        with _progress(console) as progress:
            task = progress.add_task("rotten copies written over", total=len(flipped))
            while True:
                good = 0
                for entry_id in flipped:
                    try:
                        raw = await connection.read(record.ledger_id, entry_id)
                        entry = decode_entry(raw, record.metadata.digest_type, key)
                    except TallyError:
                        continue
                    good += entry.payload == payload(record.ledger_id, entry_id)
                progress.update(task, completed=good)
                if good == len(flipped):
                    break
                if time.monotonic() - started > REREPLICATION_TIMEOUT:
                    console.print(f"[bold red]not repaired within {REREPLICATION_TIMEOUT:.0f} s[/]")
                    return False
                await asyncio.sleep(0.5)
    console.print(
        f"  {bookie_id} serves every one of them intact again, {time.monotonic() - started:.1f} s "
        "after the scrub: the bookie filed them, the worker copied them from another replica"
    )
    return True


def _flip_payload(data_dir: Path, data: bytes) -> bool:
    """Flip a byte of `data` wherever a bookie's entry logs hold it (a copy re-added holds
    it twice); whether it was found."""
    found = False
    for path in sorted((data_dir / "ledgers" / "logs").glob("*.log")):
        content = path.read_bytes()
        offset = content.find(data)
        while offset >= 0:
            with path.open("r+b") as file:
                file.seek(offset + len(data) // 2)
                file.write(bytes([content[offset + len(data) // 2] ^ 0x08]))
            found = True
            offset = content.find(data, offset + 1)
    return found


def _local_stop(console: Console, root: Path, supervisor: subprocess.Popen[bytes]) -> None:
    console.print(f"\n$ tally local stop --data-dir {root}")
    result = subprocess.run(
        [sys.executable, "-m", "tally.cli.main", "local", "stop", "--data-dir", str(root)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    console.print(result.stdout.strip() or result.stderr.strip())
    try:
        supervisor.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(supervisor.pid, signal.SIGKILL)


async def _exercise(console: Console, state: LocalState, root: Path) -> bool:
    async with Client(state.metadata, config=load(ClientConfig, "client")) as client:
        writers = [
            await client.create_ledger(
                ensemble_size=QUORUMS[0],
                write_quorum=QUORUMS[1],
                ack_quorum=QUORUMS[2],
                password=PASSWORD,
            )
            for _ in range(LEDGERS)
        ]
        victim = writers[0].metadata.metadata.segments[0].ensemble[1]
        acked: dict[LedgerId, int] = {w.ledger_id: -1 for w in writers}
        with _progress(console) as progress:
            tasks = {
                w.ledger_id: progress.add_task(f"ledger {w.ledger_id}", total=ENTRIES)
                for w in writers
            }
            half = ENTRIES // 2
            await asyncio.gather(*(_write(w, 0, half, progress, tasks, acked) for w in writers))
            progress.console.print(
                f"[bold red]SIGKILL bookie {victim}[/] (in ledger {writers[0].ledger_id}'s "
                "ensemble) while the writers go on"
            )
            killed_ms = int(time.time() * 1000)
            _kill_bookie(state, victim)
            await asyncio.gather(
                *(_write(w, half, ENTRIES, progress, tasks, acked) for w in writers)
            )
        _show_ensembles(console, writers, victim)
        for writer in writers[1:]:
            await writer.close()
        abandoned = writers[0]
        console.print(
            f"\nThe writer of ledger {abandoned.ledger_id} is abandoned without closing "
            f"(LAC {abandoned.last_add_confirmed}); a second client recovers it:"
        )
        async with Client(state.metadata, config=client.config) as second:
            reader = await second.open_ledger(abandoned.ledger_id, password=PASSWORD, recovery=True)
            console.print(
                f"  recovered and closed at entry {reader.last_entry_id} "
                f"(every acknowledged entry is at or below it: "
                f"{reader.last_entry_id >= acked[abandoned.ledger_id]})"
            )
            try:
                await abandoned.append(b"too late")
                console.print("  [red]the old writer could still write![/]")
                fenced = False
            except LedgerFenced as error:
                console.print(f"  the old writer's next append: [yellow]LedgerFenced[/] ({error})")
                fenced = True
            repaired = await _watch_rereplication(console, second, writers, victim, killed_ms)
            return fenced and repaired and await _verify(console, second, writers, acked)


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


async def _write(
    writer: LedgerWriter,
    first: int,
    stop: int,
    progress: Progress,
    tasks: dict[LedgerId, TaskID],
    acked: dict[LedgerId, int],
) -> None:
    """Append entries first..stop-1, up to WINDOW in flight."""
    in_flight: set[asyncio.Future[int]] = set()
    for entry_id in range(first, stop):
        in_flight.add(writer.append_nowait(payload(writer.ledger_id, entry_id)))
        if len(in_flight) >= WINDOW:
            done, in_flight = await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            _count(writer, done, progress, tasks, acked)
    if in_flight:
        done, _ = await asyncio.wait(in_flight)
        _count(writer, done, progress, tasks, acked)


def _count(
    writer: LedgerWriter,
    done: set[asyncio.Future[int]],
    progress: Progress,
    tasks: dict[LedgerId, TaskID],
    acked: dict[LedgerId, int],
) -> None:
    for future in done:
        acked[writer.ledger_id] = max(acked[writer.ledger_id], future.result())
    progress.advance(tasks[writer.ledger_id], len(done))


def _kill_bookie(state: LocalState, bookie_id: str) -> None:
    for slot in state.bookies:
        record = state.running(slot.name)
        if slot.bookie_id == bookie_id and record is not None:
            os.killpg(record.pid, signal.SIGKILL)
            return
    raise TallyError(f"bookie {bookie_id} is not a running bookie of the local cluster")


def _show_ensembles(
    console: Console,
    writers: list[LedgerWriter],
    victim: str,
    title: str = "Ensemble changes",
    records: list[LedgerRecord] | None = None,
) -> None:
    table = Table("ledger", "segment from entry", "ensemble", title=title)
    for record in records or [writer.metadata for writer in writers]:
        for segment in record.metadata.segments:
            members = [f"[red strike]{b}[/]" if b == victim else b for b in segment.ensemble]
            table.add_row(str(record.ledger_id), f"{segment.first_entry_id:,}", "  ".join(members))
    console.print(table)


async def _watch_rereplication(
    console: Console, client: Client, writers: list[LedgerWriter], victim: str, killed_ms: int
) -> bool:
    """Follow auto-recovery until no ledger names the lost bookie and none is marked; then
    run a replicas check, which must find every entry on all its WQ bookies. A repair can
    take less than a look's interval, so the marks are also known by the last-marked
    watch the replication workers wake on, not only by being listed."""
    context = client.context
    marked_since_kill = asyncio.Event()

    def last_marked(marked_ms: int | None) -> None:
        if marked_ms is not None and marked_ms >= killed_ms:
            marked_since_kill.set()

    watch = await context.under_replication.watch_marks(last_marked)
    try:
        return await _follow_rereplication(console, client, writers, victim, marked_since_kill)
    finally:
        watch.cancel()


async def _follow_rereplication(
    console: Console,
    client: Client,
    writers: list[LedgerWriter],
    victim: str,
    marked_since_kill: asyncio.Event,
) -> bool:
    context = client.context
    ledgers = [writer.ledger_id for writer in writers]
    console.print(
        f"\n[bold]Auto-recovery[/]: once {victim}'s session lapses, the auditor marks its "
        "ledgers under-replicated and the replication worker copies their entries elsewhere"
    )

    async def read_all() -> list[LedgerRecord]:
        return list(
            await asyncio.gather(*(context.ledgers.read_ledger_metadata(x) for x in ledgers))
        )

    damaged = [r.ledger_id for r in await read_all() if victim in r.metadata.bookies()]
    seen_marks = False
    deadline = time.monotonic() + REREPLICATION_TIMEOUT
    with _progress(console) as progress:
        task = progress.add_task("ledgers back to full replication", total=len(damaged))
        while True:
            found = await read_all()
            left = [r for r in found if victim in r.metadata.bookies()]
            marks = [m async for m in context.under_replication.list_under_replicated()]
            if marks and not seen_marks:
                seen_marks = True
                names = ", ".join(str(m.ledger_id) for m in marks)
                progress.console.print(
                    f"  the auditor marked ledger(s) {names} under-replicated "
                    f"(missing: {', '.join(sorted({b for m in marks for b in m.missing_bookies}))})"
                )
            progress.update(task, completed=len(damaged) - len(left))
            if not left and not marks:
                if not seen_marks and marked_since_kill.is_set():
                    progress.console.print(
                        f"  the auditor marked ledger(s) under-replicated (missing: {victim}), "
                        "and the worker repaired them between two looks"
                    )
                break
            if time.monotonic() > deadline:
                console.print(f"[bold red]not repaired within {REREPLICATION_TIMEOUT:.0f} s[/]")
                return False
            await asyncio.sleep(0.5)
    _show_ensembles(console, writers, victim, "After re-replication", found)
    report = await replicas_check(context, AutoRecoveryConfig(metadata=client.metadata_uri))
    table = Table("finding", "ledgers", title=f"Replicas check of {report.ledgers_checked} ledgers")
    for name, count in report.counts.items():
        table.add_row(name, f"[green]{count}[/]" if count == 0 else f"[red]{count}[/]")
    console.print(table)
    return all(count == 0 for count in report.counts.values())


async def _verify(
    console: Console,
    client: Client,
    writers: list[LedgerWriter],
    acked: dict[LedgerId, int],
) -> bool:
    table = Table("ledger", "last entry", "entries read", "bytes", "verified", title="Read back")
    ok = True
    for writer in writers:
        reader = await client.open_ledger(writer.ledger_id, password=PASSWORD, recovery=False)
        count = size = bad = 0
        async for entry in reader.read(0, reader.last_entry_id):
            count += 1
            size += len(entry.data)
            bad += entry.data != payload(writer.ledger_id, entry.entry_id)
        intact = bad == 0 and reader.last_entry_id >= acked[writer.ledger_id]
        ok &= intact
        table.add_row(
            str(writer.ledger_id),
            str(reader.last_entry_id),
            f"{count:,}",
            f"{size:,}",
            "[green]every byte[/]" if intact else f"[red]{bad} bad[/]",
        )
    console.print(table)
    return ok
