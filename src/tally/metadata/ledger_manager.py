"""The ledger manager: ledger ids, and each ledger's metadata in the store.

Ids. Scope-0 (64-bit) ids come from a store sequence: allocating one is a single
unconditional write to a counter key, whose new data version is the id. Versions never go
back, even when ledgers are deleted, so ids are never reused (a nuked cluster starts over,
under a new instance id that every old cookie refuses); concurrent writers each get
their own version, so creators on any number of sessions and processes never collide and
never retry. ZooKeeper's data version is a signed 32-bit counter, so the sequence runs in
buckets of IDGEN_BUCKET_SIZE ids: `/idgen/<first id>` counts the ids after its first, and
when it is full the next bucket is created and the allocation retried there (the bucket's
first id itself is never handed out). Scoped (128-bit) ids are random UUIDs, scope != 0.

Creating metadata is idempotent for its creator: a create retried after a lost reply finds
its own metadata there (same creator token) and succeeds; any other creator gets
LedgerExists. Updates are compare-and-set on the key's version.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from tally.core.errors import (
    KeyExists,
    LedgerExists,
    MalformedData,
    MetadataVersionConflict,
    NoSuchKey,
    NoSuchLedger,
)
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata
from tally.metadata.key_ops import Watcher
from tally.metadata.ledger_tree import (
    DEFAULT_PAGE_SIZE,
    Subtree,
    create_with_parents,
    walk,
)
from tally.metadata.paths import (
    IDGEN,
    LEDGER_METADATA,
    idgen_bucket_first_id,
    idgen_bucket_path,
)
from tally.metadata.store import MetadataStore, Versioned, WatchKind

log = logging.getLogger(__name__)

UPDATE_ATTEMPTS = 10
"""Compare-and-set tries of one `update` before it gives up."""

IDGEN_BUCKET_SIZE = 1 << 30
"""Ids per bucket of the sequence: below ZooKeeper's 2^31 data versions."""
CREATE_ATTEMPTS = 3


@dataclass(frozen=True)
class LedgerRecord:
    """A ledger's metadata as stored, with the version to pass back for a CAS update."""

    ledger_id: LedgerId
    metadata: LedgerMetadata
    version: int


@dataclass(frozen=True)
class UnreadableLedger:
    """A key in the ledger tree whose metadata does not decode (or that names no ledger)."""

    path: str
    ledger_id: LedgerId | None
    error: MalformedData


@dataclass(frozen=True)
class LedgerPage:
    """One page of an iteration over every ledger, in ledger id order."""

    ledgers: tuple[LedgerRecord, ...]
    unreadable: tuple[UnreadableLedger, ...]


def _decode(ledger_id: LedgerId, found: Versioned) -> LedgerRecord:
    return LedgerRecord(ledger_id, LedgerMetadata.from_bytes(found.data, ledger_id), found.version)


def _no_such_ledger(ledger_id: LedgerId) -> NoSuchLedger:
    return NoSuchLedger(f"ledger {ledger_id} has no metadata (never created, or deleted)")


class LedgerManager:
    """Ledger ids and metadata on one store session; call `require_cluster` first."""

    def __init__(self, store: MetadataStore):
        self.store = store
        self._bucket: int | None = None
        """First id of the newest sequence bucket seen, once looked up."""

    # -- ids -----------------------------------------------------------------------------

    async def generate_ledger_id(self, *, scoped: bool = False) -> LedgerId:
        """A new ledger id: the next of the store's 64-bit sequence, or a random scoped one."""
        if scoped:
            return LedgerId.from_uuid()
        while True:
            # A local copy: concurrent callers on this manager may reset `_bucket` meanwhile.
            bucket = self._bucket
            if bucket is None:
                bucket = self._bucket = await self._newest_bucket()
            try:
                stat = await self.store.set(idgen_bucket_path(bucket), b"")
            except NoSuchKey:  # the cluster was nuked and initialised again
                self._bucket = None
                continue
            if stat.version < IDGEN_BUCKET_SIZE:
                return LedgerId.classic(bucket + stat.version)
            with contextlib.suppress(KeyExists):  # another creator opened it first
                await self.store.create(idgen_bucket_path(bucket + IDGEN_BUCKET_SIZE))
            self._bucket = None

    async def skip_ids_through(self, last_id: int) -> None:
        """Never hand out a 64-bit id up to `last_id` (ledgers put back by a metadata
        recovery): the sequence goes on in a new bucket past it (versions cannot be set, so
        the rest of the bucket `last_id` is in goes unused)."""
        first = (last_id // IDGEN_BUCKET_SIZE + 1) * IDGEN_BUCKET_SIZE
        with contextlib.suppress(KeyExists):
            await self.store.create(idgen_bucket_path(first))
        self._bucket = None

    async def ids_allocated(self) -> int:
        """How many 64-bit ids the sequence has handed out (each bucket's version counts its
        own): an upper bound of the scope-0 ledgers there are, read in a few requests."""
        buckets = [
            idgen_bucket_path(first)
            for name in await self.store.children(IDGEN)
            if (first := idgen_bucket_first_id(name)) is not None
        ]
        return sum(found.stat.version for found in await self.store.get_many(buckets) if found)

    async def _newest_bucket(self) -> int:
        """The first id of the newest bucket; the first bucket is created when none is."""
        while True:
            names = await self.store.children(IDGEN)
            firsts = [first for name in names if (first := idgen_bucket_first_id(name)) is not None]
            if firsts:
                return max(firsts)
            with contextlib.suppress(KeyExists):
                await self.store.create(idgen_bucket_path(0))

    # -- one ledger ----------------------------------------------------------------------

    async def create_ledger_metadata(
        self, ledger_id: LedgerId, metadata: LedgerMetadata
    ) -> LedgerRecord:
        """Store a new ledger's metadata; LedgerExists if another creator has the id.

        Metadata with the same non-empty creator token already there is this creator's own
        earlier attempt: it is returned as the result.
        """
        path = LEDGER_METADATA.path(ledger_id)
        data = metadata.to_bytes()
        for _ in range(CREATE_ATTEMPTS):
            try:
                await create_with_parents(self.store, path, data)
                return LedgerRecord(ledger_id, metadata, 0)
            except KeyExists:
                pass
            try:
                existing = await self.read_ledger_metadata(ledger_id)
            except NoSuchLedger:
                continue  # deleted meanwhile: the id is free again for this creator
            token = metadata.creator_token
            if token and existing.metadata.creator_token == token:
                return existing
            raise LedgerExists(
                f"ledger {ledger_id} already exists, created by another creator "
                f"(creator token {existing.metadata.creator_token.hex() or 'none'})"
            )
        raise LedgerExists(f"ledger {ledger_id} keeps being created and deleted by others")

    async def read_ledger_metadata(self, ledger_id: LedgerId) -> LedgerRecord:
        """The ledger's metadata; NoSuchLedger if absent, MalformedData naming it if corrupt."""
        try:
            found = await self.store.get(LEDGER_METADATA.path(ledger_id))
        except NoSuchKey:
            raise _no_such_ledger(ledger_id) from None
        return _decode(ledger_id, found)

    async def write_ledger_metadata(
        self, ledger_id: LedgerId, metadata: LedgerMetadata, expected_version: int
    ) -> LedgerRecord:
        """Replace the metadata if still at `expected_version` (MetadataVersionConflict if not)."""
        try:
            stat = await self.store.set(
                LEDGER_METADATA.path(ledger_id), metadata.to_bytes(), expected_version
            )
        except NoSuchKey:
            raise _no_such_ledger(ledger_id) from None
        except MetadataVersionConflict:
            raise MetadataVersionConflict(
                f"ledger {ledger_id} metadata changed since version {expected_version}; "
                "re-read it and apply the change again"
            ) from None
        return LedgerRecord(ledger_id, metadata, stat.version)

    async def update(
        self,
        ledger_id: LedgerId,
        change: Callable[[LedgerMetadata], LedgerMetadata],
        *,
        current: LedgerRecord | None = None,
        attempts: int = UPDATE_ATTEMPTS,
    ) -> LedgerRecord:
        """Read, change, compare-and-set, and on a version conflict read and change again
        (BookKeeper's MetadataUpdateLoop). `change` gets the metadata as stored and returns
        the metadata to write, the same object when nothing needs writing, or raises to stop
        (its error is the caller's). `current`: the record the caller holds, tried first.
        The record as written, or as read if nothing changed; MetadataVersionConflict if
        the metadata changed under every one of `attempts` tries."""
        record = current if current is not None else await self.read_ledger_metadata(ledger_id)
        for attempt in range(1, attempts + 1):
            updated = change(record.metadata)
            if updated is record.metadata:
                return record
            try:
                return await self.write_ledger_metadata(ledger_id, updated, record.version)
            except MetadataVersionConflict:
                if attempt < attempts:
                    record = await self.read_ledger_metadata(ledger_id)
        raise MetadataVersionConflict(
            f"ledger {ledger_id}: its metadata kept changing over {attempts} attempts to update it"
        )

    async def watch_ledger_metadata(
        self, ledger_id: LedgerId, callback: Callable[[LedgerRecord | None], object]
    ) -> Watcher[LedgerRecord | None]:
        """Call `callback` with the ledger's metadata now and after each change (None once
        deleted), in order, until the returned watcher is cancelled. Metadata that does not
        decode is logged, naming the ledger, and not given."""

        async def read() -> LedgerRecord | None:
            try:
                return await self.read_ledger_metadata(ledger_id)
            except NoSuchLedger:
                return None

        path = LEDGER_METADATA.path(ledger_id)
        return await Watcher.start(
            self.store, [(path, WatchKind.DATA)], read, callback, f"ledger {ledger_id} metadata"
        )

    # -- every ledger --------------------------------------------------------------------

    async def ledger_pages(
        self, page_size: int = DEFAULT_PAGE_SIZE, within: Subtree | None = None
    ) -> AsyncIterator[LedgerPage]:
        """Every ledger's id and metadata (in the subtree `within`), in id order, at most
        `page_size` per page.

        A key whose bytes do not decode (or that names no ledger) is reported in its page's
        `unreadable` and the iteration goes on.
        """
        async for page in walk(self.store, LEDGER_METADATA, page_size, within):
            ledgers: list[LedgerRecord] = []
            unreadable = [
                UnreadableLedger(
                    path, None, MalformedData(f"{path} is in the ledger tree but names no ledger")
                )
                for path in page.strays
            ]
            for ledger_id, path, found in page.ledgers:
                try:
                    ledgers.append(_decode(ledger_id, found))
                except MalformedData as e:
                    unreadable.append(UnreadableLedger(path, ledger_id, e))
            yield LedgerPage(tuple(ledgers), tuple(unreadable))
