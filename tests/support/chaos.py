"""Histories of chaos runs for tests, written step by step as a harness would."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tally.core.chaos.checker import SETTLED_COUNTS, Verdict, check_history
from tally.core.chaos.history import (
    Added,
    Closed,
    Deleted,
    End,
    Event,
    Fault,
    Final,
    LedgerOpened,
    Outcome,
    Read,
    Recovered,
    Run,
    Settled,
    content_digest,
    encode_event,
)


def ledger_name(number: int) -> str:
    return f"{0:016x}{number:016x}"


L1, L2, L3, L4 = (ledger_name(n) for n in (1, 2, 3, 4))


def digest(ledger: str, entry: int) -> str:
    """The content the model's writers add at an entry: a pure function of where it is."""
    return content_digest(f"{ledger}/{entry}".encode())


def digests(ledger: str, last_entry: int) -> tuple[str, ...]:
    return tuple(digest(ledger, entry) for entry in range(last_entry + 1))


class Script:
    """A history written step by step; the clock advances one second per event unless an
    event is given its time."""

    def __init__(self, *, begin: bool = True) -> None:
        self.events: list[Event] = []
        self.t = 0.0
        if begin:
            self.events.append(
                Run(t=0.0, seed=1, metadata="sqlite", duration=60.0, bookies=("b1",), wall_ms=0)
            )

    def _at(self, t: float | None) -> float:
        self.t = self.t + 1.0 if t is None else t
        return self.t

    def open(
        self, ledger: str, *, log: str = "log-0", actor: str = "w0", t: float | None = None
    ) -> Script:
        self.events.append(
            LedgerOpened(
                t=self._at(t),
                actor=actor,
                log=log,
                ledger=ledger,
                ensemble_size=3,
                write_quorum=2,
                ack_quorum=2,
            )
        )
        return self

    def add(
        self,
        ledger: str,
        entry: int | None,
        *,
        actor: str = "w0",
        outcome: Outcome = "ok",
        content: str | None = None,
        t: float | None = None,
    ) -> Script:
        at = self._at(t)
        self.events.append(
            Added(
                t=at,
                t_start=at - 0.5,
                actor=actor,
                log="log-0",
                ledger=ledger,
                entry=entry,
                digest=content or digest(ledger, entry or 0),
                size=10,
                outcome=outcome,
            )
        )
        return self

    def adds(self, ledger: str, count: int, *, actor: str = "w0") -> Script:
        for entry in range(count):
            self.add(ledger, entry, actor=actor)
        return self

    def close(
        self,
        ledger: str,
        last_entry: int,
        *,
        actor: str = "w0",
        outcome: Outcome = "ok",
        t: float | None = None,
    ) -> Script:
        return self._ended(Closed, ledger, last_entry, actor, outcome, t)

    def recover(
        self,
        ledger: str,
        last_entry: int,
        *,
        actor: str = "w1",
        outcome: Outcome = "ok",
        t: float | None = None,
    ) -> Script:
        return self._ended(Recovered, ledger, last_entry, actor, outcome, t)

    def _ended(
        self,
        kind: type[Closed | Recovered],
        ledger: str,
        last_entry: int,
        actor: str,
        outcome: Outcome,
        t: float | None,
    ) -> Script:
        at = self._at(t)
        self.events.append(
            kind(
                t=at,
                t_start=at - 0.5,
                actor=actor,
                log="log-0",
                ledger=ledger,
                outcome=outcome,
                last_entry=last_entry,
            )
        )
        return self

    def read(self, ledger: str, first: int, seen: Sequence[str], *, actor: str = "r0") -> Script:
        self.events.append(
            Read(t=self._at(None), actor=actor, ledger=ledger, first=first, digests=tuple(seen))
        )
        return self

    def delete(self, ledger: str, *, outcome: Outcome = "ok") -> Script:
        at = self._at(None)
        self.events.append(
            Deleted(
                t=at,
                t_start=at - 0.5,
                actor="retention",
                log="log-0",
                ledger=ledger,
                outcome=outcome,
            )
        )
        return self

    def fault(self, fault: str, target: str) -> Script:
        self.events.append(Fault(t=self._at(None), fault=fault, target=target, action="start"))
        self.events.append(Fault(t=self._at(None), fault=fault, target=target, action="end"))
        return self

    def final(
        self,
        ledger: str,
        last_entry: int,
        *,
        state: str = "CLOSED",
        seen: Sequence[str | None] | None = None,
    ) -> Script:
        self.events.append(
            Final(
                t=self._at(None),
                ledger=ledger,
                state=state,
                last_entry=last_entry,
                length=10 * (last_entry + 1),
                digests=tuple(digests(ledger, last_entry) if seen is None else seen),
            )
        )
        return self

    def finish(self, *, end: bool = True, **found: int) -> Script:
        counts = dict.fromkeys(SETTLED_COUNTS, 0) | found
        self.events.append(Settled(t=self._at(None), seconds=1.0, **counts))
        if end:
            self.events.append(End(t=self._at(None), operations=0, acknowledged=0, faults=0))
        return self

    def check(self) -> Verdict:
        return check_history(self.events)

    def write(self, path: Path) -> Path:
        """The history as the JSON-lines file a run writes."""
        path.write_text("".join(encode_event(event) + "\n" for event in self.events))
        return path


def clean_script() -> Script:
    """Two logs: a ledger closed, read and kept; one taken over after its writer failed
    (its failed entry recovered); the taker's own ledger still open; one deleted."""
    return (
        Script()
        .open(L1).adds(L1, 3).close(L1, 2).read(L1, 0, digests(L1, 2))
        .open(L2).adds(L2, 2).add(L2, 2, outcome="failed").fault("kill", "b1")
        .recover(L2, 2, actor="w1")
        .open(L3, actor="w1").add(L3, 0, actor="w1")
        .open(L4, log="log-1", actor="v0").adds(L4, 2, actor="v0").close(L4, 1, actor="v0")
        .delete(L4)
        .final(L1, 2).final(L2, 2).final(L3, 0, state="OPEN")
        .final(L4, -1, state="DELETED", seen=())
        .finish()
    )  # fmt: skip
