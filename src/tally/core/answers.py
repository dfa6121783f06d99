"""What one bookie's answer to a read proves: the two questions tally asks of it.

The truncation rule (seed 003): only an explicit "I do not have it" (NoSuchEntry,
NoSuchLedger) is a negative. An error, a timeout, a refusal, a corrupt or unreadable copy,
a ledger in limbo after journal damage: each is *unknown*, never a negative, because a
recovery that counts them as negatives can close a ledger before an entry that an ack
quorum acknowledged. `Answer` is this rule, for recovery and fencing.

A replication worker asks something else of the same answer: is there a copy here that it
can copy from? A corrupt copy, an unreadable one or a ledger in limbo that lacks the entry
holds none, although none of them is a negative to recovery. `Copy` is that question; an
entry counts as lost only when every bookie of its write set has no copy (NONE).
"""

from __future__ import annotations

from enum import Enum

from tally.core.errors import (
    BadDigest,
    EntryUnreadable,
    LedgerInLimbo,
    NoSuchEntry,
    NoSuchLedger,
)

_NO_COPY = (NoSuchEntry, NoSuchLedger, BadDigest, EntryUnreadable, LedgerInLimbo)
"""A limbo bookie answers LedgerInLimbo only for entries it does not hold."""


class Answer(Enum):
    """What one bookie's answer proves about an entry, or (when fencing) about the ledger."""

    POSITIVE = "positive"
    """The bookie answered with data whose digest the caller verified."""
    NEGATIVE = "negative"
    """The bookie answered NoSuchEntry or NoSuchLedger."""
    UNKNOWN = "unknown"
    """Any other outcome: no answer, a timeout, or an error that says nothing of absence."""

    @classmethod
    def of(cls, error: BaseException | None) -> Answer:
        """Classify the outcome of one read; `None` means data that passed its digest check.

        Unknown, not negative: `BadDigest` and `EntryUnreadable` (the bookie holds
        *something* for the entry, so it was written, but this copy is useless);
        `LedgerInLimbo` (the bookie may have lost it); `LedgerFenced` (recovery reads carry
        the fence flag, so a refusal says nothing about the entry); `Timeout`,
        `BookieUnavailable`, `TooManyRequests`, `Unauthorized` and any exception that is not
        a tally error.
        """
        if error is None:
            return cls.POSITIVE
        if isinstance(error, NoSuchEntry | NoSuchLedger):
            return cls.NEGATIVE
        return cls.UNKNOWN


class Copy(Enum):
    """Whether a bookie has a copy of an entry that a repair can use."""

    USABLE = "usable"
    """A copy whose digest the caller verified."""
    NONE = "none"
    """Certainly no usable copy: absent, corrupt, unreadable, or lost in limbo."""
    UNKNOWN = "unknown"
    """No answer, or an error that says nothing of the copy: ask again later."""

    @classmethod
    def of(cls, error: BaseException | None) -> Copy:
        """Classify the outcome of one read; `None` means data that passed its digest check."""
        if error is None:
            return cls.USABLE
        if isinstance(error, _NO_COPY):
            return cls.NONE
        return cls.UNKNOWN
