"""The history of a chaos run: every kind of event survives its JSON line, and a line that
is not an event is refused with where and why."""

from __future__ import annotations

import json

import pytest

from tally.core.chaos.history import (
    EVENTS,
    Added,
    Closed,
    Deleted,
    End,
    Event,
    Fault,
    Final,
    LedgerOpened,
    Read,
    Recovered,
    Run,
    Settled,
    content_digest,
    decode_event,
    decode_history,
    encode_event,
)
from tally.core.errors import MalformedData

LEDGER = "0000000000000000000000000000002a"
DIGEST = content_digest(b"entry")

ONE_OF_EACH: tuple[Event, ...] = (
    Run(t=0.0, seed=7, metadata="sqlite", duration=60.0, bookies=("b1", "b2"), wall_ms=1),
    LedgerOpened(
        t=0.1,
        actor="w1",
        log="log-1",
        ledger=LEDGER,
        ensemble_size=3,
        write_quorum=2,
        ack_quorum=2,
    ),
    Added(
        t=0.3,
        t_start=0.2,
        actor="w1",
        log="log-1",
        ledger=LEDGER,
        entry=0,
        digest=DIGEST,
        size=5,
        outcome="ok",
    ),
    Added(
        t=0.4,
        t_start=0.3,
        actor="w1",
        log="log-1",
        ledger=LEDGER,
        entry=None,
        digest=DIGEST,
        size=5,
        outcome="failed",
        error="NotEnoughBookies",
    ),
    Closed(t=0.5, t_start=0.4, actor="w1", log="log-1", ledger=LEDGER, outcome="ok", last_entry=0),
    Recovered(
        t=0.6,
        t_start=0.5,
        actor="r1",
        log="log-1",
        ledger=LEDGER,
        outcome="failed",
        error="LedgerRecoveryFailed",
    ),
    Read(t=0.7, actor="r1", ledger=LEDGER, first=0, digests=(DIGEST,)),
    Deleted(t=0.8, t_start=0.7, actor="retention", log="log-1", ledger=LEDGER, outcome="ok"),
    Fault(t=0.9, fault="kill", target="b1", action="start", detail="SIGKILL"),
    Final(t=1.0, ledger=LEDGER, state="CLOSED", last_entry=1, length=10, digests=(DIGEST, None)),
    Settled(
        t=1.1,
        seconds=3.5,
        under_replicated=0,
        replicas_check_findings=0,
        audit_violations=0,
        corrupt_copies=0,
        deleted_data_left=0,
        detail={"audit": {"ledgers": 3}},
    ),
    End(t=1.2, operations=9, acknowledged=1, faults=1),
)


def test_the_sample_has_every_kind() -> None:
    assert {event.kind for event in ONE_OF_EACH} == set(EVENTS)


@pytest.mark.parametrize("event", ONE_OF_EACH, ids=lambda event: event.kind)
def test_every_kind_round_trips_through_its_line(event: Event) -> None:
    line = encode_event(event)
    assert "\n" not in line
    assert json.loads(line)["kind"] == event.kind
    assert decode_event(line) == event


def test_a_history_round_trips_skipping_blank_lines() -> None:
    lines = [encode_event(event) + "\n" for event in ONE_OF_EACH]
    lines.insert(3, "\n")
    lines.insert(5, "   \n")
    assert list(decode_history(lines)) == list(ONE_OF_EACH)


def test_content_digest_names_content() -> None:
    assert content_digest(b"a") == content_digest(b"a")
    assert content_digest(b"a") != content_digest(b"b")
    assert len(content_digest(b"")) == 32
    assert int(content_digest(b"a"), 16) >= 0


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "history: not JSON: "),
        ("[1, 2]", "history: an event is a JSON object, not list"),
        ('"run"', "history: an event is a JSON object, not str"),
        ('{"kind": "nap", "t": 1}', "history: unknown event kind 'nap'"),
        ('{"t": 1}', "history: unknown event kind None"),
        ('{"kind": 3, "t": 1}', "history: unknown event kind 3"),
        (
            '{"kind": "end", "t": 1, "operations": 1, "acknowledged": 1, "faults": 0, "x": 1}',
            "history: a end event has no field 'x'",
        ),
        ('{"kind": "end", "t": 1, "operations": 1}', "history: a end event: "),
    ],
)
def test_a_line_that_is_no_event_is_refused(line: str, reason: str) -> None:
    with pytest.raises(MalformedData) as refused:
        decode_event(line)
    assert str(refused.value).startswith(reason)


def test_a_refusal_names_the_line_of_the_history() -> None:
    lines = [encode_event(ONE_OF_EACH[0]), "", '{"kind": "nap", "t": 1}']
    events = decode_history(lines, source="run.jsonl")
    assert next(events) == ONE_OF_EACH[0]
    with pytest.raises(MalformedData, match=r"^run\.jsonl line 3: unknown event kind 'nap'$"):
        next(events)
