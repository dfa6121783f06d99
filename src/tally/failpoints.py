"""Failpoints: named places in the code paths that can fail, where a test makes them fail.

White-box error injection in the way of etcd's gofail (issue 19). Each place calls
`failpoint(name)` (or `await afailpoint(name)` in async code); nothing happens there unless
the failpoint is enabled, by the environment variable a test sets for the processes it
starts, or in-process by `enabled(name, term)`:

    TALLY_FAILPOINTS="journal.fdatasync=error(EIO);checkpoint.before_mark=3*off->crash"

The variable is read once, when this module is first imported. Terms follow gofail's:
`step->step->...`, each step `[N*]action[(argument)]`, where `N*` limits the step to the next
N hits, after which the next step applies (after the last one: off); a step without a count
applies from then on, so only the last step may lack one. Actions:

- `off`: nothing (`5*off->crash`: crash at the sixth hit);
- `error`, `error(EIO)`, `error(ENOSPC)` (any errno name): raise `OSError(errno, ...)`
  naming the failpoint; plain `error` is EIO. Where the code turns the OS errors of that
  step into its own error (a journal's or a storage's WriteFailed, the metadata store's
  MetadataStoreError) it does the same with the failpoint's, so a test sees what a real
  failure there would give;
- `delay(0.5)`: sleep that many seconds (`asyncio.sleep` in async code);
- `crash`: write one line naming the failpoint to stderr and end the process at once with
  exit code CRASH_EXIT_CODE (`os._exit`: no cleanup, no flush, like a SIGKILL there).

Parsing is strict: an unknown failpoint name, an unknown action, a bad argument or a
malformed term raises `FailpointError` at import (or from `enabled`), listing the known
names, so that a typo in a test is loud rather than a test that proves nothing.

Cost. With no failpoint enabled a call is a function call and a truth test of an empty
dict; with some enabled, one dict look-up more. The state of an enabled failpoint is
guarded by a lock (its hits may come from several threads).

This module is on the bottom layer beside `tally.core`, which stays pure and never imports
it: failpoints sit in the layers that do I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import math
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

log = logging.getLogger(__name__)

ENVIRONMENT_VARIABLE = "TALLY_FAILPOINTS"
CRASH_EXIT_CODE = 86
"""The exit code of a process that a `crash` failpoint ended."""

KNOWN = frozenset(
    {
        "journal.write",
        "journal.fdatasync",
        "entry_log.write",
        "entry_log.read",
        "index.batch",
        "checkpoint.after_flush",
        "checkpoint.before_mark",
        "compaction.after_copy",
        "compaction.before_remove",
        "replication.copy",
        "replication.commit",
        "replication.unmark",
        "metadata.cas",
    }
)
"""Every failpoint the code has (docs/architecture.md §8 says where each sits)."""

ACTIONS = ("off", "error", "delay", "crash")
_STEP = re.compile(r"(?:(?P<count>\d+)\*)?(?P<action>[a-z]+)(?:\((?P<argument>[^()]*)\))?")
_ERRNO_NAMES = frozenset(errno.errorcode.values())


class FailpointError(ValueError):
    """A failpoint spec that does not parse, or names no known failpoint."""


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a term: `action` (with its argument) for `count` hits (None: for good)."""

    action: str
    count: int | None = None
    errno: int = errno.EIO
    """For `error`."""
    seconds: float = 0.0
    """For `delay`."""


class Failpoint:
    """An enabled failpoint: its steps and how far along them its hits are."""

    def __init__(self, name: str, term: str) -> None:
        self.name = name
        self.term = term
        self.steps = parse_term(term, name)
        self._lock = threading.Lock()
        self._step = 0
        self._left = self.steps[0].count
        self._hits = 0

    @property
    def hits(self) -> int:
        """How many times the code reached the failpoint since it was enabled."""
        with self._lock:
            return self._hits

    def _take(self) -> Step | None:
        """Count a hit; the step that applies to it (None: off, the steps are used up)."""
        with self._lock:
            self._hits += 1
            while self._step < len(self.steps):
                step = self.steps[self._step]
                if self._left is None:
                    return step
                if self._left > 0:
                    self._left -= 1
                    return step
                self._step += 1
                if self._step < len(self.steps):
                    self._left = self.steps[self._step].count
            return None

    def hit(self) -> None:
        step = self._take()
        if step is None or step.action == "off":
            return
        if step.action == "delay":
            log.warning("failpoint %s: delay %gs", self.name, step.seconds)
            time.sleep(step.seconds)
            return
        self._fail(step)

    async def ahit(self) -> None:
        step = self._take()
        if step is None or step.action == "off":
            return
        if step.action == "delay":
            log.warning("failpoint %s: delay %gs", self.name, step.seconds)
            await asyncio.sleep(step.seconds)
            return
        self._fail(step)

    def _fail(self, step: Step) -> None:
        if step.action == "crash":
            os.write(
                2,
                f"tally failpoint {self.name}: crash, exiting with {CRASH_EXIT_CODE}\n".encode(),
            )
            os._exit(CRASH_EXIT_CODE)
        log.warning("failpoint %s: error %s", self.name, errno.errorcode[step.errno])
        raise OSError(step.errno, f"{os.strerror(step.errno)} (failpoint {self.name})")


def parse_term(term: str, name: str = "") -> tuple[Step, ...]:
    """The steps of `term` (see the module docstring); FailpointError if malformed."""
    where = f"failpoint {name}" if name else "failpoint term"
    text = term.strip()
    if not text:
        raise FailpointError(f"{where}: empty term; {_GRAMMAR}")
    steps = []
    parts = [part.strip() for part in text.split("->")]
    for index, part in enumerate(parts):
        found = _STEP.fullmatch(part)
        if found is None:
            raise FailpointError(f"{where}: malformed step {part!r} in {term!r}; {_GRAMMAR}")
        count = None if found["count"] is None else int(found["count"])
        if count == 0:
            raise FailpointError(f"{where}: a step's count must be at least 1, in {term!r}")
        if count is None and index < len(parts) - 1:
            raise FailpointError(
                f"{where}: step {part!r} has no count, so the steps after it in {term!r} "
                "would never apply"
            )
        steps.append(_step(found["action"], found["argument"], count, where, term))
    return tuple(steps)


_GRAMMAR = (
    "a term is step->step->..., each step [N*]action[(argument)] with action one of "
    f"{', '.join(ACTIONS)}: off, error, error(EIO), error(ENOSPC), delay(0.5), crash"
)


def _step(action: str, argument: str | None, count: int | None, where: str, term: str) -> Step:
    if action not in ACTIONS:
        raise FailpointError(f"{where}: unknown action {action!r} in {term!r}; {_GRAMMAR}")
    argument = None if argument is None else argument.strip()
    if action == "error":
        if not argument:
            return Step(action, count)
        if argument not in _ERRNO_NAMES:
            raise FailpointError(
                f"{where}: error({argument}) in {term!r} names no errno (EIO, ENOSPC, ...)"
            )
        return Step(action, count, errno=getattr(errno, argument))
    if action == "delay":
        try:
            seconds = float(argument or "")
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds >= 0):
            raise FailpointError(
                f"{where}: delay needs seconds, a number >= 0, as in delay(0.5); got {term!r}"
            )
        return Step(action, count, seconds=seconds)
    if argument is not None:
        raise FailpointError(f"{where}: {action} takes no argument, in {term!r}")
    return Step(action, count)


def parse(spec: str) -> dict[str, Failpoint]:
    """The failpoints `name=term;name=term` enables; FailpointError if any is malformed or
    unknown. Blank entries are ignored."""
    enabled: dict[str, Failpoint] = {}
    for entry in spec.split(";"):
        if not entry.strip():
            continue
        name, equals, term = entry.partition("=")
        name = name.strip()
        if not equals:
            raise FailpointError(
                f"{ENVIRONMENT_VARIABLE}: {entry.strip()!r} is not name=term "
                f"(known failpoints: {', '.join(sorted(KNOWN))})"
            )
        _check_name(name)
        if name in enabled:
            raise FailpointError(f"{ENVIRONMENT_VARIABLE}: failpoint {name} is given twice")
        enabled[name] = Failpoint(name, term)
    return enabled


def _check_name(name: str) -> None:
    if name not in KNOWN:
        raise FailpointError(
            f"unknown failpoint {name!r}; the known failpoints are: {', '.join(sorted(KNOWN))}"
        )


_active: dict[str, Failpoint] = parse(os.environ.get(ENVIRONMENT_VARIABLE, ""))
"""The enabled failpoints, by name; empty unless a test enables some."""


def failpoint(name: str) -> None:
    """The failpoint `name` in synchronous code: nothing unless it is enabled."""
    if _active:
        point = _active.get(name)
        if point is not None:
            point.hit()


async def afailpoint(name: str) -> None:
    """The failpoint `name` in async code (a delay does not block the event loop)."""
    if _active:
        point = _active.get(name)
        if point is not None:
            await point.ahit()


def active() -> dict[str, str]:
    """The enabled failpoints and their terms."""
    return {name: point.term for name, point in _active.items()}


@contextlib.contextmanager
def enabled(name: str, term: str) -> Iterator[Failpoint]:
    """Enable failpoint `name` with `term` in this process for the duration; yields it (its
    `hits` count what reached it). What was enabled before comes back afterwards."""
    _check_name(name)
    point = Failpoint(name, term)
    before = _active.get(name)
    _active[name] = point
    try:
        yield point
    finally:
        if before is None:
            _active.pop(name, None)
        else:
            _active[name] = before
