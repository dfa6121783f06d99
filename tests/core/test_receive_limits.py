"""The receive budget shared by a bookie's connections, and the stall clock of one of them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.core.errors import BadRequest
from tally.core.receive_limits import ReceiveBudget, ReceiveProgress

LIMIT = 100


def test_frames_that_fit_are_held_at_once_and_their_room_comes_back() -> None:
    budget: ReceiveBudget[str] = ReceiveBudget(LIMIT)
    assert budget.hold("a", 60)
    assert budget.hold("b", 40)
    assert (budget.held, budget.waiting) == (100, 0)
    assert budget.hold("a", 10)  # a's frame is done and the next one begun
    assert budget.hold("b", 0)
    assert (budget.held, budget.waiting) == (10, 0)
    budget.release("a")
    assert budget.held == 0


def test_a_frame_without_room_waits_until_room_is_freed() -> None:
    budget: ReceiveBudget[str] = ReceiveBudget(LIMIT)
    assert budget.hold("a", 70)
    assert not budget.hold("b", 50)
    assert (budget.held, budget.waiting) == (70, 1)
    assert budget.admit() == []
    assert budget.hold("a", 0)
    assert budget.admit() == ["b"]
    assert (budget.held, budget.waiting) == (50, 0)


def test_waiters_take_their_turns_in_order_even_when_a_later_one_would_fit() -> None:
    budget: ReceiveBudget[str] = ReceiveBudget(LIMIT)
    assert budget.hold("a", 60)
    assert not budget.hold("large", 100)
    assert not budget.hold("small", 1)  # it would fit, but "large" came first
    assert budget.admit() == []
    budget.release("a")
    assert budget.admit() == ["large"]
    assert budget.hold("large", 0)
    assert budget.admit() == ["small"]


def test_a_connection_that_is_done_with_a_frame_queues_behind_the_waiters_for_its_next() -> None:
    budget: ReceiveBudget[str] = ReceiveBudget(LIMIT)
    assert budget.hold("a", 80)
    assert not budget.hold("b", 50)
    assert not budget.hold("a", 30)  # a gave its 80 back; b asked first
    assert budget.admit() == ["b", "a"]
    assert (budget.held, budget.waiting) == (80, 0)


def test_a_waiter_that_goes_away_leaves_the_queue() -> None:
    budget: ReceiveBudget[str] = ReceiveBudget(LIMIT)
    assert budget.hold("a", 100)
    assert not budget.hold("b", 100)
    assert not budget.hold("c", 10)
    budget.release("b")
    assert budget.waiting == 1
    budget.release("a")
    assert budget.admit() == ["c"]


def test_a_frame_larger_than_the_budget_and_an_empty_budget_are_refused() -> None:
    with pytest.raises(BadRequest, match="holds nothing"):
        ReceiveBudget[str](0)
    with pytest.raises(BadRequest, match="does not fit a budget of 100"):
        ReceiveBudget[str](LIMIT).hold("a", LIMIT + 1)


owners = st.sampled_from("abcdef")
steps = st.lists(
    st.one_of(
        st.tuples(st.just("hold"), owners, st.integers(0, LIMIT)),
        st.tuples(st.just("release"), owners, st.just(0)),
    ),
    max_size=60,
)


@given(steps)
def test_the_budget_is_never_exceeded_and_every_waiter_gets_its_turn(
    script: list[tuple[str, str, int]],
) -> None:
    """Connections ask and give back room as the bookie's do (asking only while read, then
    letting the budget admit waiters); once the frames being received finish, every waiter
    holds its frame in turn, in the order they asked: nobody waits forever."""
    budget: ReceiveBudget[str] = ReceiveBudget(LIMIT)
    holding: dict[str, int] = {}
    waiting: dict[str, int] = {}

    def admit() -> None:
        admitted = budget.admit()
        assert admitted == list(waiting)[: len(admitted)]
        for owner in admitted:
            holding[owner] = waiting.pop(owner)
        assert budget.held == sum(holding.values()) <= LIMIT
        assert budget.waiting == len(waiting)
        if waiting:  # whoever waits first does not fit
            assert budget.held + next(iter(waiting.values())) > LIMIT

    for action, owner, size in script:
        if action == "release":
            budget.release(owner)
            holding.pop(owner, None)
            waiting.pop(owner, None)
        elif owner not in waiting:  # a connection waiting for the budget is not read
            holding.pop(owner, None)
            if budget.hold(owner, size):
                if size:
                    holding[owner] = size
            else:
                waiting[owner] = size
        admit()

    order = list(waiting)
    served: list[str] = []
    while holding:  # each frame being received completes, and the next waiters get room
        done = next(iter(holding))
        assert budget.hold(done, 0)
        del holding[done]
        before = list(waiting)
        admit()
        served += [owner for owner in before if owner not in waiting]
    assert served == order
    assert (budget.held, budget.waiting) == (0, 0)


def test_an_unfinished_frame_stalls_after_the_timeout_without_a_byte() -> None:
    progress = ReceiveProgress()
    progress.received(10.0, unfinished=True)
    assert not progress.stalled(14.9, timeout=5.0)
    assert progress.stalled(15.0, timeout=5.0)
    progress.received(15.0, unfinished=True)  # a byte more: the clock starts again
    assert not progress.stalled(19.0, timeout=5.0)


def test_a_connection_between_frames_never_stalls() -> None:
    progress = ReceiveProgress()
    assert not progress.stalled(1e9, timeout=5.0)
    progress.received(10.0, unfinished=False)
    assert not progress.stalled(1e9, timeout=5.0)


def test_time_waiting_for_the_budget_does_not_count() -> None:
    progress = ReceiveProgress()
    progress.received(10.0, unfinished=True)
    progress.paused()
    assert not progress.stalled(100.0, timeout=5.0)
    progress.resumed(100.0)
    assert not progress.stalled(104.0, timeout=5.0)
    assert progress.stalled(105.0, timeout=5.0)
