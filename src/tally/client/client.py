"""`tally.Client`: create, write, open (with or without recovery), read and delete ledgers.

async with tally.Client("sqlite:///path/meta.db") as client:
    writer = await client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2,
                                        password=b"pw")
    await writer.append(b"bytes")
    await writer.close()
    reader = await client.open_ledger(writer.ledger_id, password=b"pw", recovery=True)
    async for entry in reader.read(0, reader.last_entry_id): ...
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import ssl
import time
import weakref
from collections.abc import Mapping
from types import TracebackType
from typing import Self

from tally.client.bookie_pool import BookiePool
from tally.client.config import ClientConfig
from tally.client.context import ClientContext
from tally.client.deletion import (
    check_before_delete,
    give_deletion_copies,
    recovery_for_delete,
)
from tally.client.reader import LedgerReader
from tally.client.recovery import recover
from tally.client.writer import LedgerWriter
from tally.core.digest import DigestType, LedgerKeys
from tally.core.errors import BadRequest, IllegalOperation
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.core.placement import (
    DEFAULT_POLICY,
    DefaultPlacementPolicy,
    PlacementPolicy,
    RackAwarePlacementPolicy,
)
from tally.core.schedule import check_quorums
from tally.metadata import deletion
from tally.metadata.bookie_registry import BookieRegistry
from tally.metadata.cluster import require_cluster
from tally.metadata.deletion import DeleteOutcome
from tally.metadata.ledger_manager import LedgerManager, LedgerRecord
from tally.metadata.store import MetadataStore
from tally.metadata.stores import open_store
from tally.metadata.underreplication import UnderReplicationManager

log = logging.getLogger(__name__)


def placement_policy(config: ClientConfig) -> PlacementPolicy:
    if config.placement == DEFAULT_POLICY:
        return DefaultPlacementPolicy()
    return RackAwarePlacementPolicy(  # the config allows no other
        min_num_racks_per_write_quorum=config.min_num_racks_per_write_quorum,
        enforce_min_num_racks_per_write_quorum=config.enforce_min_num_racks_per_write_quorum,
    )


class Client:
    """A connection to one tally cluster, through its metadata store."""

    def __init__(
        self,
        metadata: str,
        *,
        config: ClientConfig | None = None,
        ssl_context: ssl.SSLContext | None = None,
        seed: int | None = None,
    ) -> None:
        self.metadata_uri = metadata
        self.config = config or ClientConfig()
        self._ssl = ssl_context
        self._rng = random.Random(seed)
        self._store: MetadataStore | None = None
        self._shared_store: MetadataStore | None = None
        """A started session another component owns (`sharing`): used, never closed."""
        self._context: ClientContext | None = None
        self._writers: weakref.WeakSet[LedgerWriter] = weakref.WeakSet()

    @classmethod
    def sharing(cls, store: MetadataStore, *, config: ClientConfig | None = None) -> Client:
        """A client on a started store session that another component owns (the admin
        HTTP app of a bookie, say); closing the client leaves the session open."""
        client = cls("shared://", config=config)
        client._shared_store = store
        return client

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        if self._shared_store is not None:
            self._store = self._shared_store
        else:
            self._store = open_store(self.metadata_uri, session_timeout=self.config.session_timeout)
            await self._store.start()
            await require_cluster(self._store, uri=self.metadata_uri)
        registry = BookieRegistry(self._store)
        self._context = ClientContext(
            config=self.config,
            ledgers=LedgerManager(self._store),
            registry=registry,
            under_replication=UnderReplicationManager(self._store),
            bookies=BookiePool(
                registry, request_timeout=self.config.add_entry_timeout, ssl_context=self._ssl
            ),
            policy=placement_policy(self.config),
            rng=self._rng,
        )

    async def close(self) -> None:
        """Stop the writers left open first (they wait, bounded, for what they have in
        flight and mark what failed, which needs both the bookies and the store), then
        close the bookie connections, then the store."""
        writers, self._writers = list(self._writers), weakref.WeakSet()
        stopped = await asyncio.gather(*(w.stop() for w in writers), return_exceptions=True)
        for writer, outcome in zip(writers, stopped, strict=True):
            if isinstance(outcome, Exception):
                log.warning(
                    "ledger %s: its writer did not stop cleanly: %s", writer.ledger_id, outcome
                )
            elif isinstance(outcome, BaseException):
                raise outcome
        if self._context is not None:
            await self._context.bad_copies.flush()
            await self._context.bookies.close()
            self._context = None
        if self._store is not None:
            if self._store is not self._shared_store:
                await self._store.close()
            self._store = None

    @property
    def context(self) -> ClientContext:
        if self._context is None:
            raise IllegalOperation("the client is not started (use `async with Client(...)`)")
        return self._context

    async def create_ledger(
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
    ) -> LedgerWriter:
        """A new OPEN ledger on an ensemble the placement policy chose among the writable
        bookies; `scope` or `uuid=True` give it a 128-bit id."""
        check_quorums(ensemble_size, write_quorum, ack_quorum)
        if not isinstance(password, bytes):
            raise BadRequest("the ledger password is bytes")
        context = self.context
        ensemble = await context.new_ensemble(ensemble_size, write_quorum, ack_quorum)
        if uuid and scope is not None:
            raise BadRequest("give scope or uuid=True, not both")
        if uuid:
            ledger_id = LedgerId.from_uuid()
        else:
            ledger_id = await context.ledgers.generate_ledger_id()
            if scope is not None:
                ledger_id = LedgerId(scope, ledger_id.id)
        metadata = LedgerMetadata.create(
            ensemble=ensemble,
            write_quorum=write_quorum,
            ack_quorum=ack_quorum,
            digest_type=DigestType.parse(digest),
            password=password,
            ctime_ms=int(time.time() * 1000),
            creator_token=os.urandom(16),
            custom_metadata=custom_metadata,
        )
        record = await context.ledgers.create_ledger_metadata(ledger_id, metadata)
        writer = LedgerWriter(context, record, password, advanced=advanced)
        self._writers.add(writer)
        return writer

    async def open_ledger(
        self, ledger_id: LedgerId | int | str, *, password: bytes = b"", recovery: bool = True
    ) -> LedgerReader:
        """A reader. With `recovery`, an open ledger is first fenced and closed (its writer
        stops); without it, the view ends at the LAC the bookies report."""
        context = self.context
        record = await deletion.read_undeleted(context.ledgers, LedgerId.parse(ledger_id))
        record.metadata.check_password(password, record.ledger_id)
        keys = LedgerKeys.of_password(password)
        if recovery:
            record = await recover(context, record, keys)
        reader = LedgerReader(context, record, keys)
        if record.metadata.state is not LedgerState.CLOSED:
            await reader.update_last_add_confirmed()
        return reader

    async def delete_ledger(
        self,
        ledger_id: LedgerId | int | str,
        *,
        force: bool = False,
        reason: str = "deleted by a client",
        password: bytes | None = None,
    ) -> DeleteOutcome:
        """Delete the ledger through the cluster's delete path (metadata.deletion): checked
        once more, DELETED (undeletable for `ledger_delete_retention`), then a tombstone its
        bookies drop the data for. `force` recovers and closes an open ledger first (an HMAC
        ledger's recovery takes its `password`)."""
        context = self.context
        outcome = await deletion.delete_ledger(
            context.ledgers,
            LedgerId.parse(ledger_id),
            reason=reason,
            now_ms=int(time.time() * 1000),
            force=force,
            recover=recovery_for_delete(context, password),
            check=functools.partial(check_before_delete, context),
        )
        if outcome.tombstone is None:  # a tombstone reaches the bookies by itself
            await give_deletion_copies(context, outcome.record)
        return outcome

    async def undelete_ledger(self, ledger_id: LedgerId | int | str) -> LedgerRecord:
        """Bring a DELETED ledger back, unchanged, while it is within its retention."""
        record = await deletion.undelete_ledger(
            self.context.ledgers, LedgerId.parse(ledger_id), now_ms=int(time.time() * 1000)
        )
        await give_deletion_copies(self.context, record)
        return record

    async def set_archived(self, ledger_id: LedgerId | int | str) -> LedgerRecord:
        """Set a closed ledger's archival bit, once an archiver copied it elsewhere."""
        return await deletion.set_archived(self.context.ledgers, LedgerId.parse(ledger_id))
