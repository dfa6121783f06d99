"""Open files for preads, by id: the entry logs and journal files that ledger storage reads.

A big disk holds thousands of such files; a bounded table keeps the recently read ones open
(least recently used go first). Reads may come from several threads; a handle that leaves
the table while a read uses it is closed by that read once done. A file retired because it
is about to be deleted is never opened again (ids are not reused): an open kept by a read
that raced the deletion would hold the file's space until the handle aged out.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tally.bookie.page_cache import drop_range

MAX_OPEN_FILES = 256


@dataclass(slots=True)
class _Handle:
    fd: int
    users: int = 0
    retired: bool = False


class ReadHandles:
    """Reads of files opened on first use by `open_file(file_id)`, which returns an fd or
    raises; its errors, and those of the read, reach the caller as they are."""

    def __init__(self, open_file: Callable[[int], int], limit: int = MAX_OPEN_FILES) -> None:
        self._open_file = open_file
        self._limit = limit
        self._lock = threading.Lock()
        self._handles: OrderedDict[int, _Handle] = OrderedDict()
        self._gone: set[int] = set()

    def pread(self, file_id: int, size: int, offset: int) -> bytes:
        handle = self._acquire(file_id)
        try:
            return os.pread(handle.fd, size, offset)
        finally:
            self._release(handle)

    def pread_cached(self, file_id: int, size: int, offset: int) -> bytes | None:
        """`pread`'s bytes if the page cache holds all of them and the file is open; None
        where the disk would have to be waited for (RWF_NOWAIT)."""
        handle = self._open_handle(file_id)
        if handle is None:
            return None
        try:
            into = bytearray(size)
            read = os.preadv(handle.fd, [into], offset, os.RWF_NOWAIT)
        except BlockingIOError:
            return None
        finally:
            self._release(handle)
        return bytes(into) if read == size else None

    def pread_into(self, file_id: int, into: memoryview, offset: int) -> int:
        """Read into `into` from `offset`; the count read."""
        handle = self._acquire(file_id)
        try:
            return os.preadv(handle.fd, [into], offset)
        finally:
            self._release(handle)

    def scan_into(self, file_id: int, into: memoryview, offset: int) -> int:
        """Read into `into` from `offset`, letting go of the cached pages of what was read
        (a scan reads each byte once, into buffers it reuses); the count read."""
        handle = self._acquire(file_id)
        try:
            read = os.preadv(handle.fd, [into], offset)
            drop_range(handle.fd, offset, offset + read)
            return read
        finally:
            self._release(handle)

    def _release(self, handle: _Handle) -> None:
        with self._lock:
            handle.users -= 1
            if handle.retired and handle.users == 0:
                os.close(handle.fd)

    def _open_handle(self, file_id: int) -> _Handle | None:
        """The file's handle if it is open, taken for a read (and made the most recently
        used); None if it is not."""
        with self._lock:
            handle = self._handles.get(file_id)
            if handle is not None:
                self._handles.move_to_end(file_id)
                handle.users += 1
            return handle

    def _acquire(self, file_id: int) -> _Handle:
        if file_id in self._gone:
            raise FileNotFoundError(f"cannot open file {file_id}: it was deleted")
        handle = self._open_handle(file_id)
        if handle is not None:
            return handle
        fd = self._open_file(file_id)
        with self._lock:
            if file_id in self._gone:  # retired while this opened it
                os.close(fd)
                raise FileNotFoundError(f"cannot open file {file_id}: it was deleted")
            handle = self._handles.get(file_id)
            if handle is None:
                handle = self._handles[file_id] = _Handle(fd)
                for idle in list(self._handles)[: max(0, len(self._handles) - self._limit)]:
                    if self._handles[idle].users == 0:
                        self._retire(idle)
            else:
                os.close(fd)
            handle.users += 1
            return handle

    def retire(self, file_id: int) -> None:
        """Let go of a file about to be deleted: closed now, or after the reads using it, and
        never opened again."""
        with self._lock:
            self._gone.add(file_id)
            self._retire(file_id)

    def _retire(self, file_id: int) -> None:
        handle = self._handles.pop(file_id, None)
        if handle is None:
            return
        handle.retired = True
        if handle.users == 0:
            os.close(handle.fd)

    def close(self) -> None:
        """Retire every handle; reads must have stopped."""
        with self._lock:
            for file_id in list(self._handles):
                self._retire(file_id)
