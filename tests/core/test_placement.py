"""Placement policies against brute force: the best spread any ensemble of the cluster has."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Collection

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.errors import BadRequest, NotEnoughBookies
from tally.core.placement import (
    DEFAULT_RACK,
    BookieQuarantine,
    DefaultPlacementPolicy,
    PlacementAdherence,
    PlacementPolicy,
    RackAwarePlacementPolicy,
    adherence_of_racks,
    crowded_bookies,
    fewest_racks_per_write_set,
    preferring_healthy,
    racks_required,
    worst_segments,
    write_sets_on_enough_racks,
)
from tally.core.schedule import write_set

FAIL, SOFT, STRICT = (
    PlacementAdherence.FAIL,
    PlacementAdherence.MEETS_SOFT,
    PlacementAdherence.MEETS_STRICT,
)


# -- references, written from the definitions ---------------------------------------------


def spans(racks: list[str], write_quorum: int, through: Collection[int] | None = None) -> int:
    """Fewest racks of the write sets of entries 0..E-1 (those holding a position of
    `through`, if given; WQ if none does)."""
    sets = [write_set(entry, len(racks), write_quorum) for entry in range(len(racks))]
    return min(
        (len({racks[p] for p in s}) for s in sets if through is None or set(s) & set(through)),
        default=write_quorum,
    )


def best_spread(bookies: dict[str, str], exclude: set[str], size: int, write_quorum: int) -> int:
    """The best `spans` of any ensemble of the candidates, over every sequence of racks."""
    capacity = Counter(rack for bookie, rack in bookies.items() if bookie not in exclude)
    return max(
        spans(list(racks), write_quorum)
        for racks in itertools.product(sorted(capacity), repeat=size)
        if all(racks.count(rack) <= n for rack, n in capacity.items())
    )


def coverage_bound(capacities: list[int], size: int, write_quorum: int) -> int:
    """The most racks every write set can span, by counting: a rack's k-th bookie in the
    ensemble adds the rack to at most min(WQ, E - (k-1) * WQ) more write sets; with the E
    best such gains, the write sets hold that many racks in all, and the fewest holds at
    most the average."""
    gains = [
        max(0, min(write_quorum, size - k * write_quorum))
        for capacity in capacities
        for k in range(capacity)
    ]
    return min(write_quorum, sum(sorted(gains, reverse=True)[:size]) // size)


def swapped(ensemble: list[str], position: int, bookie: str) -> list[str]:
    return [bookie if p == position else b for p, b in enumerate(ensemble)]


def expected_adherence(
    fewest: int, write_quorum: int, min_racks: int, cluster: int
) -> PlacementAdherence:
    if fewest < min(write_quorum, min_racks, cluster):
        return FAIL
    return SOFT if fewest < min(write_quorum, cluster) else STRICT


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[str, str], set[str], int, int]:
    """Up to 8 bookies on up to 4 racks, some excluded, and E <= 6 that the rest can fill."""
    rack_count = draw(st.integers(1, 4))
    count = draw(st.integers(1, 8))
    bookies = {f"b{i}": f"/zone/r{draw(st.integers(0, rack_count - 1))}" for i in range(count)}
    exclude = draw(st.sets(st.sampled_from(sorted(bookies)), max_size=count - 1))
    size = draw(st.integers(1, min(6, count - len(exclude))))
    return bookies, exclude, size, draw(st.integers(1, size))


# -- adherence -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("racks", "wq", "min_racks", "cluster", "expected"),
    [
        (["a", "a", "b"], 2, 2, 2, FAIL),  # the write set (0, 1) is all rack a
        (["a", "b", "a", "b"], 2, 2, 2, STRICT),
        (["a", "b", "a"], 3, 2, 3, SOFT),  # 3 racks in the cluster, the write set spans 2
        (["a", "b", "a"], 3, 2, 2, STRICT),  # ... but 2 is all a 2-rack cluster has
        (["a", "b", "c"], 3, 2, 3, STRICT),
        (["a", "b", "c"], 3, 2, 9, STRICT),  # WQ caps what strict asks
        (["a", "b", "c", "a"], 3, 3, 3, FAIL),  # the write set (3, 0, 1) spans a, a, b
        (["a", "b", "a", "b", "c"], 3, 2, 3, SOFT),  # (0, 1, 2) spans 2, (2, 3, 4) spans 3
        (["a", "a", "a"], 1, 2, 3, STRICT),  # with WQ = 1 one rack is all there is
        (["a", "a", "a"], 2, 2, 1, STRICT),  # a one-rack cluster: one rack is all it has
        (["a", "a", "a"], 2, 2, 2, FAIL),  # ... but a second rack in the cluster asks for 2
        (["a", "b", "a"], 2, 2, 2, FAIL),  # E=3 WQ=2 on two racks: a ring of 3 has a pair
        (["a", "a", "b"], 2, 1, 2, SOFT),  # min racks 1: never FAIL, yet not strict
        (["a", "b"], 3, 1, 2, FAIL),  # WQ larger than the ensemble holds no WQ copies
    ],
)
def test_adherence_follows_the_definition(
    racks: list[str], wq: int, min_racks: int, cluster: int, expected: PlacementAdherence
) -> None:
    assert adherence_of_racks(racks, wq, min_racks, cluster) is expected


def test_the_worst_adherence_is_the_minimum() -> None:
    assert min(STRICT, FAIL, SOFT) is FAIL
    assert sorted([STRICT, SOFT, FAIL]) == [FAIL, SOFT, STRICT]


@settings(max_examples=300)
@given(st.lists(st.sampled_from("abcd"), min_size=1, max_size=9), st.data())
def test_fewest_racks_is_that_of_the_round_robin_write_sets(
    racks: list[str], data: st.DataObject
) -> None:
    wq = data.draw(st.integers(1, len(racks)))
    assert fewest_racks_per_write_set(racks, wq) == spans(racks, wq)


@settings(max_examples=300)
@given(
    st.lists(st.sampled_from("abcd"), min_size=1, max_size=9),
    st.integers(1, 5),
    st.integers(1, 5),
    st.data(),
)
def test_adherence_is_the_quoted_rule_applied_to_the_fewest_racks(
    racks: list[str], min_racks: int, cluster: int, data: st.DataObject
) -> None:
    wq = data.draw(st.integers(1, len(racks)))
    assert adherence_of_racks(racks, wq, min_racks, cluster) is expected_adherence(
        spans(racks, wq), wq, min_racks, cluster
    )


def test_adherence_refuses_nonsense_thresholds() -> None:
    with pytest.raises(BadRequest, match="min racks must be at least 1, got 0"):
        adherence_of_racks(["a"], 1, 0, 1)
    with pytest.raises(BadRequest, match="cluster racks must be at least 1, got 0"):
        adherence_of_racks(["a"], 1, 1, 0)
    with pytest.raises(BadRequest, match="write quorum 3 does not fit an ensemble of 2"):
        fewest_racks_per_write_set(["a", "b"], 3)


def test_rack_aware_adherence_of_bookies() -> None:
    policy = RackAwarePlacementPolicy()
    racks = {"b1": "/r1", "b2": "/r2", "b3": "/r3", "b4": "/r1"}
    assert policy.adherence(("b1", "b2", "b3"), 3, racks) is STRICT
    assert policy.adherence(("b1", "b2", "b4"), 3, racks) is SOFT  # 3 racks, spans 2
    assert policy.adherence(("b1", "b2", "b4"), 3, racks, cluster_racks=2) is STRICT
    assert policy.adherence(("b1", "b4", "b2"), 2, racks) is FAIL  # b1, b4 share /r1
    assert policy.adherence(("b1", "b2", "b1", "b3"), 2, racks) is FAIL  # b1 twice
    assert policy.adherence(("b1", "b2", "b4", "b3"), 2, racks) is STRICT  # same racks
    assert policy.adherence(("b1", "b2"), 3, racks) is FAIL  # WQ does not fit


def test_bookies_without_a_rack_are_on_the_default_rack() -> None:
    policy = RackAwarePlacementPolicy()
    racks = {"b1": DEFAULT_RACK, "b2": "/r2"}
    assert policy.adherence(("b1", "ghost"), 2, racks) is FAIL  # both on /default-rack
    assert policy.adherence(("b2", "ghost"), 2, racks) is STRICT
    # the default rack is one of the cluster's racks: r2, r3, default -> 3 racks, spans 2
    placed = {"b2": "/r2", "b3": "/r3"}
    assert policy.adherence(("b2", "ghost", "x", "b3"), 3, placed) is SOFT
    assert policy.adherence(("b2", "ghost", "x", "b3"), 3, placed, cluster_racks=2) is STRICT


def test_default_policy_judges_only_distinctness() -> None:
    policy = DefaultPlacementPolicy()
    one_rack = {"b1": "/r", "b2": "/r"}
    assert policy.adherence(("b1", "b2"), 2, one_rack) is STRICT
    assert policy.adherence(("b1", "b1"), 2, one_rack) is FAIL
    assert policy.adherence(("b1", "b2"), 3, one_rack) is FAIL
    assert policy.adherence((), 1, one_rack) is FAIL


# -- new ensembles ---------------------------------------------------------------------------


POLICIES: list[PlacementPolicy] = [
    DefaultPlacementPolicy(),
    RackAwarePlacementPolicy(),
    RackAwarePlacementPolicy(3, enforce_min_num_racks_per_write_quorum=False),
]


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=100, deadline=None)
@given(clusters(), st.integers(0, 2**32))
def test_new_ensembles_are_distinct_candidates(
    policy: PlacementPolicy, case: tuple[dict[str, str], set[str], int, int], seed: int
) -> None:
    bookies, exclude, size, wq = case
    ensemble = policy.new_ensemble(size, wq, 1, bookies, exclude, random.Random(seed))
    assert len(ensemble) == size
    assert len(set(ensemble)) == size
    assert set(ensemble) <= set(bookies) - exclude


@settings(max_examples=200, deadline=None)
@given(clusters(), st.integers(0, 2**32))
def test_rack_aware_reaches_the_best_spread_of_any_ensemble(
    case: tuple[dict[str, str], set[str], int, int], seed: int
) -> None:
    bookies, exclude, size, wq = case
    policy = RackAwarePlacementPolicy()
    ensemble = policy.new_ensemble(size, wq, 1, bookies, exclude, random.Random(seed))
    best = best_spread(bookies, exclude, size, wq)
    assert spans([bookies[b] for b in ensemble], wq) == best
    cluster = len({rack for bookie, rack in bookies.items() if bookie not in exclude})
    assert policy.adherence(ensemble, wq, bookies, cluster) is expected_adherence(
        best, wq, 2, cluster
    )


@settings(max_examples=200, deadline=None)
@given(clusters(), st.integers(1, 4), st.integers(0, 2**32))
def test_enforcement_refuses_exactly_when_no_ensemble_complies(
    case: tuple[dict[str, str], set[str], int, int], min_racks: int, seed: int
) -> None:
    bookies, exclude, size, wq = case
    policy = RackAwarePlacementPolicy(min_racks, enforce_min_num_racks_per_write_quorum=True)
    cluster = len(set(bookies.values()))  # excluded bookies' racks are the cluster's too
    need = min(wq, min_racks, cluster)
    best = best_spread(bookies, exclude, size, wq)
    if best >= need:
        ensemble = policy.new_ensemble(size, wq, 1, bookies, exclude, random.Random(seed))
        racks = [bookies[b] for b in ensemble]
        assert spans(racks, wq) >= need
        assert write_sets_on_enough_racks(racks, wq, min_racks, cluster)
        assert policy.adherence(ensemble, wq, bookies) is not FAIL
    else:
        with pytest.raises(
            NotEnoughBookies,
            match=f"refusing to place unsafely.* at least {need} racks .* at most {best} racks",
        ):
            policy.new_ensemble(size, wq, 1, bookies, exclude, random.Random(seed))


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_the_coverage_bound_is_the_best_spread_on_small_clusters(
    case: tuple[dict[str, str], set[str], int, int],
) -> None:
    bookies, exclude, size, wq = case
    capacity = Counter(rack for bookie, rack in bookies.items() if bookie not in exclude)
    assert coverage_bound(list(capacity.values()), size, wq) == best_spread(
        bookies, exclude, size, wq
    )


def _medium_clusters() -> list[tuple[list[int], int, int]]:
    rng = random.Random(2024)
    cases = [([2, 3, 3], 8, 4), ([16, 13, 5, 20, 12, 9], 22, 8)]
    cases += [([20, 26, 13, 13, 21, 25, 4, 10], 27, 13), ([8, 13, 3, 19, 13, 17, 17, 26], 27, 11)]
    while len(cases) < 150:
        size = rng.randint(7, 16)
        capacities = [rng.randint(1, size) for _ in range(rng.randint(2, 6))]
        if sum(capacities) >= size:
            cases.append((capacities, size, rng.randint(2, min(size, 6))))
    return cases


def test_rack_aware_reaches_the_coverage_bound_on_larger_clusters() -> None:
    """Beyond brute force: the bound is an upper bound, so reaching it is the best."""
    policy = RackAwarePlacementPolicy()
    for capacities, size, wq in _medium_clusters():
        bookies = {f"r{r}-{i}": f"/r{r}" for r, n in enumerate(capacities) for i in range(n)}
        for seed in range(3):
            ensemble = policy.new_ensemble(size, wq, 1, bookies, (), random.Random(seed))
            got = fewest_racks_per_write_set([bookies[b] for b in ensemble], wq)
            assert got == coverage_bound(capacities, size, wq), (capacities, size, wq, seed)


@pytest.mark.parametrize(
    ("capacities", "size", "wq", "min_racks", "bound"),
    [
        ([2, 2], 3, 2, 2, 1),  # three positions in a ring on two racks: two neighbours share
        ([4, 1, 1], 5, 3, 3, 2),
        ([1, 1, 1, 9], 6, 3, 3, 2),
        ([4, 1], 4, 2, 2, 1),  # one bookie of /r1 parts one pair of /r0's four, not two
    ],
)
def test_refusals_name_the_most_racks_the_cluster_allows(
    capacities: list[int], size: int, wq: int, min_racks: int, bound: int
) -> None:
    bookies = {f"r{r}-{i}": f"/r{r}" for r, n in enumerate(capacities) for i in range(n)}
    assert coverage_bound(capacities, size, wq) == bound
    assert best_spread(bookies, set(), size, wq) == bound
    with pytest.raises(NotEnoughBookies, match=f"allow at most {bound} racks per write set"):
        RackAwarePlacementPolicy(min_racks, True).new_ensemble(
            size, wq, 1, bookies, (), random.Random(0)
        )


def test_enforcement_refuses_when_no_layout_reaches_what_the_bound_allows() -> None:
    # A cluster where the layouts fall one short of the bound (E=26 WQ=4): 3 racks per
    # write set may be possible, 2 is what is found; refusing is the safe answer.
    capacities = [3, 5, 7, 23]
    bookies = {f"r{r}-{i}": f"/r{r}" for r, n in enumerate(capacities) for i in range(n)}
    assert coverage_bound(capacities, 26, 4) == 3
    with pytest.raises(
        NotEnoughBookies,
        match="may allow up to 3 racks per write set, and 8 layouts reached only 2",
    ):
        RackAwarePlacementPolicy(3, True).new_ensemble(26, 4, 2, bookies, (), random.Random(0))
    ensemble = RackAwarePlacementPolicy(3).new_ensemble(26, 4, 2, bookies, (), random.Random(0))
    assert fewest_racks_per_write_set([bookies[b] for b in ensemble], 4) == 2


def test_without_enforcement_a_one_rack_cluster_gets_its_best_and_the_truth() -> None:
    bookies = {f"b{i}": "/r1" for i in range(5)} | {"b5": "/r2"}
    policy = RackAwarePlacementPolicy()
    ensemble = policy.new_ensemble(5, 3, 2, bookies, (), random.Random(3))
    assert spans([bookies[b] for b in ensemble], 3) == 1  # 4 of 5 on /r1: some set is all /r1
    assert policy.adherence(ensemble, 3, bookies) is FAIL
    with pytest.raises(
        NotEnoughBookies,
        match=r"E=5 WQ=3 needs every write set on at least 2 racks .*"
        r"the 6 candidate bookies on 2 rack\(s\) allow at most 1",
    ):
        RackAwarePlacementPolicy(2, True).new_ensemble(5, 3, 2, bookies, (), random.Random(3))


def test_a_spread_that_needs_uneven_spacing_is_found() -> None:
    # E=5 WQ=3 from 4 bookies on /a and one each on /b and /c: only /a three times, never
    # three in a row (a b a c a), puts 2 racks in every write set; 3 racks cannot be had.
    bookies = {"a1": "/a", "a2": "/a", "a3": "/a", "a4": "/a", "b1": "/b", "c1": "/c"}
    assert best_spread(bookies, set(), 5, 3) == 2
    for seed in range(30):
        ensemble = RackAwarePlacementPolicy(2, True).new_ensemble(
            5, 3, 2, bookies, (), random.Random(seed)
        )
        assert spans([bookies[b] for b in ensemble], 3) == 2
    with pytest.raises(NotEnoughBookies, match="allow at most 2 racks per write set"):
        RackAwarePlacementPolicy(3, True).new_ensemble(5, 3, 2, bookies, (), random.Random(0))


@pytest.mark.parametrize("policy", POLICIES)
def test_seeded_choices_repeat_whatever_the_order_of_the_inputs(policy: PlacementPolicy) -> None:
    bookies = {f"b{i}": f"/r{i % 3}" for i in range(12)}
    shuffled = dict(reversed(list(bookies.items())))
    first = policy.new_ensemble(5, 3, 2, bookies, {"b1", "b7"}, random.Random(7))
    assert first == policy.new_ensemble(5, 3, 2, shuffled, ["b7", "b1"], random.Random(7))
    seen = {policy.new_ensemble(5, 3, 2, bookies, (), random.Random(s)) for s in range(20)}
    assert len(seen) > 1


def test_positions_are_not_tied_to_rack_names() -> None:
    bookies = {"a": "/a", "b": "/b", "c": "/c"}
    orders = {
        RackAwarePlacementPolicy().new_ensemble(3, 2, 2, bookies, (), random.Random(seed))
        for seed in range(50)
    }
    assert {ensemble[0] for ensemble in orders} == {"a", "b", "c"}


def test_every_candidate_gets_chosen_sometimes() -> None:
    bookies = {f"b{i}": f"/r{i % 3}" for i in range(9)} | {"lonely": "/r3"}
    chosen: Counter[str] = Counter()
    for seed in range(300):
        chosen.update(
            RackAwarePlacementPolicy().new_ensemble(3, 3, 2, bookies, (), random.Random(seed))
        )
    assert set(chosen) == set(bookies)


@pytest.mark.parametrize("policy", POLICIES)
def test_bad_sizes_and_too_few_candidates(policy: PlacementPolicy) -> None:
    bookies = {"a": "/r1", "b": "/r2", "c": "/r2", "d": "/r3"}
    with pytest.raises(
        NotEnoughBookies,
        match=r"need 4 bookies for an ensemble \(E=4 WQ=2 AQ=2\) but only 3 are candidates, "
        r"on 2 rack\(s\): 4 known, 1 of them excluded",
    ):
        policy.new_ensemble(4, 2, 2, bookies, {"d", "not-a-bookie"}, random.Random(0))
    with pytest.raises(BadRequest, match="E=2 WQ=3 AQ=1"):
        policy.new_ensemble(2, 3, 1, bookies, (), random.Random(0))
    with pytest.raises(BadRequest, match="E=3 WQ=2 AQ=3"):
        policy.new_ensemble(3, 2, 3, bookies, (), random.Random(0))
    with pytest.raises(BadRequest, match=r"position 3 is outside the ensemble 0\.\.2"):
        policy.replace_positions(("a", "b", "c"), [3], 2, bookies, (), random.Random(0))
    with pytest.raises(BadRequest, match=r"positions \[1, 1\] name a position twice"):
        policy.replace_positions(("a", "b", "c"), [1, 1], 2, bookies, (), random.Random(0))
    with pytest.raises(BadRequest, match="E=3 WQ=4"):
        policy.replace_positions(("a", "b", "c"), [0], 4, bookies, (), random.Random(0))
    with pytest.raises(
        NotEnoughBookies,
        match=r"no bookies can replace \['b'\] at position\(s\) \[1\] of \['a', 'b', 'c'\]: "
        r"0 candidate\(s\) for 1 position\(s\)",
    ):
        policy.replace_positions(("a", "b", "c"), [1], 2, bookies, {"d"}, random.Random(0))
    with pytest.raises(NotEnoughBookies, match=r"1 candidate\(s\) for 2 position\(s\)"):
        policy.replace_positions(("a", "b", "c"), [0, 2], 2, bookies, (), random.Random(0))
    assert policy.replace_positions(("a", "b"), [], 2, bookies, (), random.Random(0)) == ("a", "b")


@pytest.mark.parametrize("value", [0, -1, True, 2.0])
def test_min_racks_must_be_a_positive_int(value: object) -> None:
    with pytest.raises(BadRequest, match="min_num_racks_per_write_quorum must be an int >= 1"):
        RackAwarePlacementPolicy(value)  # type: ignore[arg-type]


# -- the rule --------------------------------------------------------------------------------


@settings(max_examples=300)
@given(
    st.lists(st.sampled_from("abcd"), min_size=1, max_size=9),
    st.integers(1, 5),
    st.integers(1, 5),
    st.data(),
)
def test_the_rule_enforced_is_the_rule_the_audit_checks(
    racks: list[str], min_racks: int, cluster: int, data: st.DataObject
) -> None:
    wq = data.draw(st.integers(1, len(racks)))
    through = data.draw(st.sets(st.integers(0, len(racks) - 1)))
    keeps = write_sets_on_enough_racks(racks, wq, min_racks, cluster)
    assert keeps == (spans(racks, wq) >= min(wq, min_racks, cluster))
    assert keeps == (adherence_of_racks(racks, wq, min_racks, cluster) is not FAIL)
    assert racks_required(wq, min_racks, cluster) == min(wq, min_racks, cluster)
    assert fewest_racks_per_write_set(racks, wq, through) == spans(racks, wq, through)
    assert write_sets_on_enough_racks(racks, wq, min_racks, cluster, through) == (
        spans(racks, wq, through) >= min(wq, min_racks, cluster)
    )


def test_three_positions_on_two_racks_always_put_a_write_set_of_two_on_one_rack() -> None:
    for racks in itertools.product("ab", repeat=3):
        assert not write_sets_on_enough_racks(list(racks), 2, 2, 2), racks
    assert write_sets_on_enough_racks(["a", "b", "a", "b"], 2, 2, 2)
    assert write_sets_on_enough_racks(["a", "a", "a"], 2, 2, 1), "one rack is all it has"


def test_e3_wq2_on_two_racks_is_refused_naming_the_racks_and_what_it_needs() -> None:
    bookies = {"b1": "/zone-1/rack-1", "b2": "/zone-1/rack-2", "b3": "/zone-1/rack-1"}
    enforced = RackAwarePlacementPolicy(2, enforce_min_num_racks_per_write_quorum=True)
    with pytest.raises(NotEnoughBookies) as refused:
        enforced.new_ensemble(3, 2, 2, bookies, (), random.Random(0))
    message = str(refused.value)
    assert message.startswith(
        "refusing to place unsafely: E=3 WQ=2 needs every write set on at least 2 racks "
        "(the least of WQ=2, min_num_racks_per_write_quorum=2 and the 2 racks of the cluster"
    )
    assert "allow at most 1 racks per write set" in message
    assert (
        "Racks and their candidate bookies: /zone-1/rack-1: b1, b3; /zone-1/rack-2: b2."
    ) in message
    assert "enforce_min_num_racks_per_write_quorum = false" in message
    # Without enforcement the same cluster gets its best, which the audit calls a failure.
    free = RackAwarePlacementPolicy(2)
    ensemble = free.new_ensemble(3, 2, 2, bookies, (), random.Random(0))
    assert free.adherence(ensemble, 2, bookies) is FAIL
    # WQ=3 puts both racks in its one write set.
    assert (
        enforced.adherence(
            enforced.new_ensemble(3, 3, 2, bookies, (), random.Random(0)), 3, bookies
        )
        is STRICT
    )


def test_a_rack_whose_bookies_are_all_excluded_is_still_the_clusters() -> None:
    # b2 is read-only: /r2 is a rack of the cluster, so E=2 WQ=2 on /r1 alone breaks the rule.
    bookies = {"b1": "/r1", "b2": "/r2", "b3": "/r1"}
    enforced = RackAwarePlacementPolicy(2, enforce_min_num_racks_per_write_quorum=True)
    with pytest.raises(NotEnoughBookies, match="/r1: b1, b3; /r2: no candidate"):
        enforced.new_ensemble(2, 2, 2, bookies, {"b2"}, random.Random(0))
    assert set(
        enforced.new_ensemble(2, 2, 2, bookies, {"b2"}, random.Random(0), cluster_racks=1)
    ) == {"b1", "b3"}


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.sampled_from([DEFAULT_RACK, "/r1"]), st.data())
def test_a_cluster_on_one_rack_is_never_refused(count: int, rack: str, data: st.DataObject) -> None:
    bookies = {f"b{i}": rack for i in range(count)}
    size = data.draw(st.integers(1, count))
    wq = data.draw(st.integers(1, size))
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    policy = RackAwarePlacementPolicy(data.draw(st.integers(1, 4)), True)
    ensemble = policy.new_ensemble(size, wq, 1, bookies, (), rng)
    assert policy.adherence(ensemble, wq, bookies) is STRICT
    spare = count - size
    positions = data.draw(st.sets(st.integers(0, size - 1), max_size=spare))
    replaced = policy.replace_positions(ensemble, positions, wq, bookies, (), rng)
    assert policy.adherence(replaced, wq, bookies) is STRICT


# -- replacements ----------------------------------------------------------------------------


Replacement = tuple[dict[str, str], set[str], list[str], set[int], int]


@st.composite
def replacements(draw: st.DrawFn) -> Replacement:
    """An ensemble of a small cluster (its bookies possibly excluded since), and positions."""
    bookies, exclude, size, wq = draw(clusters())
    rng = random.Random(draw(st.integers(0, 2**32)))
    ensemble = list(DefaultPlacementPolicy().new_ensemble(size, wq, 1, bookies, set(), rng))
    positions = draw(st.sets(st.integers(0, size - 1), min_size=1))
    return bookies, exclude, ensemble, positions, wq


def best_replacement(
    bookies: dict[str, str], exclude: set[str], ensemble: list[str], positions: set[int], wq: int
) -> int | None:
    """The best `spans` through `positions` of any racks the candidates can put there."""
    capacity = Counter(
        rack for bookie, rack in bookies.items() if bookie not in exclude | set(ensemble)
    )
    order = sorted(positions)
    best = None
    for choice in itertools.product(sorted(capacity), repeat=len(order)):
        if any(choice.count(rack) > n for rack, n in capacity.items()):
            continue
        racks = [bookies[b] for b in ensemble]
        for position, rack in zip(order, choice, strict=True):
            racks[position] = rack
        best = max(best or 0, spans(racks, wq, positions))
    return best


def check_replaced(case: Replacement, replaced: tuple[str, ...]) -> list[str]:
    """The racks of a valid replacement: new distinct candidates at `positions` only."""
    bookies, exclude, ensemble, positions, _ = case
    assert len(replaced) == len(ensemble)
    assert len(set(replaced)) == len(replaced)
    for position, (old, new) in enumerate(zip(ensemble, replaced, strict=True)):
        if position in positions:
            assert new in bookies
            assert new not in ensemble
            assert new not in exclude
        else:
            assert new == old
    return [bookies[b] for b in replaced]


@settings(max_examples=300, deadline=None)
@given(replacements(), st.integers(1, 4), st.integers(0, 2**32))
def test_enforced_replacement_refuses_exactly_when_no_choice_keeps_the_rule(
    case: Replacement, min_racks: int, seed: int
) -> None:
    bookies, exclude, ensemble, positions, wq = case
    policy = RackAwarePlacementPolicy(min_racks, enforce_min_num_racks_per_write_quorum=True)
    need = min(wq, min_racks, len(set(bookies.values())))
    best = best_replacement(bookies, exclude, ensemble, positions, wq)
    rng = random.Random(seed)
    if best is None:
        with pytest.raises(NotEnoughBookies, match="no bookies can replace"):
            policy.replace_positions(ensemble, positions, wq, bookies, exclude, rng)
    elif best >= need:
        replaced = policy.replace_positions(ensemble, positions, wq, bookies, exclude, rng)
        racks = check_replaced(case, replaced)
        assert write_sets_on_enough_racks(
            racks, wq, min_racks, len(set(bookies.values())), positions
        )
    else:
        with pytest.raises(NotEnoughBookies, match="refusing to place unsafely"):
            policy.replace_positions(ensemble, positions, wq, bookies, exclude, rng)


@settings(max_examples=300, deadline=None)
@given(replacements(), st.integers(1, 4), st.integers(0, 2**32))
def test_replacement_without_enforcement_keeps_the_rule_when_it_can(
    case: Replacement, min_racks: int, seed: int
) -> None:
    bookies, exclude, ensemble, positions, wq = case
    policy = RackAwarePlacementPolicy(min_racks)
    best = best_replacement(bookies, exclude, ensemble, positions, wq)
    if best is None:
        return
    replaced = policy.replace_positions(
        ensemble, positions, wq, bookies, exclude, random.Random(seed)
    )
    racks = check_replaced(case, replaced)
    need = min(wq, min_racks, len(set(bookies.values())))
    assert spans(racks, wq, positions) >= min(need, best)
    if len(positions) == 1:  # one position: the best rack there is
        assert spans(racks, wq, positions) == best


@settings(max_examples=200, deadline=None)
@given(replacements(), st.integers(0, 2**32))
def test_default_policy_replaces_with_any_distinct_candidates(case: Replacement, seed: int) -> None:
    bookies, exclude, ensemble, positions, wq = case
    if best_replacement(bookies, exclude, ensemble, positions, wq) is None:
        return
    replaced = DefaultPlacementPolicy().replace_positions(
        ensemble, positions, wq, bookies, exclude, random.Random(seed)
    )
    check_replaced(case, replaced)


@settings(max_examples=200, deadline=None)
@given(clusters(), st.integers(0, 2**32), st.data())
def test_replacement_is_the_best_for_its_position_and_never_barred(
    case: tuple[dict[str, str], set[str], int, int], seed: int, data: st.DataObject
) -> None:
    bookies, exclude, size, wq = case
    rng = random.Random(seed)
    ensemble = list(DefaultPlacementPolicy().new_ensemble(size, wq, 1, bookies, set(), rng))
    position = data.draw(st.integers(0, size - 1))
    others = [b for b in bookies if b not in ensemble and b not in exclude]
    policy = RackAwarePlacementPolicy(data.draw(st.integers(1, 4)))
    if not others:
        with pytest.raises(NotEnoughBookies):
            policy.replace_positions(ensemble, [position], wq, bookies, exclude, rng)
        return
    choice = policy.replace_positions(ensemble, [position], wq, bookies, exclude, rng)[position]
    assert choice in others

    def with_(bookie: str) -> list[str]:
        return [bookies[b] for b in swapped(ensemble, position, bookie)]

    def judged(bookie: str) -> PlacementAdherence:
        trial = swapped(ensemble, position, bookie)
        return policy.adherence(trial, wq, bookies, cluster_racks=len(set(bookies.values())))

    best = max(spans(with_(b), wq, [position]) for b in others)
    assert spans(with_(choice), wq, [position]) == best
    assert judged(choice) == max(judged(b) for b in others)


def test_replacement_counts_unknown_ensemble_bookies_on_the_default_rack() -> None:
    bookies = {"d1": DEFAULT_RACK, "r1": "/r1", "b": "/r2"}
    policy = RackAwarePlacementPolicy(2, enforce_min_num_racks_per_write_quorum=True)
    for seed in range(20):
        # "ghost" (gone from the registry) stands on /default-rack, so d1 next to it is no use
        replaced = policy.replace_positions(
            ("ghost", "failed"), [1], 2, bookies, (), random.Random(seed)
        )
        assert replaced[0] == "ghost"
        assert replaced[1] in {"r1", "b"}
    with pytest.raises(
        NotEnoughBookies,
        match=r"no candidates for position\(s\) \[1\] of \['ghost', 'failed'\] put the write "
        r"sets through them on more than 1 racks\. Racks and their candidate bookies: "
        r"/default-rack: d1; /r1: no candidate; /r2: no candidate",
    ):
        policy.replace_positions(
            ("ghost", "failed"), [1], 2, bookies, {"r1", "b"}, random.Random(0)
        )


def test_replacement_draws_every_bookie_of_the_best_racks() -> None:
    bookies = {"a": "/r1", "b": "/r2", "c": "/r3", "d": "/r3", "e": "/r1"}
    picks = {
        RackAwarePlacementPolicy().replace_positions(
            ("a", "b"), [1], 2, bookies, (), random.Random(s)
        )[1]
        for s in range(100)
    }
    assert picks == {"c", "d"}  # e would put both copies on /r1, as a is


def test_positions_replaced_together_are_placed_together() -> None:
    # Both bookies of /r2 failed, at positions 1 and 3 of E=4 WQ=2, between bookies of /r1:
    # both new bookies must come from /r3, as f of /r1 would share a write set with a or c.
    bookies = {"a": "/r1", "x": "/r2", "c": "/r1", "y": "/r2", "d": "/r3", "e": "/r3", "f": "/r1"}
    policy = RackAwarePlacementPolicy(2, enforce_min_num_racks_per_write_quorum=True)
    for seed in range(30):
        replaced = policy.replace_positions(
            ("a", "x", "c", "y"), [1, 3], 2, bookies, {"x", "y"}, random.Random(seed)
        )
        assert replaced[0::2] == ("a", "c")
        assert {replaced[1], replaced[3]} == {"d", "e"}
        assert write_sets_on_enough_racks([bookies[b] for b in replaced], 2, 2, 3)


def test_a_choice_position_by_position_that_falls_short_is_searched_past() -> None:
    # E=6 WQ=3, positions 3 and 4 to fill beside four bookies of /r1 and one of /r0, from
    # one candidate of /r0 and two of /r1. Position 3 alone is best served by /r0, which then
    # leaves the write set (4, 5, 0) all /r1; only /r1 at 3 and /r0 at 4 keeps the rule.
    bookies = {"a": "/r1", "b": "/r0", "c": "/r1", "d": "/r1", "e": "/r1", "f": "/r1"}
    bookies |= {"g": "/r0", "h": "/r1", "i": "/r1"}
    ensemble = ("a", "b", "c", "d", "e", "f")
    policy = RackAwarePlacementPolicy(2, enforce_min_num_racks_per_write_quorum=True)
    for seed in range(20):
        replaced = policy.replace_positions(
            ensemble, [3, 4], 3, bookies, {"d", "e"}, random.Random(seed)
        )
        assert replaced[3] in {"h", "i"}
        assert replaced[4] == "g"
        assert write_sets_on_enough_racks([bookies[b] for b in replaced], 3, 2, 2)


def test_crowded_bookies_are_those_sharing_a_rack_within_a_write_set() -> None:
    racks = {"b1": "/r1", "b2": "/r1", "b3": "/r2", "b4": "/r2"}
    assert crowded_bookies(("b1", "b2"), 2, racks) == {"b2"}
    assert crowded_bookies(("b1", "b3", "b2", "b4"), 2, racks) == set()
    assert crowded_bookies(("b1", "b2", "b3", "b4"), 2, racks) == {"b2", "b4"}
    assert crowded_bookies(("b1", "b3"), 2, {}) == {"b3"}, "both on the default rack"


def test_a_quarantine_lapses_and_never_blocks_a_choice() -> None:
    quarantine = BookieQuarantine(seconds=10.0)
    quarantine.add("b1", now=100.0)
    quarantine.add("b2", now=105.0)
    assert quarantine.active(109.0) == {"b1", "b2"}
    assert quarantine.active(110.0) == {"b2"}
    assert quarantine.active(115.0) == frozenset()
    policy = DefaultPlacementPolicy()
    racks = dict.fromkeys(("b1", "b2", "b3", "b4"), DEFAULT_RACK)
    rng = random.Random(1)
    for _ in range(20):
        chosen = preferring_healthy(
            lambda avoid: policy.new_ensemble(2, 2, 2, racks, avoid, rng), frozenset({"b1"})
        )
        assert "b1" not in chosen
    # Too few bookies out of quarantine: the quarantined ones are used rather than fail.
    crowded = preferring_healthy(
        lambda avoid: policy.new_ensemble(4, 2, 2, racks, avoid, rng), frozenset({"b1"})
    )
    assert sorted(crowded) == ["b1", "b2", "b3", "b4"]


def test_worst_segments_skips_empty_segments_and_collects_ties() -> None:
    policy = RackAwarePlacementPolicy()
    racks = {"b1": "/r1", "b2": "/r1", "b3": "/r2", "b4": "/r2"}
    crowded, spread = ("b1", "b2"), ("b1", "b3")
    assert worst_segments(policy, [(spread, True), (spread, True)], 2, racks, 2) == (
        PlacementAdherence.MEETS_STRICT,
        [],
    )
    worst, indexes = worst_segments(
        policy, [(crowded, True), (spread, True), (crowded, True), (crowded, False)], 2, racks, 2
    )
    assert worst is PlacementAdherence.FAIL
    assert indexes == [0, 2], "the empty trailing segment stores nothing: not judged"
