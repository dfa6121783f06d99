"""A bookie's modes and its doors: registration, read-only and back, I/O errors, TLS.

Disk usage and I/O errors are driven for real where the test can (a threshold below the
disk's actual usage, for a real process) and injected in-process where it cannot (a disk
that empties again, an fdatasync that fails with EIO).
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import tally.bookie.server
from tally.bookie import EXIT_SESSION_LOST
from tally.core.errors import (
    BookieUnavailable,
    MetadataStoreError,
    WriteFailed,
    WriteOnReadOnlyBookie,
)
from tally.core.protocol import AddRequest, ErrorResponse
from tally.metadata.bookie_registry import BookieRegistry
from tests.bookie.conftest import (
    KEY,
    SESSION_TIMEOUT,
    BookieUnderTest,
    RawConnection,
    connected,
    entry,
    in_process_bookie,
    new_ledger,
    registration_of,
    running,
    sample,
    store_session,
)
from tests.support.polling import until

CHECK_INTERVAL = 0.05
"""Seconds between a test bookie's disk checks."""


class DiskReadings:
    """Stands in for the bookie's reading of its disks' usage, and counts the readings."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.taken = 0

    def __call__(self, directory: Path) -> float:
        self.taken += 1
        return self.fraction

    async def more(self, count: int) -> None:
        """Until the bookie has checked its disks `count` more times."""
        target = self.taken + count
        await until(lambda: self.taken >= target, f"{count} more disk checks")


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
        return str(answer.read().decode())


# --- registration ---------------------------------------------------------------------------


async def test_the_registration_dies_with_a_killed_bookie(cluster: str, tmp_path: Path) -> None:
    bookie = BookieUnderTest(cluster, tmp_path / "bookie")
    async with store_session(cluster) as store:
        registry = BookieRegistry(store)

        async def gone() -> bool:
            return bookie.address not in await registry.writable_bookies()

        with running(bookie):
            assert await registry.writable_bookies() == [bookie.address]
            registration = await registry.registration(bookie.address)
            assert registration is not None
            assert registration.info.address == bookie.address
            assert registration.info.http_port == bookie.metrics_port
            bookie.kill()
            # The key outlives the process until its session's lease runs out.
            assert not await gone()
            took = await until(gone, "registration gone", timeout=4 * SESSION_TIMEOUT)
            assert took <= 2 * SESSION_TIMEOUT
            bookie.start()  # a restart registers again ...
            assert not await gone()
            assert bookie.stop() == 0
            assert await gone()  # ... and a clean stop unregisters at once


async def test_a_bookie_whose_disks_vanished_still_stops_on_sigterm(
    cluster: str, tmp_path: Path
) -> None:
    """Its disk check used to die on the journal's vanished disk, and its stop then waited
    on that task's error and went no further: alive, until SIGKILL (seen after tests whose
    directories were deleted under their bookies). Now the check goes on and it stops."""
    bookie = BookieUnderTest(cluster, tmp_path / "bookie", settings={"disk_check_interval": 0.05})
    with running(bookie):
        shutil.rmtree(bookie.data_dir / "journal")
        shutil.rmtree(bookie.data_dir / "ledgers")
        await until(lambda: "usage is unknown" in bookie.log(), "the disk check's warning")
        assert bookie.stop() == 0
        assert "last checkpoint failed" in bookie.log()
        async with store_session(cluster) as store:
            assert bookie.address not in await BookieRegistry(store).writable_bookies()


async def test_a_failed_step_of_stop_is_counted_and_the_rest_done(tmp_path: Path) -> None:
    """Storage that cannot close (an index on a vanished disk): logged and counted (tally
    bookie then exits 1), and the bookie still unregisters and counts as stopped."""
    async with in_process_bookie(tmp_path / "bookie") as node:
        storage = node.bookie.storage

        def cannot_close() -> None:
            raise WriteFailed("index: close failed: IO error")

        storage.close = cannot_close  # type: ignore[method-assign]
        await asyncio.wait_for(node.bookie.stop(), 30)
        assert node.bookie.stop_failures == 1
        assert await BookieRegistry(node.store).writable_bookies() == []
        await asyncio.wait_for(node.bookie.wait_stopped(), 1)


async def test_an_internal_error_in_a_batch_of_adds_answers_each_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug met while storing the adds of one receive: every add is answered with the
    internal error (none is acknowledged), and the log has one traceback, not one per add."""
    async with in_process_bookie(tmp_path / "bookie") as node:

        def broken(*_: object) -> None:
            raise RuntimeError("storage bug")

        node.bookie.storage.add_entries = broken  # type: ignore[method-assign]
        ledger = new_ledger()
        raw = await RawConnection.open(node.address)
        try:
            await raw.send(
                b"".join(AddRequest.for_entry(i, entry(ledger, i), KEY).encode() for i in range(3))
            )
            answers = await raw.responses(3)
        finally:
            await raw.close()
    assert sorted(answer.request_id for answer in answers) == [0, 1, 2]
    for answer in answers:
        assert isinstance(answer, ErrorResponse)
        assert "internal error: RuntimeError('storage bug')" in answer.message
    failures = [r for r in caplog.records if "failed on" in r.getMessage()]
    assert len(failures) == 1
    assert "and 2 more" in failures[0].getMessage()
    assert failures[0].exc_info is not None


async def test_sigusr1_writes_every_threads_stack_to_the_log_and_the_bookie_goes_on(
    cluster: str, tmp_path: Path
) -> None:
    """What an operator (and a test whose bookie will not stop) sees of a stuck process."""
    bookie = BookieUnderTest(cluster, tmp_path / "bookie")
    with running(bookie):
        bookie.signal(signal.SIGUSR1)
        await until(  # the main thread's stack, down to the command's own frame
            lambda: (
                "(most recent call first)" in bookie.log() and "tally/cli/bookie.py" in bookie.log()
            ),
            "the stacks written to the log",
        )
        async with connected(bookie.address) as connection:
            await connection.add(entry(new_ledger(), 0, b"still serving"), KEY)
        assert bookie.stop() == 0


async def test_a_bookie_paused_past_its_session_exits_asking_for_a_restart(
    cluster: str, tmp_path: Path
) -> None:
    session_timeout = 2 * SESSION_TIMEOUT  # no lapse while a loaded machine starts it
    bookie = BookieUnderTest(
        cluster, tmp_path / "bookie", settings={"session_timeout": session_timeout}
    )
    async with store_session(cluster) as store:
        registry = BookieRegistry(store)

        async def gone() -> bool:
            return bookie.address not in await registry.writable_bookies()

        with running(bookie):
            assert bookie.process is not None
            bookie.signal(signal.SIGSTOP)
            try:  # paused until its lease has run out and been swept
                await until(gone, "registration gone", timeout=3 * session_timeout)
            finally:
                bookie.signal(signal.SIGCONT)
            code = await asyncio.to_thread(bookie.process.wait, 2 * session_timeout)
        assert code == EXIT_SESSION_LOST, bookie.log()
        assert "tally bookie: stopped: it lost its metadata store session" in bookie.log()
        assert "start it again" in bookie.log()
        assert await gone()


async def test_stop_closes_the_metrics_endpoint(tmp_path: Path) -> None:
    async with in_process_bookie(tmp_path / "bookie", metrics_port=0) as node:
        port = node.bookie.metrics_port
        assert port is not None
        assert "bookie_requests" in await asyncio.to_thread(scrape_text, port)
        registration = await BookieRegistry(node.store).registration(node.bookie.bookie_id)
        assert registration is not None
        assert registration.info.http_port == port
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(scrape_text, port)


# --- read-only on a full disk ---------------------------------------------------------------


async def test_a_disk_over_the_threshold_makes_a_read_only_bookie(
    cluster: str, tmp_path: Path
) -> None:
    usage = shutil.disk_usage(tmp_path)
    used = usage.used / usage.total
    assert used > 0
    bookie = BookieUnderTest(
        cluster,
        tmp_path / "bookie",
        settings={
            "disk_usage_threshold": used / 2,
            "disk_usage_lwm_threshold": used / 4,
            "disk_check_interval": CHECK_INTERVAL,
        },
    )
    ledger = new_ledger()
    with running(bookie):
        assert await registration_of(cluster, bookie.address) == "readonly"
        async with connected(bookie.address) as connection:
            with pytest.raises(WriteOnReadOnlyBookie, match="disk usage"):
                await connection.add(entry(ledger, 0), KEY)
            # Recovery must not stall on a full disk: recovery adds and fences go through.
            await connection.add(entry(ledger, 0), KEY, recovery=True)
            await connection.add(entry(ledger, 1), KEY, recovery=True)
            assert await connection.read(ledger, 0, fencing_key=KEY) == entry(ledger, 0)
            assert await connection.read(ledger, -1) == entry(ledger, 1)
            assert (await connection.ledger_info(ledger)).fenced
        metrics = bookie.metrics()
        assert sample(metrics, "bookie_read_only") == 1
        labels = {"operation": "ADD", "result": "WriteOnReadOnlyBookie"}
        assert sample(metrics, "bookie_requests_total", **labels) == 1
        assert f"bookie {bookie.address} registered readonly" in bookie.log()


async def test_the_bookie_is_writable_again_below_the_low_water_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    used = DiskReadings(0.5)
    monkeypatch.setattr(tally.bookie.server, "_used_fraction", used)
    ledger = new_ledger()
    async with (
        in_process_bookie(
            tmp_path / "bookie",
            disk_usage_threshold=0.95,
            disk_usage_lwm_threshold=0.90,
            disk_check_interval=CHECK_INTERVAL,
        ) as node,
        connected(node.address) as connection,
    ):

        async def registered(mode: str) -> bool:
            return await node.registered_as() == mode

        assert await node.registered_as() == "writable"
        await connection.add(entry(ledger, 0), KEY)

        used.fraction = 0.96
        await until(lambda: registered("readonly"), "read-only")
        with pytest.raises(WriteOnReadOnlyBookie):
            await connection.add(entry(ledger, 1), KEY)

        used.fraction = 0.92  # below the threshold, above the low-water mark: no flapping
        await used.more(8)
        assert await node.registered_as() == "readonly"
        with pytest.raises(WriteOnReadOnlyBookie):
            await connection.add(entry(ledger, 1), KEY)

        used.fraction = 0.89
        await until(lambda: registered("writable"), "writable again")
        await connection.add(entry(ledger, 1), KEY)
        assert await connection.read(ledger, 1) == entry(ledger, 1)


async def test_a_failed_re_registration_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    used = DiskReadings(0.5)
    monkeypatch.setattr(tally.bookie.server, "_used_fraction", used)
    failures = {"left": 0}
    register = BookieRegistry.register

    async def flaky_register(self: BookieRegistry, *args: Any, **kwargs: Any) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise MetadataStoreError("injected: the store did not answer")
        await register(self, *args, **kwargs)

    monkeypatch.setattr(BookieRegistry, "register", flaky_register)
    async with in_process_bookie(tmp_path / "bookie", disk_check_interval=CHECK_INTERVAL) as node:
        failures["left"] = 2
        used.fraction = 0.99

        async def read_only() -> bool:
            return await node.registered_as() == "readonly"

        await until(read_only, "read-only despite two failed registrations")
        assert failures["left"] == 0


# --- read-only on an I/O error --------------------------------------------------------------


async def test_a_journal_io_error_makes_the_bookie_read_only_until_a_new_file_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing journal disk: the add fails, the bookie is read-only (not down) and serves
    reads, tries a new journal file on schedule, and is writable again once one writes."""
    failing = {"on": False}

    def failing_journal(sync: Callable[[int], None]) -> Callable[[int], None]:
        def synced(fd: int) -> None:
            if failing["on"] and "/journal/" in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(errno.EIO, "injected I/O error")  # the journal's files only
            sync(fd)

        return synced

    monkeypatch.setattr(os, "fdatasync", failing_journal(os.fdatasync))
    monkeypatch.setattr(os, "fsync", failing_journal(os.fsync))
    used = DiskReadings(0.5)
    monkeypatch.setattr(tally.bookie.server, "_used_fraction", used)
    ledger = new_ledger()
    async with (
        in_process_bookie(
            tmp_path / "bookie",
            disk_check_interval=CHECK_INTERVAL,
            journal_retry_interval=CHECK_INTERVAL,
        ) as node,
        connected(node.address) as connection,
    ):
        await connection.add(entry(ledger, 0), KEY)
        failing["on"] = True
        with pytest.raises(WriteFailed, match="injected I/O error"):
            await connection.add(entry(ledger, 1), KEY)

        async def registered(mode: str) -> bool:
            return await node.registered_as() == mode

        await until(lambda: registered("readonly"), "re-registered read-only")
        for attempt in (
            connection.add(entry(ledger, 2), KEY),
            connection.add(entry(ledger, 2), KEY, recovery=True),
            connection.read(ledger, 0, fencing_key=KEY),
        ):
            with pytest.raises(WriteOnReadOnlyBookie, match="journal cannot write"):
                await attempt
        assert await connection.read(ledger, 0) == entry(ledger, 0)
        await used.more(4)  # the retries meanwhile fail too
        assert await registered("readonly"), "no new journal file was written"
        failing["on"] = False
        await until(lambda: registered("writable"), "writable again, without a restart")
        await connection.add(entry(ledger, 1), KEY)
        assert await connection.read(ledger, 1) == entry(ledger, 1)


# --- TLS ------------------------------------------------------------------------------------


class Certificates(NamedTuple):
    server_cert: Path
    server_key: Path
    ca_cert: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path
    rogue_key: Path


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def self_signed(cert: Path, key: Path, subject: str, *extensions: str) -> None:
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-days", "1", "-subj", subject, *extensions, "-keyout", key, "-out", cert,
    )  # fmt: skip


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """The bookie's self-signed certificate for 127.0.0.1; a client CA, a client certificate
    it signed, and a self-signed client certificate it did not."""
    d = tmp_path_factory.mktemp("tls")
    made = Certificates(*(d / name for name in (
        "server.pem", "server.key", "ca.pem", "client.pem", "client.key", "rogue.pem", "rogue.key"
    )))  # fmt: skip
    self_signed(
        made.server_cert, made.server_key, "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"
    )
    ca_key = d / "ca.key"
    self_signed(made.ca_cert, ca_key, "/CN=tally test client CA")
    request = d / "client.csr"
    openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-subj", "/CN=tally client", "-keyout", made.client_key, "-out", request,
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", request, "-CA", made.ca_cert, "-CAkey", ca_key,
        "-CAcreateserial", "-days", "1", "-out", made.client_cert,
    )  # fmt: skip
    self_signed(made.rogue_cert, made.rogue_key, "/CN=tally client")
    return made


def client_context(
    certificates: Certificates, cert: Path | None = None, key: Path | None = None
) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=certificates.server_cert)
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


async def works(address: str, context: ssl.SSLContext | None) -> None:
    ledger = new_ledger()
    async with connected(address, ssl=context) as connection:
        await connection.add(entry(ledger, 0, bytes(50_000)), KEY)
        assert await connection.read(ledger, 0) == entry(ledger, 0, bytes(50_000))
        transport = connection._transport
        assert transport is not None
        assert transport.get_extra_info("ssl_object") is not None


async def refused(address: str, context: ssl.SSLContext | None) -> None:
    started = time.monotonic()
    with pytest.raises(BookieUnavailable):
        async with connected(address, ssl=context) as connection:
            await connection.read_lac(new_ledger())
    assert time.monotonic() - started < 5, "refused at once, not by a timeout"


async def test_a_tls_bookie_speaks_tls_only(
    cluster: str, tmp_path: Path, certificates: Certificates
) -> None:
    settings: dict[str, object] = {
        "tls_cert": certificates.server_cert,
        "tls_key": certificates.server_key,
    }
    with running(BookieUnderTest(cluster, tmp_path / "bookie", settings=settings)) as bookie:
        await works(bookie.address, client_context(certificates))
        await refused(bookie.address, None)  # plain TCP
        await refused(bookie.address, ssl.create_default_context())  # an untrusted server
        await works(bookie.address, client_context(certificates))  # and it goes on


async def test_client_verification_takes_only_certificates_of_the_client_ca(
    cluster: str, tmp_path: Path, certificates: Certificates
) -> None:
    settings: dict[str, object] = {
        "tls_cert": certificates.server_cert,
        "tls_key": certificates.server_key,
        "tls_client_ca": certificates.ca_cert,
    }
    with running(BookieUnderTest(cluster, tmp_path / "bookie", settings=settings)) as bookie:
        await refused(bookie.address, client_context(certificates))
        rogue = client_context(certificates, certificates.rogue_cert, certificates.rogue_key)
        await refused(bookie.address, rogue)
        signed = client_context(certificates, certificates.client_cert, certificates.client_key)
        await works(bookie.address, signed)
