"""What a bookie lets through for one ledger: adds, fencing reads and explicit LACs.

The first writer to reach a bookie fixes the ledger's master key there; every later add
or fencing read must present the same key, so a client without the password can neither
write nor fence. Fencing is one-way: after it, only recovery adds are accepted, which is
what stops an old writer once a recovering client has fenced enough bookies.

The bookie keeps `LedgerAccess` per ledger and asks these functions before it journals;
what they return says which durable records the request needs first. `admit_write` says
which writes a read-only bookie still takes.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Final

from tally.core.digest import MASTER_KEY_SIZE
from tally.core.disk_usage import BookieMode, DiskState
from tally.core.errors import (
    BadRequest,
    LedgerFenced,
    Unauthorized,
    WriteFailed,
    WriteOnReadOnlyBookie,
)
from tally.core.ids import LedgerId


@dataclass(frozen=True, slots=True)
class LedgerAccess:
    """A bookie's access state for one ledger; None master key: never written here."""

    master_key: bytes | None = None
    fenced: bool = False
    lost: bool = False
    """The bookie may have lost its copy of the ledger (in limbo: a failed disk, a damaged
    journal): its fence may be lost too, and the ledger is being repaired here."""


@dataclass(frozen=True, slots=True)
class Admission:
    """The bookie may go on; these durable records must precede the reply."""

    record_master_key: bool
    """First key this bookie sees for the ledger: journal it with the entry."""
    record_fence: bool
    """A fencing read on a ledger not yet fenced here: journal the fence before replying."""


_FIRST_KEY: Final = Admission(record_master_key=True, record_fence=False)
_KNOWN_KEY: Final = Admission(record_master_key=False, record_fence=False)
"""The two answers of an add or an explicit LAC, made once: one per add is a cost."""


def admit_write(disk: DiskState, bookie_id: str, *, recovery: bool) -> None:
    """Refuse a write (an add, or the fence of a fencing read) on a read-only bookie, but
    let recovery's through while the journal still works: closing other writers' ledgers
    must not stall on a full disk. After an I/O error, or while the journal is out of room,
    the bookie writes nothing."""
    if disk.mode is BookieMode.WRITABLE:
        return
    if recovery and disk.journal_writes:
        return
    raise WriteOnReadOnlyBookie(f"bookie {bookie_id} is read-only: {disk.reason}")


def admit_add(
    ledger_id: LedgerId, access: LedgerAccess, master_key: bytes, *, recovery: bool
) -> Admission:
    """Accept an add, or raise Unauthorized (wrong key), LedgerFenced (normal add after
    fencing) or WriteFailed (normal add to a ledger the bookie may have lost, so that its
    writer changes ensemble rather than stop as fenced). Recovery adds pass a fence: they are how
    recovery and repairs re-write entries."""
    _check_key(ledger_id, access, master_key)
    if access.lost and not recovery:
        raise WriteFailed(
            f"ledger {ledger_id}: this bookie may have lost its copy (a failed ledger "
            "directory or a damaged journal) and is being repaired: normal adds refused, "
            "write to another bookie"
        )
    if access.fenced and not recovery:
        raise LedgerFenced(f"ledger {ledger_id} is fenced on this bookie: normal adds refused")
    return _FIRST_KEY if access.master_key is None else _KNOWN_KEY


def admit_fencing_read(ledger_id: LedgerId, access: LedgerAccess, master_key: bytes) -> Admission:
    """Accept a fencing read (also on a ledger this bookie never saw: its fence must still
    be recorded, or a late first add of the old writer could slip past recovery)."""
    _check_key(ledger_id, access, master_key)
    return Admission(record_master_key=access.master_key is None, record_fence=not access.fenced)


def admit_write_lac(ledger_id: LedgerId, access: LedgerAccess, master_key: bytes) -> Admission:
    """An explicit LAC comes from the writer: same key rules as an add, fence or not (it only
    advertises entries already acknowledged)."""
    _check_key(ledger_id, access, master_key)
    return _FIRST_KEY if access.master_key is None else _KNOWN_KEY


def _check_key(ledger_id: LedgerId, access: LedgerAccess, master_key: bytes) -> None:
    if len(master_key) != MASTER_KEY_SIZE:
        raise BadRequest(
            f"master key for ledger {ledger_id} is {len(master_key)} bytes, not {MASTER_KEY_SIZE}"
        )
    if access.master_key is not None and not hmac.compare_digest(access.master_key, master_key):
        raise Unauthorized(f"wrong master key (ledger password) for ledger {ledger_id}")
