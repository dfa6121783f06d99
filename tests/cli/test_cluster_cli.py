"""`tally cluster init | nuke`, run for real in a subprocess against a sqlite store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tally.core.errors import ClusterNotInitialised
from tally.metadata import open_store
from tally.metadata.cluster import read_cluster, require_cluster
from tally.metadata.paths import ROOTS
from tally.ports import free_port
from tests.support.processes import tally


@pytest.fixture
def uri(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'meta.db'}"


def test_init_twice_creates_one_cluster_and_says_so(uri: str) -> None:
    first = tally("cluster", "init", "--metadata", uri)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("initialised cluster ")
    instance_id = first.stdout.split()[2]
    second = tally("cluster", "init", "--metadata", uri)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == (
        f"cluster {instance_id} already exists in {uri}; nothing changed"
    )

    async def stored_instance_id() -> str | None:
        async with open_store(uri) as store:
            info = await read_cluster(store)
            return None if info is None else info.instance_id

    assert asyncio.run(stored_instance_id()) == instance_id


def test_nuke_needs_force_then_wipes_the_cluster(uri: str) -> None:
    assert tally("cluster", "init", "--metadata", uri).returncode == 0
    refused = tally("cluster", "nuke", "--metadata", uri)
    assert refused.returncode == 1
    assert "without --force" in refused.stderr
    nuked = tally("cluster", "nuke", "--metadata", uri, "--force")
    assert nuked.returncode == 0, nuked.stderr
    assert f"deleted {len(ROOTS) + 1} keys" in nuked.stdout
    again = tally("cluster", "nuke", "--metadata", uri, "--force")
    assert again.stdout.strip() == f"no cluster in {uri}; deleted 0 leftover keys"


def test_a_bookie_facing_check_on_an_empty_store_names_the_init_command(uri: str) -> None:
    async def check() -> None:
        async with open_store(uri) as store:
            await require_cluster(store, uri=uri)

    with pytest.raises(ClusterNotInitialised, match=f"`tally cluster init --metadata {uri}`"):
        asyncio.run(check())


def test_an_unknown_scheme_is_an_error_naming_the_known_ones() -> None:
    result = tally("cluster", "init", "--metadata", "etcd://h:2379/x")
    assert result.returncode == 1
    assert "unknown metadata store scheme 'etcd'" in result.stderr
    assert "sqlite://" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreachable_zookeeper_times_out_with_a_clear_message() -> None:
    hosts = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = tally("cluster", "init", "--metadata", f"zk://{hosts}/tally", "--timeout", "1")
    assert time.monotonic() - started < 15
    assert result.returncode == 1
    assert f"no ZooKeeper server answered at {hosts} within 1.0s" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_option_is_a_usage_error() -> None:
    result = tally("cluster", "init")
    assert result.returncode == 2
    assert "--metadata" in result.stderr
