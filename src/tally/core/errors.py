"""The one hierarchy of tally's errors, each with a stable numeric code for the wire.

A bookie answers a request with a status code; the client turns it back into the same
exception type with `from_code`. The codes never change meaning once released: a new
error takes a new code. Where Apache BookKeeper has the same error, the code is the
magnitude of its client return code, so operators can map one onto the other.
"""

from __future__ import annotations

from typing import ClassVar


class TallyError(Exception):
    """Base of every error tally raises on purpose."""

    code: ClassVar[int] = 1


class BadRequest(TallyError):
    """A request or argument that can never succeed as given (a caller's mistake)."""

    code = 14


class MalformedData(BadRequest):
    """Bytes that do not decode: truncated, oversized, garbage, or of an unknown version."""

    code = 16


class BadSetting(BadRequest):
    """A config refused the value of `setting` (tally.config.load adds where it came from)."""

    code = 19

    def __init__(self, setting: str = "", problem: str = "") -> None:
        super().__init__(f"{setting}: {problem}" if problem else setting)
        self.setting = setting
        self.problem = problem


class BadDigest(TallyError):
    """An entry's digest does not match its bytes: corruption on the wire or at rest."""

    code = 5


class NotEnoughBookies(TallyError):
    """Too few bookies (or too few racks) to place an ensemble that meets the policy."""

    code = 6


class NoSuchLedger(TallyError):
    """The ledger does not exist (never created, or deleted)."""

    code = 7


class BookieUnavailable(TallyError):
    """A bookie could not be reached or refused the connection."""

    code = 8


class MetadataStoreError(TallyError):
    """The metadata store failed or could not be reached."""

    code = 9


class LedgerRecoveryFailed(TallyError):
    """Recovery could not decide the end of the ledger; it stays IN_RECOVERY, retry later."""

    code = 10


class LedgerClosed(TallyError):
    """The ledger is closed (or was closed at another end than the caller's)."""

    code = 11


class WriteFailed(TallyError):
    """A bookie failed to store an entry."""

    code = 12


class NoSuchEntry(TallyError):
    """The bookie does not have the entry, and its index never said it had it."""

    code = 13


class MetadataVersionConflict(TallyError):
    """A compare-and-set found another version than the one expected."""

    code = 17


class Unauthorized(TallyError):
    """Wrong ledger password (master key)."""

    code = 102


class LedgerExists(TallyError):
    """A ledger with this id already exists."""

    code = 20


class Timeout(TallyError):
    """No answer within the allowed time: an *unknown* outcome, never a negative one."""

    code = 23


class EntryUnreadable(TallyError):
    """The index says the entry exists but its bytes cannot be read or are corrupt.

    Distinct from `NoSuchEntry` on purpose: answering "no such entry" for an entry a
    bookie once stored would let recovery truncate the ledger.
    """

    code = 24


class EntryCorrupt(EntryUnreadable):
    """The bookie's stored copy of the entry failed its check (CRC32C, or a record that
    names another entry): it is marked corrupt in the bookie's index, kept, and answered
    as this until a good copy is written over it. Unknown, never missing, as its parent."""

    code = 28


class LedgerInLimbo(TallyError):
    """The bookie may have lost entries of this ledger (its journal was damaged) and cannot
    say whether it held this one: unknown, never `NoSuchEntry`, until it is repaired."""

    code = 25


class LedgerDeleted(TallyError):
    """The ledger was deleted: soft-deleted (undeletable for a while) or tombstoned."""

    code = 26


class DeleteRefused(TallyError):
    """A delete the cluster's delete discipline refuses (open ledger, archival missing)."""

    code = 27


class LedgerFenced(TallyError):
    """The ledger was fenced by a recovering client; normal adds are refused."""

    code = 101


class WriteOnReadOnlyBookie(TallyError):
    """The bookie is read-only (disk full or failing) and refuses writes."""

    code = 104


class TooManyRequests(TallyError):
    """The bookie is overloaded and shed this request."""

    code = 105


class IllegalOperation(TallyError):
    """An operation the receiver does not support, or not in this state."""

    code = 100


class InvalidMetadataTransition(BadRequest):
    """A ledger metadata change that would break an invariant (e.g. closing at another end)."""

    code = 18


class NoSuchKey(MetadataStoreError):
    """The metadata store has nothing at this path."""

    code = 33


class KeyExists(MetadataStoreError):
    """The metadata store already has something at this path."""

    code = 34


class NotEmpty(MetadataStoreError):
    """A path cannot be deleted while it has children."""

    code = 35


class SessionExpired(MetadataStoreError):
    """The metadata store session is gone; its ephemeral keys with it."""

    code = 36


class ClusterNotInitialised(TallyError):
    """The metadata store holds no tally cluster; run `tally cluster init` first."""

    code = 30


class CookieMismatch(TallyError):
    """A bookie's cookie disagrees with its directories or with the metadata store."""

    code = 31


class UnrecoverableEntries(TallyError):
    """Entries with no readable copy anywhere: re-replication cannot restore them."""

    code = 200


def _all_error_types() -> list[type[TallyError]]:
    found: list[type[TallyError]] = []
    pending: list[type[TallyError]] = [TallyError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def _build_registry() -> dict[int, type[TallyError]]:
    registry: dict[int, type[TallyError]] = {}
    for cls in _all_error_types():
        if cls.__module__ != __name__:
            continue
        if cls.code in registry:
            raise AssertionError(f"wire code {cls.code} used twice: {registry[cls.code]}, {cls}")
        registry[cls.code] = cls
    return registry


_BY_CODE = _build_registry()


def from_code(code: int, message: str = "") -> TallyError:
    """The exception that `code` stands for, carrying `message`; unknown codes stay visible."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return TallyError(f"unknown error code {code}: {message}")
    return cls(message)


def wire_codes() -> dict[int, type[TallyError]]:
    """Every stable code and its type (for documentation and tests)."""
    return dict(_BY_CODE)
