"""tally.failpoints itself: the spec's grammar (strict), what each action does, the
counts and chains of steps, enabling in-process, the variable read at import, and that
every known failpoint sits somewhere in the code (and nothing else does)."""

from __future__ import annotations

import asyncio
import errno
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tally
from tally import failpoints
from tally.failpoints import (
    CRASH_EXIT_CODE,
    KNOWN,
    FailpointError,
    afailpoint,
    enabled,
    failpoint,
    parse,
)

SOURCE = Path(tally.__file__).parent


def test_a_spec_enables_each_named_failpoint_with_its_steps() -> None:
    found = parse(
        " journal.write=error ; journal.fdatasync = 2*error(ENOSPC)->delay(0.25) ;"
        "index.batch=3*off->crash;;metadata.cas=off"
    )
    assert sorted(found) == ["index.batch", "journal.fdatasync", "journal.write", "metadata.cas"]
    assert [(s.action, s.count, s.errno) for s in found["journal.write"].steps] == [
        ("error", None, errno.EIO)
    ]
    steps = found["journal.fdatasync"].steps
    assert [(s.action, s.count) for s in steps] == [("error", 2), ("delay", None)]
    assert steps[0].errno == errno.ENOSPC
    assert steps[1].seconds == 0.25
    assert [(s.action, s.count) for s in found["index.batch"].steps] == [
        ("off", 3),
        ("crash", None),
    ]
    assert parse("") == {}
    assert parse(" ; ") == {}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("journal.wirte=error", "unknown failpoint 'journal.wirte'"),
        ("journal.write", "is not name=term"),
        ("journal.write=", "empty term"),
        ("journal.write=explode", "unknown action 'explode'"),
        ("journal.write=error(EWHAT)", "names no errno"),
        ("journal.write=delay", "delay needs seconds"),
        ("journal.write=delay(-1)", "delay needs seconds"),
        ("journal.write=delay(soon)", "delay needs seconds"),
        ("journal.write=crash(9)", "crash takes no argument"),
        ("journal.write=0*error", "count must be at least 1"),
        ("journal.write=error->crash", "would never apply"),
        ("journal.write=2 * error", "malformed step"),
        ("journal.write=error;journal.write=crash", "given twice"),
    ],
)
def test_a_malformed_or_unknown_spec_is_refused_naming_the_known_failpoints(
    spec: str, message: str
) -> None:
    with pytest.raises(FailpointError, match=re.escape(message)) as refused:
        parse(spec)
    if "unknown failpoint" in message or "name=term" in message:
        assert all(name in str(refused.value) for name in KNOWN)


def test_a_disabled_failpoint_does_nothing() -> None:
    assert failpoints.active() == {}
    for name in KNOWN:
        failpoint(name)
    asyncio.run(afailpoint("metadata.cas"))


def test_an_error_raises_an_os_error_naming_the_failpoint() -> None:
    with enabled("entry_log.write", "error") as point:
        with pytest.raises(OSError, match=r"failpoint entry_log\.write") as raised:
            failpoint("entry_log.write")
        assert raised.value.errno == errno.EIO
        failpoint("index.batch")  # another failpoint is not enabled by it
        assert point.hits == 1
    with (
        enabled("entry_log.write", "error(ENOSPC)"),
        pytest.raises(OSError, match="No space left") as raised,
    ):
        failpoint("entry_log.write")
    assert raised.value.errno == errno.ENOSPC
    failpoint("entry_log.write")  # off again


def test_counts_limit_a_step_and_chains_go_on_to_the_next() -> None:
    def outcomes(name: str, hits: int) -> list[str]:
        found = []
        for _ in range(hits):
            try:
                failpoint(name)
                found.append("ok")
            except OSError as error:
                found.append(errno.errorcode[error.errno or 0])
        return found

    with enabled("index.batch", "2*error") as point:
        assert outcomes("index.batch", 4) == ["EIO", "EIO", "ok", "ok"]
        assert point.hits == 4
    with enabled("index.batch", "2*off->1*error(ENOSPC)->error(EROFS)"):
        assert outcomes("index.batch", 5) == ["ok", "ok", "ENOSPC", "EROFS", "EROFS"]


def test_enabled_restores_what_was_enabled_before() -> None:
    with enabled("journal.write", "error(ENOSPC)"):
        with enabled("journal.write", "off"):
            failpoint("journal.write")
        with pytest.raises(OSError, match=r"failpoint journal\.write"):
            failpoint("journal.write")
    assert failpoints.active() == {}
    with pytest.raises(FailpointError, match="unknown failpoint"), enabled("journal", "off"):
        pass
    with pytest.raises(FailpointError, match="unknown action"), enabled("journal.write", "bang"):
        pass


def test_a_delay_sleeps_and_in_async_code_lets_the_loop_run() -> None:
    with enabled("journal.fdatasync", "delay(0.05)"):
        started = time.monotonic()
        failpoint("journal.fdatasync")
        assert time.monotonic() - started >= 0.05

    async def delayed() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        ticking = asyncio.create_task(tick())
        with enabled("metadata.cas", "1*delay(0.1)"):
            await afailpoint("metadata.cas")
            await afailpoint("metadata.cas")  # used up: no delay
        ticking.cancel()
        return ticks

    assert asyncio.run(delayed()) >= 5


def run_python(code: str, spec: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, failpoints.ENVIRONMENT_VARIABLE: spec},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_variable_is_read_at_import_and_a_crash_ends_the_process_at_once() -> None:
    code = (
        "import atexit\n"
        "from tally.failpoints import failpoint\n"
        "atexit.register(print, 'cleaned up')\n"
        "failpoint('journal.write'); failpoint('journal.write')\n"
        "print('past two hits', flush=True)\n"
        "failpoint('journal.write')\n"
        "print('not reached')\n"
    )
    crashed = run_python(code, "journal.write=2*off->crash")
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
    assert crashed.stdout == "past two hits\n", "no cleanup (atexit) after the crash"
    assert crashed.stderr == (
        f"tally failpoint journal.write: crash, exiting with {CRASH_EXIT_CODE}\n"
    )


def test_a_typo_in_the_variable_fails_the_import_loudly() -> None:
    refused = run_python("import tally.bookie.journal", "journal.fsync=crash")
    assert refused.returncode == 1
    assert "FailpointError: unknown failpoint 'journal.fsync'" in refused.stderr
    assert "journal.fdatasync" in refused.stderr


CALL = re.compile(r"failpoint\(\s*\"([^\"]+)\"")


def test_every_known_failpoint_sits_in_the_code_and_nothing_else_does() -> None:
    placed: dict[str, list[str]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        if path.name == "failpoints.py":
            continue
        for match in CALL.finditer(path.read_text()):
            name = match.group(1)
            placed.setdefault(name, []).append(str(path.relative_to(SOURCE)))
    assert set(placed) == KNOWN, {
        "unknown": sorted(set(placed) - KNOWN),
        "not placed": sorted(KNOWN - set(placed)),
    }
    assert all(len(where) == 1 for where in placed.values()), placed
