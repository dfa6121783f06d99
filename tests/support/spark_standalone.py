"""A Spark standalone cluster on loopback, started from PySpark's own jars, whose executors
have the image `tally audit executors` asks for and no tally: a Python that sees only the
executor packages (and what they require), found as `python3` on the workers' PATH."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import time
import urllib.request
import venv
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyspark
from packaging.requirements import Requirement

from tally.audit.executors import EXECUTOR_PACKAGES
from tally.ports import free_ports
from tests.support.processes import stop_process

SPARK_HOME = Path(pyspark.__file__).parent
DAEMON_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The master's and workers' JVMs start for a short life, as the tests' drivers do."""


def distributions_needed(names: tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """`names` and every distribution they require (no extras), installed here."""
    found: dict[str, importlib.metadata.Distribution] = {}
    pending = list(names)
    while pending:
        name = pending.pop().lower().replace("_", "-")
        if name in found:
            continue
        dist = importlib.metadata.distribution(name)
        found[name] = dist
        for text in dist.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return list(found.values())


def executor_python(where: Path) -> Path:
    """A directory holding `python3`: this Python's version with a site of only the
    executor packages (linked from this environment), so `import tally` fails there."""
    env_dir, site = where / "env", where / "site"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    site.mkdir()
    for dist in distributions_needed(EXECUTOR_PACKAGES):
        root = Path(str(dist.locate_file("")))
        tops = {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in tops:
            if top != "tally" and not (site / top).exists() and (root / top).exists():
                (site / top).symlink_to(root / top)
    purelib = next((env_dir / "lib").glob("python3*/site-packages"))
    (purelib / "executor-image.pth").write_text(f"{site}\n")
    return env_dir / "bin"


@dataclass
class StandaloneCluster:
    """A master and `workers` workers of `cores` cores each, on 127.0.0.1."""

    workdir: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    python_bin: Path | None = None
    """Put first on the workers' PATH, where their executors find `python3`."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    port: int = 0
    ui_port: int = 0

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120.0) -> None:
        self.port, self.ui_port, *worker_ui = free_ports(2 + self.workers)
        self._launch(
            "master",
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port)],
        )
        for n, ui in enumerate(worker_ui):
            work = self.workdir / f"worker{n}"
            work.mkdir(parents=True)
            self._launch(
                f"worker{n}",
                "org.apache.spark.deploy.worker.Worker",
                [
                    self.master,
                    "--host", "127.0.0.1", "--webui-port", str(ui),
                    "--cores", str(self.cores), "--memory", self.memory,
                    "--work-dir", str(work),
                ],
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while self.alive_workers() < self.workers:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited: {process.args!r}\n{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.workers} workers not alive in {timeout} s\n{self.logs()}"
                )
            time.sleep(0.2)

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                return int(json.load(r).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def stop(self) -> None:
        for process in reversed(self.processes):
            stop_process(process, self.logs)
        self.processes.clear()

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted(self.workdir.glob("*.log"))
        )

    def _launch(self, name: str, main_class: str, args: list[str]) -> None:
        path = os.pathsep.join(
            [*([str(self.python_bin)] if self.python_bin else []), "/usr/bin", "/bin"]
        )
        env = {
            "PATH": path,
            "HOME": os.environ.get("HOME", "/root"),
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_DAEMON_JAVA_OPTS": DAEMON_JVM,
            "SPARK_LOCAL_DIRS": str(self.workdir / "local"),
            "SPARK_LOG_DIR": str(self.workdir),
        }
        if "JAVA_HOME" in os.environ:
            env["JAVA_HOME"] = os.environ["JAVA_HOME"]
        log = (self.workdir / f"{name}.log").open("wb")
        with log:
            self.processes.append(
                subprocess.Popen(
                    [str(SPARK_HOME / "bin" / "spark-class"), main_class, *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )


@contextmanager
def standalone_cluster(workdir: Path, **options: object) -> Iterator[StandaloneCluster]:
    """A started cluster, stopped on the way out."""
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = StandaloneCluster(workdir, **options)  # type: ignore[arg-type]
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
