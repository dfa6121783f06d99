"""The one suite every metadata store backend must pass: memory, sqlite and ZooKeeper."""

from __future__ import annotations

import asyncio
import re

import pytest

from tally.core.errors import (
    BadRequest,
    KeyExists,
    MetadataStoreError,
    MetadataVersionConflict,
    NoSuchKey,
    NotEmpty,
    SessionExpired,
)
from tally.metadata import (
    CheckVersion,
    Create,
    Delete,
    SetData,
    Stat,
    WatchEvent,
    WatchKind,
)
from tests.metadata.conftest import Backend
from tests.metadata.support import Recorder, settled
from tests.support.polling import until

# -- keys, values, versions --------------------------------------------------------------


async def test_create_then_get_returns_data_at_version_zero(backend: Backend) -> None:
    async with backend.open() as store:
        assert await store.create("/a", b"hello") == "/a"
        got = await store.get("/a")
        assert got.data == b"hello"
        assert got.version == 0
        assert got.stat.ephemeral_owner is None
        assert got.stat.ctime_ms == got.stat.mtime_ms > 0
        assert await store.exists("/a") == got.stat
        assert await store.exists("/missing") is None
        with pytest.raises(NoSuchKey):
            await store.get("/missing")


async def test_empty_and_binary_values_round_trip(backend: Backend) -> None:
    value = bytes(range(256)) * 4
    async with backend.open() as store:
        await store.create("/empty")
        await store.create("/binary", value)
        assert (await store.get("/empty")).data == b""
        assert (await store.get("/binary")).data == value


async def test_get_many_reads_each_key_in_order_with_none_where_absent(
    backend: Backend,
) -> None:
    async with backend.open() as store:
        assert await store.get_many([]) == []
        await store.create("/m")
        paths = [f"/m/k{i:04d}" for i in range(1200)]  # more than one sqlite chunk
        for path in paths[::2]:
            await store.create(path, path.encode())
        await store.set(paths[0], b"changed")
        wanted = ["/missing", paths[0], *reversed(paths), paths[0], "/"]
        got = await store.get_many(wanted)
        assert len(got) == len(wanted)
        assert got[0] is None
        for path, value in zip(wanted[1:-1], got[1:-1], strict=True):
            if path in paths[::2]:
                assert value == await store.get(path)
            else:
                assert value is None
        assert got[1] is not None
        assert (got[1].data, got[1].version) == (b"changed", 1)
        assert got[-1] is not None


async def test_get_many_refuses_bad_paths_before_reading(backend: Backend) -> None:
    async with backend.open() as store:
        with pytest.raises(BadRequest, match="metadata path"):
            await store.get_many(["/ok", "relative"])
        with pytest.raises(BadRequest, match="sequence of paths"):
            await store.get_many("/a")


async def test_create_existing_key_raises_key_exists(backend: Backend) -> None:
    async with backend.open() as store:
        await store.create("/a", b"first")
        with pytest.raises(KeyExists):
            await store.create("/a", b"second")
        with pytest.raises(KeyExists):
            await store.create("/")
        assert (await store.get("/a")).data == b"first"


async def test_create_needs_parent_unless_make_parents(backend: Backend) -> None:
    async with backend.open() as store:
        with pytest.raises(NoSuchKey):
            await store.create("/x/y/z", b"v")
        assert await store.exists("/x") is None
        assert await store.create("/x/y/z", b"v", make_parents=True) == "/x/y/z"
        assert (await store.get("/x")).data == b""
        assert (await store.get("/x/y")).stat.ephemeral_owner is None
        assert (await store.get("/x/y/z")).data == b"v"
        assert await store.create("/x/y/w", make_parents=True) == "/x/y/w"
        with pytest.raises(KeyExists):
            await store.create("/x/y/z", make_parents=True)


async def test_set_is_a_compare_and_set_on_the_version(backend: Backend) -> None:
    async with backend.open() as store:
        await store.create("/k", b"v0")
        stat = await store.set("/k", b"v1", expected_version=0)
        assert stat.version == 1
        assert (await store.get("/k")).version == 1
        with pytest.raises(MetadataVersionConflict):
            await store.set("/k", b"stale", expected_version=0)
        assert (await store.get("/k")).data == b"v1"
        assert (await store.set("/k", b"v2")).version == 2
        got = await store.get("/k")
        assert (got.data, got.version) == (b"v2", 2)
        assert got.stat.mtime_ms >= got.stat.ctime_ms
        with pytest.raises(NoSuchKey):
            await store.set("/nope", b"x")
        with pytest.raises(NoSuchKey):
            await store.set("/nope", b"x", expected_version=0)


async def test_delete_checks_version_and_children(backend: Backend) -> None:
    async with backend.open() as store:
        await store.create("/p", b"")
        await store.create("/p/c", b"")
        with pytest.raises(NotEmpty):
            await store.delete("/p")
        with pytest.raises(MetadataVersionConflict):
            await store.delete("/p/c", expected_version=3)
        await store.delete("/p/c", expected_version=0)
        await store.delete("/p")
        assert await store.exists("/p") is None
        with pytest.raises(NoSuchKey):
            await store.delete("/p")
        with pytest.raises(BadRequest):
            await store.delete("/")


async def test_children_are_sorted_names(backend: Backend) -> None:
    async with backend.open() as store:
        assert await store.children("/") == []
        await store.create("/d")
        for name in ["b", "a", "c10", "c2", "Z"]:
            await store.create(f"/d/{name}")
        await store.create("/d/a/deeper")
        assert await store.children("/d") == ["Z", "a", "b", "c10", "c2"]
        assert await store.children("/d/b") == []
        assert await store.children("/") == ["d"]
        with pytest.raises(NoSuchKey):
            await store.children("/nope")


async def test_sequential_names_take_a_ten_digit_increasing_suffix(backend: Backend) -> None:
    async with backend.open() as store:
        await store.create("/q")
        created = [await store.create("/q/item-", b"x", sequential=True) for _ in range(5)]
        await store.create("/q/other")
        created.append(await store.create("/q/item-", sequential=True))
        for path in created:
            assert re.fullmatch(r"/q/item-\d{10}", path), path
        suffixes = [int(path[-10:]) for path in created]
        assert suffixes == sorted(set(suffixes))
        assert await store.children("/q") == sorted(
            [p.rsplit("/", 1)[1] for p in created] + ["other"]
        )
        assert (await store.get(created[0])).data == b"x"


async def test_ephemeral_key_belongs_to_the_session_and_dies_with_it(backend: Backend) -> None:
    async with backend.open() as owner, backend.open() as other:
        assert owner.session_id != other.session_id
        await owner.create("/members", b"")
        path = await owner.create("/members/me", b"up", ephemeral=True)
        stat = await other.exists(path)
        assert stat is not None
        assert stat.ephemeral_owner == owner.session_id
        with pytest.raises(BadRequest):
            await owner.create("/members/me/child")
        await owner.close()
        assert await other.exists(path) is None
        assert await other.exists("/members") is not None


async def test_sequential_ephemeral(backend: Backend) -> None:
    async with backend.open() as store:
        path = await store.create("/lock-", ephemeral=True, sequential=True)
        assert re.fullmatch(r"/lock-\d{10}", path)
        stat = await store.exists(path)
        assert stat is not None
        assert stat.ephemeral_owner == store.session_id


# -- transactions ------------------------------------------------------------------------


async def test_transaction_applies_all_ops_in_order(backend: Backend) -> None:
    async with backend.open() as store:
        await store.create("/t", b"0")
        await store.create("/gone")
        results = await store.transaction(
            [
                CheckVersion("/t", 0),
                Create("/t/a", b"a"),
                Create("/t/a/b", b"b"),
                SetData("/t", b"1", expected_version=0),
                SetData("/t", b"2", expected_version=1),
                Create("/t/s-", sequential=True),
                Delete("/gone", expected_version=0),
            ]
        )
        assert results[:3] == [None, "/t/a", "/t/a/b"]
        assert isinstance(results[3], Stat)
        assert results[3].version == 1
        assert isinstance(results[4], Stat)
        assert results[4].version == 2
        assert isinstance(results[5], str)
        assert re.fullmatch(r"/t/s-\d{10}", results[5])
        assert results[6] is None
        assert (await store.get("/t")).data == b"2"
        assert await store.exists("/gone") is None
        assert await store.transaction([]) == []


@pytest.mark.parametrize(
    ("failing_op", "error"),
    [
        (Create("/exists"), KeyExists),
        (Create("/no/parent"), NoSuchKey),
        (SetData("/exists", b"x", expected_version=7), MetadataVersionConflict),
        (SetData("/missing", b"x"), NoSuchKey),
        (CheckVersion("/exists", 0), MetadataVersionConflict),  # stale after the SetData
        (Delete("/parent"), NotEmpty),
        (Delete("/missing"), NoSuchKey),
    ],
)
async def test_failed_transaction_raises_first_error_and_changes_nothing(
    backend: Backend, failing_op: object, error: type[Exception]
) -> None:
    async with backend.open() as store:
        await store.create("/exists", b"orig")
        await store.create("/parent")
        await store.create("/parent/child")
        before = await store.get("/exists")
        with pytest.raises(error):
            await store.transaction(
                [
                    Create("/new", b"n"),
                    SetData("/exists", b"changed", expected_version=0),
                    failing_op,  # type: ignore[list-item]
                    Delete("/parent/child"),
                ]
            )
        assert await store.exists("/new") is None
        assert await store.get("/exists") == before
        assert await store.children("/parent") == ["child"]


async def test_failed_transaction_reports_the_first_failing_op(backend: Backend) -> None:
    async with backend.open() as store:
        await store.create("/a")
        with pytest.raises(NoSuchKey):
            await store.transaction([Delete("/missing"), Create("/a")])
        with pytest.raises(KeyExists):
            await store.transaction([Create("/a"), Delete("/missing")])


# -- watches -----------------------------------------------------------------------------


async def test_data_watch_fires_on_create_set_and_delete(backend: Backend) -> None:
    async with backend.open() as store, backend.open() as writer:
        seen = Recorder()
        watch = await store.watch("/w", WatchKind.DATA, seen)
        await writer.create("/w", b"0")
        await seen.wait_for(1)
        await writer.set("/w", b"1")
        await seen.wait_for(2)
        await writer.delete("/w")
        await seen.wait_for(3)
        assert set(seen.events) == {WatchEvent("/w", WatchKind.DATA)}
        watch.cancel()
        await writer.create("/w")
        await settled(store, writer)
        assert len(seen.events) == 3


async def test_exists_watch_fires_on_create_and_delete_only(backend: Backend) -> None:
    async with backend.open() as store, backend.open() as writer:
        seen = Recorder()
        await store.watch("/e", WatchKind.EXISTS, seen)
        await writer.create("/e", b"")
        await seen.wait_for(1)
        await writer.set("/e", b"not an existence change")
        await settled(store, writer)
        assert len(seen.events) == 1
        await writer.delete("/e")
        await seen.wait_for(2)
        assert set(seen.events) == {WatchEvent("/e", WatchKind.EXISTS)}


async def test_children_watch_fires_on_child_add_and_remove(backend: Backend) -> None:
    async with backend.open() as store, backend.open() as writer:
        await writer.create("/c")
        seen = Recorder()
        await store.watch("/c", WatchKind.CHILDREN, seen)
        await writer.create("/c/one")
        await seen.wait_for(1)
        await writer.set("/c/one", b"a child's data is not the child list")
        await writer.set("/c", b"nor is the parent's own data")
        await writer.create("/c/one/grandchild")
        await settled(store, writer)
        assert len(seen.events) == 1
        await writer.delete("/c/one/grandchild")
        await writer.delete("/c/one")
        await seen.wait_for(2)
        assert set(seen.events) == {WatchEvent("/c", WatchKind.CHILDREN)}


async def test_children_watch_on_a_missing_key_fires_when_it_appears(backend: Backend) -> None:
    async with backend.open() as store, backend.open() as writer:
        seen = Recorder()
        await store.watch("/later", WatchKind.CHILDREN, seen)
        await writer.create("/later")
        await seen.wait_for(1)
        await writer.create("/later/kid")
        await seen.wait_for(2)
        assert await store.children("/later") == ["kid"]


async def test_own_changes_fire_own_watches(backend: Backend) -> None:
    async with backend.open() as store:
        seen = Recorder()
        await store.watch("/mine", WatchKind.DATA, seen)
        await store.create("/mine")
        await seen.wait_for(1)


async def test_a_notification_always_follows_the_last_change(backend: Backend) -> None:
    """Notifications may coalesce, but a consumer that re-reads sees the final value."""
    async with backend.open() as store, backend.open() as writer:
        await writer.create("/n", b"0")
        latest: list[bytes] = []

        async def reread(_: WatchEvent) -> None:
            latest.append((await store.get("/n")).data)

        await store.watch("/n", WatchKind.DATA, reread)
        for i in range(1, 31):
            await writer.set("/n", str(i).encode())

        async def caught_up() -> bool:
            return bool(latest) and latest[-1] == b"30"

        await until(caught_up)
        assert 1 <= len(latest) <= 30


async def test_ephemeral_loss_fires_watches_of_other_sessions(backend: Backend) -> None:
    async with backend.open() as watcher:
        owner = backend.open()
        await owner.start()
        await owner.create("/eph", ephemeral=True)
        gone = Recorder()
        parent = Recorder()
        await watcher.watch("/eph", WatchKind.EXISTS, gone)
        await watcher.watch("/", WatchKind.CHILDREN, parent)
        await owner.close()
        await gone.wait_for(1)
        await parent.wait_for(1)
        assert await watcher.exists("/eph") is None


async def test_failing_callbacks_do_not_stop_other_watches(backend: Backend) -> None:
    async with backend.open() as store:

        def broken(_: WatchEvent) -> None:
            raise RuntimeError("consumer bug")

        seen = Recorder()
        await store.watch("/f", WatchKind.DATA, broken)
        await store.watch("/f", WatchKind.DATA, seen)
        await store.create("/f")
        await seen.wait_for(1)
        await store.set("/f", b"again")
        await seen.wait_for(2)


# -- sessions ----------------------------------------------------------------------------


async def test_session_loss_is_reported_and_ephemerals_vanish(backend: Backend) -> None:
    async with backend.open() as store, backend.open() as other:
        await store.create("/reg", ephemeral=True)
        lost = asyncio.Event()
        store.on_session_lost(lost.set)
        assert not store.session_lost.is_set()

        await store.expire_session()

        await asyncio.wait_for(lost.wait(), 10)
        assert store.session_lost.is_set()
        assert await other.exists("/reg") is None
        with pytest.raises(SessionExpired):
            await store.create("/again", ephemeral=True)
        with pytest.raises(SessionExpired):
            await store.transaction([Create("/again", ephemeral=True)])
        assert await store.create("/persistent", b"p") == "/persistent"
        assert (await other.get("/persistent")).data == b"p"
        late = asyncio.Event()
        store.on_session_lost(late.set)
        await asyncio.wait_for(late.wait(), 5)


async def test_session_listener_can_be_cancelled(backend: Backend) -> None:
    async with backend.open() as store:
        called: list[int] = []
        listener = store.on_session_lost(lambda: called.append(1))
        kept = asyncio.Event()
        store.on_session_lost(kept.set)
        listener.cancel()
        await store.expire_session()
        await asyncio.wait_for(kept.wait(), 10)
        # The listeners' calls are all scheduled at once, so by the time `kept` wakes this
        # test, the cancelled one would have run too.
        assert called == []


# -- bad input ---------------------------------------------------------------------------

BAD_PATHS = ["", "a", "a/b", "/a/", "//a", "/a//b", "/a/./b", "/a/../b", "/..", "/a\x00b", "/\x7f"]


@pytest.mark.parametrize("path", BAD_PATHS)
async def test_invalid_paths_are_bad_requests(backend: Backend, path: str) -> None:
    async with backend.open() as store:
        for attempt in (
            store.get(path),
            store.exists(path),
            store.create(path),
            store.set(path, b""),
            store.delete(path),
            store.children(path),
            store.transaction([SetData(path, b"")]),
            store.watch(path, WatchKind.DATA, lambda e: None),
        ):
            with pytest.raises(BadRequest, match="metadata path"):
                await attempt


async def test_bad_arguments_are_bad_requests(backend: Backend) -> None:
    async with backend.open() as store:
        await store.create("/k")
        with pytest.raises(BadRequest, match="bytes"):
            await store.create("/s", "text")  # type: ignore[arg-type]
        with pytest.raises(BadRequest, match="bytes"):
            await store.set("/k", bytearray(b"x"))  # type: ignore[arg-type]
        with pytest.raises(BadRequest, match="expected_version"):
            await store.set("/k", b"x", expected_version=-1)
        with pytest.raises(BadRequest, match="expected_version"):
            await store.delete("/k", expected_version=True)
        with pytest.raises(BadRequest, match="not a metadata transaction op"):
            await store.transaction([("create", "/x")])  # type: ignore[list-item]
        with pytest.raises(BadRequest, match="WatchKind"):
            await store.watch("/k", "data", lambda e: None)  # type: ignore[arg-type]
        with pytest.raises(BadRequest, match="str"):
            await store.get(b"/k")  # type: ignore[arg-type]
        assert (await store.get("/k")).version == 0
        assert await store.exists("/s") is None


async def test_a_closed_store_refuses_operations(backend: Backend) -> None:
    store = backend.open()
    with pytest.raises(MetadataStoreError, match="not started"):
        await store.get("/")
    await store.start()
    await store.create("/x")
    await store.close()
    await store.close()
    with pytest.raises(MetadataStoreError, match="closed"):
        await store.get("/x")
    async with backend.open() as again:
        assert await again.exists("/x") is not None
