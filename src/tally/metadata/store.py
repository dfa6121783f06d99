"""The metadata store protocol: one async API over ZooKeeper-like hierarchical keys.

Every backend (memory, sqlite, ZooKeeper) subclasses `MetadataStore`, which validates
arguments once for all of them, tracks the session and delivers watch notifications, so
the three behave alike down to the error raised for a bad path.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import functools
import inspect
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from tally.core.errors import BadRequest, KeyExists, MetadataStoreError, SessionExpired
from tally.failpoints import afailpoint

log = logging.getLogger(__name__)

DEFAULT_SESSION_TIMEOUT = 10.0
"""Seconds; BookKeeper's `zkTimeout` default. Also the sqlite lease TTL."""

DEFAULT_CONNECT_TIMEOUT = 10.0
"""Seconds to wait for the store to answer (connect, or one request) before `Timeout`."""

SEQUENTIAL_DIGITS = 10
"""ZooKeeper's zero-padded width of a sequential node's suffix."""

ROOT = "/"
_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_path(path: object) -> str:
    """`path` if it is an absolute, normalised key path; BadRequest otherwise."""
    if not isinstance(path, str):
        raise BadRequest(f"metadata path must be a str, got {type(path).__name__}: {path!r}")
    if not path.startswith("/"):
        raise BadRequest(f"metadata path {path!r} is not absolute (must start with '/')")
    if path == ROOT:
        return path
    if path.endswith("/"):
        raise BadRequest(f"metadata path {path!r} has a trailing '/'")
    for part in path[1:].split("/"):
        if part in ("", ".", ".."):
            raise BadRequest(f"metadata path {path!r} has an empty, '.' or '..' component")
    bad = _CONTROL_CHARACTER.search(path)
    if bad:
        raise BadRequest(f"metadata path {path!r} contains control character {bad.group()!r}")
    return path


def parent_of(path: str) -> str:
    """The parent of a valid non-root path ("/a/b" -> "/a", "/a" -> "/")."""
    head = path.rsplit("/", 1)[0]
    return head or ROOT


def name_of(path: str) -> str:
    """The last component of a valid path ("/a/b" -> "b")."""
    return path.rsplit("/", 1)[1]


def join(parent: str, name: str) -> str:
    return parent + name if parent == ROOT else f"{parent}/{name}"


def sequential_name(path: str, counter: int) -> str:
    """ZooKeeper's name for a sequential node: the requested path plus a padded counter."""
    return f"{path}{counter:0{SEQUENTIAL_DIGITS}d}"


def check_data(data: object) -> bytes:
    if not isinstance(data, bytes):
        raise BadRequest(f"metadata value must be bytes, got {type(data).__name__}")
    return data


def check_version(version: object, what: str) -> int | None:
    if version is None:
        return None
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise BadRequest(f"{what} must be a non-negative int or None, got {version!r}")
    return version


@dataclass(frozen=True)
class Stat:
    """What the store knows about a key besides its value (ZooKeeper's Stat, trimmed)."""

    version: int
    """0 at creation, +1 on every set (ZooKeeper's data version)."""
    ctime_ms: int
    mtime_ms: int
    ephemeral_owner: int | None
    """The session that owns an ephemeral key; None for a persistent one."""


@dataclass(frozen=True)
class Versioned:
    """A key's value with the stat to pass back as `expected_version` for a CAS."""

    data: bytes
    stat: Stat

    @property
    def version(self) -> int:
        return self.stat.version


@dataclass(frozen=True)
class Create:
    """Transaction op: create `path` (the prefix of the name when sequential)."""

    path: str
    data: bytes = b""
    ephemeral: bool = False
    sequential: bool = False


@dataclass(frozen=True)
class SetData:
    """Transaction op: replace the value of `path`, if at `expected_version` (when given)."""

    path: str
    data: bytes
    expected_version: int | None = None


@dataclass(frozen=True)
class Delete:
    """Transaction op: delete `path` (it must have no children)."""

    path: str
    expected_version: int | None = None


@dataclass(frozen=True)
class CheckVersion:
    """Transaction op: fail the whole transaction unless `path` is at `version`."""

    path: str
    version: int


Op = Create | SetData | Delete | CheckVersion
OpResult = str | Stat | None
"""Per op: the created path (Create), the new Stat (SetData), None (Delete, CheckVersion)."""


def check_op(op: object) -> Op:
    """The op with its fields validated; BadRequest for anything else."""
    if isinstance(op, Create):
        check_path(op.path)
        check_data(op.data)
        return op
    if isinstance(op, SetData):
        check_path(op.path)
        check_data(op.data)
        check_version(op.expected_version, "expected_version")
        return op
    if isinstance(op, Delete):
        check_path(op.path)
        check_version(op.expected_version, "expected_version")
        return op
    if isinstance(op, CheckVersion):
        check_path(op.path)
        if check_version(op.version, "version") is None:
            raise BadRequest(f"CheckVersion of {op.path} needs a version")
        return op
    raise BadRequest(f"not a metadata transaction op: {op!r}")


def _versioned(op: Op) -> bool:
    """Whether the op is a compare-and-set: it holds only at a version."""
    if isinstance(op, CheckVersion):
        return True
    return isinstance(op, SetData | Delete) and op.expected_version is not None


async def _cas_failpoint() -> None:
    """The failpoint every compare-and-set passes (a versioned set or delete, a transaction
    with one), in every backend; its error is a store error, as a backend's would be."""
    try:
        await afailpoint("metadata.cas")
    except OSError as error:
        raise MetadataStoreError(f"metadata store: compare-and-set failed: {error}") from error


class WatchKind(enum.Enum):
    """What a watch on a path reacts to.

    DATA: the key is created, set or deleted. EXISTS: the key is created or deleted.
    CHILDREN: a child is created or deleted, or the key itself is created or deleted.
    """

    DATA = "data"
    EXISTS = "exists"
    CHILDREN = "children"


@dataclass(frozen=True)
class WatchEvent:
    """Something changed at `path` for a watch of `kind`: re-read to see what.

    Notifications may coalesce several changes; there is always at least one after
    every change that happened once the watch was registered.
    """

    path: str
    kind: WatchKind


WatchCallback = Callable[[WatchEvent], object]
"""Called in the store's event loop; may return an awaitable, which is run as a task."""


class Watch:
    """A persistent watch registration; `cancel()` stops its notifications."""

    def __init__(self, store: MetadataStore, path: str, kind: WatchKind, callback: WatchCallback):
        self.path = path
        self.kind = kind
        self._store = store
        self._callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._store._forget_watch(self)

    def notify(self) -> None:
        """Run the callback (in the store's loop) unless the watch was cancelled."""
        if not self.cancelled:
            event = WatchEvent(self.path, self.kind)
            self._store._run_callback(functools.partial(self._callback, event))

    def __repr__(self) -> str:
        return f"Watch({self.path!r}, {self.kind.name}, cancelled={self.cancelled})"


class SessionListener:
    """A registration made with `on_session_lost`; `cancel()` removes it."""

    def __init__(self, store: MetadataStore, callback: Callable[[], object]):
        self._store = store
        self.callback = callback

    def cancel(self) -> None:
        self._store._session_listeners.discard(self)


class MetadataStore(abc.ABC):
    """One session on a hierarchical, versioned key store.

    Paths are ZooKeeper's: absolute, '/'-separated, no trailing '/'. A key's parent must
    exist to create it. Ephemeral keys belong to this store's session and vanish with it.
    Losing the session is reported once, through `session_lost` and `on_session_lost`;
    afterwards ephemeral operations raise SessionExpired until the owner opens a new store.
    """

    def __init__(self, *, session_timeout: float, connect_timeout: float):
        if session_timeout <= 0 or connect_timeout <= 0:
            raise BadRequest(
                f"session_timeout ({session_timeout}) and connect_timeout "
                f"({connect_timeout}) must be positive"
            )
        self.session_timeout = session_timeout
        self.connect_timeout = connect_timeout
        self.session_lost = asyncio.Event()
        """Set once the session is gone (expired, or its lease taken by another process)."""
        self._session_listeners: set[SessionListener] = set()
        self._callback_tasks: set[asyncio.Task[object]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def session_id(self) -> int:
        """This store's session (the owner recorded on its ephemeral keys)."""

    async def start(self) -> None:
        if self._started or self._closed:
            raise BadRequest("metadata store already started (a store starts once)")
        self._loop = asyncio.get_running_loop()
        try:
            await self._start()
        except BaseException:
            self._closed = True  # a backend that failed to start has released what it took
            raise
        self._started = True

    async def close(self) -> None:
        """End the session (its ephemeral keys go) and release resources. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._started:
            await self._close()
        for task in list(self._callback_tasks):
            task.cancel()

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

    def on_session_lost(self, callback: Callable[[], object]) -> SessionListener:
        """Call `callback` (in the loop) when the session is lost; at once if it already is."""
        listener = SessionListener(self, callback)
        self._session_listeners.add(listener)
        if self.session_lost.is_set():
            self._run_callback(callback)
        return listener

    async def expire_session(self) -> None:
        """Test hook: make the backend expire this session as if its owner had died."""
        self._check_open()
        await self._expire_session()

    # -- operations ----------------------------------------------------------------------

    async def get(self, path: str) -> Versioned:
        """The value and stat of `path`; NoSuchKey when absent."""
        self._check_open()
        return await self._get(check_path(path))

    async def exists(self, path: str) -> Stat | None:
        self._check_open()
        return await self._exists(check_path(path))

    async def get_many(self, paths: Sequence[str]) -> list[Versioned | None]:
        """The value and stat of each of `paths`, in order, None where absent.

        One round trip (or one pipelined burst) for the lot, so that reading thousands of
        keys costs about what one does. Not a snapshot across keys: each is read at some
        moment during the call.
        """
        self._check_open()
        if isinstance(paths, str | bytes):
            raise BadRequest(f"get_many takes a sequence of paths, not one: {paths!r}")
        checked = [check_path(path) for path in paths]
        if not checked:
            return []
        return await self._get_many(checked)

    async def create(
        self,
        path: str,
        data: bytes = b"",
        *,
        ephemeral: bool = False,
        sequential: bool = False,
        make_parents: bool = False,
    ) -> str:
        """Create `path` and return the created path (with its suffix when sequential).

        KeyExists if it exists, NoSuchKey if its parent does not (unless `make_parents`,
        which creates missing ancestors as persistent empty keys).
        """
        self._check_open()
        op = Create(path, data, ephemeral, sequential)
        check_op(op)
        if op.path == ROOT:
            raise KeyExists("the root key '/' always exists")
        if ephemeral:
            self._check_session()
        return await self._create(op, make_parents)

    async def set(self, path: str, data: bytes, expected_version: int | None = None) -> Stat:
        """Replace the value; MetadataVersionConflict if `expected_version` is stale."""
        self._check_open()
        op = check_op(SetData(path, data, expected_version))
        if expected_version is not None:
            await _cas_failpoint()
        result = await self._transaction([op])
        assert isinstance(result[0], Stat)
        return result[0]

    async def delete(self, path: str, expected_version: int | None = None) -> None:
        """Delete a key without children (NotEmpty otherwise), CAS on the version if given."""
        self._check_open()
        op = check_op(Delete(path, expected_version))
        if op.path == ROOT:
            raise BadRequest("the root key cannot be deleted")
        if expected_version is not None:
            await _cas_failpoint()
        await self._transaction([op])

    async def children(self, path: str) -> list[str]:
        """Names (not paths) of the children of `path`, sorted; NoSuchKey when absent."""
        self._check_open()
        return sorted(await self._children(check_path(path)))

    async def transaction(self, ops: Sequence[Op]) -> list[OpResult]:
        """Apply all `ops` in order, atomically; on failure raise the first op's error.

        Later ops see the effects of earlier ones. Nothing changes when any op fails.
        """
        self._check_open()
        checked = [check_op(op) for op in ops]
        for op in checked:
            if isinstance(op, Create) and op.path == ROOT:
                raise KeyExists("the root key '/' always exists")
            if isinstance(op, Delete) and op.path == ROOT:
                raise BadRequest("the root key cannot be deleted")
        if any(isinstance(op, Create) and op.ephemeral for op in checked):
            self._check_session()
        if not checked:
            return []
        if any(_versioned(op) for op in checked):
            await _cas_failpoint()
        return await self._transaction(checked)

    async def watch(self, path: str, kind: WatchKind, callback: WatchCallback) -> Watch:
        """Register a persistent watch; it is armed when this returns.

        `callback(WatchEvent)` runs in this store's event loop after every change (changes
        may coalesce into one call), until `Watch.cancel()` or `close()`.
        """
        self._check_open()
        if not isinstance(kind, WatchKind):
            raise BadRequest(f"not a WatchKind: {kind!r}")
        w = Watch(self, check_path(path), kind, callback)
        await self._add_watch(w)
        return w

    # -- for backends --------------------------------------------------------------------

    @abc.abstractmethod
    async def _start(self) -> None: ...

    @abc.abstractmethod
    async def _close(self) -> None: ...

    @abc.abstractmethod
    async def _expire_session(self) -> None: ...

    @abc.abstractmethod
    async def _get(self, path: str) -> Versioned: ...

    @abc.abstractmethod
    async def _exists(self, path: str) -> Stat | None: ...

    @abc.abstractmethod
    async def _get_many(self, paths: list[str]) -> list[Versioned | None]: ...

    @abc.abstractmethod
    async def _create(self, op: Create, make_parents: bool) -> str: ...

    @abc.abstractmethod
    async def _children(self, path: str) -> list[str]: ...

    @abc.abstractmethod
    async def _transaction(self, ops: list[Op]) -> list[OpResult]: ...

    @abc.abstractmethod
    async def _add_watch(self, watch: Watch) -> None: ...

    @abc.abstractmethod
    def _forget_watch(self, watch: Watch) -> None: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise MetadataStoreError("metadata store not started")
        return self._loop

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataStoreError("metadata store is closed")
        if not self._started:
            raise MetadataStoreError("metadata store not started: await start() first")

    def _check_session(self) -> None:
        if self.session_lost.is_set():
            raise SessionExpired(
                f"session {self.session_id:#x} was lost; open a new store for ephemeral keys"
            )

    def _report_session_lost(self, why: str) -> None:
        """Mark the session lost (once) and tell the owner. Call in the loop."""
        if self.session_lost.is_set() or self._closed:
            return
        log.warning("metadata session %#x lost: %s", self.session_id, why)
        self.session_lost.set()
        for listener in list(self._session_listeners):
            self._run_callback(listener.callback)

    def _run_callback(self, callback: Callable[[], object]) -> None:
        """Run a user callback soon in the loop; errors are logged, never propagated.

        Safe from any thread; a no-op once the loop is gone (a late backend thread).
        """
        loop = self.loop
        if loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._invoke_callback, callback)
        except RuntimeError:  # the loop closed between the check and the call
            return

    def _invoke_callback(self, callback: Callable[[], object]) -> None:
        if self._closed:
            return
        try:
            result = callback()
        except Exception:
            log.exception("metadata callback %r failed", callback)
            return
        if inspect.isawaitable(result):
            task: asyncio.Task[object] = asyncio.ensure_future(result)
            self._callback_tasks.add(task)
            task.add_done_callback(self._callback_done)

    def _callback_done(self, task: asyncio.Task[object]) -> None:
        self._callback_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("metadata callback task failed", exc_info=task.exception())
