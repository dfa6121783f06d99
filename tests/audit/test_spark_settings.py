"""Spark settings for the audit (`--conf`, `spark_conf`), and tally's archive for the
executors: what a job ships must import on its own."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tally.audit.config import AuditConfig
from tally.audit.executors import tally_archive
from tally.config import load
from tally.core.errors import BadRequest


def test_spark_settings_come_from_the_file_the_environment_and_the_flags(tmp_path: Path) -> None:
    config = tmp_path / "tally.toml"
    config.write_text('[audit]\nspark_conf = ["spark.executor.memory=2g", "a.b = c=d"]\n')
    from_file = load(AuditConfig, "audit", file=config, env={})
    assert from_file.spark_settings == {"spark.executor.memory": "2g", "a.b": "c=d"}
    from_env = load(AuditConfig, "audit", env={"TALLY_AUDIT_SPARK_CONF": "x=1,y=2"})
    assert from_env.spark_settings == {"x": "1", "y": "2"}
    flags = load(
        AuditConfig,
        "audit",
        file=config,
        env={"TALLY_AUDIT_SPARK_CONF": "x=1"},
        overrides={"spark_conf": ("z=3",)},
    )
    assert flags.spark_settings == {"z": "3"}


@pytest.mark.parametrize("item", ["spark.executor.memory", "=2g", " = 2g"])
def test_a_setting_that_is_not_key_value_is_refused(item: str) -> None:
    with pytest.raises(BadRequest, match="is not KEY=VALUE"):
        load(AuditConfig, "audit", env={}, overrides={"spark_conf": (item,)})


def test_the_archive_holds_tally_and_imports_without_it_installed(tmp_path: Path) -> None:
    archive = tally_archive(tmp_path)
    assert tally_archive(tmp_path) == archive, "made once per content"
    with zipfile.ZipFile(archive) as opened:
        names = set(opened.namelist())
    assert {"tally/__init__.py", "tally/audit/checks/auditor.py", "tally/core/ids.py"} <= names
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in names)
    # -I: no site-packages, no editable install; the archive alone provides tally.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import tally.core.ids as ids; "
        "print(ids.__file__)"
    )
    imported = subprocess.run(
        [sys.executable, "-I", "-c", code, str(archive)], capture_output=True, text=True
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip().startswith(str(archive))
