"""A bookie's identity and what it keeps across restarts, with real processes.

Cookies and incarnations (BP-31): the first start formats the bookie; wiped disks under
the same id, another cluster's store and changed directories are refused with what differs.
What a reply promised survives a SIGKILL right after it: the fence, the master key, the
entries, the explicit LAC. An entry whose bytes rotted on disk is EntryCorrupt (an
EntryUnreadable: its copy is marked corrupt), never NoSuchEntry (seed 003).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tally.bookie.cookie_check import COOKIE_FILE
from tally.chaos.disks import fill, small_filesystem
from tally.core.errors import EntryUnreadable, LedgerFenced, NoSuchEntry, Unauthorized
from tally.metadata.cluster import read_cluster
from tally.metadata.cookies import Cookie, CookieManager
from tests.bookie.conftest import (
    KEY,
    OTHER_KEY,
    BookieUnderTest,
    connected,
    entry,
    new_ledger,
    registration_of,
    running,
    sample,
    store_session,
)
from tests.support.processes import init_cluster


def disk_cookies(bookie: BookieUnderTest) -> dict[str, bytes]:
    return {
        name: (bookie.data_dir / name / COOKIE_FILE).read_bytes()
        for name in ("journal", "ledgers")
        if (bookie.data_dir / name / COOKIE_FILE).exists()
    }


async def stored_cookie(uri: str, bookie_id: str) -> Cookie | None:
    async with store_session(uri) as store:
        found = await CookieManager(store).get(bookie_id)
    return None if found is None else found.cookie


# --- cookies --------------------------------------------------------------------------------


async def test_the_first_start_formats_and_a_restart_keeps_the_incarnation(
    cluster: str, tmp_path: Path
) -> None:
    bookie = BookieUnderTest(cluster, tmp_path / "bookie")
    with running(bookie):
        cookie = await stored_cookie(cluster, bookie.address)
        assert cookie is not None
        assert cookie.bookie_id == bookie.address
        assert cookie.directories == (
            str((bookie.data_dir / "journal").resolve()),
            str((bookie.data_dir / "ledgers").resolve()),
        )
        async with store_session(cluster) as store:
            info = await read_cluster(store)
        assert info is not None
        assert cookie.instance_id == info.instance_id
        assert disk_cookies(bookie) == {"journal": cookie.to_bytes(), "ledgers": cookie.to_bytes()}
        assert await registration_of(cluster, bookie.address) == "writable"
        assert bookie.stop() == 0
        assert await registration_of(cluster, bookie.address) is None  # a clean stop leaves
        bookie.start()
        assert await stored_cookie(cluster, bookie.address) == cookie
        assert await registration_of(cluster, bookie.address) == "writable"

    # The log tells the story, naming the bookie: format, replay, registration, serving.
    log = bookie.log()
    steps = [
        f"bookie {bookie.address} formatted: incarnation {cookie.incarnation_id}",
        f"bookie {bookie.address} (incarnation {cookie.incarnation_id}): replayed",
        f"bookie {bookie.address} registered writable",
        f"bookie {bookie.address} serving on {bookie.address}",
        f"bookie {bookie.address} stopped",
    ]
    positions = [log.find(step) for step in steps]
    assert -1 not in positions, log
    assert positions == sorted(positions), log
    assert log.count("formatted") == 1, log
    assert log.count("replayed") == 2, log


async def test_wiped_disks_under_the_same_id_are_refused(cluster: str, tmp_path: Path) -> None:
    bookie = BookieUnderTest(cluster, tmp_path / "bookie")
    with running(bookie):
        async with connected(bookie.address) as connection:
            await connection.add(entry(new_ledger(), 0), KEY)
        cookie = await stored_cookie(cluster, bookie.address)
        assert bookie.stop() == 0
    for name in ("journal", "ledgers"):
        shutil.rmtree(bookie.data_dir / name)

    refused = bookie.refused_start()
    assert refused.returncode != 0
    assert cookie is not None
    for fragment in (
        f"bookie {bookie.address}",
        f"incarnation {cookie.incarnation_id}",
        "have no cookie",
        "wiped or replaced",
        "Decommission",
    ):
        assert fragment in refused.stderr, refused.stderr
    # Nothing was formatted over the loss: no new cookie anywhere, no registration.
    assert disk_cookies(bookie) == {}
    assert await stored_cookie(cluster, bookie.address) == cookie
    assert await registration_of(cluster, bookie.address) is None


async def test_a_bookie_whose_store_was_lost_says_so_and_names_the_recovery(
    tmp_path: Path,
) -> None:
    """Its directories hold a cookie, the store no cluster: the store was lost or wiped
    (issue 18); a bookie with empty directories is only told to init the cluster."""
    uri = init_cluster(tmp_path / "before")
    bookie = BookieUnderTest(uri, tmp_path / "bookie")
    with running(bookie):
        pass
    (tmp_path / "before" / "meta.db").unlink()
    refused = bookie.refused_start()
    assert refused.returncode == 2
    for fragment in ("the store was lost", "tally cluster recover", "holds no tally cluster"):
        assert fragment in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    fresh = BookieUnderTest(uri, tmp_path / "fresh").refused_start()
    assert "tally cluster init" in fresh.stderr
    assert "recover" not in fresh.stderr


async def test_a_first_start_on_a_full_disk_leaves_no_half_format(
    cluster: str, tmp_path: Path
) -> None:
    """Its cookie could not be written on the disk: the store's copy is taken back too, so
    that once the disk has room the bookie formats, rather than pass for a wiped one."""
    bookie = BookieUnderTest(cluster, tmp_path / "bookie")
    with small_filesystem(bookie.data_dir, 1 << 20, kind="tmpfs"):
        filler = fill(bookie.data_dir, leave=0)
        refused = bookie.refused_start()
        assert refused.returncode != 0
        assert "No space left" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
        assert await stored_cookie(cluster, bookie.address) is None
        assert disk_cookies(bookie) == {}
        filler.unlink()
        with running(bookie):
            assert await stored_cookie(cluster, bookie.address) is not None
            assert set(disk_cookies(bookie)) == {"journal", "ledgers"}


async def test_another_clusters_store_is_refused(
    cluster: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    bookie = BookieUnderTest(cluster, tmp_path / "bookie")
    with running(bookie):
        assert bookie.stop() == 0
    ours = await stored_cookie(cluster, bookie.address)
    other = init_cluster(tmp_path_factory.mktemp("other-cluster"))
    async with store_session(other) as store:
        info = await read_cluster(store)
    assert ours is not None
    assert info is not None
    assert info.instance_id != ours.instance_id

    bookie.metadata = other
    refused = bookie.refused_start()
    assert refused.returncode != 0
    for fragment in (
        f"bookie {bookie.address}",
        f"cluster instance {ours.instance_id}",
        f"cluster instance {info.instance_id}",
        "another cluster",
    ):
        assert fragment in refused.stderr, refused.stderr
    assert await stored_cookie(other, bookie.address) is None
    assert await registration_of(other, bookie.address) is None


async def test_changed_directories_are_refused(cluster: str, tmp_path: Path) -> None:
    bookie = BookieUnderTest(cluster, tmp_path / "bookie")
    with running(bookie):
        assert bookie.stop() == 0
    moved = tmp_path / "elsewhere" / "journal"
    bookie.settings["journal_dir"] = moved

    refused = bookie.refused_start()
    assert refused.returncode != 0
    message = refused.stderr
    assert "directories" in message, message
    assert str((bookie.data_dir / "journal").resolve()) in message, message
    assert str(moved.resolve()) in message, message
    assert "decommission" in message, message
    assert not (moved / COOKIE_FILE).exists()

    del bookie.settings["journal_dir"]  # back to the recorded layout: it starts again
    with running(bookie):
        assert await registration_of(cluster, bookie.address) == "writable"


# --- what survives a crash ------------------------------------------------------------------


async def test_a_fence_survives_a_sigkill_right_after_its_reply(
    cluster: str, tmp_path: Path
) -> None:
    ledger = new_ledger()
    entries = [entry(ledger, i) for i in range(3)]
    bookie = BookieUnderTest(cluster, tmp_path / "bookie")
    with running(bookie):
        async with connected(bookie.address) as connection:
            for data in entries:
                await connection.add(data, KEY)
            assert await connection.read(ledger, -1, fencing_key=KEY) == entries[-1]
            bookie.kill()
        bookie.start()
        async with connected(bookie.address) as connection:
            with pytest.raises(LedgerFenced):
                await connection.add(entry(ledger, 3), KEY)
            assert (await connection.ledger_info(ledger)).fenced
            for i, data in enumerate(entries):
                assert await connection.read(ledger, i) == data
            await connection.add(entry(ledger, 3, lac=2), KEY, recovery=True)
            assert await connection.read(ledger, 3) == entry(ledger, 3, lac=2)


async def test_the_master_key_and_explicit_lac_survive_a_sigkill(
    cluster: str, tmp_path: Path
) -> None:
    ledger = new_ledger()
    bookie = BookieUnderTest(cluster, tmp_path / "bookie")
    with running(bookie):
        async with connected(bookie.address) as connection:
            await connection.add(entry(ledger, 0), KEY)
            await connection.write_lac(ledger, KEY, 0)
            bookie.kill()
        bookie.start()
        async with connected(bookie.address) as connection:
            with pytest.raises(Unauthorized):
                await connection.add(entry(ledger, 1), OTHER_KEY)
            with pytest.raises(Unauthorized):
                await connection.read(ledger, 0, fencing_key=OTHER_KEY)
            assert await connection.read_lac(ledger) == 0
            assert await connection.read(ledger, 0) == entry(ledger, 0)
            await connection.add(entry(ledger, 1), KEY)


async def test_a_rotten_entry_is_unreadable_never_no_such_entry(
    cluster: str, tmp_path: Path
) -> None:
    ledger = new_ledger()
    payloads = [b"healthy entry zero", b"ROT-ME: entry one", b"healthy entry two"]
    entries = [entry(ledger, i, payload) for i, payload in enumerate(payloads)]
    bookie = BookieUnderTest(cluster, tmp_path / "bookie")
    with running(bookie):
        async with connected(bookie.address) as connection:
            for data in entries:
                await connection.add(data, KEY)
        assert bookie.stop() == 0  # the checkpoint moves the entries into an entry log
        logs = sorted((bookie.data_dir / "ledgers" / "logs").glob("*.log"))
        holding = [path for path in logs if payloads[1] in path.read_bytes()]
        assert len(holding) == 1, logs
        rotten = bytearray(holding[0].read_bytes())
        rotten[rotten.index(payloads[1]) + 3] ^= 0x20
        holding[0].write_bytes(rotten)

        bookie.start()
        async with connected(bookie.address) as connection:
            for reader in (
                connection.read(ledger, 1),
                connection.read(ledger, 1, fencing_key=KEY),
            ):
                with pytest.raises(EntryUnreadable, match="corrupt"):
                    await reader
            assert await connection.read(ledger, 0) == entries[0]
            assert await connection.read(ledger, -1) == entries[2]
            # Marked corrupt: not servable, so availability leaves it out (the checks see it
            # lacking and repair it), while reads of it never answer NoSuchEntry.
            assert list(await connection.get_list_of_entries(ledger)) == [0, 2]
            with pytest.raises(NoSuchEntry):
                await connection.read(ledger, 3)
        metrics = bookie.metrics()
        assert sample(metrics, "bookie_ledger_storage_read_errors_total") == 2
        for operation in ("READ", "FENCE"):
            labels = {"operation": operation, "result": "EntryCorrupt"}
            assert sample(metrics, "bookie_requests_total", **labels) == 1
