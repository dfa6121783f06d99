"""A bookie's export for a metadata recovery (issue 18), and the commands' refusals: a dump
without its cookie, an empty directory, a directory that is no bookie's, exports of two
clusters. Each refusal is one line, with no traceback and nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tally.audit.recovery.exports import EXPORT_SUFFIX, export_files, export_path, write_export
from tally.audit.recovery.job import LedgerDecider, read_cookies
from tally.audit.schema import from_int64
from tally.core.availability import EntryAvailability
from tally.core.digest import DigestType
from tally.core.errors import BadRequest, MalformedData
from tally.core.ids import LedgerId
from tally.core.ledger_metadata import LedgerMetadata
from tally.core.protocol import StateRecord
from tally.metadata.cookies import Cookie
from tests.support.ledgers import rotating_ledger
from tests.support.processes import tally

KEY = bytes(range(32))


def cookie(bookie_id: str, instance_id: str = "cluster-a") -> StateRecord:
    return StateRecord.cookie_of(Cookie(bookie_id, ("/j", "/l"), instance_id, "inc").to_bytes())


def held(
    ledger_id: LedgerId, copy: bytes | None = b"copy", digest_type: DigestType | None = None
) -> StateRecord:
    return StateRecord.held(
        ledger_id,
        EntryAvailability.span(0, 4).to_bytes(),
        fenced=True,
        last_add_confirmed=3,
        master_key=KEY,
        metadata_copy=copy,
        digest_type=digest_type,
    )


def test_an_export_holds_each_record_of_the_dump_under_its_bookie(tmp_path: Path) -> None:
    wide = LedgerId(2**64 - 1, 2**63 + 5)
    records = [
        cookie("a:1"),
        held(LedgerId(0, 1)),
        held(wide, None, DigestType.HMAC),
        StateRecord.deleted(LedgerId(0, 9), 1_234),
    ]
    counts = write_export(records, export_path(tmp_path, "127.0.0.1:3181"), "a test")
    assert (counts.bookie_id, counts.ledgers, counts.deleted) == ("a:1", 2, 1)
    assert counts.path.name == f"127.0.0.1_3181{EXPORT_SUFFIX}"
    rows = pq.read_table(counts.path).to_pylist()
    assert [row["kind"] for row in rows] == ["cookie", "ledger", "ledger", "deleted"]
    assert {row["bookie_id"] for row in rows} == {"a:1"}
    assert LedgerId(from_int64(rows[2]["scope"]), from_int64(rows[2]["ledger_id"])) == wide
    assert (rows[1]["fenced"], rows[1]["last_add_confirmed"], rows[1]["master_key"]) == (
        True,
        3,
        KEY,
    )
    assert (rows[1]["metadata_copy"], rows[2]["metadata_copy"]) == (b"copy", None)
    assert (rows[1]["digest_type"], rows[2]["digest_type"]) == (None, "HMAC")
    assert rows[3]["deleted_ms"] == 1_234
    assert read_cookies(tmp_path)["a:1"].instance_id == "cluster-a"


def test_the_digest_type_a_bookie_s_entries_tell_reaches_the_inferred_metadata(
    tmp_path: Path,
) -> None:
    """An export's row, as the job reads it, into the ledger's decision (no Spark)."""
    ledger_id = LedgerId(0, 1)
    path = export_path(tmp_path, "a")
    write_export([cookie("a:1"), held(ledger_id, None, DigestType.CRC32)], path, "a")
    rows = [row for row in pq.read_table(path).to_pylist() if row["kind"] == "ledger"]
    decision = LedgerDecider(frozenset({"a:1"})).decide(rows)
    assert decision["verdict"] == "inferred", decision["reason"]
    assert LedgerMetadata.from_bytes(decision["metadata"]).digest_type is DigestType.CRC32
    assert "digest type CRC32 from its entries" in decision["reason"]


@pytest.mark.parametrize("in_limbo", [False, True])
def test_what_a_bookie_in_limbo_lacks_is_unknown_not_lost(tmp_path: Path, in_limbo: bool) -> None:
    """b's ledger directory failed: it holds 0-4 of a ledger placed on a and b, and cannot
    tell whether it ever had 5-9. Only without limbo are they lost (a lacks them too)."""
    metadata = rotating_ledger(2, 2, 2, [], 9, bookies=("a:1", "b:1"))
    ledger_id = LedgerId(0, 1)
    rows = []
    for bookie, limbo in (("a:1", False), ("b:1", in_limbo)):
        record = StateRecord.held(
            ledger_id,
            EntryAvailability.span(0, 4).to_bytes(),
            fenced=True,
            last_add_confirmed=4,
            master_key=metadata.master_key,
            metadata_copy=metadata.to_bytes(),
            in_limbo=limbo,
        )
        path = write_export([cookie(bookie), record], export_path(tmp_path, bookie), "a").path
        rows += [row for row in pq.read_table(path).to_pylist() if row["kind"] == "ledger"]
    decision = LedgerDecider(frozenset({"a:1", "b:1"})).decide(rows)
    assert decision["verdict"] == "exact"
    assert decision["lost_entries"] == (0 if in_limbo else 5)


@pytest.mark.parametrize(
    ("records", "problem"),
    [
        ([], "empty"),
        ([held(LedgerId(0, 1))], "does not start with its cookie"),
        ([cookie("a:1"), cookie("a:1")], "second cookie"),
    ],
)
def test_a_dump_that_is_not_a_whole_bookie_s_leaves_no_export(
    tmp_path: Path, records: list[StateRecord], problem: str
) -> None:
    with pytest.raises(MalformedData, match=problem):
        write_export(records, tmp_path / f"x{EXPORT_SUFFIX}", "a test")
    assert list(tmp_path.iterdir()) == []


def test_a_directory_without_exports_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BadRequest, match="no bookie exports"):
        export_files(tmp_path)


def test_export_bookie_of_a_directory_that_is_no_bookie_s_says_so(tmp_path: Path) -> None:
    done = tally(
        "cluster", "export-bookie", "--data-dir", str(tmp_path / "nothing"),
        "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert "no cookie in" in done.stderr
    assert not (tmp_path / "out").exists()


def test_recover_refuses_exports_of_two_clusters_before_starting_spark(tmp_path: Path) -> None:
    write_export([cookie("a:1"), held(LedgerId(0, 1))], export_path(tmp_path, "a"), "a")
    write_export([cookie("b:1"), held(LedgerId(0, 1))], export_path(tmp_path, "b"), "b")
    write_export([cookie("c:1", "cluster-b")], export_path(tmp_path, "c"), "c")
    done = tally("cluster", "recover", "--exports", str(tmp_path), "--report", str(tmp_path / "r"))
    assert done.returncode == 1
    assert "c:1 of cluster cluster-b" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert "Spark" not in done.stderr


def test_recover_needs_bookies_or_exports(tmp_path: Path) -> None:
    done = tally("cluster", "recover", "--report", str(tmp_path / "r"))
    assert done.returncode == 2
    assert "give --bookies, --exports or both" in done.stderr
