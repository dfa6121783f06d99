"""The local cluster's data directory and `local.json`, the record every command shares.

`local.json` says what the cluster is made of (the metadata URI; each bookie's port, rack,
metrics port, directory and log), which are fixed at the first `up` and kept, because a
bookie's id is its host:port: a restarted bookie on a new port would be a new bookie whose
old cookie no longer matches. It also says what runs: the supervisor's pid and each
process's last run. Writers (the supervisor, `start-bookie`) change it under an exclusive
lock on `local.lock` and replace it atomically, so readers never see half a file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tally.core.errors import BadRequest, MalformedData
from tally.local.processes import is_running, start_token
from tally.metadata.json_records import Record
from tally.ports import free_ports

FORMAT = 1
STATE_FILE = "local.json"
LOCK_FILE = "local.lock"
META_DB = "meta.db"
HOST = "127.0.0.1"


@dataclass(frozen=True)
class BookieSlot:
    """One bookie of the local cluster: where it listens, stands and keeps its data."""

    index: int
    """1-based; `tally local start-bookie INDEX` names it."""
    port: int
    metrics_port: int
    rack: str
    data_dir: Path
    log: Path

    @property
    def name(self) -> str:
        return f"bookie-{self.index}"

    @property
    def bookie_id(self) -> str:
        """The bookie's id: its advertised host:port, as BookKeeper defaults it."""
        return f"{HOST}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}/metrics"

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "bookie_id": self.bookie_id,
            "port": self.port,
            "rack": self.rack,
            "metrics_port": self.metrics_port,
            "metrics_url": self.metrics_url,
            "data_dir": str(self.data_dir),
            "log": str(self.log),
        }

    @classmethod
    def from_json(cls, record: Record) -> BookieSlot:
        return cls(
            index=record.integer("index", low=1),
            port=record.integer("port", low=1),
            metrics_port=record.integer("metrics_port", low=1),
            rack=record.text("rack"),
            data_dir=Path(record.text("data_dir")),
            log=Path(record.text("log")),
        )


@dataclass(frozen=True)
class ProcessRecord:
    """One run of a process: which it is, where its output of this run starts, how it ended."""

    pid: int
    token: int | None
    """Its start time where the OS tells it (see `processes`): a reused pid is not it."""
    log_offset: int = 0
    """Byte offset in its log where this run's output begins."""
    exit_code: int | None = None
    """Set by the supervisor once the process exited (negative: killed by that signal)."""

    @classmethod
    def of(cls, pid: int, log_offset: int = 0) -> ProcessRecord:
        return cls(pid, start_token(pid), log_offset)

    @property
    def running(self) -> bool:
        return self.exit_code is None and is_running(self.pid, self.token)

    def to_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "token": self.token,
            "log_offset": self.log_offset,
            "exit_code": self.exit_code,
        }

    @classmethod
    def from_json(cls, record: Record) -> ProcessRecord:
        return cls(
            pid=record.integer("pid", low=1),
            token=record.optional_integer("token"),
            log_offset=record.integer("log_offset"),
            exit_code=record.optional_integer("exit_code", low=-255),
        )


@dataclass(frozen=True)
class LocalState:
    """The content of `local.json`."""

    metadata: str
    bookies: tuple[BookieSlot, ...]
    supervisor: ProcessRecord | None = None
    processes: Mapping[str, ProcessRecord] = field(default_factory=dict)
    """The last run of each process by name ("bookie-2"), running or ended."""
    start_requests: frozenset[str] = frozenset()
    """Processes `start-bookie` asked the supervisor to start."""
    autorecovery_port: int | None = None
    """The auto-recovery process's admin HTTP port: the cluster's API and /metrics; None in
    a `local.json` written before auto-recovery existed (`up` then picks one)."""

    @property
    def api_url(self) -> str | None:
        if self.autorecovery_port is None:
            return None
        return f"http://{HOST}:{self.autorecovery_port}"

    @property
    def racks(self) -> int:
        return len({slot.rack for slot in self.bookies})

    def slot(self, index: int) -> BookieSlot:
        for slot in self.bookies:
            if slot.index == index:
                return slot
        raise BadRequest(
            f"no bookie {index} in this local cluster: it has bookies 1..{len(self.bookies)}"
        )

    def running(self, name: str) -> ProcessRecord | None:
        """The record of `name` if that process runs now."""
        record = self.processes.get(name)
        return record if record is not None and record.running else None

    def supervisor_running(self) -> bool:
        return self.supervisor is not None and self.supervisor.running

    def with_process(self, name: str, record: ProcessRecord) -> LocalState:
        return dataclasses.replace(self, processes={**self.processes, name: record})

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "metadata": self.metadata,
            "supervisor": None if self.supervisor is None else self.supervisor.to_json(),
            "bookies": [slot.to_json() for slot in self.bookies],
            "processes": {name: p.to_json() for name, p in sorted(self.processes.items())},
            "start_requests": sorted(self.start_requests),
            "autorecovery_port": self.autorecovery_port,
        }

    @classmethod
    def from_json(cls, data: bytes, source: str) -> LocalState:
        try:
            parsed = json.loads(data)
        except (ValueError, RecursionError) as error:
            raise MalformedData(f"{source} is not JSON: {error}") from None
        if not isinstance(parsed, dict):
            raise MalformedData(f"{source} holds a JSON {type(parsed).__name__}, not an object")
        top = Record(parsed, source)
        if top.integer("format", low=1) > FORMAT:
            raise MalformedData(f"{source} has a newer format than this tally understands")
        supervisor = parsed.get("supervisor")
        return cls(
            metadata=top.text("metadata"),
            bookies=tuple(
                BookieSlot.from_json(_record(item, f"{source} bookies[{i}]"))
                for i, item in enumerate(_field(parsed, "bookies", list, source))
            ),
            supervisor=None
            if supervisor is None
            else ProcessRecord.from_json(_record(supervisor, f"{source} supervisor")),
            processes={
                name: ProcessRecord.from_json(_record(item, f"{source} processes[{name!r}]"))
                for name, item in _field(parsed, "processes", dict, source).items()
            },
            start_requests=frozenset(top.texts("start_requests")),
            autorecovery_port=top.optional_integer("autorecovery_port", low=1)
            if "autorecovery_port" in parsed
            else None,
        )


def _field(parsed: dict[str, Any], name: str, kind: type, source: str) -> Any:
    value = parsed.get(name)
    if not isinstance(value, kind):
        raise MalformedData(f"{source}: {name!r} is not a JSON {kind.__name__}: {value!r}")
    return value


def _record(value: Any, source: str) -> Record:
    if not isinstance(value, dict):
        raise MalformedData(f"{source} is not an object: {value!r}")
    return Record(value, source)


def plan_bookies(root: Path, bookies: int, racks: int) -> tuple[BookieSlot, ...]:
    """`bookies` new slots on free ports, racks /zone-1/rack-1.. assigned round-robin."""
    if bookies < 1:
        raise BadRequest(f"a local cluster needs at least one bookie, not {bookies}")
    if not 1 <= racks <= bookies:
        raise BadRequest(f"--racks must be between 1 and the number of bookies ({bookies})")
    ports = free_ports(2 * bookies)
    return tuple(
        BookieSlot(
            index=i,
            port=ports[2 * (i - 1)],
            metrics_port=ports[2 * (i - 1) + 1],
            rack=f"/zone-1/rack-{(i - 1) % racks + 1}",
            data_dir=root / f"bookie-{i}",
            log=root / "logs" / f"bookie-{i}.log",
        )
        for i in range(1, bookies + 1)
    )


@dataclass(frozen=True)
class DataDir:
    """The local cluster's directory: its store, its bookies' directories, `local.json`."""

    root: Path
    """Absolute, so that the paths recorded in `local.json` hold from any directory."""

    @classmethod
    def at(cls, path: Path) -> DataDir:
        return cls(path.expanduser().resolve())

    @property
    def metadata_uri(self) -> str:
        return f"sqlite://{self.root / META_DB}"

    @property
    def state_file(self) -> Path:
        return self.root / STATE_FILE

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive against every other writer of `local.json`, in any process."""
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / LOCK_FILE).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield  # closing the file releases the lock

    def read(self) -> LocalState | None:
        """The state, or None where no local cluster was ever started."""
        try:
            data = self.state_file.read_bytes()
        except FileNotFoundError:
            return None
        return LocalState.from_json(data, str(self.state_file))

    def write(self, state: LocalState) -> None:
        """Replace `local.json` whole; call it holding `locked()`."""
        temporary = self.state_file.with_suffix(".json.tmp")
        with temporary.open("w") as file:
            file.write(json.dumps(state.to_json(), indent=2) + "\n")
            file.flush()
            os.fsync(file.fileno())  # else a crash may leave the new name on empty content
        os.replace(temporary, self.state_file)

    def update(self, change: Callable[[LocalState], LocalState]) -> LocalState:
        """Read, change and write the state under the lock; the new state."""
        with self.locked():
            state = self.require()
            new = change(state)
            if new != state:
                self.write(new)
            return new

    def require(self) -> LocalState:
        state = self.read()
        if state is None:
            raise BadRequest(
                f"no local cluster in {self.root} (no {STATE_FILE}): start one with "
                f"`tally local up --data-dir {self.root}`"
            )
        return state
