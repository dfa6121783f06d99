"""Small real file systems for tests that need a disk of their own: one that fills up, fails,
turns read-only or goes away under a running process. The tests run as root.

`small_filesystem` mounts one at `path` (an ext4 image on a loop device, or a tmpfs) and
always unmounts it at the end, lazily if a process still holds files there.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


def _run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr}")
    return done.stdout


@contextlib.contextmanager
def small_filesystem(path: Path, size_bytes: int, kind: str = "ext4") -> Iterator[Path]:
    """A file system of `size_bytes` mounted at `path` (created if missing): "ext4" (an
    image file beside `path`, loop-mounted with errors=remount-ro) or "tmpfs"."""
    path.mkdir(parents=True, exist_ok=True)
    image = path.with_name(f"{path.name}.img")
    if kind == "ext4":
        image.unlink(missing_ok=True)
        _run("truncate", "-s", str(size_bytes), str(image))
        _run("mkfs.ext4", "-q", "-F", str(image))
        _run("mount", "-o", "loop,errors=remount-ro", str(image), str(path))
    elif kind == "tmpfs":
        _run("mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path))
    else:
        raise ValueError(f"no small file system of kind {kind!r}")
    try:
        yield path
    finally:
        if is_mounted(path):
            done = subprocess.run(["umount", str(path)], capture_output=True, timeout=60)
            if done.returncode != 0:
                _run("umount", "-l", str(path))
        image.unlink(missing_ok=True)


def is_mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)], check=False).returncode == 0


def fail_read_only(path: Path) -> None:
    """Make the ext4 file system at `path` fail as on a disk error: the kernel remounts it
    read-only (errors=remount-ro), and every write to it fails with EROFS from then on."""
    device = Path(_run("findmnt", "-no", "SOURCE", str(path)).strip()).name
    Path(f"/sys/fs/ext4/{device}/trigger_fs_error").write_text("tally test: disk failure\n")


def check_and_mount_again(path: Path) -> None:
    """What an operator does with an ext4 disk that failed, once nothing uses it: unmount,
    check and repair it, mount it again (read-write)."""
    image = path.with_name(f"{path.name}.img")
    _run("umount", str(path))
    done = subprocess.run(["e2fsck", "-fy", str(image)], capture_output=True, text=True)
    if done.returncode not in (0, 1):  # 1: errors found and fixed
        raise AssertionError(f"e2fsck {image} failed ({done.returncode}): {done.stdout}")
    _run("mount", "-o", "loop,errors=remount-ro", str(image), str(path))


def unmount_lazily(path: Path) -> None:
    """Take the file system at `path` away under the processes using it (`umount -l`): the
    path then shows the directory below, and files open there stay open on the old one."""
    _run("umount", "-l", str(path))
