"""`tally local`, run as a user would: `up` in one shell, `status`, `stop`, `start-bookie` in
another, with real bookie processes killed for real.

Bookies get a short session timeout (TALLY_BOOKIE_SESSION_TIMEOUT, inherited through the
supervisor), so a SIGKILLed bookie's registration lapses in seconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from tally.bookie import EXIT_SESSION_LOST
from tally.cli.main import app
from tally.core.errors import BadRequest, MalformedData
from tally.local.processes import is_running, start_token
from tally.local.state import BookieSlot, LocalState, ProcessRecord, plan_bookies
from tally.local.supervisor import RestartBudget
from tests.support.polling import wait_until
from tests.support.processes import tally

SESSION_TIMEOUT = 4.0
"""Short, so a killed bookie's registration lapses soon; not so short that a bookie slowed
by a loaded machine loses its session while starting."""
WAIT = 30.0
RACKS_OF_3_ON_2 = ["/zone-1/rack-1", "/zone-1/rack-2", "/zone-1/rack-1"]


class Up:
    """`tally local up` in the background; a thread collects its output line by line."""

    def __init__(self, data_dir: Path, *args: str) -> None:
        command = [sys.executable, "-m", "tally.cli.main", "local", "up", "--data-dir"]
        self.process = subprocess.Popen(
            [*command, str(data_dir), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "TALLY_BOOKIE_SESSION_TIMEOUT": str(SESSION_TIMEOUT)},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float = WAIT) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            assert self.process.poll() is None or self._reader.is_alive(), (
                f"`local up` exited with {self.process.returncode} before printing "
                f"{text!r}:\n{self.output}"
            )
            assert time.monotonic() < deadline, f"no {text!r} in {timeout}s:\n{self.output}"
            time.sleep(0.05)

    def wait(self) -> int:
        code = self.process.wait(WAIT)
        self._reader.join(5)
        return code


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """The cluster's directory; whatever runs from it at the end is stopped."""
    root = tmp_path / "local"
    yield root
    if (root / "local.json").exists():
        in_process("local", "stop", "--data-dir", str(root))


def in_process(*args: str) -> Result:
    """The CLI run in this process: for commands that start no process, it is much faster."""
    return CliRunner().invoke(app, list(args))


def status(data_dir: Path, *, shell: bool = False) -> tuple[int, dict[str, Any]]:
    """`tally local status --json`: its exit code and report; with `shell`, in a process of
    its own, else in this one (same code, without a second or two of interpreter start)."""
    args = ("local", "status", "--json", "--data-dir", str(data_dir))
    if shell:
        result = tally(*args)
        return result.returncode, json.loads(result.stdout)
    found = in_process(*args)
    return found.exit_code, json.loads(found.stdout)


def bookie(report: dict[str, Any], index: int) -> dict[str, Any]:
    (found,) = (b for b in report["bookies"] if b["index"] == index)
    return found


def alive(pid: int) -> bool:
    return is_running(pid, None)


# --- the whole life of a local cluster ---------------------------------------------------------


def test_up_kill_restart_stop_and_up_again(data_dir: Path) -> None:
    up = Up(data_dir, "--bookies", "3", "--racks", "2")
    up.wait_for("tally local cluster ready")
    assert "(initialised now)" in up.output
    code, report = status(data_dir, shell=True)
    assert code == 0
    assert report["metadata"] == f"sqlite://{data_dir.resolve() / 'meta.db'}"
    assert report["supervisor"] == {"pid": up.process.pid, "running": True}
    assert [b["running"] for b in report["bookies"]] == [True] * 3
    assert [b["registered"] for b in report["bookies"]] == ["writable"] * 3
    assert [b["registered_rack"] for b in report["bookies"]] == RACKS_OF_3_ON_2
    assert [b["rack"] for b in report["bookies"]] == RACKS_OF_3_ON_2
    ids = [b["bookie_id"] for b in report["bookies"]]
    assert len(set(ids)) == 3
    instance_id = report["instance_id"]
    for entry in report["bookies"]:  # the summary names what serves, and it does serve
        assert entry["bookie_id"] in up.output
        assert entry["metrics_url"] in up.output
        with urllib.request.urlopen(entry["metrics_url"], timeout=5) as answer:
            assert answer.status == 200
    # The auto-recovery process serves the cluster's admin API, and is its auditor.
    auto = report["autorecovery"]
    assert auto["running"]
    assert f"admin API {auto['api_url']}/api/v1/" in up.output
    assert f"metrics   {auto['api_url']}/metrics" in up.output
    who = f"{auto['api_url']}/api/v1/autorecovery/who_is_auditor"
    with urllib.request.urlopen(who, timeout=5) as answer:
        assert json.load(answer) == {"auditor": "local-autorecovery"}
    with urllib.request.urlopen(f"{auto['api_url']}/api/v1/bookie/list", timeout=5) as answer:
        assert sorted(b["bookie_id"] for b in json.load(answer)) == sorted(
            b["bookie_id"] for b in report["bookies"]
        )

    second = tally("local", "up", "--data-dir", str(data_dir))
    assert second.returncode == 1
    assert f"already runs in {data_dir.resolve()}" in second.stderr
    assert f"supervisor pid {up.process.pid}" in second.stderr

    # A bookie dies: reported with its exit, shown down, left down.
    killed = bookie(report, 2)["pid"]
    os.kill(killed, signal.SIGKILL)
    up.wait_for(f"bookie-2 (pid {killed}) exited: killed by SIGKILL")
    assert "tally local start-bookie 2" in up.output
    assert "last lines of " in up.output
    code, report = status(data_dir)
    assert code == 0
    assert (bookie(report, 2)["running"], bookie(report, 2)["exit_code"]) == (False, -9)
    wait_until(
        lambda: bookie(status(data_dir)[1], 2)["registered"] is None,
        "the killed bookie's registration lapsing",
        timeout=WAIT,
        step=0.1,
    )
    report = status(data_dir)[1]
    assert (bookie(report, 2)["pid"], bookie(report, 2)["running"]) == (killed, False)
    assert (bookie(report, 2)["registered"], bookie(report, 3)["registered"]) == (None, "writable")

    # start-bookie brings it back: same id (so its cookie still matched), a new process.
    started = tally("local", "start-bookie", "2", "--data-dir", str(data_dir))
    assert started.returncode == 0, started.stderr
    assert "bookie-2 is back" in started.stdout
    report = status(data_dir)[1]
    back = bookie(report, 2)
    assert (back["bookie_id"], back["running"], back["registered"]) == (ids[1], True, "writable")
    assert back["pid"] != killed
    up.wait_for("bookie-2 ready")
    again = tally("local", "start-bookie", "2", "--data-dir", str(data_dir))
    assert again.returncode == 0
    assert f"already running (pid {back['pid']})" in again.stdout

    # The auto-recovery process too: reported when it dies, brought back by `start`.
    auto_pid = report["autorecovery"]["pid"]
    os.kill(auto_pid, signal.SIGKILL)
    up.wait_for(f"autorecovery (pid {auto_pid}) exited: killed by SIGKILL")
    assert "tally local start autorecovery" in up.output
    restarted = tally("local", "start", "autorecovery", "--data-dir", str(data_dir))
    assert restarted.returncode == 0, restarted.stderr
    assert "autorecovery is back" in restarted.stdout
    unknown = tally("local", "start", "bookie-9", "--data-dir", str(data_dir))
    assert unknown.returncode == 1
    assert "no process 'bookie-9'" in unknown.stderr
    report = status(data_dir)[1]
    assert report["autorecovery"]["running"]
    assert report["autorecovery"]["pid"] != auto_pid

    # stop, from another shell: everything goes, cleanly.
    pids = [b["pid"] for b in report["bookies"]] + [report["autorecovery"]["pid"]]
    stopped = tally("local", "stop", "--data-dir", str(data_dir))
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped" in stopped.stdout
    assert up.wait() == 0
    assert "SIGTERM received: stopping" in up.output
    assert not any(alive(pid) for pid in pids)
    code, report = status(data_dir)
    assert code == 1
    assert report["supervisor"]["running"] is False
    assert [(b["running"], b["exit_code"]) for b in report["bookies"]] == [(False, 0)] * 3
    assert [b["registered"] for b in report["bookies"]] == [None] * 3
    not_running = in_process("local", "status", "--data-dir", str(data_dir))
    assert not_running.exit_code == 1
    assert "not running" in not_running.stdout

    # up again: the same cluster, the same bookies (ids, racks, cookies), Ctrl-C stops it.
    up = Up(data_dir)
    up.wait_for("tally local cluster ready")
    assert f"cluster {instance_id} (existing)" in up.output
    code, report = status(data_dir)
    assert code == 0
    assert [b["bookie_id"] for b in report["bookies"]] == ids
    assert [b["registered"] for b in report["bookies"]] == ["writable"] * 3
    assert [b["registered_rack"] for b in report["bookies"]] == RACKS_OF_3_ON_2
    up.process.send_signal(signal.SIGINT)
    assert up.wait() == 0
    assert "SIGINT received: stopping" in up.output
    assert not any(alive(b["pid"]) for b in report["bookies"])


def test_bookies_of_a_killed_supervisor_are_stopped_and_a_failed_start_is_reported(
    data_dir: Path,
) -> None:
    up = Up(data_dir, "--bookies", "2", "--racks", "1")
    up.wait_for("tally local cluster ready")
    report = status(data_dir)[1]
    pids = [b["pid"] for b in report["bookies"]]
    up.process.kill()  # the supervisor alone: its bookies are in process groups of their own
    up.wait()
    assert all(alive(pid) for pid in pids)
    code, after = status(data_dir)
    assert code == 1
    assert [b["running"] for b in after["bookies"]] == [True, True]

    refused = tally("local", "up", "--data-dir", str(data_dir))
    assert refused.returncode == 1
    assert "after their supervisor died" in refused.stderr
    assert f"bookie-1 (pid {pids[0]})" in refused.stderr

    stopped = tally("local", "stop", "--data-dir", str(data_dir))
    assert stopped.returncode == 0, stopped.stderr
    assert "directly: its supervisor is gone" in stopped.stdout
    assert not any(alive(pid) for pid in pids)
    assert "nothing runs" in tally("local", "stop", "--data-dir", str(data_dir)).stdout

    # A bookie that cannot start (its port taken meanwhile) fails `up` with its log, and the
    # other bookie is stopped again rather than left behind.
    taken = report["bookies"][0]["port"]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        failed = Up(data_dir)
        assert failed.wait() == 1
    assert "bookie-1 (pid " in failed.output
    assert "exited: exit code" in failed.output
    assert "The local cluster cannot start without it." in failed.output
    assert "bookie-2 stopped (" in failed.output  # perhaps while still starting: any exit
    code, after = status(data_dir)
    assert code == 1
    assert not any(b["running"] for b in after["bookies"])


def test_a_bookie_paused_past_its_session_is_restarted_and_registers_again(
    data_dir: Path,
) -> None:
    up = Up(data_dir, "--bookies", "2", "--racks", "1")
    up.wait_for("tally local cluster ready")
    paused = bookie(status(data_dir)[1], 1)
    os.kill(paused["pid"], signal.SIGSTOP)
    try:  # paused until its lease has run out and been swept
        wait_until(
            lambda: bookie(status(data_dir)[1], 1)["registered"] is None,
            "the paused bookie's registration lapsing",
            timeout=WAIT,
            step=0.1,
        )
    finally:
        os.kill(paused["pid"], signal.SIGCONT)
    up.wait_for(
        f"bookie-1 (pid {paused['pid']}) exited: exit code {EXIT_SESSION_LOST}. It lost its "
        "metadata store session: starting it again (restart 1 of at most 3"
    )
    up.wait_for("| tally bookie: stopped: it lost its metadata store session")  # its log's end
    up.wait_for("bookie-1 starting again (pid ")

    def back() -> bool:
        now = bookie(status(data_dir)[1], 1)
        return now["running"] and now["registered"] == "writable" and now["pid"] != paused["pid"]

    wait_until(back, "the restarted bookie registered again", timeout=WAIT, step=0.1)
    up.wait_for("bookie-1 ready (pid ")
    report = status(data_dir)[1]
    assert bookie(report, 1)["bookie_id"] == paused["bookie_id"]
    assert bookie(report, 2)["registered"] == "writable"
    assert "It stays down" not in up.output


def test_automatic_restarts_are_bounded_within_a_window() -> None:
    budget = RestartBudget(limit=3, window=60.0)
    assert [budget.take("bookie-1", t) for t in (0.0, 10.0, 20.0)] == [1, 2, 3]
    assert budget.take("bookie-1", 30.0) is None  # a fault that repeats: it stays down
    assert budget.take("bookie-2", 30.0) == 1  # each process has its own budget
    assert budget.take("bookie-1", 59.9) is None
    assert budget.take("bookie-1", 60.0) == 3  # the first one has left the window
    assert budget.take("bookie-1", 61.0) is None


# --- refusals ----------------------------------------------------------------------------------


def test_commands_on_a_directory_without_a_cluster_say_how_to_start_one(tmp_path: Path) -> None:
    for command in (["status"], ["status", "--json"], ["stop"], ["start-bookie", "1"]):
        result = in_process("local", *command, "--data-dir", str(tmp_path))
        assert result.exit_code == 1, command
        assert f"no local cluster in {tmp_path}" in result.stderr
        assert "tally local up" in result.stderr


def test_up_refuses_bad_shapes_before_starting_anything(tmp_path: Path) -> None:
    result = in_process(
        "local", "up", "--bookies", "2", "--racks", "3", "--data-dir", str(tmp_path)
    )
    assert result.exit_code == 1
    assert "--racks must be between 1 and the number of bookies (2)" in result.stderr
    assert not (tmp_path / "local.json").exists()

    state = LocalState("sqlite:///x/meta.db", plan_bookies(tmp_path, 3, 2))
    (tmp_path / "local.json").write_text(json.dumps(state.to_json()))
    changed = in_process("local", "up", "--bookies", "4", "--data-dir", str(tmp_path))
    assert changed.exit_code == 1
    assert "holds a local cluster of 3 bookies on 2 racks" in changed.stderr
    assert LocalState.from_json((tmp_path / "local.json").read_bytes(), "x") == state


def test_start_bookie_needs_a_running_supervisor_and_a_known_bookie(tmp_path: Path) -> None:
    state = LocalState("sqlite:///x/meta.db", plan_bookies(tmp_path, 2, 1))
    (tmp_path / "local.json").write_text(json.dumps(state.to_json()))
    unknown = in_process("local", "start-bookie", "3", "--data-dir", str(tmp_path))
    assert unknown.exit_code == 1
    assert "no bookie 3 in this local cluster: it has bookies 1..2" in unknown.stderr
    down = in_process("local", "start-bookie", "1", "--data-dir", str(tmp_path))
    assert down.exit_code == 1
    assert "is not running: `tally local up --data-dir" in down.stderr


# --- local.json and processes ------------------------------------------------------------------


def test_plan_assigns_racks_round_robin_on_distinct_ports(tmp_path: Path) -> None:
    slots = plan_bookies(tmp_path, 5, 3)
    assert [s.rack for s in slots] == [f"/zone-1/rack-{r}" for r in (1, 2, 3, 1, 2)]
    assert [s.index for s in slots] == [1, 2, 3, 4, 5]
    ports = [p for s in slots for p in (s.port, s.metrics_port)]
    assert len(set(ports)) == 10
    assert slots[3].data_dir == tmp_path / "bookie-4"
    assert slots[3].log == tmp_path / "logs" / "bookie-4.log"
    for bookies, racks in ((0, 1), (3, 0), (2, 3)):
        with pytest.raises(BadRequest):
            plan_bookies(tmp_path, bookies, racks)


def sample_state(root: Path) -> LocalState:
    slots = plan_bookies(root, 3, 2)
    return LocalState(
        "sqlite:///data/meta.db",
        slots,
        supervisor=ProcessRecord(4242, 17),
        processes={
            "bookie-1": ProcessRecord(100, None, 5, None),
            "bookie-2": ProcessRecord(101, 99, 0, -9),
        },
        start_requests=frozenset({"bookie-2"}),
    )


def test_state_round_trips_through_json(tmp_path: Path) -> None:
    state = sample_state(tmp_path)
    data = json.dumps(state.to_json(), indent=2).encode()
    assert LocalState.from_json(data, "local.json") == state


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda d: d.pop("metadata"), "no 'metadata' field"),
        (lambda d: d.update(bookies={}), "'bookies' is not a JSON list"),
        (lambda d: d["bookies"].append(7), "bookies[3] is not an object"),
        (lambda d: d["bookies"][0].update(port="3181"), "field 'port' is not an integer"),
        (lambda d: d["bookies"][1].update(index=0), "field 'index' is 0, below 1"),
        (lambda d: d.update(processes=[]), "'processes' is not a JSON dict"),
        (lambda d: d["processes"]["bookie-1"].pop("pid"), "no 'pid' field"),
        (lambda d: d.update(supervisor="4242"), "supervisor is not an object"),
        (lambda d: d.update(start_requests=[""]), "non-string or empty item"),
        (lambda d: d.update(format=2), "newer format"),
    ],
)
def test_a_damaged_state_file_is_refused_with_what_is_wrong(
    tmp_path: Path, change: Any, complaint: str
) -> None:
    document = sample_state(tmp_path).to_json()
    change(document)
    with pytest.raises(MalformedData, match=r"local\.json") as refused:
        LocalState.from_json(json.dumps(document).encode(), "local.json")
    assert complaint in str(refused.value)


@pytest.mark.parametrize("data", [b"", b"{", b"[]", b"\xff\xfe", b'{"format": 1}'])
def test_a_state_file_that_is_not_one_is_refused(data: bytes) -> None:
    with pytest.raises(MalformedData):
        LocalState.from_json(data, "local.json")


def test_a_pid_counts_as_running_only_while_it_is_the_same_live_process() -> None:
    me = os.getpid()
    assert is_running(me, start_token(me))
    token = start_token(me)
    assert token is not None  # these tests run where /proc is
    assert not is_running(me, token + 1)  # a later process that got the pid is not it
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_until(
        lambda: not is_running(child.pid, None), "the child to end", timeout=WAIT
    )  # a zombie
    assert child.poll() == 0
    assert not is_running(child.pid, None)


def test_slot_names_what_an_operator_types(tmp_path: Path) -> None:
    slot = BookieSlot(2, 4000, 4001, "/zone-1/rack-2", tmp_path / "bookie-2", tmp_path / "l")
    assert (slot.name, slot.bookie_id) == ("bookie-2", "127.0.0.1:4000")
    assert slot.metrics_url == "http://127.0.0.1:4001/metrics"
