"""Evicting a directory's files from the page cache, as time or a reboot would: reads of
them then need the disk (a bookie reads such entries on its read threads)."""

from __future__ import annotations

import os
from pathlib import Path


def drop_page_cache(where: Path) -> None:
    """Evict the file `where`, or every file under the directory `where`."""
    for path in [where] if where.is_file() else where.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
