"""The two questions asked of a bookie's answer: what it proves to recovery (Answer), and
whether it holds a copy a repair can use (Copy)."""

from __future__ import annotations

import pytest

from tally.core.answers import Answer, Copy
from tally.core.errors import (
    BadDigest,
    BookieUnavailable,
    EntryCorrupt,
    EntryUnreadable,
    LedgerFenced,
    LedgerInLimbo,
    NoSuchEntry,
    NoSuchLedger,
    Timeout,
    TooManyRequests,
    Unauthorized,
    wire_codes,
)

NO_COPY = (NoSuchEntry, NoSuchLedger, BadDigest, EntryUnreadable, EntryCorrupt, LedgerInLimbo)


def test_only_explicit_absence_is_negative() -> None:
    assert Answer.of(None) is Answer.POSITIVE
    for error_type in wire_codes().values():
        expected = Answer.NEGATIVE if error_type in (NoSuchEntry, NoSuchLedger) else Answer.UNKNOWN
        assert Answer.of(error_type("x")) is expected, error_type


@pytest.mark.parametrize(
    "error",
    [
        Timeout(),
        BadDigest(),
        EntryUnreadable(),
        EntryCorrupt(),
        LedgerInLimbo(),
        LedgerFenced(),
        BookieUnavailable(),
        TooManyRequests(),
        Unauthorized(),
        TimeoutError(),
        ConnectionResetError(),
        ValueError(),
    ],
)
def test_errors_timeouts_and_limbo_are_unknown_to_recovery(error: BaseException) -> None:
    assert Answer.of(error) is Answer.UNKNOWN


def test_a_repair_finds_no_copy_in_absent_corrupt_unreadable_or_limbo_answers() -> None:
    assert Copy.of(None) is Copy.USABLE
    for error_type in wire_codes().values():
        expected = Copy.NONE if error_type in NO_COPY else Copy.UNKNOWN
        assert Copy.of(error_type("x")) is expected, error_type
    for error in (TimeoutError(), ConnectionResetError(), ValueError()):
        assert Copy.of(error) is Copy.UNKNOWN


def test_every_negative_to_recovery_is_no_copy_to_a_repair() -> None:
    """Never the other way round: a negative that left a usable copy would be a bug."""
    for error_type in wire_codes().values():
        if Answer.of(error_type("x")) is Answer.NEGATIVE:
            assert Copy.of(error_type("x")) is Copy.NONE
