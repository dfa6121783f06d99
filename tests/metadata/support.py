"""Helpers shared by the metadata tests: a watch recorder and a store in another process."""

from __future__ import annotations

import asyncio
import itertools
import sys
from pathlib import Path

from tally.metadata import MetadataStore, WatchEvent, WatchKind

WORKER = Path(__file__).with_name("store_worker.py")


class Recorder:
    """A watch callback that counts notifications and lets a test await the next one."""

    def __init__(self) -> None:
        self.events: list[WatchEvent] = []
        self._changed = asyncio.Event()

    def __call__(self, event: WatchEvent) -> None:
        self.events.append(event)
        self._changed.set()

    async def wait_for(self, count: int, timeout: float = 5.0) -> None:
        """Until at least `count` notifications arrived; fails the test after `timeout`."""
        async with asyncio.timeout(timeout):
            while len(self.events) < count:
                self._changed.clear()
                await self._changed.wait()


_witnesses = itertools.count()


async def settled(store: MetadataStore, writer: MetadataStore) -> None:
    """Until `store` is notified of a change `writer` makes now: every backend delivers a
    session's notifications in the order of the changes, so any notification of an earlier
    change has been delivered by then (how a test shows that one is not)."""
    witness = Recorder()
    path = f"/witness-{next(_witnesses)}"
    watch = await store.watch(path, WatchKind.EXISTS, witness)
    await writer.create(path)
    await witness.wait_for(1)
    watch.cancel()


class StoreProcess:
    """`store_worker.py` in a child process, driven line by line over its stdin/stdout."""

    def __init__(self, process: asyncio.subprocess.Process, session_id: int):
        self.process = process
        self.session_id = session_id

    @classmethod
    async def start(cls, uri: str, session_timeout: float, script: Path = WORKER) -> StoreProcess:
        """`script` (a worker speaking this protocol) in a child process, once ready."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            uri,
            str(session_timeout),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        worker = cls(process, 0)
        reply = await worker.read()
        assert reply[0] == "ready", reply
        worker.session_id = int(reply[1])
        return worker

    async def send(self, *words: object) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write((" ".join(str(w) for w in words) + "\n").encode())
        await self.process.stdin.drain()

    async def read(self, timeout: float = 15.0) -> list[str]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        assert line, f"store worker exited with {await self.process.wait()}"
        return line.decode().split()

    async def ask(self, *words: object) -> list[str]:
        await self.send(*words)
        return await self.read()

    async def kill(self) -> None:
        """SIGKILL: no clean close, the session must die on its own."""
        self.process.kill()
        await self.process.wait()

    async def stop(self) -> None:
        if self.process.returncode is None:
            await self.kill()
