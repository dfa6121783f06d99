"""A failing `tally` command prints one line saying what went wrong and what to do, and no
traceback (unless asked for with --debug or TALLY_DEBUG=1); help texts print every word."""

from __future__ import annotations

import errno
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from tally.cli.failures import describe, spark_summary
from tally.cli.main import app
from tests.support.processes import environment, free_port, init_cluster, tally

LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


def messages(stderr: str) -> list[str]:
    """What a command said on stderr, without its log records."""
    return [line for line in stderr.splitlines() if line.strip() and not LOG_RECORD.match(line)]


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    (line,) = messages(stderr)
    return line


# --- the commands an operator runs ------------------------------------------------------------


def test_a_bookie_on_a_data_dir_it_cannot_use_says_so_in_one_line(tmp_path: Path) -> None:
    metadata = init_cluster(tmp_path)
    (tmp_path / "taken").write_text("a file where the data directory should be")
    data_dir = tmp_path / "taken" / "bookie"
    result = tally(
        "bookie", "--metadata", metadata, "--data-dir", str(data_dir),
        "--listen", f"127.0.0.1:{free_port()}",
    )  # fmt: skip
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert line.startswith(f"error: {data_dir / 'journal'}")
    assert "Not a directory (ENOTDIR)" in line


def test_an_audit_of_a_missing_snapshot_says_how_to_take_one(tmp_path: Path) -> None:
    missing = tmp_path / "no-snapshot"
    result = tally("audit", "run", "--snapshot", str(missing), "--out", str(tmp_path / "out"))
    assert result.returncode == 1
    assert one_line(result.stderr) == (
        f"error: no audit snapshot at {missing} (no such directory): take one with "
        f"`tally audit snapshot --metadata URI --out {missing}` (or `tally audit synth` for "
        "a synthetic one)"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "command",
    [
        ("audit", "snapshot", "--out", "{tmp}/snap"),
        ("audit", "confirm", "--report", "{tmp}/r"),
        ("cluster", "settings"),
        ("cluster", "settings", "--set", "tombstone_retention=60"),
        ("cluster", "nuke", "--force"),
    ],
)
def test_a_command_on_a_store_that_is_not_there_creates_none(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """Commands that read or change a cluster refuse a mistyped sqlite path in one line
    and leave nothing behind (only `cluster init`, and `cluster recover --apply` for a lost
    store, create one)."""
    missing = tmp_path / "typo.db"
    arguments = [part.format(tmp=tmp_path) for part in command]
    result = tally(*arguments, "--metadata", f"sqlite:///{missing}")
    assert result.returncode == 1
    assert one_line(result.stderr) == (
        f"error: no metadata store at {missing}; create a cluster with "
        f"`tally cluster init --metadata sqlite:///{missing}`"
    )
    assert sorted(tmp_path.iterdir()) == []


def test_the_shell_on_a_store_without_a_cluster_says_how_to_create_one(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'meta.db'}"
    result = tally("shell", "listbookies", "--metadata", uri)
    assert result.returncode == 4
    line = one_line(result.stderr)
    assert line.startswith("error: no metadata store at ")
    assert f"tally cluster init --metadata {uri}" in line


def test_an_error_no_command_expects_is_one_line_and_debug_shows_its_traceback(
    tmp_path: Path,
) -> None:
    (tmp_path / "file").write_text("")
    command = ("local", "status", "--data-dir", str(tmp_path / "file" / "local"))
    result = tally(*command)
    assert result.returncode == 1
    assert one_line(result.stderr) == (
        f"error: {tmp_path / 'file' / 'local' / 'local.json'}: Not a directory (ENOTDIR): "
        "a part of the path is a file: use a directory"
    )

    debugged = tally("--debug", *command)
    assert debugged.returncode == 1
    assert "Traceback" in debugged.stderr
    assert "NotADirectoryError" in debugged.stderr
    with environment({"TALLY_DEBUG": "1"}):
        assert "Traceback" in tally(*command).stderr


# --- the one line -------------------------------------------------------------------------------


def test_an_os_error_names_its_path_its_errno_and_what_to_do() -> None:
    full = OSError(errno.ENOSPC, "No space left on device", "/data/journal/3.txn")
    assert describe(full) == (
        "/data/journal/3.txn: No space left on device (ENOSPC): free space on its disk"
    )
    moved = OSError(errno.EXDEV, "Invalid cross-device link", "/a", None, "/b")
    assert describe(moved) == "/a -> /b: Invalid cross-device link (EXDEV)"
    assert describe(OSError("no errno")) == "no errno"


def test_an_unexpected_error_says_it_is_a_bug_and_how_to_see_more() -> None:
    line = describe(KeyError("segments"))
    assert line.startswith("KeyError: 'segments' (unexpected: a bug in tally); run it again")
    assert "tally --debug" in line
    assert "\n" not in describe(ValueError("two\nlines"))


WORKER_FAILURE = """An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/worker.py", \
line 4207, in invoke_udf
    func, profiler, deserializer, serializer = read_udfs(
                                               ^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark/serializers.py", \
line 483, in loads
    return cloudpickle.loads(obj, encoding=encoding)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
ModuleNotFoundError: No module named 'tally'
"""
PY4J_FAILURE = """An error occurred while calling o61.parquet.
: java.lang.OutOfMemoryError: Java heap space
\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)
\tat org.apache.spark.sql.execution.SparkPlan.executeCollect(SparkPlan.scala:456)
"""


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (WORKER_FAILURE, "ModuleNotFoundError: No module named 'tally'"),
        (PY4J_FAILURE, "java.lang.OutOfMemoryError: Java heap space"),
        (
            "[PATH_NOT_FOUND] Path does not exist: file:/tmp/snapshot/bookies. SQLSTATE: 42K03",
            "[PATH_NOT_FOUND] Path does not exist: file:/tmp/snapshot/bookies.",
        ),
        ("", "no message"),
    ],
)
def test_a_spark_error_is_its_first_meaningful_line(text: str, line: str) -> None:
    assert spark_summary(text) == line


def test_a_spark_error_says_spark_failed() -> None:
    class AnalysisException(Exception):
        """Stands in for pyspark's, which needs a JVM to be made."""

    AnalysisException.__module__ = "pyspark.errors.exceptions.captured"
    line = describe(AnalysisException("[PATH_NOT_FOUND] Path does not exist: file:/x."))
    assert line.startswith("Spark failed: [PATH_NOT_FOUND] Path does not exist: file:/x.; run")


# --- help ---------------------------------------------------------------------------------------


def _commands() -> Iterator[list[str]]:
    def walk(command: object, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(app), [])


BRACKETED = re.compile(r"\\?\[[^\]\s]*\]")


@pytest.mark.parametrize("path", list(_commands()), ids=lambda path: " ".join(path) or "tally")
def test_help_prints_every_bracketed_word(path: list[str]) -> None:
    """Rich reads "[bookie]" as markup and drops it unless it is escaped."""
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    texts = [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
    words = [w.replace("\\[", "[") for text in texts for w in BRACKETED.findall(text)]
    shown = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    for word in words:
        assert word in shown.output, f"{word} missing from `tally {' '.join(path)} --help`"
