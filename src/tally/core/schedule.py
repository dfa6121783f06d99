"""The round-robin distribution schedule: which ensemble positions store which entries.

Entry e goes to positions (e + k) mod E for k = 0..WQ-1, so position i holds exactly the
entries with (i - e) mod E < WQ.
"""

from __future__ import annotations

import math

from tally.core.availability import (
    MAX_ENTRY_ID,
    MAX_SEQUENCE,
    EntryAvailability,
    SequenceGroup,
)
from tally.core.errors import BadRequest


def check_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """Refuse sizes that break E >= WQ >= AQ >= 1."""
    if not ensemble_size >= write_quorum >= ack_quorum >= 1:
        raise BadRequest(
            f"need ensemble size >= write quorum >= ack quorum >= 1, got "
            f"E={ensemble_size} WQ={write_quorum} AQ={ack_quorum}"
        )


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """The ensemble positions that store `entry_id`, in the order writes and reads use."""
    if entry_id < 0:
        raise BadRequest(f"entry id {entry_id} is negative")
    check_quorums(ensemble_size, write_quorum, 1)
    return tuple((entry_id + k) % ensemble_size for k in range(write_quorum))


def stores_entry(position: int, entry_id: int, ensemble_size: int, write_quorum: int) -> bool:
    """Whether ensemble `position` is in the write set of `entry_id`."""
    return (position - entry_id) % ensemble_size < write_quorum


def expected_entries(
    first: int, last: int, ensemble_size: int, write_quorum: int, position: int
) -> EntryAvailability:
    """The entries of [first, last] that ensemble `position` must hold, in closed form.

    Position i holds one run of WQ entries every E entries, starting where
    e = i - WQ + 1 (mod E); so the answer is at most a cut first run, one periodic group
    and a cut last run, whatever the length of the segment. An auditor compares it with
    what the bookie reports (`EntryAvailability.difference`) in O(groups).
    """
    check_quorums(ensemble_size, write_quorum, 1)
    if not 0 <= position < ensemble_size:
        raise BadRequest(f"position {position} is outside the ensemble 0..{ensemble_size - 1}")
    if ensemble_size > MAX_SEQUENCE:
        raise BadRequest(f"ensemble size {ensemble_size} is beyond {MAX_SEQUENCE}")
    if first < 0 or last > MAX_ENTRY_ID:
        raise BadRequest(f"entries {first}..{last} are outside 0..{MAX_ENTRY_ID}")
    if last < first:
        return EntryAvailability.empty()
    stop = last + 1
    run_start = first - (first - position + write_quorum - 1) % ensemble_size
    groups = []
    if run_start < first:
        if run_start + write_quorum > first:
            groups.append(
                SequenceGroup(first, first, min(run_start + write_quorum, stop) - first, 0)
            )
        run_start += ensemble_size
    whole_runs = max(0, (stop - write_quorum - run_start) // ensemble_size + 1)
    if whole_runs:
        last_start = run_start + (whole_runs - 1) * ensemble_size
        period = ensemble_size if whole_runs > 1 else 0
        groups.append(SequenceGroup(run_start, last_start, write_quorum, period))
        run_start += whole_runs * ensemble_size
    if run_start < stop:
        groups.append(SequenceGroup(run_start, run_start, stop - run_start, 0))
    return EntryAvailability(groups)


def entries_to_verify(first: int, last: int, percentage: int) -> list[int]:
    """The entries of segment [first, last] the ledger check reads: the first and the last,
    plus `percentage` % of the segment spread evenly over it (BookKeeper's
    auditorLedgerVerificationPercentage)."""
    if last < first:
        return []
    count = last - first + 1
    chosen = {first, last}
    sample = math.ceil(count * percentage / 100)
    chosen.update(first + i * count // sample for i in range(sample))
    return sorted(chosen)
