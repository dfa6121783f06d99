"""What a metadata recovery writes back for each ledger, from what its bookies hold (issue 18).

The metadata store is gone; the bookies still hold every entry, and for each ledger the
copy of its metadata that its writer gave them (core/metadata_copies.py), its fenced flag,
LAC and master key, and the ledgers they deleted under a tombstone. Per ledger:

- a ledger any bookie deleted under its tombstone stays deleted, whatever another bookie
  (away when it was deleted) still holds of it;
- a ledger with copies comes back from the most advanced copy (`metadata_copies.progress`);
  among copies equally advanced (a replication worker's, naming the bookie it put into an
  old segment, beside the older ones), the one that fits what the bookies hold best. It
  is *exact*. A CLOSED copy comes back CLOSED at its last entry; any other comes back
  OPEN, for the normal ledger recovery (fencing and quorum coverage) to find its end:
  never closed from a guess;
- a ledger without a copy (written before bookies kept them) is *inferred* from which
  bookie holds which entries (core/metadata_inference.py): OPEN, for recovery to close,
  with an ack quorum of 1, which makes recovery the most careful (an entry is only given
  up when every bookie of its write set says it never had it), and the digest type its
  stored entries tell (`entry_format.stored_digest_type`: a V2 entry names it, a V1
  entry's CRC is checked), else CRC32C, assumed (V1 entries of HMAC or DUMMY, none read, or
  bookies whose entries disagree);
- otherwise it is *not recoverable*, and the report says why.

From an older snapshot of the store (`--from-snapshot`), a ledger's metadata there is one
more copy: the bookies' copies supersede it where they are further along (later segments,
a close, a delete), it wins ties (it holds what changed without a copy: the archival bit,
custom metadata), and it stands in for the copies of data written before bookies kept
them. A snapshot copy that does not place what the bookies hold (a segment added or a
bookie replaced after it, with no copy) gives its fields to an inference of the rest. A
ledger no bookie holds comes back from the snapshot unless its bookies all answered and it
should hold entries (deleted since, its tombstones forgotten, or its data lost).

Every decision says what it could not restore (ctime, custom metadata, a digest type the
entries do not tell) and which entries no bookie holds any more. No I/O: the Spark job feeds
it each ledger's rows.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from tally.core.availability import EntryAvailability
from tally.core.digest import DigestType
from tally.core.errors import BadRequest, CookieMismatch, MalformedData
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata, LedgerState, Segment
from tally.core.metadata_copies import progress
from tally.core.metadata_inference import (
    InferredLedger,
    NotInferable,
    infer_ledger,
    missing,
    unexplained,
)

INFERRED_ACK_QUORUM = 1
"""The ack quorum of an inferred ledger: recovery then truncates nothing a bookie may hold."""
SOFT_DELETED = "soft-deleted when the store was lost: comes back DELETED"
"""The reason a ledger restored from a DELETED copy starts with (the report lists them)."""
FROM_SNAPSHOT = "from the snapshot"
"""The note of a ledger whose metadata comes from the snapshot, no bookie's copy."""
INFERRED_DIGEST = DigestType.CRC32C
"""The digest type an inferred ledger is given when its entries do not tell one: the
client's default; the report says it was assumed."""


_NOTHING = EntryAvailability.empty()


class Verdict(enum.Enum):
    EXACT = "exact"
    """From a copy of the ledger's metadata."""
    INFERRED = "inferred"
    """From which bookie holds which entries."""
    DELETED = "deleted"
    """A bookie (or the snapshot) holds its tombstone, or nothing is left of a DELETED one:
    not brought back."""
    NOT_RECOVERABLE = "not_recoverable"


@dataclass(frozen=True, slots=True)
class Holding:
    """What one bookie holds of one ledger."""

    bookie_id: str
    availability: EntryAvailability
    fenced: bool
    last_add_confirmed: int
    master_key: bytes | None
    metadata_copy: bytes | None
    digest_type: DigestType | None = None
    """The digest type its stored entries tell (read only where it holds no copy)."""


@dataclass(frozen=True, slots=True)
class LedgerRecovery:
    """What the recovery does with one ledger."""

    ledger_id: LedgerId
    verdict: Verdict
    reason: str
    """Why (not recoverable, deleted), or what was not restored."""
    metadata: LedgerMetadata | None = None
    """What to write back: CLOSED as the copy says, else OPEN (then recovered)."""
    lost_entries: EntryAvailability = _NOTHING
    """Entries up to the ledger's end (or the last one any bookie holds) held by none of the
    bookies the metadata places them on: data the cluster no longer has."""

    @property
    def needs_recovery(self) -> bool:
        """Written back OPEN: the ledger recovery finds and closes its end."""
        return self.metadata is not None and self.metadata.state is LedgerState.OPEN


def recover_ledger(
    ledger_id: LedgerId,
    holdings: Sequence[Holding],
    deleted_by: Sequence[str],
    answered: Collection[str],
    recorded: bytes | None = None,
) -> LedgerRecovery:
    """The decision for one ledger: its bookies' `holdings`, and who deleted it under its
    tombstone (`deleted_by`: bookies, or the snapshot). `answered`: the bookies known to hold
    of it exactly what `holdings` say (their exports were read); what another bookie holds
    is unknown, so the entries placed on it are never counted lost (seed 003). `recorded`:
    its metadata in an older snapshot of the store, if one is given and holds it."""
    if deleted_by:
        return LedgerRecovery(
            ledger_id,
            Verdict.DELETED,
            f"deleted under its tombstone (remembered by {', '.join(sorted(deleted_by))})",
        )
    snapshot = _decoded(recorded)
    if not holdings:
        if snapshot is None:
            return LedgerRecovery(ledger_id, Verdict.NOT_RECOVERABLE, "no bookie holds it")
        return _held_nowhere(ledger_id, snapshot, answered)
    copies = _copies(holdings)
    if copies or snapshot is not None:
        return _from_copies(ledger_id, copies, snapshot, holdings, answered)
    return _inferred(ledger_id, holdings, answered)


def _decoded(copy: bytes | None) -> LedgerMetadata | None:
    """A copy's metadata; None for none, or one that does not decode (the other copies, or
    an inference, stand in for it)."""
    if copy is None:
        return None
    try:
        return LedgerMetadata.from_bytes(copy)
    except (BadRequest, MalformedData):
        return None


def _copies(holdings: Sequence[Holding]) -> list[LedgerMetadata]:
    """The copies the bookies hold that decode."""
    found = (_decoded(copy) for copy in {holding.metadata_copy for holding in holdings})
    return [copy for copy in found if copy is not None]  # most are alike: decoded once


def _from_copies(
    ledger_id: LedgerId,
    copies: list[LedgerMetadata],
    snapshot: LedgerMetadata | None,
    holdings: Sequence[Holding],
    answered: Collection[str],
) -> LedgerRecovery:
    held = {holding.bookie_id: holding.availability for holding in holdings}
    candidates = copies if snapshot is None else [*copies, snapshot]
    furthest = max(progress(copy) for copy in candidates)
    tied = [copy for copy in candidates if progress(copy) == furthest]
    chosen = (
        tied[0]
        if len(tied) == 1
        else min(
            tied,
            key=lambda copy: (
                *_misplaced(copy, held, answered),
                copy is not snapshot,  # it holds what changed without a copy
                copy.to_bytes(),
            ),
        )
    )
    from_snapshot = chosen is snapshot and chosen not in copies
    if from_snapshot and _stray(chosen, held):
        return _inferred(ledger_id, holdings, answered, base=chosen)
    restored = chosen if chosen.has_end else dataclasses.replace(chosen, state=LedgerState.OPEN)
    notes = [SOFT_DELETED] if chosen.state is LedgerState.DELETED else []
    if from_snapshot:
        notes.append(FROM_SNAPSHOT)
    lost = _lost(restored, held, _end(chosen, held), answered)
    return LedgerRecovery(ledger_id, Verdict.EXACT, "; ".join(notes), restored, lost)


def _held_nowhere(
    ledger_id: LedgerId, snapshot: LedgerMetadata, answered: Collection[str]
) -> LedgerRecovery:
    """A ledger of the snapshot that no bookie holds, nor remembers deleting."""
    restored = (
        snapshot if snapshot.has_end else dataclasses.replace(snapshot, state=LedgerState.OPEN)
    )
    lost = _lost(restored, {}, _end(snapshot, {}), answered)
    every_bookie_answered = snapshot.bookies() <= set(answered)
    if every_bookie_answered and snapshot.state is LedgerState.DELETED:
        return LedgerRecovery(
            ledger_id,
            Verdict.DELETED,
            "DELETED in the snapshot, and none of its bookies holds any of it any more",
        )
    if every_bookie_answered and lost:
        return LedgerRecovery(
            ledger_id,
            Verdict.NOT_RECOVERABLE,
            "in the snapshot, but none of its bookies holds any of its entries: deleted "
            "since and its tombstones forgotten (a snapshot older than tombstone_retention), "
            "or its data lost",
        )
    notes = [SOFT_DELETED] if snapshot.state is LedgerState.DELETED else []
    notes.append(f"{FROM_SNAPSHOT}; no bookie holds any of it")
    return LedgerRecovery(ledger_id, Verdict.EXACT, "; ".join(notes), restored, lost)


def _inferred(
    ledger_id: LedgerId,
    holdings: Sequence[Holding],
    answered: Collection[str],
    base: LedgerMetadata | None = None,
) -> LedgerRecovery:
    """Inferred from what the bookies hold; `base` (a snapshot's copy that does not place
    it) gives the fields the data cannot tell."""
    keys = {holding.master_key for holding in holdings if holding.master_key is not None}
    if base is not None:
        keys = {base.master_key}
    if len(keys) != 1:
        problem = "its bookies disagree on its master key" if keys else "no master key is held"
        return LedgerRecovery(
            ledger_id, Verdict.NOT_RECOVERABLE, f"no metadata copy, and {problem}"
        )
    held = {holding.bookie_id: holding.availability for holding in holdings}
    inferred = infer_ledger(held)
    if isinstance(inferred, NotInferable):
        return LedgerRecovery(
            ledger_id, Verdict.NOT_RECOVERABLE, f"no metadata copy, and {inferred.reason}"
        )
    metadata = _metadata_of(inferred, keys.pop(), INFERRED_DIGEST)
    notes = [f"ack quorum set to {INFERRED_ACK_QUORUM}"]
    if base is None:
        digest_type, digest_note = _inferred_digest(holdings)
        metadata = dataclasses.replace(metadata, digest_type=digest_type)
        notes += [digest_note, "ctime and custom metadata unknown"]
    else:
        metadata = dataclasses.replace(
            metadata,
            digest_type=base.digest_type,
            ctime_ms=base.ctime_ms,
            creator_token=base.creator_token,
            custom_metadata=base.custom_metadata,
        )
        notes.append(
            "the snapshot's metadata does not place what its bookies hold (a segment added "
            "or a bookie replaced since): the ensembles inferred, the rest from the snapshot"
        )
    notes += inferred.ambiguous
    return LedgerRecovery(
        ledger_id,
        Verdict.INFERRED,
        "; ".join(notes),
        metadata,
        _lost(metadata, held, inferred.last_entry_seen, answered),
    )


def _inferred_digest(holdings: Sequence[Holding]) -> tuple[DigestType, str]:
    """The digest type the bookies' entries tell, if they agree, and the note that says where
    it came from; else the assumed one, and why."""
    told = {holding.digest_type for holding in holdings if holding.digest_type is not None}
    if len(told) == 1:
        (digest_type,) = told
        return digest_type, f"digest type {digest_type.name} from its entries"
    why = (
        f"its bookies' entries disagree: {', '.join(sorted(t.name for t in told))}"
        if told
        else "its entries do not say: HMAC, DUMMY or none read"
    )
    return INFERRED_DIGEST, f"digest type assumed {INFERRED_DIGEST.name} ({why})"


def _metadata_of(
    inferred: InferredLedger, master_key: bytes, digest_type: DigestType
) -> LedgerMetadata:
    segments = tuple(
        Segment(
            segment.first_entry_id,
            tuple(
                bookie if bookie is not None else unknown_bookie(position)
                for position, bookie in enumerate(segment.ensemble)
            ),
        )
        for segment in inferred.segments
    )
    return LedgerMetadata(
        state=LedgerState.OPEN,
        ensemble_size=inferred.ensemble_size,
        write_quorum=inferred.write_quorum,
        ack_quorum=INFERRED_ACK_QUORUM,
        segments=segments,
        digest_type=digest_type,
        master_key=master_key,
        ctime_ms=0,
        creator_token=b"",
    )


def unknown_bookie(position: int) -> str:
    """The id an inferred ensemble names where no bookie holds that position's entries (it
    is gone): one that never registers, so the auditor sees it lost and repairs its share."""
    return f"unknown-{position}.invalid:0"


def _last_held(held: Mapping[str, EntryAvailability]) -> int:
    return max((max(entries) for entries in held.values() if entries), default=-1)


def _end(metadata: LedgerMetadata, held: Mapping[str, EntryAvailability]) -> int:
    """The last entry to account for: the ledger's, else the last one any bookie holds."""
    return metadata.last_entry_id if metadata.has_end else _last_held(held)


def _stray(metadata: LedgerMetadata, held: Mapping[str, EntryAvailability]) -> bool:
    """Whether bookies hold entries up to the ledger's end (or the last one held) that the
    metadata does not place on them; entries past a closed ledger's end are no sign."""
    end = _end(metadata, held)
    found = unexplained(
        _placement(metadata), metadata.ensemble_size, metadata.write_quorum, end, held
    )
    return any(entries.intersection(EntryAvailability.span(0, end)) for entries in found.values())


def _misplaced(
    metadata: LedgerMetadata, held: Mapping[str, EntryAvailability], answered: Collection[str]
) -> tuple[int, int]:
    """How badly a copy fits the data: entries it places where no bookie holds them, then
    entries bookies hold where it does not place them."""
    end = _end(metadata, held)
    stray = unexplained(
        _placement(metadata), metadata.ensemble_size, metadata.write_quorum, end, held
    )
    return len(_lost(metadata, held, end, answered)), sum(map(len, stray.values()))


def _lost(
    metadata: LedgerMetadata,
    held: Mapping[str, EntryAvailability],
    end: int,
    answered: Collection[str],
) -> EntryAvailability:
    """The entries 0..`end` that no bookie the metadata places them on holds, among the
    bookies that answered: one that did not may hold any of them."""
    if end < 0:
        return _NOTHING
    unknown = {bookie: EntryAvailability.span(0, end) for bookie in metadata.bookies()}
    known = {bookie: held.get(bookie, _NOTHING) for bookie in answered}
    return missing(
        _placement(metadata),
        metadata.ensemble_size,
        metadata.write_quorum,
        end,
        {**unknown, **known},
    )


def _placement(metadata: LedgerMetadata) -> list[tuple[int, tuple[str, ...]]]:
    return [(segment.first_entry_id, segment.ensemble) for segment in metadata.segments]


def cluster_instance(instances: Mapping[str, str]) -> str:
    """The cluster's instance id, from each bookie's cookie (bookie id -> instance id); they
    must agree, else CookieMismatch names the bookies that do not."""
    if not instances:
        raise BadRequest("no bookie's cookie to take the cluster's instance id from")
    counts: dict[str, list[str]] = {}
    for bookie_id, instance in sorted(instances.items()):
        counts.setdefault(instance, []).append(bookie_id)
    if len(counts) == 1:
        return next(iter(counts))
    most = max(counts.values(), key=len)
    others = [
        f"{', '.join(bookies)} of cluster {instance}"
        for instance, bookies in counts.items()
        if bookies is not most
    ]
    raise CookieMismatch(
        f"the bookies' cookies name {len(counts)} clusters: {'; '.join(others)}, against "
        f"{len(most)} bookie(s) of another; recover one cluster at a time (leave out the "
        "bookies, or exports, of the other)"
    )
