"""When a bookie may let a ledger out of limbo: closed, and every entry it should hold held."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tally.core.availability import EntryAvailability
from tally.core.digest import DigestType
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.limbo import LimboVerdict, check_limbo, ledgers_to_limbo
from tally.core.schedule import write_set

BOOKIES = ("a", "b", "c", "d", "e")


def ledger(
    ensembles: list[tuple[int, tuple[str, ...]]], wq: int, last: int | None
) -> LedgerMetadata:
    first, ensemble = ensembles[0]
    metadata = LedgerMetadata.create(
        ensemble=ensemble,
        write_quorum=wq,
        ack_quorum=1,
        digest_type=DigestType.CRC32C,
        password=b"pw",
        ctime_ms=0,
        creator_token=b"t",
    )
    for first, ensemble in ensembles[1:]:
        metadata = metadata.with_ensemble_change(first, ensemble)
    return metadata if last is None else metadata.close(last, 0)


def owed(metadata: LedgerMetadata, bookie: str) -> set[int]:
    """Brute force: the entries whose write set puts `bookie` in."""
    return {
        e
        for e in range(metadata.last_entry_id + 1)
        if bookie
        in [
            metadata.ensemble_at(e)[p]
            for p in write_set(e, metadata.ensemble_size, metadata.write_quorum)
        ]
    }


@st.composite
def closed_ledgers(draw: st.DrawFn) -> LedgerMetadata:
    e = draw(st.integers(1, 4))
    wq = draw(st.integers(1, e))
    firsts = sorted(draw(st.sets(st.integers(1, 40), max_size=3)))
    ensembles = [(first, tuple(draw(st.permutations(BOOKIES))[:e])) for first in [0, *firsts]]
    last = draw(st.integers(max(firsts, default=0) - 1, 60))
    return ledger(ensembles, wq, last)


@given(closed_ledgers(), st.sampled_from(BOOKIES), st.data())
def test_a_closed_ledger_leaves_limbo_exactly_when_every_owed_entry_is_held(
    metadata: LedgerMetadata, bookie: str, data: st.DataObject
) -> None:
    expected = owed(metadata, bookie)
    dropped = (
        data.draw(st.sets(st.sampled_from(sorted(expected)), max_size=3)) if expected else set()
    )
    extra = data.draw(st.sets(st.integers(0, 80), max_size=5))
    held = EntryAvailability.from_entries(sorted((expected - dropped) | extra))
    check = check_limbo(metadata, bookie, held)
    missing = dropped - extra
    if missing:
        assert check.verdict is LimboVerdict.MISSING
        assert set(check.missing) == missing
    else:
        assert check.verdict is LimboVerdict.WHOLE
        assert not check.missing


def test_an_open_ledger_stays_in_limbo_whatever_the_bookie_holds() -> None:
    metadata = ledger([(0, ("a", "b", "c"))], 2, None)
    everything = EntryAvailability.span(0, 100)
    assert check_limbo(metadata, "a", everything).verdict is LimboVerdict.OPEN
    assert check_limbo(metadata.start_recovery(), "a", everything).verdict is LimboVerdict.OPEN


def test_a_bookie_outside_every_ensemble_owes_nothing() -> None:
    metadata = ledger([(0, ("a", "b", "c"))], 3, 10)
    check = check_limbo(metadata, "z", EntryAvailability.empty())
    assert check.verdict is LimboVerdict.WHOLE


def test_the_ledgers_of_a_damaged_file_go_into_limbo() -> None:
    a, b, c = LedgerId(0, 1), LedgerId(0, 2), LedgerId(5, 3)
    by_file = {1: {a}, 2: {b}, 3: {c}}
    everything = [a, b, c, LedgerId(0, 9)]
    assert ledgers_to_limbo({2}, by_file, lambda: everything) == {b}
    assert ledgers_to_limbo({1, 3}, by_file, lambda: everything) == {a, c}
    assert ledgers_to_limbo(set(), by_file, lambda: everything) == set()


def test_a_damaged_file_with_no_intact_record_puts_every_known_ledger_in_limbo() -> None:
    a, b = LedgerId(0, 1), LedgerId(0, 2)
    assert ledgers_to_limbo({1, 7}, {1: {a}}, lambda: [a, b]) == {a, b}
