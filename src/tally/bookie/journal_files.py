"""The journal's files on disk: listed, created, read back in order, and let go.

Files are `<directory>/<file id as 16 hex digits>.txn`, ids increasing, each beginning with
a header that records where the records of the file before it end (journal_format.py). A
file is born under a temporary name with its header and first preallocated chunk, fsync'ed,
renamed and its directory fsync'ed: a `.txn` file always has a whole header. Blocking I/O
throughout: the journal calls these from its threads, or at start-up before serving.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
from collections.abc import Collection, Generator
from dataclasses import dataclass
from pathlib import Path

from tally.bookie.journal_format import (
    HEADER_SIZE,
    Damage,
    FileHeader,
    JournalMark,
    Scan,
    file_name,
    scan_records,
)
from tally.core.errors import MalformedData

log = logging.getLogger(__name__)

_FILE_NAME = re.compile(r"([0-9a-f]{16})\.txn")
_TEMPORARY_SUFFIX = ".tmp"

Records = Generator[tuple[JournalMark, bytes], None, Scan]
"""A file's records with the mark of each one's end; returns how they ended."""


@dataclass
class OpenFile:
    """The file being written; touched by the journal thread only."""

    file_id: int
    path: Path
    fd: int
    allocated: int
    direct: bool
    """Written with O_DIRECT; else through the page cache."""

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class ReplayEnd:
    """What a replay of the files learnt besides their records."""

    tail: JournalMark | None
    """Where the last file's records end (None without files)."""
    damage: tuple[Damage, ...]


def journal_files(directory: Path) -> list[tuple[int, Path]]:
    """The journal files of `directory` by increasing id; a stray `.txn` name is refused."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        if path.suffix != ".txn":
            continue
        match = _FILE_NAME.fullmatch(path.name)
        if match is None:
            raise MalformedData(
                f"{path}: not a journal file name (16 lowercase hex digits and .txn)"
            )
        found.append((int(match.group(1), 16), path))
    return sorted(found)


def remove_temporaries(directory: Path) -> None:
    """Remove what a start interrupted before its new file got its name."""
    for stale in directory.glob(f"*.txn{_TEMPORARY_SUFFIX}"):
        stale.unlink()


def create_file(
    directory: Path, file_id: int, header: bytes, allocated: int, *, fsync: bool
) -> tuple[Path, int]:
    """Journal file `file_id`, durable with `header` and `allocated` bytes reserved before it
    gets its name; (its path, an fd open for writing)."""
    path = directory / file_name(file_id)
    temporary = path.with_name(path.name + _TEMPORARY_SUFFIX)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        pwrite_all(fd, header, 0)
        os.posix_fallocate(fd, 0, allocated)
        if fsync:
            os.fsync(fd)
        temporary.rename(path)
        if fsync:
            fsync_directory(directory)
    except BaseException:
        os.close(fd)
        temporary.unlink(missing_ok=True)
        raise
    return path, fd


def replay_files(
    directory: Path, start: JournalMark | None
) -> Generator[tuple[JournalMark, bytes], None, ReplayEnd]:
    """Every record of `directory`'s files after `start` (all if None), in order; returns
    the end of the last file's records and the damage found (see journal.py)."""
    files = journal_files(directory)
    if start is not None:
        if start.file_id not in {file_id for file_id, _ in files}:
            raise MalformedData(
                f"{directory / file_name(start.file_id)}, the journal file of "
                f"checkpoint mark {tuple(start)}, is missing"
            )
        files = [(file_id, path) for file_id, path in files if file_id >= start.file_id]
    headers = [read_header(path, file_id) for file_id, path in files]
    for (previous_id, previous_path), header, (_, path) in zip(
        files, headers[1:], files[1:], strict=False
    ):
        if header.previous_file_id != previous_id:
            raise MalformedData(
                f"{path} follows journal file {header.previous_file_id:016x}, "
                f"but the file before it is {previous_path}: a journal file is missing"
            )
    damage: list[Damage] = []
    tail = None
    for index, (file_id, path) in enumerate(files):
        begin = start.offset if start is not None and file_id == start.file_id else HEADER_SIZE
        end = headers[index + 1].previous_end if index + 1 < len(files) else None
        scan = yield from read_records(path, file_id, begin, end)
        damage.extend(scan.damage)
        if end is None:
            tail = JournalMark(file_id, scan.end)
    return ReplayEnd(tail, tuple(damage))


def release_files(directory: Path, limit: int, keep: Collection[int], *, fsync: bool) -> list[Path]:
    """Delete the files with ids below `limit` but those in `keep`; returns those deleted."""
    released = [
        path
        for file_id, path in journal_files(directory)
        if file_id < limit and file_id not in keep
    ]
    for path in released:
        path.unlink(missing_ok=True)
    if released and fsync:
        fsync_directory(directory)
    return released


def read_header(path: Path, file_id: int) -> FileHeader:
    with path.open("rb") as f:
        return FileHeader.from_bytes(f.read(HEADER_SIZE), file_id, str(path))


def read_records(
    path: Path, file_id: int, begin: int = HEADER_SIZE, end: int | None = None
) -> Records:
    """The records of one file from `begin`, up to `end` if its successor recorded one;
    returns how they ended (journal_format.scan_records), logging damage and a torn tail.

    A file shorter than its recorded end lost records too: damage from where it stops.
    """
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        bound = size if end is None else min(end, size)
        if not HEADER_SIZE <= begin <= max(bound, HEADER_SIZE):
            raise MalformedData(
                f"{path}: replay would start at offset {begin}, outside its records "
                f"[{HEADER_SIZE}, {bound}]"
            )
        if begin >= bound:
            scan = Scan(begin, None, ())
        else:
            with (
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
                memoryview(mapped) as view,
            ):
                mapped.madvise(mmap.MADV_SEQUENTIAL)
                scan = yield from scan_records(
                    view, file_id, begin, bound, end_recorded=end is not None
                )
    if end is not None and size < end:
        cut = Damage(file_id, size, end, f"the file ends at {size}, before its recorded end")
        scan = Scan(scan.end, None, (*scan.damage, cut))
    for damage in scan.damage:
        log.error(
            "%s: %s at offset %d: no valid record in [%d, %d), where acknowledged records "
            "were; replay goes on after it",
            path,
            damage.problem,
            damage.start,
            damage.start,
            damage.end,
        )
    if scan.torn is not None:
        log.warning(
            "%s: %s at offset %d, and no valid record after it: a torn write at the tail of "
            "the last journal file; replay stops there and the next start writes a new file",
            path,
            scan.torn,
            scan.end,
        )
    return scan


def records_end(path: Path, file_id: int) -> int:
    """Where the records of the (last) file end, read through."""
    read_header(path, file_id)
    records = read_records(path, file_id)
    while True:
        try:
            next(records)
        except StopIteration as done:
            scan: Scan = done.value
            return scan.end


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of `data` at `offset`."""
    written = os.pwrite(fd, data, offset)
    if written < len(data):
        with memoryview(data) as view:  # cut short (a signal, a nearly full disk): go on
            while written < len(view):
                more = os.pwrite(fd, view[written:], offset + written)
                if more <= 0:
                    raise OSError(f"journal write made no progress at offset {offset + written}")
                written += more


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
