"""The synthetic cluster: bookies on racks, which of them are silent or read-only, and the
quorum mixes whose rack patterns place strictly on it, found once and judged by the core's
placement rule so that generator and checks cannot disagree."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tally.audit.synth.truth import MIN_RACKS
from tally.core.availability import Int64Array
from tally.core.errors import BadRequest
from tally.core.placement import PlacementAdherence, adherence_of_racks

MIXES = ((3, 3, 2, 0.45), (3, 2, 2, 0.35), (5, 3, 2, 0.20))
"""(E, WQ, AQ, share) of the healthy ledgers; a mix the racks cannot place strictly is left
out and the others share its weight."""
MAX_ENSEMBLE = max(mix[0] for mix in MIXES)
READONLY_SHARE = 0.05


@dataclass(frozen=True)
class Mix:
    """A quorum mix of the healthy ledgers, with the rack patterns it may use here."""

    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    weight: float
    patterns: tuple[tuple[int, ...], ...]
    """Rack colours per position (0, 1, ... in order of first use) that meet the placement
    policy strictly in this cluster."""


def _strict_patterns(
    ensemble_size: int, write_quorum: int, racks: int, per_rack: int
) -> tuple[tuple[int, ...], ...]:
    """Every way (up to renaming racks) to give the positions racks so that each write set
    spans min(WQ, racks) racks, using no rack more than `per_rack` times."""
    found = []
    for pattern in _rack_colourings(ensemble_size, min(ensemble_size, racks)):
        if max(pattern.count(colour) for colour in pattern) > per_rack:
            continue
        adherence = adherence_of_racks([str(c) for c in pattern], write_quorum, MIN_RACKS, racks)
        if adherence is PlacementAdherence.MEETS_STRICT:
            found.append(pattern)
    return tuple(found)


def _rack_colourings(length: int, colours: int) -> Iterator[tuple[int, ...]]:
    """Sequences where each colour first appears after all lower ones (restricted growth)."""
    if length == 0:
        yield ()
        return
    for prefix in _rack_colourings(length - 1, colours):
        for colour in range(min(max(prefix, default=-1) + 2, colours)):
            yield (*prefix, colour)


@dataclass(frozen=True)
class Cluster:
    """Bookies by index: bookie b stands on rack b mod racks, so racks are filled evenly."""

    bookies: int
    racks: int
    names: list[str]
    rack_names: list[str]
    per_rack: Int64Array
    unresponsive: frozenset[int]
    readonly: frozenset[int]
    mixes: tuple[Mix, ...]

    @classmethod
    def make(cls, bookies: int, racks: int, unresponsive: int, rng: random.Random) -> Cluster:
        if racks < 2:
            raise BadRequest(f"need at least 2 racks (min racks is {MIN_RACKS}), got {racks}")
        if bookies < racks:
            raise BadRequest(f"{bookies} bookies cannot fill {racks} racks")
        per_rack = np.array([len(range(r, bookies, racks)) for r in range(racks)], np.int64)
        mixes = tuple(
            Mix(e, wq, aq, w, patterns)
            for e, wq, aq, w in MIXES
            if e <= bookies and (patterns := _strict_patterns(e, wq, racks, bookies // racks))
        )
        if not mixes:
            raise BadRequest(f"no ensemble mix places strictly on {bookies} bookies, {racks} racks")
        if unresponsive > bookies // 4:
            raise BadRequest(
                f"{unresponsive} unresponsive bookies of {bookies}: at most a quarter, so that "
                "fault ledgers can avoid them"
            )
        silent = frozenset(rng.sample(range(bookies), unresponsive))
        others = [b for b in range(bookies) if b not in silent]
        readonly = frozenset(rng.sample(others, int(len(others) * READONLY_SHARE)))
        return cls(
            bookies,
            racks,
            [_bookie_name(b % racks, b // racks) for b in range(bookies)],
            [f"/rack-{r:02d}" for r in range(racks)],
            per_rack,
            silent,
            readonly,
            mixes,
        )

    def rack_of(self, bookie: int) -> int:
        return bookie % self.racks

    def responsive_on(self, rack: int) -> list[int]:
        return [b for b in range(rack, self.bookies, self.racks) if b not in self.unresponsive]


def _bookie_name(rack: int, index: int) -> str:
    """host:port, as bookie ids are; the third octet is the rack."""
    return f"10.{rack // 256}.{rack % 256}.{index % 250 + 1}:{3181 + index // 250}"
