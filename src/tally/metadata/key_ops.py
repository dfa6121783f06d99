"""What several services do with keys: upsert, delete if present, and watch a value."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from tally.core.errors import KeyExists, MalformedData, NoSuchKey
from tally.metadata.store import MetadataStore, Watch, WatchEvent, WatchKind

log = logging.getLogger(__name__)

T = TypeVar("T")


async def put(store: MetadataStore, path: str, data: bytes) -> None:
    """Set `path` to `data` whether or not it exists yet (its parent must)."""
    while True:
        try:
            await store.set(path, data)
            return
        except NoSuchKey:
            pass
        try:
            await store.create(path, data)
            return
        except KeyExists:
            continue  # created meanwhile: set it


async def delete_if_present(store: MetadataStore, path: str) -> bool:
    """Delete `path`; False if it was not there."""
    try:
        await store.delete(path)
    except NoSuchKey:
        return False
    return True


class Watcher(Generic[T]):
    """Gives what `read()` returns to a callback: at once, then after each change it watches.

    Re-reads run one at a time and a value is given only when it differs from the last one
    given, so the callback sees successive values in order, each once. A value that does
    not decode (MalformedData) is logged and skipped; later changes are delivered as usual.
    """

    def __init__(
        self,
        store: MetadataStore,
        read: Callable[[], Awaitable[T]],
        callback: Callable[[T], object],
        what: str,
    ):
        self.what = what
        self._store = store
        self._read = read
        self._callback = callback
        self._lock = asyncio.Lock()
        self._last: list[T] = []
        self._watches: list[Watch] = []
        self.cancelled = False

    @classmethod
    async def start(
        cls,
        store: MetadataStore,
        targets: Sequence[tuple[str, WatchKind]],
        read: Callable[[], Awaitable[T]],
        callback: Callable[[T], object],
        what: str,
    ) -> Watcher[T]:
        """Arm a store watch on each (path, kind) target, then deliver the current value."""
        watcher = cls(store, read, callback, what)
        try:
            for path, kind in targets:
                watcher._watches.append(await store.watch(path, kind, watcher._changed))
            await watcher._refresh()
        except BaseException:
            watcher.cancel()
            raise
        return watcher

    def cancel(self) -> None:
        self.cancelled = True
        for watch in self._watches:
            watch.cancel()

    def _changed(self, _: WatchEvent) -> object:
        return self._refresh()

    async def _refresh(self) -> None:
        async with self._lock:
            if self.cancelled:
                return
            try:
                value = await self._read()
            except MalformedData as e:
                log.error("%s does not decode: %s", self.what, e)
                return
            if self._last and self._last[0] == value:
                return
            self._last = [value]
            result = self._callback(value)
            if inspect.isawaitable(result):
                await result


async def watch_value(
    store: MetadataStore,
    path: str,
    decode: Callable[[bytes], T],
    callback: Callable[[T | None], object],
) -> Watcher[T | None]:
    """Give `path`'s decoded value (None while absent) to `callback`, now and on changes."""

    async def read() -> T | None:
        try:
            found = await store.get(path)
        except NoSuchKey:
            return None
        return decode(found.data)

    return await Watcher.start(store, [(path, WatchKind.DATA)], read, callback, f"key {path}")
