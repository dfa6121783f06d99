"""A client's settings, with BookKeeper's meaning and defaults where it has the setting.

Loaded by `tally.config.load` (section `[client]`, variables `TALLY_CLIENT_<SETTING>`) for
`tally shell`, the auto-recovery process's replication worker and placement check,
`tally audit confirm` and the demo; durations are in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from tally.config import check
from tally.core.placement import (
    DEFAULT_MIN_NUM_RACKS_PER_WRITE_QUORUM,
    PLACEMENT_POLICIES,
    RACK_AWARE,
)
from tally.metadata.store import DEFAULT_SESSION_TIMEOUT


@dataclass(frozen=True)
class ClientConfig:
    add_entry_timeout: float = 10.0
    """Seconds a bookie has to acknowledge an add before it counts as failed (addEntryTimeout)."""
    read_timeout: float = 10.0
    """Seconds a bookie has to answer a read before the next replica is tried (readTimeout)."""
    speculative_read_timeout: float = 2.0
    """Seconds before a read is also sent to the next replica (speculativeReadTimeout)."""
    explicit_lac_interval: float = 1.0
    """Seconds of idleness after which the writer sends its LAC explicitly; 0: never."""
    max_outstanding_reads: int = 64
    """Entries read in parallel by a sequential read or by recovery."""
    placement: str = RACK_AWARE
    """`rack-aware` (BookKeeper's default: write sets spread over racks) or `default`
    (random distinct bookies, racks ignored)."""
    min_num_racks_per_write_quorum: int = DEFAULT_MIN_NUM_RACKS_PER_WRITE_QUORUM
    """Racks every write set must span, capped by WQ and by the racks the cluster has."""
    enforce_min_num_racks_per_write_quorum: bool = True
    """Refuse an ensemble, or an ensemble change, that breaks the rule above, as BP-31's
    "enforce placement policy strictly during write" asks (BookKeeper: false); false
    chooses availability over placement and places as well as the racks allow."""
    session_timeout: float = DEFAULT_SESSION_TIMEOUT
    """Metadata store session timeout, seconds."""
    bookie_quarantine_time: float = 1800.0
    """Seconds a bookie that failed a request is kept out of new ensembles and
    replacements, unless too few others are left (bookieQuarantineTime)."""
    ensemble_change_retries: int = 10
    """Metadata CAS attempts for one ensemble change before the writer gives up."""
    close_copies_timeout: float = 10.0
    """Seconds a closing writer (or a closing client, for the writers left open) waits for
    the copies still in flight beyond the ack quorum; the ledger is marked under-replicated
    for those that fail or stay silent. The default is `add_entry_timeout`'s, by which a
    copy sent has answered or timed out anyway."""

    def __post_init__(self) -> None:
        for name in (
            "add_entry_timeout",
            "read_timeout",
            "speculative_read_timeout",
            "session_timeout",
            "close_copies_timeout",
        ):
            check(getattr(self, name) > 0, name, "must be more than 0 seconds")
        for name in ("explicit_lac_interval", "bookie_quarantine_time"):
            check(getattr(self, name) >= 0, name, "must not be negative (0: off)")
        for name in (
            "max_outstanding_reads",
            "min_num_racks_per_write_quorum",
            "ensemble_change_retries",
        ):
            check(getattr(self, name) >= 1, name, "must be at least 1")
        check(
            self.placement in PLACEMENT_POLICIES,
            "placement",
            f"must be one of {', '.join(PLACEMENT_POLICIES)}",
        )
