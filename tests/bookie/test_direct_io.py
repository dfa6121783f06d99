"""O_DIRECT appends through an aligned buffer, on real files of the test machine's disk."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.bookie.direct_io import (
    ALIGNMENT,
    DirectAppender,
    aligned_down,
    aligned_up,
    enable_direct,
)


@contextlib.contextmanager
def direct_file(path: Path, head: bytes = b"") -> Iterator[int]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, head)
        if not enable_direct(fd):
            pytest.skip(f"the file system of {path} refuses O_DIRECT")
        yield fd
    finally:
        os.close(fd)


part_sizes = st.integers(0, 3 * ALIGNMENT + 17) | st.sampled_from([16 << 10, 20_000, 40_000])
"""Parts within a block or a few, and entry-sized ones that span several buffers."""
appends = st.lists(st.lists(part_sizes, max_size=12), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None)
@given(
    head=st.integers(0, 2 * ALIGNMENT + 100),
    sizes=appends,
    buffer_blocks=st.integers(1, 16),
)
def test_the_file_holds_exactly_what_was_appended_then_zeros_to_a_block(
    tmp_path_factory: pytest.TempPathFactory, head: int, sizes: list[list[int]], buffer_blocks: int
) -> None:
    path = tmp_path_factory.mktemp("direct") / "file"
    before = os.urandom(head)
    with direct_file(path, before) as fd:
        kept = before[aligned_down(head) :]
        appender = DirectAppender(fd, head, kept, buffer_size=buffer_blocks * ALIGNMENT)
        expected = bytearray(before)
        for append in sizes:
            parts = [os.urandom(size) for size in append]
            appender.append(parts)
            expected += b"".join(parts)
            assert appender.position == len(expected)
            content = path.read_bytes()
            assert content[: len(expected)] == expected, "every byte appended, none changed"
            assert len(content) in {len(expected), aligned_up(len(expected))}
            assert not any(content[len(expected) :]), "padded with zeros"
        appender.close()


def test_a_head_that_does_not_match_the_position_is_refused(tmp_path: Path) -> None:
    with direct_file(tmp_path / "file") as fd:
        with pytest.raises(ValueError, match="head of 3 bytes"):
            DirectAppender(fd, 10, b"abc")
        with pytest.raises(ValueError, match="multiple"):
            DirectAppender(fd, 0, buffer_size=ALIGNMENT + 1)


def test_a_short_write_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """O_DIRECT writes fail short only when the disk fills: never taken as success."""
    with direct_file(tmp_path / "file") as fd:
        appender = DirectAppender(fd, 0)
        monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: len(data) - ALIGNMENT)
        with pytest.raises(OSError, match="wrote") as raised:
            appender.append([b"x" * (3 * ALIGNMENT)])
        assert raised.value.errno == errno.ENOSPC
        appender.close()


def test_a_file_system_that_refuses_o_direct_is_reported_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulated: this machine's file systems all take O_DIRECT (tmpfs too, since Linux 6.6)."""
    real = fcntl.fcntl

    def refusing(fd: int, command: int, argument: int = 0) -> int:
        if command == fcntl.F_SETFL and argument & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(fd, command, argument)

    monkeypatch.setattr(fcntl, "fcntl", refusing)
    fd = os.open(tmp_path / "file", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert enable_direct(fd) is False
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="Bad file descriptor"):
        enable_direct(fd)
