"""The installed `tally` entry point runs the audit from a shell that has not activated the
virtual environment: Spark's Python workers must still be able to import tally."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from tally.audit import schema
from tally.audit.synth import ledger_key

OUTSIDE_THE_VENV = {"PATH": "/usr/bin:/bin"}
"""No venv on PATH, and nothing else that would point Spark at its interpreter."""
UNSET = ("VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH", "PYTHONHOME")


def _installed_tally(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    entry_point = Path(sys.executable).with_name("tally")
    assert entry_point.exists(), f"no installed entry point at {entry_point}"
    env = {k: v for k, v in os.environ.items() if k not in UNSET} | OUTSIDE_THE_VENV
    return subprocess.run(
        [str(entry_point), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
        env=env,
    )


def test_the_audit_runs_from_the_entry_point_without_the_venv_on_path(tmp_path: Path) -> None:
    snapshot, out = tmp_path / "snapshot", tmp_path / "out"
    synth = _installed_tally(
        "audit", "synth", "--ledgers", "300", "--bookies", "6", "--racks", "3",
        "--faults", "default", "--seed", "5", "--out", str(snapshot),
        cwd=tmp_path,
    )  # fmt: skip
    assert synth.returncode == 0, synth.stderr
    truth = json.loads((snapshot / schema.TRUTH_JSON).read_text())

    run = _installed_tally(
        "audit", "run", "--snapshot", str(snapshot), "--out", str(out), "--master", "local[2]",
        "--grace-period", f"{truth['grace_period_ms']}ms",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "No module named" not in run.stderr

    found: dict[str, set[str]] = {name: set() for name in truth["categories"]}
    for row in pq.read_table(out / schema.VIOLATIONS).to_pylist():
        key = (
            row["bookie_id"]
            if row["ledger_id"] is None
            else ledger_key(row["scope"], row["ledger_id"])
        )
        found.setdefault(row["category"], set()).add(key)
    assert found == {name: set(keys) for name, keys in truth["categories"].items()}
    assert any(truth["categories"].values()), "the synthetic snapshot should carry faults"
