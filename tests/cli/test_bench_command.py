"""`tally bench`: lists the benchmarks, runs one, refuses an unknown name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tally.cli.bench import BENCH_DIR, bench_scripts, split_script_args


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


def test_a_script_is_run_by_the_name_it_is_listed_under() -> None:
    """A script without the bench_ prefix runs from its own file (it was looked for as
    bench_<name>.py): the names map to the files, and --list shows them."""
    scripts = bench_scripts()
    assert scripts["raw_replicated"] == BENCH_DIR / "raw_replicated.py"
    assert scripts["rereplication"] == BENCH_DIR / "bench_rereplication.py"
    assert all(path.is_file() for path in scripts.values())
    listed = _tally("--list")
    assert "raw_replicated" in listed.stdout
    assert "raw_copy" in listed.stdout


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


def test_options_after_a_double_dash_go_to_the_script() -> None:
    """`tally bench NAME -- OPTIONS` runs the script with them: its own usage for --help,
    and its usage error (exit 2, counted as a failed benchmark) for an option it lacks."""
    helped = _tally("raw_replicated", "--", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--storage" in helped.stdout
    refused = _tally("raw_replicated", "--", "--no-such-option")
    assert refused.returncode == 1
    assert "unrecognized arguments: --no-such-option" in refused.stderr
    assert "raw_replicated" in refused.stdout


def test_the_words_from_the_first_option_on_are_the_scripts() -> None:
    assert split_script_args(["rereplication", "--mib", "1024"]) == (
        ["rereplication"],
        ["--mib", "1024"],
    )
    assert split_script_args(["client", "bookie"]) == (["client", "bookie"], [])
    assert split_script_args(["--seconds", "3"]) == ([], ["--seconds", "3"])
