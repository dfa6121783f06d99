"""Small real file systems, for the chaos run's disk faults and for tests of full and
failing disks.

A disk here is an ext4 image loop-mounted on a directory (what a bookie's disk usually
is), or a tmpfs of a given size: made, mounted, unmounted and replaced by an empty one as
an operator would, which needs root. `fill` takes a file system's free space but a
little, as a filler file to delete to give the room back; `fail_read_only` and
`unmount_lazily` make a disk fail under a running process; `check_and_mount_again` is the
operator's repair of a disk that is kept.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

FILLER = "filler"
EXT4_OPTIONS = "loop,errors=remount-ro"
"""As a data disk is mounted: an error in the file system turns it read-only (`fail_read_only`)."""


class FilesystemRefused(RuntimeError):
    """This process may not make or mount the file system (not root, no loop device)."""


@dataclass(frozen=True)
class Disk:
    """A file system of `size` bytes mounted at `path`; an ext4 one lives in the image
    `<path>.img` beside it (sparse, made without reserved blocks)."""

    path: Path
    size: int
    kind: Literal["ext4", "tmpfs"] = "ext4"

    @property
    def image(self) -> Path:
        return self.path.with_name(self.path.name + ".img")

    def mount(self) -> None:
        """Make the file system anew (empty) and mount it at `path` (made if missing)."""
        self.path.mkdir(parents=True, exist_ok=True)
        command: tuple[str, ...]
        if self.kind == "ext4":
            with self.image.open("wb") as f:
                f.truncate(self.size)
            _run("mkfs.ext4", "-q", "-F", "-m", "0", str(self.image))
            command = ("mount", "-o", EXT4_OPTIONS, str(self.image), str(self.path))
        else:
            command = ("mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.path))
        try:
            _run(*command)
        except FilesystemRefused:
            self.image.unlink(missing_ok=True)
            raise

    def unmount(self) -> None:
        """Unmount it, and detach it all the same if it is busy: never left behind."""
        unmounted = subprocess.run(["umount", str(self.path)], capture_output=True, check=False)
        if unmounted.returncode != 0:
            subprocess.run(["umount", "--lazy", str(self.path)], capture_output=True, check=False)

    def replace(self) -> None:
        """What an operator does with a disk that failed and is lost: a new, empty one in
        its place (nothing may use the old one)."""
        self.unmount()
        self.mount()

    def remove(self) -> None:
        self.unmount()
        self.image.unlink(missing_ok=True)


@contextlib.contextmanager
def small_filesystem(
    path: Path, size: int, kind: Literal["ext4", "tmpfs"] = "ext4"
) -> Iterator[Path]:
    """A fresh file system of `size` bytes mounted at `path`; yields `path`. Unmounted, and
    the image deleted, at the end."""
    disk = Disk(path, size, kind)
    disk.mount()
    try:
        yield path
    finally:
        disk.remove()


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
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise FilesystemRefused(f"{command[0]} is not installed") from None
    if done.returncode != 0:
        raise FilesystemRefused(f"{' '.join(command)}: {done.stderr.strip()}")


def fail_read_only(path: Path) -> None:
    """Make the ext4 file system at `path` fail as on a disk error: the kernel remounts it
    read-only (errors=remount-ro), and every write to it fails with EROFS from then on."""
    source = subprocess.run(
        ["findmnt", "-no", "SOURCE", str(path)], capture_output=True, text=True, check=True
    )
    device = Path(source.stdout.strip()).name
    Path(f"/sys/fs/ext4/{device}/trigger_fs_error").write_text("tally: disk failure\n")


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
