"""Placement policies: ensembles meet the policy whenever the cluster allows it."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.errors import BadRequest, NotEnoughBookies
from tally.core.placement import (
    DefaultPlacementPolicy,
    PlacementAdherence,
    RackAwarePlacementPolicy,
    adherence_of_racks,
    fewest_racks_per_write_set,
)

FAIL, SOFT, STRICT = (
    PlacementAdherence.FAIL,
    PlacementAdherence.MEETS_SOFT,
    PlacementAdherence.MEETS_STRICT,
)


@pytest.mark.parametrize(
    ("racks", "wq", "min_racks", "cluster", "expected"),
    [
        (["a", "a", "b"], 2, 2, 2, FAIL),  # write set (0, 1) is all rack a
        (["a", "b", "a", "b"], 2, 2, 2, STRICT),
        (["a", "b", "a"], 3, 2, 3, SOFT),  # 3 racks exist, a write set spans 2
        (["a", "b", "c"], 3, 2, 3, STRICT),
        (["a", "a", "a"], 1, 2, 3, STRICT),  # WQ=1: one rack is all a write set can span
        (["a", "b", "c", "a"], 3, 3, 3, FAIL),  # window (3, 0, 1) spans a, a, b
    ],
)
def test_adherence_follows_the_definition(
    racks: list[str], wq: int, min_racks: int, cluster: int, expected: PlacementAdherence
) -> None:
    assert adherence_of_racks(racks, wq, min_racks, cluster) is expected


def test_worst_adherence_is_the_minimum() -> None:
    assert min(STRICT, FAIL, SOFT) is FAIL


def _cluster(draw: st.DrawFn) -> dict[str, str]:
    count = draw(st.integers(1, 8))
    rack_count = draw(st.integers(1, 4))
    return {f"b{i}": f"/r{draw(st.integers(0, rack_count - 1))}" for i in range(count)}


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[str, str], int, int]:
    bookies = _cluster(draw)
    e = draw(st.integers(1, len(bookies)))
    wq = draw(st.integers(1, e))
    return bookies, e, wq


def _best_possible(bookies: dict[str, str], e: int, wq: int) -> int:
    return max(
        fewest_racks_per_write_set([bookies[b] for b in ensemble], wq)
        for ensemble in itertools.permutations(bookies, e)
    )


@settings(max_examples=150, deadline=None)
@given(clusters(), st.integers(0, 2**32))
def test_rack_aware_reaches_the_best_placement_the_cluster_allows(
    case: tuple[dict[str, str], int, int], seed: int
) -> None:
    bookies, e, wq = case
    policy = RackAwarePlacementPolicy(min_num_racks_per_write_quorum=wq)
    ensemble = policy.new_ensemble(e, wq, 1, bookies, (), random.Random(seed))
    assert len(set(ensemble)) == e
    got = fewest_racks_per_write_set([bookies[b] for b in ensemble], wq)
    assert got == _best_possible(bookies, e, wq)


@settings(max_examples=100, deadline=None)
@given(clusters(), st.integers(0, 2**32))
def test_enforcement_refuses_exactly_when_the_cluster_cannot_comply(
    case: tuple[dict[str, str], int, int], seed: int
) -> None:
    bookies, e, wq = case
    policy = RackAwarePlacementPolicy(2, enforce_min_num_racks_per_write_quorum=True)
    possible = _best_possible(bookies, e, wq) >= min(wq, 2)
    if possible:
        ensemble = policy.new_ensemble(e, wq, 1, bookies, (), random.Random(seed))
        assert policy.adherence(ensemble, wq, bookies) is not FAIL
    else:
        with pytest.raises(NotEnoughBookies, match="refuses to place unsafely"):
            policy.new_ensemble(e, wq, 1, bookies, (), random.Random(seed))


@settings(max_examples=100, deadline=None)
@given(clusters(), st.integers(0, 2**32), st.data())
def test_replacement_is_the_best_for_its_position_and_never_excluded(
    case: tuple[dict[str, str], int, int], seed: int, data: st.DataObject
) -> None:
    bookies, e, wq = case
    if len(bookies) == e:
        return
    rng = random.Random(seed)
    policy = RackAwarePlacementPolicy(2)
    ensemble = DefaultPlacementPolicy().new_ensemble(e, wq, 1, bookies, (), rng)
    position = data.draw(st.integers(0, e - 1))
    choice = policy.replace_bookie(ensemble, position, wq, bookies, (), rng)
    assert choice not in ensemble

    def fewest(bookie: str) -> int:
        trial = [bookies[b] for b in ensemble]
        trial[position] = bookies[bookie]
        return fewest_racks_per_write_set(trial, wq)

    others = [b for b in bookies if b not in ensemble]
    assert fewest(choice) == max(fewest(b) for b in others)


def test_default_policy_picks_distinct_unexcluded_bookies() -> None:
    bookies = {f"b{i}": "/r" for i in range(6)}
    policy = DefaultPlacementPolicy()
    for seed in range(50):
        ensemble = policy.new_ensemble(3, 2, 2, bookies, {"b0", "b1"}, random.Random(seed))
        assert len(set(ensemble)) == 3
        assert not {"b0", "b1"} & set(ensemble)
    replacement = policy.replace_bookie(("b2", "b3", "b4"), 1, 2, bookies, {"b5"}, random.Random(1))
    assert replacement in {"b0", "b1"}
    assert policy.adherence(("b2", "b3"), 2, bookies) is STRICT
    assert policy.adherence(("b2", "b2"), 2, bookies) is FAIL


def test_too_few_bookies_is_not_enough_bookies() -> None:
    bookies = {"a": "/r1", "b": "/r2"}
    with pytest.raises(NotEnoughBookies, match="2 available"):
        DefaultPlacementPolicy().new_ensemble(3, 2, 2, bookies, (), random.Random(0))
    with pytest.raises(NotEnoughBookies, match="no writable bookie"):
        DefaultPlacementPolicy().replace_bookie(("a", "b"), 0, 2, bookies, (), random.Random(0))
    with pytest.raises(BadRequest):
        DefaultPlacementPolicy().new_ensemble(2, 3, 1, bookies, (), random.Random(0))


def test_seeded_choices_repeat() -> None:
    bookies = {f"b{i}": f"/r{i % 3}" for i in range(9)}
    policy = RackAwarePlacementPolicy()
    first = policy.new_ensemble(5, 3, 2, bookies, (), random.Random(7))
    assert first == policy.new_ensemble(5, 3, 2, bookies, (), random.Random(7))
