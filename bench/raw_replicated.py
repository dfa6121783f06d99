"""The least a replicated write can cost on this machine in Python: a bare client writes each
record to three bare bookies and counts it acknowledged once two of them have fdatasynced
it (E=3 WQ=3 AQ=2), with nothing else in the way: no ledger, no metadata, no index, no
admission, no metrics. It is the reference bench_etcd_peer prints beside tally's rate, since
tally's figure can only approach this one.

A bare bookie is an asyncio server: it takes the frames of each receive, checks each
record's CRC32C, and hands the receive's records to a journal thread, which writes whatever
has gathered in one write and one fdatasync and then has the loop answer them, one write per
connection. The bare client keeps a future per record (as an API that answers each write
must), builds each frame once, writes it to the three connections once per loop turn, and
counts the answers. The load keeps `window` records in flight, one new one for each
acknowledged, like bench_client's windowed load. It prints writes/s and the CPU per write of
the client and the three bookies.

With `--storage`, the writes also do the work BookKeeper's design adds to every entry, at
its cheapest: the client prefixes each record with its own CRC32C digest, which the bookies
check beside the frame's; and once the
journal batch is answered, the records appended to an entry log and a RocksDB key per record
(its location) written in one batch, the entry log fdatasynced and RocksDB's WAL flushed
once a second: a checkpoint, on a thread of its own as tally's is, which the journal's
group commits do not wait for. Still no protocol, ledger state, admission or metrics.

    python bench/raw_replicated.py [--seconds S] [--size B] [--window N] [--dir D] [--storage]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import struct
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Generic, TypeAlias, TypeVar

import crc32c
import rocksdict

from bench_client import cpu_seconds
from raw_socket import FramedProtocol

BOOKIES = 3
ACK_QUORUM = 2
_HEAD = struct.Struct(">IQQI")  # length, request id, entry id, crc32c of the payload
_REPLY = struct.Struct(">IQ")  # length, request id
_DIGESTED = _HEAD.size + 4  # with --storage, a record's payload follows its own CRC32C
_KEY = struct.Struct(">QQQ")  # scope, ledger, entry id: tally's index key
_LOCATION = struct.Struct(">IQI")  # entry log, offset, size
CHECKPOINT_INTERVAL = 1.0

T = TypeVar("T")
_Batch: TypeAlias = tuple[list[bytes], list[bytes], asyncio.Transport]
"""A receive's records, their replies, and the connection to answer on."""


class _Batches(Generic[T]):
    """Items handed over from the loop and taken all at once by a thread of their own, which
    ends the bookie process if it raises: its clients then lose their connections and the
    load fails, where it would wait for answers."""

    def __init__(self, process: Callable[[list[T]], None]) -> None:
        self._process = process
        self._pending: list[T] = []
        self._wake = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def give(self, items: Iterable[T]) -> None:
        with self._wake:
            self._pending.extend(items)
            self._wake.notify()

    def _run(self) -> None:
        try:
            while True:
                with self._wake:
                    while not self._pending:
                        self._wake.wait()
                    taken, self._pending = self._pending, []
                self._process(taken)
        except BaseException:
            traceback.print_exc()
            os._exit(3)


class _Storage:
    """The entry log and index of a bookie, on a thread of their own as a checkpoint is
    (the journal's group commits do not wait for them): each answered batch appended and
    indexed, made durable once a CHECKPOINT_INTERVAL."""

    def __init__(self, directory: Path) -> None:
        self._log = os.open(directory / "entry-log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._offset = 0
        self._index = rocksdict.Rdict(
            str(directory / "index"), options=rocksdict.Options(raw_mode=True)
        )
        self._synced = time.monotonic()
        self._records = _Batches(self._store)

    def keep(self, records: list[bytes]) -> None:
        self._records.give(records)

    def _store(self, records: list[bytes]) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        offset = self._offset
        for record in records:
            entry_id = _HEAD.unpack_from(record)[2]
            batch.put(_KEY.pack(0, 1, entry_id), _LOCATION.pack(1, offset, len(record)))
            offset += len(record)
        os.write(self._log, b"".join(records))
        self._index.write(batch)
        self._offset = offset
        if time.monotonic() - self._synced >= CHECKPOINT_INTERVAL:
            os.fdatasync(self._log)
            self._index.flush_wal(True)
            self._synced = time.monotonic()


class _Journal:
    """Group commit on a thread: every batch handed over meanwhile is written and fdatasynced
    together, then answered on the loop."""

    def __init__(
        self, path: Path, loop: asyncio.AbstractEventLoop, storage: _Storage | None
    ) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self._loop = loop
        self._storage = storage
        self._batches: _Batches[_Batch] = _Batches(self._commit)

    def append(
        self, records: list[bytes], replies: list[bytes], transport: asyncio.Transport
    ) -> None:
        self._batches.give([(records, replies, transport)])

    def _commit(self, batches: list[_Batch]) -> None:
        os.write(self._fd, b"".join(b"".join(records) for records, _, _ in batches))
        os.fdatasync(self._fd)
        self._loop.call_soon_threadsafe(_answer, batches)
        if self._storage is not None:
            self._storage.keep([record for records, _, _ in batches for record in records])


def _answer(batches: list[_Batch]) -> None:
    for _, replies, transport in batches:
        transport.write(b"".join(replies))


class _Bookie(FramedProtocol):
    def __init__(self, journal: _Journal, digests: bool) -> None:
        super().__init__()
        self._journal = journal
        self._digests = digests

    def data_received(self, data: bytes) -> None:
        records: list[bytes] = []
        replies: list[bytes] = []
        for view, pos in self._frames.feed(data):
            length, request_id, _, crc = _HEAD.unpack_from(view, pos)
            record = bytes(view[pos : pos + 4 + length])
            if crc32c.crc32c(memoryview(record)[_HEAD.size :]) != crc:
                raise ValueError(f"request {request_id}: bad CRC32C")
            if self._digests and crc32c.crc32c(memoryview(record)[_DIGESTED:]) != int.from_bytes(
                record[_HEAD.size : _DIGESTED], "big"
            ):
                raise ValueError(f"request {request_id}: bad digest")
            records.append(record)
            replies.append(_REPLY.pack(_REPLY.size - 4, request_id))
        if records and self._transport is not None:
            self._journal.append(records, replies, self._transport)


def _serve(directory: str, report: Connection, storage: bool) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        own = Path(tempfile.mkdtemp(prefix="bookie-", dir=directory))
        journal = _Journal(own / "journal", loop, _Storage(own) if storage else None)
        server = await loop.create_server(lambda: _Bookie(journal, storage), "127.0.0.1", 0)
        report.send((os.getpid(), server.sockets[0].getsockname()[1]))
        await server.serve_forever()

    asyncio.run(run())


class _Connection(FramedProtocol):
    """One bookie's connection: frames out once per loop turn, answers counted."""

    def __init__(self, client: _Client) -> None:
        super().__init__()
        self._client = client
        self.outbox: list[bytes] = []

    def flush(self) -> None:
        if self.outbox and self._transport is not None:
            self._transport.write(b"".join(self.outbox))
            self.outbox.clear()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        answered = self._client.answered
        for view, pos in self._frames.feed(data):
            answered(_REPLY.unpack_from(view, pos)[1])

    def connection_lost(self, exc: Exception | None) -> None:
        self._client.lost()


class _Pending:
    __slots__ = ("answers", "future")

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.answers = 0
        self.future = future


class _Client:
    def __init__(self, loop: asyncio.AbstractEventLoop, digests: bool) -> None:
        self._loop = loop
        self._digests = digests
        self.connections: list[_Connection] = []
        self._pending: dict[int, _Pending] = {}
        self._next = 0
        self._flush_scheduled = False

    def append_nowait(self, payload: bytes) -> asyncio.Future[None]:
        request_id = self._next
        self._next += 1
        if self._digests:
            payload = crc32c.crc32c(payload).to_bytes(4, "big") + payload
        frame = (
            _HEAD.pack(
                _HEAD.size - 4 + len(payload), request_id, request_id, crc32c.crc32c(payload)
            )
            + payload
        )
        future: asyncio.Future[None] = self._loop.create_future()
        self._pending[request_id] = _Pending(future)
        for connection in self.connections:
            connection.outbox.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._flush_scheduled = False
        for connection in self.connections:
            connection.flush()

    def lost(self) -> None:
        """A bookie is gone (or the load is over): whatever still waits fails."""
        pending, self._pending = self._pending, {}
        for waiting in pending.values():
            if not waiting.future.done():
                waiting.future.set_exception(ConnectionError("a bare bookie went away"))

    def answered(self, request_id: int) -> None:
        pending = self._pending.get(request_id)
        if pending is None:
            return  # failed when a bookie went away
        pending.answers += 1
        if pending.answers == ACK_QUORUM:
            pending.future.set_result(None)
        elif pending.answers == BOOKIES:
            del self._pending[request_id]


async def _load(
    ports: Sequence[int],
    pids: Sequence[int],
    size: int,
    window: int,
    seconds: float,
    storage: bool,
) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    client = _Client(loop, storage)
    for port in ports:
        _, connection = await loop.create_connection(lambda: _Connection(client), "127.0.0.1", port)
        client.connections.append(connection)
    payload = os.urandom(size)
    append = client.append_nowait
    in_flight = deque(append(payload) for _ in range(window))
    warm_up = time.perf_counter() + seconds / 10
    while time.perf_counter() < warm_up:
        await in_flight.popleft()
        in_flight.append(append(payload))
    done, started = 0, time.perf_counter()
    cpu, bookie_cpu = time.process_time(), cpu_seconds(pids)
    while True:
        await in_flight.popleft()
        in_flight.append(append(payload))
        done += 1
        if not done % 100 and time.perf_counter() >= started + seconds:
            break
    elapsed = time.perf_counter() - started
    cpu, bookie_cpu = time.process_time() - cpu, cpu_seconds(pids) - bookie_cpu
    for future in in_flight:
        await future
    for connection in client.connections:
        connection.close()
    return {
        "writes_per_s": done / elapsed,
        "client_cpu_us_per_write": cpu / done * 1e6,
        "bookies_cpu_us_per_write": bookie_cpu / done * 1e6,
    }


async def _bounded(load: Coroutine[Any, Any, dict[str, float]], seconds: float) -> dict[str, float]:
    """`load`, ended with TimeoutError if it outlasts its seconds by far (a bare bookie
    that died leaves its records unanswered)."""
    async with asyncio.timeout(seconds * 3 + 30):
        return await load


def replicated_floor(
    directory: Path,
    size: int = 1024,
    window: int = 1_000,
    seconds: float = 4.0,
    storage: bool = False,
) -> dict[str, float]:
    """Writes/s and CPU per write of the bare client and bookies, with `storage` the
    design's work per entry too (see the module's doc)."""
    context = multiprocessing.get_context("spawn")
    processes = []
    ports, pids = [], []
    try:
        for _ in range(BOOKIES):
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(
                target=_serve, args=(str(directory), sender, storage), daemon=True
            )
            process.start()
            processes.append(process)
            if not receiver.poll(30):
                raise RuntimeError("a bare bookie did not start")
            pid, port = receiver.recv()
            pids.append(pid)
            ports.append(port)
        load = _load(ports, pids, size, window, seconds, storage)
        return asyncio.run(_bounded(load, seconds))
    finally:
        for process in processes:
            process.terminate()
            process.join()


def print_floor(figures: dict[str, float], storage: bool = False) -> None:
    kind = "with digests, entry log and index" if storage else "no protocol"
    print(
        f"bare Python replicated writes (E3 WQ3 AQ2, {kind}): "
        f"{figures['writes_per_s']:,.0f}/s (CPU per write: client "
        f"{figures['client_cpu_us_per_write']:.0f} us, 3 bookies "
        f"{figures['bookies_cpu_us_per_write']:.0f} us)"
    )


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--window", type=int, default=1_000)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument(
        "--storage", action="store_true", help="add the design's digests, entry log and index"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        figures = replicated_floor(
            Path(scratch), args.size, args.window, args.seconds, args.storage
        )
    print_floor(figures, args.storage)
    return figures


if __name__ == "__main__":
    main()
