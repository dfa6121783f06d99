"""Receive limits, against real bookie processes on loopback: what frames begun and not yet
complete may hold of a bookie's memory over all its connections, and the closing of a
connection whose frame stops arriving.

Many slow senders of large frames are the case the budget is for: without it, each of 40
connections holding an unfinished 5 MiB frame held 5 MiB of the bookie (its RSS grew by
about 200 MiB). The stall tests use a second bookie with a short stall timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tally.core.errors import NoSuchLedger
from tally.core.ids import LedgerId
from tally.core.protocol import (
    MAX_FRAME_SIZE,
    AddRequest,
    AddResponse,
    ErrorResponse,
    ReadLacRequest,
)
from tally.core.protocol.wire import ADD
from tests.bookie.conftest import (
    KEY,
    BookieUnderTest,
    RawConnection,
    connected,
    entry,
    new_ledger,
    running,
    sample,
)
from tests.support.polling import until

PREFIX = 4
"""A frame's length prefix, which its length (and the budget) does not count."""
MiB = 1 << 20

SENDERS = 40
BUDGET = 16 * MiB
"""Room for three unfinished frames of the default largest size (5 MiB) at once."""
CHUNK = 256 << 10

STALL_TIMEOUT = 1.0
SMALL_FRAME_LIMIT = 2 * MiB
"""The stall tests' bookie: its budget holds exactly one frame of its largest size."""


def add_frame(request_id: int, ledger: LedgerId, length: int) -> bytes:
    """An ADD of entry 0 of `ledger` whose frame is `length` bytes after its prefix."""
    empty = AddRequest.for_entry(request_id, entry(ledger, 0, b""), KEY).encode()
    payload = bytes([ledger.id % 251]) * (length + PREFIX - len(empty))
    frame = AddRequest.for_entry(request_id, entry(ledger, 0, payload), KEY).encode()
    assert len(frame) == PREFIX + length
    return frame


def memory_kib(pid: int, field: str) -> int:
    """A figure of /proc/PID/status in KiB: VmRSS (resident now), VmHWM (its peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def reset_peak(pid: int) -> None:
    """Start VmHWM again from the current RSS (Linux: 5 into clear_refs)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def receive_gauges(bookie: BookieUnderTest) -> tuple[float, float]:
    """(bytes held by unfinished frames, connections waiting for the budget)."""
    samples = bookie.metrics()
    return (
        sample(samples, "bookie_receive_buffer_bytes"),
        sample(samples, "bookie_receive_paused_connections"),
    )


async def test_slow_large_frames_hold_no_more_than_the_budget_and_all_complete(
    cluster: str, tmp_path: Path
) -> None:
    frame_length = MAX_FRAME_SIZE
    fitting = BUDGET // frame_length
    settings = {"receive_buffer_limit_bytes": BUDGET}
    with running(BookieUnderTest(cluster, tmp_path / "bookie", settings=settings)) as bookie:
        assert bookie.process is not None
        pid = bookie.process.pid
        ledgers = [new_ledger() for _ in range(SENDERS)]
        frames = [add_frame(i, ledger, frame_length) for i, ledger in enumerate(ledgers)]
        senders = [await RawConnection.open(bookie.address) for _ in range(SENDERS)]
        try:
            for sender in senders:  # a round trip each: the bookie has taken them all in
                await sender.send(ReadLacRequest(SENDERS, new_ledger()).encode())
                (answer,) = await sender.responses(1)
                assert isinstance(answer, ErrorResponse)
                assert isinstance(answer.error(), NoSuchLedger)
            baseline = memory_kib(pid, "VmRSS")
            reset_peak(pid)

            finish = asyncio.Event()
            sent = 0

            async def send_slowly(sender: RawConnection, frame: bytes) -> object:
                """All but the last byte, a chunk at a time; the last one on `finish`."""
                nonlocal sent
                for start in range(0, len(frame) - 1, CHUNK):
                    await sender.send(frame[start : min(start + CHUNK, len(frame) - 1)])
                    await asyncio.sleep(0.01)
                sent += 1
                await finish.wait()
                await sender.send(frame[-1:])
                (answer,) = await sender.responses(1, timeout=60)
                return answer

            sending = [
                asyncio.create_task(send_slowly(sender, frame))
                for sender, frame in zip(senders, frames, strict=True)
            ]
            full = (fitting * frame_length, SENDERS - fitting)
            await until(lambda: receive_gauges(bookie) == full, f"{full} held, paused", step=0.05)
            await until(lambda: sent >= fitting, "the first senders' frames sent", timeout=30)
            grown = memory_kib(pid, "VmHWM") - baseline
            assert grown * 1024 < BUDGET + 16 * MiB, f"RSS grew by {grown} KiB"

            finish.set()
            most = (0.0, 0.0)
            while not all(task.done() for task in sending):
                held, paused = receive_gauges(bookie)
                most = (max(most[0], held), max(most[1], paused))
                await asyncio.sleep(0.05)
            answers = [await task for task in sending]
        finally:
            for sender in senders:
                await sender.close()
        assert answers == [AddResponse(i, ledger, 0) for i, ledger in enumerate(ledgers)]
        assert most[0] <= BUDGET
        assert receive_gauges(bookie) == (0, 0)
        async with connected(bookie.address) as reader:
            for sender in (0, SENDERS // 2, SENDERS - 1):
                assert await reader.read(ledgers[sender], 0) == frames[sender][ADD.size :]


@pytest.fixture(scope="module")
def stalls(cluster: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BookieUnderTest]:
    settings = {
        "receive_stall_timeout": STALL_TIMEOUT,
        "max_frame_size": SMALL_FRAME_LIMIT,
        "receive_buffer_limit_bytes": SMALL_FRAME_LIMIT,
    }
    data_dir = tmp_path_factory.mktemp("stalls") / "bookie"
    with running(BookieUnderTest(cluster, data_dir, settings=settings)) as started:
        yield started


async def test_a_frame_that_stops_arriving_closes_its_connection_after_the_timeout(
    stalls: BookieUnderTest,
) -> None:
    before = stalls.metrics()
    working, quiet = new_ledger(), new_ledger()
    frame = add_frame(1, quiet, 64 << 10)
    added = 0
    async with connected(stalls.address) as healthy:
        stalled = await RawConnection.open(stalls.address)
        try:
            peer = stalled.local_address
            started = time.monotonic()
            await stalled.send(frame[: len(frame) // 2])
            closing = asyncio.create_task(stalled.closed_by_bookie(timeout=10 * STALL_TIMEOUT))
            while not closing.done():  # the bookie keeps serving everyone else meanwhile
                await healthy.add(entry(working, added), KEY)
                added += 1
            assert await closing
            waited = time.monotonic() - started
        finally:
            await stalled.close()
        assert waited >= STALL_TIMEOUT
        assert added > 0
        assert await healthy.read(working, added - 1) == entry(working, added - 1)
    after = stalls.metrics()
    assert sample(after, "bookie_receive_stalled_connections_total") == 1 + sample(
        before, "bookie_receive_stalled_connections_total"
    )
    assert sample(after, "bookie_malformed_frames_total") == sample(
        before, "bookie_malformed_frames_total"
    )
    assert receive_gauges(stalls) == (0, 0)
    assert f"closing connection from {peer}: its unfinished frame" in stalls.log()


async def test_waiting_for_the_budget_longer_than_the_stall_timeout_is_no_stall(
    stalls: BookieUnderTest,
) -> None:
    """The budget holds one largest frame: a second one waits, unread, while the first
    arrives slowly (never a stall timeout without a byte); then it is read and answered."""
    before = stalls.metrics()
    first_ledger, second_ledger = new_ledger(), new_ledger()
    first = add_frame(1, first_ledger, SMALL_FRAME_LIMIT)
    second = add_frame(2, second_ledger, SMALL_FRAME_LIMIT)
    slow, waiting = [await RawConnection.open(stalls.address) for _ in range(2)]
    try:
        await slow.send(first[:CHUNK])
        await until(lambda: receive_gauges(stalls) == (SMALL_FRAME_LIMIT, 0), "first held")
        sending = asyncio.create_task(waiting.send(second))
        await until(lambda: receive_gauges(stalls) == (SMALL_FRAME_LIMIT, 1), "second paused")
        paused = time.monotonic()
        for start in range(CHUNK, len(first), CHUNK):  # the rest, well within the timeout
            await asyncio.sleep(STALL_TIMEOUT / 4)
            await slow.send(first[start : start + CHUNK])
        assert await slow.responses(1) == [AddResponse(1, first_ledger, 0)]
        assert await waiting.responses(1) == [AddResponse(2, second_ledger, 0)]
        waited = time.monotonic() - paused
        await sending
    finally:
        for connection in (slow, waiting):
            await connection.close()
    assert waited > STALL_TIMEOUT
    after = stalls.metrics()
    assert sample(after, "bookie_receive_stalled_connections_total") == sample(
        before, "bookie_receive_stalled_connections_total"
    )
    assert receive_gauges(stalls) == (0, 0)
