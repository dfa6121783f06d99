"""`tally chaos` stopped by SIGTERM in the middle of its run (a CI job cancelled, a service
manager): it stops every process it started and unmounts its disks, says so in one line and
exits 143, keeping what it saw."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tally.chaos.run import HISTORY

START = 120.0


@pytest.mark.timeout(300)
def test_sigterm_stops_the_run_and_cleans_up_after_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = subprocess.Popen(
        [
            *(sys.executable, "-m", "tally.cli.main", "chaos", "--out", str(out)),
            *("--duration", "5m", "--seed", "22", "--writers", "1", "--no-audit"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START
        while not _acknowledged(out / HISTORY):  # the whole cluster up and taking adds
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "no add acknowledged"
            time.sleep(0.5)
        assert _mounts(out), "seed 22 gives a bookie disks of its own"
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 128 + signal.SIGTERM, stderr
    assert f"stopped by SIGTERM before its verdict: what it saw is in {out}" in stderr
    assert "Traceback" not in stderr
    assert not _mounts(out)
    assert not _processes_of(out)
    assert (out / HISTORY).stat().st_size > 0


def _acknowledged(history: Path) -> bool:
    return history.exists() and '"outcome":"ok"' in history.read_text()


def _mounts(out: Path) -> list[str]:
    return [line for line in Path("/proc/mounts").read_text().splitlines() if str(out) in line]


def _processes_of(out: Path) -> list[str]:
    found = subprocess.run(["pgrep", "-af", str(out)], capture_output=True, text=True)
    return found.stdout.splitlines()
