"""OS processes seen from another process: is a recorded pid still that process, and stop it.

A pid alone names a process only while it lives: once it exits the kernel may hand the
number to any new process. So a record keeps, next to the pid, the process's start time
(from /proc, where there is one), and a process counts as running only while both match;
`stop` then never signals a stranger. A zombie (exited, not yet reaped by its parent) is
not running either: it serves nothing and holds no port.

Also here: reading what a process wrote to its log.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import suppress
from pathlib import Path

WAIT_POLL = 0.05
"""Seconds between two looks at a process we wait for."""
TAIL_BYTES = 64 * 1024
"""How much of a log's end `log_tail` reads: a few screens of lines."""
_PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """The process's state letter and start time (clock ticks since boot) from /proc."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the name in parentheses may hold spaces
    return fields[0], int(fields[19])  # fields 3 and 22 of proc(5)


def start_token(pid: int) -> int | None:
    """What tells this process from a later one with its pid; None without /proc."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def is_running(pid: int, token: int | None) -> bool:
    """True while `pid` is the live (not zombie) process that had start token `token`."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    if not (_PROC / "self").exists():
        return True  # no /proc here: the pid is all there is to go by
    stat = _stat(pid)
    if stat is None:
        return False  # gone meanwhile
    state, started = stat
    return state != "Z" and (token is None or started == token)


def wait_gone(pid: int, token: int | None, timeout: float) -> bool:
    """Wait up to `timeout` seconds for the process to end; True if it did."""
    deadline = time.monotonic() + timeout
    while is_running(pid, token):
        if time.monotonic() >= deadline:
            return False
        time.sleep(WAIT_POLL)
    return True


def signal_group(pid: int, signum: int) -> None:
    """Send `signum` to the process group that `pid` leads (a bookie and anything it forked)."""
    with suppress(ProcessLookupError):
        os.killpg(pid, signum)


def terminate_group(pid: int, token: int | None, timeout: float) -> bool:
    """SIGTERM the group `pid` leads, SIGKILL it after `timeout`; True if it stopped cleanly."""
    if not is_running(pid, token):
        return True
    signal_group(pid, signal.SIGTERM)
    if wait_gone(pid, token, timeout):
        return True
    signal_group(pid, signal.SIGKILL)
    wait_gone(pid, token, timeout)
    return False


def describe_exit(code: int | None) -> str:
    """An exit status as an operator reads it: "exit code 2", "killed by SIGKILL"."""
    if code is None:
        return "exit status unknown"
    return f"killed by {signal_name(-code)}" if code < 0 else f"exit code {code}"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def log_since(path: Path, offset: int, limit: int | None = None) -> str:
    """The text written to `path` at or after byte `offset`, or its last `limit` bytes."""
    try:
        with path.open("rb") as log:
            end = log.seek(0, os.SEEK_END)
            log.seek(offset if limit is None else max(offset, end - limit))
            return log.read().decode(errors="replace")
    except OSError:
        return ""


def log_tail(path: Path, lines: int, offset: int = 0) -> list[str]:
    """The last `lines` lines of `path` written at or after `offset`."""
    return log_since(path, offset, limit=TAIL_BYTES).splitlines()[-lines:]
