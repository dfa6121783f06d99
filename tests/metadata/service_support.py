"""Helpers for the tests of the services on the store: sample metadata, a worker process."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Generic, TypeVar

from tally.core.digest import DigestType
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import Deletion, LedgerMetadata
from tally.metadata.deletion import tombstone_ledger
from tally.metadata.ledger_manager import LedgerManager
from tests.metadata.support import StoreProcess

SERVICE_WORKER = Path(__file__).with_name("service_worker.py")

T = TypeVar("T")


class Collected(Generic[T]):
    """A callback that keeps the values it is given and lets a test await the next ones."""

    def __init__(self) -> None:
        self.values: list[T] = []
        self._changed = asyncio.Event()

    def __call__(self, value: T) -> None:
        self.values.append(value)
        self._changed.set()

    async def wait_for(self, count: int, timeout: float = 5.0) -> list[T]:
        """The values once there are at least `count`; fails the test after `timeout`."""
        async with asyncio.timeout(timeout):
            while len(self.values) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.values


def sample_metadata(token: bytes | None = None, ensemble: tuple[str, ...] = ()) -> LedgerMetadata:
    """An open ledger's metadata with its own creator token (unless one is given)."""
    return LedgerMetadata.create(
        ensemble=ensemble or ("bookie-1:3181", "bookie-2:3181", "bookie-3:3181"),
        write_quorum=2,
        ack_quorum=2,
        digest_type=DigestType.CRC32C,
        password=b"secret",
        ctime_ms=1_700_000_000_000,
        creator_token=secrets.token_bytes(16) if token is None else token,
    )


async def start_service_worker(uri: str, session_timeout: float) -> StoreProcess:
    """`service_worker.py` in a child process, once it is ready."""
    return await StoreProcess.start(uri, session_timeout, script=SERVICE_WORKER)


async def delete_now(manager: LedgerManager, ledger_id: LedgerId, now_ms: int = 1) -> None:
    """Delete a ledger at once, as the delete path does with a retention of 0: close it if
    it is open, move it to DELETED, then replace its metadata by its tombstone."""

    def closed_then_deleted(metadata: LedgerMetadata) -> LedgerMetadata:
        if not metadata.has_end:
            metadata = metadata.close(-1, 0)
        return metadata.deleted(Deletion(now_ms, "deleted by a test"))

    record = await manager.update(ledger_id, closed_then_deleted)
    assert await tombstone_ledger(manager, record, now_ms) is not None
