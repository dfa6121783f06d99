"""A chaos run's report, from a small history: what a reader of report.md and of the
HTML timeline sees."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tally.chaos.report import SAMPLES, Finding, write_report
from tally.core.chaos.history import Added, Fault, Run, Settled, encode_event

BOOKIE = "127.0.0.1:4001"


def history(path: Path) -> Path:
    events = [
        Run(t=0.0, seed=7, metadata="sqlite", duration=20.0, bookies=(BOOKIE,), wall_ms=0),
        *(
            Added(
                t=1.0 + n / 10,
                t_start=1.0 + n / 10 - 0.005,
                actor="writer-0",
                log="log-0",
                ledger="00000001",
                entry=n,
                digest="d",
                size=10,
                outcome="ok",
            )
            for n in range(50)
        ),
        Fault(t=3.0, fault="fail_ledger_dir", target=BOOKIE, action="start", detail="ledgers-0"),
        Fault(t=8.0, fault="fail_ledger_dir", target=BOOKIE, action="end", detail="replaced"),
        Fault(t=9.0, fault="kill_writer", target="log-0", action="start", detail=""),
        Settled(
            t=24.0,
            seconds=4.0,
            under_replicated=0,
            replicas_check_findings=0,
            audit_violations=0,
            corrupt_copies=0,
            deleted_data_left=0,
        ),
    ]
    path.write_text("".join(encode_event(event) + "\n" for event in events))
    return path


def test_the_report_names_what_ran_what_was_injected_and_what_broke(tmp_path: Path) -> None:
    (tmp_path / SAMPLES).write_text(
        "".join(json.dumps({"t": t, "under_replicated": n}) + "\n" for t, n in ((2, 0), (4, 3)))
    )
    found = [Finding("NoTruncation", "00000001", "40-49", "closed at 39")]
    page = write_report(tmp_path, history(tmp_path / "h.jsonl"), found, {"operations": 53})
    markdown = (tmp_path / "report.md").read_text()
    assert "| seed | 7 |" in markdown
    assert "| faults | fail_ledger_dir 1, kill_writer 1 |" in markdown
    assert "| time to settle | 4.0 s |" in markdown
    assert "**NoTruncation** ledger 00000001 entries 40-49: closed at 39" in markdown

    svg = re.search(r"<svg.*</svg>", page.read_text(), re.S)
    assert svg is not None
    timeline = svg.group(0)
    assert f">{BOOKIE}</text>" in timeline
    assert ">log-0</text>" in timeline
    assert "disk full or failed" in timeline  # the legend
    assert f"<title>fail_ledger_dir {BOOKIE} 3.0-8.0 s</title>" in timeline
    assert ">0 s</text>" in timeline
    assert ">20 s</text>" in timeline
    assert ">faults end</text>" in timeline
    assert ">settled</text>" in timeline
    assert "adds acknowledged / s (max 10)" in timeline
    assert "ledgers under-replicated (max 3)" in timeline


def test_a_run_without_faults_or_samples_still_draws(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    run = Run(t=0.0, seed=1, metadata="zk", duration=5.0, bookies=(BOOKIE,), wall_ms=0)
    path.write_text(encode_event(run) + "\n")
    page = write_report(tmp_path, path, [], {})
    assert "| faults | none |" in (tmp_path / "report.md").read_text()
    assert "ledgers under-replicated (max 0)" in page.read_text()
