"""`sqlite:///path/meta.db`: the embedded metadata store, shared by processes on one host.

- Writes run in `BEGIN IMMEDIATE` transactions (one writer at a time, waiting up to the
  connect timeout for the lock), so every CAS check and its write are atomic across
  processes. WAL mode lets readers proceed during a write.
- A session is a lease row renewed every TTL/3 by a heartbeat task. Any process's
  heartbeat sweeps expired leases, deleting their ephemeral keys in the same transaction,
  and wakes up early for the next lease due, so a dead process's keys go within the TTL.
- Every change appends to a revision log (`changes`); watches poll it, a few dozen times
  a second and only while the store has watches. The log keeps a window of revisions;
  a watcher that falls further behind is notified for everything.
- All sqlite calls run on one worker thread per store: the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple
from typing import TypeVar

from tally.core.errors import (
    MetadataStoreError,
    NoSuchKey,
    SessionExpired,
    TallyError,
    Timeout,
)
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

log = logging.getLogger(__name__)

T = TypeVar("T")

SCHEMA_VERSION = 1
POLL_INTERVAL = 0.025
"""Seconds between two reads of the revision log while the store has watches."""
CHANGE_LOG_WINDOW = 10_000
"""Revisions kept in the log; older ones are pruned by heartbeats."""
GET_MANY_CHUNK = 500
"""Paths per query of `get_many`, well under sqlite's limit on bound parameters."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    path TEXT PRIMARY KEY,
    parent TEXT NOT NULL,
    name TEXT NOT NULL,
    data BLOB NOT NULL,
    version INTEGER NOT NULL,
    cversion INTEGER NOT NULL,
    ctime_ms INTEGER NOT NULL,
    mtime_ms INTEGER NOT NULL,
    owner INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS nodes_by_parent ON nodes (parent, name);
CREATE INDEX IF NOT EXISTS nodes_by_owner ON nodes (owner) WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS changes (
    rev INTEGER PRIMARY KEY AUTOINCREMENT,
    path TEXT NOT NULL,
    change TEXT NOT NULL
);
"""

_NODE_COLUMNS = "data, version, cversion, ctime_ms, mtime_ms, owner"


def _now_ms(now: float) -> int:
    return int(now * 1000)


class _SqlTable:
    """The `nodes` table as a NodeTable, inside the caller's transaction."""

    def __init__(self, con: sqlite3.Connection):
        self._con = con

    def node(self, path: str) -> Node | None:
        row = self._con.execute(
            f"SELECT {_NODE_COLUMNS} FROM nodes WHERE path = ?", (path,)
        ).fetchone()
        return None if row is None else Node(*row)

    def put(self, path: str, node: Node) -> None:
        parent, name = ("", "") if path == ROOT else (parent_of(path), name_of(path))
        self._con.execute(
            f"INSERT OR REPLACE INTO nodes (path, parent, name, {_NODE_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (path, parent, name, *astuple(node)),
        )

    def remove(self, path: str) -> None:
        self._con.execute("DELETE FROM nodes WHERE path = ?", (path,))

    def has_children(self, path: str) -> bool:
        row = self._con.execute("SELECT 1 FROM nodes WHERE parent = ? LIMIT 1", (path,))
        return row.fetchone() is not None


class SqliteStore(MetadataStore):
    def __init__(
        self,
        path: str,
        *,
        session_timeout: float,
        connect_timeout: float,
        poll_interval: float = POLL_INTERVAL,
    ):
        super().__init__(session_timeout=session_timeout, connect_timeout=connect_timeout)
        self.path = path
        self._poll_interval = poll_interval
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tally-sqlite")
        self._con: sqlite3.Connection | None = None
        self._session_id = 0
        self._lease_until = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._watches: dict[tuple[str, WatchKind], dict[Watch, int]] = defaultdict(dict)
        self._cursor: int | None = None
        self._wake = asyncio.Event()

    @property
    def session_id(self) -> int:
        return self._session_id

    # -- worker-thread plumbing ----------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        """Run `fn(*args)` on the worker thread, turning sqlite errors into tally's."""
        return await self.loop.run_in_executor(self._executor, self._guarded, fn, args)

    def _guarded(self, fn: Callable[..., T], args: tuple[object, ...]) -> T:
        try:
            return fn(*args)
        except sqlite3.OperationalError as e:
            if "locked" in str(e) or "busy" in str(e):
                raise Timeout(
                    f"sqlite metadata store {self.path} stayed locked for more than "
                    f"{self.connect_timeout}s: {e}"
                ) from e
            raise MetadataStoreError(f"sqlite metadata store {self.path}: {e}") from e
        except sqlite3.Error as e:
            raise MetadataStoreError(f"sqlite metadata store {self.path}: {e}") from e

    @property
    def _db(self) -> sqlite3.Connection:
        assert self._con is not None, "sqlite store used before start()"
        return self._con

    def _in_write(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(connection, *args)` in BEGIN IMMEDIATE ... COMMIT; an error rolls it all back."""
        con = self._db
        con.execute("BEGIN IMMEDIATE")
        try:
            result = fn(con, *args)
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:  # sqlite may have rolled back already (e.g. disk full)
                con.execute("ROLLBACK")
            raise
        return result

    @staticmethod
    def _log(con: sqlite3.Connection, changes: list[tuple[str, Change]]) -> None:
        con.executemany(
            "INSERT INTO changes (path, change) VALUES (?, ?)",
            [(path, change.value) for path, change in changes],
        )

    # -- sessions ------------------------------------------------------------------------

    async def _start(self) -> None:
        try:
            self._session_id = await self._run(self._open)
        except BaseException:
            await self._run(self._disconnect)
            self._executor.shutdown(wait=False)
            raise
        self._tasks.append(asyncio.create_task(self._heartbeat_loop()))

    def _open(self) -> int:
        con = sqlite3.connect(self.path, timeout=self.connect_timeout, isolation_level=None)
        self._con = con
        con.execute("PRAGMA journal_mode = WAL")
        con.execute("PRAGMA synchronous = FULL")

        def setup(con: sqlite3.Connection) -> int:
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise MetadataStoreError(
                    f"sqlite metadata store {self.path} has schema version {version}, "
                    f"this tally knows {SCHEMA_VERSION}"
                )
            for statement in _SCHEMA.split(";"):
                con.execute(statement)
            con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            now = time.time()
            table = _SqlTable(con)
            if table.node(ROOT) is None:
                table.put(ROOT, root_node(_now_ms(now)))
            self._sweep(con, now)
            self._lease_until = now + self.session_timeout
            cursor = con.execute(
                "INSERT INTO sessions (expires_at) VALUES (?)", (self._lease_until,)
            )
            assert cursor.lastrowid is not None
            return cursor.lastrowid

        return self._in_write(setup)

    def _disconnect(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    async def _close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._watches.clear()
        try:
            await self._run(self._in_write, self._end_session)
        finally:
            await self._run(self._disconnect)
            self._executor.shutdown(wait=False)

    def _end_session(self, con: sqlite3.Connection) -> None:
        self._drop_session(con, self._session_id)

    def _drop_session(self, con: sqlite3.Connection, session: int) -> None:
        rows = con.execute("SELECT path FROM nodes WHERE owner = ?", (session,)).fetchall()
        paths = [path for (path,) in rows]
        self._log(con, delete_ephemerals(_SqlTable(con), paths, session))
        con.execute("DELETE FROM sessions WHERE id = ?", (session,))

    def _sweep(self, con: sqlite3.Connection, now: float) -> None:
        """End every session whose lease ran out (this one's included).

        Ephemeral keys whose session row is missing altogether (removed by hand) go too.
        """
        expired = con.execute(
            "SELECT id FROM sessions WHERE expires_at < ? UNION "
            "SELECT DISTINCT owner FROM nodes WHERE owner IS NOT NULL "
            "AND owner NOT IN (SELECT id FROM sessions)",
            (now,),
        ).fetchall()
        for (session,) in expired:
            self._drop_session(con, session)

    def _renew(self, con: sqlite3.Connection, keep: bool) -> tuple[bool, float | None]:
        """Sweep, renew this lease (when `keep`), prune the log.

        Returns whether this session is alive and when the next other lease is due.
        """
        now = time.time()
        if not keep:
            self._drop_session(con, self._session_id)
        self._sweep(con, now)
        alive = False
        if keep:
            renewed = con.execute(
                "UPDATE sessions SET expires_at = ? WHERE id = ?",
                (now + self.session_timeout, self._session_id),
            )
            alive = renewed.rowcount == 1
            if alive:
                self._lease_until = now + self.session_timeout
        (next_due,) = con.execute(
            "SELECT min(expires_at) FROM sessions WHERE id != ?", (self._session_id,)
        ).fetchone()
        con.execute(
            "DELETE FROM changes WHERE rev <= (SELECT max(rev) FROM changes) - ?",
            (CHANGE_LOG_WINDOW,),
        )
        return alive, next_due

    async def _heartbeat_loop(self) -> None:
        interval = self.session_timeout / 3
        delay = interval
        while True:
            await asyncio.sleep(delay)
            delay = interval
            keep = not self.session_lost.is_set()
            try:
                alive, next_due = await self._run(self._in_write, self._renew, keep)
            except TallyError as e:
                log.warning("sqlite metadata store %s: lease renewal failed: %s", self.path, e)
                if time.time() >= self._lease_until:
                    self._report_session_lost(f"lease not renewed before it ran out ({e})")
                continue
            if keep and not alive:
                self._report_session_lost("lease ran out and was swept")
            self._wake.set()
            if next_due is not None:
                delay = min(interval, max(0.0, next_due - time.time()) + 0.005)

    async def _expire_session(self) -> None:
        def expire(con: sqlite3.Connection) -> None:
            con.execute("UPDATE sessions SET expires_at = 0 WHERE id = ?", (self._session_id,))
            self._sweep(con, time.time())

        await self._run(self._in_write, expire)
        self._wake.set()
        self._report_session_lost("expired by expire_session()")

    # -- operations ----------------------------------------------------------------------

    async def _get(self, path: str) -> Versioned:
        node = await self._run(self._read_node, path)
        if node is None:
            raise NoSuchKey(f"no metadata key at {path}")
        return Versioned(node.data, node.stat())

    async def _exists(self, path: str) -> Stat | None:
        node = await self._run(self._read_node, path)
        return None if node is None else node.stat()

    def _read_node(self, path: str) -> Node | None:
        return _SqlTable(self._db).node(path)

    async def _get_many(self, paths: list[str]) -> list[Versioned | None]:
        nodes = await self._run(self._read_nodes, paths)
        return [None if node is None else Versioned(node.data, node.stat()) for node in nodes]

    def _read_nodes(self, paths: list[str]) -> list[Node | None]:
        """The nodes at `paths`, a query per GET_MANY_CHUNK of them, in one read snapshot."""
        con = self._db
        found: dict[str, Node] = {}
        con.execute("BEGIN")
        try:
            for start in range(0, len(paths), GET_MANY_CHUNK):
                chunk = paths[start : start + GET_MANY_CHUNK]
                rows = con.execute(
                    f"SELECT path, {_NODE_COLUMNS} FROM nodes "
                    f"WHERE path IN ({', '.join('?' * len(chunk))})",
                    chunk,
                )
                for path, *columns in rows:
                    found[path] = Node(*columns)
        finally:
            con.execute("COMMIT")
        return [found.get(path) for path in paths]

    async def _children(self, path: str) -> list[str]:
        return await self._run(self._read_children, path)

    def _read_children(self, path: str) -> list[str]:
        con = self._db
        con.execute("BEGIN")
        try:
            if _SqlTable(con).node(path) is None:
                raise NoSuchKey(f"no metadata key at {path}")
            rows = con.execute("SELECT name FROM nodes WHERE parent = ?", (path,)).fetchall()
        finally:
            con.execute("COMMIT")
        return [name for (name,) in rows]

    async def _create(self, op: Create, make_parents: bool) -> str:
        result = (await self._write([op], make_parents))[-1]
        assert isinstance(result, str)
        return result

    async def _transaction(self, ops: list[Op]) -> list[OpResult]:
        return await self._write(ops, False)

    async def _write(self, ops: list[Op], make_parents: bool) -> list[OpResult]:
        try:
            results: list[OpResult] = await self._run(
                self._in_write, self._apply, ops, make_parents
            )
        except SessionExpired as e:
            self._report_session_lost(str(e))
            raise
        self._wake.set()
        return results

    def _apply(self, con: sqlite3.Connection, ops: list[Op], make_parents: bool) -> list[OpResult]:
        now = time.time()
        table = _SqlTable(con)
        if any(isinstance(op, Create) and op.ephemeral for op in ops):
            row = con.execute(
                "SELECT expires_at FROM sessions WHERE id = ?", (self._session_id,)
            ).fetchone()
            if row is None or row[0] < now:
                raise SessionExpired(
                    f"session {self._session_id:#x} of {self.path} expired; "
                    "its ephemeral keys are gone"
                )
        if make_parents:
            (create,) = ops
            assert isinstance(create, Create)
            ops = [*with_parents(table, create)]
        results, changes = apply_ops(table, ops, session_id=self._session_id, now_ms=_now_ms(now))
        self._log(con, changes)
        return results

    # -- watches -------------------------------------------------------------------------

    def _current_rev(self) -> int:
        row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'changes'").fetchone()
        return 0 if row is None else int(row[0])

    async def _add_watch(self, watch: Watch) -> None:
        since = await self._run(self._current_rev)
        self._watches[(watch.path, watch.kind)][watch] = since
        if self._cursor is None:
            self._cursor = since
            self._tasks.append(asyncio.create_task(self._poll_loop()))

    def _forget_watch(self, watch: Watch) -> None:
        self._watches[(watch.path, watch.kind)].pop(watch, None)

    def _read_changes(self, after: int) -> list[tuple[int, str, str]]:
        return self._db.execute(
            "SELECT rev, path, change FROM changes WHERE rev > ? ORDER BY rev LIMIT ?",
            (after, CHANGE_LOG_WINDOW),
        ).fetchall()

    async def _poll_loop(self) -> None:
        while True:
            # Not wait_for: on 3.11 it can swallow a cancel that lands with a wake-up, and
            # close() would then wait for this loop forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval):
                    await self._wake.wait()
            self._wake.clear()
            assert self._cursor is not None
            try:
                rows = await self._run(self._read_changes, self._cursor)
            except TallyError as e:
                log.warning("sqlite metadata store %s: reading changes failed: %s", self.path, e)
                continue
            if rows:
                self._dispatch(rows, pruned=rows[0][0] != self._cursor + 1)
                self._cursor = rows[-1][0]
                if len(rows) == CHANGE_LOG_WINDOW:
                    self._wake.set()

    def _dispatch(self, rows: list[tuple[int, str, str]], pruned: bool) -> None:
        """Notify each watch once for the rows it has not seen; all of them when `pruned`."""
        latest: dict[tuple[str, WatchKind], int] = {}
        for rev, path, change in rows:
            for target in watch_targets(path, Change(change)):
                latest[target] = rev
        for target, watches in self._watches.items():
            last = latest.get(target)
            for watch, since in list(watches.items()):
                if pruned or (last is not None and last > since):
                    watch.notify()
