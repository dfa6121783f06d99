"""The round-robin distribution schedule: which ensemble positions store which entries.

Entry e goes to positions (e + k) mod E for k = 0..WQ-1, so position i holds exactly the
entries with (i - e) mod E < WQ.
"""

from __future__ import annotations

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
