"""The receive arena pool. An arena is free when only the pool refers to it, so each test
drops its own references (keeping ids) before it asks for one again."""

from __future__ import annotations

import pytest

from tally.core.errors import BadRequest
from tally.core.receive_arenas import DEFAULT_ARENA_SIZE, MIN_RECEIVE, ReceiveArenas

SIZE = 2 * MIN_RECEIVE


def retire(arenas: ReceiveArenas, count: int = 1) -> list[int]:
    """Take `count` arenas and give them back, in order; their ids."""
    taken = [arenas.take(SIZE) for _ in range(count)]
    for arena in taken:
        arenas.give_back(arena)
    return [id(arena) for arena in taken]


def test_a_retired_arena_nobody_views_is_taken_again() -> None:
    arenas = ReceiveArenas(SIZE)
    [first] = retire(arenas)
    assert arenas.waiting == 1
    assert id(arenas.take(SIZE)) == first
    assert arenas.waiting == 0


def test_an_arena_is_not_taken_while_a_view_of_it_lives() -> None:
    arenas = ReceiveArenas(SIZE)
    arena = arenas.take(SIZE)
    base = memoryview(arena)
    kept = base[10:20]  # what a decoded message holds
    base.release()
    arenas.give_back(arena)
    retired = id(arena)
    del arena
    assert id(arenas.take(SIZE)) != retired
    assert arenas.waiting == 1
    del kept
    assert id(arenas.take(SIZE)) == retired


def test_a_view_of_a_view_keeps_the_arena_too() -> None:
    arenas = ReceiveArenas(SIZE)
    arena = arenas.take(SIZE)
    kept = memoryview(arena)[100:][5:9]
    arenas.give_back(arena)
    retired = id(arena)
    del arena
    assert id(arenas.take(SIZE)) != retired
    del kept
    assert id(arenas.take(SIZE)) == retired


def test_a_caller_holding_the_arena_itself_keeps_it() -> None:
    arenas = ReceiveArenas(SIZE)
    arena = arenas.take(SIZE)
    arenas.give_back(arena)
    assert arenas.take(SIZE) is not arena


def test_arenas_are_taken_again_oldest_first() -> None:
    arenas = ReceiveArenas(SIZE)
    first, second = retire(arenas, 2)
    assert id(arenas.take(SIZE)) == first
    assert id(arenas.take(SIZE)) == second


def test_arenas_of_other_sizes_are_not_kept() -> None:
    arenas = ReceiveArenas(SIZE)
    arenas.give_back(arenas.take(3 * SIZE))
    assert arenas.waiting == 0
    [free] = retire(arenas)
    assert len(arenas.take(3 * SIZE)) == 3 * SIZE  # not the free one: its size differs
    assert arenas.waiting == 1
    assert id(arenas.take(SIZE)) == free


def test_at_most_retained_arenas_wait_and_the_oldest_goes() -> None:
    arenas = ReceiveArenas(SIZE, retained=2)
    _, second, third = retire(arenas, 3)
    assert arenas.waiting == 2
    assert id(arenas.take(SIZE)) == second
    assert id(arenas.take(SIZE)) == third


def test_none_retained_keeps_nothing() -> None:
    arenas = ReceiveArenas(SIZE, retained=0)
    retire(arenas)
    assert arenas.waiting == 0


def test_a_new_arena_has_the_size_asked_for() -> None:
    assert len(ReceiveArenas().take(DEFAULT_ARENA_SIZE)) == DEFAULT_ARENA_SIZE


@pytest.mark.parametrize(("size", "retained"), [(SIZE - 1, 1), (0, 1), (SIZE, -1)])
def test_bad_pool_shapes_are_refused(size: int, retained: int) -> None:
    with pytest.raises(BadRequest, match="receive arenas of"):
        ReceiveArenas(size, retained)
