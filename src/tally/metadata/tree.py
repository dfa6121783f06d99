"""ZooKeeper's rules for a tree of versioned keys, over any table of nodes.

The memory and sqlite backends keep their nodes differently (a dict; SQL rows inside a
write transaction) but must agree with ZooKeeper, and with each other, on every rule:
which error an op raises and in which order the checks run, how versions and sequential
suffixes advance, which watches a change wakes. Those rules live here, once.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from tally.core.errors import (
    BadRequest,
    KeyExists,
    MetadataVersionConflict,
    NoSuchKey,
    NotEmpty,
)
from tally.metadata.store import (
    ROOT,
    CheckVersion,
    Create,
    Delete,
    Op,
    OpResult,
    SetData,
    Stat,
    WatchKind,
    parent_of,
    sequential_name,
)


@dataclass(frozen=True)
class Node:
    data: bytes
    version: int
    cversion: int
    """Children created or deleted so far: ZooKeeper's counter for sequential names."""
    ctime_ms: int
    mtime_ms: int
    owner: int | None
    """Session id of an ephemeral node's owner; None when persistent."""

    def stat(self) -> Stat:
        return Stat(self.version, self.ctime_ms, self.mtime_ms, self.owner)


def root_node(now_ms: int) -> Node:
    return Node(b"", 0, 0, now_ms, now_ms, None)


class NodeTable(Protocol):
    """Where a backend keeps its nodes; the root '/' is always present."""

    def node(self, path: str) -> Node | None: ...

    def put(self, path: str, node: Node) -> None: ...

    def remove(self, path: str) -> None: ...

    def has_children(self, path: str) -> bool: ...


class Change(enum.Enum):
    """What happened to a key; logged by backends that drive watches themselves."""

    CREATED = "c"
    CHANGED = "s"
    DELETED = "d"


def watch_targets(path: str, change: Change) -> list[tuple[str, WatchKind]]:
    """The (path, kind) watches that `change` at `path` wakes (see WatchKind)."""
    if change is Change.CHANGED:
        return [(path, WatchKind.DATA)]
    targets = [(path, WatchKind.DATA), (path, WatchKind.EXISTS), (path, WatchKind.CHILDREN)]
    if path != ROOT:
        targets.append((parent_of(path), WatchKind.CHILDREN))
    return targets


def with_parents(table: NodeTable, op: Create) -> list[Create]:
    """`op` preceded by creates of its missing ancestors (persistent, empty)."""
    missing: list[Create] = []
    parent = parent_of(op.path)
    while parent != ROOT and table.node(parent) is None:
        missing.append(Create(parent))
        parent = parent_of(parent)
    return [*reversed(missing), op]


def apply_ops(
    table: NodeTable, ops: Sequence[Op], *, session_id: int, now_ms: int
) -> tuple[list[OpResult], list[tuple[str, Change]]]:
    """Apply `ops` in order; the first failing op raises and the caller rolls `table` back."""
    changes: list[tuple[str, Change]] = []
    results = [_apply(table, op, session_id, now_ms, changes) for op in ops]
    return results, changes


def delete_ephemerals(
    table: NodeTable, paths: Iterable[str], owner: int
) -> list[tuple[str, Change]]:
    """Remove the ephemeral nodes of a session that ended (its `paths` among them)."""
    changes: list[tuple[str, Change]] = []
    for path in sorted(paths, reverse=True):
        node = table.node(path)
        if node is not None and node.owner == owner:
            _remove(table, path, changes)
    return changes


def _apply(
    table: NodeTable, op: Op, session_id: int, now_ms: int, changes: list[tuple[str, Change]]
) -> OpResult:
    if isinstance(op, Create):
        return _create(table, op, session_id, now_ms, changes)
    node = table.node(op.path)
    if node is None:
        raise NoSuchKey(f"no metadata key at {op.path}")
    expected = op.version if isinstance(op, CheckVersion) else op.expected_version
    if expected is not None and expected != node.version:
        raise MetadataVersionConflict(
            f"{op.path} is at version {node.version}, expected {expected}"
        )
    if isinstance(op, SetData):
        updated = replace(node, data=op.data, version=node.version + 1, mtime_ms=now_ms)
        table.put(op.path, updated)
        changes.append((op.path, Change.CHANGED))
        return updated.stat()
    if isinstance(op, Delete):
        if table.has_children(op.path):
            raise NotEmpty(f"cannot delete {op.path}: it has children")
        _remove(table, op.path, changes)
    return None


def _create(
    table: NodeTable, op: Create, session_id: int, now_ms: int, changes: list[tuple[str, Change]]
) -> str:
    parent_path = parent_of(op.path)
    parent = table.node(parent_path)
    if parent is None:
        raise NoSuchKey(f"cannot create {op.path}: parent {parent_path} does not exist")
    path = sequential_name(op.path, parent.cversion) if op.sequential else op.path
    if table.node(path) is not None:
        raise KeyExists(f"metadata key {path} already exists")
    if parent.owner is not None:
        raise BadRequest(f"cannot create {path}: parent {parent_path} is ephemeral")
    owner = session_id if op.ephemeral else None
    table.put(path, Node(op.data, 0, 0, now_ms, now_ms, owner))
    table.put(parent_path, replace(parent, cversion=parent.cversion + 1))
    changes.append((path, Change.CREATED))
    return path


def _remove(table: NodeTable, path: str, changes: list[tuple[str, Change]]) -> None:
    table.remove(path)
    parent_path = parent_of(path)
    parent = table.node(parent_path)
    assert parent is not None, f"{path} outlived its parent"
    table.put(parent_path, replace(parent, cversion=parent.cversion + 1))
    changes.append((path, Change.DELETED))
