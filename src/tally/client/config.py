"""A client's settings, with BookKeeper's meaning and defaults where it has the setting."""

from __future__ import annotations

from dataclasses import dataclass


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
    placement: str = "rack-aware"
    """`rack-aware` (BookKeeper's default: write sets spread over racks) or `default`
    (random distinct bookies, racks ignored)."""
    min_num_racks_per_write_quorum: int = 2
    """Racks every write set must span, capped by WQ and by the racks the cluster has."""
    enforce_min_num_racks_per_write_quorum: bool = True
    """Refuse an ensemble, or an ensemble change, that breaks the rule above, as BP-31's
    "enforce placement policy strictly during write" asks (BookKeeper: false); false
    chooses availability over placement and places as well as the racks allow."""
    session_timeout: float = 10.0
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
