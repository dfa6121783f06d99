"""A bookie's admission rules: master keys fixed by the first writer, one-way fencing, and
which writes a read-only bookie still takes."""

from __future__ import annotations

import pytest

from tally.core.admission import (
    LedgerAccess,
    admit_add,
    admit_fencing_read,
    admit_write,
    admit_write_lac,
)
from tally.core.digest import master_key
from tally.core.disk_usage import DiskState
from tally.core.errors import (
    BadRequest,
    LedgerFenced,
    Unauthorized,
    WriteFailed,
    WriteOnReadOnlyBookie,
)
from tally.core.ids import LedgerId

LEDGER = LedgerId(0, 7)
KEY = master_key(b"pw")
OTHER = master_key(b"not-pw")


def test_first_add_fixes_the_key_and_asks_to_record_it() -> None:
    admission = admit_add(LEDGER, LedgerAccess(), KEY, recovery=False)
    assert admission.record_master_key
    assert not admission.record_fence
    again = admit_add(LEDGER, LedgerAccess(master_key=KEY), KEY, recovery=False)
    assert not again.record_master_key


@pytest.mark.parametrize("admit", [admit_fencing_read, admit_write_lac])
def test_wrong_key_is_unauthorized_everywhere(admit: object) -> None:
    access = LedgerAccess(master_key=KEY)
    with pytest.raises(Unauthorized, match="ledger 7"):
        admit_add(LEDGER, access, OTHER, recovery=False)
    with pytest.raises(Unauthorized):
        admit_add(LEDGER, access, OTHER, recovery=True)
    with pytest.raises(Unauthorized):
        admit(LEDGER, access, OTHER)  # type: ignore[operator]


def test_fenced_ledger_refuses_normal_adds_but_not_recovery_adds() -> None:
    access = LedgerAccess(master_key=KEY, fenced=True)
    with pytest.raises(LedgerFenced, match="ledger 7 is fenced"):
        admit_add(LEDGER, access, KEY, recovery=False)
    assert not admit_add(LEDGER, access, KEY, recovery=True).record_fence


def test_a_ledger_lost_with_a_disk_refuses_normal_adds_as_a_failure_not_as_fenced() -> None:
    """Its writer changes ensemble away from the bookie rather than stop as if fenced; the
    repair's recovery adds come through."""
    access = LedgerAccess(fenced=True, lost=True)
    with pytest.raises(WriteFailed, match="failed ledger directory"):
        admit_add(LEDGER, access, KEY, recovery=False)
    assert admit_add(LEDGER, access, KEY, recovery=True).record_master_key


def test_fencing_an_unknown_ledger_records_key_and_fence() -> None:
    admission = admit_fencing_read(LEDGER, LedgerAccess(), KEY)
    assert admission.record_fence
    assert admission.record_master_key


def test_fencing_twice_records_nothing_new() -> None:
    admission = admit_fencing_read(LEDGER, LedgerAccess(master_key=KEY, fenced=True), KEY)
    assert not admission.record_fence
    assert not admission.record_master_key


def test_explicit_lac_passes_a_fence() -> None:
    access = LedgerAccess(master_key=KEY, fenced=True)
    assert not admit_write_lac(LEDGER, access, KEY).record_fence


def test_master_keys_have_one_size() -> None:
    with pytest.raises(BadRequest, match="5 bytes"):
        admit_add(LEDGER, LedgerAccess(), b"short", recovery=False)


@pytest.mark.parametrize("recovery", [False, True])
def test_a_writable_bookie_takes_every_write(recovery: bool) -> None:
    admit_write(DiskState(), "b1", recovery=recovery)


def test_a_full_disk_refuses_normal_writes_but_lets_recovery_through() -> None:
    full = DiskState().with_usage(0.99)
    with pytest.raises(WriteOnReadOnlyBookie, match="b1 is read-only: disk usage"):
        admit_write(full, "b1", recovery=False)
    admit_write(full, "b1", recovery=True)


def test_a_journal_out_of_room_refuses_recovery_writes_too() -> None:
    full = DiskState().with_journal_failure("ENOSPC", now=0.0)
    for recovery in (False, True):
        with pytest.raises(WriteOnReadOnlyBookie, match="journal cannot write: ENOSPC"):
            admit_write(full, "b1", recovery=recovery)
    admit_write(full.with_journal_writing(), "b1", recovery=True)


@pytest.mark.parametrize("usage", [0.0, 0.99])
def test_after_an_io_error_nothing_is_written(usage: float) -> None:
    failed = DiskState().with_usage(usage).with_io_error("EIO on the journal")
    for recovery in (False, True):
        with pytest.raises(WriteOnReadOnlyBookie, match="I/O error: EIO on the journal"):
            admit_write(failed, "b1", recovery=recovery)
