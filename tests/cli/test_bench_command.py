"""`tally bench`: lists the benchmarks, runs one, refuses an unknown name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tally.cli.bench import BENCH_DIR


def _tally(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tally.cli.main", "bench", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_lists_every_benchmark_script() -> None:
    result = _tally("--list")
    assert result.returncode == 0, result.stderr
    for name in ("availability", "journal", "bookie", "client", "raw_socket"):
        assert name in result.stdout


def test_runs_a_benchmark_and_shows_its_reference() -> None:
    result = _tally("availability")
    assert result.returncode == 0, result.stderr
    assert "np.diff (reference)" in result.stdout
    assert "ratio" in result.stdout


def test_runs_a_reference_script_whose_name_has_no_bench_prefix() -> None:
    """raw_replicated.py is listed as `raw_replicated` and runs under that name."""
    result = _tally("raw_replicated")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bare Python replicated writes (E3 WQ3 AQ2, no protocol)" in result.stdout


def test_unknown_benchmark_is_a_usage_error() -> None:
    result = _tally("nonesuch")
    assert result.returncode == 2
    assert "unknown benchmark" in result.stdout


def test_etcd_peer_without_etcd_says_how_to_install_it(tmp_path: Path) -> None:
    """Neither etcd nor h2load on PATH: one line naming the install script, exit 2."""
    result = subprocess.run(
        [sys.executable, str(BENCH_DIR / "bench_etcd_peer.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PATH": str(tmp_path)},
    )
    assert result.returncode == 2
    assert result.stderr == "etcd and h2load not found: run scripts/ensure-etcd.sh\n"
    assert result.stdout == ""
