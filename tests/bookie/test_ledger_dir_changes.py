"""A bookie's ledger directories changed by an operator, on real processes: a directory added
with `tally shell cookie update` moves no ledger and loses no read (seed 003, storage
expansion), and an empty directory standing for a replaced disk is brought back with the
same command, its ledgers answering "unknown" until repaired, never NoSuchEntry."""

from __future__ import annotations

from pathlib import Path

import pytest

from tally.bookie.ledger_placement import PlacementRecord
from tally.chaos.disks import check_and_mount_again, fail_read_only, small_filesystem
from tally.core.errors import LedgerInLimbo
from tally.core.ids import LedgerId
from tests.bookie.conftest import (
    KEY,
    BookieUnderTest,
    connected,
    entry,
    new_ledger,
    registration_of,
    running,
    sample,
)
from tests.support.polling import until
from tests.support.processes import tally

ENTRIES = 5


def payload(ledger_id: LedgerId, entry_id: int) -> bytes:
    return f"{ledger_id.qualified_name}/{entry_id}".encode()


async def write(address: str, ledgers: list[LedgerId]) -> None:
    async with connected(address) as connection:
        for ledger_id in ledgers:
            for entry_id in range(ENTRIES):
                await connection.add(entry(ledger_id, entry_id, payload(ledger_id, entry_id)), KEY)


async def read_back(address: str, ledgers: list[LedgerId]) -> None:
    async with connected(address) as connection:
        for ledger_id in ledgers:
            for entry_id in range(ENTRIES):
                expected = entry(ledger_id, entry_id, payload(ledger_id, entry_id))
                assert await connection.read(ledger_id, entry_id) == expected


def placements(bookie: BookieUnderTest) -> dict[LedgerId, str]:
    record = PlacementRecord(bookie.data_dir / "journal")
    try:
        return record.placements()
    finally:
        record.close()


def update_cookie(bookie: BookieUnderTest, ledger_dirs: str, *flags: str) -> tuple[int, str]:
    done = tally(
        "shell", "cookie", "update", bookie.address, "--metadata", bookie.metadata,
        "--data-dir", str(bookie.data_dir), "--ledger-dirs", ledger_dirs, *flags,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


async def test_an_added_ledger_directory_moves_nothing_and_takes_new_ledgers(
    cluster: str, tmp_path: Path
) -> None:
    a, b = (tmp_path / "disk-a").resolve(), (tmp_path / "disk-b").resolve()
    bookie = BookieUnderTest(cluster, tmp_path / "bookie", settings={"ledger_dirs": a})
    old = [new_ledger() for _ in range(6)]
    with running(bookie):
        await write(bookie.address, old)
        assert bookie.stop() == 0
    before = placements(bookie)
    assert {before[ledger_id] for ledger_id in old} == {str(a)}

    bookie.settings["ledger_dirs"] = f"{a},{b}"
    refused = bookie.refused_start()
    assert refused.returncode != 0
    assert f"tally shell cookie update {bookie.address}" in refused.stderr, refused.stderr
    code, said = update_cookie(bookie, f"{a},{b}")
    assert code == 0, said
    assert f"added {b}" in said

    newer = [new_ledger() for _ in range(4)]
    with running(bookie):
        await read_back(bookie.address, old)
        await write(bookie.address, newer)
        await read_back(bookie.address, newer)
        metrics = bookie.metrics()
        assert sample(metrics, "bookie_ledger_dir_ledgers", dir=str(a)) == len(old)
        assert sample(metrics, "bookie_ledger_dir_ledgers", dir=str(b)) == len(newer)
        assert bookie.stop() == 0
    after = placements(bookie)
    assert {ledger_id: after[ledger_id] for ledger_id in old} == {x: before[x] for x in old}
    assert {after[ledger_id] for ledger_id in newer} == {str(b)}


async def test_an_empty_directory_for_a_replaced_disk_is_brought_back_by_the_operator(
    cluster: str, tmp_path: Path
) -> None:
    a, b = (tmp_path / "disk-a").resolve(), (tmp_path / "disk-b").resolve()
    bookie = BookieUnderTest(cluster, tmp_path / "bookie", settings={"ledger_dirs": f"{a},{b}"})
    ledgers = [new_ledger() for _ in range(6)]
    with running(bookie):
        await write(bookie.address, ledgers)
        assert bookie.stop() == 0
    on_b = [x for x, directory in placements(bookie).items() if directory == str(b)]
    assert len(on_b) == 3
    for path in sorted(b.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()  # the disk died: a new, empty one

    refused = bookie.refused_start()
    assert refused.returncode != 0
    assert "--force" in refused.stderr, refused.stderr
    code, said = update_cookie(bookie, f"{a},{b}")
    assert code == 2, said
    assert "--force" in said
    code, said = update_cookie(bookie, f"{a},{b}", "--force")
    assert code == 0, said
    assert f"brought back empty {b}" in said

    with running(bookie):
        assert await registration_of(cluster, bookie.address) == "writable"
        await read_back(bookie.address, [x for x in ledgers if x not in on_b])
        async with connected(bookie.address) as connection:
            for ledger_id in on_b:
                with pytest.raises(LedgerInLimbo):
                    await connection.read(ledger_id, 0)
        assert sample(bookie.metrics(), "bookie_ledgers_in_limbo") == len(on_b)
    assert {placements(bookie)[x] for x in on_b} == {str(b)}


async def test_a_bookie_whose_only_ledger_disk_fails_serves_reads_until_an_operator_acts(
    cluster: str, tmp_path: Path
) -> None:
    """No other directory to take its ledgers: they stay, served from the read-only disk,
    and the bookie turns read-only; it starts again only once an operator, having checked
    the disk, brings the directory back with its data."""
    with small_filesystem(tmp_path / "disk", 64 << 20) as disk:
        disk = disk.resolve()
        bookie = BookieUnderTest(
            cluster,
            tmp_path / "bookie",
            settings={"ledger_dirs": disk, "disk_check_interval": 0.2, "flush_interval": 0.2},
        )
        ledgers = [new_ledger() for _ in range(3)]
        with running(bookie):
            await write(bookie.address, ledgers)
            await until(lambda: sample(bookie.metrics(), "bookie_checkpoints_total") > 0, step=0.1)
            fail_read_only(disk)

            async def failed() -> bool:
                return await registration_of(cluster, bookie.address) == "readonly"

            await until(failed, "registered read-only", step=0.1)
            assert sample(bookie.metrics(), "bookie_ledger_dir_failed", dir=str(disk)) == 1
            await read_back(bookie.address, ledgers)
            assert bookie.stop() == 0

        refused = bookie.refused_start()
        assert refused.returncode != 0
        assert "recorded as failed" in refused.stderr, refused.stderr
        check_and_mount_again(disk)
        code, said = update_cookie(bookie, str(disk))
        assert code == 0, said
        assert "still failed" in said
        assert "--force" in said
        code, said = update_cookie(bookie, str(disk), "--force")
        assert code == 0, said
        assert f"brought back with its data {disk}" in said
        with running(bookie):
            assert await registration_of(cluster, bookie.address) == "writable"
            await read_back(bookie.address, ledgers)
