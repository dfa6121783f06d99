"""The history of a chaos run (issue 19): every operation, its outcome and every fault, as
JSON lines, one event per line, in the order the harness saw them end.

A history is the whole evidence a run leaves: the checker (`checker.py`) judges it alone,
so a run on another machine can be checked here (`tally chaos check HISTORY`). Times are
seconds since the run began (`t`, monotonic), with `t_start` when the operation was issued
for those that take time; ledgers are qualified ids (`LedgerId.qualified_name`); an entry's
content is named by its digest (`content_digest`), so a history holds no payloads.

Events, by `kind`:

- `run`: the run's seed, metadata store (`sqlite` or `zk`), planned duration, bookies.
- `ledger_opened`: a writer created `ledger` as the next segment of its log `log`.
- `added`: an add; `outcome` `ok` means acknowledged (it must survive), `failed` means not
  acknowledged (it may or may not be stored: never a violation either way).
- `closed`: a writer's close, with the end it closed at when `ok`.
- `recovered`: another client opened the ledger with recovery (fencing it) and closed it at
  `last_entry`: a takeover of the log, or a reader's recovery.
- `read`: consecutive entries read back from `first`, by their digests (a tailing reader
  up to the LAC, or a reader of a closed ledger).
- `deleted`: the retention task deleted the ledger through the delete path.
- `fault`: a fault started or ended (`action`), on `target`.
- `final`: after the faults stopped and the cluster settled, a ledger as the cluster has it:
  its state, end, and the digest of each entry 0..`last_entry` read back (None: unreadable).
- `settled`: what the checks of a settled cluster found (the replicas check, the Spark
  audit, copies marked corrupt, data of deleted ledgers still on bookies, ledgers still
  under-replicated) and how long settling took.
- `end`: the run's totals.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from tally.core.errors import MalformedData

Outcome = Literal["ok", "failed"]
DIGEST_HEX = 32


def content_digest(payload: bytes) -> str:
    """What a history records of an entry's bytes: equal digests, equal content."""
    return hashlib.sha256(payload).hexdigest()[:DIGEST_HEX]


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    kind: ClassVar[str]
    t: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Run(Event):
    kind: ClassVar[str] = "run"
    seed: int
    metadata: str
    duration: float
    bookies: tuple[str, ...]
    wall_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerOpened(Event):
    kind: ClassVar[str] = "ledger_opened"
    actor: str
    log: str
    ledger: str
    ensemble_size: int
    write_quorum: int
    ack_quorum: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Added(Event):
    kind: ClassVar[str] = "added"
    t_start: float
    actor: str
    log: str
    ledger: str
    entry: int | None
    """The entry id the client gave it; None when it failed before one was given."""
    digest: str
    size: int
    outcome: Outcome
    error: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ended(Event):
    """A ledger's end as a client made it: closed by its writer, or recovered."""

    t_start: float
    actor: str
    log: str
    ledger: str
    outcome: Outcome
    last_entry: int = -1
    error: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Closed(Ended):
    kind: ClassVar[str] = "closed"


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovered(Ended):
    kind: ClassVar[str] = "recovered"


@dataclass(frozen=True, slots=True, kw_only=True)
class Read(Event):
    kind: ClassVar[str] = "read"
    actor: str
    ledger: str
    first: int
    digests: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Deleted(Event):
    kind: ClassVar[str] = "deleted"
    t_start: float
    actor: str
    log: str
    ledger: str
    outcome: Outcome
    error: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault(Event):
    kind: ClassVar[str] = "fault"
    fault: str
    target: str
    action: Literal["start", "end"]
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Final(Event):
    kind: ClassVar[str] = "final"
    ledger: str
    state: str
    """OPEN, IN_RECOVERY, CLOSED, DELETED, or GONE (no metadata, or only its tombstone)."""
    last_entry: int
    length: int
    digests: tuple[str | None, ...]
    """Of entries 0..last_entry, as read back; None where the read failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Settled(Event):
    kind: ClassVar[str] = "settled"
    seconds: float
    under_replicated: int
    replicas_check_findings: int
    audit_violations: int
    corrupt_copies: int
    deleted_data_left: int
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class End(Event):
    kind: ClassVar[str] = "end"
    operations: int
    acknowledged: int
    faults: int


EVENTS: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        *(Run, LedgerOpened, Added, Closed, Recovered, Read, Deleted),
        *(Fault, Final, Settled, End),
    )
}


_FIELD_NAMES = {
    cls: frozenset(item.name for item in dataclasses.fields(cls)) for cls in EVENTS.values()
}
"""Each kind's fields, looked up once: a history has millions of lines to decode."""


def encode_event(event: Event) -> str:
    """One line of JSON, without its newline."""
    fields: dict[str, Any] = {"kind": event.kind}
    for item in dataclasses.fields(event):
        value = getattr(event, item.name)
        fields[item.name] = list(value) if isinstance(value, tuple) else value
    return json.dumps(fields, separators=(",", ":"), sort_keys=True)


def decode_event(line: str, where: str = "history") -> Event:
    """The event of one line; MalformedData naming `where` for anything else."""
    try:
        fields = json.loads(line)
    except ValueError as error:
        raise MalformedData(f"{where}: not JSON: {error}") from None
    if not isinstance(fields, dict):
        raise MalformedData(f"{where}: an event is a JSON object, not {type(fields).__name__}")
    kind = fields.pop("kind", None)
    cls = EVENTS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise MalformedData(f"{where}: unknown event kind {kind!r}")
    unknown = fields.keys() - _FIELD_NAMES[cls]
    if unknown:
        raise MalformedData(f"{where}: a {kind} event has no field {sorted(unknown)[0]!r}")
    for name, value in fields.items():
        if isinstance(value, list):
            fields[name] = tuple(value)
    try:
        return cls(**fields)
    except TypeError as error:
        raise MalformedData(f"{where}: a {kind} event: {error}") from None


def decode_history(lines: Iterable[str], source: str = "history") -> Iterator[Event]:
    """The events of a history's lines (blank lines skipped)."""
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield decode_event(line, f"{source} line {number}")
