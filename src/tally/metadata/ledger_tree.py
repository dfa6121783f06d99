"""The per-ledger key hierarchies of `layout`: create, delete, and walk them in pages.

Creating a ledger's key creates the parents it needs; deleting it removes parents left
empty, as BookKeeper does, so that deleted ledgers leave no keys behind (random scoped
ids would otherwise leave a few each). A create that loses a race with that pruning
(the parent vanished between the two steps of a ZooKeeper `makepath`) is retried.

A walk lists a level's children for several siblings at once and reads the leaves'
values with `get_many`, a page at a time, so it costs a few round trips per page however
many ledgers there are, and holds one page (plus one parent's children) in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tally.core.errors import BadRequest, NoSuchKey, NotEmpty, TallyError
from tally.core.ids import LedgerId
from tally.metadata.paths import LEAF_PREFIX, Hierarchy, LedgerTree
from tally.metadata.store import MetadataStore, Versioned, join

log = logging.getLogger(__name__)

CREATE_ATTEMPTS = 5
LISTING_PARALLELISM = 32
"""Children listings in flight at once while walking the intermediate levels."""
DEFAULT_PAGE_SIZE = 1000


async def create_with_parents(store: MetadataStore, path: str, data: bytes) -> None:
    """Create `path` and any missing parent; KeyExists if it exists."""
    for _ in range(CREATE_ATTEMPTS - 1):
        with contextlib.suppress(NoSuchKey):  # a parent pruned meanwhile: again
            await store.create(path, data, make_parents=True)
            return
    await store.create(path, data, make_parents=True)


async def prune_parents(store: MetadataStore, parents: list[str]) -> None:
    """Delete `parents` (nearest first) while they are empty; best effort."""
    for parent in parents:
        try:
            await store.delete(parent)
        except (NotEmpty, NoSuchKey):
            return
        except TallyError as e:
            log.warning("could not prune the empty key %s: %s", parent, e)
            return


@dataclass(frozen=True)
class Subtree:
    """The keys below one node of a ledger tree's hierarchy, named by the key names from its
    root: the same node of every ledger tree (metadata, marks, tombstones) holds the same ids,
    so one subtree names a range of ids in all of them. Picklable, for a Spark task."""

    scoped: bool
    names: tuple[str, ...] = ()

    def hierarchy(self, tree: LedgerTree) -> Hierarchy:
        return tree.scoped if self.scoped else tree.classic

    def path(self, tree: LedgerTree) -> str:
        return "/".join([self.hierarchy(tree).root, *self.names])


WHOLE_TREES = (Subtree(scoped=False), Subtree(scoped=True))
"""Both hierarchies whole: every id."""


async def split(
    store: MetadataStore, trees: tuple[LedgerTree, ...], wanted: int
) -> tuple[list[Subtree], list[tuple[LedgerTree, str]]]:
    """At least `wanted` subtrees that together hold every key of `trees` (fewer when the
    trees hold fewer nodes above their leaves), and the stray keys met on the way, with the
    tree each is in.

    A node is split into the union of its children in every tree, so a range of ids that only
    one tree uses (a tombstone of a ledger whose metadata is gone) is in some subtree. Leaves
    are never split apart: a subtree is at least one parent of leaves.
    """
    parts = list(WHOLE_TREES)
    strays: list[tuple[LedgerTree, str]] = []
    while len(parts) < wanted:
        splittable = [
            part for part in parts if len(part.names) < part.hierarchy(trees[0]).depth - 1
        ]
        if not splittable:
            break
        finer: list[Subtree] = [part for part in parts if part not in splittable]
        for part in splittable:
            level = len(part.names)
            names: set[str] = set()
            for tree in trees:
                pattern = part.hierarchy(tree).patterns[level]
                for name in await _children(store, part.path(tree)):
                    if pattern.fullmatch(name):
                        names.add(name)
                    else:
                        strays.append((tree, join(part.path(tree), name)))
            finer.extend(Subtree(part.scoped, (*part.names, name)) for name in sorted(names))
        parts = finer
    return parts, strays


@dataclass(frozen=True)
class TreePage:
    """A page of a walk: the ledgers' keys with their values, and keys naming no ledger."""

    ledgers: list[tuple[LedgerId, str, Versioned]]
    strays: list[str]


async def walk(
    store: MetadataStore,
    tree: LedgerTree,
    page_size: int = DEFAULT_PAGE_SIZE,
    within: Subtree | None = None,
) -> AsyncIterator[TreePage]:
    """Every key of `tree` (or of its subtree `within`), sorted by ledger id, `page_size`
    ledgers per page (at most).

    The next page is read while the caller works on this one. A ledger created or deleted
    during the walk may or may not appear.
    """
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise BadRequest(f"page size must be a positive int, got {page_size!r}")
    reading: asyncio.Task[TreePage] | None = None
    try:
        async for leaves, strays in _batches(store, tree, page_size, within):
            next_read = asyncio.ensure_future(_read(store, leaves, strays))
            if reading is not None:
                yield await reading
            reading = next_read
        if reading is not None:
            yield await reading
    finally:
        if reading is not None and not reading.done():
            reading.cancel()


async def _batches(
    store: MetadataStore, tree: LedgerTree, page_size: int, within: Subtree | None
) -> AsyncIterator[tuple[list[tuple[LedgerId, str]], list[str]]]:
    """The leaves of `tree` (or of `within`) in order, `page_size` at a time, with the strays
    met meanwhile."""
    pending: list[tuple[LedgerId, str]] = []
    strays: list[str] = []
    for part in WHOLE_TREES if within is None else (within,):
        hierarchy, path = part.hierarchy(tree), part.path(tree)
        names = await _children(store, path)
        digits, level = "".join(part.names), len(part.names)
        async for leaves, stray in _descend(store, hierarchy, path, digits, level, names):
            pending.extend(leaves)
            strays.extend(stray)
            while len(pending) >= page_size:
                yield pending[:page_size], strays
                pending, strays = pending[page_size:], []
    if pending or strays:
        yield pending, strays


async def _read(
    store: MetadataStore, leaves: list[tuple[LedgerId, str]], strays: list[str]
) -> TreePage:
    values = await store.get_many([path for _, path in leaves])
    found = [
        (ledger_id, path, value)
        for (ledger_id, path), value in zip(leaves, values, strict=True)
        if value is not None
    ]
    return TreePage(found, strays)


async def _children(store: MetadataStore, path: str) -> list[str]:
    try:
        return await store.children(path)
    except NoSuchKey:
        return []  # pruned meanwhile, or a root of a store without a cluster


async def _descend(
    store: MetadataStore, hierarchy: Hierarchy, path: str, digits: str, level: int, names: list[str]
) -> AsyncIterator[tuple[list[tuple[LedgerId, str]], list[str]]]:
    """(leaves, stray keys) below `path`, whose children at `level` are `names`, in order."""
    pattern = hierarchy.patterns[level]
    valid = [name for name in names if pattern.fullmatch(name)]
    strays = [join(path, name) for name in names if not pattern.fullmatch(name)]
    if level == hierarchy.depth - 1:
        leaves = []
        for name in valid:
            leaf = join(path, name)
            ledger_id = hierarchy.ledger_id(digits + name[len(LEAF_PREFIX) :])
            if ledger_id is None:
                strays.append(leaf)
            else:
                leaves.append((ledger_id, leaf))
        yield leaves, strays
        return
    if strays:
        yield [], strays
    for start in range(0, len(valid), LISTING_PARALLELISM):
        group = valid[start : start + LISTING_PARALLELISM]
        listings = await asyncio.gather(*(_children(store, join(path, name)) for name in group))
        for name, children in zip(group, listings, strict=True):
            async for found in _descend(
                store, hierarchy, join(path, name), digits + name, level + 1, children
            ):
                yield found
