"""The I/O side of a ledger directory's health (the decisions are tally.core.ledger_dirs'):
a probe of the directory, and the errno behind an error that storage raised.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from tally.core.ledger_dirs import FAILURE_ERRNOS, FULL_ERRNOS, ProbeResult

PROBE_FILE = ".probe"
_KNOWN_ERRNOS = {os.strerror(number): number for number in FAILURE_ERRNOS | FULL_ERRNOS}
"""An error of the index engine carries the errno's text only."""


def probe_directory(path: Path, device: int) -> ProbeResult:
    """Write a small file in the directory, sync it and read it back, after checking that
    the directory is still on `device` (an unmounted file system leaves the directory on
    the one below it)."""
    try:
        now = os.stat(path).st_dev
    except OSError as error:
        return ProbeResult(device, None, error.errno, f"stat {path}: {error.strerror}")
    if now != device:
        return ProbeResult(device, now)
    target = path / PROBE_FILE
    written = os.urandom(16) + b"tally ledger directory probe\n"
    step = "open"
    try:
        fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            step = "write"
            os.write(fd, written)
            step = "fdatasync"
            os.fdatasync(fd)
            step = "read"
            read = os.pread(fd, len(written) + 1, 0)
        finally:
            os.close(fd)
    except OSError as error:
        return ProbeResult(device, now, error.errno, f"{step} {target}: {error.strerror}")
    if read != written:
        return ProbeResult(device, now, errno.EIO, f"read {target}: other bytes than written")
    return ProbeResult(device, now)


def described(error: BaseException) -> str:
    """The messages of the error and of its causes."""
    parts: list[str] = []
    seen: BaseException | None = error
    while seen is not None and len(parts) < 8:
        parts.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    return " | ".join(parts)


def errno_of(error: BaseException) -> int | None:
    """The errno behind an error: of an OSError among its causes, or named by the text of
    an index engine's error."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.errno
        seen = seen.__cause__ or seen.__context__
    messages = described(error)
    for text, number in _KNOWN_ERRNOS.items():
        if text in messages:
            return number
    return None
