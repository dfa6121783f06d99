"""How a failed `tally` command ends: one line on stderr saying what went wrong and what to
do, and status 1. An operator reads the line; the traceback, which is for whoever debugs
tally, goes to the log at debug level, and to the terminal with `tally --debug` or
TALLY_DEBUG=1. Commands that expect a failure (a TallyError) may still end it themselves,
with a status of their own; this is where everything else ends.
"""

from __future__ import annotations

import errno
import logging
import re
from typing import Any

import typer
from typer.core import TyperGroup

from tally.core.errors import TallyError

log = logging.getLogger(__name__)

EXIT_FAILED = 1
DEBUG_HINT = "run it again with `tally --debug ...` (or TALLY_DEBUG=1) to see the traceback"
MAX_LINE = 400
"""Characters of a foreign error's message that the one line keeps."""

_SPARK_MODULES = ("pyspark", "py4j")
_OS_HINTS = {
    errno.ENOSPC: "free space on its disk",
    errno.EDQUOT: "raise the disk quota or free space",
    errno.EACCES: "give this user access to it",
    errno.EPERM: "give this user access to it",
    errno.EROFS: "its file system is read-only: use another path",
    errno.ENOTDIR: "a part of the path is a file: use a directory",
    errno.EISDIR: "it is a directory: give a file",
    errno.EEXIST: "something else is at that path: move it or use another path",
    errno.ENOENT: "check the path",
}
_PYTHON_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+\.?\s*$")


class OneLineFailures(TyperGroup):
    """The root `tally` command: a sub-command's exception ends in one line and status 1."""

    def invoke(self, ctx: Any) -> Any:  # typer's (vendored) click Context
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException, BrokenPipeError):
            raise  # typer's own ends: an exit status, Ctrl-C, a usage error, a closed pipe
        except Exception as error:
            log.debug("tally %s failed", ctx.invoked_subcommand, exc_info=True)
            if ctx.params.get("debug"):
                raise
            typer.echo(f"error: {describe(error)}", err=True)
            raise typer.Exit(EXIT_FAILED) from None


def describe(error: BaseException) -> str:
    """What went wrong, in one line, and what to do where that can be told."""
    if isinstance(error, TallyError):
        return _one_line(str(error))
    if isinstance(error, OSError):
        return _describe_os_error(error)
    if type(error).__module__.split(".")[0] in _SPARK_MODULES:
        return f"Spark failed: {spark_summary(str(error))}; {DEBUG_HINT}"
    message = _one_line(str(error))
    what = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return f"{what} (unexpected: a bug in tally); {DEBUG_HINT}"


def spark_summary(text: str) -> str:
    """The first line of a Spark error worth reading: the exception a Python worker raised,
    or else the first line past Py4J's "An error occurred while calling" and Java frames."""
    lines = [line.strip() for line in text.splitlines()]
    if _PYTHON_TRACEBACK in lines:
        after = lines[lines.index(_PYTHON_TRACEBACK) + 1 :]
        raised = [line for line in after if _EXCEPTION_LINE.match(line)]
        if raised:
            return _clip(raised[-1])
    for line in lines:
        line = line.removeprefix(":").strip()
        if line and not line.startswith(("An error occurred while calling", "at ")):
            return _clip(line)
    return "no message"


def _describe_os_error(error: OSError) -> str:
    if error.errno is None or error.strerror is None:
        return _one_line(str(error))
    paths = " -> ".join(str(p) for p in (error.filename, error.filename2) if p is not None)
    name = errno.errorcode.get(error.errno, str(error.errno))
    what = f"{paths}: {error.strerror} ({name})" if paths else f"{error.strerror} ({name})"
    hint = _OS_HINTS.get(error.errno)
    return f"{what}: {hint}" if hint else what


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _clip(line: str) -> str:
    line = _SQLSTATE.sub("", line)
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 3] + "..."
