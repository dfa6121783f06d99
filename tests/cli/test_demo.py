"""`tally demo`, the README's first command, run in CI exactly as a newcomer runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_demo_writes_loses_a_bookie_recovers_and_verifies_every_byte(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tally.cli.main", "demo"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "COLUMNS": "200", "TMPDIR": str(tmp_path)},
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "SIGKILL bookie" in out
    assert "Ensemble changes" in out
    assert "the old writer's next append: LedgerFenced" in out
    assert out.count("every byte") == 4
    assert "the auditor marked ledger(s)" in out
    assert "After re-replication" in out
    assert "Replicas check of 4 ledgers" in out
    assert "4 ledgers checked" in out
    assert "audit verdict: no violation" in out
    assert "entries marked corrupt" in out
    assert "serves every one of them intact again" in out
    assert "3 of 4 ledgers deleted" in out
    assert "bytes reclaimed" in out
    assert list(tmp_path.glob("tally-demo-*/audit/report/report.html"))
    assert "every acknowledged entry was read back intact" in out
    assert "local cluster in" in out
    assert "stopped" in out
    # The cluster it started is gone: no supervisor or bookie left behind.
    leftovers = subprocess.run(
        ["pgrep", "-f", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert leftovers.stdout.strip() == ""
