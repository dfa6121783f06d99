"""`tally local up`: start the local cluster's processes, watch them, and stop them all.

The supervisor is the parent of every process it runs, each in a process group of its own
(so a Ctrl-C in the terminal reaches the supervisor alone, which then stops the others in
order) with its output appended to its log. A process that dies is reported with its exit
status and the end of its log, and stays down: restarting it silently would hide the crash
that the operator of a durability system most needs to see. Only an exit that says a new
start is the cure (a bookie that lost its metadata session) is followed by a restart, and
only a few times in a while, so that a fault that repeats still ends in an alarm and a
process left down. `tally local start-bookie`
asks for a restart by adding a start request to `local.json`, which the supervisor polls;
so a restarted bookie is again the supervisor's child, whose exit status it can report
and which it stops with the rest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType
from typing import Protocol

from tally.core.errors import BadRequest, IllegalOperation
from tally.local.config import DEFAULT_BOOKIES, DEFAULT_RACKS, LocalConfig
from tally.local.processes import (
    describe_exit,
    log_tail,
    signal_group,
    signal_name,
)
from tally.local.services import Service, services
from tally.local.state import DataDir, LocalState, ProcessRecord, plan_bookies
from tally.metadata.cluster import InitResult, init_cluster
from tally.metadata.stores import open_store
from tally.ports import free_ports

POLL_INTERVAL = 0.2
LOG_TAIL_LINES = 12
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Report(Protocol):
    """Where the supervisor tells what happens; `alarm` marks what went wrong."""

    def __call__(self, message: str, *, alarm: bool = False) -> None: ...


@dataclass
class RestartBudget:
    """The automatic restarts each process has had lately, with time as an input: at most
    `limit` within any `window` seconds."""

    limit: int
    window: float
    _taken: dict[str, list[float]] = field(default_factory=dict)

    def take(self, name: str, now: float) -> int | None:
        """Count a restart of `name` at `now`: its number within the window, or None (and
        nothing counted) when the budget is spent."""
        recent = [at for at in self._taken.get(name, []) if now - at < self.window]
        if len(recent) < self.limit:
            recent.append(now)
            self._taken[name] = recent
            return len(recent)
        self._taken[name] = recent
        return None


@dataclass
class _Child:
    service: Service
    process: subprocess.Popen[bytes]
    run: ProcessRecord
    ready: bool = False


class Supervisor:
    """Runs the services of one data directory; the process that runs it is the supervisor."""

    def __init__(
        self, data_dir: DataDir, report: Report, config: LocalConfig | None = None
    ) -> None:
        self.data_dir = data_dir
        self.report = report
        self.config = config or LocalConfig()
        self._children: dict[str, _Child] = {}
        self._restarts = RestartBudget(self.config.restarts, self.config.restart_window)
        self._stop_signal: int | None = None
        """Set by the signal handler alone: a plain attribute, as a lock taken there could be
        the one the interrupted code holds."""

    # -- life cycle ----------------------------------------------------------------------

    def run(
        self,
        bookies: int | None,
        racks: int | None,
        on_ready: Callable[[LocalState, InitResult], None],
    ) -> int:
        """Claim the data dir, start everything, supervise until a stop signal; exit code.

        IllegalOperation, before anything starts, if the data dir's cluster already runs.
        """
        state = self._claim(bookies, racks)
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)
        try:
            init = asyncio.run(_init_cluster(state.metadata))
            if not self._start_all(state):
                return 0 if self._stop_signal is not None else 1
            on_ready(self.data_dir.require(), init)
            while self._stop_signal is None:
                time.sleep(POLL_INTERVAL)
                for child in self._watch():
                    self._after_exit(child)
                self._take_start_requests()
            return 0
        finally:
            if self._stop_signal is not None:
                self.report(f"{signal_name(self._stop_signal)} received: stopping")
            self._stop_all()
            self.data_dir.update(
                lambda s: dataclasses.replace(s, supervisor=None, start_requests=frozenset())
            )
            self.report(f"local cluster in {self.data_dir.root} stopped")

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._stop_signal = signum

    def _claim(self, bookies: int | None, racks: int | None) -> LocalState:
        """Become the supervisor recorded in `local.json` (creating the cluster's plan)."""
        root = self.data_dir.root
        with self.data_dir.locked():
            state = self.data_dir.read()
            if state is None:
                state = LocalState(
                    self.data_dir.metadata_uri,
                    plan_bookies(root, bookies or DEFAULT_BOOKIES, racks or DEFAULT_RACKS),
                )
            else:
                _check_shape(state, bookies, racks, self.data_dir)
                other = state.supervisor
                if other is not None and other.running:
                    raise IllegalOperation(
                        f"a local cluster already runs in {root} (supervisor pid "
                        f"{other.pid}): see `tally local status --data-dir {root}`, "
                        f"or stop it with `tally local stop --data-dir {root}`"
                    )
                survivors = [
                    f"{name} (pid {run.pid})"
                    for name, run in state.processes.items()
                    if state.running(name)
                ]
                if survivors:
                    raise IllegalOperation(
                        f"{', '.join(survivors)} still run(s) in {root} after their supervisor "
                        f"died: stop them with `tally local stop --data-dir {root}` first"
                    )
            state = dataclasses.replace(
                state,
                supervisor=ProcessRecord.of(os.getpid()),
                start_requests=frozenset(),
                autorecovery_port=state.autorecovery_port or free_ports(1)[0],
            )
            self.data_dir.write(state)
        return state

    # -- starting ------------------------------------------------------------------------

    def _start_all(self, state: LocalState) -> bool:
        """Start every service and wait until all serve; False (reported) if one does not."""
        started = [self._spawn(service) for service in services(state, self.data_dir.root).values()]
        self.data_dir.update(lambda s: _with_runs(s, started))
        deadline = time.monotonic() + self.config.ready_timeout
        while not all(child.ready for child in self._children.values()):
            ended = self._watch()
            for child in ended:
                self._report_exit(child, "The local cluster cannot start without it.")
            if ended or self._stop_signal is not None:
                return False
            if time.monotonic() > deadline:
                late = [c.service.name for c in self._children.values() if not c.ready]
                self.report(
                    f"{', '.join(late)} not ready within {self.config.ready_timeout:.0f}s; "
                    f"see the log(s) in {self.data_dir.root / 'logs'}",
                    alarm=True,
                )
                return False
            time.sleep(POLL_INTERVAL)
        return True

    def _spawn(self, service: Service) -> _Child:
        service.log.parent.mkdir(parents=True, exist_ok=True)
        with service.log.open("ab") as log:
            stamp = datetime.now().isoformat(sep=" ", timespec="seconds")
            log.write(f"--- {stamp} tally local: starting {service.name}\n".encode())
            log.flush()
            process = subprocess.Popen(
                service.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            child = _Child(service, process, ProcessRecord.of(process.pid, log.tell()))
        self._children[service.name] = child
        return child

    def _take_start_requests(self) -> None:
        """Start what `start-bookie` asked for, unless it runs already."""
        if not self.data_dir.require().start_requests:
            return
        with self.data_dir.locked():
            state = self.data_dir.require()
            known = services(state, self.data_dir.root)
            later = set()
            for name in sorted(state.start_requests):
                running = self._children.get(name)
                if running is not None:
                    if running.process.poll() is not None:
                        later.add(name)  # ended, not yet reported: start it next time round
                    continue
                if name not in known:
                    continue
                try:
                    child = self._spawn(known[name])
                except OSError as error:
                    self.report(f"{name} could not be started: {error}", alarm=True)
                    continue
                self.report(f"{name} starting again (pid {child.run.pid}), as requested")
                state = state.with_process(name, child.run)
            self.data_dir.write(dataclasses.replace(state, start_requests=frozenset(later)))

    # -- watching ------------------------------------------------------------------------

    def _watch(self) -> list[_Child]:
        """Note who became ready (reported) and who ended (recorded); the ended ones."""
        ended = []
        for name, child in list(self._children.items()):
            code = child.process.poll()
            if code is not None:
                del self._children[name]
                child.run = dataclasses.replace(child.run, exit_code=code)
                ended.append(child)
            elif not child.ready and child.service.is_ready(child.run):
                child.ready = True
                self.report(f"{name} ready (pid {child.run.pid})")
        if ended:
            self.data_dir.update(lambda s: _with_runs(s, ended))
        return ended

    def _after_exit(self, child: _Child) -> None:
        """Report a process that ended; start it again if its exit asks for that and its
        restart budget allows, else leave it down."""
        service = child.service
        stays_down = f"It stays down: `{service.restart_hint}`"
        code = child.run.exit_code
        why = None if code is None else service.restart_on.get(code)
        if why is None:
            self._report_exit(child, stays_down)
            return
        count = self._restarts.take(service.name, time.monotonic())
        if count is None:
            self._report_exit(
                child,
                f"{why}, again: restarted {self.config.restarts} times within "
                f"{self.config.restart_window:.0f}s "
                f"already. {stays_down}",
            )
            return
        self._report_exit(
            child,
            f"{why}: starting it again (restart {count} of at most {self.config.restarts} "
            f"within {self.config.restart_window:.0f}s).",
        )
        try:
            restarted = self._spawn(service)
        except OSError as error:
            self.report(f"{service.name} could not be started: {error}. {stays_down}", alarm=True)
            return
        self.data_dir.update(lambda s: s.with_process(service.name, restarted.run))
        self.report(f"{service.name} starting again (pid {restarted.run.pid})")

    def _report_exit(self, child: _Child, consequence: str) -> None:
        service = child.service
        lines = log_tail(service.log, LOG_TAIL_LINES, child.run.log_offset)
        self.report(
            f"{service.name} (pid {child.run.pid}) exited: "
            f"{describe_exit(child.run.exit_code)}. {consequence}",
            alarm=True,
        )
        self.report(f"last lines of {service.log}:")
        for line in lines or ["(nothing)"]:
            self.report(f"  | {line}")

    # -- stopping ------------------------------------------------------------------------

    def _stop_all(self) -> None:
        """SIGTERM every child, wait, SIGKILL the ones that overstay; record how they ended."""
        children = list(self._children.values())
        for child in children:
            signal_group(child.run.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.stop_timeout
        for child in children:
            try:
                child.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.report(
                    f"{child.service.name} did not stop in "
                    f"{self.config.stop_timeout:.0f}s: SIGKILL",
                    alarm=True,
                )
                signal_group(child.run.pid, signal.SIGKILL)
                child.process.wait()
            child.run = dataclasses.replace(child.run, exit_code=child.process.returncode)
            self.report(f"{child.service.name} stopped ({describe_exit(child.run.exit_code)})")
        self._children.clear()
        self.data_dir.update(lambda s: _with_runs(s, children))


def _with_runs(state: LocalState, children: list[_Child]) -> LocalState:
    for child in children:
        state = state.with_process(child.service.name, child.run)
    return state


def _check_shape(state: LocalState, bookies: int | None, racks: int | None, data: DataDir) -> None:
    """A cluster keeps its bookies (ids, data) and racks: refuse a request for another shape."""
    if (bookies is None or bookies == len(state.bookies)) and (racks in (None, state.racks)):
        return
    raise BadRequest(
        f"{data.root} holds a local cluster of {len(state.bookies)} bookies on {state.racks} "
        f"racks, which keep their ids and data: run `tally local up --data-dir {data.root}` "
        "without --bookies/--racks, or use another --data-dir"
    )


async def _init_cluster(uri: str) -> InitResult:
    async with open_store(uri) as store:
        return await init_cluster(store)
