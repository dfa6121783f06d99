"""Writing a ledger: pipelined adds, ensemble changes on failure, and a safe close.

Every decision is `tally.core`'s: `PendingAdds` says when an entry is confirmed (AQ acks,
strictly in entry order) and which bookies to replace; `LedgerMetadata` says whether an
ensemble change or a close is a valid transition; the placement policy picks bookies.
This module sends, receives and compare-and-sets.

An ensemble change swaps failed bookies for new ones from LAC + 1 on: the new segment is
CASed into the metadata, then the unconfirmed entries are sent to the newcomers. While it
runs, confirmations are held (the LAC must not pass the new segment's start) and new
appends wait. If the CAS finds the ledger IN_RECOVERY or CLOSED, another client is
recovering it: the writer stops with LedgerFenced or LedgerClosed.

A write error after an entry was confirmed is not ignored (BP-31): the bookie is replaced
before the next add, and the ledger is marked under-replicated for it when the writer
closes, since the old segment keeps the missing copy. For the same reason a close waits,
up to `close_copies_timeout`, for the copies still in flight beyond the ack quorum, and
counts those that fail or stay silent as missing: closing the connections right after
would otherwise cut them unseen. A client that closes does the same for its writers left
open, before it closes its connections, and leaves their ledgers open for recovery.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Any

from tally.client.bookie_connection import BookieConnection
from tally.client.context import ClientContext
from tally.client.metadata_copies import copy_answered, give_copies
from tally.core.digest import mac_key, master_key
from tally.core.entry_format import EntryEncoder, EntryFormat, decode_entry, header_size
from tally.core.errors import (
    BadDigest,
    BadRequest,
    IllegalOperation,
    LedgerClosed,
    LedgerFenced,
    MetadataVersionConflict,
    NotEnoughBookies,
    TallyError,
    Unauthorized,
)
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.core.protocol import ADD_HEAD_SIZE, MAX_FRAME_SIZE, PreparedAdd
from tally.core.quorum import PendingAdds
from tally.core.schedule import write_set
from tally.metadata.ledger_manager import LedgerRecord

log = logging.getLogger(__name__)

_TERMINAL = (LedgerFenced, Unauthorized, LedgerClosed)
"""Errors from a bookie that end the writer: no other bookie can answer differently."""


class LedgerWriter:
    """The handle of a ledger this client created: `append`, then `close`."""

    def __init__(
        self,
        context: ClientContext,
        record: LedgerRecord,
        password: bytes,
        *,
        advanced: bool = False,
    ) -> None:
        metadata = record.metadata
        if metadata.state is not LedgerState.OPEN:
            raise IllegalOperation(f"ledger {record.ledger_id} is {metadata.state.name}")
        self._context = context
        self._record = record
        self._advanced = advanced
        self._mac_key = mac_key(password)
        # V2 names its digest type: bookies check CRC digests on the way in.
        self._encoder = EntryEncoder(
            record.ledger_id, metadata.digest_type, self._mac_key, EntryFormat.V2
        )
        self._max_payload = (
            MAX_FRAME_SIZE - ADD_HEAD_SIZE - header_size(EntryFormat.V2) - metadata.digest_type.size
        )
        self._master_key = master_key(password)
        self._pending = PendingAdds(
            metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum
        )
        self._ensemble: list[str] = []
        self._answered: list[_PositionAnswers] = []
        self._connections: list[BookieConnection | None] = []
        """Each position's connection as last taken from the pool, while it stays open."""
        self._segment_start = 0
        self._enter_segment(metadata)
        self._entries: dict[int, PreparedAdd] = {}
        """Entries not yet confirmed, each ADD made once for all its copies: what an
        ensemble change re-sends."""
        self._lengths: dict[int, int] = {}
        self._waiters: dict[int, asyncio.Future[int]] = {}
        self._unsent: list[int] = []
        """Entries appended while an ensemble change ran: sent to their write set after it."""
        self._held: dict[int, bytes] = {}
        """Advanced mode: payloads given ahead of a gap, sent once the gap fills."""
        self._length = 0
        self._confirmed_length = 0
        self._error: TallyError | None = None
        self._closed = False
        self._changing: asyncio.Task[None] | None = None
        self._replace: set[int] = set()
        """Positions whose bookie failed: replace them before sending anything new."""
        self._under_replicated: set[str] = set()
        self._settling = False
        """No add is left to confirm: answers now only settle the copies beyond AQ."""
        self._settled: asyncio.Future[None] | None = None
        """Resolved once no copy is in flight, while a close waits for that."""
        self._last_add_time = time.monotonic()
        self._lac_sent = -1
        self._copy = metadata.to_bytes()
        """The metadata copy of the current segment, given to each of its bookies (issue
        18): ahead of the first add each gets on its connection, so durable with it."""
        self._copied: set[str] = set()
        """Bookies given `_copy`."""
        self._lac_task = (
            asyncio.get_running_loop().create_task(self._explicit_lac_loop())
            if context.config.explicit_lac_interval > 0
            else None
        )

    @property
    def ledger_id(self) -> LedgerId:
        return self._record.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._pending.last_add_confirmed

    @property
    def length(self) -> int:
        """Bytes of the confirmed entries."""
        return self._confirmed_length

    @property
    def metadata(self) -> LedgerRecord:
        return self._record

    # -- appending -------------------------------------------------------------------

    async def append(self, data: bytes, entry_id: int | None = None) -> int:
        """Add `data` as the next entry (or as `entry_id` for an advanced ledger); returns
        its entry id once an ack quorum of bookies has it on disk."""
        return await self.append_nowait(data, entry_id)

    def append_nowait(self, data: bytes, entry_id: int | None = None) -> asyncio.Future[int]:
        """`append` without a coroutine: the add starts now and the future resolves as
        `append` returns, so keeping many adds in flight costs no task each. What `append`
        raises before sending anything (a closed or failed writer, bad arguments) is raised
        here at once."""
        self._check_open()
        if not isinstance(data, bytes | bytearray | memoryview):
            raise BadRequest(f"an entry is bytes, not {type(data).__name__}")
        self._check_size(data)
        if self._advanced:
            if entry_id is None:
                raise BadRequest("an advanced ledger's append needs entry_id")
            return self._append_advanced(bytes(data), entry_id)
        if entry_id is not None:
            raise BadRequest("entry_id is only for ledgers created with advanced=True")
        return self._start_add(bytes(data))

    def _check_size(self, data: bytes | bytearray | memoryview) -> None:
        if len(data) > self._max_payload:
            raise BadRequest(
                f"ledger {self.ledger_id}: an entry of {len(data)} bytes is over the "
                f"{self._max_payload} a frame of {MAX_FRAME_SIZE} bytes carries"
            )

    def _append_advanced(self, data: bytes, entry_id: int) -> asyncio.Future[int]:
        """Advanced ledgers take ids in any order; each is sent once the ids below it have
        been given, as confirmations are in entry order anyway."""
        if entry_id < self._pending.next_entry_id or entry_id in self._held:
            raise BadRequest(f"entry {entry_id} of ledger {self.ledger_id} was already given")
        if entry_id > self._pending.next_entry_id:
            waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            self._waiters[entry_id] = waiter
            self._held[entry_id] = data
            return waiter
        future = self._start_add(data)
        while (held := self._held.pop(self._pending.next_entry_id, None)) is not None:
            self._start_add(held)  # resolves the waiter its append is awaiting
        return future

    def _start_add(self, data: bytes) -> asyncio.Future[int]:
        pending = self._pending
        ledger_id = self._record.ledger_id
        entry_id = pending.next_entry_id
        length = self._length + len(data)
        encoded = self._encoder.encode(entry_id, pending.last_add_confirmed, length, data)
        add = PreparedAdd.of_written(ledger_id, entry_id, encoded, self._master_key)
        positions = pending.add(entry_id)
        self._length = length
        self._entries[entry_id] = add
        self._lengths[entry_id] = length
        future = self._waiters.get(entry_id) or asyncio.get_running_loop().create_future()
        self._waiters[entry_id] = future
        self._last_add_time = time.monotonic()
        self._lac_sent = self._pending.last_add_confirmed
        if self._changing is None and not self._replace:
            for position in positions:
                self._send_add(add, position)
        else:
            self._unsent.append(entry_id)
        return future

    def _send(self, entry_id: int, position: int) -> None:
        self._send_add(self._entries[entry_id], position)

    def _send_add(self, add: PreparedAdd, position: int) -> None:
        if self._error is not None:
            return
        bookie = self._ensemble[position]
        connection = self._connections[position]
        if connection is None or connection.closed:
            connection = self._connections[position] = self._context.bookies.cached(bookie)
        if connection is None:
            asyncio.get_running_loop().create_task(
                self._send_after_dial(add.entry_id, position, bookie, add)
            )
            return
        if bookie not in self._copied:
            self._give_copy(bookie, connection)
        connection.add_prepared(add, self._answered[position])

    def _give_copy(self, bookie: str, connection: BookieConnection) -> None:
        """Send the bookie the current segment's metadata copy (best effort: a bookie
        without one only makes a metadata recovery infer more)."""
        self._copied.add(bookie)
        future = connection.metadata_copy_nowait(self.ledger_id, self._master_key, self._copy)
        future.add_done_callback(partial(copy_answered, self.ledger_id, bookie))

    async def _send_after_dial(
        self, entry_id: int, position: int, bookie: str, add: PreparedAdd
    ) -> None:
        """The entry is kept as sent: it may be confirmed by the other copies meanwhile,
        and this one is still owed."""
        try:
            connection = await self._context.bookies.get(bookie)
        except TallyError as error:
            # A dial can fail after the bookie was replaced at this position: the failure
            # is then the old bookie's, and must not block the new one's copy.
            if self._bookie_of(entry_id, position) == bookie:
                self._on_failure(entry_id, position, bookie, error)
            return
        if self._bookie_of(entry_id, position) == bookie:
            if bookie not in self._copied:
                self._give_copy(bookie, connection)
            connection.add_prepared(add, _PositionAnswers(self, position, bookie))

    def _bookie_of(self, entry_id: int, position: int) -> str:
        """The bookie that holds `entry_id` at `position` by the current metadata."""
        if entry_id < self._segment_start:
            return self._record.metadata.ensemble_at(entry_id)[position]
        return self._ensemble[position]

    def _enter_segment(self, metadata: LedgerMetadata) -> None:
        """Send from now on to the last segment's ensemble, each bookie's answers to the
        callback of its position."""
        segment = metadata.segments[-1]
        self._ensemble = list(segment.ensemble)
        self._segment_start = segment.first_entry_id
        self._answered = [
            _PositionAnswers(self, position, bookie)
            for position, bookie in enumerate(self._ensemble)
        ]
        self._connections = [None] * len(self._ensemble)

    def _on_acks(self, position: int, bookie: str, entry_ids: list[int]) -> None:
        """The bookie at `position` has these entries: each counts where it still holds the
        entry's copy by the metadata (an ensemble change may have replaced it since)."""
        if min(entry_ids) < self._segment_start or self._ensemble[position] != bookie:
            entry_ids = [e for e in entry_ids if self._bookie_of(e, position) == bookie]
        if self._pending.ack_all(entry_ids, position):
            self._release()
        if self._settled is not None:
            self._wake_if_settled()

    def _on_add_failed(self, position: int, bookie: str, entry_id: int, error: Exception) -> None:
        """The add failed at the bookie at `position`: replace it, unless it was already."""
        if self._bookie_of(entry_id, position) == bookie:
            self._on_failure(entry_id, position, bookie, error)

    def _corrupt_here(self, entry_id: int, error: BadDigest) -> bool:
        """Whether a bookie refused the entry's digest because the writer's own copy is
        corrupt (changed after it was digested): no bookie would take it, so the writer
        fails rather than replace bookie after bookie."""
        try:
            decode_entry(
                self._entries[entry_id].entry, self._record.metadata.digest_type, self._mac_key
            )
        except BadDigest:
            log.error(
                "ledger %s entry %d changed in this writer after it was digested: %s",
                self.ledger_id,
                entry_id,
                error,
            )
            return True
        return False

    def _on_failure(self, entry_id: int, position: int, bookie: str, error: Exception) -> None:
        if self._settling:
            # A copy beyond AQ of a writer that closes: marked at its close, not replaced.
            self._pending.failed(entry_id, position)
            self._take_under_replicated()
            self._wake_if_settled()
            return
        if isinstance(error, _TERMINAL) or (
            isinstance(error, BadDigest) and self._corrupt_here(entry_id, error)
        ):
            self._fail_all(error)
            return
        if position not in self._replace and self._ensemble[position] == bookie:
            log.warning(
                "ledger %s: bookie %s failed entry %d, replacing it: %s",
                self.ledger_id,
                bookie,
                entry_id,
                error,
            )
        self._context.bookie_failed(bookie)
        self._pending.failed(entry_id, position)
        self._take_under_replicated()
        if self._ensemble[position] == bookie:
            self._replace.add(position)
        self._start_ensemble_change()
        self._release()

    def _take_under_replicated(self) -> None:
        for confirmed_id, failed_position in self._pending.take_under_replicated():
            self._under_replicated.add(self._bookie_of(confirmed_id, failed_position))

    def _wake_if_settled(self) -> None:
        settled = self._settled
        if settled is not None and not settled.done() and not self._pending.copies_in_flight:
            settled.set_result(None)

    def _release(self) -> None:
        if self._changing is not None or self._error is not None:
            return
        for entry_id in self._pending.release():
            self._entries.pop(entry_id, None)
            self._confirmed_length = self._lengths.pop(entry_id)
            waiter = self._waiters.pop(entry_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(entry_id)

    def _fail_all(self, error: TallyError) -> None:
        if self._error is None:
            self._error = error
            log.warning("ledger %s: writer stops: %s", self.ledger_id, error)
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(self._error)
        self._waiters.clear()

    def _stop_appends(self) -> None:
        self._closed = True
        if self._lac_task is not None:
            self._lac_task.cancel()
        self._fail_held()

    def _fail_held(self) -> None:
        """Advanced appends still behind a gap at close were never sent, nor will be."""
        gap = self._pending.next_entry_id
        for entry_id in sorted(self._held):
            waiter = self._waiters.pop(entry_id)
            if not waiter.done():
                waiter.set_exception(
                    LedgerClosed(
                        f"ledger {self.ledger_id} closed while entry {entry_id} waited for "
                        f"entry {gap}, which was never given"
                    )
                )
        self._held.clear()

    def _check_open(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise LedgerClosed(f"ledger {self.ledger_id} was closed by this writer")

    # -- ensemble changes ----------------------------------------------------------------

    def _start_ensemble_change(self) -> None:
        if self._changing is None and self._replace and self._error is None:
            self._changing = asyncio.get_running_loop().create_task(self._change_ensemble())

    async def _change_ensemble(self) -> None:
        try:
            while self._replace and self._error is None:
                positions = sorted(self._replace)
                await self._cas_new_segment(positions)
                self._replace.difference_update(positions)
                unsent = set(self._unsent)
                for position in positions:
                    for entry_id in self._pending.replace(position):
                        if entry_id not in unsent:
                            self._send(entry_id, position)
            metadata = self._record.metadata
            for entry_id in self._unsent:
                for position in write_set(entry_id, metadata.ensemble_size, metadata.write_quorum):
                    self._send(entry_id, position)
            self._unsent.clear()
        except TallyError as error:
            self._fail_all(error)
        finally:
            self._changing = None
        self._release()

    async def _cas_new_segment(self, positions: list[int]) -> None:
        context = self._context
        failed = {self._ensemble[p] for p in positions}
        ensemble = list(
            await context.replace_positions(
                self._ensemble, positions, self._record.metadata.write_quorum
            )
        )
        first = self._pending.last_add_confirmed + 1

        def change(metadata: LedgerMetadata) -> LedgerMetadata:
            self._stop_if_taken_over(metadata)
            return metadata.with_ensemble_change(first, tuple(ensemble))

        try:
            self._record = await context.ledgers.update(
                self.ledger_id,
                change,
                current=self._record,
                attempts=context.config.ensemble_change_retries,
            )
        except MetadataVersionConflict:
            raise NotEnoughBookies(
                f"ledger {self.ledger_id}: no ensemble change after "
                f"{context.config.ensemble_change_retries} attempts"
            ) from None
        log.info(
            "ledger %s: ensemble change at entry %d: %s -> %s",
            self.ledger_id,
            first,
            sorted(failed),
            [ensemble[p] for p in positions],
        )
        self._enter_segment(self._record.metadata)
        self._copy = self._record.metadata.to_bytes()
        self._copied = set()

    def _stop_if_recovering(self, metadata: LedgerMetadata) -> None:
        if metadata.state is LedgerState.IN_RECOVERY:
            raise LedgerFenced(f"ledger {self.ledger_id} is being recovered by another client")

    def _stop_if_taken_over(self, metadata: LedgerMetadata) -> None:
        self._stop_if_recovering(metadata)
        if metadata.state is LedgerState.CLOSED:
            raise LedgerClosed(
                f"ledger {self.ledger_id} was closed by another client at entry "
                f"{metadata.last_entry_id}"
            )

    # -- explicit LAC ----------------------------------------------------------------------

    async def _explicit_lac_loop(self) -> None:
        """When the writer goes idle, readers following the tail learn the LAC anyway."""
        interval = self._context.config.explicit_lac_interval
        while not self._closed and self._error is None:
            await asyncio.sleep(interval)
            lac = self._pending.last_add_confirmed
            if lac <= self._lac_sent or time.monotonic() - self._last_add_time < interval:
                continue
            self._lac_sent = lac
            for bookie in self._ensemble:
                connection = self._context.bookies.cached(bookie)
                if connection is not None:
                    task = asyncio.get_running_loop().create_task(
                        connection.write_lac(self.ledger_id, self._master_key, lac)
                    )
                    task.add_done_callback(_ignore_result)

    # -- closing ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Wait for the adds in flight and, up to `close_copies_timeout`, for their copies
        beyond the ack quorum; CAS the ledger CLOSED at the LAC; mark it under-replicated
        for the copies that failed or stayed silent."""
        if self._closed:
            return
        self._stop_appends()
        pending = [w for w in self._waiters.values() if not w.done()]
        if pending and self._error is None:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._changing is not None:
            await asyncio.gather(self._changing, return_exceptions=True)
        if isinstance(self._error, _TERMINAL):
            self._settling = True  # its copies no longer matter to this writer
            raise self._error  # not (or no longer) the ledger's writer: its LAC is no end
        deadline = asyncio.get_running_loop().time() + self._context.config.close_copies_timeout
        await self._settle_copies(deadline)
        last, length = self._pending.last_add_confirmed, self._confirmed_length

        def close(metadata: LedgerMetadata) -> LedgerMetadata:
            self._stop_if_recovering(metadata)
            return metadata.close(last, length)

        self._record = await self._context.ledgers.update(
            self.ledger_id, close, current=self._record
        )
        # Only to the bookies that were sent adds in this segment: a bookie given nothing to
        # hold (E > WQ, a short ledger) is not made to know the ledger by its copy. Not
        # waited for: their connections are open, the frames go now, and a close that
        # waited for three more journal syncs took 3 ms more (bench_ledger_lifecycle).
        await give_copies(self._context, self._record, self._master_key, self._copied, wait=False)
        await self._mark_under_replicated("closed")

    async def stop(self) -> None:
        """The client closes, this writer still open: wait up to `close_copies_timeout` for
        its adds and copies in flight, fail the adds still unconfirmed, mark the ledger
        under-replicated for the copies that failed or stayed silent, and leave the ledger
        OPEN (its recovery closes it). Nothing once the writer is closed or closing."""
        if self._closed:
            return
        self._stop_appends()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._context.config.close_copies_timeout
        pending: list[asyncio.Future[Any]] = [w for w in self._waiters.values() if not w.done()]
        if self._changing is not None:
            pending.append(self._changing)
        if pending and self._error is None:
            await asyncio.wait(pending, timeout=max(0.0, deadline - loop.time()))
        if self._changing is not None:
            # Cut short: its CAS may or may not have landed, which a recovery reads anyway.
            self._changing.cancel()
            await asyncio.gather(self._changing, return_exceptions=True)
        stopped = IllegalOperation(f"ledger {self.ledger_id}: its client was closed")
        if any(not w.done() for w in self._waiters.values()):
            self._fail_all(stopped)  # these adds did fail: logged
        elif self._error is None:
            self._error = stopped
        if isinstance(self._error, _TERMINAL):
            self._settling = True
            return  # another client took the ledger over: its copies are that one's
        await self._settle_copies(deadline)
        await self._mark_under_replicated("left open by its closing client")

    async def _settle_copies(self, deadline: float) -> None:
        """Wait until `deadline` for the copies in flight beyond the ack quorum; the silent
        ones are then counted as missing, as a bookie that did not answer may lack them."""
        self._settling = True
        if self._pending.copies_in_flight:
            self._settled = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._settled
            except TimeoutError:
                pass
            finally:
                self._settled = None
        silent = self._pending.give_up()
        if silent:
            log.warning(
                "ledger %s: %d copies beyond the ack quorum did not answer before the close "
                "(on %s)",
                self.ledger_id,
                len(silent),
                sorted({self._bookie_of(e, p) for e, p in silent}),
            )
        self._take_under_replicated()

    async def _mark_under_replicated(self, how: str) -> None:
        if self._under_replicated:
            await self._context.under_replication.mark_under_replicated(
                self.ledger_id, self._under_replicated
            )
            log.warning(
                "ledger %s %s with copies missing on %s: marked under-replicated",
                self.ledger_id,
                how,
                sorted(self._under_replicated),
            )


def _ignore_result(task: asyncio.Task[None]) -> None:
    """An explicit LAC is advisory: a bookie that misses one learns the LAC later."""
    if not task.cancelled():
        task.exception()


class _PositionAnswers:
    """The AddAnswers of the bookie at one position of a writer's ensemble."""

    __slots__ = ("bookie", "position", "writer")

    def __init__(self, writer: LedgerWriter, position: int, bookie: str) -> None:
        self.writer, self.position, self.bookie = writer, position, bookie

    def acknowledged(self, entry_ids: list[int]) -> None:
        self.writer._on_acks(self.position, self.bookie, entry_ids)

    def failed(self, entry_id: int, error: Exception) -> None:
        self.writer._on_add_failed(self.position, self.bookie, entry_id, error)
