"""The installed `tally` entry point runs the audit from a shell that has not activated the
virtual environment, on local Spark and on a standalone cluster whose executors do not have
tally installed: Spark's Python workers import the tally the job ships."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pyspark
import pytest

from tally.audit import schema
from tally.audit.executors import EXECUTOR_PACKAGES
from tally.audit.snapshot import take_snapshot
from tally.audit.synth import ledger_key
from tests.autorecovery.test_end_to_end import write_ledgers
from tests.support.cluster import running_cluster
from tests.support.spark_standalone import StandaloneCluster, executor_python, standalone_cluster

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


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A synthetic snapshot with the default faults, and its truth."""
    where = tmp_path_factory.mktemp("synthetic")
    snapshot = where / "snapshot"
    synth = _installed_tally(
        "audit", "synth", "--ledgers", "300", "--bookies", "6", "--racks", "3",
        "--faults", "default", "--seed", "5", "--out", str(snapshot),
        cwd=where,
    )  # fmt: skip
    assert synth.returncode == 0, synth.stderr
    truth = json.loads((snapshot / schema.TRUTH_JSON).read_text())
    assert any(truth["categories"].values()), "the synthetic snapshot should carry faults"
    return snapshot, truth


def _audit(
    snapshot: Path, truth: dict[str, Any], out: Path, master: str, *conf: str
) -> subprocess.CompletedProcess[str]:
    run = _installed_tally(
        "audit", "run", "--snapshot", str(snapshot), "--out", str(out), "--master", master,
        "--grace-period", f"{truth['grace_period_ms']}ms",
        *(option for setting in conf for option in ("--conf", setting)),
        cwd=out.parent,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "No module named" not in run.stderr
    return run


def _found(out: Path) -> dict[str, set[str]]:
    """The run's violations by category, as keys of truth.json."""
    found: dict[str, set[str]] = {}
    for row in pq.read_table(out / schema.VIOLATIONS).to_pylist():
        key = (
            row["bookie_id"]
            if row["ledger_id"] is None
            else ledger_key(row["scope"], row["ledger_id"])
        )
        found.setdefault(row["category"], set()).add(key)
    return found


def _expected(truth: dict[str, Any]) -> dict[str, set[str]]:
    return {name: set(keys) for name, keys in truth["categories"].items() if keys}


def test_the_audit_runs_from_the_entry_point_without_the_venv_on_path(
    tmp_path: Path, synthetic: tuple[Path, dict[str, Any]]
) -> None:
    snapshot, truth = synthetic
    _audit(snapshot, truth, tmp_path / "out", "local[2]")
    assert _found(tmp_path / "out") == _expected(truth)


EXECUTOR_CONF = (
    "spark.executor.memory=512m",
    "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A master and two workers of one core whose `python3` cannot import tally."""
    where = tmp_path_factory.mktemp("standalone")
    python_bin = executor_python(where / "executor-image")
    lacks = subprocess.run(
        [str(python_bin / "python3"), "-c", "import tally"], capture_output=True, check=False
    )
    assert b"No module named 'tally'" in lacks.stderr, "the executors' Python must lack tally"
    with standalone_cluster(where / "spark", workers=2, python_bin=python_bin) as cluster:
        yield cluster


def _shipped_to(cluster: StandaloneCluster, before: set[Path]) -> set[str]:
    """The workers on which an executor of an application started since `before` (the
    applications then) fetched the tally its job shipped."""
    return {
        path.relative_to(cluster.workdir).parts[0]
        for path in cluster.workdir.glob("worker*/app-*/*/tally-*.zip")
        if path.parent.parent not in before
    }


def _applications(cluster: StandaloneCluster) -> set[Path]:
    return set(cluster.workdir.glob("worker*/app-*"))


def test_the_audit_runs_on_a_standalone_cluster_whose_executors_lack_tally(
    tmp_path: Path, synthetic: tuple[Path, dict[str, Any]], standalone: StandaloneCluster
) -> None:
    snapshot, truth = synthetic
    before = _applications(standalone)
    _audit(snapshot, truth, tmp_path / "out", standalone.master, *EXECUTOR_CONF)
    assert _found(tmp_path / "out") == _expected(truth)
    assert _shipped_to(standalone, before) == {"worker0", "worker1"}, standalone.logs()


def test_a_snapshot_taken_on_a_standalone_cluster_is_the_one_taken_in_process(
    tmp_path: Path, standalone: StandaloneCluster
) -> None:
    with running_cluster(tmp_path / "cluster", 3) as cluster:
        asyncio.run(write_ledgers(cluster.uri, 12, 20, write_quorum=2))
        before = _applications(standalone)
        taken = _installed_tally(
            "audit", "snapshot", "--metadata", cluster.uri, "--out", str(tmp_path / "tasks"),
            "--master", standalone.master, *(f"--conf={setting}" for setting in EXECUTOR_CONF),
            cwd=tmp_path,
        )  # fmt: skip
        assert taken.returncode == 0, taken.stderr[-3000:]
        alone = asyncio.run(take_snapshot(cluster.uri, tmp_path / "alone"))
    by_tasks = json.loads((tmp_path / "tasks" / schema.SNAPSHOT_JSON).read_text())
    assert by_tasks["counts"] == alone["counts"]
    assert by_tasks["counts"]["ledgers"] == 12
    for name in schema.SNAPSHOT_TABLES:
        assert _sorted_rows(tmp_path / "tasks", name) == _sorted_rows(tmp_path / "alone", name)
    assert _shipped_to(standalone, before) == {"worker0", "worker1"}, standalone.logs()


def _sorted_rows(snapshot: Path, table: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(row.values()) for row in pq.read_table(snapshot / table).to_pylist())


def test_executors_prints_what_an_executor_image_needs(tmp_path: Path) -> None:
    shown = _installed_tally("audit", "executors", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    pinned = [line for line in shown.stdout.splitlines() if not line.startswith("#")]
    assert pinned == [f"{name}=={version(name)}" for name in EXECUTOR_PACKAGES]
    assert f"Spark {pyspark.__version__}" in shown.stdout
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in shown.stdout


def test_a_spark_setting_that_is_not_key_value_is_refused_in_one_line(tmp_path: Path) -> None:
    refused = _installed_tally(
        "audit", "run", "--snapshot", str(tmp_path), "--out", str(tmp_path / "out"),
        "--conf", "spark.executor.memory",
        cwd=tmp_path,
    )  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "error: audit setting spark_conf = ('spark.executor.memory',) (from option --conf): "
        "'spark.executor.memory' is not KEY=VALUE (e.g. spark.executor.memory=2g)"
    ]
    assert not (tmp_path / "out").exists()
