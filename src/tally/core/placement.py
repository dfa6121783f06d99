"""Placement policies: which bookies form an ensemble, and how well an ensemble is placed.

The same `adherence` answers the writer (is this new ensemble acceptable?), the auditor and
the Spark audit (is this segment's ensemble still acceptable?), so all three judge alike.
For the rack-aware policy an ensemble FAILs when some write set spans fewer racks than
min(WQ, min_num_racks_per_write_quorum); it MEETS_SOFT when all reach that but some write
set spans fewer than min(WQ, racks in the cluster); otherwise it MEETS_STRICT (BP-31:
placement is part of the durability contract, and with enforcement a create fails rather
than place unsafely).

Everything is pure: candidates and racks come in as data, randomness as a `random.Random`.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from tally.core.errors import BadRequest, NotEnoughBookies

DEFAULT_RACK = "/default-rack"
"""Where a bookie with no known rack stands, as in BookKeeper."""

_RESTARTS = 32
"""Randomised greedy attempts at a rack-aware ensemble before settling for the best."""


class PlacementAdherence(enum.IntEnum):
    """Ordered worst first, so `min` of several segments is the ledger's adherence."""

    FAIL = 0
    MEETS_SOFT = 1
    MEETS_STRICT = 2


def fewest_racks_per_write_set(racks: Sequence[str], write_quorum: int) -> int:
    """The fewest distinct racks any round-robin write set of the ensemble spans."""
    size = len(racks)
    if not 1 <= write_quorum <= size:
        raise BadRequest(f"write quorum {write_quorum} does not fit an ensemble of {size}")
    return min(
        len({racks[(first + k) % size] for k in range(write_quorum)}) for first in range(size)
    )


def adherence_of_racks(
    racks: Sequence[str], write_quorum: int, min_racks: int, cluster_racks: int
) -> PlacementAdherence:
    """Adherence of an ensemble given its bookies' racks in ensemble order (what a Spark
    batch has at hand); O(E * WQ)."""
    fewest = fewest_racks_per_write_set(racks, write_quorum)
    if fewest < min(write_quorum, min_racks):
        return PlacementAdherence.FAIL
    if fewest < min(write_quorum, cluster_racks):
        return PlacementAdherence.MEETS_SOFT
    return PlacementAdherence.MEETS_STRICT


class PlacementPolicy(Protocol):
    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Mapping[str, str],
        exclude: Collection[str],
        rng: random.Random,
    ) -> tuple[str, ...]:
        """An ensemble from `bookies` (id -> rack) minus `exclude`."""
        ...

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        position: int,
        write_quorum: int,
        bookies: Mapping[str, str],
        exclude: Collection[str],
        rng: random.Random,
    ) -> str:
        """A bookie for `position`, never one of `ensemble` or `exclude`."""
        ...

    def adherence(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        racks: Mapping[str, str],
        cluster_racks: int | None = None,
    ) -> PlacementAdherence: ...


def _candidates(bookies: Mapping[str, str], exclude: Collection[str]) -> list[str]:
    return sorted(b for b in bookies if b not in exclude)


def _check_distinct(ensemble: Sequence[str]) -> bool:
    return len(set(ensemble)) == len(ensemble)


class DefaultPlacementPolicy:
    """Random distinct bookies; any ensemble of distinct bookies meets it."""

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Mapping[str, str],
        exclude: Collection[str],
        rng: random.Random,
    ) -> tuple[str, ...]:
        if not ensemble_size >= write_quorum >= ack_quorum >= 1:
            raise BadRequest(
                f"need E >= WQ >= AQ >= 1, got E={ensemble_size} WQ={write_quorum} AQ={ack_quorum}"
            )
        candidates = _candidates(bookies, exclude)
        if len(candidates) < ensemble_size:
            raise NotEnoughBookies(
                f"an ensemble of {ensemble_size} needs as many writable bookies; "
                f"{len(candidates)} available ({len(exclude)} excluded)"
            )
        return tuple(rng.sample(candidates, ensemble_size))

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        position: int,
        write_quorum: int,
        bookies: Mapping[str, str],
        exclude: Collection[str],
        rng: random.Random,
    ) -> str:
        candidates = _candidates(bookies, {*exclude, *ensemble})
        if not candidates:
            raise NotEnoughBookies(
                f"no writable bookie outside the ensemble {list(ensemble)} and the "
                f"{len(exclude)} excluded to replace position {position}"
            )
        return rng.choice(candidates)

    def adherence(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        racks: Mapping[str, str],
        cluster_racks: int | None = None,
    ) -> PlacementAdherence:
        if not _check_distinct(ensemble) or not 1 <= write_quorum <= len(ensemble):
            return PlacementAdherence.FAIL
        return PlacementAdherence.MEETS_STRICT


class RackAwarePlacementPolicy:
    """Spread every write set over racks (BookKeeper's names and defaults)."""

    def __init__(
        self,
        min_num_racks_per_write_quorum: int = 2,
        enforce_min_num_racks_per_write_quorum: bool = False,
    ) -> None:
        if min_num_racks_per_write_quorum < 1:
            raise BadRequest("min_num_racks_per_write_quorum must be at least 1")
        self.min_racks = min_num_racks_per_write_quorum
        self.enforce = enforce_min_num_racks_per_write_quorum

    def adherence(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        racks: Mapping[str, str],
        cluster_racks: int | None = None,
    ) -> PlacementAdherence:
        if not _check_distinct(ensemble) or not 1 <= write_quorum <= len(ensemble):
            return PlacementAdherence.FAIL
        in_cluster = cluster_racks if cluster_racks is not None else len(set(racks.values()))
        return adherence_of_racks(
            [racks.get(b, DEFAULT_RACK) for b in ensemble], write_quorum, self.min_racks, in_cluster
        )

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Mapping[str, str],
        exclude: Collection[str],
        rng: random.Random,
    ) -> tuple[str, ...]:
        placed = DefaultPlacementPolicy().new_ensemble(
            ensemble_size, write_quorum, ack_quorum, bookies, exclude, rng
        )  # checks sizes and counts
        candidates = _candidates(bookies, exclude)
        racks = {b: bookies[b] or DEFAULT_RACK for b in candidates}
        cluster_racks = len(set(racks.values()))
        best, best_fewest = (
            placed,
            fewest_racks_per_write_set([racks[b] for b in placed], write_quorum),
        )
        target = min(write_quorum, cluster_racks)
        for _ in range(_RESTARTS):
            if best_fewest >= target:
                break
            attempt = self._greedy(ensemble_size, write_quorum, racks, rng)
            fewest = fewest_racks_per_write_set([racks[b] for b in attempt], write_quorum)
            if fewest > best_fewest:
                best, best_fewest = attempt, fewest
        self._enforce(best_fewest, write_quorum, cluster_racks, "a new ensemble")
        return best

    def replace_bookie(
        self,
        ensemble: Sequence[str],
        position: int,
        write_quorum: int,
        bookies: Mapping[str, str],
        exclude: Collection[str],
        rng: random.Random,
    ) -> str:
        candidates = _candidates(bookies, {*exclude, *ensemble})
        if not candidates:
            raise NotEnoughBookies(
                f"no writable bookie outside the ensemble {list(ensemble)} and the "
                f"{len(exclude)} excluded to replace position {position}"
            )
        racks = [bookies.get(b, DEFAULT_RACK) for b in ensemble]

        def fewest_with(candidate: str) -> int:
            trial = list(racks)
            trial[position] = bookies[candidate] or DEFAULT_RACK
            return fewest_racks_per_write_set(trial, write_quorum)

        scored = [(fewest_with(c), c) for c in candidates]
        best = max(score for score, _ in scored)
        in_reach = len({bookies[c] for c in candidates} | set(racks))
        self._enforce(best, write_quorum, in_reach, f"position {position}")
        return rng.choice([c for score, c in scored if score == best])

    def _greedy(
        self, size: int, write_quorum: int, racks: Mapping[str, str], rng: random.Random
    ) -> tuple[str, ...]:
        """Fill positions in order, preferring a bookie whose rack is new to every write set
        the position shares with positions already filled (wrapping at the end)."""
        remaining = list(racks)
        rng.shuffle(remaining)
        chosen: list[str] = []
        for position in range(size):
            near = {
                racks[chosen[p]] for p in range(max(0, position - write_quorum + 1), position)
            } | {
                racks[chosen[p]]
                for p in range(position + write_quorum - size)
                if p < len(chosen)
            }
            pick = next((b for b in remaining if racks[b] not in near), remaining[0])
            remaining.remove(pick)
            chosen.append(pick)
        return tuple(chosen)

    def _enforce(self, fewest: int, write_quorum: int, cluster_racks: int, what: str) -> None:
        needed = min(write_quorum, self.min_racks)
        if self.enforce and fewest < needed:
            raise NotEnoughBookies(
                f"{what}: every write set must span {needed} racks "
                f"(min_num_racks_per_write_quorum={self.min_racks}, WQ={write_quorum}) but "
                f"the best placement spans {fewest}; the cluster has {cluster_racks} racks "
                "among the candidates. Enforcement refuses to place unsafely."
            )
