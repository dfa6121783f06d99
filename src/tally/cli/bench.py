"""`tally bench`: run the benchmarks of bench/ one after another.

Each benchmark prints its own table, every figure beside the physical limit measured in
the same run (raw fdatasync, raw socket, raw numpy pass, ...); `docs/benchmarks.md` keeps
the latest figures with the command that made them. The benchmarks live in the source
checkout, beside `src/`, not in the installed package.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

BENCH_DIR = Path(__file__).resolve().parents[3] / "bench"

DESCRIPTIONS = {
    "availability": "BP-34 availability encoding and the O(groups) durability check",
    "protocol": "wire codec: encode + decode of ADD frames",
    "journal": "journal group commit, fdatasync latency, replay",
    "index_engines": "rocksdict vs lmdb vs plyvel for the entry index (needs them installed)",
    "metadata": "ledger metadata create/read/CAS on sqlite and ZooKeeper; 1M-ledger iteration",
    "bookie": "one bookie: 64 KiB MB/s, 100 B adds/s, p99 at 1,000/s, restart time",
    "gc": "garbage collection: compaction MB/s, space back after deletes, adds meanwhile",
    "client": "three bookies and a client: adds/s, MB/s, latency, open-with-recovery",
    "raw_socket": "the machine's raw framed request/reply rate and loopback MB/s",
    "raw_copy": "the disk copying to itself, and a bare Python copy of 64 KiB entries",
    "raw_replicated": "bare Python replicated writes (E3 WQ3 AQ2): the floor of the design",
    "replicas_check": "the online replicas check: ledgers/s over 10,000 closed ledgers",
    "rereplication": "re-replication MB/s after losing a bookie (--mib 1024 for 1 GiB)",
    "reads": "catch-up reads, and a writer beside a slow disk's reads, by read_threads",
    "audit": "the Spark audit pipeline on synthetic snapshots: ledgers/s, cost per ledger",
    "etcd_peer": "etcd, 3 members on loopback, beside tally: writes/s, p50/p99 (needs etcd)",
}
DEFAULT = ["availability", "protocol", "journal", "bookie", "client"]


def bench_scripts() -> dict[str, Path]:
    """Each script of bench/ by the name `tally bench` lists it under: its file's name
    without the `bench_` prefix, if it has one (raw_socket.py is `raw_socket`)."""
    return {path.stem.removeprefix("bench_"): path for path in BENCH_DIR.glob("*.py")}


def split_script_args(words: list[str]) -> tuple[list[str], list[str]]:
    """The benchmarks named, and the options for their scripts: everything from the first
    word that starts with `-` (click hands over what follows `--` as arguments)."""
    for index, word in enumerate(words):
        if word.startswith("-"):
            return words[:index], words[index:]
    return words, []


def run(
    names: Annotated[
        list[str] | None,
        typer.Argument(
            help="Benchmarks to run (default: the main ones); see --list. Options after "
            "`--` go to each one's script: `tally bench rereplication -- --mib 1024`."
        ),
    ] = None,
    list_only: Annotated[bool, typer.Option("--list", help="List the benchmarks.")] = False,
) -> None:
    """Run benchmarks of bench/, each printing its figures beside the physical limits."""
    console = Console()
    scripts = bench_scripts()
    available = sorted(scripts)
    if list_only or not BENCH_DIR.is_dir():
        table = Table("benchmark", "measures", title=f"benchmarks in {BENCH_DIR}")
        for name in available:
            table.add_row(name, DESCRIPTIONS.get(name, ""))
        console.print(table)
        if not BENCH_DIR.is_dir():
            console.print("[red]no bench/ directory: run from a source checkout[/]")
            raise typer.Exit(2)
        return
    chosen, script_args = split_script_args(names or [])
    chosen = chosen or DEFAULT
    unknown = [n for n in chosen if n not in available]
    if unknown:
        console.print(f"[red]unknown benchmark(s) {unknown}[/]; known: {', '.join(available)}")
        raise typer.Exit(2)
    results = Table("benchmark", "exit", "seconds", title="tally bench")
    failed = False
    for name in chosen:
        script = scripts[name]
        console.rule(f"[bold]{name}[/]: {DESCRIPTIONS.get(name, '')}")
        started = time.monotonic()
        code = subprocess.run([sys.executable, str(script), *script_args], check=False).returncode
        failed |= code != 0
        results.add_row(name, str(code), f"{time.monotonic() - started:.0f}")
    console.print(results)
    if failed:
        raise typer.Exit(1)
