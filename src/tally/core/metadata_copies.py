"""The copies of a ledger's metadata that bookies keep, so that a lost metadata store can be
rebuilt from them (issue 18).

A writer gives each bookie of a segment a copy of the ledger's metadata as of that segment:
at the ledger's creation, at each ensemble change (to the bookies of the new ensemble), and
at its close (to the last segment's bookies); the replication worker gives one to a bookie
it puts into an ensemble or copies entries back onto; a delete and an undelete give one to
every bookie of the ledger. Copies can arrive out of order (a recovering client and the old
writer, a worker and the writer, a slow close and a delete), so a bookie keeps the most
advanced one it was offered: the one with more segments, then the further along in its
life (OPEN, IN_RECOVERY, then CLOSED and DELETED alike), then the one with the later last
entry, then the one with the later delete or undelete (a DELETED copy is timed by its
deletion, a CLOSED one by its last undelete, 0 if never; `LedgerMetadata.undeleted` times
an undelete after the deletion it undoes). No I/O here: the bookie decodes what it is
offered and asks `supersedes`.
"""

from __future__ import annotations

from tally.core.ledger_metadata import LedgerMetadata, LedgerState


def progress(metadata: LedgerMetadata) -> tuple[int, int, int, int, bool]:
    """How far along a copy is, to compare with another copy of the same ledger."""
    deletion = metadata.deletion
    return (
        len(metadata.segments),
        min(metadata.state, LedgerState.CLOSED),
        metadata.last_entry_id,
        metadata.undeleted_ms if deletion is None else deletion.time_ms,
        deletion is not None,  # deleted at 0 ms, in tests, is still after a close
    )


def supersedes(offered: LedgerMetadata, held: LedgerMetadata | None) -> bool:
    """Whether the bookie keeps `offered` in place of the copy it `held` (None: none)."""
    return held is None or progress(offered) > progress(held)
