"""The error hierarchy's wire codes: unique, stable, and mapped back to the same type."""

from __future__ import annotations

import pytest

import tally.errors
from tally.core import errors

# Released codes never change meaning: this table is the contract with old peers.
STABLE = {
    errors.BadDigest: 5,
    errors.NotEnoughBookies: 6,
    errors.NoSuchLedger: 7,
    errors.LedgerClosed: 11,
    errors.NoSuchEntry: 13,
    errors.MetadataVersionConflict: 17,
    errors.Timeout: 23,
    errors.EntryUnreadable: 24,
    errors.LedgerFenced: 101,
    errors.Unauthorized: 102,
}


@pytest.mark.parametrize(("cls", "code"), list(STABLE.items()))
def test_codes_are_stable(cls: type[errors.TallyError], code: int) -> None:
    assert cls.code == code


def test_every_code_maps_back_to_its_type_with_the_message() -> None:
    codes = errors.wire_codes()
    assert len(codes) == len(errors._all_error_types())
    for code, cls in codes.items():
        error = errors.from_code(code, "ledger 7 entry 3")
        assert type(error) is cls
        assert str(error) == "ledger 7 entry 3"


def test_unknown_code_stays_visible() -> None:
    error = errors.from_code(9999, "what the peer said")
    assert type(error) is errors.TallyError
    assert "9999" in str(error)
    assert "what the peer said" in str(error)


def test_public_module_exports_every_type() -> None:
    for cls in errors.wire_codes().values():
        assert getattr(tally.errors, cls.__name__) is cls


def test_malformed_data_is_a_bad_request() -> None:
    assert issubclass(errors.MalformedData, errors.BadRequest)
    assert issubclass(errors.SessionExpired, errors.MetadataStoreError)
