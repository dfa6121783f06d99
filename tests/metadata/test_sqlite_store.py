"""The sqlite backend's own machinery: leases, the lock, the revision log, bad files."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from tally.core.errors import MetadataStoreError, SessionExpired, Timeout
from tally.metadata import WatchKind, open_store
from tally.metadata import sqlite as sqlite_backend
from tally.metadata.sqlite import SqliteStore
from tests.metadata.support import Recorder
from tests.support.polling import until


def uri(path: Path) -> str:
    return f"sqlite://{path}"


def lease_expiry(db: Path, session_id: int) -> float:
    with sqlite3.connect(db) as raw:
        (expires_at,) = raw.execute(
            "SELECT expires_at FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
    return float(expires_at)


async def test_heartbeats_keep_a_lease_alive_past_its_ttl(tmp_path: Path) -> None:
    db = tmp_path / "meta.db"
    async with open_store(uri(db), session_timeout=0.5) as store, open_store(uri(db)) as other:
        await store.create("/eph", ephemeral=True)
        first = lease_expiry(db, store.session_id)
        # Renewed until the lease now runs past three of its first TTLs: the session lived
        # on by heartbeats alone, and the other session's sweeps left it be.
        await until(lambda: lease_expiry(db, store.session_id) > first + 1.0, "renewals")
        assert not store.session_lost.is_set()
        assert await other.exists("/eph") is not None


async def test_a_lease_removed_behind_the_store_s_back_is_reported_lost(tmp_path: Path) -> None:
    db = tmp_path / "meta.db"
    async with open_store(uri(db), session_timeout=0.6) as store, open_store(uri(db)) as other:
        await store.create("/eph", ephemeral=True)
        with sqlite3.connect(db) as raw:
            raw.execute("DELETE FROM sessions WHERE id = ?", (store.session_id,))
        await asyncio.wait_for(store.session_lost.wait(), 2)
        assert await other.exists("/eph") is None
        with pytest.raises(SessionExpired):
            await store.create("/eph", ephemeral=True)


async def test_an_expired_lease_refuses_ephemerals_even_before_the_heartbeat(
    tmp_path: Path,
) -> None:
    db = tmp_path / "meta.db"
    async with open_store(uri(db), session_timeout=30) as store:
        with sqlite3.connect(db) as raw:
            raw.execute("UPDATE sessions SET expires_at = 0 WHERE id = ?", (store.session_id,))
        with pytest.raises(SessionExpired):
            await store.create("/eph", ephemeral=True)
        assert store.session_lost.is_set()


async def test_a_held_write_lock_makes_writes_time_out_then_succeed(tmp_path: Path) -> None:
    db = tmp_path / "meta.db"
    async with open_store(uri(db), connect_timeout=0.3) as store:
        await store.create("/k")
        raw = sqlite3.connect(db, isolation_level=None)
        raw.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(Timeout, match="locked"):
                await store.set("/k", b"blocked")
            assert (await store.get("/k")).data == b"", "readers are not blocked (WAL)"
        finally:
            raw.execute("ROLLBACK")
            raw.close()
        assert (await store.set("/k", b"free")).version == 1


async def test_a_watcher_behind_the_pruned_log_is_notified_for_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_backend, "CHANGE_LOG_WINDOW", 5)
    path = str(tmp_path / "meta.db")
    laggard = SqliteStore(path, session_timeout=30, connect_timeout=5, poll_interval=1.0)
    async with laggard, open_store(uri(Path(path)), session_timeout=0.3) as writer:
        watched = Recorder()
        untouched = Recorder()
        await laggard.watch("/x", WatchKind.DATA, watched)
        await laggard.watch("/never-changed", WatchKind.EXISTS, untouched)
        await writer.create("/x")
        await writer.create("/y")
        for i in range(20):
            await writer.set("/y", str(i).encode())

        def pruned() -> bool:  # the writer's heartbeat prunes the log to its window
            with sqlite3.connect(path) as raw:
                (kept,) = raw.execute("SELECT count(*) FROM changes").fetchone()
            return bool(kept <= 5)

        await until(pruned, "the change log pruned to its window")
        await watched.wait_for(1, timeout=3)
        await untouched.wait_for(1, timeout=3)


async def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "meta.db"
    db.write_bytes(b"certainly not sqlite " * 100)
    with pytest.raises(MetadataStoreError, match=str(db)):
        async with open_store(uri(db)):
            pass


async def test_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "no" / "such" / "dir" / "meta.db"
    with pytest.raises(MetadataStoreError, match=str(db)):
        async with open_store(uri(db)):
            pass


async def test_a_database_from_a_newer_tally_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "meta.db"
    with sqlite3.connect(db) as raw:
        raw.execute("PRAGMA user_version = 99")
    with pytest.raises(MetadataStoreError, match="schema version 99"):
        async with open_store(uri(db)):
            pass


async def test_data_survives_reopening(tmp_path: Path) -> None:
    db = tmp_path / "meta.db"
    async with open_store(uri(db)) as store:
        await store.create("/kept", b"v")
        await store.create("/eph", ephemeral=True)
    async with open_store(uri(db)) as store:
        assert (await store.get("/kept")).data == b"v"
        assert await store.exists("/eph") is None
