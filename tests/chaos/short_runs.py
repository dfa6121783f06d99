"""A short chaos run through the CLI, and what every such run must show."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tests.support.processes import tally

DISK_FAULTS = frozenset({"disk_full", "fail_ledger_dir"})
"""What the seeds of the short runs plan beside the rest: disk faults need root, as the
tests of full and failing disks do."""


def check_short_run(out: Path, *options: str, faults: frozenset[str] = frozenset()) -> None:
    """Run `tally chaos` to completion and check its verdict, history and report, and that
    `faults` were injected: kinds the seed plans before its first disk repair, which on a
    loaded machine delays the faults after it (a fault not started by the end is left out)."""
    result = tally("chaos", "--out", str(out), "--writers", "2", *options, timeout=540)
    report = (out / "report.md").read_text() if (out / "report.md").exists() else ""
    assert result.returncode == 0, result.stdout + result.stderr + report
    assert "no violation: every invariant holds" in result.stdout
    assert "Traceback" not in result.stderr
    kinds: Counter[str] = Counter()
    with (out / "history.jsonl").open() as history:
        for line in history:
            event = json.loads(line)
            kinds[event["kind"]] += 1
            if event["kind"] == "fault" and event["action"] == "start":
                kinds[f"fault:{event['fault']}"] += 1
    assert kinds["added"] > 500, kinds
    assert kinds["final"] >= 4, kinds
    assert sum(1 for kind in kinds if kind.startswith("fault:")) >= 3, kinds
    assert {f"fault:{fault}" for fault in faults} <= set(kinds), kinds
    assert (out / "report.html").read_text().count("<svg") == 1
    assert not (out / "cluster").exists(), "a run that passed leaves no cluster data"
