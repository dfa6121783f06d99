"""A chaos run's report: `report.md` (what ran, what was injected, what the checker found)
and `report.html`, the same with a timeline drawn in inline SVG: the faults, the adds
acknowledged per second, their p99 latency, and the ledgers marked under-replicated over
time. One file, no script, no network: it opens anywhere, years later.
"""

from __future__ import annotations

import html
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tally.core.chaos.history import Added, Fault, Run, Settled, decode_history

SAMPLES = "samples.jsonl"
"""The harness's samples of the cluster over time (under-replicated ledgers), one a line."""
WIDTH, LANE, GAP = 1100, 120, 30


@dataclass(frozen=True)
class Finding:
    invariant: str
    ledger: str
    entries: str
    detail: str


@dataclass
class Timeline:
    seconds: int = 0
    acked: Counter[int] = field(default_factory=Counter)
    latencies: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    faults: list[tuple[float, float, str, str]] = field(default_factory=list)
    """(start, end, kind, target)."""
    under_replicated: list[tuple[float, int]] = field(default_factory=list)
    run: Run | None = None
    settled: Settled | None = None
    fault_counts: Counter[str] = field(default_factory=Counter)

    def p99(self, second: int) -> float:
        found = sorted(self.latencies.get(second, ()))
        return found[min(len(found) - 1, math.ceil(len(found) * 0.99) - 1)] if found else 0.0


def read_timeline(out: Path, history: Path) -> Timeline:
    timeline = Timeline()
    open_faults: dict[tuple[str, str], float] = {}
    with history.open(encoding="utf-8") as lines:
        for event in decode_history(lines, str(history)):
            timeline.seconds = max(timeline.seconds, int(event.t) + 1)
            if isinstance(event, Run):
                timeline.run = event
            elif isinstance(event, Settled):
                timeline.settled = event
            elif isinstance(event, Added) and event.outcome == "ok":
                second = int(event.t)
                timeline.acked[second] += 1
                timeline.latencies[second].append(event.t - event.t_start)
            elif isinstance(event, Fault):
                key = (event.fault, event.target)
                if event.action == "start":
                    timeline.fault_counts[event.fault] += 1
                    open_faults[key] = event.t
                    if event.fault in ("flip_bytes", "kill_writer", "exited"):
                        timeline.faults.append((event.t, event.t, event.fault, event.target))
                elif key in open_faults:
                    timeline.faults.append((open_faults.pop(key), event.t, *key))
    samples = out / SAMPLES
    if samples.exists():
        for line in samples.read_text().splitlines():
            sample = json.loads(line)
            timeline.under_replicated.append((sample["t"], sample["under_replicated"]))
    return timeline


def write_report(
    out: Path, history: Path, findings: Sequence[Finding], counts: dict[str, int]
) -> Path:
    """Write report.md and report.html into `out`; the HTML's path."""
    timeline = read_timeline(out, history)
    (out / "report.md").write_text(_markdown(timeline, findings, counts))
    page = out / "report.html"
    page.write_text(_html(timeline, findings, counts))
    return page


def _summary_rows(timeline: Timeline, counts: dict[str, int]) -> list[tuple[str, str]]:
    run, settled = timeline.run, timeline.settled
    rows = [
        ("seed", str(run.seed) if run else "?"),
        ("metadata store", run.metadata if run else "?"),
        ("planned duration", f"{run.duration:.0f} s" if run else "?"),
        ("bookies", str(len(run.bookies)) if run else "?"),
        *((name.replace("_", " "), f"{value:,}") for name, value in sorted(counts.items())),
        (
            "faults",
            ", ".join(f"{k} {v}" for k, v in sorted(timeline.fault_counts.items())) or "none",
        ),
    ]
    if settled is not None:
        rows.append(("time to settle", f"{settled.seconds:.1f} s"))
    return rows


def _markdown(timeline: Timeline, findings: Sequence[Finding], counts: dict[str, int]) -> str:
    lines = ["# Chaos run", "", "| | |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in _summary_rows(timeline, counts)]
    lines += ["", f"## Invariant violations: {len(findings)}", ""]
    lines += [
        f"- **{f.invariant}** ledger {f.ledger or '-'} entries {f.entries or '-'}: {f.detail}"
        for f in findings
    ] or ["None: every acknowledged entry was read back, as acknowledged."]
    return "\n".join(lines) + "\n"


def _html(timeline: Timeline, findings: Sequence[Finding], counts: dict[str, int]) -> str:
    rows = "".join(
        f"<tr><th>{html.escape(n)}</th><td>{html.escape(v)}</td></tr>"
        for n, v in _summary_rows(timeline, counts)
    )
    found = (
        "".join(
            f"<li><b>{html.escape(f.invariant)}</b> ledger {html.escape(f.ledger)} entries "
            f"{html.escape(f.entries)}: {html.escape(f.detail)}</li>"
            for f in findings
        )
        or "<li>None: every acknowledged entry was read back, as acknowledged.</li>"
    )
    return (
        "<!doctype html><meta charset=utf-8><title>tally chaos run</title>"
        "<style>body{font:14px sans-serif;margin:2em}th{text-align:left;padding-right:1em}"
        "svg{border:1px solid #ccc}</style>"
        f"<h1>Chaos run</h1><table>{rows}</table>"
        f"<h2>Invariant violations: {len(findings)}</h2><ul>{found}</ul>"
        f"<h2>Timeline</h2>{_svg(timeline)}"
    )


LEFT = 150
"""The timeline's left margin: the fault lanes' names."""
LEGEND = (
    ("network (delay, stall, cut, reset, partition)", "#e93"),
    ("killed, or exited by itself", "#c33"),
    ("paused", "#88c"),
    ("bytes flipped", "#a6a"),
    ("disk full or failed", "#963"),
)


@dataclass(frozen=True)
class _Axis:
    """Seconds of the run to x pixels."""

    span: float

    def __call__(self, t: float) -> float:
        return LEFT + (WIDTH - LEFT - 10) * t / self.span


def _svg(timeline: Timeline) -> str:
    span = max(timeline.seconds, 1)
    x = _Axis(span)
    targets = sorted({target for _, _, _, target in timeline.faults})
    parts = ['<text x="4" y="14">faults, by target (hover a bar for its detail)</text>']
    for lane, target in enumerate(targets):
        parts.append(f'<text x="4" y="{30 + 14 * lane}">{html.escape(target)}</text>')
    for start, end, kind, target in timeline.faults:
        y = 20 + 14 * targets.index(target)
        width = max(x(end) - x(start), 2)
        parts.append(
            f'<rect x="{x(start):.1f}" y="{y}" width="{width:.1f}" height="11" '
            f'fill="{_colour(kind)}"><title>{html.escape(kind)} {html.escape(target)} '
            f"{start:.1f}-{end:.1f} s</title></rect>"
        )
    top = 20 + 14 * len(targets) + 8
    left = LEFT
    for what, colour in LEGEND:
        parts.append(f'<rect x="{left}" y="{top}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{left + 14}" y="{top + 9}">{html.escape(what)}</text>')
        left += 14 + 6 * len(what) + 16  # about 6 px a character at 11 px
    top += 14 + GAP
    charts_top = top
    seconds = range(span)
    parts += _series("adds acknowledged / s", [(s, timeline.acked[s]) for s in seconds], top, x)
    top += LANE + GAP
    parts += _series("p99 add latency (s)", [(s, timeline.p99(s)) for s in seconds], top, x)
    top += LANE + GAP
    parts += _series("ledgers under-replicated", timeline.under_replicated, top, x)
    bottom = top + LANE
    parts += _time_axis(span, x, charts_top - 16, bottom)
    if timeline.run is not None:
        parts += _marker(x(timeline.run.duration), charts_top - 16, bottom, "faults end")
    if timeline.settled is not None:
        parts += _marker(x(timeline.settled.t), charts_top - 16, bottom, "settled")
    height = bottom + 36
    return (
        f'<svg width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11" '
        f'xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>'
    )


def _time_axis(span: int, x: _Axis, top: int, bottom: int) -> list[str]:
    """Seconds under the charts, a faint line up through them at each tick."""
    step = next(s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800) if span / s <= 12)
    parts = []
    for t in range(0, span + 1, step):
        parts.append(
            f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{bottom}" stroke="#eee"/>'
        )
        parts.append(f'<text x="{x(t) - 8:.1f}" y="{bottom + 14}">{t} s</text>')
    return parts


def _marker(at: float, top: int, bottom: int, what: str) -> list[str]:
    return [
        f'<line x1="{at:.1f}" y1="{top}" x2="{at:.1f}" y2="{bottom}" stroke="#555" '
        'stroke-dasharray="4 3"/>',
        f'<text x="{at - 3:.1f}" y="{bottom + 28}" text-anchor="end">{html.escape(what)}</text>',
    ]


def _series(name: str, points: Iterable[tuple[float, float]], top: int, x: _Axis) -> list[str]:
    found = list(points)
    peak = max((value for _, value in found), default=0)
    scale = peak or 1
    path = " ".join(f"{x(t):.1f},{top + LANE - LANE * value / scale:.1f}" for t, value in found)
    return [
        f'<text x="4" y="{top - 4}">{html.escape(name)} (max {peak:,.3g})</text>',
        f'<line x1="{LEFT}" y1="{top + LANE}" x2="{WIDTH - 10}" y2="{top + LANE}" stroke="#999"/>',
        f'<polyline fill="none" stroke="#2a6" points="{path}"/>',
    ]


def _colour(kind: str) -> str:
    """The legend's colour of a fault kind."""
    if kind.startswith("network"):
        return LEGEND[0][1]
    if kind.startswith("kill") or kind == "exited":
        return LEGEND[1][1]
    if kind.startswith("pause"):
        return LEGEND[2][1]
    if kind == "flip_bytes":
        return LEGEND[3][1]
    return LEGEND[4][1]
