"""A bookie process whose ledger disk fills up under its checkpoints: read-only, serving every
acknowledged entry, the directory not failed, and writable again by itself once there is
room, without a restart.

The ledger directory lives on a small ext4 file system that the test makes, the journal on
the test's directory. The usage thresholds are set to 1.0, so that what turns the bookie
read-only is a checkpoint running out of room, not the disk check's usage reading.
"""

from __future__ import annotations

from pathlib import Path

from tally.chaos.disks import fill, small_filesystem
from tally.core.errors import WriteOnReadOnlyBookie
from tests.bookie.conftest import (
    KEY,
    BookieUnderTest,
    connected,
    entry,
    new_ledger,
    running,
    sample,
)
from tests.bookie.test_journal_disk_full import PAYLOAD, reads_back, wait_registered
from tests.support.async_tests import run
from tests.support.polling import until

LEFT = 64 << 10
"""Room the filler leaves: less than the entries written after it."""


def test_a_full_ledger_disk_makes_the_bookie_read_only_until_a_checkpoint_succeeds(
    cluster: str, tmp_path: Path
) -> None:
    with small_filesystem(tmp_path / "ledger-disk", 64 << 20) as disk:
        run(full_ledger_disk(cluster, tmp_path, disk), deadline=90.0)


async def full_ledger_disk(cluster: str, tmp_path: Path, disk: Path) -> None:
    bookie = BookieUnderTest(
        cluster,
        tmp_path / "bookie",
        settings={
            "ledger_dirs": disk / "ledgers",
            "disk_usage_threshold": 1.0,
            "disk_usage_lwm_threshold": 1.0,
            "disk_check_interval": 0.05,
            "flush_interval": 0.1,
        },
    )
    ledger = new_ledger()
    with running(bookie):
        async with connected(bookie.address) as connection:
            acknowledged = []
            for entry_id in range(5):
                await connection.add(entry(ledger, entry_id, PAYLOAD), KEY)
                acknowledged.append(entry_id)
            filler = fill(disk, leave=LEFT)
            entry_id, error = 5, None
            while entry_id < 500 and error is None:
                try:
                    await connection.add(entry(ledger, entry_id, PAYLOAD), KEY)
                    acknowledged.append(entry_id)
                    entry_id += 1
                except WriteOnReadOnlyBookie as refused:
                    error = refused
            assert error is not None, "the ledger disk never ran out of room"
            assert "a checkpoint found no room on a ledger disk" in str(error)
            await wait_registered(cluster, bookie, "readonly")
            await reads_back(connection, ledger, acknowledged)
            metrics = bookie.metrics()
            assert sample(metrics, "bookie_read_only") == 1
            assert sample(metrics, "bookie_ledger_dir_failed", dir=str(disk / "ledgers")) == 0
            assert "free space there" in bookie.log()

            filler.unlink()
            await wait_registered(cluster, bookie, "writable")
            for more in range(entry_id, entry_id + 5):
                await connection.add(entry(ledger, more, PAYLOAD), KEY)
                acknowledged.append(more)
            await until(
                lambda: sample(bookie.metrics(), "bookie_write_cache_bytes") == 0,
                "every acknowledged entry checkpointed",
            )
            await reads_back(connection, ledger, acknowledged)
        assert "a checkpoint succeeded again" in bookie.log()
        assert bookie.stop() == 0
    with running(bookie):  # started again: every acknowledged entry is there
        async with connected(bookie.address) as connection:
            await reads_back(connection, ledger, acknowledged)
    assert "Traceback" not in bookie.log()
