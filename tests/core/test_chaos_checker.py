"""The chaos checker: a clean history passes; each invariant, broken by a minimal history,
is caught under its name with its ledger and entries; and random clean histories of a small
model of writers pass, until one mutation a real fault would make is caught."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tally.core.chaos.checker import SETTLED_COUNTS, Invariant, Verdict, Violation, check_history
from tally.core.chaos.history import Added, Closed, End, Event, Final, Recovered
from tests.support.chaos import L1, L2, L3, L4, Script, clean_script, digest, digests, ledger_name


def only(verdict: Verdict, invariant: Invariant) -> Violation:
    """The one violation of a verdict, which must be of `invariant`."""
    assert len(verdict.violations) == 1, verdict.violations
    (violation,) = verdict.violations
    assert violation.invariant is invariant, violation
    return violation


def found(verdict: Verdict) -> set[tuple[Invariant, str, tuple[int, ...]]]:
    return {(v.invariant, v.ledger, v.entries) for v in verdict.violations}


# --- a clean history ------------------------------------------------------------------------


def test_a_clean_history_has_no_violation_and_its_counts() -> None:
    verdict = clean_script().check()
    assert verdict.violations == ()
    assert verdict.ok
    assert verdict.acknowledged == 3 + 2 + 1 + 2
    assert verdict.operations == 4 + 9 + 2 + 1 + 1 + 1
    assert verdict.ledgers == 4
    assert verdict.reads_checked == 1
    assert verdict.faults == {"kill": 1}


def test_an_empty_history_is_incomplete() -> None:
    verdict = check_history([])
    assert [v.invariant for v in verdict.violations] == [
        Invariant.INCOMPLETE,
        Invariant.INCOMPLETE,
        Invariant.SETTLED,
    ]


# --- AllAckedEntriesAreReadable -------------------------------------------------------------


def test_an_acknowledged_ledger_without_a_final_is_caught() -> None:
    violation = only(
        Script().open(L1).adds(L1, 2).close(L1, 1).finish().check(),
        Invariant.ALL_ACKED_ENTRIES_ARE_READABLE,
    )
    assert (violation.ledger, violation.entries) == (L1, (0, 1))
    assert "no final" in violation.detail


def test_an_unreadable_entry_is_caught() -> None:
    seen = (digest(L1, 0), None, digest(L1, 2))
    violation = only(
        Script().open(L1).adds(L1, 3).close(L1, 2).final(L1, 2, seen=seen).finish().check(),
        Invariant.ALL_ACKED_ENTRIES_ARE_READABLE,
    )
    assert (violation.ledger, violation.entries) == (L1, (1,))
    assert violation.detail == "acknowledged entry 1 not read back: the read failed"


def test_an_entry_read_back_with_other_content_is_caught_once() -> None:
    seen = (digest(L1, 0), digest(L1, 0))
    violation = only(
        Script().open(L1).adds(L1, 2).close(L1, 1).final(L1, 1, seen=seen).finish().check(),
        Invariant.ALL_ACKED_ENTRIES_ARE_READABLE,
    )
    assert (violation.ledger, violation.entries) == (L1, (1,))
    assert "other content" in violation.detail


def test_an_open_ledger_whose_final_ends_before_an_acknowledged_entry_is_caught() -> None:
    violation = only(
        Script().open(L1).adds(L1, 4).final(L1, 1, state="OPEN").finish().check(),
        Invariant.ALL_ACKED_ENTRIES_ARE_READABLE,
    )
    assert (violation.ledger, violation.entries) == (L1, (2, 3))
    assert "past its final end 1 (OPEN)" in violation.detail


def test_a_ledger_gone_in_the_end_that_nobody_deleted_is_caught() -> None:
    violation = only(
        Script().open(L1).adds(L1, 2).close(L1, 1).final(L1, -1, state="GONE", seen=())
        .finish().check(),
        Invariant.ALL_ACKED_ENTRIES_ARE_READABLE,
    )  # fmt: skip
    assert (violation.ledger, violation.entries) == (L1, (0, 1))


def test_failed_adds_and_ledgers_the_workload_deleted_are_not_judged() -> None:
    script = (
        Script()
        .open(L1).adds(L1, 2).close(L1, 1).delete(L1)
        .open(L2).add(L2, 0, outcome="failed").add(L2, None, outcome="failed")
        .finish()
    )  # fmt: skip
    assert script.check().violations == ()


def test_a_failed_delete_exempts_a_ledger_only_if_it_is_gone() -> None:
    gone = (
        Script().open(L1).adds(L1, 2).close(L1, 1).delete(L1, outcome="failed")
        .final(L1, -1, state="DELETED", seen=()).finish()
    )  # fmt: skip
    assert gone.check().violations == ()
    kept = (
        Script().open(L1).adds(L1, 2).close(L1, 1).delete(L1, outcome="failed")
        .final(L1, 1, seen=(digest(L1, 0), None)).finish()
    )  # fmt: skip
    assert only(kept.check(), Invariant.ALL_ACKED_ENTRIES_ARE_READABLE).entries == (1,)


# --- NoTruncation ---------------------------------------------------------------------------


def test_a_close_below_an_acknowledged_entry_is_caught() -> None:
    verdict = Script().open(L1).adds(L1, 3).close(L1, 1).final(L1, 2).finish().check()
    assert found(verdict) == {
        (Invariant.NO_TRUNCATION, L1, (2,)),
        (Invariant.NO_DIVERGENCE, L1, (2,)),  # the final closed it at 2
    }


def test_a_recovery_below_an_acknowledged_entry_is_caught_with_the_final_that_agrees() -> None:
    violation = only(
        Script().open(L1).adds(L1, 3).recover(L1, 0).final(L1, 0).finish().check(),
        Invariant.NO_TRUNCATION,
    )
    assert (violation.ledger, violation.entries) == (L1, (1, 2))
    assert violation.detail.startswith("it ends at 0 (recovered by w1 at t=5, CLOSED in its ")


# --- NoDivergence ---------------------------------------------------------------------------


def test_a_read_of_other_content_than_acknowledged_is_caught() -> None:
    wrong = (digest(L1, 0), "f" * 32)
    violation = only(
        Script().open(L1).adds(L1, 2).read(L1, 0, wrong).close(L1, 1).final(L1, 1)
        .finish().check(),
        Invariant.NO_DIVERGENCE,
    )  # fmt: skip
    assert (violation.ledger, violation.entries) == (L1, (1,))
    assert violation.detail == (
        "a read by r0 at t=4 saw other content than the add acknowledged to w0 at entry 1"
    )


def test_a_read_logged_before_the_acknowledgement_it_contradicts_is_caught() -> None:
    violation = only(
        Script().open(L1).add(L1, 0).read(L1, 0, [digest(L1, 0), "f" * 32]).add(L1, 1)
        .close(L1, 1).final(L1, 1).finish().check(),
        Invariant.NO_DIVERGENCE,
    )  # fmt: skip
    assert (violation.ledger, violation.entries) == (L1, (1,))
    assert "the add acknowledged to w0 has other content than a read by r0" in violation.detail


def test_two_reads_of_an_entry_never_acknowledged_that_disagree_are_caught() -> None:
    script = (
        Script().open(L1).add(L1, 0).add(L1, 1, outcome="failed")
        .read(L1, 0, [digest(L1, 0), "a" * 32]).read(L1, 1, ["b" * 32], actor="r1")
        .recover(L1, 1).final(L1, 1, seen=(digest(L1, 0), "a" * 32)).finish()
    )  # fmt: skip
    violation = only(script.check(), Invariant.NO_DIVERGENCE)
    assert (violation.ledger, violation.entries) == (L1, (1,))
    assert violation.detail.startswith("a read by r1 at t=5 saw other content than a read by r0")


def test_a_final_read_that_contradicts_a_read_of_an_unacknowledged_entry_is_caught() -> None:
    script = (
        Script().open(L1).add(L1, 0).add(L1, 1, outcome="failed")
        .read(L1, 0, [digest(L1, 0), "a" * 32]).recover(L1, 1)
        .final(L1, 1, seen=(digest(L1, 0), "b" * 32)).finish()
    )  # fmt: skip
    violation = only(script.check(), Invariant.NO_DIVERGENCE)
    assert (violation.ledger, violation.entries) == (L1, (1,))
    assert violation.detail.startswith("the final read has other content than a read by r0")


def test_a_ledger_closed_at_two_ends_is_caught() -> None:
    script = (
        Script().open(L1).adds(L1, 2).add(L1, 2, outcome="failed").close(L1, 1)
        .recover(L1, 2).final(L1, 2, seen=(*digests(L1, 1), digest(L1, 2))).finish()
    )  # fmt: skip
    violation = only(script.check(), Invariant.NO_DIVERGENCE)
    assert (violation.ledger, violation.entries) == (L1, (2,))
    assert violation.detail == (
        "it was closed at 2 different ends: 1 (closed by w0 at t=5); "
        "2 (recovered by w1 at t=6, CLOSED in its final)"
    )


# --- Fencing --------------------------------------------------------------------------------


def test_an_add_acknowledged_past_the_end_after_another_clients_recovery_is_caught() -> None:
    verdict = (
        Script().open(L1).adds(L1, 2).recover(L1, 1, t=10).add(L1, 2, t=11).final(L1, 1)
        .finish().check()
    )  # fmt: skip
    assert found(verdict) == {
        (Invariant.FENCING, L1, (2,)),
        (Invariant.NO_TRUNCATION, L1, (2,)),
    }
    (fencing,) = (v for v in verdict.violations if v.invariant is Invariant.FENCING)
    assert fencing.detail == (
        "entry 2 acknowledged to w0 after it was recovered by w1 at t=10, fenced and closed at 1"
    )


@pytest.mark.parametrize(
    ("ack_t", "recoverer"),
    [(9.0, "w1"), (10.0, "w1"), (11.0, "w0")],
    ids=["before", "at the same time", "by the writer itself"],
)
def test_an_add_not_after_another_clients_recovery_is_no_fencing_violation(
    ack_t: float, recoverer: str
) -> None:
    verdict = (
        Script().open(L1).adds(L1, 2).recover(L1, 1, actor=recoverer, t=10)
        .add(L1, 2, t=ack_t).final(L1, 1).finish().check()
    )  # fmt: skip
    assert only(verdict, Invariant.NO_TRUNCATION).entries == (2,)


# --- EntryOrder -----------------------------------------------------------------------------


@pytest.mark.parametrize("lines", ["in time order", "in entry order"])
def test_an_entry_acknowledged_before_the_one_before_it_is_caught(lines: str) -> None:
    script = Script().open(L1)
    if lines == "in time order":
        script.add(L1, 0, t=2).add(L1, 2, t=3).add(L1, 1, t=4)
    else:
        script.add(L1, 0, t=2).add(L1, 1, t=4).add(L1, 2, t=3)
    violation = only(
        script.close(L1, 2).final(L1, 2).finish().check(),
        Invariant.ENTRY_ORDER,
    )
    assert (violation.ledger, violation.entries) == (L1, (1, 2))
    assert violation.detail == "entry 2 was acknowledged at t=3, before entry 1 at t=4"


def test_acknowledgements_at_the_same_time_in_either_order_pass() -> None:
    script = (
        Script().open(L1).add(L1, 0, t=2).add(L1, 2, t=3).add(L1, 1, t=3).close(L1, 2)
        .final(L1, 2).finish()
    )  # fmt: skip
    assert script.check().violations == ()


def test_an_entry_acknowledged_past_a_gap_is_caught() -> None:
    script = Script().open(L1).add(L1, 0).add(L1, 3).close(L1, 3)
    script.final(L1, 3, seen=(digest(L1, 0), None, None, digest(L1, 3))).finish()
    violation = only(script.check(), Invariant.ENTRY_ORDER)
    assert (violation.ledger, violation.entries) == (L1, (1, 2))
    assert violation.detail == "2 entries never acknowledged, yet entry 3 was"


def test_an_entry_acknowledged_twice_is_caught() -> None:
    script = Script().open(L1).adds(L1, 2).add(L1, 1).close(L1, 1).final(L1, 1).finish()
    violation = only(script.check(), Invariant.ENTRY_ORDER)
    assert (violation.ledger, violation.entries) == (L1, (1,))
    assert violation.detail.startswith("entry 1 was acknowledged twice")


def test_an_acknowledged_add_without_an_entry_id_is_malformed() -> None:
    script = Script().open(L1).add(L1, None).finish()
    violation = only(script.check(), Invariant.ENTRY_ORDER)
    assert (violation.ledger, violation.entries) == (L1, ())
    assert "malformed" in violation.detail


# --- OnlyOneLedgerOpenAtATime ---------------------------------------------------------------


def test_a_ledger_opened_while_the_previous_one_of_its_log_is_open_is_caught() -> None:
    script = (
        Script().open(L1).add(L1, 0).open(L2).close(L1, 0).final(L1, 0)
        .final(L2, -1, state="OPEN", seen=()).finish()
    )  # fmt: skip
    violation = only(script.check(), Invariant.ONLY_ONE_LEDGER_OPEN_AT_A_TIME)
    assert (violation.ledger, violation.entries) == (L2, ())
    assert violation.detail == (
        f"log log-0 opened it at t=3 while its ledger {L1} was open (ended at t=4)"
    )


def test_a_ledger_never_ended_blocks_every_later_one_of_its_log() -> None:
    script = Script().open(L1).open(L2).close(L2, -1).open(L3).open(L4, log="log-1").finish()
    verdict = script.check()
    assert found(verdict) == {
        (Invariant.ONLY_ONE_LEDGER_OPEN_AT_A_TIME, L2, ()),
        (Invariant.ONLY_ONE_LEDGER_OPEN_AT_A_TIME, L3, ()),
    }
    assert all("never ended" in v.detail for v in verdict.violations)


def test_a_takeovers_recovery_ends_the_failed_writers_ledger() -> None:
    script = (
        Script().open(L1).add(L1, 0).add(L1, 1, outcome="failed").recover(L1, 0, t=5)
        .open(L2, actor="w1", t=5).close(L2, -1, actor="w1").open(L3, actor="w1")
        .final(L1, 0).finish()
    )  # fmt: skip
    assert script.check().violations == ()


def test_a_close_logged_after_the_next_open_but_timed_before_it_passes() -> None:
    script = Script().open(L1, t=1).open(L2, t=5).close(L1, -1, t=4).finish()
    assert script.check().violations == ()


# --- Settled --------------------------------------------------------------------------------


def test_a_history_that_never_settled_is_caught() -> None:
    script = Script().open(L1).close(L1, -1)
    script.events.append(End(t=9, operations=2, acknowledged=0, faults=0))
    violation = only(script.check(), Invariant.SETTLED)
    assert (violation.ledger, violation.entries) == ("", ())


@pytest.mark.parametrize("field", SETTLED_COUNTS)
def test_each_finding_of_the_settled_cluster_is_caught(field: str) -> None:
    violation = only(Script().finish(**{field: 3}).check(), Invariant.SETTLED)
    assert violation.detail == f"the settled cluster has {field} = 3"


def test_a_deleted_ledger_that_came_back_is_caught() -> None:
    script = Script().open(L1).adds(L1, 1).close(L1, 0).delete(L1).final(L1, 0).finish()
    violation = only(script.check(), Invariant.SETTLED)
    assert (violation.ledger, violation.entries) == (L1, ())
    assert (
        violation.detail == "the workload deleted it, yet it came back: its final state is CLOSED"
    )


# --- Incomplete -----------------------------------------------------------------------------


def test_a_history_cut_short_is_incomplete_and_said_first() -> None:
    script = Script().open(L1).adds(L1, 1).close(L1, 0).final(L1, 0).finish(end=False)
    violation = only(script.check(), Invariant.INCOMPLETE)
    assert violation.detail == "the history has no end event: the run was cut short"
    headless = Script(begin=False).open(L1).adds(L1, 1).finish().check()
    assert [v.invariant for v in headless.violations] == [
        Invariant.INCOMPLETE,
        Invariant.ALL_ACKED_ENTRIES_ARE_READABLE,
    ]


# --- random histories of a model of writers -------------------------------------------------

LOGS = 3


@dataclasses.dataclass
class _Log:
    writer: str
    ledger: str | None = None
    next_entry: int = 0
    generation: int = 0


class Model:
    """Writers that behave: per log one ledger open at a time, adds acknowledged in entry
    order, a close at the last acknowledged entry, a takeover's recovery at the last entry
    stored, and a settled cluster reading back exactly that."""

    def __init__(self) -> None:
        self.script = Script()
        self.logs = [_Log(writer=f"w{log}.0") for log in range(LOGS)]
        self.ledgers = 0
        self.ends: dict[str, int] = {}
        """Ledgers ended (closed or recovered), by their last entry."""
        self.open: dict[str, int] = {}
        """Ledgers still open, by their last acknowledged entry."""
        self.deleted: set[str] = set()

    def step(self, action: str, log_index: int, pick: int) -> None:
        log = self.logs[log_index]
        name = f"log-{log_index}"
        if log.ledger is None:
            self.ledgers += 1
            log.ledger, log.next_entry = ledger_name(self.ledgers), 0
            self.script.open(log.ledger, log=name, actor=log.writer)
            self.open[log.ledger] = -1
            return
        ledger = log.ledger
        if action == "add":
            self.script.add(ledger, log.next_entry, actor=log.writer)
            self.open[ledger] = log.next_entry
            log.next_entry += 1
        elif action == "close":
            self.script.close(ledger, log.next_entry - 1, actor=log.writer)
            self.ends[ledger] = self.open.pop(ledger)
            log.ledger = None
        elif action == "takeover":
            self._take_over(log, ledger, stored=pick % 2 == 0)
        elif action == "read" and self.ends:
            readable = sorted(set(self.ends) - self.deleted)
            if readable:
                target = readable[pick % len(readable)]
                self.script.read(target, 0, digests(target, self.ends[target]), actor="r0")
        elif action == "delete":
            candidates = sorted(set(self.ends) - self.deleted)
            if candidates:
                target = candidates[pick % len(candidates)]
                self.script.delete(target)
                self.deleted.add(target)
        elif action == "fault":
            self.script.fault(("kill", "partition", "disk_full")[pick % 3], f"b{pick % 5}")

    def _take_over(self, log: _Log, ledger: str, *, stored: bool) -> None:
        """The writer's next add fails (stored on some bookies or not), and the log's next
        writer recovers the ledger at the last entry it finds."""
        self.script.add(ledger, log.next_entry, actor=log.writer, outcome="failed")
        log.generation += 1
        log.writer = f"{log.writer.split('.')[0]}.{log.generation}"
        last = log.next_entry if stored else log.next_entry - 1
        self.script.recover(ledger, last, actor=log.writer)
        self.open.pop(ledger)
        self.ends[ledger] = last
        log.ledger = None

    def finish(self) -> list[Event]:
        for ledger, last in sorted(self.ends.items()):
            if ledger in self.deleted:
                self.script.final(ledger, -1, state="DELETED", seen=())
            else:
                self.script.final(ledger, last)
        for ledger, last in sorted(self.open.items()):
            self.script.final(ledger, last, state="OPEN")
        self.script.finish()
        return self.script.events


ACTIONS = ("add", "add", "add", "close", "takeover", "read", "delete", "fault")


@st.composite
def clean_histories(draw: st.DrawFn) -> list[Event]:
    model = Model()
    for action, log, pick in (("open", 0, 0), ("add", 0, 0), ("add", 0, 0), ("close", 0, 0)):
        model.step(action, log, pick)
    steps = draw(
        st.lists(
            st.tuples(st.sampled_from(ACTIONS), st.integers(0, LOGS - 1), st.integers(0, 99)),
            max_size=80,
        )
    )
    for action, log, pick in steps:
        model.step(action, log, pick)
    return model.finish()


@given(clean_histories())
@settings(max_examples=200, deadline=None)
def test_random_clean_histories_pass(events: list[Event]) -> None:
    verdict = check_history(events)
    assert verdict.violations == ()
    assert verdict.acknowledged == sum(isinstance(e, Added) and e.outcome == "ok" for e in events)


def _acks(events: Iterable[Event]) -> list[int]:
    return [i for i, e in enumerate(events) if isinstance(e, Added) and e.outcome == "ok"]


def _kept_finals(events: list[Event]) -> list[int]:
    """Finals of ledgers kept (not deleted) with at least one entry."""
    return [i for i, e in enumerate(events) if isinstance(e, Final) and e.last_entry >= 0]


def _mutate(events: list[Event], mutation: str, pick: int) -> tuple[Invariant, str, int] | None:
    """Break `events` in place as a fault would; the violation that must follow (its
    invariant, ledger and an entry), or None if this history has nowhere to break so."""
    if mutation in ("drop a final digest", "change a final digest"):
        finals = _kept_finals(events)
        if not finals:
            return None
        index = finals[pick % len(finals)]
        final = events[index]
        assert isinstance(final, Final)
        entry = pick % (final.last_entry + 1)
        acked = {(e.ledger, e.entry) for e in events if isinstance(e, Added) and e.outcome == "ok"}
        if (final.ledger, entry) not in acked:
            return None  # a failed add a recovery kept: no acknowledgement to judge it by
        wrong = None if mutation == "drop a final digest" else "0" * 32
        seen = list(final.digests)
        seen[entry] = wrong
        events[index] = dataclasses.replace(final, digests=tuple(seen))
        return Invariant.ALL_ACKED_ENTRIES_ARE_READABLE, final.ledger, entry
    if mutation == "close below the last ack":
        last_acked: dict[str, int] = {}
        for event in events:
            if isinstance(event, Added) and event.outcome == "ok" and event.entry is not None:
                last_acked[event.ledger] = max(last_acked.get(event.ledger, -1), event.entry)
        ends = [
            i for i, e in enumerate(events)
            if isinstance(e, Closed | Recovered) and e.outcome == "ok" and e.ledger in last_acked
        ]  # fmt: skip
        if not ends:
            return None
        index = ends[pick % len(ends)]
        end = events[index]
        assert isinstance(end, Closed | Recovered)
        last = last_acked[end.ledger]
        events[index] = dataclasses.replace(end, last_entry=last - 1)
        return Invariant.NO_TRUNCATION, end.ledger, last
    acks = _acks(events)
    pairs = [
        (a, b) for a, b in itertools.pairwise(acks)
        if events[a].ledger == events[b].ledger  # type: ignore[attr-defined]
    ]  # fmt: skip
    if not pairs:
        return None
    a, b = pairs[pick % len(pairs)]
    first, second = events[a], events[b]
    assert isinstance(first, Added)
    assert isinstance(second, Added)
    events[a] = dataclasses.replace(first, entry=second.entry, digest=second.digest)
    events[b] = dataclasses.replace(second, entry=first.entry, digest=first.digest)
    assert second.entry is not None
    return Invariant.ENTRY_ORDER, first.ledger, second.entry


MUTATIONS = (
    "drop a final digest",
    "change a final digest",
    "close below the last ack",
    "swap two acks' order",
)


@given(clean_histories(), st.sampled_from(MUTATIONS), st.integers(0, 10_000))
@settings(max_examples=300, deadline=None)
def test_a_random_mutation_of_a_clean_history_is_caught(
    events: list[Event], mutation: str, pick: int
) -> None:
    broken = list(events)
    expected = _mutate(broken, mutation, pick)
    if expected is None:
        return
    invariant, ledger, entry = expected
    verdict = check_history(broken)
    assert any(
        v.invariant is invariant and v.ledger == ledger and entry in v.entries
        for v in verdict.violations
    ), (mutation, expected, verdict.violations)
