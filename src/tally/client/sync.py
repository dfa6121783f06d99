"""`tally.SyncClient`: the same calls without async, for scripts and notebooks.

The asyncio client runs on an event loop in a daemon thread of its own; each call waits
for its result there, so the caller's thread may be any thread without a loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Awaitable, Coroutine, Iterator, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

from tally.client.client import Client
from tally.client.config import ClientConfig
from tally.client.reader import LedgerEntry, LedgerReader
from tally.client.writer import LedgerWriter
from tally.core.digest import DigestType
from tally.core.ids import LedgerId
from tally.metadata.deletion import DeleteOutcome
from tally.metadata.ledger_manager import LedgerRecord

T = TypeVar("T")


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tally", daemon=True)
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await work

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class SyncClient:
    """`tally.Client` for synchronous code; use it as a context manager or call close()."""

    def __init__(
        self, metadata: str, *, config: ClientConfig | None = None, seed: int | None = None
    ) -> None:
        self._loop = _Loop()
        self._client = Client(metadata, config=config, seed=seed)
        try:
            self._loop.run(self._client.start())
        except BaseException:
            self._loop.stop()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._loop.run(self._client.close())
        self._loop.stop()

    def create_ledger(
        self,
        *,
        ensemble_size: int = 3,
        write_quorum: int = 2,
        ack_quorum: int = 2,
        password: bytes = b"",
        digest: DigestType | str = DigestType.CRC32C,
        custom_metadata: Mapping[str, bytes] | None = None,
        scope: int | None = None,
        uuid: bool = False,
        advanced: bool = False,
    ) -> SyncLedgerWriter:
        writer = self._loop.run(
            self._client.create_ledger(
                ensemble_size=ensemble_size,
                write_quorum=write_quorum,
                ack_quorum=ack_quorum,
                password=password,
                digest=digest,
                custom_metadata=custom_metadata,
                scope=scope,
                uuid=uuid,
                advanced=advanced,
            )
        )
        return SyncLedgerWriter(self._loop, writer)

    def open_ledger(
        self, ledger_id: LedgerId | int | str, *, password: bytes = b"", recovery: bool = True
    ) -> SyncLedgerReader:
        reader = self._loop.run(
            self._client.open_ledger(ledger_id, password=password, recovery=recovery)
        )
        return SyncLedgerReader(self._loop, reader)

    def delete_ledger(
        self,
        ledger_id: LedgerId | int | str,
        *,
        force: bool = False,
        reason: str = "deleted by a client",
        password: bytes | None = None,
    ) -> DeleteOutcome:
        return self._loop.run(
            self._client.delete_ledger(ledger_id, force=force, reason=reason, password=password)
        )

    def undelete_ledger(self, ledger_id: LedgerId | int | str) -> LedgerRecord:
        return self._loop.run(self._client.undelete_ledger(ledger_id))

    def set_archived(self, ledger_id: LedgerId | int | str) -> LedgerRecord:
        return self._loop.run(self._client.set_archived(ledger_id))


class SyncLedgerWriter:
    def __init__(self, loop: _Loop, writer: LedgerWriter) -> None:
        self._loop = loop
        self._writer = writer

    @property
    def ledger_id(self) -> LedgerId:
        return self._writer.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._writer.last_add_confirmed

    def append(self, data: bytes, entry_id: int | None = None) -> int:
        return self._loop.run(self._writer.append(data, entry_id))

    def close(self) -> None:
        self._loop.run(self._writer.close())


class SyncLedgerReader:
    def __init__(self, loop: _Loop, reader: LedgerReader) -> None:
        self._loop = loop
        self._reader = reader

    @property
    def ledger_id(self) -> LedgerId:
        return self._reader.ledger_id

    @property
    def last_entry_id(self) -> int:
        return self._reader.last_entry_id

    def update_last_add_confirmed(self) -> int:
        return self._loop.run(self._reader.update_last_add_confirmed())

    def read_entry(self, entry_id: int) -> LedgerEntry:
        return self._loop.run(self._reader.read_entry(entry_id))

    def read(self, first: int, last: int) -> Iterator[LedgerEntry]:
        entries: AsyncGenerator[LedgerEntry, None] = self._reader.read(first, last)
        try:
            while True:
                try:
                    yield self._loop.run(anext(entries))
                except StopAsyncIteration:
                    return
        finally:
            self._loop.run(entries.aclose())
