"""`memory://[name]`: the metadata store in this process's memory, for tests.

Stores opened on the same name share one tree, which lives as long as the process; each
store is a session of its own, so one test process can play a bookie and a client.
`memory://` alone gives a private tree. Sessions end only on `close()` or
`expire_session()`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict

from tally.core.errors import NoSuchKey
from tally.metadata.store import (
    ROOT,
    Create,
    MetadataStore,
    Op,
    OpResult,
    Stat,
    Versioned,
    Watch,
    WatchKind,
    name_of,
    parent_of,
)
from tally.metadata.tree import (
    Change,
    Node,
    apply_ops,
    delete_ephemerals,
    root_node,
    watch_targets,
    with_parents,
)

_session_ids = itertools.count(1)


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Tree:
    """Nodes shared by the stores of one name; every access holds `lock`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.nodes: dict[str, Node] = {ROOT: root_node(_now_ms())}
        self.kids: dict[str, set[str]] = defaultdict(set)
        self.stores: set[MemoryStore] = set()

    def store_node(self, path: str, node: Node) -> None:
        if path not in self.nodes and path != ROOT:
            self.kids[parent_of(path)].add(name_of(path))
        self.nodes[path] = node

    def drop_node(self, path: str) -> None:
        del self.nodes[path]
        self.kids.pop(path, None)
        siblings = self.kids[parent_of(path)]
        siblings.discard(name_of(path))
        if not siblings:
            del self.kids[parent_of(path)]

    def publish(self, changes: list[tuple[str, Change]]) -> None:
        targets = {t for path, change in changes for t in watch_targets(path, change)}
        for store in self.stores:
            store._notify(targets)


class _Journal:
    """The tree as a NodeTable that can undo what a failed transaction did."""

    def __init__(self, tree: _Tree):
        self._tree = tree
        self._undo: list[tuple[str, Node | None]] = []

    def node(self, path: str) -> Node | None:
        return self._tree.nodes.get(path)

    def put(self, path: str, node: Node) -> None:
        self._undo.append((path, self._tree.nodes.get(path)))
        self._tree.store_node(path, node)

    def remove(self, path: str) -> None:
        self._undo.append((path, self._tree.nodes[path]))
        self._tree.drop_node(path)

    def has_children(self, path: str) -> bool:
        return bool(self._tree.kids.get(path))

    def rollback(self) -> None:
        for path, old in reversed(self._undo):
            if old is None:
                self._tree.drop_node(path)
            else:
                self._tree.store_node(path, old)
        self._undo.clear()


_named_lock = threading.Lock()
_named: dict[str, _Tree] = {}


class MemoryStore(MetadataStore):
    def __init__(self, name: str, *, session_timeout: float, connect_timeout: float):
        super().__init__(session_timeout=session_timeout, connect_timeout=connect_timeout)
        self._name = name
        self._session_id = next(_session_ids)
        self._tree = _Tree()
        self._watches: dict[tuple[str, WatchKind], set[Watch]] = defaultdict(set)

    @property
    def session_id(self) -> int:
        return self._session_id

    async def _start(self) -> None:
        if self._name:
            with _named_lock:
                self._tree = _named.setdefault(self._name, self._tree)
        with self._tree.lock:
            self._tree.stores.add(self)

    async def _close(self) -> None:
        self._end_session()
        with self._tree.lock:
            self._tree.stores.discard(self)
        self._watches.clear()

    async def _expire_session(self) -> None:
        self._end_session()
        self._report_session_lost("expired by expire_session()")

    def _end_session(self) -> None:
        tree = self._tree
        with tree.lock:
            mine = [path for path, node in tree.nodes.items() if node.owner == self._session_id]
            changes = delete_ephemerals(_Journal(tree), mine, self._session_id)
            tree.publish(changes)

    async def _get(self, path: str) -> Versioned:
        with self._tree.lock:
            node = self._tree.nodes.get(path)
        if node is None:
            raise NoSuchKey(f"no metadata key at {path}")
        return Versioned(node.data, node.stat())

    async def _exists(self, path: str) -> Stat | None:
        with self._tree.lock:
            node = self._tree.nodes.get(path)
        return None if node is None else node.stat()

    async def _get_many(self, paths: list[str]) -> list[Versioned | None]:
        with self._tree.lock:
            nodes = [self._tree.nodes.get(path) for path in paths]
        return [None if node is None else Versioned(node.data, node.stat()) for node in nodes]

    async def _children(self, path: str) -> list[str]:
        with self._tree.lock:
            if path not in self._tree.nodes:
                raise NoSuchKey(f"no metadata key at {path}")
            return list(self._tree.kids.get(path, ()))

    async def _create(self, op: Create, make_parents: bool) -> str:
        tree = self._tree
        with tree.lock:
            ops: list[Op] = [*with_parents(_Journal(tree), op)] if make_parents else [op]
            result = self._apply(ops)[-1]
        assert isinstance(result, str)
        return result

    async def _transaction(self, ops: list[Op]) -> list[OpResult]:
        with self._tree.lock:
            return self._apply(ops)

    def _apply(self, ops: list[Op]) -> list[OpResult]:
        """Apply `ops` all or nothing; the caller holds the tree's lock."""
        journal = _Journal(self._tree)
        try:
            results, changes = apply_ops(
                journal, ops, session_id=self._session_id, now_ms=_now_ms()
            )
        except BaseException:
            journal.rollback()
            raise
        self._tree.publish(changes)
        return results

    async def _add_watch(self, watch: Watch) -> None:
        self._watches[(watch.path, watch.kind)].add(watch)

    def _forget_watch(self, watch: Watch) -> None:
        self._watches[(watch.path, watch.kind)].discard(watch)

    def _notify(self, targets: set[tuple[str, WatchKind]]) -> None:
        for target in targets:
            for watch in list(self._watches.get(target, ())):
                watch.notify()
