"""The copies of a ledger's metadata that bookies keep, so that a lost metadata store can be
rebuilt from them (issue 18).

A writer gives each bookie of a segment a copy of the ledger's metadata as of that segment:
at the ledger's creation, at each ensemble change (to the bookies of the new ensemble), and
at its close (to the last segment's bookies); the replication worker gives one to a bookie
it puts into an ensemble or copies entries back onto. Copies can arrive out of order (a
recovering client and the old writer, a worker and the writer), so a bookie keeps the most
advanced one it was offered: the one with more segments, then the further along in its
life (OPEN, IN_RECOVERY, CLOSED, DELETED), then the one with the later last entry. No I/O
here: the bookie decodes what it is offered and asks `supersedes`.
"""

from __future__ import annotations

from tally.core.ledger_metadata import LedgerMetadata


def progress(metadata: LedgerMetadata) -> tuple[int, int, int]:
    """How far along a copy is, to compare with another copy of the same ledger."""
    return len(metadata.segments), int(metadata.state), metadata.last_entry_id


def supersedes(offered: LedgerMetadata, held: LedgerMetadata | None) -> bool:
    """Whether the bookie keeps `offered` in place of the copy it `held` (None: none)."""
    return held is None or progress(offered) > progress(held)
