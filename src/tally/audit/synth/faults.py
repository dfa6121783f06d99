"""Fault ledgers, one at a time: each fault kind takes copies away, leaves extra ones, moves
a write set, marks the ledger or deletes it, and each ledger is checked with `audit_ledger`
(a tombstoned one with `deletion_stuck`) to fall in exactly its category before it is
written, so truth.json cannot claim what the checks would not find.

Faults are built with the core's own types (`LedgerMetadata`, `EntryAvailability`,
`Tombstone`). An invalid_metadata ledger is a healthy one whose first segment's row is then
written starting at entry 1. A deleted_ledger is a healthy one moved to DELETED, its data
kept; a deletion_stuck or tombstone_pending one is a healthy one replaced by its tombstone,
with some of its bookies still holding their copies. Fault ledgers never touch an
unresponsive bookie.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from tally.audit.synth.cluster import Cluster, Mix
from tally.audit.synth.truth import (
    DELETED_LEDGER,
    GRACE_PERIOD_MS,
    MAX_AGE_MS,
    MIN_RACKS,
    NOW_MS,
    SETTINGS,
    TOMBSTONE_PENDING,
    UNREPORTED,
    WITHIN_GRACE,
)
from tally.core.availability import EntryAvailability
from tally.core.deletion import Tombstone
from tally.core.digest import MASTER_KEY_SIZE, DigestType
from tally.core.errors import BadRequest
from tally.core.ledger_audit import Category, audit_ledger, deletion_stuck
from tally.core.ledger_metadata import Deletion, LedgerMetadata, LedgerState, Segment
from tally.core.schedule import expected_entries

LEDGER_FAULTS = (
    Category.NO_REPLICA.value,
    Category.BELOW_ACK_QUORUM.value,
    Category.BELOW_WRITE_QUORUM.value,
    Category.UNDERREPLICATED_TOO_LONG.value,
    WITHIN_GRACE,
    Category.PLACEMENT_FAIL.value,
    Category.PLACEMENT_SOFT.value,
    Category.OVER_REPLICATED.value,
    Category.INVALID_METADATA.value,
    Category.DELETION_STUCK.value,
    DELETED_LEDGER,
    TOMBSTONE_PENDING,
)
DELETIONS = (Category.DELETION_STUCK.value, DELETED_LEDGER, TOMBSTONE_PENDING)
"""The fault kinds of deleted ledgers: built healthy, then deleted (`Injector._delete`)."""
FAULT_KINDS = (
    *LEDGER_FAULTS,
    Category.ORPHAN_DATA.value,
    Category.UNRESPONSIVE_REGISTERED_BOOKIE.value,
)
DEFAULT_FAULTS = (
    "no_replica=3,below_ack_quorum=3,below_write_quorum=3,underreplicated_too_long=2,"
    f"{WITHIN_GRACE}=2,placement_fail=2,placement_soft=2,unresponsive_registered_bookie=1,"
    "orphan_data=2,over_replicated=2,invalid_metadata=1,deletion_stuck=2,"
    f"{DELETED_LEDGER}=2,{TOMBSTONE_PENDING}=2"
)
FAULT_ATTEMPTS = 50


def parse_faults(spec: str) -> dict[str, int]:
    """`kind=count,...` (FAULT_KINDS), "default" for DEFAULT_FAULTS, "" for none."""
    spec = spec.strip()
    if spec == "default":
        spec = DEFAULT_FAULTS
    faults: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        kind, equals, count = item.partition("=")
        kind = kind.strip()
        if kind == Category.POTENTIALLY_FAULTY.value:
            raise BadRequest(
                "potentially_faulty is not injected: it follows from unresponsive_registered_bookie"
            )
        if kind not in FAULT_KINDS:
            raise BadRequest(f"unknown fault {kind!r} in {spec!r}; known: {', '.join(FAULT_KINDS)}")
        if not equals or not count.strip().isdecimal():
            raise BadRequest(f"fault {item!r} needs a count: {kind}=N")
        if kind in faults:
            raise BadRequest(f"fault {kind} is given twice in {spec!r}")
        faults[kind] = int(count)
    return faults


@dataclass(frozen=True)
class FaultLedger:
    """A ledger with what each bookie holds of it (bookies holding nothing are absent)."""

    scope: int
    ledger_id: int
    metadata: LedgerMetadata
    held: dict[str, EntryAvailability]
    underreplicated_since_ms: int | None = None
    invalid: bool = False
    """Its rows are written broken (the first segment starting at entry 1): no valid ledger."""
    tombstone: Tombstone | None = None
    """Its metadata is gone, replaced by this tombstone: only the tombstone row is written."""


class Injector:
    """Builds fault ledgers of a cluster; each is checked to fall in exactly its category."""

    def __init__(self, cluster: Cluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.racks = {
            name: cluster.rack_names[cluster.rack_of(b)] for b, name in enumerate(cluster.names)
        }

    def eligible(self, kind: str) -> list[Mix]:
        """The mixes that can hold a `kind` fault; BadRequest, saying why, if none can."""
        mixes = [mix for mix in self.cluster.mixes if _suits(kind, mix, self.cluster.racks)]
        if not mixes:
            placed = ", ".join(
                f"{m.ensemble_size}/{m.write_quorum}/{m.ack_quorum}" for m in self.cluster.mixes
            )
            raise BadRequest(
                f"no ensemble mix that places strictly on {self.cluster.bookies} bookies and "
                f"{self.cluster.racks} racks ({placed}) can hold a {kind} fault"
                + (
                    f" (a write set spans at least min(WQ, {MIN_RACKS}) racks or fails: "
                    "placement_soft needs 3 racks or more)"
                    if kind == Category.PLACEMENT_SOFT.value
                    else ""
                )
            )
        return mixes

    def build(self, kind: str, index: int) -> FaultLedger:
        eligible = self.eligible(kind)
        expected = set() if kind in (*UNREPORTED, Category.INVALID_METADATA.value) else {kind}
        for _ in range(FAULT_ATTEMPTS):
            ledger = self._attempt(kind, index, self.rng.choice(eligible))
            if ledger is not None and kind in DELETIONS:
                ledger = self._delete(kind, ledger)
            if ledger is not None and self.categories(ledger) == expected:
                if kind == Category.INVALID_METADATA.value:
                    return dataclasses.replace(ledger, invalid=True)
                return ledger
        raise BadRequest(
            f"could not inject a {kind} fault on {self.cluster.bookies} bookies, "
            f"{self.cluster.racks} racks in {FAULT_ATTEMPTS} attempts"
        )

    def categories(self, ledger: FaultLedger) -> set[str]:
        if ledger.tombstone is not None:
            found = deletion_stuck(
                ledger.tombstone,
                ledger.held,
                now_ms=NOW_MS,
                stuck_after=SETTINGS.deletion_stuck_after,
            )
            return {violation.category.value for violation in found}
        if ledger.metadata.state is LedgerState.DELETED:
            return set()  # its data is kept on purpose, and it is not judged
        available = {
            b: ledger.held.get(b, EntryAvailability.empty()) for b in ledger.metadata.bookies()
        }
        return {
            violation.category.value
            for violation in audit_ledger(
                ledger.metadata,
                available | ledger.held,
                racks=self.racks,
                min_racks=MIN_RACKS,
                underreplicated_since_ms=ledger.underreplicated_since_ms,
                now_ms=NOW_MS,
                grace_period_ms=GRACE_PERIOD_MS,
                cluster_racks=self.cluster.racks,
            )
        }

    def _attempt(self, kind: str, index: int, mix: Mix) -> FaultLedger | None:
        rng = self.rng
        e, wq = mix.ensemble_size, mix.write_quorum
        ensembles = self._ensembles(mix, rng.randint(2, 3))
        if ensembles is None:
            return None
        if kind in (Category.PLACEMENT_FAIL.value, Category.PLACEMENT_SOFT.value):
            segment = rng.randrange(len(ensembles))
            misplaced = self._misplace(
                ensembles[segment], wq, kind == Category.PLACEMENT_FAIL.value
            )
            if misplaced is None:
                return None
            ensembles[segment] = misplaced
        segments = len(ensembles)
        entries = rng.randint(4 * e * segments, 3000)
        cuts = sorted(rng.randint(0, entries - segments * e) for _ in range(segments - 1))
        firsts = [n * e + cut for n, cut in enumerate([0, *cuts])]
        metadata = LedgerMetadata(
            state=LedgerState.CLOSED,
            ensemble_size=e,
            write_quorum=wq,
            ack_quorum=mix.ack_quorum,
            segments=tuple(
                Segment(f, tuple(self.cluster.names[b] for b in ensemble))
                for f, ensemble in zip(firsts, ensembles, strict=True)
            ),
            digest_type=DigestType.CRC32C,
            master_key=bytes(MASTER_KEY_SIZE),
            ctime_ms=NOW_MS - rng.randrange(60_000, MAX_AGE_MS),
            creator_token=b"",
            last_entry_id=entries - 1,
            length=entries * rng.randrange(64, 4096),
        )
        held = _held(metadata)
        since = self._damage(kind, metadata, held)
        scoped = rng.random() < 0.3
        scope = rng.getrandbits(64) | 1 << 63 if scoped else 0
        ledger_id = rng.getrandbits(64) if scoped else 2 * index
        return FaultLedger(scope, ledger_id, metadata, {b: h for b, h in held.items() if h}, since)

    def _delete(self, kind: str, ledger: FaultLedger) -> FaultLedger:
        """The healthy `ledger` deleted: DELETED with its data (deleted_ledger), or replaced
        by its tombstone with one or two of its bookies still holding their copies and the
        others acknowledged: written longer than deletion_stuck_after ago (deletion_stuck),
        or more recently (tombstone_pending; or, half the time, long ago with every bookie
        acknowledged and nothing held)."""
        rng = self.rng
        stuck_ms = SETTINGS.deletion_stuck_after * 1000
        stuck = kind == Category.DELETION_STUCK.value
        gone = kind == TOMBSTONE_PENDING and rng.random() < 0.5
        age = (
            stuck_ms + rng.randrange(60_000, 3 * 86_400_000)
            if stuck or gone
            else rng.randrange(1_000, stuck_ms - 60_000)
        )
        tombstoned_ms = NOW_MS - age
        deletion = Deletion(
            tombstoned_ms - SETTINGS.ledger_delete_retention * 1000,
            "trimmed by the synthetic broker",
            0,
            "every entry on WQ bookies",
        )
        metadata = ledger.metadata.deleted(deletion)
        if kind == DELETED_LEDGER:
            return dataclasses.replace(ledger, metadata=metadata)
        tombstone = Tombstone.of(metadata, tombstoned_ms)
        holders = [] if gone else rng.sample(sorted(ledger.held), rng.randint(1, 2))
        for bookie in tombstone.bookies:
            if bookie not in holders:
                tombstone = tombstone.acknowledged(
                    bookie, tombstoned_ms + rng.randrange(1, 600_000)
                )
        return dataclasses.replace(
            ledger,
            metadata=metadata,
            held={bookie: ledger.held[bookie] for bookie in holders},
            tombstone=tombstone,
        )

    def _ensembles(self, mix: Mix, segments: int) -> list[list[int]] | None:
        """A strict first ensemble of responsive bookies; each change replaces one position
        with a new bookie of the same rack. None if the racks are too thin."""
        rng = self.rng
        pattern = rng.choice(mix.patterns)
        colour_rack = rng.sample(range(self.cluster.racks), max(pattern) + 1)
        pools = {c: self.cluster.responsive_on(colour_rack[c]) for c in set(pattern)}
        for pool in pools.values():
            rng.shuffle(pool)
        if any(len(pools[c]) < pattern.count(c) for c in pools):
            return None
        ensembles = [[pools[c].pop() for c in pattern]]
        for _ in range(segments - 1):
            ensemble = list(ensembles[-1])
            position = rng.randrange(len(ensemble))
            pool = pools[pattern[position]]
            if pool:
                ensemble[position] = pool.pop()
            ensembles.append(ensemble)
        return ensembles

    def _misplace(self, ensemble: list[int], write_quorum: int, fail: bool) -> list[int] | None:
        """The ensemble with one write set moved onto one rack (fail) or with one position
        moved to the rack of a neighbour in its write sets (soft)."""
        rng, cluster = self.rng, self.cluster
        size = len(ensemble)
        start = rng.randrange(size)
        window = [(start + k) % size for k in range(write_quorum)]
        if fail:
            rack = rng.randrange(cluster.racks)
            others = {ensemble[p] for p in range(size) if p not in window}
            pool = [b for b in cluster.responsive_on(rack) if b not in others]
            if len(pool) < write_quorum:
                return None
            changed = list(ensemble)
            for position, bookie in zip(window, rng.sample(pool, write_quorum), strict=True):
                changed[position] = bookie
            return changed
        position = window[-1]
        rack = cluster.rack_of(ensemble[window[0]])
        pool = [b for b in cluster.responsive_on(rack) if b not in ensemble]
        if not pool:
            return None
        changed = list(ensemble)
        changed[position] = rng.choice(pool)
        return changed

    def _damage(
        self, kind: str, metadata: LedgerMetadata, held: dict[str, EntryAvailability]
    ) -> int | None:
        """Take copies away (or leave extra ones) for `kind`; the under-replication mark."""
        rng = self.rng
        e, wq, aq = metadata.ensemble_size, metadata.write_quorum, metadata.ack_quorum
        index = rng.randrange(len(metadata.segments))
        segment, first, last = metadata.segments_with_bounds()[index]
        ensemble = segment.ensemble
        assert last is not None
        entry = rng.randint(first, last)
        one = EntryAvailability.from_entries([entry])
        copies = list(metadata.write_set_bookies(entry))

        def lose(bookies: list[str], entries: EntryAvailability = one) -> None:
            for bookie in bookies:
                held[bookie] = held[bookie].difference(entries)

        if kind == Category.NO_REPLICA.value:
            lose(copies)
        elif kind in (Category.BELOW_ACK_QUORUM.value, WITHIN_GRACE):
            lose(rng.sample(copies, wq - aq + 1))
        elif kind in (Category.BELOW_WRITE_QUORUM.value, Category.UNDERREPLICATED_TOO_LONG.value):
            how = rng.choice(("entry", "segment", "ledger"))
            position = rng.randrange(e)
            if how == "entry":
                lose([rng.choice(copies)])
            elif how == "segment":
                lose([ensemble[position]], expected_entries(first, last, e, wq, position))
            else:
                held[ensemble[position]] = EntryAvailability.empty()
        elif kind == Category.OVER_REPLICATED.value:
            # A bookie that held `position` before it was replaced there keeps its copies:
            # outside the ensemble now, or back at another position (E > WQ: it then holds
            # more than that position's write sets, every entry if E = WQ + 1).
            position = rng.randrange(e)
            left = expected_entries(first, last, e, wq, position)
            responsive = (
                self.cluster.names[b]
                for b in range(self.cluster.bookies)
                if b not in self.cluster.unresponsive
            )
            outsiders = [b for b in responsive if b not in ensemble]
            members = [b for p, b in enumerate(ensemble) if p != position] if e > wq else []
            choices = outsiders + members
            if choices:
                bookie = rng.choice(choices)
                held[bookie] = held.get(bookie, EntryAvailability.empty()).union(left)
        if kind == Category.UNDERREPLICATED_TOO_LONG.value:
            return NOW_MS - GRACE_PERIOD_MS - rng.randrange(60_000, 3 * 86_400_000)
        if kind == WITHIN_GRACE:
            return NOW_MS - rng.randrange(1_000, GRACE_PERIOD_MS - 60_000)
        return None

    def orphan(self) -> dict[str, EntryAvailability]:
        """What bookies still hold of a deleted ledger: a few round-robin copies."""
        rng = self.rng
        responsive = [b for b in range(self.cluster.bookies) if b not in self.cluster.unresponsive]
        bookies = rng.sample(responsive, min(3, len(responsive)))
        last = rng.randint(10, 500)
        return {
            self.cluster.names[b]: expected_entries(0, last, 3, 2, position)
            for position, b in enumerate(bookies)
        }


def _suits(kind: str, mix: Mix, racks: int) -> bool:
    if kind == Category.BELOW_WRITE_QUORUM.value:
        return mix.write_quorum > mix.ack_quorum
    if kind == Category.PLACEMENT_SOFT.value:
        return min(mix.write_quorum, racks) > MIN_RACKS
    return True


def _held(metadata: LedgerMetadata) -> dict[str, EntryAvailability]:
    """What each bookie of a healthy closed ledger holds: its positions' schedules."""
    held: dict[str, EntryAvailability] = {}
    e, wq = metadata.ensemble_size, metadata.write_quorum
    for segment, first, last in metadata.segments_with_bounds():
        assert last is not None
        for position, bookie in enumerate(segment.ensemble):
            expected = expected_entries(first, last, e, wq, position)
            held[bookie] = held.get(bookie, EntryAvailability.empty()).union(expected)
    return held
