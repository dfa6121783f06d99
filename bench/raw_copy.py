"""The least a re-replication can cost on this machine in Python: 64 KiB entries read from a
file with O_DIRECT by a source process, sent over loopback, checked (CRC32C) and written with
O_DIRECT by a target process, one fdatasync per group of batches written together (a
journal's group commit), with nothing else in the way: no
protocol, no index, no metadata, no event loop. It is the reference bench_rereplication
prints beside a repair, since a repair's figure can only approach this one, not the raw disk.

Two shapes, as a repair may run:
- direct: the target reads from the source (a bookie-to-bookie copy);
- relay: a third process reads from the source, checks each entry and sends it on to the
  target, which checks it again (the replication worker's copy, as tally runs it).

Each side keeps two reads of 1 MiB in flight; the target's receiver and its writer are two
threads, as a bookie's event loop and its journal thread are. It prints MB/s and the CPU
of each process per entry.

    python bench/raw_copy.py [--mib N] [--dir D]
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing
import os
import queue
import resource
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import crc32c

KIB, MIB = 1 << 10, 1 << 20
ENTRY = 64 * KIB
BATCH = 16
"""Entries per read: about READ_BATCH_BYTES, as a repair's READ_ENTRIES asks."""
IN_FLIGHT = 2
"""Batches of a source asked and not yet durable at the target (each source's window, a
semaphore that the target's writer releases)."""
SOURCES = 2
"""The survivors a repair reads from."""
ANSWER_SECONDS = 120
_REQUEST = struct.Struct(">QI")  # first entry, entries
_RECORD = struct.Struct(">II")  # length, crc32c


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    while view:
        got = sock.recv_into(view)
        if not got:
            raise ConnectionError("peer closed")
        view = view[got:]


def _source(path: str, report: Connection) -> None:
    """Serve batches of entries read with O_DIRECT, each after its length and CRC32C (as a
    bookie stores an entry's digest beside it), until the asker closes."""
    started = _cpu()
    listener = socket.create_server(("127.0.0.1", 0))
    report.send(listener.getsockname()[1])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buffer = mmap.mmap(-1, BATCH * ENTRY)
    request = bytearray(_REQUEST.size)
    try:
        while True:
            try:
                _recv_exactly(conn, memoryview(request))
            except ConnectionError:
                break
            first, count = _REQUEST.unpack(request)
            parts: list[bytes | memoryview] = []
            view = memoryview(buffer)
            for index in range(count):
                entry = view[index * ENTRY : (index + 1) * ENTRY]
                os.preadv(fd, [entry], (first + index) * ENTRY)
                parts.append(_RECORD.pack(ENTRY, crc32c.crc32c(entry)))
                parts.append(entry)
            conn.sendall(b"".join(parts))
    finally:
        os.close(fd)
        report.send(_cpu() - started)


def _cpu() -> float:
    """This process's CPU seconds so far; a spawned child's include its start (imports), so
    each reports the difference from when its work began."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _read_batches(
    sock: socket.socket,
    indexes: range,
    checked: queue.Queue[tuple[bytearray, threading.Semaphore] | None],
    window: threading.Semaphore,
) -> None:
    """Ask for the entries `indexes` (of this source's file), a batch at a time with at most
    IN_FLIGHT batches not yet durable; check each batch's entries and put it on `checked`
    (None if this fails, so that the consumer fails too rather than wait)."""
    asked: list[int] = []
    cursor = 0
    try:
        while cursor < len(indexes) or asked:
            while cursor < len(indexes) and window.acquire(blocking=not asked):
                count = min(BATCH, len(indexes) - cursor)
                sock.sendall(_REQUEST.pack(cursor, count))
                asked.append(count)
                cursor += count
            count = asked.pop(0)
            batch = bytearray(count * (_RECORD.size + ENTRY))
            view = memoryview(batch)
            _recv_exactly(sock, view)
            for index in range(count):
                at = index * (_RECORD.size + ENTRY)
                length, crc = _RECORD.unpack_from(view, at)
                if crc32c.crc32c(view[at + _RECORD.size : at + _RECORD.size + length]) != crc:
                    raise ValueError(f"entry {index} of a batch fails its CRC32C")
            checked.put((batch, window))
    except BaseException:
        checked.put(None)
        raise


def _checked_batch(
    checked: queue.Queue[tuple[bytearray, threading.Semaphore] | None],
) -> tuple[bytearray, threading.Semaphore]:
    item = checked.get()
    if item is None:
        raise RuntimeError("a reader failed: its batches will not come")
    return item


def _relay(source_ports: list[int], share: int, report: Connection) -> None:
    """For each source, read its entries, check them and send them on to whoever connects
    to the listener of that source, a batch for each batch asked (the replication worker's
    copy: it reads ahead of the target by its own window)."""
    started = _cpu()
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in source_ports]
    report.send([listener.getsockname()[1] for listener in listeners])

    def forward(listener: socket.socket, source_port: int) -> None:
        target, _ = listener.accept()
        target.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        source = socket.create_connection(("127.0.0.1", source_port))
        source.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        checked: queue.Queue[tuple[bytearray, threading.Semaphore] | None] = queue.Queue()
        window = threading.Semaphore(IN_FLIGHT)
        reader = threading.Thread(
            target=_read_batches, args=(source, range(share), checked, window)
        )
        reader.start()
        request = bytearray(_REQUEST.size)
        for _ in range(-(-share // BATCH)):
            _recv_exactly(target, memoryview(request))
            target.sendall(_checked_batch(checked)[0])
            window.release()
        reader.join()
        source.close()

    threads = [
        threading.Thread(target=forward, args=pair)
        for pair in zip(listeners, source_ports, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report.send(_cpu() - started)


def _target(ports: list[int], entries: int, path: str, report: Connection) -> None:
    """Read every entry from the sources (each holds an equal share), check it, and write it
    with O_DIRECT, each group of batches waiting then followed by one fdatasync, on a
    writer thread (a journal's group commit); report the seconds it took."""
    started_cpu = _cpu()
    socks = [socket.create_connection(("127.0.0.1", port)) for port in ports]
    for sock in socks:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    checked: queue.Queue[tuple[bytearray, threading.Semaphore] | None] = queue.Queue()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    group = len(ports) * IN_FLIGHT * BATCH * (ENTRY + 4 * KIB)
    aligned = mmap.mmap(-1, group)
    share = entries // len(ports)

    def write() -> None:
        offset = 0
        done = 0
        while done < len(ports) * -(-share // BATCH):
            batches = [_checked_batch(checked)]
            while not checked.empty():
                batches.append(_checked_batch(checked))
            size = 0
            for batch, _ in batches:
                aligned[size : size + len(batch)] = batch
                size += -(-len(batch) // (4 * KIB)) * 4 * KIB
            os.pwrite(fd, memoryview(aligned)[:size], offset)
            os.fdatasync(fd)
            offset += size
            for _, window in batches:
                window.release()
            done += len(batches)

    started = time.perf_counter()
    writer = threading.Thread(target=write)
    writer.start()
    readers = [
        threading.Thread(
            target=_read_batches, args=(sock, range(share), checked, threading.Semaphore(IN_FLIGHT))
        )
        for sock in socks
    ]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    writer.join()
    elapsed = time.perf_counter() - started
    os.close(fd)
    for sock in socks:
        sock.close()
    report.send((elapsed, _cpu() - started_cpu))


def _source_file(directory: Path, index: int, entries: int) -> Path:
    path = directory / f"raw-copy-source-{index}"
    block = mmap.mmap(-1, MIB)
    block.write(os.urandom(MIB))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    try:
        for offset in range(0, entries * ENTRY, MIB):
            os.pwrite(fd, block, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def copy_mb_per_s(directory: Path, mib: int, *, relay: bool) -> dict[str, float]:
    """One copy of `mib` MiB from SOURCES sources, direct or through a relay: MB/s and CPU
    µs per entry of each process."""
    share = mib * MIB // ENTRY // SOURCES
    entries = share * SOURCES
    context = multiprocessing.get_context("spawn")
    paths = [_source_file(directory, index, share) for index in range(SOURCES)]
    target_path = directory / "raw-copy-target"
    processes: list[multiprocessing.process.BaseProcess] = []
    answers: list[Connection] = []

    def start(target: Callable[..., None], *args: object) -> Connection:
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(target=target, args=(*args, sender))
        process.start()
        processes.append(process)
        answers.append(receiver)
        return receiver

    try:
        ports = [_answer(start(_source, str(path))) for path in paths]
        if relay:
            ports = _answer(start(_relay, ports, share))
        elapsed, target_cpu = _answer(start(_target, ports, entries, str(target_path)))
        for process in processes:
            process.join(60)
        cpu = [_answer(answer) for answer in answers[:-1]] + [target_cpu]
        figures = {"mb_per_s": entries * ENTRY / elapsed / 1e6}
        names = [f"source_{index + 1}" for index in range(SOURCES)]
        names += ["relay"] * relay + ["target"]
        for name, seconds in zip(names, cpu, strict=True):
            figures[f"{name}_us_per_entry"] = seconds / entries * 1e6
        return figures
    finally:
        for process in processes:
            process.kill()
        for path in [*paths, target_path]:
            path.unlink(missing_ok=True)


def _answer(receiver: Connection) -> Any:
    """What a copy's process reports; RuntimeError if it says nothing in ANSWER_SECONDS
    (one of its threads failed, say), so that a broken run ends rather than hangs."""
    if not receiver.poll(ANSWER_SECONDS):
        raise RuntimeError(f"a copy's process said nothing for {ANSWER_SECONDS} s")
    return receiver.recv()


def disk_copy_mb_per_s(directory: Path, mib: int, read_size: int) -> float:
    """MB/s of the disk copying to itself, with no network or check between: SOURCES threads
    read their files with O_DIRECT, `read_size` at a time, while a writer thread appends as
    many bytes as they read (random ones: nothing is copied between the threads) with
    O_DIRECT and an fdatasync per MiB. A repair whose survivors and
    newcomer share the disk reads and writes each byte on it, so this, not the rate of
    appends alone, is what it may reach."""
    share = mib * MIB // SOURCES
    paths = [_source_file(directory, index, share // ENTRY) for index in range(SOURCES)]
    target = directory / "raw-copy-target"
    read: queue.Queue[int] = queue.Queue(SOURCES * IN_FLIGHT * BATCH * ENTRY // read_size)

    def reader(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buffer = mmap.mmap(-1, read_size)
        try:
            for offset in range(0, share, read_size):
                read.put(os.preadv(fd, [buffer], offset))
        except BaseException:
            read.put(-1)  # the writer fails rather than wait for bytes that will not come
            raise
        finally:
            os.close(fd)

    def writer() -> None:
        block = mmap.mmap(-1, MIB)
        block.write(os.urandom(MIB))
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
        try:
            for offset in range(0, share * SOURCES, MIB):
                held = 0
                while held < MIB:
                    got = read.get()
                    if got < 0:
                        raise RuntimeError("a reader failed")
                    held += got
                os.pwrite(fd, block, offset)
                os.fdatasync(fd)
        finally:
            os.close(fd)

    threads = [threading.Thread(target=reader, args=(path,)) for path in paths]
    threads.append(threading.Thread(target=writer))
    try:
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return share * SOURCES / (time.perf_counter() - started) / 1e6
    finally:
        for path in [*paths, target]:
            path.unlink(missing_ok=True)


def copy_references(directory: Path, mib: int) -> dict[str, float]:
    """Every reference of this module, flat: the disk copying to itself (64 KiB and 1 MiB
    reads) and the bare Python copies (direct, relay) with their CPU per entry."""
    figures = {
        "disk_copy_64k_mb_per_s": disk_copy_mb_per_s(directory, mib, ENTRY),
        "disk_copy_1m_mb_per_s": disk_copy_mb_per_s(directory, mib, MIB),
    }
    for shape in ("direct", "relay"):
        copy = copy_mb_per_s(directory, mib, relay=shape == "relay")
        figures.update({f"python_copy_{shape}_{name}": value for name, value in copy.items()})
    return figures


def print_references(figures: dict[str, float]) -> None:
    print(
        "the disk copying to itself (2 readers, O_DIRECT; appends, fdatasync every MiB):\n"
        f"  64 KiB reads: {figures['disk_copy_64k_mb_per_s']:,.0f} MB/s;"
        f" 1 MiB reads: {figures['disk_copy_1m_mb_per_s']:,.0f} MB/s"
    )
    for shape in ("direct", "relay"):
        prefix = f"python_copy_{shape}_"
        cpu = ", ".join(
            f"{name.removeprefix(prefix).removesuffix('_us_per_entry')} {value:.0f}"
            for name, value in figures.items()
            if name.startswith(prefix) and name.endswith("_us_per_entry")
        )
        print(
            f"bare Python copy over loopback, {shape}: {figures[prefix + 'mb_per_s']:,.0f} MB/s"
            f" (CPU us per entry: {cpu})"
        )


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        figures = copy_references(Path(scratch), args.mib)
    print_references(figures)
    return figures


if __name__ == "__main__":
    main()
