"""A tally cluster in a metadata store: create it, check it is there, wipe it.

`init_cluster` writes the cluster record (a random instance id and the layout version)
and every root of `layout` in one transaction, so a store holds either a whole cluster
or none; a second init finds the record and changes nothing. Every process that serves
the cluster (bookie, client, auto-recovery) calls `require_cluster` first, so one pointed
at the wrong or an empty store stops with the command to run instead of creating keys.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass

from tally.core.errors import (
    BadRequest,
    ClusterNotInitialised,
    IllegalOperation,
    KeyExists,
    NoSuchKey,
    NotEmpty,
)
from tally.metadata import json_records
from tally.metadata.paths import CLUSTER, READONLY, ROOTS, SETTINGS, WRITABLE
from tally.metadata.store import ROOT, Create, Delete, MetadataStore, join, parent_of

LAYOUT_VERSION = 1
"""The version of `layout` this tally writes; a cluster with a newer one is refused."""
INIT_ATTEMPTS = 5
NUKE_BATCH = 500
"""Deletes per transaction while nuking (ZooKeeper bounds a multi's size)."""

_KIND = "cluster"
_FIELDS = frozenset({"instance_id", "layout_version", "created_ms"})


@dataclass(frozen=True)
class ClusterInfo:
    """The cluster record: what makes a store a tally cluster, and which one."""

    instance_id: str
    """Random at init; bookies keep it in their cookies, so a bookie formatted for another
    cluster (or for this store before a nuke) is refused."""
    layout_version: int
    created_ms: int

    def to_bytes(self) -> bytes:
        return json_records.encode(
            _KIND,
            {
                "instance_id": self.instance_id,
                "layout_version": self.layout_version,
                "created_ms": self.created_ms,
            },
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> ClusterInfo:
        record = json_records.decode(data, _KIND, _FIELDS, f"cluster record {CLUSTER}")
        return cls(
            instance_id=record.text("instance_id"),
            layout_version=record.integer("layout_version", low=1),
            created_ms=record.integer("created_ms"),
        )


@dataclass(frozen=True)
class InitResult:
    info: ClusterInfo
    created: bool
    """False when the store already held a cluster (then `info` is that cluster's)."""


def _uninitialised(uri: str | None) -> ClusterNotInitialised:
    where = f"the metadata store {uri}" if uri else "the metadata store"
    command = f"tally cluster init --metadata {uri or 'URI'}"
    return ClusterNotInitialised(
        f"{where} holds no tally cluster (no {CLUSTER} key); run `{command}` first"
    )


async def read_cluster(store: MetadataStore) -> ClusterInfo | None:
    """The cluster record, or None when the store holds no cluster."""
    try:
        found = await store.get(CLUSTER)
    except NoSuchKey:
        return None
    return ClusterInfo.from_bytes(found.data)


async def require_cluster(store: MetadataStore, *, uri: str | None = None) -> ClusterInfo:
    """The cluster record; ClusterNotInitialised (naming `tally cluster init`) if none.

    IllegalOperation when the cluster's layout is newer than this tally understands.
    `uri` only makes the message name the store.
    """
    info = await read_cluster(store)
    if info is None:
        raise _uninitialised(uri)
    if info.layout_version > LAYOUT_VERSION:
        raise IllegalOperation(
            f"cluster {info.instance_id} has metadata layout version {info.layout_version}; "
            f"this tally understands up to {LAYOUT_VERSION}: upgrade tally"
        )
    return info


async def init_cluster(
    store: MetadataStore, *, now_ms: int | None = None, instance_id: str | None = None
) -> InitResult:
    """Create the cluster, or find the one already there (then nothing changes).
    `instance_id`: the one of a cluster whose store was lost (metadata recovery), which
    its bookies' cookies name; a new one by default."""
    created_ms = int(time.time() * 1000) if now_ms is None else now_ms
    info = ClusterInfo(instance_id or str(uuid.uuid4()), LAYOUT_VERSION, created_ms)
    for _ in range(INIT_ATTEMPTS):
        existing = await read_cluster(store)
        if existing is not None:
            return InitResult(existing, created=False)
        present = await store.get_many(list(ROOTS))
        ops = [Create(root) for root, value in zip(ROOTS, present, strict=True) if value is None]
        try:
            await store.transaction([*ops, Create(CLUSTER, info.to_bytes())])
        except KeyExists:
            continue  # a concurrent init (or a root appeared): look again
        return InitResult(info, created=True)
    raise KeyExists(f"could not create the cluster: {CLUSTER} or its roots keep changing")


async def _registered_bookies(store: MetadataStore) -> list[str]:
    """Bookies registered now, writable or read-only (none if the roots are missing)."""
    found: list[str] = []
    for parent in (WRITABLE, READONLY):
        with contextlib.suppress(NoSuchKey):
            found += await store.children(parent)
    return sorted(set(found))


async def nuke_cluster(
    store: MetadataStore, *, instance_id: str | None = None, force: bool = False
) -> int:
    """Delete every key of the cluster (the record last); the number of keys deleted.

    Guarded: unless `force`, `instance_id` must name this cluster and no bookie may be
    registered. With `force`, whatever of a cluster is there goes, even a half-nuked one.
    An interrupted nuke leaves the record, so running it again finishes the job.
    """
    info = await read_cluster(store)
    if not force:
        if info is None:
            raise _uninitialised(None)
        if instance_id != info.instance_id:
            raise BadRequest(
                f"refusing to nuke cluster {info.instance_id}: the instance id given "
                f"({instance_id!r}) is not this cluster's"
            )
        bookies = await _registered_bookies(store)
        if bookies:
            raise IllegalOperation(
                f"refusing to nuke cluster {info.instance_id}: bookies {bookies} are "
                "registered; stop them first"
            )
    deleted = 0
    for root in (r for r in ROOTS if parent_of(r) == ROOT):
        deleted += await _delete_below(store, root)
        deleted += await _delete(store, root)
    deleted += await _delete(store, SETTINGS)
    return deleted + await _delete(store, CLUSTER)


async def _delete(store: MetadataStore, path: str) -> int:
    try:
        await store.delete(path)
    except NoSuchKey:
        return 0
    return 1


async def _delete_below(store: MetadataStore, path: str) -> int:
    """Delete the descendants of `path`: leaves a batch per transaction, others one by one."""
    try:
        names = await store.children(path)
    except NoSuchKey:
        return 0
    kids = [join(path, name) for name in names]
    deleted = 0
    for start in range(0, len(kids), NUKE_BATCH):
        batch = kids[start : start + NUKE_BATCH]
        try:
            await store.transaction([Delete(kid) for kid in batch])
            deleted += len(batch)
            continue
        except (NotEmpty, NoSuchKey):
            pass  # some have children (or went meanwhile): one by one
        for kid in batch:
            deleted += await _delete_below(store, kid)
            deleted += await _delete(store, kid)
    return deleted
