"""The HTML report: self-contained, escaped, and showing the numbers it was given."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tally.audit import schema
from tally.audit.report import COLOURS, MEANING, SEVERITY, WORST_LEDGERS, write_report
from tally.core.ledger_audit import VIOLATION_CATEGORIES, Category

SUMMARY: dict[str, Any] = {
    "categories": {category.value: 0 for category in Category}
    | {"no_replica": 1, "potentially_faulty": 2, "unresponsive_registered_bookie": 1},
    "ledgers_checked": 1234,
    "timings": {"read": 0.5, "audit": 2.25, "summary": 0.125, "total": 2.875},
}
RACKS = {"b0": "/r0", "b1": "/r1", "<b2>": "/r<2>"}


def _violations(rows: list[tuple[Any, ...]]) -> pa.Table:
    names = schema.VIOLATIONS_SCHEMA.names
    return pa.Table.from_pylist([dict(zip(names, row, strict=True)) for row in rows],
                                schema.VIOLATIONS_SCHEMA)  # fmt: skip


ROWS = [
    (0, 7, "no_replica", 0, "b0", 3, "bookie b0 lacks 3 entries"),
    (0, 7, "no_replica", 0, "b1", 3, "bookie b1 lacks 3 entries"),
    (0, 8, "potentially_faulty", None, "<b2>", None, "bookie <b2> & co did not answer"),
    (schema.to_int64((1 << 63) + 1), 9, "potentially_faulty", None, "b0", None, "silent"),
    (None, None, "unresponsive_registered_bookie", None, "<b2>", None, "<script>x</script>"),
]


class _Parsed(HTMLParser):
    """Tags, attribute URLs and text of a document; fails on nothing, records everything."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.urls: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.urls += [v or "" for k, v in attrs if k in ("href", "src")]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(path: Path) -> _Parsed:
    parsed = _Parsed()
    parsed.feed(path.read_text(encoding="utf-8"))
    return parsed


def test_the_report_is_self_contained_and_escaped(tmp_path: Path) -> None:
    path = write_report(tmp_path, SUMMARY, _violations(ROWS), RACKS)
    assert path == tmp_path / schema.REPORT_HTML
    html = path.read_text(encoding="utf-8")
    parsed = _parse(path)
    assert "script" not in parsed.tags
    assert parsed.urls == []
    assert "http" not in re.sub(r'xmlns="http://www.w3.org/2000/svg"', "", html)
    assert "<script>x</script>" not in html
    assert "<b2>" not in html
    assert "&lt;b2&gt;" in html
    assert parsed.tags.count("svg") == 3  # by category, by bookie, by rack
    assert {"table", "style", "rect"} <= set(parsed.tags)


def test_the_report_shows_the_summary_and_the_worst_ledgers(tmp_path: Path) -> None:
    text = " ".join(_parse(write_report(tmp_path, SUMMARY, _violations(ROWS), RACKS)).text)
    assert "1,234 closed ledgers checked in 2.9 s" in text
    assert "4 findings" in text
    for stage in SUMMARY["timings"]:
        assert stage in text
    # Ledger 7 (no_replica) is the worst, before the silent ones; scoped ids are qualified.
    worst = text.index("bookie b0 lacks 3 entries")
    assert worst < text.index("bookie <b2> & co did not answer")
    assert f"{(1 << 63) + 1:016x}{9:016x}" in text
    assert "/r<2>" in text  # the rack chart names the racks, escaped in the file


def test_bars_are_proportional_to_the_counts(tmp_path: Path) -> None:
    html = write_report(tmp_path, SUMMARY, _violations(ROWS), RACKS).read_text()
    category_chart = html[html.index("<svg") : html.index("</svg>")]
    widths = {
        name: float(width)
        for width, name in re.findall(
            r'width="([\d.]+)" height="16" [^>]*><title>(\w+):', category_chart
        )
    }
    assert widths["potentially_faulty"] == 2 * widths["no_replica"]


def test_a_clean_run_says_so(tmp_path: Path) -> None:
    summary = SUMMARY | {"categories": {category.value: 0 for category in Category}}
    text = " ".join(_parse(write_report(tmp_path, summary, _violations([]), {})).text)
    assert "no violation found" in text
    assert "No ledger has a finding." in text
    assert "No finding names a bookie." in text
    assert "No extra copies." in text


def test_over_replication_is_shown_apart_from_the_violations(tmp_path: Path) -> None:
    names = schema.OVER_REPLICATED_SCHEMA.names
    extra = [
        (0, 11, 0, "b1", 10, 40_960, "bookie b1 holds 10 entries of segment 0 ..."),
        (0, 12, 1, "b1", 5, 20_480, "..."),
        (0, 12, 0, "<b2>", 7, 700, "..."),
    ]
    table = pa.Table.from_pylist(
        [dict(zip(names, row, strict=True)) for row in extra], schema.OVER_REPLICATED_SCHEMA
    )
    summary = SUMMARY | {
        "categories": {category.value: 0 for category in VIOLATION_CATEGORIES},
        "over_replication": {"ledgers": 2, "rows": 3, "entries": 22, "bytes": 62_140},
    }
    path = write_report(tmp_path, summary, _violations([]), RACKS, over_replicated=table)
    html = path.read_text(encoding="utf-8")
    text = " ".join(_parse(path).text)
    assert "no violation found" in text
    assert "22 extra copies (about 62,140 bytes) on 2 ledgers, which are not violations" in text
    assert "No ledger has a finding." in text
    section = text[text.index("Over-replication") :]
    assert "not a violation, no alert" in section
    assert section.index("b1") < section.index("<b2>")  # most bytes first
    assert "&lt;b2&gt;" in html
    assert "61,440" in section  # b1's bytes over its two rows
    assert "over_replicated" not in html[: html.index("Over-replication")]


def test_the_violations_can_come_from_their_dataset(tmp_path: Path) -> None:
    dataset = tmp_path / schema.VIOLATIONS
    dataset.mkdir()
    pq.write_table(_violations(ROWS[:2]), dataset / "part-0.parquet")
    (dataset / "_SUCCESS").write_text("")
    text = " ".join(_parse(write_report(tmp_path, SUMMARY, dataset, RACKS)).text)
    assert "bookie b0 lacks 3 entries" in text


def test_only_the_worst_ledgers_are_listed(tmp_path: Path) -> None:
    rows = [(0, i, "placement_soft", 0, None, None, f"stray {i}") for i in range(100)]
    rows.append((0, 500, "below_write_quorum", 0, "b1", 1, "the worst one"))
    text = " ".join(_parse(write_report(tmp_path, SUMMARY, _violations(rows), RACKS)).text)
    assert "the worst one" in text
    assert sum(f"stray {i}" in text for i in range(100)) == WORST_LEDGERS - 1


def test_every_violation_category_is_ranked_explained_and_coloured(tmp_path: Path) -> None:
    assert len(SEVERITY) == len(set(SEVERITY)) == len(VIOLATION_CATEGORIES)
    assert set(SEVERITY) == set(MEANING) == set(COLOURS) == set(VIOLATION_CATEGORIES)
    stuck = (0, 21, "deletion_stuck", None, "b1", 4, "bookie b1 still holds 4 entries ...")
    summary = SUMMARY | {"categories": SUMMARY["categories"] | {"deletion_stuck": 1}}
    text = " ".join(_parse(write_report(tmp_path, summary, _violations([stuck]), RACKS)).text)
    assert MEANING[Category.DELETION_STUCK] in text
    assert "bookie b1 still holds 4 entries ..." in text
