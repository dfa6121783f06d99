"""The delete discipline (BP-31): what may be deleted, when, and what a tombstone promises.

A ledger's data goes only through explicit, recorded steps, never because its metadata
is absent or unreadable:

1. the delete path moves a CLOSED ledger to DELETED (`plan_delete` says whether it may);
2. `ledger_delete_retention` later (`tombstone_due`) its metadata is replaced by a
   `Tombstone` naming every bookie that may hold its data;
3. a bookie deletes a ledger's data only when it reads a tombstone for it, then
   acknowledges it (`Tombstone.acknowledged`);
4. `tombstone_retention` after the last acknowledgement, or after the tombstone was
   written when some named bookie never acknowledged, the tombstone goes
   (`Tombstone.removable`). Data a bookie then still holds has neither metadata nor
   tombstone: an orphan, reported and never deleted without an operator.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from tally.core.errors import BadSetting, DeleteRefused
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import Deletion, LedgerMetadata, LedgerState

HOUR = 3600
DAY = 24 * HOUR


@dataclasses.dataclass(frozen=True)
class ClusterSettings:
    """The settings every process of a cluster must agree on, kept in the metadata store."""

    ledger_delete_retention: int = DAY
    """Seconds a DELETED ledger can be undeleted before its metadata becomes a tombstone."""
    tombstone_retention: int = 7 * DAY
    """Seconds a tombstone stays after its bookies acknowledged it (or were given the time to)."""
    delete_requires_archival: bool = False
    """Refuse to delete a ledger whose archival bit is not set."""
    deletion_stuck_after: int = DAY
    """Seconds after which a tombstone with bookies still to acknowledge it is `deletion_stuck`."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "bool":
                if not isinstance(value, bool):
                    raise BadSetting(field.name, f"must be true or false, not {value!r}")
            elif not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise BadSetting(field.name, f"must be whole seconds >= 0, not {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def with_text_values(self, changes: Mapping[str, str]) -> ClusterSettings:
        """These settings with `changes` (values as an operator types them) applied."""
        types = {field.name: field.type for field in dataclasses.fields(self)}
        parsed: dict[str, Any] = {}
        for name, text in changes.items():
            if name not in types:
                raise BadSetting(name, f"no such cluster setting (known: {', '.join(types)})")
            parse = _parse_bool if types[name] == "bool" else parse_seconds
            parsed[name] = parse(name, text)
        return dataclasses.replace(self, **parsed)


def _parse_bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "on", "1"):
        return True
    if lowered in ("false", "no", "off", "0"):
        return False
    raise BadSetting(name, f"must be true or false, not {text!r}")


def parse_seconds(name: str, text: str) -> int:
    """A duration setting as an operator types it: whole seconds, at least 0."""
    try:
        seconds = int(text.strip())
    except ValueError:
        raise BadSetting(name, f"must be a whole number of seconds, not {text!r}") from None
    if seconds < 0:
        raise BadSetting(name, f"must be at least 0 seconds, not {seconds}")
    return seconds


class DeletePlan(enum.Enum):
    """What the delete path does with a ledger it may delete."""

    DELETE = "delete"
    RECOVER_FIRST = "recover then delete"
    ALREADY_DELETED = "already deleted"


def plan_delete(
    ledger_id: LedgerId, metadata: LedgerMetadata, settings: ClusterSettings, *, force: bool
) -> DeletePlan:
    """Whether and how the ledger may be deleted; DeleteRefused saying why when it may not."""
    if metadata.state is LedgerState.DELETED:
        return DeletePlan.ALREADY_DELETED
    if settings.delete_requires_archival and not metadata.archived:
        raise DeleteRefused(
            f"ledger {ledger_id} is not archived, and this cluster deletes only archived "
            f"ledgers (delete_requires_archival): archive it, then `tally shell setarchived "
            f"{ledger_id}`"
        )
    if metadata.state is LedgerState.CLOSED:
        return DeletePlan.DELETE
    if not force:
        raise DeleteRefused(
            f"ledger {ledger_id} is {metadata.state.name}: a writer (or a recovery) may still "
            "add to it; close it first, or delete with force to recover and close it"
        )
    return DeletePlan.RECOVER_FIRST


def tombstone_due(metadata: LedgerMetadata, now_ms: int, retention: int) -> bool:
    """Whether a DELETED ledger is past its retention, so its metadata becomes a tombstone."""
    deletion = metadata.deletion
    return deletion is not None and now_ms >= deletion.time_ms + retention * 1000


@dataclasses.dataclass(frozen=True)
class Tombstone:
    """What is left of a deleted ledger: when and why, and which bookies dropped its data."""

    deletion: Deletion
    tombstoned_ms: int
    last_entry_id: int
    length: int
    bookies: Mapping[str, int | None]
    """Every bookie that may hold the ledger's data, with the time it acknowledged deleting
    it (None until then). A bookie not named that held data adds itself on acknowledging."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "bookies", MappingProxyType(dict(sorted(self.bookies.items()))))

    @classmethod
    def of(cls, metadata: LedgerMetadata, now_ms: int) -> Tombstone:
        """The tombstone of a DELETED ledger, naming every bookie of every segment."""
        if metadata.deletion is None:
            raise DeleteRefused(
                f"only a DELETED ledger gets a tombstone, not {metadata.state.name}"
            )
        return cls(
            deletion=metadata.deletion,
            tombstoned_ms=now_ms,
            last_entry_id=metadata.last_entry_id,
            length=metadata.length,
            bookies=dict.fromkeys(metadata.bookies()),
        )

    @property
    def pending(self) -> frozenset[str]:
        """The bookies that have not acknowledged yet."""
        return frozenset(bookie for bookie, acked in self.bookies.items() if acked is None)

    def acknowledged(self, bookie_id: str, now_ms: int) -> Tombstone:
        """The tombstone with `bookie_id`'s acknowledgement (the first one stays)."""
        if self.bookies.get(bookie_id) is not None:
            return self
        return dataclasses.replace(self, bookies={**self.bookies, bookie_id: now_ms})

    def removable(self, now_ms: int, retention: int) -> bool:
        """Whether the tombstone may go: `retention` seconds after the last acknowledgement,
        or after it was written if a named bookie never acknowledged (a bookie gone for
        longer than that finds orphans, which are reported, never deleted by themselves)."""
        acks = [acked for acked in self.bookies.values() if acked is not None]
        since = max(acks) if acks and not self.pending else self.tombstoned_ms
        return now_ms >= since + retention * 1000

    def overdue(self, now_ms: int, threshold: int) -> bool:
        """Whether `threshold` seconds have passed since the tombstone was written: by then
        every bookie's garbage collection should have dropped the ledger."""
        return now_ms >= self.tombstoned_ms + threshold * 1000

    def stuck(self, now_ms: int, threshold: int) -> bool:
        """Whether bookies still hold data `threshold` seconds after the tombstone was written."""
        return bool(self.pending) and self.overdue(now_ms, threshold)

    def to_dict(self) -> dict[str, Any]:
        return {
            "deletion": self.deletion.to_dict(),
            "tombstoned_ms": self.tombstoned_ms,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "bookies": dict(self.bookies),
        }
