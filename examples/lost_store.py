"""The metadata store was lost: a local cluster's sqlite file deleted, and rebuilt from its
bookies with `tally cluster recover` (README: the metadata store was lost).

    uv run python examples/lost_store.py [--dir DIR]

Three bookies; five ledgers written (one left open, as a writer that died leaves it); the
store deleted; a bookie stopped, and its restart refused with what happened; its files
exported, the others asked; a report, then --apply; the bookies started again on the
rebuilt store, the open ledger's recovery finished by a second run; every entry read back
and compared. About three minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tally.client.client import Client
from tally.core.ids import LedgerId

PASSWORD = b"lost-store"
TALLY = [sys.executable, "-m", "tally.cli.main"]


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def tally(*arguments: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*TALLY, *arguments], capture_output=True, text=True, check=False)
    print(done.stdout, end="", flush=True)
    if done.returncode:
        print(done.stderr, end="", flush=True)
    return done


class Bookie:
    def __init__(self, uri: str, root: Path, port: int) -> None:
        self.uri, self.data_dir, self.address = uri, root / f"bookie-{port}", f"127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / "bookie.log"
        seen = path.stat().st_size if path.exists() else 0
        log = path.open("ab")
        self.process = subprocess.Popen(
            [*TALLY, "bookie", "--metadata", self.uri, "--data-dir", str(self.data_dir),
             "--listen", self.address],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while b" ready on " not in path.read_bytes()[seen:]:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"bookie {self.address} did not start: see its bookie.log")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


async def write(uri: str) -> dict[LedgerId, list[str]]:
    """Five ledgers; the digests of their entries, to compare after."""
    written: dict[LedgerId, list[str]] = {}
    async with Client(uri) as client:
        for number in range(5):
            writer = await client.create_ledger(
                ensemble_size=3, write_quorum=2, ack_quorum=2, password=PASSWORD
            )
            entries = [f"ledger {number} entry {n} ".encode() * (n + 1) for n in range(50)]
            for data in entries:
                await writer.append(data)
            if number < 4:
                await writer.close()  # the last one stays open, as a dead writer leaves it
            written[writer.ledger_id] = [hashlib.sha256(d).hexdigest() for d in entries]
            print(f"ledger {writer.ledger_id}: {len(entries)} entries", flush=True)
    return written


async def read_back(uri: str, written: dict[LedgerId, list[str]]) -> None:
    async with Client(uri) as client:
        for ledger_id, digests in written.items():
            reader = await client.open_ledger(ledger_id, password=PASSWORD)
            found = [
                hashlib.sha256(e.data).hexdigest() async for e in reader.read(0, len(digests) - 1)
            ]
            state = (await client.context.ledgers.read_ledger_metadata(ledger_id)).metadata
            ok = "identical" if found == digests else "DIFFERENT"
            print(f"ledger {ledger_id}: {len(found)} entries read back, {ok}; {state.state.name}")
            if found != digests:
                raise SystemExit("an entry did not come back")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="working directory (a temp one)")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="tally-lost-store-"))
    uri = f"sqlite:///{root / 'meta.db'}"
    bookies = [Bookie(uri, root, port) for port in (4181, 4182, 4183)]
    exports, report = root / "exports", root / "report"
    try:
        say(f"a cluster of three bookies in {root}")
        tally("cluster", "init", "--metadata", uri)
        for bookie in bookies:
            bookie.start()
        say("five ledgers written, the last one left open")
        written = asyncio.run(write(uri))

        say("the metadata store is lost: its file deleted; one bookie is stopped")
        for path in root.glob("meta.db*"):
            path.unlink()
        stopped, running = bookies[0], bookies[1:]
        stopped.stop()
        refused = subprocess.run(
            [*TALLY, "bookie", "--metadata", uri, "--data-dir", str(stopped.data_dir),
             "--listen", stopped.address],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        print(f"started again, it says:\n{refused.stderr.strip()}")

        say("the stopped bookie's files exported; the running ones asked; a report (Spark)")
        tally(
            "cluster", "export-bookie", "--data-dir", str(stopped.data_dir), "--out", str(exports)
        )
        addresses = ",".join(bookie.address for bookie in running)
        recover = ["cluster", "recover", "--bookies", addresses, "--exports", str(exports),
                   "--report", str(report), "--master", "local[2]"]  # fmt: skip
        if tally(*recover).returncode:
            raise SystemExit("the report failed")

        say("--apply: the cluster, the cookies, the ledgers, then the open ledger's recovery")
        applied = tally(*recover, "--metadata", uri, "--apply")
        if applied.returncode:
            print("(its recovery re-writes entries onto every bookie of its ensemble: it waits")
            print(" for the stopped bookie, which can start now that the store is back)")
        for bookie in running:
            bookie.stop()
        for bookie in bookies:
            bookie.start()
        say("the bookies started again on the rebuilt store; the recovery run again")
        everyone = ",".join(bookie.address for bookie in bookies)
        again = ["cluster", "recover", "--bookies", everyone, "--report", str(report),
                 "--master", "local[2]", "--metadata", uri, "--apply"]  # fmt: skip
        if tally(*again).returncode:
            raise SystemExit("the recovery failed")
        say("every entry read back")
        asyncio.run(read_back(uri, written))
    finally:
        for bookie in bookies:
            bookie.stop()
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
