"""Small real file systems for tests of full and failing disks.

A test that needs a disk to run out of room, or to vanish, makes its own: an ext4 image
loop-mounted (what a bookie's disk usually is) or a tmpfs of a given size, mounted over a
directory and unmounted when the test ends, whatever happened. The tests run as root, as
mounting needs. `fill` takes a file system's free space but a little, as a filler file
that the test deletes to give the room back.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

FILLER = "filler"


class FilesystemRefused(RuntimeError):
    """This process may not make or mount the file system (not root, no loop device)."""


@contextlib.contextmanager
def small_filesystem(
    path: Path, size: int, kind: Literal["ext4", "tmpfs"] = "ext4"
) -> Iterator[Path]:
    """A fresh file system of `size` bytes mounted at `path` (made if missing); yields
    `path`. ext4: an image beside `path` (`<path>.img`), made without reserved blocks and
    loop-mounted; tmpfs: memory. Unmounted, and the image deleted, at the end."""
    path.mkdir(parents=True, exist_ok=True)
    image = path.with_name(path.name + ".img")
    if kind == "ext4":
        with image.open("wb") as f:
            f.truncate(size)
        _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))
        mount = ("mount", "-o", "loop", str(image), str(path))
    else:
        mount = ("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    try:
        _run(*mount)
    except FilesystemRefused:
        image.unlink(missing_ok=True)
        raise
    try:
        yield path
    finally:
        unmounted = subprocess.run(["umount", str(path)], capture_output=True, check=False)
        if unmounted.returncode != 0:  # busy: detach it all the same, never leave it behind
            subprocess.run(["umount", "--lazy", str(path)], capture_output=True, check=False)
        image.unlink(missing_ok=True)


def free_bytes(directory: Path) -> int:
    """The room left for files on `directory`'s file system."""
    space = os.statvfs(directory)
    return space.f_bavail * space.f_frsize


def fill(directory: Path, leave: int) -> Path:
    """Take the free space of `directory`'s file system but about `leave` bytes (never
    more), in the file `directory/filler`; returns it (delete it to give the room back)."""
    filler = directory / FILLER
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        step = 4 << 20
        while step >= 4096:
            room = free_bytes(directory) - leave
            if room <= 0:
                break
            length = min(room, step)
            try:
                os.posix_fallocate(fd, size, length)
            except OSError as error:  # the extents' own blocks took the last of it
                if error.errno != errno.ENOSPC:
                    raise
                step //= 2
                continue
            size += length
        os.fsync(fd)
    finally:
        os.close(fd)
    return filler


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise FilesystemRefused(f"{' '.join(command)}: {done.stderr.strip()}")
