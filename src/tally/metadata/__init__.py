"""Metadata store: one async protocol over memory, sqlite and ZooKeeper backends."""

from tally.metadata.store import (
    CheckVersion,
    Create,
    Delete,
    MetadataStore,
    Op,
    OpResult,
    SetData,
    Stat,
    Versioned,
    Watch,
    WatchEvent,
    WatchKind,
)
from tally.metadata.stores import open_store

__all__ = [
    "CheckVersion",
    "Create",
    "Delete",
    "MetadataStore",
    "Op",
    "OpResult",
    "SetData",
    "Stat",
    "Versioned",
    "Watch",
    "WatchEvent",
    "WatchKind",
    "open_store",
]
