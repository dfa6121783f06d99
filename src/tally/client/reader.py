"""Reading a ledger: from the write set in schedule order, with failover and speculation.

An entry is read from the first bookie of its write set; on an error, or when that bookie
is slow (the speculative read timeout), the next one is asked too, and the first copy
whose digest verifies wins. One replica's NoSuchEntry is not final while another may
have the entry. A copy that fails its digest, here or at the bookie's own end-to-end check
(EntryUnreadable), is corruption at rest or on the wire: it is logged and counted, the
next replica serves the read, and once one did, the bad copies are filed for repair
(tally.metadata.bad_copies).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass

from prometheus_client import Counter

from tally.client.context import ClientContext
from tally.core.answers import Answer
from tally.core.digest import DigestType, LedgerKeys
from tally.core.entry_format import MAX_ENTRY_SIZE, Entry, EntryHeader, verified_entry, verify_entry
from tally.core.errors import (
    BadDigest,
    BadRequest,
    EntryUnreadable,
    NoSuchEntry,
    TallyError,
    Timeout,
)
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata, LedgerState
from tally.metadata.ledger_manager import LedgerRecord

log = logging.getLogger(__name__)

CORRUPT_COPIES = Counter(
    "client_read_corrupt_copies",
    "Entry copies that failed their digest, at the client or at the bookie that held them "
    "(EntryUnreadable); the read used another copy",
)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    entry_id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class FetchedEntry:
    """A verified copy: its bytes as stored (recovery re-writes them) and their header; the
    payload is copied out only when asked for (`entry`): a repair passes `raw` on as it is."""

    raw: bytes
    header: EntryHeader
    digest_type: DigestType

    @property
    def entry(self) -> Entry:
        return verified_entry(self.raw, self.header, self.digest_type)


class EntryFetcher:
    """Reads and verifies single entries of one ledger; shared by readers and recovery."""

    def __init__(self, context: ClientContext, ledger_id: LedgerId, keys: LedgerKeys) -> None:
        self.context = context
        self.ledger_id = ledger_id
        self.mac_key = keys.mac_key
        self.master_key = keys.master_key

    async def read_from(
        self,
        metadata: LedgerMetadata,
        bookie: str,
        entry_id: int,
        *,
        fencing: bool = False,
    ) -> FetchedEntry:
        """One bookie's verified copy of `entry_id` (-1: its last entry)."""
        connection = await self.context.bookies.get(bookie)
        try:
            # asyncio.timeout rather than wait_for: no task per read (recovery makes thousands)
            async with asyncio.timeout(self.context.config.read_timeout):
                raw = await connection.read(
                    self.ledger_id, entry_id, fencing_key=self.master_key if fencing else None
                )
        except EntryUnreadable as error:
            # The bookie's own end-to-end check caught its copy rotten: corruption at rest.
            self._report_corrupt(bookie, entry_id, error)
            raise
        try:
            return self._verified(metadata, bookie, entry_id, raw)
        except BadDigest as error:
            self._report_corrupt(bookie, entry_id, error)
            raise

    async def read_batch_from(
        self, metadata: LedgerMetadata, bookie: str, entry_ids: Sequence[int], max_bytes: int
    ) -> list[FetchedEntry]:
        """One bookie's verified copies of a prefix of `entry_ids`, in one request
        (READ_ENTRIES), about `max_bytes` of them. The prefix ends before the first copy
        that fails its check: a read of that entry alone (`read_from`) reports it. Raises
        as `read_from` does when the bookie answers none."""
        connection = await self.context.bookies.get(bookie)
        async with asyncio.timeout(self.context.config.read_timeout):
            answered = await connection.read_entries(self.ledger_id, entry_ids, max_bytes)
        fetched = []
        for entry_id, raw in zip(entry_ids, answered, strict=False):
            try:
                fetched.append(self._verified(metadata, bookie, entry_id, raw))
            except BadDigest:
                break
        return fetched

    def _verified(
        self, metadata: LedgerMetadata, bookie: str, entry_id: int, raw: bytes
    ) -> FetchedEntry:
        """`raw` as a FetchedEntry if its digest checks and it is the entry asked (entry id
        -1: the bookie's last); BadDigest if not."""
        header = verify_entry(raw, metadata.digest_type, self.mac_key, MAX_ENTRY_SIZE)
        if header.ledger_id != self.ledger_id or (entry_id >= 0 and header.entry_id != entry_id):
            raise BadDigest(
                f"bookie {bookie} answered ledger {header.ledger_id} entry {header.entry_id} "
                f"for ledger {self.ledger_id} entry {entry_id}"
            )
        return FetchedEntry(raw, header, metadata.digest_type)

    def _report_corrupt(self, bookie: str, entry_id: int, error: TallyError) -> None:
        CORRUPT_COPIES.inc()
        log.error(
            "corrupt copy of ledger %s entry %d on bookie %s: %s",
            self.ledger_id,
            entry_id,
            bookie,
            error,
        )

    async def read(self, metadata: LedgerMetadata, entry_id: int) -> LedgerEntry:
        """`entry_id` from any replica of its write set, failing over and speculating."""
        bookies = list(metadata.write_set_bookies(entry_id))
        speculative = self.context.config.speculative_read_timeout
        errors: list[TallyError] = []
        bad: list[str] = []
        tasks: dict[asyncio.Task[FetchedEntry], str] = {}
        remaining = list(bookies)
        try:
            while remaining or tasks:
                if remaining:
                    bookie = remaining.pop(0)
                    tasks[asyncio.create_task(self.read_from(metadata, bookie, entry_id))] = bookie
                done, _ = await asyncio.wait(
                    tasks,
                    timeout=speculative if remaining else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in done:
                    bookie = tasks.pop(task)
                    error = task.exception()
                    if error is None:
                        fetched = task.result()
                        for holder in bad:  # a good copy proves the others bad, not the key
                            self.context.bad_copies.report(self.ledger_id, holder, [entry_id])
                        return LedgerEntry(entry_id, fetched.entry.payload)
                    if isinstance(error, EntryUnreadable | BadDigest):
                        bad.append(bookie)
                    errors.append(_as_tally_error(error))
        finally:
            for task in tasks:
                task.cancel()
        raise _worst(errors, self.ledger_id, entry_id, bookies)


def _as_tally_error(error: BaseException) -> TallyError:
    if isinstance(error, TallyError):
        return error
    if isinstance(error, TimeoutError):
        return Timeout(str(error) or "read timed out")
    return TallyError(repr(error))


def _worst(
    errors: list[TallyError], ledger_id: LedgerId, entry_id: int, bookies: list[str]
) -> TallyError:
    """What the caller sees when no replica served the entry: NoSuchEntry only when every
    replica said so; otherwise the first error that is not an absence (core.answers)."""
    others = [e for e in errors if Answer.of(e) is not Answer.NEGATIVE]
    if others:
        return others[0]
    return NoSuchEntry(f"ledger {ledger_id} entry {entry_id} is on none of {bookies}")


class LedgerReader:
    """A read-only view of a ledger: closed (up to its last entry) or open (up to the LAC)."""

    def __init__(self, context: ClientContext, record: LedgerRecord, keys: LedgerKeys) -> None:
        self._record = record
        self._fetcher = EntryFetcher(context, record.ledger_id, keys)
        self._last_add_confirmed = record.metadata.last_entry_id

    @property
    def ledger_id(self) -> LedgerId:
        return self._record.ledger_id

    @property
    def metadata(self) -> LedgerMetadata:
        return self._record.metadata

    @property
    def is_closed(self) -> bool:
        return self._record.metadata.state is LedgerState.CLOSED

    @property
    def last_entry_id(self) -> int:
        """The last readable entry: the end of a closed ledger, the LAC of an open one."""
        return self._last_add_confirmed

    @property
    def last_add_confirmed(self) -> int:
        return self._last_add_confirmed

    async def update_last_add_confirmed(self) -> int:
        """Ask the bookies of an open ledger's last segment for the LAC they know (no fence);
        the highest answer is the new LAC. A closed ledger's end never moves.

        The metadata is read again first: since this view was taken the writer may have
        changed ensembles (the tail is then on other bookies) or closed the ledger."""
        if self.is_closed:
            return self._last_add_confirmed
        context = self._fetcher.context
        self._record = await context.ledgers.read_ledger_metadata(self.ledger_id)
        if self.is_closed:
            self._last_add_confirmed = self._record.metadata.last_entry_id
            return self._last_add_confirmed
        ensemble = self._record.metadata.segments[-1].ensemble

        async def lac_of(bookie: str) -> int:
            connection = await context.bookies.get(bookie)
            return await asyncio.wait_for(
                connection.read_lac(self.ledger_id), context.config.read_timeout
            )

        answers = await asyncio.gather(*(lac_of(b) for b in ensemble), return_exceptions=True)
        known = [a for a in answers if isinstance(a, int)]
        if known:
            self._last_add_confirmed = max(self._last_add_confirmed, *known)
        return self._last_add_confirmed

    async def wait_for(self, entry_id: int, *, timeout: float, poll_interval: float = 0.1) -> int:
        """Follow the tail: return once the LAC reaches `entry_id` (Timeout otherwise)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while await self.update_last_add_confirmed() < entry_id:
            if asyncio.get_running_loop().time() >= deadline:
                raise Timeout(
                    f"ledger {self.ledger_id}: LAC {self._last_add_confirmed} did not reach "
                    f"{entry_id} in {timeout}s"
                )
            await asyncio.sleep(poll_interval)
        return self._last_add_confirmed

    async def read_entry(self, entry_id: int) -> LedgerEntry:
        self._check_range(entry_id, entry_id)
        return await self._fetcher.read(self._record.metadata, entry_id)

    async def read(self, first: int, last: int) -> AsyncGenerator[LedgerEntry, None]:
        """Entries `first`..`last` in order, fetched up to `max_outstanding_reads` at once."""
        self._check_range(first, last)
        window = self._fetcher.context.config.max_outstanding_reads
        metadata = self._record.metadata
        pending: dict[int, asyncio.Task[LedgerEntry]] = {}
        next_to_start = first
        try:
            for entry_id in range(first, last + 1):
                while next_to_start <= last and next_to_start < entry_id + window:
                    pending[next_to_start] = asyncio.create_task(
                        self._fetcher.read(metadata, next_to_start)
                    )
                    next_to_start += 1
                yield await pending.pop(entry_id)
        finally:
            for task in pending.values():
                if task.done() and not task.cancelled():
                    task.exception()  # a read ahead that failed: the reader left before it
                else:
                    task.cancel()

    def _check_range(self, first: int, last: int) -> None:
        if first < 0 or last < first:
            raise BadRequest(f"cannot read entries {first}..{last} of ledger {self.ledger_id}")
        if last > self._last_add_confirmed:
            raise BadRequest(
                f"entry {last} of ledger {self.ledger_id} is past its "
                f"{'last entry' if self.is_closed else 'last add confirmed'} "
                f"{self._last_add_confirmed}"
            )
