"""What a Spark executor needs to run tally's tasks, and how a job brings it there.

Executors run tally's own Python (the audit's pass, the recovery's decisions, the
snapshot's fetches) without tally installed: every session ships tally's code, zipped from
the package this driver imports, as a Python file of the session (`SparkContext.addPyFile`:
the driver serves it to every executor, whatever the master — local, standalone, YARN,
Kubernetes — and it leads their import path). The third-party packages those tasks import
are compiled wheels, so they are a requirement of the executors' image instead, listed
pinned to the driver's versions by `tally audit executors`. A packed environment
(`spark.archives`) would carry them too, but at about 480 MB per job (PySpark's own
installation in it again), and only to executors of the driver's OS, CPU and Python build.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import sys
import tempfile
import zipfile
from pathlib import Path

from pyspark import SparkContext

from tally.version import __version__

EXECUTOR_PACKAGES = ("pyarrow", "numpy", "pandas", "crc32c", "kazoo")
"""Distributions tally's tasks import on an executor (kazoo: a snapshot task reading a
ZooKeeper store); PySpark itself comes from the workers' Spark installation."""

_SHIPPED = "_tally_shipped"
"""The attribute a SparkContext gets once tally's archive is added to it."""


def executor_requirements() -> list[str]:
    """The executors' requirements as pip takes them, pinned to this driver's versions."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in EXECUTOR_PACKAGES]


def python_version() -> str:
    """The executors' Python must be this minor version: PySpark refuses a worker of
    another."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def tally_archive(directory: Path | None = None) -> Path:
    """tally's package as a zip an executor imports from; made once per content.

    The name carries a hash of the files, so a changed tree is never served under the
    name of an older one (executors cache Python files by name).
    """
    package = Path(__file__).resolve().parent.parent
    files = sorted(
        path
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    )
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    where = directory or Path(tempfile.gettempdir()) / "tally-executor"
    archive = where / f"tally-{__version__}-{digest.hexdigest()[:16]}.zip"
    if archive.exists():
        return archive
    where.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed: two drivers starting at once never serve half a zip.
    with (
        tempfile.NamedTemporaryFile(dir=where, suffix=".partial", delete=False) as partial,
        zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as out,
    ):
        for path in files:
            out.write(path, Path("tally") / path.relative_to(package))
    Path(partial.name).replace(archive)
    return archive


def ship_tally(context: SparkContext) -> Path:
    """Add tally's archive to `context`, once; the archive's path."""
    shipped: Path | None = getattr(context, _SHIPPED, None)
    if shipped is not None:
        return shipped
    archive = tally_archive()
    context.addPyFile(str(archive))
    setattr(context, _SHIPPED, archive)
    return archive
