"""`tally local stop | start-bookie | start`: act on a running local cluster from another shell.

All go through `local.json`. `stop` signals the supervisor, which stops its children in
order; only when the supervisor is gone (SIGKILLed, say) does it stop the survivors itself.
`start-bookie` leaves a start request for the supervisor rather than starting the bookie
itself, so the bookie is the supervisor's child like the others (see `supervisor`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from dataclasses import dataclass

from tally.core.errors import BadRequest, BookieUnavailable, IllegalOperation, Timeout
from tally.local.config import LocalConfig
from tally.local.processes import describe_exit, log_tail, terminate_group, wait_gone
from tally.local.services import services
from tally.local.state import DataDir, LocalState, ProcessRecord
from tally.local.supervisor import LOG_TAIL_LINES, Report

REQUEST_POLL = 0.1
SUPERVISOR_STOP_MARGIN = 15.0
"""Seconds the supervisor's own stop takes beyond its children's: writing down how they
ended."""


def stop_cluster(data_dir: DataDir, report: Report, config: LocalConfig | None = None) -> bool:
    """Stop the supervisor and, through it or directly, every process of the cluster.

    False when nothing was running.
    """
    config = config or LocalConfig()
    stop_timeout = config.stop_timeout
    supervisor_timeout = stop_timeout + SUPERVISOR_STOP_MARGIN
    supervisor = data_dir.require().supervisor
    supervised = supervisor is not None and supervisor.running
    if supervised:
        assert supervisor is not None
        report(f"stopping the supervisor (pid {supervisor.pid}) and its processes")
        with contextlib.suppress(ProcessLookupError):
            os.kill(supervisor.pid, signal.SIGTERM)
        if not wait_gone(supervisor.pid, supervisor.token, supervisor_timeout):
            report(
                f"the supervisor did not stop in {supervisor_timeout:.0f}s: SIGKILL",
                alarm=True,
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisor.pid, signal.SIGKILL)
            wait_gone(supervisor.pid, supervisor.token, stop_timeout)

    survivors: list[str] = []

    def stop_survivors(state: LocalState) -> LocalState:
        for name, run in state.processes.items():
            if run.running:
                survivors.append(name)
                report(f"stopping {name} (pid {run.pid}) directly: its supervisor is gone")
                if not terminate_group(run.pid, run.token, stop_timeout):
                    report(f"{name} did not stop in {stop_timeout:.0f}s: killed", alarm=True)
        return dataclasses.replace(state, supervisor=None, start_requests=frozenset())

    data_dir.update(stop_survivors)
    return supervised or bool(survivors)


@dataclass(frozen=True)
class Started:
    name: str
    run: ProcessRecord
    already: bool
    """True when it was running before: nothing was started."""


def start_bookie(data_dir: DataDir, index: int, config: LocalConfig | None = None) -> Started:
    """Have the supervisor start bookie `index` again; see `start_process`."""
    return start_process(data_dir, data_dir.require().slot(index).name, config)


def start_process(data_dir: DataDir, name: str, config: LocalConfig | None = None) -> Started:
    """Have the supervisor start process `name` again; returns once it serves.

    IllegalOperation when the cluster does not run; BadRequest for a name the cluster has
    no process of; BookieUnavailable (with the end of its log) when the process exits
    while starting; Timeout when it does not serve in time.
    """
    root = data_dir.root
    with data_dir.locked():
        state = data_dir.require()
        known = services(state, root)
        if name not in known:
            raise BadRequest(f"the local cluster has no process {name!r}: {', '.join(known)}")
        if not state.supervisor_running():
            raise IllegalOperation(
                f"the local cluster in {root} is not running: "
                f"`tally local up --data-dir {root}` starts it with all its processes"
            )
        running = state.running(name)
        if running is not None:
            return Started(name, running, already=True)
        before = state.processes.get(name)
        data_dir.write(dataclasses.replace(state, start_requests=state.start_requests | {name}))

    service = known[name]
    ready_timeout = (config or LocalConfig()).ready_timeout
    deadline = time.monotonic() + ready_timeout
    while True:
        state = data_dir.require()
        run = state.processes.get(name)
        if run is not None and run != before:  # the supervisor started it
            if service.is_ready(run):
                return Started(name, run, already=False)
            if run.exit_code is not None:
                tail = "\n".join(log_tail(service.log, LOG_TAIL_LINES, run.log_offset))
                raise BookieUnavailable(
                    f"{name} exited while starting ({describe_exit(run.exit_code)}):\n{tail}"
                )
        elif name not in state.start_requests:
            raise IllegalOperation(f"the supervisor of {root} did not start {name}: see its output")
        if not state.supervisor_running():
            raise IllegalOperation(f"the supervisor of {root} stopped while starting {name}")
        if time.monotonic() > deadline:
            raise Timeout(f"{name} did not serve within {ready_timeout:.0f}s: see {service.log}")
        time.sleep(REQUEST_POLL)
