"""The key layout: every ledger id has one key, keys sort as ids do, fan-out stays bounded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.core.errors import BadRequest
from tally.core.ids import UINT64_MAX, LedgerId
from tally.metadata.paths import (
    LEDGER_METADATA,
    ROOTS,
    UNDER_REPLICATION_MARKS,
    check_bookie_id,
    idgen_bucket_first_id,
    idgen_bucket_path,
)
from tally.metadata.store import ROOT, check_path, parent_of

halves = st.integers(min_value=0, max_value=UINT64_MAX)
ledger_ids = st.builds(LedgerId, halves, halves)


@given(ledger_ids)
def test_a_ledger_s_key_is_a_valid_path_that_names_it_back(ledger_id: LedgerId) -> None:
    for tree in (LEDGER_METADATA, UNDER_REPLICATION_MARKS):
        path = tree.path(ledger_id)
        assert check_path(path) == path
        assert tree.ledger_id(path) == ledger_id
        root = tree.classic.root if ledger_id.is_classic else tree.scoped.root
        assert path.startswith(root + "/")
        parents = tree.parents(ledger_id)
        assert parents[0] == parent_of(path)
        assert parent_of(parents[-1]) == root
        assert len(parents) == (4 if ledger_id.is_classic else 3)


@given(ledger_ids, ledger_ids)
def test_keys_of_one_hierarchy_sort_as_their_ids(a: LedgerId, b: LedgerId) -> None:
    if a.is_classic == b.is_classic:
        pa, pb = LEDGER_METADATA.path(a), LEDGER_METADATA.path(b)
        assert (pa < pb) == (a < b)
        assert (pa == pb) == (a == b)


def test_the_documented_example_and_the_largest_id() -> None:
    assert LEDGER_METADATA.path(LedgerId.classic(1)) == "/ledgers/0000/0000/0000/0000/L0001"
    assert LEDGER_METADATA.path(LedgerId.classic(UINT64_MAX)) == (
        "/ledgers/1844/6744/0737/0955/L1615"
    )
    scoped = LedgerId.from_qualified_name("0123456789abcdeffedcba9876543210")
    assert LEDGER_METADATA.path(scoped) == "/ledgers-scoped/0123/456789abcdef/fedcba987654/L3210"


def test_sequential_ids_fill_one_parent_of_ten_thousand_at_a_time() -> None:
    parents = {parent_of(LEDGER_METADATA.path(LedgerId.classic(i))) for i in range(30_000)}
    assert len(parents) == 3
    per_scope = {parent_of(LEDGER_METADATA.path(LedgerId(7, i))) for i in range(0, 70_000, 7)}
    assert len(per_scope) == 2  # 65,536 ids per parent under one scope


@pytest.mark.parametrize(
    "path",
    [
        "/ledgers/0000/0000/0000/0000/0001",  # no leaf prefix
        "/ledgers/0000/0000/0000/L0001",  # too shallow
        "/ledgers/0000/0000/0000/0000/L00001",  # too wide
        "/ledgers/9999/9999/9999/9999/L9999",  # past 2^64 - 1
        "/ledgers/000a/0000/0000/0000/L0001",  # hex in a decimal tree
        "/ledgers-scoped/0000/000000000000/000000000000/L0001",  # scope 0 lives in /ledgers
        "/ledgers-scoped/ABCD/000000000000/000000000000/L0001",  # upper case
        "/cookies/bookie-1",
    ],
)
def test_keys_that_name_no_ledger_are_refused(path: str) -> None:
    with pytest.raises(BadRequest, match="not a ledger's key"):
        LEDGER_METADATA.ledger_id(path)


def test_roots_come_after_their_parents() -> None:
    for index, root in enumerate(ROOTS):
        assert check_path(root) == root
        assert parent_of(root) == ROOT or parent_of(root) in ROOTS[:index]


def test_idgen_bucket_names_round_trip() -> None:
    path = idgen_bucket_path(3 << 30)
    assert idgen_bucket_first_id(path.rsplit("/", 1)[1]) == 3 << 30
    for name in ["", "12", "x" * 20, "0" * 19 + "a", "\u0661" * 20]:
        assert idgen_bucket_first_id(name) is None


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "tab\tbed", "x" * 256, 7, None])
def test_bookie_ids_that_cannot_name_a_key_are_refused(bad: object) -> None:
    with pytest.raises(BadRequest, match="bookie id"):
        check_bookie_id(bad)


def test_bookie_ids_with_ports_and_unicode_are_fine() -> None:
    for good in ["127.0.0.1:3181", "bookie-1.example.com:3181", "bökie", "[::1]:3181"]:
        assert check_bookie_id(good) == good
