"""The under-replication manager: what the auditor found, and who is repairing it.

The auditor marks a ledger under-replicated with the bookies that lost its copies; a
replication worker locks the ledger (an ephemeral key: a worker that dies drops it),
copies the missing entries, then removes the mark and the lock in one transaction that
also checks the mark's version. A re-mark while the copy runs (another bookie lost)
merges into the mark by compare-and-set and so bumps its version: the worker's removal
then fails, the mark stays, and the newly missing copies are repaired in a next round
instead of being forgotten.

Also here, as in BookKeeper: a cluster-wide switch that disables replication, the
`lost_bookie_recovery_delay` (seconds the auditor waits before marking a lost bookie's
ledgers, so a bookie that restarts quickly causes no copying), and when each of the
auditor's periodic checks last ran. Beyond BookKeeper: an operator's request for an audit
now (the auditor watches it), and the list of lost entries, where a worker puts a ledger
that no copy is left of some entries of, so that it is reported instead of retried forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field

from tally.core.availability import EntryAvailability
from tally.core.errors import (
    BadRequest,
    KeyExists,
    MalformedData,
    MetadataVersionConflict,
    NoSuchKey,
    SessionExpired,
    TallyError,
)
from tally.core.ids import LedgerId
from tally.core.replication import entry_ranges
from tally.metadata import json_records
from tally.metadata.key_ops import Watcher, delete_if_present, put, watch_value
from tally.metadata.ledger_tree import (
    DEFAULT_PAGE_SIZE,
    Subtree,
    create_with_parents,
    prune_parents,
    walk,
)
from tally.metadata.paths import (
    AUDIT_REQUEST,
    LAST_MARKED,
    LOST_BOOKIE_RECOVERY_DELAY,
    LOST_ENTRY_RECORDS,
    REPLICATION_DISABLED,
    UNDER_REPLICATION_MARKS,
    check_path_of,
    lock_path,
)
from tally.metadata.store import Delete, MetadataStore, Versioned, WatchKind

log = logging.getLogger(__name__)

_MARK_KIND = "under-replicated"
_MARK_FIELDS = frozenset({"missing_bookies", "first_marked_ms", "bad_copies"})
_DELAY_KIND = "lost-bookie-recovery-delay"
_DELAY_FIELDS = frozenset({"seconds"})
_CHECK_KIND = "auditor-check"
_CHECK_FIELDS = frozenset({"time_ms"})
_REQUEST_KIND = "audit-request"
_MARKED_KIND = "last-marked"
_MARKED_FIELDS = frozenset({"marked_ms"})
_REQUEST_FIELDS = frozenset({"requested_ms"})
_LOST_KIND = "lost-entries"
_LOST_FIELDS = frozenset({"ranges", "reason", "recorded_ms", "mark_version"})


class AuditorCheck(enum.Enum):
    """The auditor's periodic checks (BookKeeper's names), whose last runs are kept."""

    BOOKIES = "bookie_check"
    CHECK_ALL_LEDGERS = "check_all_ledgers"
    PLACEMENT_POLICY = "placement_policy_check"
    REPLICAS = "replicas_check"
    DELETIONS = "deletion_check"


@dataclass(frozen=True)
class UnderReplicatedLedger:
    """A ledger's under-replication mark as stored."""

    ledger_id: LedgerId
    missing_bookies: frozenset[str]
    """Bookies whose copies of the ledger are lost (empty: check every copy)."""
    first_marked_ms: int
    """When the ledger was first marked; re-marks keep it."""
    version: int
    bad_copies: Mapping[str, EntryAvailability] = field(default_factory=dict)
    """Per bookie, entries whose copies there were found bad (corrupt, unreadable): a repair
    writes a verified copy over each (issue 17)."""


@dataclass(frozen=True)
class LostEntries:
    """Entries of a ledger that no bookie holds a readable copy of, as a worker found them."""

    ledger_id: LedgerId
    ranges: tuple[tuple[int, int], ...]
    """Inclusive (first, last) entry ranges, ascending."""
    reason: str
    recorded_ms: int
    mark_version: int
    """The version of the ledger's mark when recorded: a re-mark makes workers try again."""


@dataclass(frozen=True)
class ReplicationLock:
    """A worker's hold on one ledger, with the mark as it was when the lock was taken."""

    mark: UnderReplicatedLedger
    session_id: int

    @property
    def ledger_id(self) -> LedgerId:
        return self.mark.ledger_id


def _check_bookies(bookies: Iterable[str]) -> frozenset[str]:
    if isinstance(bookies, str):
        raise BadRequest(f"missing bookies must be a collection of ids, not one str {bookies!r}")
    found = frozenset(bookies)
    for bookie in found:
        if not isinstance(bookie, str) or not bookie:
            raise BadRequest(f"a missing bookie must be a non-empty str, got {bookie!r}")
    return found


def _encode_mark(
    missing: frozenset[str], first_marked_ms: int, bad_copies: Mapping[str, EntryAvailability]
) -> bytes:
    fields: dict[str, object] = {
        "missing_bookies": sorted(missing),
        "first_marked_ms": first_marked_ms,
    }
    if bad_copies:
        fields["bad_copies"] = {
            bookie: [list(pair) for pair in entry_ranges(entries)]
            for bookie, entries in sorted(bad_copies.items())
        }
    return json_records.encode(_MARK_KIND, fields)


def _decode_mark(ledger_id: LedgerId, found: Versioned) -> UnderReplicatedLedger:
    source = f"under-replication mark of ledger {ledger_id}"
    record = json_records.decode(found.data, _MARK_KIND, _MARK_FIELDS, source)
    bad = record.pairs_by_text("bad_copies") if "bad_copies" in record.names else {}
    return UnderReplicatedLedger(
        ledger_id,
        frozenset(record.texts("missing_bookies")),
        record.integer("first_marked_ms"),
        found.version,
        {bookie: _entries_of(bookie, ranges, source) for bookie, ranges in bad.items()},
    )


def _entries_of(bookie: str, ranges: tuple[tuple[int, int], ...], source: str) -> EntryAvailability:
    try:
        checked = _check_ranges(ranges)
    except BadRequest as e:
        raise MalformedData(f"{source}: bad copies on {bookie}: {e}") from None
    entries = EntryAvailability.empty()
    for first, last in checked:
        entries = entries.union(EntryAvailability.span(first, last))
    return entries


def _merged_copies(
    *maps: Mapping[str, EntryAvailability],
) -> dict[str, EntryAvailability]:
    merged: dict[str, EntryAvailability] = {}
    for bad in maps:
        for bookie, entries in bad.items():
            merged[bookie] = merged[bookie].union(entries) if bookie in merged else entries
    return {bookie: entries for bookie, entries in merged.items() if entries}


def _decode_delay(data: bytes) -> int:
    record = json_records.decode(data, _DELAY_KIND, _DELAY_FIELDS, LOST_BOOKIE_RECOVERY_DELAY)
    return record.integer("seconds")


def _decode_marked(data: bytes) -> int:
    return json_records.decode(data, _MARKED_KIND, _MARKED_FIELDS, LAST_MARKED).integer("marked_ms")


def _decode_request(data: bytes) -> int:
    return json_records.decode(data, _REQUEST_KIND, _REQUEST_FIELDS, AUDIT_REQUEST).integer(
        "requested_ms"
    )


def _check_ranges(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    found = tuple((int(first), int(last)) for first, last in ranges)
    if not found or any(not 0 <= first <= last for first, last in found):
        raise BadRequest(f"lost entries need non-empty ranges 0 <= first <= last, got {found}")
    return tuple(sorted(found))


def _decode_lost(ledger_id: LedgerId, found: Versioned) -> LostEntries:
    source = f"lost entries of ledger {ledger_id}"
    record = json_records.decode(found.data, _LOST_KIND, _LOST_FIELDS, source)
    try:
        ranges = _check_ranges(record.integer_pairs("ranges"))
    except BadRequest as e:
        raise MalformedData(f"{source}: {e}") from None
    return LostEntries(
        ledger_id,
        ranges,
        record.text("reason"),
        record.integer("recorded_ms"),
        record.integer("mark_version"),
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


class UnderReplicationManager:
    """Under-replication marks, replication locks and the auditor's settings, on one session."""

    def __init__(self, store: MetadataStore):
        self.store = store

    # -- marks ---------------------------------------------------------------------------

    async def mark_under_replicated(
        self,
        ledger_id: LedgerId,
        missing_bookies: Iterable[str],
        *,
        bad_copies: Mapping[str, Iterable[int]] | None = None,
        now_ms: int | None = None,
    ) -> UnderReplicatedLedger:
        """Mark the ledger, or merge `missing_bookies` (and `bad_copies`: per bookie, entries
        whose copies there are bad) into its mark; the mark as stored.

        A mark that does not decode is replaced (and the replacement logged), so a corrupt
        mark never blocks the ledger's repair.
        """
        missing = _check_bookies(missing_bookies)
        bad = _merged_copies(
            {
                bookie: EntryAvailability.from_entries(entries)
                for bookie, entries in (bad_copies or {}).items()
            }
        )
        _check_bookies(bad)
        path = UNDER_REPLICATION_MARKS.path(ledger_id)
        marked_ms = _now_ms() if now_ms is None else now_ms
        while True:
            try:
                found = await self.store.get(path)
            except NoSuchKey:
                try:
                    await create_with_parents(
                        self.store, path, _encode_mark(missing, marked_ms, bad)
                    )
                except KeyExists:
                    continue  # marked meanwhile: merge into that
                await self._tell_workers(marked_ms)
                return UnderReplicatedLedger(ledger_id, missing, marked_ms, 0, bad)
            try:
                current = _decode_mark(ledger_id, found)
                merged, first = current.missing_bookies | missing, current.first_marked_ms
                merged_bad = _merged_copies(current.bad_copies, bad)
            except MalformedData as e:
                log.error("replacing an unreadable mark: %s", e)
                current, merged, first, merged_bad = None, missing, marked_ms, bad
            if current is not None and (merged, merged_bad) == (
                current.missing_bookies,
                current.bad_copies,
            ):
                return current
            try:
                stat = await self.store.set(
                    path, _encode_mark(merged, first, merged_bad), found.version
                )
            except (MetadataVersionConflict, NoSuchKey):
                continue  # re-marked or repaired meanwhile: start over
            await self._tell_workers(marked_ms)
            return UnderReplicatedLedger(ledger_id, merged, first, stat.version, merged_bad)

    async def _tell_workers(self, marked_ms: int) -> None:
        """Wake the workers watching LAST_MARKED. Best effort: the mark is made, and a
        worker that misses this finds it at its next poll."""
        try:
            await put(
                self.store, LAST_MARKED, json_records.encode(_MARKED_KIND, {"marked_ms": marked_ms})
            )
        except TallyError as error:
            log.warning("could not tell the replication workers of a new mark: %s", error)

    async def watch_marks(self, callback: Callable[[int | None], object]) -> Watcher[int | None]:
        """Call `callback(when the last mark was made or changed, ms, or None)` now and at
        every mark made or changed."""
        return await watch_value(self.store, LAST_MARKED, _decode_marked, callback)

    async def under_replicated(self, ledger_id: LedgerId) -> UnderReplicatedLedger | None:
        """The ledger's mark, or None when it is not marked."""
        try:
            found = await self.store.get(UNDER_REPLICATION_MARKS.path(ledger_id))
        except NoSuchKey:
            return None
        return _decode_mark(ledger_id, found)

    async def list_under_replicated(
        self,
        *,
        missing_bookie: str | None = None,
        marked_before_ms: int | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        within: Subtree | None = None,
    ) -> AsyncIterator[UnderReplicatedLedger]:
        """Marked ledgers (in the subtree `within`) in id order; only those missing
        `missing_bookie`, or first marked before `marked_before_ms`, when given. Unreadable
        marks are logged and skipped."""
        async for page in walk(self.store, UNDER_REPLICATION_MARKS, page_size, within):
            for stray in page.strays:
                log.error("%s is among the under-replication marks but names no ledger", stray)
            for ledger_id, _, found in page.ledgers:
                try:
                    mark = _decode_mark(ledger_id, found)
                except MalformedData as e:
                    log.error("skipping an unreadable mark: %s", e)
                    continue
                if missing_bookie is not None and missing_bookie not in mark.missing_bookies:
                    continue
                if marked_before_ms is not None and mark.first_marked_ms >= marked_before_ms:
                    continue
                yield mark

    # -- locks ---------------------------------------------------------------------------

    async def acquire(self, ledger_id: LedgerId) -> ReplicationLock | None:
        """Lock the ledger for replication; None if another worker holds it or it is no
        longer marked. MalformedData (lock released) if its mark does not decode."""
        lock_session = await self._lock(ledger_id)
        if lock_session is None:
            return None
        try:
            mark = await self.under_replicated(ledger_id)
        except BaseException:
            await self._unlock(ledger_id, lock_session)
            raise
        if mark is None:
            await self._unlock(ledger_id, lock_session)
            return None
        return ReplicationLock(mark, lock_session)

    async def release(self, lock: ReplicationLock) -> None:
        """Give the ledger back, marked as it is, for another round (this or another worker)."""
        self._check_own(lock)
        await self._unlock(lock.ledger_id, lock.session_id)

    async def mark_replicated(self, lock: ReplicationLock) -> bool:
        """Remove the mark if unchanged since `lock` was taken; release the lock either way.

        False when the ledger was re-marked meanwhile: the mark stays for another round.
        SessionExpired if the lock was lost with the session (another worker may hold it).
        Any other error (the store failed) changed nothing: the lock is still held, and the
        caller releases it.
        """
        self._check_own(lock)
        path = lock_path(lock.ledger_id)
        held = await self.store.exists(path)
        if held is None or held.ephemeral_owner != lock.session_id:
            raise SessionExpired(
                f"the replication lock on ledger {lock.ledger_id} was lost (session "
                f"{lock.session_id:#x} expired); the ledger stays marked"
            )
        mark_path = UNDER_REPLICATION_MARKS.path(lock.ledger_id)
        try:
            await self.store.transaction([Delete(mark_path, lock.mark.version), Delete(path)])
        except MetadataVersionConflict:
            await self.release(lock)
            return False
        except NoSuchKey:
            await self.release(lock)  # the mark was deleted by hand, or the lock just lost
            raise
        await prune_parents(self.store, UNDER_REPLICATION_MARKS.parents(lock.ledger_id))
        return True

    @contextlib.asynccontextmanager
    async def held_unmarked(self, ledger_id: LedgerId) -> AsyncIterator[bool]:
        """Hold the ledger's replication lock while the ledger is not marked (a bookie's GC
        trims extra copies under it, BookKeeper's rule, so that no repair copies meanwhile).
        Yields False, holding nothing, when a worker holds the lock or the ledger is marked:
        its extra copies may be what a repair reads."""
        session = await self._lock(ledger_id)
        if session is None:
            yield False
            return
        try:
            yield await self.under_replicated(ledger_id) is None
        finally:
            await self._unlock(ledger_id, session)

    def _check_own(self, lock: ReplicationLock) -> None:
        if lock.session_id != self.store.session_id:
            raise BadRequest(
                f"the lock on ledger {lock.ledger_id} was taken on session "
                f"{lock.session_id:#x}, not on this manager's {self.store.session_id:#x}"
            )

    async def _lock(self, ledger_id: LedgerId) -> int | None:
        """Create the ledger's lock; the session that holds it, or None if another does.

        A create already sent still lands when its caller is cancelled (the pass that took
        several ledgers at once cancels the rest when one fails): the cancelled caller waits
        for it and gives back a lock it made, which would otherwise keep the ledger from
        every worker for as long as this session lives. It waits through further cancels
        too, so a cancellation ends only once the store has answered (within its timeouts)."""
        creating = asyncio.ensure_future(self.store.create(lock_path(ledger_id), ephemeral=True))
        try:
            await asyncio.shield(creating)
        except KeyExists:
            return None
        except asyncio.CancelledError:
            giving_back = asyncio.ensure_future(self._give_back(ledger_id, creating))
            while not giving_back.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(giving_back)
            raise
        return self.store.session_id

    async def _give_back(self, ledger_id: LedgerId, creating: asyncio.Future[str]) -> None:
        """Delete the lock `creating` made, once it has answered, if this session holds it."""
        with contextlib.suppress(Exception):
            await creating  # KeyExists: another's; a timeout: made or not (_unlock looks)
        try:
            await self._unlock(ledger_id, self.store.session_id)
        except TallyError as error:
            log.warning(
                "ledger %s: a cancelled taker could not give its replication lock back (%s); "
                "the lock goes with this session",
                ledger_id,
                error,
            )

    async def _unlock(self, ledger_id: LedgerId, session_id: int) -> None:
        """Delete the ledger's lock if `session_id` holds it (never another worker's)."""
        path = lock_path(ledger_id)
        held = await self.store.exists(path)
        if held is not None and held.ephemeral_owner == session_id:
            await delete_if_present(self.store, path)

    # -- cluster-wide settings -----------------------------------------------------------

    async def disable_replication(self) -> None:
        with contextlib.suppress(KeyExists):
            await self.store.create(REPLICATION_DISABLED)

    async def enable_replication(self) -> None:
        await delete_if_present(self.store, REPLICATION_DISABLED)

    async def is_replication_enabled(self) -> bool:
        return await self.store.exists(REPLICATION_DISABLED) is None

    async def watch_replication_enabled(self, callback: Callable[[bool], object]) -> Watcher[bool]:
        """Call `callback(enabled)` now and whenever replication is enabled or disabled."""
        return await Watcher.start(
            self.store,
            [(REPLICATION_DISABLED, WatchKind.EXISTS)],
            self.is_replication_enabled,
            callback,
            "the replication switch",
        )

    async def set_lost_bookie_recovery_delay(self, seconds: int) -> None:
        if not isinstance(seconds, int) or isinstance(seconds, bool) or seconds < 0:
            raise BadRequest(f"lost bookie recovery delay must be an int >= 0, got {seconds!r}")
        await put(
            self.store,
            LOST_BOOKIE_RECOVERY_DELAY,
            json_records.encode(_DELAY_KIND, {"seconds": seconds}),
        )

    async def lost_bookie_recovery_delay(self) -> int | None:
        """Seconds, or None when never set (the auditor then uses its configured default)."""
        try:
            found = await self.store.get(LOST_BOOKIE_RECOVERY_DELAY)
        except NoSuchKey:
            return None
        return _decode_delay(found.data)

    async def watch_lost_bookie_recovery_delay(
        self, callback: Callable[[int | None], object]
    ) -> Watcher[int | None]:
        """Call `callback(seconds or None)` now and after every change."""
        return await watch_value(self.store, LOST_BOOKIE_RECOVERY_DELAY, _decode_delay, callback)

    async def set_check_time(self, check: AuditorCheck, time_ms: int) -> None:
        """Record when the auditor last ran `check`."""
        if not isinstance(time_ms, int) or isinstance(time_ms, bool) or time_ms < 0:
            raise BadRequest(f"a check time must be an int >= 0 (ms), got {time_ms!r}")
        await put(
            self.store,
            check_path_of(AuditorCheck(check).value),
            json_records.encode(_CHECK_KIND, {"time_ms": time_ms}),
        )

    async def check_time(self, check: AuditorCheck) -> int | None:
        """When the auditor last ran `check` (ms), or None if it never did."""
        path = check_path_of(AuditorCheck(check).value)
        try:
            found = await self.store.get(path)
        except NoSuchKey:
            return None
        return json_records.decode(found.data, _CHECK_KIND, _CHECK_FIELDS, path).integer("time_ms")

    # -- audit requests ------------------------------------------------------------------

    async def request_audit(self, *, now_ms: int | None = None) -> int:
        """Ask the auditor to run every check now; the request's time (ms)."""
        requested = _now_ms() if now_ms is None else now_ms
        await put(
            self.store,
            AUDIT_REQUEST,
            json_records.encode(_REQUEST_KIND, {"requested_ms": requested}),
        )
        return requested

    async def watch_audit_requests(
        self, callback: Callable[[int | None], object]
    ) -> Watcher[int | None]:
        """Call `callback(requested ms or None)` now and at every request."""
        return await watch_value(self.store, AUDIT_REQUEST, _decode_request, callback)

    # -- lost entries --------------------------------------------------------------------

    async def record_lost_entries(
        self,
        ledger_id: LedgerId,
        ranges: Iterable[tuple[int, int]],
        reason: str,
        *,
        mark_version: int,
        now_ms: int | None = None,
    ) -> LostEntries:
        """Put the ledger on the lost-entries list (replacing an earlier record of it)."""
        lost = LostEntries(
            ledger_id,
            _check_ranges(ranges),
            reason,
            _now_ms() if now_ms is None else now_ms,
            mark_version,
        )
        data = json_records.encode(
            _LOST_KIND,
            {
                "ranges": [list(pair) for pair in lost.ranges],
                "reason": reason,
                "recorded_ms": lost.recorded_ms,
                "mark_version": mark_version,
            },
        )
        path = LOST_ENTRY_RECORDS.path(ledger_id)
        try:
            await create_with_parents(self.store, path, data)
        except KeyExists:
            await put(self.store, path, data)
        return lost

    async def lost_entries(self, ledger_id: LedgerId) -> LostEntries | None:
        try:
            found = await self.store.get(LOST_ENTRY_RECORDS.path(ledger_id))
        except NoSuchKey:
            return None
        return _decode_lost(ledger_id, found)

    async def list_lost_entries(
        self, *, page_size: int = DEFAULT_PAGE_SIZE
    ) -> AsyncIterator[LostEntries]:
        """Every ledger on the lost-entries list, in id order; unreadable records logged."""
        async for page in walk(self.store, LOST_ENTRY_RECORDS, page_size):
            for ledger_id, _, found in page.ledgers:
                try:
                    yield _decode_lost(ledger_id, found)
                except MalformedData as e:
                    log.error("skipping an unreadable lost-entries record: %s", e)

    async def forget_deleted(self, ledger_id: LedgerId) -> None:
        """Drop the mark and the lost-entries record of a ledger replaced by its tombstone:
        there is nothing left to repair, and a mark left would never be taken again (a
        worker that holds it finds it gone and lets go)."""
        if await delete_if_present(self.store, UNDER_REPLICATION_MARKS.path(ledger_id)):
            await prune_parents(self.store, UNDER_REPLICATION_MARKS.parents(ledger_id))
        await self.clear_lost_entries(ledger_id)

    async def clear_lost_entries(self, ledger_id: LedgerId) -> bool:
        """Take the ledger off the list (repaired, deleted, or an operator's decision)."""
        removed = await delete_if_present(self.store, LOST_ENTRY_RECORDS.path(ledger_id))
        if removed:
            await prune_parents(self.store, LOST_ENTRY_RECORDS.parents(ledger_id))
        return removed
