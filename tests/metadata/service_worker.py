"""A metadata service user in its own process, for the multi-process tests.

Usage: service_worker.py URI SESSION_TIMEOUT. Prints `ready SESSION_ID`, then answers one
line per command read from stdin:
  ids N          -> ids ID...          (N new 64-bit ledger ids, allocated 8 at a time)
  lock QUALIFIED -> locked | busy      (take the replication lock of that ledger)
"""

from __future__ import annotations

import asyncio
import sys

from tally.core.ids import LedgerId
from tally.metadata import open_store
from tally.metadata.ledger_manager import LedgerManager
from tally.metadata.underreplication import UnderReplicationManager


async def serve(uri: str, session_timeout: float) -> None:
    loop = asyncio.get_running_loop()
    async with open_store(uri, session_timeout=session_timeout, connect_timeout=10) as store:
        ledgers = LedgerManager(store)
        replication = UnderReplicationManager(store)
        print("ready", store.session_id, flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command, argument = line.split()
            if command == "ids":
                ids: list[LedgerId] = []
                while len(ids) < int(argument):
                    ids += await asyncio.gather(*(ledgers.generate_ledger_id() for _ in range(8)))
                print("ids", *(ledger_id.id for ledger_id in ids), flush=True)
            elif command == "lock":
                lock = await replication.acquire(LedgerId.from_qualified_name(argument))
                print("busy" if lock is None else "locked", flush=True)
            else:
                print("unknown", command, flush=True)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], float(sys.argv[2])))
