"""128-bit ledger ids: halves, qualified names, parsing, UUIDs, ordering."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tally.core.errors import BadRequest
from tally.core.ids import UINT64_MAX, LedgerId

halves = st.integers(0, UINT64_MAX)


@given(halves, halves)
def test_qualified_name_round_trips(scope: int, ledger: int) -> None:
    ledger_id = LedgerId(scope, ledger)
    name = ledger_id.qualified_name
    assert len(name) == 32
    assert name == name.lower()
    assert LedgerId.from_qualified_name(name) == ledger_id
    assert LedgerId.parse(name) == ledger_id


def test_qualified_name_is_scope_then_id() -> None:
    assert LedgerId(1, 2).qualified_name == "0000000000000001" + "0000000000000002"
    assert LedgerId(UINT64_MAX, 0).qualified_name == "f" * 16 + "0" * 16


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "0 characters"),
        ("abc", "3 characters"),
        ("0" * 33, "33 characters"),
        ("A" * 32, "lowercase hex"),
        ("g" * 32, "lowercase hex"),
        (" " + "0" * 31, "lowercase hex"),
        ("0x" + "0" * 30, "lowercase hex"),
    ],
)
def test_bad_qualified_names_are_refused_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(BadRequest, match=reason):
        LedgerId.from_qualified_name(text)


@pytest.mark.parametrize(
    ("scope", "ledger"), [(-1, 0), (0, -1), (UINT64_MAX + 1, 0), (0, UINT64_MAX + 1)]
)
def test_halves_outside_64_bits_are_refused(scope: int, ledger: int) -> None:
    with pytest.raises(BadRequest, match="outside"):
        LedgerId(scope, ledger)


def test_halves_must_be_ints() -> None:
    with pytest.raises(BadRequest, match="must be an int"):
        LedgerId(0, True)
    with pytest.raises(BadRequest, match="must be an int"):
        LedgerId(0.0, 1)  # type: ignore[arg-type]


def test_parse_accepts_what_users_type() -> None:
    assert LedgerId.parse(7) == LedgerId(0, 7)
    assert LedgerId.parse("42") == LedgerId(0, 42)
    assert LedgerId.parse(LedgerId(3, 4)) == LedgerId(3, 4)
    # 32 decimal digits are a qualified name, not a huge classic id.
    assert LedgerId.parse("0" * 31 + "9") == LedgerId(0, 9)
    with pytest.raises(BadRequest):
        LedgerId.parse(True)
    with pytest.raises(BadRequest):
        LedgerId.parse(1.5)  # type: ignore[arg-type]
    with pytest.raises(BadRequest):
        LedgerId.parse("-1")


def test_uuid_ids_split_the_uuid_and_are_never_scope_zero() -> None:
    value = uuid.UUID("0123456789abcdef" + "fedcba9876543210")
    assert LedgerId.from_uuid(value) == LedgerId(0x0123456789ABCDEF, 0xFEDCBA9876543210)
    random_ids = {LedgerId.from_uuid() for _ in range(1000)}
    assert len(random_ids) == 1000
    assert all(i.scope != 0 for i in random_ids)
    with pytest.raises(BadRequest, match="zero top half"):
        LedgerId.from_uuid(uuid.UUID(int=5))


@given(halves, halves, halves, halves)
def test_order_is_scope_then_id_as_in_the_qualified_name(a: int, b: int, c: int, d: int) -> None:
    x, y = LedgerId(a, b), LedgerId(c, d)
    assert (x < y) == (x.qualified_name < y.qualified_name)
    assert (x == y) == (hash(x) == hash(y) and (a, b) == (c, d))


def test_int_and_str_for_classic_ids_only() -> None:
    assert int(LedgerId(0, 99)) == 99
    assert str(LedgerId(0, 99)) == "99"
    wide = LedgerId(1, 99)
    assert str(wide) == wide.qualified_name
    with pytest.raises(BadRequest, match="only scope-0"):
        int(wide)
    assert LedgerId.classic(5).is_classic
    assert not wide.is_classic
