"""A metadata store session in its own process, for the multi-process tests.

Usage: store_worker.py URI SESSION_TIMEOUT. Prints `ready SESSION_ID`, then answers one
line per command read from stdin:
  ephemeral PATH      -> ok PATH       (creates an ephemeral key)
  version PATH        -> version N
  cas PATH VERSION    -> won | lost    (set PATH to this process's pid if at VERSION)
"""

from __future__ import annotations

import asyncio
import os
import sys

from tally.core.errors import MetadataVersionConflict
from tally.metadata import open_store


async def serve(uri: str, session_timeout: float) -> None:
    loop = asyncio.get_running_loop()
    async with open_store(uri, session_timeout=session_timeout, connect_timeout=10) as store:
        print("ready", store.session_id, flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            command, *args = line.split()
            if command == "ephemeral":
                print("ok", await store.create(args[0], ephemeral=True), flush=True)
            elif command == "version":
                print("version", (await store.get(args[0])).version, flush=True)
            elif command == "cas":
                try:
                    await store.set(args[0], str(os.getpid()).encode(), int(args[1]))
                    print("won", flush=True)
                except MetadataVersionConflict:
                    print("lost", flush=True)
            else:
                print("unknown", command, flush=True)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], float(sys.argv[2])))
