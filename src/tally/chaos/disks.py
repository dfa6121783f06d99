"""Small real file systems for tests of full and failing disks.

A test that needs a disk to run out of room, or to vanish, makes its own: an ext4 image
loop-mounted (what a bookie's disk usually is) or a tmpfs of a given size, mounted over a
directory and unmounted when the test ends, whatever happened. The tests run as root, as
mounting needs. `fill` takes a file system's free space but a little, as a filler file
that the test deletes to give the room back. `fail_read_only` and `unmount_lazily` make a
disk fail under a running process; `check_and_mount_again` is the operator's repair.
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
EXT4_OPTIONS = "loop,errors=remount-ro"
"""As a data disk is mounted: an error in the file system turns it read-only (`fail_read_only`)."""


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
        mount = ("mount", "-o", EXT4_OPTIONS, str(image), str(path))
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


def fail_read_only(path: Path) -> None:
    """Make the ext4 file system at `path` fail as on a disk error: the kernel remounts it
    read-only (errors=remount-ro), and every write to it fails with EROFS from then on."""
    source = subprocess.run(
        ["findmnt", "-no", "SOURCE", str(path)], capture_output=True, text=True, check=True
    )
    device = Path(source.stdout.strip()).name
    Path(f"/sys/fs/ext4/{device}/trigger_fs_error").write_text("tally test: disk failure\n")


def unmount_lazily(path: Path) -> None:
    """Take the file system at `path` away under the processes using it (`umount -l`): the
    path then shows the directory below, and files open there stay open on the old one."""
    _run("umount", "--lazy", str(path))


def check_and_mount_again(path: Path) -> None:
    """What an operator does with an ext4 disk that failed, once nothing uses it: unmount,
    check and repair it, mount it again (read-write)."""
    image = path.with_name(path.name + ".img")
    _run("umount", str(path))
    checked = subprocess.run(["e2fsck", "-fy", str(image)], capture_output=True, text=True)
    if checked.returncode not in (0, 1):  # 1: errors found and fixed
        raise FilesystemRefused(f"e2fsck {image}: {checked.stdout.strip()}")
    _run("mount", "-o", EXT4_OPTIONS, str(image), str(path))
