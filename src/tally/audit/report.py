"""The audit's report for people: one HTML file that opens anywhere, offline.

Everything is inline (CSS and SVG charts, no script, no fonts or images to fetch), so the
file can be mailed, attached to a ticket or opened on an air-gapped machine. Aggregation is
done with Arrow over the violations dataset, so a run with millions of findings still makes
a report of a few hundred kilobytes: counts per category, per bookie and per rack, and the
worst ledgers one by one. Over-replication (extra copies) has a section of its own, apart
from the violations: it never lowers durability. Every text that comes from data is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tally.audit import schema
from tally.core.ids import LedgerId
from tally.core.ledger_audit import Category

TOP_BOOKIES = 20
TOP_RACKS = 20
WORST_LEDGERS = 25

SEVERITY = (
    Category.NO_REPLICA,
    Category.BELOW_ACK_QUORUM,
    Category.BELOW_WRITE_QUORUM,
    Category.UNDERREPLICATED_TOO_LONG,
    Category.INVALID_METADATA,
    Category.PLACEMENT_FAIL,
    Category.ORPHAN_DATA,
    Category.DELETION_STUCK,
    Category.POTENTIALLY_FAULTY,
    Category.PLACEMENT_SOFT,
    Category.UNRESPONSIVE_REGISTERED_BOOKIE,
)
"""Worst first: how ledgers are ranked, and the order of categories everywhere (every
violation category; over-replication is not one)."""

MEANING = {
    Category.NO_REPLICA: "an entry has no copy on any bookie that answered",
    Category.BELOW_ACK_QUORUM: "an entry has fewer copies than the ack quorum",
    Category.BELOW_WRITE_QUORUM: "an entry has fewer copies than the write quorum",
    Category.UNDERREPLICATED_TOO_LONG: "marked under-replicated for longer than the grace period",
    Category.PLACEMENT_FAIL: "a write set spans fewer racks than the policy's minimum",
    Category.PLACEMENT_SOFT: "meets the minimum, but spans fewer racks than the cluster has",
    Category.UNRESPONSIVE_REGISTERED_BOOKIE: "a registered bookie did not answer (bookies)",
    Category.POTENTIALLY_FAULTY: "a bookie of the ledger did not answer; its copies not judged",
    Category.ORPHAN_DATA: "a bookie holds data of a ledger with neither metadata nor tombstone",
    Category.DELETION_STUCK: "a bookie still holds data of a ledger deleted (tombstoned) longer "
    "than deletion_stuck_after ago",
    Category.INVALID_METADATA: "the snapshot's rows of the ledger make no valid ledger: not judged",
}

COLOURS = {
    Category.NO_REPLICA: "#7f0000",
    Category.BELOW_ACK_QUORUM: "#c62828",
    Category.BELOW_WRITE_QUORUM: "#ef6c00",
    Category.UNDERREPLICATED_TOO_LONG: "#ad1457",
    Category.PLACEMENT_FAIL: "#6a1b9a",
    Category.PLACEMENT_SOFT: "#b39ddb",
    Category.UNRESPONSIVE_REGISTERED_BOOKIE: "#37474f",
    Category.POTENTIALLY_FAULTY: "#90a4ae",
    Category.ORPHAN_DATA: "#2e7d32",
    Category.DELETION_STUCK: "#9e9d24",
    Category.INVALID_METADATA: "#4e342e",
}

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1100px;padding:0 1em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid
#ddd;padding-bottom:.2em}table{border-collapse:collapse;margin:.5em 0}td,th{padding:3px 10px;
border-bottom:1px solid #eee;text-align:left;vertical-align:top}th{background:#f6f6f6}
td.n{text-align:right;font-variant-numeric:tabular-nums}.ok{color:#2e7d32}.bad{color:#c62828}
.swatch{display:inline-block;width:.9em;height:.9em;margin-right:.4em;vertical-align:-1px}
.detail{max-width:520px;font-size:.92em;color:#444}svg text{font:12px sans-serif}
.muted{color:#777}
"""

_LABEL_WIDTH = 240
_BAR_WIDTH = 560
_ROW_HEIGHT = 22


def write_report(
    out: Path,
    summary: Mapping[str, Any],
    violations: pa.Table | Path,
    racks: Mapping[str, str],
    *,
    over_replicated: pa.Table | Path | None = None,
) -> Path:
    """Write `out`/report.html from a run's summary and violations; returns its path.

    `violations` is the violations table or the directory of its Parquet dataset, and
    `over_replicated` the same of the extra copies (None: there are none); `racks` maps
    bookie ids to racks (a bookie with none counts under "unknown").
    """
    table = _load(violations)
    extra = _load_over_replicated(over_replicated)
    categories = [category.value for category in SEVERITY]
    counts = {name: int(summary.get("categories", {}).get(name, 0)) for name in categories}
    by_bookie = _per_category(table, "bookie_id", TOP_BOOKIES)
    with_racks = table.append_column("rack", _racks(table.column("bookie_id"), racks))
    by_rack = _per_category(with_racks, "rack", TOP_RACKS)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>tally audit report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>tally audit report</h1>",
        _headline(summary, counts),
        "<h2>Violations by category</h2>",
        '<p class="muted">Distinct ledgers per category (bookies for unresponsive bookies); a '
        "ledger is in at most one of the three durability categories, its worst.</p>",
        _bar_chart([(name, {name: counts[name]}) for name in categories]),
        _category_table(counts),
        "<h2>Violations by bookie</h2>",
        f'<p class="muted">Findings that name a bookie, for the {TOP_BOOKIES} bookies with '
        "the most.</p>",
        _bar_chart(by_bookie) if by_bookie else '<p class="ok">No finding names a bookie.</p>',
        "<h2>Violations by rack</h2>",
        _bar_chart(by_rack) if by_rack else '<p class="ok">No finding names a bookie.</p>',
        _legend(),
        "<h2>Worst ledgers</h2>",
        _worst_ledgers(table),
        "<h2>Over-replication</h2>",
        _over_replication(summary.get("over_replication") or {}, extra),
        "<h2>Timings</h2>",
        _timings(summary.get("timings", {})),
        "</body></html>",
    ]
    path = out / schema.REPORT_HTML
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path


def _load(violations: pa.Table | Path) -> pa.Table:
    columns = ["scope", "ledger_id", "category", "bookie_id", "missing_count", "detail"]
    if isinstance(violations, pa.Table):
        return violations.select(columns)
    return pq.read_table(violations, columns=columns)


def _load_over_replicated(rows: pa.Table | Path | None) -> pa.Table:
    columns = ["bookie_id", "entries", "bytes"]
    if rows is None:
        return schema.OVER_REPLICATED_SCHEMA.empty_table().select(columns)
    if isinstance(rows, pa.Table):
        return rows.select(columns)
    return pq.read_table(rows, columns=columns)


def _racks(bookies: pa.ChunkedArray, racks: Mapping[str, str]) -> pa.ChunkedArray:
    """The rack of each bookie ("unknown" if it has none; null where no bookie is named)."""
    known = pa.array(list(racks), pa.string())
    placed = pc.take(pa.array(list(racks.values()), pa.string()), pc.index_in(bookies, known))
    return pc.if_else(pc.is_valid(bookies), pc.fill_null(placed, "unknown"), None)


def _per_category(table: pa.Table, key: str, top: int) -> list[tuple[str, dict[str, int]]]:
    """Rows per `key` value and category, for the `top` values with the most rows."""
    named = table.filter(pc.is_valid(table.column(key)))
    if named.num_rows == 0:
        return []
    grouped = named.group_by([key, "category"]).aggregate([("category", "count")]).to_pylist()
    totals: dict[str, dict[str, int]] = {}
    for row in grouped:
        totals.setdefault(row[key], {})[row["category"]] = row["category_count"]
    ranked = sorted(totals.items(), key=lambda item: (-sum(item[1].values()), item[0]))
    return ranked[:top]


def _headline(summary: Mapping[str, Any], counts: Mapping[str, int]) -> str:
    checked = int(summary.get("ledgers_checked", 0))
    durability = sum(
        counts[c.value]
        for c in (Category.NO_REPLICA, Category.BELOW_ACK_QUORUM, Category.BELOW_WRITE_QUORUM)
    )
    found = sum(counts.values())
    verdict = (
        '<span class="ok">no violation found</span>'
        if found == 0
        else f'<span class="bad">{found:,} findings</span>, {durability:,} ledgers below '
        "their durability contract"
    )
    extra = summary.get("over_replication") or {}
    if int(extra.get("rows", 0)):
        verdict += (
            f"; apart from these, {int(extra.get('entries', 0)):,} extra copies (about "
            f"{int(extra.get('bytes', 0)):,} bytes) on {int(extra.get('ledgers', 0)):,} ledgers, "
            "which are not violations"
        )
    total = summary.get("timings", {}).get("total")
    took = f" in {float(total):,.1f} s" if total is not None else ""
    return f"<p>{checked:,} closed ledgers checked{html.escape(took)}: {verdict}.</p>"


def _over_replication(totals: Mapping[str, Any], rows: pa.Table) -> str:
    """The extra copies: totals, and the bookies holding the most bytes of them."""
    intro = (
        '<p class="muted">Entries a bookie holds although no write set of their segment puts '
        "them there, left where a bookie held a position before. An extra copy never lowers "
        "durability: not a violation, no alert; the garbage collection trims them. Bytes are "
        "payload bytes estimated at each ledger's mean entry size.</p>"
    )
    if not int(totals.get("rows", 0)):
        return intro + '<p class="ok">No extra copies.</p>'
    figures = "".join(
        f'<tr><td>{html.escape(label)}</td><td class="n">{int(totals.get(key, 0)):,}</td></tr>'
        for key, label in (
            ("ledgers", "ledgers"),
            ("rows", "segments and bookies"),
            ("entries", "extra entries"),
            ("bytes", "bytes (estimated)"),
        )
    )
    by_bookie = (
        rows.group_by("bookie_id")
        .aggregate([("entries", "sum"), ("bytes", "sum")])
        .sort_by([("bytes_sum", "descending"), ("bookie_id", "ascending")])
        .slice(0, TOP_BOOKIES)
        .to_pylist()
    )
    bookies = "".join(
        f"<tr><td>{html.escape(row['bookie_id'])}</td>"
        f'<td class="n">{row["entries_sum"]:,}</td><td class="n">{row["bytes_sum"]:,}</td></tr>'
        for row in by_bookie
    )
    return (
        f"{intro}<table>{figures}</table>"
        f'<p class="muted">The {TOP_BOOKIES} bookies holding the most bytes of extra copies.</p>'
        f"<table><tr><th>bookie</th><th>entries</th><th>bytes</th></tr>{bookies}</table>"
    )


def _bar_chart(items: Sequence[tuple[str, Mapping[str, int]]]) -> str:
    """Horizontal bars, one per item, stacked by category in severity order."""
    largest = max((sum(parts.values()) for _, parts in items), default=0) or 1
    height = _ROW_HEIGHT * len(items) + 4
    width = _LABEL_WIDTH + _BAR_WIDTH + 80
    shapes = []
    for row, (label, parts) in enumerate(items):
        y = row * _ROW_HEIGHT + 2
        shapes.append(
            f'<text x="{_LABEL_WIDTH - 6}" y="{y + 15}" text-anchor="end">'
            f"{html.escape(_shorten(label))}<title>{html.escape(label)}</title></text>"
        )
        x = float(_LABEL_WIDTH)
        for category in SEVERITY:
            count = parts.get(category.value, 0)
            if not count:
                continue
            span = _BAR_WIDTH * count / largest
            shapes.append(
                f'<rect x="{x:.1f}" y="{y + 3}" width="{max(span, 1):.1f}" height="16" '
                f'fill="{COLOURS[category]}"><title>{html.escape(category.value)}: {count:,}'
                "</title></rect>"
            )
            x += span
        shapes.append(f'<text x="{x + 6:.1f}" y="{y + 15}">{sum(parts.values()):,}</text>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img">{"".join(shapes)}</svg>'
    )


def _shorten(label: str, limit: int = 34) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _category_table(counts: Mapping[str, int]) -> str:
    rows = "".join(
        f"<tr><td>{_swatch(category)}{html.escape(category.value)}</td>"
        f'<td class="n">{counts[category.value]:,}</td>'
        f"<td>{html.escape(MEANING[category])}</td></tr>"
        for category in SEVERITY
    )
    return f"<table><tr><th>category</th><th>count</th><th>meaning</th></tr>{rows}</table>"


def _legend() -> str:
    return (
        '<p class="muted">'
        + " ".join(f"{_swatch(category)}{html.escape(category.value)}" for category in SEVERITY)
        + "</p>"
    )


def _swatch(category: Category) -> str:
    return f'<span class="swatch" style="background:{COLOURS[category]}"></span>'


def _worst_ledgers(table: pa.Table) -> str:
    """The ledgers with the worst category first, then the most findings."""
    of_ledgers = table.filter(pc.is_valid(table.column("ledger_id")))
    if of_ledgers.num_rows == 0:
        return '<p class="ok">No ledger has a finding.</p>'
    order = pa.array([category.value for category in SEVERITY])
    ranked = of_ledgers.append_column(
        "rank", pc.index_in(of_ledgers.column("category"), value_set=order)
    )
    worst = (
        ranked.group_by(["scope", "ledger_id"])
        .aggregate([("rank", "min"), ("rank", "count"), ("missing_count", "sum")])
        .sort_by([("rank_min", "ascending"), ("rank_count", "descending")])
        .slice(0, WORST_LEDGERS)
    )
    findings = ranked.join(worst, ["scope", "ledger_id"], join_type="inner").to_pylist()
    by_ledger: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for row in findings:
        by_ledger.setdefault((row["scope"], row["ledger_id"]), []).append(row)
    rows = []
    for summary in worst.to_pylist():
        found = sorted(
            by_ledger[summary["scope"], summary["ledger_id"]],
            key=lambda row: (row["rank"], row["bookie_id"] or ""),
        )
        rows.append(
            "<tr>"
            f"<td>{html.escape(_ledger_name(summary['scope'], summary['ledger_id']))}</td>"
            f"<td>{_swatch(SEVERITY[summary['rank_min']])}"
            f"{html.escape(SEVERITY[summary['rank_min']].value)}</td>"
            f"<td>{html.escape(', '.join(_distinct(row['category'] for row in found)))}</td>"
            f'<td class="n">{summary["rank_count"]:,}</td>'
            f'<td class="n">{_number(summary["missing_count_sum"])}</td>'
            f'<td class="detail">{html.escape(found[0]["detail"])}</td>'
            "</tr>"
        )
    return (
        "<table><tr><th>ledger</th><th>worst</th><th>categories</th><th>findings</th>"
        f"<th>entries</th><th>first finding</th></tr>{''.join(rows)}</table>"
    )


def _distinct(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _number(value: int | None) -> str:
    return "" if value is None else f"{value:,}"


def _ledger_name(scope: int, ledger_id: int) -> str:
    return str(LedgerId(schema.from_int64(scope), schema.from_int64(ledger_id)))


def _timings(timings: Mapping[str, Any]) -> str:
    if not timings:
        return '<p class="muted">No timings recorded.</p>'
    rows = "".join(
        f'<tr><td>{html.escape(str(stage))}</td><td class="n">{float(seconds):,.3f} s</td></tr>'
        for stage, seconds in timings.items()
    )
    return f"<table><tr><th>stage</th><th>time</th></tr>{rows}</table>"
