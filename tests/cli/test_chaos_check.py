"""`tally chaos check HISTORY`, run for real in a subprocess: a clean history passes with its
counts, a violating one fails naming the invariant, and a history it cannot read ends in one
line saying where and what to do."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.chaos import L1, Script, clean_script, digest, ledger_name
from tests.support.processes import tally


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    (line,) = [line for line in stderr.splitlines() if line.strip()]
    return line


def test_a_clean_history_passes_with_its_counts(tmp_path: Path) -> None:
    history = clean_script().write(tmp_path / "history.jsonl")
    result = tally("chaos", "check", str(history))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"{history}: 18 operations, 8 acknowledged adds, 4 ledgers, 1 read checked",
        "faults: kill 1",
        "no violation: every invariant holds",
    ]


def test_a_violating_history_fails_naming_the_invariant_ledger_and_entries(
    tmp_path: Path,
) -> None:
    script = Script().open(L1).adds(L1, 6).recover(L1, 2).final(L1, 2).finish(corrupt_copies=1)
    history = script.write(tmp_path / "history.jsonl")
    result = tally("chaos", "check", str(history))
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines()[2:] == [
        "2 violations (Settled 1, NoTruncation 1):",
        "  Settled: the settled cluster has corrupt_copies = 1",
        f"  NoTruncation ledger {L1} entries 3..5: it ends at 2 (recovered by w1 at t=8, "
        "CLOSED in its final), below 3 acknowledged entries",
    ]


def test_json_lists_every_violation(tmp_path: Path) -> None:
    script = Script()
    for number in range(60):
        ledger = ledger_name(number)
        script.open(ledger, log=f"log-{number}").add(ledger, 0).close(ledger, 0)
        script.final(ledger, 0, seen=[digest(ledger, 1)])
    history = script.finish().write(tmp_path / "history.jsonl")

    listed = tally("chaos", "check", str(history))
    assert listed.returncode == 1
    lines = listed.stdout.splitlines()
    assert lines[2] == "60 violations (AllAckedEntriesAreReadable 60):"
    assert len(lines) == 3 + 50 + 1
    assert lines[-1] == "... and 10 more: --json lists them all"

    as_json = tally("chaos", "check", "--json", str(history))
    assert as_json.returncode == 1
    verdict = json.loads(as_json.stdout)
    assert verdict["ok"] is False
    assert verdict["acknowledged"] == 60
    assert len(verdict["violations"]) == 60
    assert verdict["violations"][0] == {
        "invariant": "AllAckedEntriesAreReadable",
        "ledger": ledger_name(0),
        "entries": [0],
        "detail": "acknowledged entry 0 read back with other content than acknowledged",
    }


def test_a_malformed_line_is_one_error_naming_the_line(tmp_path: Path) -> None:
    history = clean_script().write(tmp_path / "history.jsonl")
    lines = history.read_text().splitlines(keepends=True)
    lines[2] = lines[2][:20] + "\n"  # a line cut short
    history.write_text("".join(lines))
    result = tally("chaos", "check", str(history))
    assert result.returncode == 1
    assert result.stdout == ""
    line = one_line(result.stderr)
    assert line.startswith(f"error: {history} line 3: not JSON: ")
    assert "fix or delete that line" in line


def test_a_missing_history_is_one_error_saying_what_to_give(tmp_path: Path) -> None:
    missing = tmp_path / "no-history.jsonl"
    result = tally("chaos", "check", str(missing))
    assert result.returncode == 1
    assert one_line(result.stderr) == (
        f"error: cannot read the history {missing}: No such file or directory: give the path "
        "of the JSON-lines file a chaos run wrote"
    )
