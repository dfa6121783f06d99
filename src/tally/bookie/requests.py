"""A bookie's request processing: each request checked, applied to the journal and the
ledger storage, and answered, with the metrics counted.

The add path runs without a coroutine per request, since it is what a bookie does most:
admission (tally.core.admission), the entry into the write cache (which verifies the
client's CRC32C first), a journal record (its header and the entry as two buffers), and
the reply from the callback the journal calls when its group commit has fdatasync'ed the
record. Look-ups that would otherwise run per request are made once, at import.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import ClassVar

from tally.bookie import journal_records
from tally.bookie.connection import BookieConnectionHandler
from tally.bookie.journal import Journal
from tally.bookie.journal_entries import KEPT_ENTRY_SIZE, kept_location
from tally.bookie.journal_format import JournalMark
from tally.bookie.ledger_directories import BookieStorage
from tally.bookie.ledger_storage import LAST_ENTRY
from tally.bookie.metrics import BookieMetrics
from tally.bookie.read_workers import ReadWorkers
from tally.bookie.state_dump import state_records
from tally.core import protocol
from tally.core.admission import admit_add, admit_fencing_read, admit_write, admit_write_lac
from tally.core.disk_usage import DiskState
from tally.core.entry_format import check_crc_digest
from tally.core.errors import BadRequest, TallyError, WriteFailed
from tally.core.ids import LedgerId

log = logging.getLogger(__name__)

DUMP_LEDGERS_PER_TURN = 64
"""AVAILABILITY_DUMP reads this many ledgers between two yields to the event loop."""

_OPERATION_NAMES = {operation: operation.name for operation in protocol.Operation}
"""An operation's name for the metrics, looked up once: an Enum's `name` per request is
slow on the add path (docs/benchmarks.md, bookie section)."""
_ADD = _OPERATION_NAMES[protocol.Operation.ADD]


class BookieRequestProcessor:
    """Answers a started bookie's requests over its journal and ledger storage.

    `disk` is the bookie's mode, by which writes are admitted; the bookie's life cycle
    sets it, and hears from the journal itself when a journal write fails.
    """

    def __init__(
        self,
        bookie_id: str,
        journal: Journal,
        storage: BookieStorage,
        metrics: BookieMetrics,
        disk: DiskState,
        *,
        keeps_entries: bool,
        max_frame_size: int,
        reads: ReadWorkers[tuple[bytes, int]] | None = None,
        cookie: bytes = b"",
    ) -> None:
        """`reads`: the threads entries are read on (None: read on the event loop);
        `cookie`: the bookie's, as a dump WITH_STATE gives it."""
        self.bookie_id = bookie_id
        self.journal = journal
        self.storage = storage
        self.metrics = metrics
        self.disk = disk
        self._keeps_entries = keeps_entries
        """Whether large entries stay in the journal (`keep_large_entries_in_journal`)."""
        self._max_frame_size = max_frame_size
        self._reads = ReadWorkers[tuple[bytes, int]](0) if reads is None else reads
        self._cookie = cookie
        self._pending_fences: dict[LedgerId, asyncio.Future[JournalMark]] = {}

    def dispatch_all(
        self, requests: list[protocol.Request], connection: BookieConnectionHandler
    ) -> None:
        """Answer the requests of one receive, in order: a run of plain adds of one ledger
        is taken as one batch (`_add_batch`), anything else one by one."""
        start = 0
        while start < len(requests):
            run = _add_run(requests, start)
            if len(run) > 1:
                self._add_batch(run, connection)
                start += len(run)
            else:
                self.dispatch(requests[start], connection)
                start += 1

    def dispatch(self, request: protocol.Request, connection: BookieConnectionHandler) -> None:
        """Answer one request; errors become error responses, never a dropped connection."""
        handler = self._handlers.get(type(request))
        try:
            if handler is None:
                raise BadRequest(f"{request.operation.name} is not served by a bookie")
            handler(self, request, connection)
        except Exception as error:
            self._raised(request, connection, error)

    def _raised(
        self, request: protocol.Request, connection: BookieConnectionHandler, error: Exception
    ) -> None:
        """Answer a request whose handling raised: a TallyError as itself, anything else
        as an internal error, logged with its traceback."""
        self._all_raised([request], connection, error)

    def _all_raised(
        self,
        requests: Sequence[protocol.Request],
        connection: BookieConnectionHandler,
        error: Exception,
    ) -> None:
        """`_raised` for each of a batch's requests, an internal error logged once."""
        if not isinstance(error, TallyError):
            more = f" and {len(requests) - 1} more" if len(requests) > 1 else ""
            log.error("bookie %s failed on %r%s", self.bookie_id, requests[0], more, exc_info=error)
            error = TallyError(f"internal error: {error!r}")
        for request in requests:
            self._fail(request, connection, error)

    def _count(self, request: protocol.Request, result: str) -> None:
        self.metrics.requests.inc(_operation_label(request), result)

    def _fail(
        self, request: protocol.Request, connection: BookieConnectionHandler, error: TallyError
    ) -> None:
        self._count(request, type(error).__name__)
        connection.send(protocol.ErrorResponse.answering(request, error).encode())

    def _ok(
        self, request: protocol.Request, connection: BookieConnectionHandler, frame: bytes
    ) -> None:
        self._count(request, "ok")
        connection.send(frame)

    def _journal_then(
        self,
        record: bytes,
        done: Callable[[], None],
        request: protocol.Request,
        connection: BookieConnectionHandler,
    ) -> None:
        """Journal `record`; once it is durable call `done`, or answer with the failure."""
        self.journal.append_then(record, b"", partial(self._journaled, done, request, connection))

    def _journaled(
        self,
        done: Callable[[], None],
        request: protocol.Request,
        connection: BookieConnectionHandler,
        _: JournalMark | None,
        error: BaseException | None,
    ) -> None:
        if error is None:
            try:
                done()
            except TallyError as failure:
                self._fail(request, connection, failure)
            return
        self._journal_failed(request, connection, error)

    def _journal_failed(
        self, request: protocol.Request, connection: BookieConnectionHandler, error: BaseException
    ) -> None:
        if not isinstance(error, TallyError):
            error = WriteFailed(f"journal write failed: {error!r}")
        self._fail(request, connection, error)

    def _journal_master_key(self, ledger_id: LedgerId, master_key: bytes) -> None:
        """Journal a ledger's first master key. Nobody waits on it: the record that needs
        it (entry, fence, LAC) is journaled right after, in the same or a later group
        commit, so its reply already implies this one is durable, and its failure reports
        the journal's."""
        self.journal.append_then(
            journal_records.master_key_record(ledger_id, master_key), b"", _ignore
        )

    def _add(self, request: protocol.AddRequest, connection: BookieConnectionHandler) -> None:
        started = time.perf_counter()
        admit_write(self.disk, self.bookie_id, recovery=request.recovery)
        ledger_id = request.ledger_id
        storage = self.storage
        admission = admit_add(
            ledger_id,
            storage.ledger_access(ledger_id),
            request.master_key,
            recovery=request.recovery,
        )
        check_crc_digest(request.entry)  # refused before it is stored or journaled
        if (
            request.recovery
            and not admission.record_master_key
            and storage.holds_intact(ledger_id, request.entry_id, request.crc32c)
        ):
            self.metrics.recovery_adds_kept.inc()
            response = protocol.AddResponse(request.request_id, ledger_id, request.entry_id)
            self._ok(request, connection, response.encode())
            return
        storage.add_entry(
            ledger_id, request.entry_id, request.crc32c, request.entry, request.last_add_confirmed
        )
        if admission.record_master_key:
            storage.set_master_key(ledger_id, request.master_key)
            self._journal_master_key(ledger_id, request.master_key)
        head = journal_records.entry_record_head(
            ledger_id, request.entry_id, request.last_add_confirmed, request.crc32c
        )
        self.journal.append_then(  # add_entry has just checked the entry's CRC32C
            head, request.entry, partial(self._added, request, connection, started), request.crc32c
        )

    def _added(
        self,
        request: protocol.AddRequest,
        connection: BookieConnectionHandler,
        started: float,
        mark: JournalMark | None,
        error: Exception | None,
    ) -> None:
        """Acknowledge an add whose journal record is durable (or answer its failure)."""
        if mark is None:
            self._journal_failed(request, connection, error or WriteFailed("journal lost it"))
            return
        if self._keeps_entries:
            location = kept_location(mark, len(request.entry), request.crc32c)
            if location is not None:
                self.storage.keep_in_journal(request.ledger_id, request.entry_id, location)
        connection.send(protocol.AddResponse.answering(request))
        metrics = self.metrics
        metrics.requests.inc(_ADD, "ok")
        metrics.add_entry_seconds.observe(time.perf_counter() - started)

    def _add_batch(
        self, adds: list[protocol.AddRequest], connection: BookieConnectionHandler
    ) -> None:
        """Plain adds of one ledger under one master key, received together, taken as one:
        admitted once, stored under one lock, journaled with one waiter and answered in
        one write; an add refused (a bad digest, say) is answered with its error alone.

        An add alone costs a bookie some forty Python calls; in a batch, those left per
        add are its decode, its checks, its cache entry and its journal record."""
        started = time.perf_counter()
        first = adds[0]
        ledger_id = first.ledger_id
        storage = self.storage
        try:
            admit_write(self.disk, self.bookie_id, recovery=False)
            admission = admit_add(
                ledger_id, storage.ledger_access(ledger_id), first.master_key, recovery=False
            )
            adds = self._digests_checked(adds, connection)
            adds = storage.add_entries(
                ledger_id, adds, lambda add, error: self._fail(add, connection, error)
            )
            if not adds:
                return
            if admission.record_master_key:
                storage.set_master_key(ledger_id, first.master_key)
                self._journal_master_key(ledger_id, first.master_key)
            records = [
                (
                    journal_records.entry_record_head(
                        ledger_id, add.entry_id, add.last_add_confirmed, add.crc32c
                    ),
                    add.entry,
                    add.crc32c,  # add_entries has just checked the entry's CRC32C
                )
                for add in adds
            ]
            self.journal.append_all_then(
                records, partial(self._added_all, adds, connection, started)
            )
        except Exception as error:  # none of `adds` answered yet
            self._all_raised(adds, connection, error)

    def _digests_checked(
        self, adds: list[protocol.AddRequest], connection: BookieConnectionHandler
    ) -> list[protocol.AddRequest]:
        """The adds whose entry's own digest checks out; each other is answered so."""
        checked = []
        for add in adds:
            try:
                check_crc_digest(add.entry)
            except Exception as error:
                self._raised(add, connection, error)
            else:
                checked.append(add)
        return checked

    def _added_all(
        self,
        adds: list[protocol.AddRequest],
        connection: BookieConnectionHandler,
        started: float,
        mark: JournalMark | None,
        error: Exception | None,
    ) -> None:
        """Acknowledge a batch of adds whose journal records are durable, in one write."""
        if mark is None:
            for add in adds:
                self._journal_failed(add, connection, error or WriteFailed("journal lost it"))
            return
        connection.send(b"".join([protocol.AddResponse.answering(add) for add in adds]))
        metrics = self.metrics
        metrics.requests.inc(_ADD, "ok", len(adds))
        metrics.add_entry_seconds.observe(time.perf_counter() - started, len(adds))

    def _read(self, request: protocol.ReadRequest, connection: BookieConnectionHandler) -> None:
        started = time.perf_counter()
        answer = partial(self._serve_read, request, connection, started)
        if request.master_key is None:
            answer()
            return
        self._fence(request, request.master_key, answer, connection)

    def _serve_read(
        self, request: protocol.ReadRequest, connection: BookieConnectionHandler, started: float
    ) -> None:
        """An entry in memory or the page cache is answered at once; one that needs a disk is
        read on a read worker."""
        answered = partial(self._answer_read, request, connection, started)
        if request.entry_id != LAST_ENTRY:
            stored = self.storage.cached_entry(request.ledger_id, request.entry_id)
            if stored is not None:
                answered(_read_response(request, stored[1]))
                return
        self._reads.run(partial(self._read_entry, request), answered)

    def _read_entry(self, request: protocol.ReadRequest) -> tuple[bytes, int]:
        """A READ's answer and its one entry (on a read worker)."""
        return _read_response(
            request, self.storage.get_entry(request.ledger_id, request.entry_id)[1]
        )

    def _read_entries(
        self, request: protocol.ReadEntriesRequest, connection: BookieConnectionHandler
    ) -> None:
        """The entries in memory or the page cache from the first asked are answered at once;
        if the first needs a disk, the request is read on a read worker."""
        started = time.perf_counter()
        answered = partial(self._answer_read, request, connection, started)
        try:
            answer = self._read_entry_run(request, self._without_waiting)
        except _OnDisk:
            self._reads.run(
                partial(self._read_entry_run, request, self.storage.get_entry), answered
            )
            return
        answered(answer)

    def _without_waiting(
        self, ledger_id: LedgerId, entry_id: int
    ) -> tuple[int, protocol.EntryBytes]:
        stored = self.storage.cached_entry(ledger_id, entry_id)
        if stored is None:
            raise _OnDisk(f"entry {entry_id} of ledger {ledger_id} needs a disk read")
        return stored

    def _read_entry_run(
        self,
        request: protocol.ReadEntriesRequest,
        get_entry: Callable[[LedgerId, int], tuple[int, protocol.EntryBytes]],
    ) -> tuple[bytes, int]:
        """A READ_ENTRIES' answer and how many entries it holds: a prefix of the entries
        asked, up to `max_bytes` and a frame. It stops before the first entry it cannot
        serve, which is answered alone with its error when it is the first (the asker
        reads a later one alone to hear why)."""
        ledger_id = request.ledger_id

        def read() -> Iterator[protocol.EntryBytes]:
            for position, entry_id in enumerate(request.entry_ids):
                try:
                    yield get_entry(ledger_id, entry_id)[1]
                except (TallyError, _OnDisk):
                    if not position:
                        raise
                    return

        # A client reads frames of MAX_FRAME_SIZE by default, whatever this bookie's limit.
        budget = min(self._max_frame_size, protocol.MAX_FRAME_SIZE)
        entries = protocol.answer_entries(read(), request.max_bytes, budget)
        response = protocol.ReadEntriesResponse(
            request.request_id, ledger_id, request.entry_id, tuple(entries)
        )
        return response.encode(budget), len(entries)

    def _answer_read(
        self,
        request: protocol.Request,
        connection: BookieConnectionHandler,
        started: float,
        read: tuple[bytes, int] | Exception,
    ) -> None:
        """Send what a read worker read, or the error it met (on the event loop)."""
        if isinstance(read, Exception):
            self._raised(request, connection, read)
            return
        frame, entries = read
        self._ok(request, connection, frame)
        elapsed = time.perf_counter() - started
        self.metrics.read_entry_seconds.observe(elapsed / entries, entries)

    def _fence(
        self,
        request: protocol.ReadRequest,
        master_key: bytes,
        then: Callable[[], None],
        connection: BookieConnectionHandler,
    ) -> None:
        """Fence the ledger durably, then run `then`: the fence is in the journal before
        any reply, including replies to fencing reads racing a fence still in flight."""
        ledger_id = request.ledger_id
        admit_write(self.disk, self.bookie_id, recovery=True)
        admission = admit_fencing_read(ledger_id, self.storage.ledger_access(ledger_id), master_key)
        if admission.record_master_key:
            self.storage.set_master_key(ledger_id, master_key)
            self._journal_master_key(ledger_id, master_key)
        if admission.record_fence:
            self.storage.set_fenced(ledger_id)
            future = self.journal.append_nowait(journal_records.fence_record(ledger_id))
            self._pending_fences[ledger_id] = future
            future.add_done_callback(lambda _: self._pending_fences.pop(ledger_id, None))
        else:
            pending = self._pending_fences.get(ledger_id)
            if pending is None:
                then()
                return
            future = pending
        future.add_done_callback(
            lambda done: self._journaled(then, request, connection, None, done.exception())
        )

    def _read_lac(
        self, request: protocol.ReadLacRequest, connection: BookieConnectionHandler
    ) -> None:
        lac = self.storage.last_add_confirmed(request.ledger_id)
        response = protocol.ReadLacResponse(request.request_id, request.ledger_id, lac)
        self._ok(request, connection, response.encode())

    def _write_lac(
        self, request: protocol.WriteLacRequest, connection: BookieConnectionHandler
    ) -> None:
        ledger_id = request.ledger_id
        admission = admit_write_lac(
            ledger_id, self.storage.ledger_access(ledger_id), request.master_key
        )
        if admission.record_master_key:
            self.storage.set_master_key(ledger_id, request.master_key)
            self._journal_master_key(ledger_id, request.master_key)
        self.storage.set_explicit_lac(ledger_id, request.last_add_confirmed)
        record = journal_records.explicit_lac_record(ledger_id, request.last_add_confirmed)
        response = protocol.WriteLacResponse(request.request_id, ledger_id).encode()
        self._journal_then(
            record, lambda: self._ok(request, connection, response), request, connection
        )

    def _metadata_copy(
        self, request: protocol.MetadataCopyRequest, connection: BookieConnectionHandler
    ) -> None:
        """Keep the ledger's metadata copy, journaled before the reply: the writer sends it
        ahead of the segment's adds on the same connection, so it is durable with them."""
        ledger_id = request.ledger_id
        admit_write(self.disk, self.bookie_id, recovery=True)
        admission = admit_write_lac(
            ledger_id, self.storage.ledger_access(ledger_id), request.master_key
        )
        if admission.record_master_key:
            self.storage.set_master_key(ledger_id, request.master_key)
            self._journal_master_key(ledger_id, request.master_key)
        response = protocol.MetadataCopyResponse(request.request_id, ledger_id).encode()
        if not self.storage.set_metadata_copy(ledger_id, request.metadata):
            self._ok(request, connection, response)  # an older copy: the held one stays
            return
        record = journal_records.metadata_copy_record(ledger_id, request.metadata)
        self._journal_then(
            record, lambda: self._ok(request, connection, response), request, connection
        )

    def _list_entries(
        self, request: protocol.GetListOfEntriesOfLedgerRequest, connection: BookieConnectionHandler
    ) -> None:
        availability = self.storage.availability(request.ledger_id)
        response = protocol.GetListOfEntriesOfLedgerResponse(
            request.request_id, request.ledger_id, availability.to_bytes()
        )
        self._ok(request, connection, response.encode())

    def _list_entries_of_ledgers(
        self,
        request: protocol.GetListOfEntriesOfLedgersRequest,
        connection: BookieConnectionHandler,
    ) -> None:
        """A prefix of the ledgers asked, as many as fit a frame; a ledger whose look-up
        fails is answered with its error, the others are still answered."""

        def answers() -> Iterator[protocol.LedgerEntries]:
            for ledger_id in request.ledger_ids:
                try:
                    held = self.storage.availability(ledger_id).to_bytes()
                except TallyError as error:
                    yield protocol.LedgerEntries.failed(ledger_id, error)
                else:
                    yield protocol.LedgerEntries(ledger_id, held)

        records = protocol.answer_records(answers(), self._max_frame_size)
        response = protocol.GetListOfEntriesOfLedgersResponse(request.request_id, records)
        self._ok(request, connection, response.encode(self._max_frame_size))

    def _ledger_info(
        self, request: protocol.LedgerInfoRequest, connection: BookieConnectionHandler
    ) -> None:
        info = self.storage.ledger_info(request.ledger_id)
        response = protocol.LedgerInfoResponse(request.request_id, request.ledger_id, info)
        self._ok(request, connection, response.encode())

    def _dump(
        self, request: protocol.AvailabilityDumpRequest, connection: BookieConnectionHandler
    ) -> None:
        connection.start_task(self._stream_dump(request, connection))

    async def _stream_dump(
        self, request: protocol.AvailabilityDumpRequest, connection: BookieConnectionHandler
    ) -> None:
        """Every ledger with its availability, a frame at a time, pausing for the reader.

        A failure midway (a ledger too large for a frame, a storage error) ends the stream
        with an error response, so the reader is not left waiting for the rest."""
        encoder = protocol.AvailabilityDumpEncoder(
            request.request_id, budget=self._max_frame_size, with_state=request.with_state
        )
        records: Iterator[protocol.StateRecord | protocol.LedgerAvailability] = (
            state_records(self.storage, self._cookie)
            if request.with_state
            else (
                protocol.LedgerAvailability(ledger_id, held.to_bytes())
                for ledger_id, held in self.storage.iter_availability()
            )
        )
        try:
            for count, record in enumerate(records, start=1):
                frame = encoder.add(record)
                if frame is not None:
                    connection.send(frame)
                    await connection.writable()
                if count % DUMP_LEDGERS_PER_TURN == 0:
                    await asyncio.sleep(0)
        except Exception as error:
            self._raised(request, connection, error)
            return
        self._ok(request, connection, encoder.finish())

    _handlers: ClassVar[dict[type, Callable[..., None]]] = {
        protocol.AddRequest: _add,
        protocol.ReadRequest: _read,
        protocol.ReadLacRequest: _read_lac,
        protocol.WriteLacRequest: _write_lac,
        protocol.MetadataCopyRequest: _metadata_copy,
        protocol.GetListOfEntriesOfLedgerRequest: _list_entries,
        protocol.GetListOfEntriesOfLedgersRequest: _list_entries_of_ledgers,
        protocol.ReadEntriesRequest: _read_entries,
        protocol.LedgerInfoRequest: _ledger_info,
        protocol.AvailabilityDumpRequest: _dump,
    }


class _OnDisk(Exception):
    """An entry a read on the event loop would have to wait for a disk for (never sent: no
    TallyError, which would be one of the wire's errors)."""


def _read_response(request: protocol.ReadRequest, data: protocol.EntryBytes) -> tuple[bytes, int]:
    """A READ's answer, and its one entry."""
    response = protocol.ReadResponse(request.request_id, request.ledger_id, request.entry_id, data)
    return response.encode(), 1


def _add_run(requests: list[protocol.Request], start: int) -> list[protocol.AddRequest]:
    """The run of adds from `start` that `_add_batch` may take together: plain adds of small
    entries (never kept in the journal, whose marks they would each need) to the ledger of
    the first, under its master key. Empty if the request at `start` is no such add."""
    first = requests[start]
    if (
        type(first) is not protocol.AddRequest
        or first.recovery
        or len(first.entry) >= KEPT_ENTRY_SIZE
    ):
        return []
    scope, ledger, key = first.ledger_id.scope, first.ledger_id.id, first.master_key
    run = [first]
    for index in range(start + 1, len(requests)):
        request = requests[index]
        if (
            type(request) is not protocol.AddRequest
            or request.recovery
            or len(request.entry) >= KEPT_ENTRY_SIZE
            or request.ledger_id.id != ledger
            or request.ledger_id.scope != scope
            or request.master_key != key
        ):
            break
        run.append(request)
    return run


def _ignore(mark: JournalMark | None, error: Exception | None) -> None:
    """A journal record nobody waits on (a master key: see `_journal_master_key`)."""


def _operation_label(request: protocol.Request) -> str:
    """The metrics' operation: a fencing read is counted as FENCE, apart from plain reads,
    since fences are what recovery's progress and an old writer's refusals hang on."""
    if isinstance(request, protocol.ReadRequest) and request.do_fencing:
        return "FENCE"
    return _OPERATION_NAMES[request.operation]
