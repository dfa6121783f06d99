"""Choosing a backend by URI, and what a URI or a server that cannot work gives."""

from __future__ import annotations

import time

import pytest

from tally.core.errors import BadRequest, MetadataStoreError, Timeout
from tally.metadata import open_store
from tally.metadata.memory import MemoryStore
from tally.metadata.sqlite import SqliteStore
from tally.metadata.zookeeper import ZooKeeperStore
from tests.metadata.conftest import free_port


def test_each_scheme_picks_its_backend() -> None:
    assert isinstance(open_store("memory://"), MemoryStore)
    assert isinstance(open_store("memory://name"), MemoryStore)
    assert isinstance(open_store("sqlite:///var/lib/tally/meta.db"), SqliteStore)
    zk = open_store("zk://127.0.0.1:2181,[::1]:2182,zk3/tally/ledgers")
    assert isinstance(zk, ZooKeeperStore)
    assert zk.hosts == "127.0.0.1:2181,[::1]:2182,zk3:2181"
    assert zk.chroot == "/tally/ledgers"
    assert isinstance(open_store("ZK://h:1"), ZooKeeperStore)


@pytest.mark.parametrize("uri", ["etcd://h:2379/x", "http://h/", "file:///tmp/x", "nonsense"])
def test_an_unknown_scheme_names_it_and_the_known_ones(uri: str) -> None:
    with pytest.raises(BadRequest) as caught:
        open_store(uri)
    message = str(caught.value)
    assert repr(uri.split(":")[0]) in message
    assert "memory://, sqlite://, zk://" in message


@pytest.mark.parametrize(
    "uri",
    [
        "zk:/h:1/x",
        "sqlite:relative.db",
        "sqlite://relative.db",
        "sqlite://",
        "sqlite:///",
        "memory://name/path",
        "memory://?x=1",
        "zk://",
        "zk:///chroot",
        "zk://h:port/x",
        "zk://h:99999/x",
        "zk://h:1,,h:2/x",
        "zk://h:1/bad//chroot",
        "zk://h:1/chroot/",
        "sqlite:///tmp/x.db#frag",
    ],
)
def test_malformed_uris_are_bad_requests(uri: str) -> None:
    with pytest.raises(BadRequest, match=r"URI|ZooKeeper|metadata path"):
        open_store(uri)


@pytest.mark.parametrize("timeouts", [{"session_timeout": 0}, {"connect_timeout": -1.0}])
def test_timeouts_must_be_positive(timeouts: dict[str, float]) -> None:
    with pytest.raises(BadRequest, match="must be positive"):
        open_store("memory://", **timeouts)


def test_a_uri_must_be_a_string() -> None:
    with pytest.raises(BadRequest):
        open_store(b"memory://")  # type: ignore[arg-type]


async def test_an_unreachable_zookeeper_times_out_naming_its_hosts() -> None:
    hosts = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    store = open_store(f"zk://{hosts}/x", connect_timeout=0.5)
    started = time.monotonic()
    with pytest.raises(Timeout) as caught:
        await store.start()
    assert time.monotonic() - started < 3.0
    assert hosts in str(caught.value)
    assert "0.5s" in str(caught.value)


async def test_a_store_starts_once() -> None:
    async with open_store("memory://") as store:
        with pytest.raises(BadRequest, match="already started"):
            await store.start()
    with pytest.raises(MetadataStoreError, match="closed"):
        await store.exists("/")
