"""Synthetic snapshots: exact schema, reproducible, realistic, and a truth.json that an
independent audit (the core's `check_ledger` and placement policy, ledger by ledger) finds
exactly, healthy ledgers included."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.audit import schema
from tally.audit.synth import (
    DEFAULT_FAULTS,
    DELETED_LEDGER,
    FAULT_KINDS,
    TOMBSTONE_PENDING,
    UNREPORTED,
    WITHIN_GRACE,
    expected_encodings,
    ledger_key,
    parse_faults,
    synthesize,
)
from tally.audit.synth.healthy import MAX_ENTRIES
from tally.core.availability import EntryAvailability
from tally.core.durability import check_ledger
from tally.core.errors import BadRequest
from tally.core.ledger_audit import VIOLATION_CATEGORIES, Category
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.placement import PlacementAdherence, RackAwarePlacementPolicy
from tally.core.schedule import expected_entries
from tests.audit.snapshot_rows import metadata_of

DATASETS = {
    schema.LEDGERS: schema.LEDGERS_SCHEMA,
    schema.SEGMENTS: schema.SEGMENTS_SCHEMA,
    schema.BOOKIES: schema.BOOKIES_SCHEMA,
    schema.AVAILABILITY: schema.AVAILABILITY_SCHEMA,
    schema.TOMBSTONES: schema.TOMBSTONES_SCHEMA,
}


@pytest.fixture(scope="module")
def default_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "snapshot"
    synthesize(out, ledgers=6000, bookies=24, racks=4, faults="default", seed=11)
    return out


def _read(out: Path, name: str) -> pa.Table:
    return pq.read_table(out / name)


def _truth(out: Path) -> dict[str, Any]:
    return json.loads((out / schema.TRUTH_JSON).read_text())


# -- the independent audit ------------------------------------------------------------------


def reference_audit(out: Path) -> dict[str, set[str]]:
    """Every finding of the snapshot, computed with the core's durability and placement rules
    directly, one ledger at a time (slow, and independent of `audit_ledger`)."""
    truth = _truth(out)
    segments: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for row in _read(out, schema.SEGMENTS).to_pylist():
        segments[row["scope"], row["ledger_id"]].append(row)
    held: dict[tuple[int, int], dict[str, EntryAvailability]] = defaultdict(dict)
    for row in _read(out, schema.AVAILABILITY).to_pylist():
        key = row["scope"], row["ledger_id"]
        assert row["bookie_id"] not in held[key], "one row per bookie and ledger"
        held[key][row["bookie_id"]] = EntryAvailability.from_bytes(row["availability"])
    bookies = _read(out, schema.BOOKIES).to_pylist()
    racks = {b["bookie_id"]: b["rack"] for b in bookies}
    responded = {b["bookie_id"] for b in bookies if b["responded"]}
    policy = RackAwarePlacementPolicy(truth["params"]["min_racks"])
    cluster_racks = len(set(racks.values()))
    assert cluster_racks == truth["params"]["cluster_racks"]

    found: dict[str, set[str]] = defaultdict(set)
    known = set()
    for ledger in _read(out, schema.LEDGERS).to_pylist():
        key = ledger["scope"], ledger["ledger_id"]
        known.add(key)
        if ledger["state"] != "CLOSED" or ledger["last_entry_id"] < 0:
            continue
        name = ledger_key(*key)
        since = ledger["underreplicated_since_ms"]
        if since is not None:
            if truth["now_ms"] - since > truth["grace_period_ms"]:
                found[Category.UNDERREPLICATED_TOO_LONG.value].add(name)
            continue
        try:
            metadata = metadata_of(ledger, segments[key])
        except BadRequest:
            found[Category.INVALID_METADATA.value].add(name)
            continue
        answered = {
            bookie: held[key].get(bookie, EntryAvailability.empty())
            for bookie in metadata.bookies() | held[key].keys()
            if bookie in responded
        }
        verdict = check_ledger(metadata, answered)
        if verdict.category is not None:
            found[verdict.category.value].add(name)
        if _has_extra_copies(metadata, answered):
            found[Category.OVER_REPLICATED.value].add(name)
        if verdict.potentially_faulty:
            found[Category.POTENTIALLY_FAULTY.value].add(name)
        worst = min(
            policy.adherence(s.ensemble, metadata.write_quorum, racks, cluster_racks)
            for s in metadata.segments
        )
        if worst is PlacementAdherence.FAIL:
            found[Category.PLACEMENT_FAIL.value].add(name)
        elif worst is PlacementAdherence.MEETS_SOFT:
            found[Category.PLACEMENT_SOFT.value].add(name)
    stuck_ms = truth["deletion_stuck_after"] * 1000
    for tombstone in _read(out, schema.TOMBSTONES).to_pylist():
        key = tombstone["scope"], tombstone["ledger_id"]
        known.add(key)
        overdue = truth["now_ms"] - tombstone["tombstoned_ms"] >= stuck_ms
        if overdue and any(held[key].get(bookie) for bookie in responded):
            found[Category.DELETION_STUCK.value].add(ledger_key(*key))
    for key in held.keys() - known:
        found[Category.ORPHAN_DATA.value].add(ledger_key(*key))
    found[Category.UNRESPONSIVE_REGISTERED_BOOKIE.value] = {
        b["bookie_id"] for b in bookies if not b["responded"] and b["state"] != "unregistered"
    }
    return {category: keys for category, keys in found.items() if keys}


def _has_extra_copies(metadata: LedgerMetadata, held: dict[str, EntryAvailability]) -> bool:
    """Whether a bookie holds an entry of a segment beyond its position's schedule there."""
    e, wq = metadata.ensemble_size, metadata.write_quorum
    for segment, (first, last) in zip(metadata.segments, metadata.segment_bounds(), strict=True):
        assert last is not None
        span = EntryAvailability.span(first, last) if last >= first else EntryAvailability.empty()
        for bookie, entries in held.items():
            owed = (
                expected_entries(first, last, e, wq, segment.ensemble.index(bookie))
                if bookie in segment.ensemble
                else EntryAvailability.empty()
            )
            if entries.intersection(span).difference(owed):
                return True
    return False


def _expected(truth: dict[str, Any]) -> dict[str, set[str]]:
    """What the truth says a reference audit finds: violations and over-replication alike."""
    found = {category: set(keys) for category, keys in truth["categories"].items()}
    found[Category.OVER_REPLICATED.value] = set(truth[Category.OVER_REPLICATED.value])
    return {category: keys for category, keys in found.items() if keys}


def _marked_ledgers(out: Path) -> dict[str, dict[str, Any]]:
    return {
        ledger_key(row["scope"], row["ledger_id"]): row
        for row in _read(out, schema.LEDGERS).to_pylist()
        if row["underreplicated_since_ms"] is not None
    }


# -- tests ---------------------------------------------------------------------------------


def test_the_independent_audit_finds_exactly_the_truth(default_snapshot: Path) -> None:
    assert reference_audit(default_snapshot) == _expected(_truth(default_snapshot))


def test_every_category_is_injected_with_the_default_spec(default_snapshot: Path) -> None:
    truth = _truth(default_snapshot)
    assert set(truth["categories"]) == {category.value for category in VIOLATION_CATEGORIES}
    assert all(truth["categories"].values()), truth["categories"]
    over = Category.OVER_REPLICATED.value
    wanted = parse_faults(DEFAULT_FAULTS)
    for kind, count in wanted.items():
        found = truth[kind] if kind in (*UNREPORTED, over) else truth["categories"][kind]
        assert len(found) == count, kind
    for keys in [*truth["categories"].values(), *(truth[key] for key in UNREPORTED), truth[over]]:
        assert keys == sorted(keys)
    assert truth["grace_period_ms"] > 0
    assert truth["params"]["min_racks"] == 2


def test_ledgers_marked_within_the_grace_period_really_miss_copies(
    default_snapshot: Path,
) -> None:
    """The grace-period skip is meaningful: those ledgers are damaged, yet not reported."""
    truth = _truth(default_snapshot)
    marked = _marked_ledgers(default_snapshot)
    assert set(truth[WITHIN_GRACE]) | set(truth["categories"]["underreplicated_too_long"]) == set(
        marked
    )
    segments: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for row in _read(default_snapshot, schema.SEGMENTS).to_pylist():
        segments[row["scope"], row["ledger_id"]].append(row)
    held: dict[tuple[int, int], dict[str, EntryAvailability]] = defaultdict(dict)
    for row in _read(default_snapshot, schema.AVAILABILITY).to_pylist():
        held[row["scope"], row["ledger_id"]][row["bookie_id"]] = EntryAvailability.from_bytes(
            row["availability"]
        )
    for name in truth[WITHIN_GRACE]:
        ledger = marked[name]
        key = ledger["scope"], ledger["ledger_id"]
        metadata = metadata_of(ledger, segments[key])
        answered = {b: held[key].get(b, EntryAvailability.empty()) for b in metadata.bookies()}
        assert check_ledger(metadata, answered).category is not None
        assert 0 < truth["now_ms"] - ledger["underreplicated_since_ms"] <= truth["grace_period_ms"]


def test_deleted_ledgers_keep_data_that_the_checks_must_not_report(
    default_snapshot: Path,
) -> None:
    """The deletion faults are meaningful: DELETED ledgers and young tombstones have data on
    responding bookies, and stuck tombstones are past deletion_stuck_after with data still
    held; none of it is orphan data."""
    truth = _truth(default_snapshot)
    now, stuck_ms = truth["now_ms"], truth["deletion_stuck_after"] * 1000
    holders: dict[str, set[str]] = defaultdict(set)
    for row in _read(default_snapshot, schema.AVAILABILITY).to_pylist():
        holders[ledger_key(row["scope"], row["ledger_id"])].add(row["bookie_id"])
    ledgers = {
        ledger_key(row["scope"], row["ledger_id"]): row
        for row in _read(default_snapshot, schema.LEDGERS).to_pylist()
    }
    for name in truth[DELETED_LEDGER]:
        assert ledgers[name]["state"] == "DELETED"
        assert ledgers[name]["deleted_ms"] < now
        assert holders[name]
    tombstones = {
        ledger_key(row["scope"], row["ledger_id"]): row
        for row in _read(default_snapshot, schema.TOMBSTONES).to_pylist()
    }
    assert set(tombstones) == set(truth["categories"]["deletion_stuck"]) | set(
        truth[TOMBSTONE_PENDING]
    )
    assert not set(tombstones) & set(ledgers), "a tombstone replaces the metadata"
    for name, row in tombstones.items():
        acknowledged = dict(zip(row["bookies"], row["acknowledged_ms"], strict=True))
        assert {bookie for bookie, ms in acknowledged.items() if ms is None} == holders[name]
        age = now - row["tombstoned_ms"]
        if name in truth[TOMBSTONE_PENDING]:
            assert age < stuck_ms or not holders[name]
        else:
            assert age >= stuck_ms
            assert holders[name]


def test_every_dataset_has_exactly_the_contract_schema(default_snapshot: Path) -> None:
    for name, expected in DATASETS.items():
        parts = sorted((default_snapshot / name).glob("*.parquet"))
        assert parts, name
        for part in parts:
            assert pq.read_schema(part).remove_metadata() == expected, part
    table = _read(default_snapshot, schema.AVAILABILITY)
    assert table.num_rows > 0
    for row in table.slice(0, 200).to_pylist():
        EntryAvailability.from_bytes(row["availability"])  # decodes, canonical or not
    snapshot = json.loads((default_snapshot / schema.SNAPSHOT_JSON).read_text())
    assert snapshot["format_version"] == schema.FORMAT_VERSION
    assert snapshot["created_ms"] == _truth(default_snapshot)["now_ms"]
    assert snapshot["counts"]["ledgers"] == _read(default_snapshot, schema.LEDGERS).num_rows
    assert snapshot["counts"]["availability"] == table.num_rows


def test_the_cluster_looks_real(default_snapshot: Path) -> None:
    ledgers = _read(default_snapshot, schema.LEDGERS).to_pandas()
    closed = ledgers[ledgers.state == "CLOSED"]
    entries = closed.last_entry_id + 1
    assert entries.median() < 100 < entries.max(), "most small, a heavy tail"
    assert set(ledgers.state) == {"CLOSED", "OPEN", "IN_RECOVERY", "DELETED"}
    unclosed = ledgers[ledgers.state.isin(["OPEN", "IN_RECOVERY"])]
    open_ids = set(zip(unclosed.ledger_id, strict=True))
    assert (unclosed.last_entry_id == -1).all()
    deleted = ledgers[ledgers.state == "DELETED"]
    assert (deleted.last_entry_id >= 0).all(), "a DELETED ledger keeps the end it was closed at"
    assert deleted.deleted_ms.notna().all()
    assert ledgers[ledgers.state != "DELETED"].deleted_ms.isna().all()
    assert (closed.last_entry_id == -1).any(), "some empty closed ledgers"
    mixes = set(zip(ledgers.ensemble_size, ledgers.write_quorum, ledgers.ack_quorum, strict=True))
    assert {(3, 3, 2), (3, 2, 2)} <= mixes
    assert (ledgers.scope < 0).any(), "128-bit ids, with the sign bit set"
    assert (ledgers.scope == 0).mean() > 0.9, "mostly classic 64-bit ids"
    segments = _read(default_snapshot, schema.SEGMENTS).to_pandas()
    per_ledger = segments.groupby(["scope", "ledger_id"]).size()
    assert 2.0 < per_ledger.mean() < 3.5
    assert len(per_ledger) == len(ledgers)
    open_segments = segments[segments.ledger_id.isin({i for (i,) in open_ids})]
    last_of_open = open_segments.groupby(["scope", "ledger_id"]).last_entry_id.last()
    assert (last_of_open == -1).all()
    bookies = _read(default_snapshot, schema.BOOKIES).to_pandas()
    assert set(bookies.state) == {"writable", "readonly"}
    assert bookies.rack.nunique() == 4


def test_the_same_seed_gives_the_same_snapshot(tmp_path: Path) -> None:
    def make(name: str, seed: int) -> Path:
        out = tmp_path / name
        synthesize(out, ledgers=1500, bookies=15, racks=5, faults="default", seed=seed)
        return out

    one, two, other = make("one", 5), make("two", 5), make("other", 6)
    for name in DATASETS:
        assert _read(one, name).equals(_read(two, name)), name
    assert _truth(one) == _truth(two)
    assert not _read(one, schema.AVAILABILITY).equals(_read(other, schema.AVAILABILITY))
    assert _truth(one)["categories"] != _truth(other)["categories"]


def test_a_snapshot_without_faults_has_no_findings(tmp_path: Path) -> None:
    progress: list[tuple[str, int, int | None]] = []
    out = tmp_path / "clean"
    synthesize(
        out,
        ledgers=2500,
        bookies=12,
        racks=3,
        seed=2,
        progress=lambda *args: progress.append(args),
    )
    assert reference_audit(out) == {}
    assert not any(_truth(out)["categories"].values())
    assert not _truth(out)[Category.OVER_REPLICATED.value]
    assert progress[-1] == ("ledgers", 2500, 2500)


def test_a_size_drawn_past_int64_is_capped_not_wrapped(tmp_path: Path) -> None:
    # Seed 3 draws 10^19.2 entries for ledger 60,826 of the first chunk of 100,000: more than
    # an int64 holds, so a cast before the cap would wrap it to a negative count.
    out = tmp_path / "heavy"
    synthesize(out, ledgers=100_000, bookies=6, racks=3, seed=3)
    ledger_id = 2 * 60_826
    ledgers = _read(out, schema.LEDGERS)
    (ledger,) = ledgers.filter(pc.equal(ledgers["ledger_id"], ledger_id)).to_pylist()
    assert ledger["state"] == "CLOSED"
    assert ledger["last_entry_id"] == MAX_ENTRIES - 1
    assert ledger["length"] >= MAX_ENTRIES
    segments = _read(out, schema.SEGMENTS)
    rows = segments.filter(pc.equal(segments["ledger_id"], ledger_id)).to_pylist()
    metadata = metadata_of(ledger, rows)
    availability = _read(out, schema.AVAILABILITY)
    held = {
        row["bookie_id"]: EntryAvailability.from_bytes(row["availability"])
        for row in availability.filter(pc.equal(availability["ledger_id"], ledger_id)).to_pylist()
    }
    assert check_ledger(metadata, held).category is None


def test_an_empty_snapshot_still_has_every_schema(tmp_path: Path) -> None:
    out = tmp_path / "empty"
    synthesize(out, ledgers=0, bookies=6, racks=2, faults="orphan_data=1", seed=0)
    for name, expected in DATASETS.items():
        assert pq.read_schema(next((out / name).glob("*.parquet"))).remove_metadata() == expected
    assert _read(out, schema.LEDGERS).num_rows == 0
    assert reference_audit(out) == {"orphan_data": set(_truth(out)["categories"]["orphan_data"])}


def test_faults_that_the_cluster_cannot_hold_are_refused_before_writing(tmp_path: Path) -> None:
    out = tmp_path / "two-racks"
    with pytest.raises(BadRequest, match="placement_soft needs 3 racks"):
        synthesize(out, ledgers=100, bookies=8, racks=2, faults="placement_soft=1")
    assert not out.exists()
    with pytest.raises(BadRequest, match="do not fit"):
        synthesize(out, ledgers=2, bookies=8, racks=2, faults="no_replica=3")
    with pytest.raises(BadRequest, match="racks"):
        synthesize(out, ledgers=10, bookies=8, racks=1)


def test_an_existing_snapshot_is_not_overwritten(default_snapshot: Path) -> None:
    with pytest.raises(BadRequest, match="already holds"):
        synthesize(default_snapshot, ledgers=10, bookies=6, racks=2)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("nonsense=1", "unknown fault"),
        ("no_replica", "needs a count"),
        ("no_replica=-1", "needs a count"),
        ("no_replica=1,no_replica=2", "twice"),
        ("potentially_faulty=1", "follows from"),
    ],
)
def test_bad_fault_specs_are_refused(spec: str, problem: str) -> None:
    with pytest.raises(BadRequest, match=problem):
        parse_faults(spec)


def test_fault_specs() -> None:
    assert parse_faults("") == {}
    assert parse_faults(" no_replica=2 , orphan_data=0 ") == {"no_replica": 2, "orphan_data": 0}
    assert set(parse_faults("default")) == set(FAULT_KINDS)


def test_ledger_keys_are_the_unsigned_halves() -> None:
    assert ledger_key(0, 7) == "0:7"
    assert ledger_key(-1, schema.to_int64(2**63)) == f"{2**64 - 1}:{2**63}"


@settings(max_examples=300, deadline=None)
@given(
    shapes=st.lists(
        st.tuples(
            st.integers(1, 8).flatmap(
                lambda e: st.tuples(st.just(e), st.integers(1, e), st.integers(0, e - 1))
            ),
            st.integers(0, 2**40),
            st.integers(-1, 3 * 8 + 2) | st.integers(0, 10**7),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_vectorised_encodings_equal_the_core_s(
    shapes: list[tuple[tuple[int, int, int], int, int]],
) -> None:
    rows = np.array(
        [(first, first + length, e, wq, p) for (e, wq, p), first, length in shapes], np.int64
    )
    encodings, holders = expected_encodings(*rows.T)
    got = dict(zip(holders.tolist(), encodings.to_pylist(), strict=True))
    for index, (first, last, e, wq, p) in enumerate(rows.tolist()):
        expected = expected_entries(first, last, e, wq, p)
        assert got.get(index) == (expected.to_bytes() if expected else None)
