"""`tally tour`, run as a user runs it: the real command in a subprocess."""

from __future__ import annotations

import subprocess
import sys


def test_tour_runs_and_finds_the_lost_entries() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tally.cli.main", "tour"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Verdict: below_ack_quorum" in out
    assert "the worst entry has 1 of 3 copies" in out
    assert "BadDigest" in out
    assert "→ abort" in out
