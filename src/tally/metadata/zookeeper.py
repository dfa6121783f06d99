"""`zk://host:port[,host:port][/chroot]`: Apache ZooKeeper through kazoo.

Ephemeral keys, versions, sequential names and transactions are ZooKeeper's own. Kazoo
runs its I/O on its own threads; its results and events hop into the store's event
loop with `call_soon_threadsafe`, so no kazoo call ever blocks the loop.

Watches: ZooKeeper's watches fire once, so each store watch re-arms its ZooKeeper watch
before telling the callback (a change between the two is then seen by the callback's
re-read, and any later change fires again). Kazoo drops every watch when the connection
drops; on reconnect each is re-armed and notified, since changes may have been missed.

Sessions: kazoo keeps the session across reconnects within the session timeout. When
ZooKeeper reports it expired, the loss is reported to the owner; kazoo goes on with a new
session, which this store uses for persistent keys and watches only.

Requests wait at most `connect_timeout` (Timeout). A read interrupted by a lost
connection is retried within that time; a write is not, since its outcome is unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from kazoo.client import KazooClient  # type: ignore[import-untyped]
from kazoo.exceptions import (  # type: ignore[import-untyped]
    BadArgumentsError,
    BadVersionError,
    ConnectionClosedError,
    ConnectionLoss,
    NoChildrenForEphemeralsError,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
    OperationTimeoutError,
    RolledBackError,
    RuntimeInconsistency,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError  # type: ignore[import-untyped]
from kazoo.protocol.states import (  # type: ignore[import-untyped]
    EventType,
    KazooState,
    KeeperState,
)

from tally.core.errors import (
    BadRequest,
    KeyExists,
    MetadataStoreError,
    MetadataVersionConflict,
    NoSuchKey,
    NotEmpty,
    SessionExpired,
    TallyError,
    Timeout,
)
from tally.metadata.store import (
    ROOT,
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
    WatchKind,
    check_path,
)

log = logging.getLogger(__name__)

DEFAULT_PORT = 2181
_REARM_RETRY = 0.1
"""Seconds between two attempts to re-arm a watch, or to retry a read."""
_EXPIRED_POLL = 0.01
"""Seconds between two looks for kazoo's new session after an expiry."""


def _stat(zstat: Any) -> Stat:
    return Stat(zstat.version, zstat.ctime, zstat.mtime, zstat.ephemeralOwner or None)


def _map_error(e: BaseException, what: str, path: str) -> TallyError:
    """tally's error for a kazoo error raised by `what` on `path`."""
    if isinstance(e, TallyError):
        return e
    where = f"{what} {path}"
    if isinstance(e, NoNodeError):
        return NoSuchKey(f"{where}: no such key (or no parent)")
    if isinstance(e, NodeExistsError):
        return KeyExists(f"{where}: key already exists")
    if isinstance(e, NotEmptyError):
        return NotEmpty(f"{where}: key has children")
    if isinstance(e, BadVersionError):
        return MetadataVersionConflict(f"{where}: version is not the expected one")
    if isinstance(e, NoChildrenForEphemeralsError):
        return BadRequest(f"{where}: the parent is ephemeral")
    if isinstance(e, BadArgumentsError | ValueError | TypeError):
        return BadRequest(f"{where}: ZooKeeper rejected the arguments: {e!r}")
    if isinstance(e, ConnectionClosedError):
        return MetadataStoreError(f"{where}: the ZooKeeper client is closed")
    if isinstance(e, SessionExpiredError):
        return SessionExpired(f"{where}: the ZooKeeper session expired")
    if isinstance(e, ConnectionLoss | OperationTimeoutError):
        return Timeout(f"{where}: connection to ZooKeeper lost, outcome unknown")
    return MetadataStoreError(f"{where}: ZooKeeper error {e!r}")


def _zk_version(expected: int | None) -> int:
    """ZooKeeper spells "any version" -1."""
    return -1 if expected is None else expected


def parse_hosts(netloc: str) -> list[tuple[str, int]]:
    """(host, port) pairs of a ZooKeeper connect string; BadRequest when malformed."""
    hosts: list[tuple[str, int]] = []
    for item in netloc.split(","):
        try:
            parts = urlsplit("//" + item.strip())
            host, port = parts.hostname, parts.port
        except ValueError as e:
            raise BadRequest(f"ZooKeeper host {item!r} in {netloc!r}: {e}") from None
        if not host:
            raise BadRequest(f"ZooKeeper host list {netloc!r} has an empty host")
        hosts.append((host, port or DEFAULT_PORT))
    return hosts


def _connect_string(hosts: list[tuple[str, int]]) -> str:
    return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in hosts)


class _ZkWatch:
    """The kazoo watcher of one store watch: one object, so kazoo sees one watcher."""

    def __init__(self, store: ZooKeeperStore, watch: Watch):
        self.store = store
        self.watch = watch

    def __call__(self, event: Any) -> None:  # on a kazoo thread
        self.store._soon(self.store._on_event, self, event)


class ZooKeeperStore(MetadataStore):
    def __init__(
        self,
        hosts: list[tuple[str, int]],
        chroot: str,
        *,
        session_timeout: float,
        connect_timeout: float,
    ):
        super().__init__(session_timeout=session_timeout, connect_timeout=connect_timeout)
        self.hosts = _connect_string(hosts)
        self.chroot = "" if chroot == ROOT else chroot
        self._client: KazooClient | None = None
        self._session_id = 0
        self._watches: dict[Watch, _ZkWatch] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def from_uri_parts(
        cls, netloc: str, path: str, *, session_timeout: float, connect_timeout: float
    ) -> ZooKeeperStore:
        if not netloc:
            raise BadRequest("ZooKeeper URI needs hosts: zk://host:port[,host:port][/chroot]")
        chroot = check_path(path) if path not in ("", ROOT) else ROOT
        return cls(
            parse_hosts(netloc),
            chroot,
            session_timeout=session_timeout,
            connect_timeout=connect_timeout,
        )

    @property
    def session_id(self) -> int:
        return self._session_id

    @property
    def _zk(self) -> KazooClient:
        if self._client is None:
            raise MetadataStoreError("ZooKeeper store not started")
        return self._client

    def _full(self, path: str) -> str:
        return self.chroot if path == ROOT and self.chroot else self.chroot + path

    def _relative(self, full: str) -> str:
        return full[len(self.chroot) :] or ROOT

    def _soon(self, fn: Callable[..., object], *args: object) -> None:
        """Run `fn(*args)` in the store's loop, from a kazoo thread; dropped after close."""
        loop = self.loop
        if self._closed or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(fn, *args)

    async def _call(
        self, what: str, path: str, fn: Callable[..., Any], *args: Any, **kw: Any
    ) -> Any:
        """Await a kazoo `*_async` call, turning its errors into tally's.

        Between an expiry and kazoo's next session, kazoo fails every request unsent;
        the request waits for the new session instead.
        """
        loop = self.loop
        future: asyncio.Future[Any] = loop.create_future()
        deadline = loop.time() + self.connect_timeout
        while self._zk.client_state == KeeperState.EXPIRED_SESSION and loop.time() < deadline:
            await asyncio.sleep(_EXPIRED_POLL)

        def settle(result: Any) -> None:
            if future.done():
                return
            if result.successful():
                future.set_result(result.value)
            else:
                future.set_exception(result.exception)

        try:
            fn(*args, **kw).rawlink(lambda result: self._soon(settle, result))
            return await asyncio.wait_for(future, max(0.0, deadline - loop.time()))
        except TimeoutError:
            raise Timeout(
                f"{what} {path}: no answer from ZooKeeper at {self.hosts} "
                f"within {self.connect_timeout}s"
            ) from None
        except Exception as e:
            raise _map_error(e, what, path) from e

    async def _read(
        self, what: str, path: str, fn: Callable[..., Any], *args: Any, **kw: Any
    ) -> Any:
        """`_call` for a read: retried after a lost connection, within the connect timeout."""
        deadline = self.loop.time() + self.connect_timeout
        while True:
            try:
                return await self._call(what, path, fn, *args, **kw)
            except (Timeout, SessionExpired):
                if self.loop.time() >= deadline or self._closed:
                    raise
                await asyncio.sleep(_REARM_RETRY)

    # -- sessions ------------------------------------------------------------------------

    async def _start(self) -> None:
        client = KazooClient(
            hosts=self.hosts,
            timeout=self.session_timeout,
            connection_retry={
                "max_tries": -1,
                "delay": 0.05,
                "backoff": 2,
                "max_delay": max(0.1, self.session_timeout / 4),
            },
        )
        client.add_listener(lambda state: self._soon(self._on_state, state))
        try:
            await asyncio.to_thread(client.start, self.connect_timeout)
        except KazooTimeoutError:
            raise Timeout(
                f"no ZooKeeper server answered at {self.hosts} within {self.connect_timeout}s"
            ) from None
        self._client = client
        self._session_id = client.client_id[0]
        if self.chroot:
            try:
                await self._call("create", self.chroot, client.ensure_path_async, self.chroot)
            except BaseException:
                await asyncio.to_thread(self._shutdown, client)
                raise

    async def _close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._watches.clear()
        client = self._client
        if client is not None:
            await asyncio.to_thread(self._shutdown, client)

    @staticmethod
    def _shutdown(client: KazooClient) -> None:
        client.stop()
        client.close()

    def _on_state(self, state: str) -> None:
        if self._closed:
            return
        if state == KazooState.LOST:
            self._report_session_lost(f"ZooKeeper at {self.hosts} expired the session")
        elif state == KazooState.CONNECTED:
            for zk_watch in list(self._watches.values()):
                self._spawn(self._rearm(zk_watch, notify=True))

    def _check_same_session(self) -> None:
        """SessionExpired if kazoo already runs on another session than ours.

        Kazoo starts a new session as soon as the old one expires; an ephemeral key made
        on it would outlive what the owner was told, so it is refused here, before the
        loss reaches the loop.
        """
        # kazoo exposes the id only while connected; its field says it during reconnects.
        current = self._zk._session_id
        if current != self._session_id:
            self._report_session_lost("ZooKeeper session replaced by kazoo")
            self._check_session()

    async def _expire_session(self) -> None:
        """Close our session from a second client that presents its id and password."""
        session_id, password = self._zk.client_id

        def close_it() -> None:
            other = KazooClient(
                hosts=self.hosts, timeout=self.session_timeout, client_id=(session_id, password)
            )
            other.start(self.connect_timeout)
            self._shutdown(other)

        await asyncio.to_thread(close_it)
        try:
            await asyncio.wait_for(
                self.session_lost.wait(), self.session_timeout + self.connect_timeout
            )
        except TimeoutError:
            raise Timeout(
                f"ZooKeeper at {self.hosts} did not report session {session_id:#x} expired"
            ) from None

    # -- operations ----------------------------------------------------------------------

    async def _get(self, path: str) -> Versioned:
        data, zstat = await self._read("get", path, self._zk.get_async, self._full(path))
        return Versioned(data, _stat(zstat))

    async def _get_many(self, paths: list[str]) -> list[Versioned | None]:
        """All the gets in flight at once: ZooKeeper pipelines them on the one connection."""

        async def get_or_none(path: str) -> Versioned | None:
            try:
                return await self._get(path)
            except NoSuchKey:
                return None

        return list(await asyncio.gather(*(get_or_none(path) for path in paths)))

    async def _exists(self, path: str) -> Stat | None:
        zstat = await self._read("exists", path, self._zk.exists_async, self._full(path))
        return None if zstat is None else _stat(zstat)

    async def _children(self, path: str) -> list[str]:
        names: list[str] = await self._read(
            "children", path, self._zk.get_children_async, self._full(path)
        )
        return names

    async def _create(self, op: Create, make_parents: bool) -> str:
        if op.ephemeral:
            self._check_same_session()
        created = await self._call(
            "create",
            op.path,
            self._zk.create_async,
            self._full(op.path),
            op.data,
            ephemeral=op.ephemeral,
            sequence=op.sequential,
            makepath=make_parents,
        )
        return self._relative(created)

    async def _transaction(self, ops: list[Op]) -> list[OpResult]:
        if any(isinstance(op, Create) and op.ephemeral for op in ops):
            self._check_same_session()
        txn = self._zk.transaction()
        for op in ops:
            full = self._full(op.path)
            if isinstance(op, Create):
                txn.create(full, op.data, ephemeral=op.ephemeral, sequence=op.sequential)
            elif isinstance(op, SetData):
                txn.set_data(full, op.data, _zk_version(op.expected_version))
            elif isinstance(op, Delete):
                txn.delete(full, _zk_version(op.expected_version))
            elif isinstance(op, CheckVersion):
                txn.check(full, op.version)
        what = "transaction" if len(ops) > 1 else type(ops[0]).__name__.lower()
        raw: list[Any] = await self._call(what, ops[0].path, txn.commit_async)
        for op, result in zip(ops, raw, strict=True):
            if isinstance(result, Exception) and not isinstance(
                result, RolledBackError | RuntimeInconsistency
            ):
                raise _map_error(result, f"{what}: {type(op).__name__}", op.path)
        return [self._op_result(op, result) for op, result in zip(ops, raw, strict=True)]

    def _op_result(self, op: Op, result: Any) -> OpResult:
        if isinstance(op, Create):
            return self._relative(result)
        if isinstance(op, SetData):
            return _stat(result)
        return None

    # -- watches -------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _add_watch(self, watch: Watch) -> None:
        zk_watch = _ZkWatch(self, watch)
        self._watches[watch] = zk_watch
        try:
            await self._arm(zk_watch)
        except BaseException:
            self._watches.pop(watch, None)
            raise

    def _forget_watch(self, watch: Watch) -> None:
        self._watches.pop(watch, None)

    async def _arm(self, zk_watch: _ZkWatch) -> None:
        """Set the one-shot ZooKeeper watch(es) that cover `zk_watch`'s kind."""
        watch = zk_watch.watch
        full = self._full(watch.path)
        exists = self._zk.exists_async
        if watch.kind is not WatchKind.CHILDREN:
            await self._call("watch", watch.path, exists, full, watch=zk_watch)
            return
        while True:
            with contextlib.suppress(NoSuchKey):
                await self._call("watch", watch.path, self._zk.get_children_async, full, zk_watch)
                return
            # No node: watch for its creation, unless it appeared meanwhile.
            if await self._call("watch", watch.path, exists, full, watch=zk_watch) is None:
                return

    def _on_event(self, zk_watch: _ZkWatch, event: Any) -> None:
        if self._closed or zk_watch.watch.cancelled:
            return
        if event.type == EventType.NONE:
            return  # kazoo dropped its watches; `_on_state` re-arms them on reconnect
        kind = zk_watch.watch.kind
        relevant = event.type != EventType.CHANGED or kind is WatchKind.DATA
        self._spawn(self._rearm(zk_watch, notify=relevant))

    async def _rearm(self, zk_watch: _ZkWatch, notify: bool) -> None:
        """Re-arm, then notify: the callback's re-read comes after the watch is set."""
        while not (self._closed or zk_watch.watch.cancelled):
            try:
                await self._arm(zk_watch)
                break
            except TallyError as e:
                if not self._zk.connected:
                    return  # `_on_state` re-arms and notifies on reconnect
                log.warning("re-arming %r failed: %s", zk_watch.watch, e)
                await asyncio.sleep(_REARM_RETRY)
        if notify:
            zk_watch.watch.notify()
