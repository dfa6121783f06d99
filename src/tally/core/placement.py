"""Placement policies: which bookies make an ensemble, and how well an ensemble is placed.

BP-31 asks that the copies of an entry be spread over fault domains (racks) when a ledger is
written and when it is re-replicated; BP-34 asks the auditor to report segments whose ensemble
breaks the policy. The client and the replication worker choose bookies with `new_ensemble`
and `replace_positions`; the auditor and the Spark audit judge ensembles with `adherence` (or
`adherence_of_racks`, on the racks alone). Both hold to one rule,
`write_sets_on_enough_racks`, so choosing and judging cannot disagree.

Everything is plain data: racks come as a mapping from bookie id to rack, randomness as a
`random.Random`, so a seeded run is reproducible. A bookie whose rack is not known stands in
BookKeeper's `/default-rack`.

A write set is the WQ ensemble positions s, s+1, ..., s+WQ-1 (mod E) of the round-robin
schedule; an ensemble has E of them (one, when WQ = E).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import random
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from tally.core.errors import BadRequest, NotEnoughBookies
from tally.core.schedule import check_quorums

DEFAULT_RACK = "/default-rack"
DEFAULT_POLICY = "default"
"""Random distinct bookies, racks ignored (BookKeeper's DefaultEnsemblePlacementPolicy)."""
RACK_AWARE = "rack-aware"
"""Write sets spread over racks (RackawareEnsemblePlacementPolicy)."""
PLACEMENT_POLICIES = (DEFAULT_POLICY, RACK_AWARE)
DEFAULT_MIN_NUM_RACKS_PER_WRITE_QUORUM = 2
"""BookKeeper's minNumRacksPerWriteQuorum."""
"""Where a bookie with no known rack stands, as in BookKeeper."""

SPREAD_TRIES = 8
"""Layouts `new_ensemble` draws at most, should one fall short of the best spread."""


class PlacementAdherence(enum.IntEnum):
    """Ordered worst first, so `min` over a ledger's segments is the ledger's adherence."""

    FAIL = 0
    MEETS_SOFT = 1
    MEETS_STRICT = 2


def rack_of(racks: Mapping[str, str], bookie_id: str) -> str:
    """The bookie's rack, or the default rack when its placement was never set."""
    return racks.get(bookie_id, DEFAULT_RACK)


def fewest_racks_per_write_set(
    racks: Sequence[str], write_quorum: int, through: Collection[int] | None = None
) -> int:
    """The fewest distinct racks of any write set, given the racks of the positions in order;
    with `through`, of the write sets that hold one of those positions (WQ if none is given).

    One window slides round the ensemble with a count per rack: O(E + WQ), no sets built.
    """
    size = len(racks)
    if not 1 <= write_quorum <= size:
        raise BadRequest(f"write quorum {write_quorum} does not fit an ensemble of {size}")
    if through is not None:
        return min(
            (
                len({racks[(start + k) % size] for k in range(write_quorum)})
                for start in _starts_through(through, size, write_quorum)
            ),
            default=write_quorum,
        )
    held: dict[str, int] = {}
    for rack in racks[:write_quorum]:
        held[rack] = held.get(rack, 0) + 1
    fewest = len(held)
    for start in range(1, size if write_quorum < size else 1):
        leaving = racks[start - 1]
        if held[leaving] == 1:
            del held[leaving]
        else:
            held[leaving] -= 1
        entering = racks[(start + write_quorum - 1) % size]
        held[entering] = held.get(entering, 0) + 1
        fewest = min(fewest, len(held))
    return fewest


def racks_required(write_quorum: int, min_racks: int, cluster_racks: int) -> int:
    """The racks every write set must span: `min_num_racks_per_write_quorum`, capped by what
    a write set holds (WQ) and by the racks the cluster has, so that a cluster whose bookies
    all stand in one rack is never refused."""
    return min(write_quorum, min_racks, cluster_racks)


def write_sets_on_enough_racks(
    racks: Sequence[str],
    write_quorum: int,
    min_racks: int,
    cluster_racks: int,
    through: Collection[int] | None = None,
) -> bool:
    """The placement rule: every write set (with `through`, every one holding one of those
    positions) spans at least `racks_required` racks. The client and the replication worker
    enforce it and every audit checks it, so that what is written passes its audit."""
    return fewest_racks_per_write_set(racks, write_quorum, through) >= racks_required(
        write_quorum, min_racks, cluster_racks
    )


def racks_in_cluster(racks: Mapping[str, str], registered: Iterable[str]) -> int:
    """The racks of the registered bookies (writable or read-only), at least 1: the cluster's
    racks as the rule counts them, for the client and the audits alike."""
    return len({rack_of(racks, bookie) for bookie in registered}) or 1


def adherence_of_racks(
    racks: Sequence[str], write_quorum: int, min_racks: int, cluster_racks: int
) -> PlacementAdherence:
    """Rack-aware adherence of an ensemble given the racks of its positions, in order.

    FAIL when it breaks `write_sets_on_enough_racks` (or WQ does not fit the ensemble at
    all); MEETS_SOFT when it keeps the rule but some write set spans fewer than
    min(WQ, cluster_racks); MEETS_STRICT otherwise. This is what a Spark batch has at hand;
    it cannot see a bookie named twice, `RackAwarePlacementPolicy.adherence` checks that.
    """
    for name, value in (("min racks", min_racks), ("cluster racks", cluster_racks)):
        if value < 1:
            raise BadRequest(f"{name} must be at least 1, got {value}")
    if not 1 <= write_quorum <= len(racks):
        return PlacementAdherence.FAIL
    if not write_sets_on_enough_racks(racks, write_quorum, min_racks, cluster_racks):
        return PlacementAdherence.FAIL
    if fewest_racks_per_write_set(racks, write_quorum) < min(write_quorum, cluster_racks):
        return PlacementAdherence.MEETS_SOFT
    return PlacementAdherence.MEETS_STRICT


class PlacementPolicy(Protocol):
    """Chooses ensembles and replacements, and judges any ensemble by the same rule.

    `bookies` maps bookie ids to racks; the candidates are those not in `exclude`, and a
    bookie already in the ensemble is never chosen again. Give the racks of the ensemble's
    own bookies too, failed ones included (and in `exclude`), or they count as
    `/default-rack`. `cluster_racks` caps the racks a write set must span
    (`racks_required`); by default it counts the racks of `bookies`. `NotEnoughBookies`
    when no choice fits, `BadRequest` for sizes that can never work.
    """

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Mapping[str, str],
        exclude: Collection[str],
        rng: random.Random,
        cluster_racks: int | None = None,
    ) -> tuple[str, ...]: ...

    def replace_positions(
        self,
        ensemble: Sequence[str],
        positions: Collection[int],
        write_quorum: int,
        bookies: Mapping[str, str],
        exclude: Collection[str],
        rng: random.Random,
        cluster_racks: int | None = None,
    ) -> tuple[str, ...]:
        """The ensemble with a new bookie at each of `positions`, the others as they were."""
        ...

    def adherence(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        racks: Mapping[str, str],
        cluster_racks: int | None = None,
    ) -> PlacementAdherence: ...


@dataclasses.dataclass(frozen=True, slots=True)
class DefaultPlacementPolicy:
    """Random distinct bookies; any ensemble of distinct bookies meets it strictly."""

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Mapping[str, str],
        exclude: Collection[str],
        rng: random.Random,
        cluster_racks: int | None = None,
    ) -> tuple[str, ...]:
        check_quorums(ensemble_size, write_quorum, ack_quorum)
        candidates = _candidates(bookies, exclude)
        _require_candidates(ensemble_size, write_quorum, ack_quorum, bookies, candidates)
        return tuple(rng.sample(candidates, ensemble_size))

    def replace_positions(
        self,
        ensemble: Sequence[str],
        positions: Collection[int],
        write_quorum: int,
        bookies: Mapping[str, str],
        exclude: Collection[str],
        rng: random.Random,
        cluster_racks: int | None = None,
    ) -> tuple[str, ...]:
        wanted = _check_positions(ensemble, positions, write_quorum)
        candidates = _candidates(bookies, {*exclude, *ensemble})
        if len(candidates) < len(wanted):
            raise NotEnoughBookies(_no_replacement(ensemble, wanted, bookies, candidates))
        new = list(ensemble)
        for position, bookie in zip(wanted, rng.sample(candidates, len(wanted)), strict=True):
            new[position] = bookie
        return tuple(new)

    def adherence(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        racks: Mapping[str, str],
        cluster_racks: int | None = None,
    ) -> PlacementAdherence:
        if not 1 <= write_quorum <= len(ensemble) or len(set(ensemble)) != len(ensemble):
            return PlacementAdherence.FAIL
        return PlacementAdherence.MEETS_STRICT


@dataclasses.dataclass(frozen=True, slots=True)
class RackAwarePlacementPolicy:
    """Every write set on at least `racks_required` racks: `write_sets_on_enough_racks`.

    New ensembles go as far as the cluster allows: they maximise the fewest racks of any
    write set. Without enforcement a cluster with too few racks still gets the best ensemble
    it can (and `adherence` tells the truth about it); with enforcement (the client's and
    the replication worker's default) the create or the replacement fails instead, as BP-31
    asks ("Strict enforcement of placement policy"), with an error naming the racks there
    are and what the ledger needs.
    """

    min_num_racks_per_write_quorum: int = DEFAULT_MIN_NUM_RACKS_PER_WRITE_QUORUM
    enforce_min_num_racks_per_write_quorum: bool = False

    def __post_init__(self) -> None:
        value = self.min_num_racks_per_write_quorum
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadRequest(f"min_num_racks_per_write_quorum must be an int >= 1, not {value!r}")

    def new_ensemble(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        bookies: Mapping[str, str],
        exclude: Collection[str],
        rng: random.Random,
        cluster_racks: int | None = None,
    ) -> tuple[str, ...]:
        """Rack counts that can reach the bound of `_most_racks_possible`, laid out by
        `_spread`; each layout is measured, and a short one is drawn again."""
        check_quorums(ensemble_size, write_quorum, ack_quorum)
        candidates = _candidates(bookies, exclude)
        _require_candidates(ensemble_size, write_quorum, ack_quorum, bookies, candidates)
        if cluster_racks is None:
            cluster_racks = racks_in_cluster(bookies, bookies)
        by_rack = _by_rack(bookies, candidates)
        capacity = {rack: len(ids) for rack, ids in by_rack.items()}
        need = racks_required(write_quorum, self.min_num_racks_per_write_quorum, cluster_racks)
        best = _most_racks_possible(list(capacity.values()), ensemble_size, write_quorum)
        where = f"the {len(candidates)} candidate bookies on {len(capacity)} rack(s)"
        if self.enforce_min_num_racks_per_write_quorum and best < need:
            raise NotEnoughBookies(
                self._refusal(
                    ensemble_size,
                    write_quorum,
                    cluster_racks,
                    f"{where} allow at most {best} racks per write set",
                    bookies,
                    by_rack,
                )
            )
        racks: list[str] = []
        got = 0
        for _ in range(SPREAD_TRIES):
            layout = _spread(_rack_counts(capacity, ensemble_size, write_quorum, rng), write_quorum)
            spans = fewest_racks_per_write_set(layout, write_quorum)
            if spans > got:
                racks, got = layout, spans
            if got >= best:
                break
        if self._refuses(racks, write_quorum, cluster_racks):
            raise NotEnoughBookies(
                self._refusal(
                    ensemble_size,
                    write_quorum,
                    cluster_racks,
                    f"{where} may allow up to {best} racks per write set, and {SPREAD_TRIES} "
                    f"layouts reached only {got}",
                    bookies,
                    by_rack,
                )
            )
        turn = rng.randrange(ensemble_size)
        racks = racks[turn:] + racks[:turn]
        picks = {rack: iter(rng.sample(ids, racks.count(rack))) for rack, ids in by_rack.items()}
        return tuple(next(picks[rack]) for rack in racks)

    def replace_positions(
        self,
        ensemble: Sequence[str],
        positions: Collection[int],
        write_quorum: int,
        bookies: Mapping[str, str],
        exclude: Collection[str],
        rng: random.Random,
        cluster_racks: int | None = None,
    ) -> tuple[str, ...]:
        """New bookies for `positions` whose racks best spread the write sets through them.

        Position by position, racks rank by the fewest racks of the write sets through the
        position, then by their sum (a position still to fill counts as no rack); among the
        best a rack is drawn in proportion to its candidates, so that every candidate bookie
        of the best racks is equally likely. Should that leave a write set short of the
        rule, a search looks for racks that keep it (`_search_racks`). The rule is judged on
        the write sets through the new bookies: the others do not change, and refusing
        over them would stop a write or a repair without placing anything better.
        """
        wanted = _check_positions(ensemble, positions, write_quorum)
        candidates = _candidates(bookies, {*exclude, *ensemble})
        if len(candidates) < len(wanted):
            raise NotEnoughBookies(_no_replacement(ensemble, wanted, bookies, candidates))
        if cluster_racks is None:
            cluster_racks = racks_in_cluster(bookies, bookies)
        by_rack = _by_rack(bookies, candidates)
        capacity = {rack: len(ids) for rack, ids in by_rack.items()}
        need = racks_required(write_quorum, self.min_num_racks_per_write_quorum, cluster_racks)
        known: list[str | None] = [rack_of(bookies, bookie) for bookie in ensemble]
        for position in wanted:
            known[position] = None
        racks = _fill_racks(known, wanted, capacity, write_quorum, need, rng)
        if self._refuses(racks, write_quorum, cluster_racks, wanted):
            got = fewest_racks_per_write_set(racks, write_quorum, wanted)
            raise NotEnoughBookies(
                self._refusal(
                    len(ensemble),
                    write_quorum,
                    cluster_racks,
                    f"no candidates for position(s) {wanted} of {list(ensemble)} put the write "
                    f"sets through them on more than {got} racks",
                    bookies,
                    by_rack,
                )
            )
        chosen = Counter(racks[position] for position in wanted)
        picks = {rack: iter(rng.sample(by_rack[rack], count)) for rack, count in chosen.items()}
        new = list(ensemble)
        for position in wanted:
            new[position] = next(picks[racks[position]])
        return tuple(new)

    def adherence(
        self,
        ensemble: Sequence[str],
        write_quorum: int,
        racks: Mapping[str, str],
        cluster_racks: int | None = None,
    ) -> PlacementAdherence:
        """`adherence_of_racks` of the ensemble's racks; FAIL if a bookie is named twice.

        `cluster_racks` defaults to the racks in `racks` (with the default rack if an
        ensemble bookie has none); an auditor counts the cluster's racks once and passes it.
        """
        placed = [rack_of(racks, bookie) for bookie in ensemble]
        if cluster_racks is None:
            cluster_racks = len({*racks.values(), *placed}) or 1
        if len(set(ensemble)) != len(ensemble):
            return PlacementAdherence.FAIL
        return adherence_of_racks(
            placed, write_quorum, self.min_num_racks_per_write_quorum, cluster_racks
        )

    def _refuses(
        self,
        racks: Sequence[str],
        write_quorum: int,
        cluster_racks: int,
        through: Collection[int] | None = None,
    ) -> bool:
        return self.enforce_min_num_racks_per_write_quorum and not write_sets_on_enough_racks(
            racks, write_quorum, self.min_num_racks_per_write_quorum, cluster_racks, through
        )

    def _refusal(
        self,
        ensemble_size: int,
        write_quorum: int,
        cluster_racks: int,
        why: str,
        bookies: Mapping[str, str],
        by_rack: Mapping[str, list[str]],
    ) -> str:
        """What the ledger needs, why it cannot be had, the racks there are, what to do."""
        min_racks = self.min_num_racks_per_write_quorum
        need = racks_required(write_quorum, min_racks, cluster_racks)
        return (
            f"refusing to place unsafely: E={ensemble_size} WQ={write_quorum} needs every "
            f"write set on at least {need} racks (the least of WQ={write_quorum}, "
            f"min_num_racks_per_write_quorum={min_racks} and the {cluster_racks} racks of the "
            f"cluster; the rule is enforced), but {why}. "
            f"{_racks_and_candidates(bookies, by_rack)}. {_WHAT_TO_DO}"
        )


_WHAT_TO_DO = (
    "Add bookies on other racks, choose E and WQ the racks can hold, or set "
    "enforce_min_num_racks_per_write_quorum = false to place without the rule"
)
SHOWN_PER_RACK = 6
"""Candidates named per rack in a refusal; the rest are counted."""


# -- candidates ------------------------------------------------------------------------------


def _candidates(bookies: Mapping[str, str], exclude: Collection[str]) -> list[str]:
    """Sorted, so that a seeded choice does not depend on the order of the inputs."""
    barred = set(exclude)
    return sorted(bookie for bookie in bookies if bookie not in barred)


def _by_rack(bookies: Mapping[str, str], candidates: list[str]) -> dict[str, list[str]]:
    by_rack: dict[str, list[str]] = {}
    for bookie in candidates:
        by_rack.setdefault(rack_of(bookies, bookie), []).append(bookie)
    return dict(sorted(by_rack.items()))


def _racks_and_candidates(bookies: Mapping[str, str], by_rack: Mapping[str, list[str]]) -> str:
    """Every rack of `bookies` with its candidates, for a refusal to name."""
    shown = []
    for rack in sorted({rack_of(bookies, bookie) for bookie in bookies}):
        ids = by_rack.get(rack, [])
        names = ", ".join(ids[:SHOWN_PER_RACK])
        if len(ids) > SHOWN_PER_RACK:
            names += f" and {len(ids) - SHOWN_PER_RACK} more"
        shown.append(f"{rack}: {names or 'no candidate'}")
    return "Racks and their candidate bookies: " + "; ".join(shown)


def _require_candidates(
    ensemble_size: int,
    write_quorum: int,
    ack_quorum: int,
    bookies: Mapping[str, str],
    candidates: list[str],
) -> None:
    if len(candidates) < ensemble_size:
        racks = len({rack_of(bookies, bookie) for bookie in candidates})
        raise NotEnoughBookies(
            f"need {ensemble_size} bookies for an ensemble (E={ensemble_size} "
            f"WQ={write_quorum} AQ={ack_quorum}) but only {len(candidates)} are candidates, "
            f"on {racks} rack(s): {len(bookies)} known, "
            f"{len(bookies) - len(candidates)} of them excluded"
        )


def _check_positions(
    ensemble: Sequence[str], positions: Collection[int], write_quorum: int
) -> list[int]:
    """The positions, sorted, once each in the ensemble."""
    check_quorums(len(ensemble), write_quorum, 1)
    wanted = sorted(set(positions))
    if len(wanted) != len(positions):
        raise BadRequest(f"positions {sorted(positions)} name a position twice")
    for position in wanted:
        if not 0 <= position < len(ensemble):
            raise BadRequest(f"position {position} is outside the ensemble 0..{len(ensemble) - 1}")
    return wanted


def _no_replacement(
    ensemble: Sequence[str], positions: list[int], bookies: Mapping[str, str], candidates: list[str]
) -> str:
    return (
        f"no bookies can replace {[ensemble[p] for p in positions]} at position(s) {positions} "
        f"of {list(ensemble)}: {len(candidates)} candidate(s) for {len(positions)} "
        f"position(s); the others of the {len(bookies)} known bookies are in the ensemble or "
        "excluded"
    )


# -- replacing positions ---------------------------------------------------------------------

SEARCH_BUDGET = 20_000
"""Partial layouts `_search_racks` tries at most, so that a hopeless search of a large
cluster ends; clusters of a few racks are searched through well within it."""


def _starts_through(positions: Collection[int], size: int, write_quorum: int) -> list[int]:
    """The first positions of the write sets that hold one of `positions`."""
    if write_quorum == size:
        return [0] if positions else []
    return sorted({(position - k) % size for position in positions for k in range(write_quorum)})


def _fill_racks(
    known: list[str | None],
    positions: list[int],
    capacity: Mapping[str, int],
    write_quorum: int,
    need: int,
    rng: random.Random,
) -> list[str]:
    """Racks for the `positions` (None in `known`): the greedy choice of `replace_positions`,
    or, when it leaves a write set through them on fewer than `need` racks, the first
    layout that has none if a search finds one."""
    greedy = list(known)
    free = dict(capacity)
    for position in positions:
        rack = _best_rack(greedy, position, free, write_quorum, rng)
        greedy[position] = rack
        free[rack] -= 1
    placed = _placed(greedy)
    if fewest_racks_per_write_set(placed, write_quorum, positions) >= need:
        return placed
    found = _search_racks(known, positions, capacity, write_quorum, need)
    return placed if found is None else found


def _best_rack(
    layout: list[str | None],
    position: int,
    free: Mapping[str, int],
    write_quorum: int,
    rng: random.Random,
) -> str:
    size = len(layout)
    starts = _starts_through([position], size, write_quorum)

    def spread(rack: str) -> tuple[int, int]:
        layout[position] = rack
        spans = [
            len({layout[(start + k) % size] for k in range(write_quorum)} - {None})
            for start in starts
        ]
        return min(spans), sum(spans)

    ranked = {rack: spread(rack) for rack, left in free.items() if left > 0}
    layout[position] = None
    top = max(ranked.values())
    best = [rack for rack, score in ranked.items() if score == top]
    return rng.choices(best, [free[rack] for rack in best])[0]


def _search_racks(
    known: list[str | None],
    positions: list[int],
    capacity: Mapping[str, int],
    write_quorum: int,
    need: int,
) -> list[str] | None:
    """Depth first, racks for `positions` so that every write set through them spans `need`
    racks; a branch ends as soon as a write set through a filled position cannot get there
    (its racks so far plus its positions still to fill fall short). None if there are none,
    or none within `SEARCH_BUDGET` partial layouts."""
    size = len(known)
    trial = list(known)
    free = dict(capacity)
    starts = {position: _starts_through([position], size, write_quorum) for position in positions}
    budget = SEARCH_BUDGET

    def can_reach(start: int) -> bool:
        window = [trial[(start + k) % size] for k in range(write_quorum)]
        return len(set(window) - {None}) + window.count(None) >= need

    def fill(index: int) -> bool:
        nonlocal budget
        if index == len(positions):
            return True
        position = positions[index]
        for rack in [rack for rack, left in free.items() if left > 0]:
            budget -= 1
            if budget < 0:
                return False
            trial[position] = rack
            free[rack] -= 1
            if all(can_reach(start) for start in starts[position]) and fill(index + 1):
                return True
            free[rack] += 1
        trial[position] = None
        return False

    return _placed(trial) if fill(0) else None


def _placed(layout: list[str | None]) -> list[str]:
    racks = [rack for rack in layout if rack is not None]
    assert len(racks) == len(layout), "every position has a rack"
    return racks


# -- how many racks every write set can span -------------------------------------------------
#
# A rack with n bookies in the ensemble is in at most min(E, n * WQ) write sets, since each
# bookie is in WQ of them. Summed over racks, that bounds the racks of all write sets
# together, and the fewest is at most their average: this gives `_most_racks_possible`.
# `_rack_counts` picks counts that reach that sum and `_spread` lays them out. No proof says
# the layout always reaches the bound, so `new_ensemble` measures it; it did on every
# cluster with E <= 12 and up to 5 racks, and on random ones with E <= 20 and WQ <= 6.


def _gain(used: int, ensemble_size: int, write_quorum: int) -> int:
    """Write sets a rack's next bookie adds the rack to, when `used` are already in."""
    return max(0, min(write_quorum, ensemble_size - used * write_quorum))


def _most_racks_possible(capacities: Collection[int], ensemble_size: int, write_quorum: int) -> int:
    """The bound above, with each rack's `_gain`s taken best first (WQ, ..., WQ, E % WQ)."""
    full, spare = divmod(ensemble_size, write_quorum)
    first = sum(min(capacity, full) for capacity in capacities)
    if first >= ensemble_size:
        return write_quorum
    second = min(ensemble_size - first, sum(capacity > full for capacity in capacities))
    return (write_quorum * first + spare * second) // ensemble_size


def _rack_counts(
    capacity: Mapping[str, int], ensemble_size: int, write_quorum: int, rng: random.Random
) -> dict[str, int]:
    """Bookies per rack, one at a time to the rack with the best `_gain` (which reaches the
    bound's sum); ties go to a rack in proportion to its unused candidates."""
    counts = dict.fromkeys(capacity, 0)
    for _ in range(ensemble_size):
        gains = {
            rack: _gain(used, ensemble_size, write_quorum)
            for rack, used in counts.items()
            if used < capacity[rack]
        }
        top = max(gains.values())
        tied = [rack for rack, gain in gains.items() if gain == top]
        counts[rng.choices(tied, [capacity[rack] - counts[rack] for rack in tied])[0]] += 1
    return {rack: count for rack, count in counts.items() if count}


def _spread(counts: Mapping[str, int], write_quorum: int) -> list[str]:
    """Lay out racks so that every write set reaches, as a rule, the bound of the counts.

    A rack with n * WQ <= E bookies ("small") should be in n * WQ write sets, so its
    bookies must be WQ or more apart, and the small racks should share the write sets
    evenly. They take evenly spaced slots, dealt column by column into E // WQ rows, so
    that consecutive bookies of a rack sit a whole row apart. The larger racks can be
    in every write set if no two of their bookies are more than WQ apart; each takes free
    slots near even spacing, the tightest first. When every rack is small (the bound is WQ),
    the slots are all positions and every write set spans WQ racks.
    """
    size = sum(counts.values())
    by_count = sorted(counts, key=lambda rack: (-counts[rack], rack))
    small = [rack for rack in by_count if counts[rack] * write_quorum <= size]
    large = [rack for rack in reversed(by_count) if counts[rack] * write_quorum > size]
    slots: list[str | None] = [None] * size
    items = [rack for rack in small for _ in range(counts[rack])]
    if items:
        rows = min(size // write_quorum, len(items))
        base, longer = divmod(len(items), rows)
        for j, rack in enumerate(items):
            row, column = j % rows, j // rows
            slots[(row * base + min(row, longer) + column) * size // len(items)] = rack
    for rack in large:
        _place_everywhere(slots, rack, counts[rack], write_quorum)
    return [rack for rack in slots if rack is not None]


def _place_everywhere(slots: list[str | None], rack: str, count: int, write_quorum: int) -> None:
    """Give `rack` `count` free slots with no gap wider than WQ if it can: from each free
    start in turn, the free slot nearest to each even step."""
    size = len(slots)
    free = [p for p, taken in enumerate(slots) if taken is None]
    best: list[int] = []
    widest = size + 1
    for start in free:
        chosen: set[int] = set()
        for i in range(count):
            step = start + i * size // count
            chosen.add(
                next(
                    p % size
                    for delta in range(size)
                    for p in (step + delta, step - delta)
                    if slots[p % size] is None and p % size not in chosen
                )
            )
        ordered = sorted(chosen)
        gap = max(
            (b - a) % size or size for a, b in zip(ordered, [*ordered[1:], ordered[0]], strict=True)
        )
        if gap < widest:
            best, widest = ordered, gap
        if gap <= write_quorum:
            break
    for p in best:
        slots[p] = rack


def crowded_bookies(
    ensemble: tuple[str, ...], write_quorum: int, racks: Mapping[str, str]
) -> frozenset[str]:
    """The bookies that share a rack with an earlier bookie of one of their write sets: the
    ones to move so that the segment spreads over more racks (named in a placement mark)."""
    size = len(ensemble)
    crowded: set[str] = set()
    for start in range(size if write_quorum < size else 1):
        taken: set[str] = set()
        for k in range(write_quorum):
            bookie = ensemble[(start + k) % size]
            rack = rack_of(racks, bookie)
            if rack in taken:
                crowded.add(bookie)
            taken.add(rack)
    return frozenset(crowded)


T = TypeVar("T")


@dataclasses.dataclass
class BookieQuarantine:
    """Bookies that failed a request lately, kept out of new ensembles and replacements for
    a while (BookKeeper's bookieQuarantineTime): a bookie that just failed is likely dead
    while its registration has not lapsed yet, and choosing it costs another change."""

    seconds: float
    until: dict[str, float] = dataclasses.field(default_factory=dict)

    def add(self, bookie: str, now: float) -> None:
        self.until[bookie] = now + self.seconds

    def active(self, now: float) -> frozenset[str]:
        for bookie in [b for b, until in self.until.items() if until <= now]:
            del self.until[bookie]
        return frozenset(self.until)


def preferring_healthy(choose: Callable[[frozenset[str]], T], quarantined: frozenset[str]) -> T:
    """`choose(avoid)` with the quarantined bookies avoided; with them allowed again when
    that leaves too few, as BookKeeper does, since a quarantine must never stop a write."""
    if quarantined:
        with contextlib.suppress(NotEnoughBookies):
            return choose(quarantined)
    return choose(frozenset())


def worst_segments(
    policy: PlacementPolicy,
    metadata_segments: Sequence[tuple[Sequence[str], bool]],
    write_quorum: int,
    racks: Mapping[str, str],
    cluster_racks: int,
) -> tuple[PlacementAdherence, list[int]]:
    """A ledger's worst adherence over its segments that hold entries, and the indexes of
    the segments at that level (none when all meet the policy strictly).

    `metadata_segments` gives each segment's ensemble and whether it holds entries (an
    empty trailing segment stores nothing, so its placement does not matter).
    """
    worst, found = PlacementAdherence.MEETS_STRICT, []
    for index, (ensemble, holds_entries) in enumerate(metadata_segments):
        if not holds_entries:
            continue
        adherence = policy.adherence(ensemble, write_quorum, racks, cluster_racks)
        if adherence < worst:
            worst, found = adherence, [index]
        elif adherence == worst and adherence is not PlacementAdherence.MEETS_STRICT:
            found.append(index)
    return worst, found
