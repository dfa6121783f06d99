"""`tally shell`, run as an operator runs it: a subprocess against a real cluster of three
bookie processes on a sqlite store, its --json read back, its exit codes checked."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tally.client.config import ClientConfig
from tally.client.sync import SyncClient
from tally.core.ids import LedgerId
from tally.metadata.auditor_election import AuditorElection
from tally.metadata.stores import open_store
from tally.metadata.underreplication import UnderReplicationManager
from tests.support.processes import BookieProcess, init_cluster

PASSWORD = "shell password"
CLOSED_ENTRIES = [f"entry {i}".encode() for i in range(5)]
OPEN_ENTRIES = [bytes([i]) * 10 for i in range(4)]


@dataclass
class Cluster:
    uri: str
    root: Path
    bookies: list[BookieProcess]
    closed: LedgerId
    """A classic ledger with CLOSED_ENTRIES, closed."""
    open: LedgerId
    """A 128-bit ledger with OPEN_ENTRIES whose writer went away without closing it (once
    every bookie had acknowledged them, so none is left in flight)."""

    @property
    def bookie_ids(self) -> set[str]:
        return {b.address for b in self.bookies}


def shell(
    *args: str, uri: str | None, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`tally shell ARGS --metadata URI` (no --metadata when `uri` is None)."""
    variables = {k: v for k, v in os.environ.items() if k != "TALLY_METADATA"}
    variables.update({"COLUMNS": "200", **(env or {})})
    command = [sys.executable, "-m", "tally.cli.main", "shell", *args]
    if uri is not None:
        command += ["--metadata", uri]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=60, check=False, cwd=cwd, env=variables
    )


def shells(*commands: Sequence[str], uri: str) -> list[subprocess.CompletedProcess[str]]:
    """Independent commands at once, as several operators' terminals would run them."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda args: shell(*args, uri=uri), commands))


def parsed(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def ok(*args: str, uri: str | None) -> Any:
    """The JSON a successful `--json` command printed."""
    return parsed(shell(*args, "--json", uri=uri))


def _write_ledgers(uri: str) -> tuple[LedgerId, LedgerId]:
    config = ClientConfig(explicit_lac_interval=0)
    with SyncClient(uri, config=config) as client:
        closed = client.create_ledger(ensemble_size=3, write_quorum=2, ack_quorum=2,
                                      password=PASSWORD.encode())  # fmt: skip
        for data in CLOSED_ENTRIES:
            closed.append(data)
        closed.close()
        abandoned = client.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=3,
                                         password=PASSWORD.encode(), uuid=True)  # fmt: skip
        for data in OPEN_ENTRIES:
            abandoned.append(data)
        return closed.ledger_id, abandoned.ledger_id


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("shell")
    uri = init_cluster(root)
    bookies: list[BookieProcess] = []
    try:
        for index in range(3):
            bookies.append(BookieProcess(uri, root / f"bookie{index}").start())
        closed, abandoned = _write_ledgers(uri)
        yield Cluster(uri, root, bookies, closed, abandoned)
    finally:
        for bookie in bookies:
            bookie.kill()


# --- help and the store ---------------------------------------------------------------------


def test_the_help_documents_the_exit_codes() -> None:
    result = shell("--help", uri=None)
    assert result.returncode == 0
    assert "Exit codes" in result.stdout
    for line in ("0  done", "1  the operation failed", "2  bad usage", "3  not found",
                 "4  the metadata store"):  # fmt: skip
        assert line in result.stdout
    assert "tally cluster init" in result.stdout


def test_without_a_cluster_the_exit_code_is_4_and_names_cluster_init(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    with ThreadPoolExecutor(2) as pool:
        default = pool.submit(shell, "listbookies", uri=None, cwd=tmp_path)
        uninitialised = pool.submit(shell, "listledgers", uri=f"sqlite://{empty}")
    assert default.result().returncode == 4
    expected = f"tally cluster init --metadata sqlite://{tmp_path.resolve()}/.tally/meta.db"
    assert expected in default.result().stderr
    assert not (tmp_path / ".tally").exists(), "the shell created a store where there was none"
    assert uninitialised.result().returncode == 4
    assert "holds no tally cluster" in uninitialised.result().stderr
    assert "tally cluster init" in uninitialised.result().stderr


def test_the_store_comes_from_tally_metadata_or_the_local_cluster(
    cluster: Cluster, tmp_path: Path
) -> None:
    (tmp_path / ".tally").mkdir()
    init_cluster(tmp_path / ".tally")
    with ThreadPoolExecutor(2) as pool:
        from_env = pool.submit(
            shell, "listbookies", "--json", uri=None, env={"TALLY_METADATA": cluster.uri}
        )
        local = pool.submit(shell, "listbookies", "--json", uri=None, cwd=tmp_path)
    assert {b["bookie_id"] for b in parsed(from_env.result())} == cluster.bookie_ids
    assert parsed(local.result()) == []


# --- bookies --------------------------------------------------------------------------------


def test_listbookies_and_bookieinfo(cluster: Cluster) -> None:
    bookie = cluster.bookies[0]
    listed, read_only, table, info, stranger = shells(
        ("listbookies", "--json"),
        ("listbookies", "--readonly", "--json"),
        ("listbookies",),
        ("bookieinfo", bookie.address, "--json"),
        ("bookieinfo", "127.0.0.1:1"),
        uri=cluster.uri,
    )
    views = parsed(listed)
    assert [v["bookie_id"] for v in views] == sorted(cluster.bookie_ids)
    assert {v["state"] for v in views} == {"writable"}
    assert all(v["address"] == v["bookie_id"] and v["version"] for v in views)
    assert (read_only.returncode, read_only.stdout.strip()) == (0, "[]")
    assert table.returncode == 0
    assert all(b in table.stdout for b in cluster.bookie_ids)

    details = parsed(info)
    assert (details["state"], details["address"]) == ("writable", bookie.address)
    directories = [str(bookie.data_dir / "journal"), str(bookie.data_dir / "ledgers")]
    assert details["directories"] == directories
    assert len(details["incarnation_id"]) == 32
    assert details["connect_ms"] is not None
    assert stranger.returncode == 3
    assert "not registered and has no cookie" in stranger.stderr


def test_cookie_get_and_a_guarded_delete(cluster: Cluster) -> None:
    running = cluster.bookies[1].address
    got, unforced, refused = shells(
        ("cookie", "get", running, "--json"),
        ("cookie", "delete", running),
        ("cookie", "delete", running, "--force"),
        uri=cluster.uri,
    )
    cookie = parsed(got)
    assert cookie["bookie_id"] == running
    assert cookie["directories"][0].endswith("journal")
    assert unforced.returncode == 2
    assert refused.returncode == 1
    assert "stop it" in refused.stderr
    assert ok("cookie", "get", running, uri=cluster.uri) == cookie

    retired = BookieProcess(cluster.uri, cluster.root / "retired").start()
    assert retired.stop() == 0
    states = {v["bookie_id"]: v["state"] for v in ok("listbookies", "--all", uri=cluster.uri)}
    assert states[retired.address] == "down"
    assert shell("cookie", "delete", retired.address, "--force", uri=cluster.uri).returncode == 0
    gone, again = shells(
        ("cookie", "get", retired.address), ("cookie", "delete", retired.address, "--force"),
        uri=cluster.uri,
    )  # fmt: skip
    assert (gone.returncode, again.returncode) == (3, 3)
    assert "has no cookie" in gone.stderr


# --- ledgers --------------------------------------------------------------------------------


def test_ledgermetadata_and_listledgers(cluster: Cluster) -> None:
    by_id, by_name, scoped, listed, missing, malformed = shells(
        ("ledgermetadata", str(cluster.closed.id), "--json"),
        ("ledgermetadata", cluster.closed.qualified_name, "--json"),
        ("ledgermetadata", cluster.open.qualified_name, "--json"),
        ("listledgers", "--json"),
        ("ledgermetadata", "987654"),
        ("ledgermetadata", "not-a-ledger"),
        uri=cluster.uri,
    )
    view = parsed(by_id)
    assert parsed(by_name) == view
    assert view["ledger_id"] == str(cluster.closed)
    assert (view["state"], view["last_entry_id"]) == ("CLOSED", len(CLOSED_ENTRIES) - 1)
    assert view["length"] == sum(map(len, CLOSED_ENTRIES))
    (segment,) = view["segments"]
    assert segment["first_entry_id"] == 0
    assert set(segment["ensemble"]) == cluster.bookie_ids
    assert "password" not in json.dumps(view)
    other = parsed(scoped)
    assert other["qualified_name"] == cluster.open.qualified_name
    assert (other["ensemble_size"], other["write_quorum"], other["ack_quorum"]) == (3, 3, 3)

    names = [v["qualified_name"] for v in parsed(listed)]
    assert names == sorted(names)
    assert {cluster.closed.qualified_name, cluster.open.qualified_name} <= set(names)

    assert missing.returncode == 3
    assert "ledger 987654 has no metadata" in missing.stderr
    assert malformed.returncode == 2
    assert "32 lowercase hex digits" in malformed.stderr
    assert "Traceback" not in missing.stderr + malformed.stderr


def test_readledger(cluster: Cluster) -> None:
    ledger = str(cluster.closed.id)
    every, some, wrong, beyond = shells(
        ("readledger", ledger, "--password", PASSWORD, "--json"),
        ("readledger", cluster.closed.qualified_name, "--first", "1", "--last", "2",
         "--password", PASSWORD),
        ("readledger", ledger, "--password", "nope"),
        ("readledger", ledger, "--last", "99", "--password", PASSWORD),
        uri=cluster.uri,
    )  # fmt: skip
    assert every.returncode == 0, every.stderr
    lines = [json.loads(line) for line in every.stdout.splitlines()]
    assert [line["entry_id"] for line in lines] == list(range(len(CLOSED_ENTRIES)))
    assert [base64.b64decode(line["data_base64"]) for line in lines] == CLOSED_ENTRIES
    assert [line["size"] for line in lines] == [len(e) for e in CLOSED_ENTRIES]
    assert some.returncode == 0, some.stderr
    shown = [f"entry {i}" in some.stdout for i in range(len(CLOSED_ENTRIES))]
    assert shown == [False, True, True, False, False]
    assert wrong.returncode == 1
    assert "password" in wrong.stderr
    assert beyond.returncode == 2
    assert "past its last entry 4" in beyond.stderr


def test_recover_closes_an_abandoned_ledger(cluster: Cluster) -> None:
    name = cluster.open.qualified_name
    assert ok("ledgermetadata", name, uri=cluster.uri)["state"] == "OPEN"
    recovered = ok("recover", name, "--password", PASSWORD, uri=cluster.uri)
    assert recovered["state_before"] == "OPEN"
    assert recovered["state"] == "CLOSED"
    assert recovered["last_entry_id"] == len(OPEN_ENTRIES) - 1
    assert recovered["length"] == sum(map(len, OPEN_ENTRIES))
    after, again = shells(
        ("ledgermetadata", name, "--json"), ("recover", name, "--password", PASSWORD),
        uri=cluster.uri,
    )  # fmt: skip
    assert (parsed(after)["state"], parsed(after)["last_entry_id"]) == ("CLOSED", 3)
    assert again.returncode == 0
    assert "already closed" in again.stdout


def test_simpletest_writes_verifies_and_deletes(cluster: Cluster) -> None:
    passed, impossible = shells(
        ("simpletest", "--entries", "300", "--entry-size", "100", "-e", "3", "-w", "3", "-a", "2",
         "--json"),
        ("simpletest", "-e", "2", "-w", "3", "-a", "2"),
        uri=cluster.uri,
    )  # fmt: skip
    summary = parsed(passed)
    assert (summary["verified"], summary["deleted"]) == (True, True)
    assert summary["entries"] == 300
    assert set(summary["ensemble"]) == cluster.bookie_ids
    assert impossible.returncode == 2
    assert "Traceback" not in impossible.stderr
    assert ok("ledgermetadata", summary["ledger_id"], uri=cluster.uri)["state"] == "DELETED"


def cluster_command(*args: str, uri: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tally.cli.main", "cluster", *args, "--metadata", uri]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_deleteledger_soft_deletes_and_undeleteledger_restores(cluster: Cluster) -> None:
    with SyncClient(cluster.uri) as client:
        writer = client.create_ledger(password=b"x")
        writer.append(b"doomed")
        left_open = client.create_ledger(password=b"x")
        left_open.append(b"still open")
        writer.close()
        ledger = writer.ledger_id
    before = ok("ledgermetadata", str(ledger), uri=cluster.uri)
    refused = shell("deleteledger", str(left_open.ledger_id), uri=cluster.uri)
    assert refused.returncode == 1
    assert "is OPEN" in refused.stderr
    assert "--force" in refused.stderr or "force" in refused.stderr
    deleted = shell("deleteledger", ledger.qualified_name, "--reason", "trimmed", uri=cluster.uri)
    assert deleted.returncode == 0, deleted.stderr
    assert "undeleteledger" in deleted.stdout
    assert "every entry on its 2 bookies" in deleted.stdout
    shown = ok("ledgermetadata", str(ledger), uri=cluster.uri)
    assert shown["state"] == "DELETED"
    assert shown["deletion"]["reason"] == "trimmed"
    unreadable = shell("readledger", str(ledger), "--password", "x", uri=cluster.uri)
    assert unreadable.returncode == 3
    assert "was deleted" in unreadable.stderr
    restored = shell("undeleteledger", str(ledger), uri=cluster.uri)
    assert restored.returncode == 0, restored.stderr
    after = ok("ledgermetadata", str(ledger), uri=cluster.uri)
    assert after.pop("metadata_version") == before.pop("metadata_version") + 2
    assert after.pop("undeleted_ms") > shown["deletion"]["time_ms"]
    before.pop("undeleted_ms")
    assert after == before
    forced = ok("deleteledger", str(left_open.ledger_id), "--force", uri=cluster.uri)
    assert forced["deletion"]["detail"].startswith("every entry")
    assert ok("ledgermetadata", str(left_open.ledger_id), uri=cluster.uri)["last_entry_id"] == 0


def test_deleteledger_with_retention_zero_and_archival_required(cluster: Cluster) -> None:
    with SyncClient(cluster.uri) as client:
        writer = client.create_ledger(password=b"x")
        writer.append(b"archived elsewhere")
        writer.close()
        ledger = str(writer.ledger_id)
    changed = cluster_command(
        "settings",
        "--set",
        "ledger_delete_retention=0",
        "--set",
        "delete_requires_archival=true",
        "--json",
        uri=cluster.uri,
    )
    try:
        assert changed.returncode == 0, changed.stderr
        shown = json.loads(changed.stdout)
        assert (shown["ledger_delete_retention"], shown["delete_requires_archival"]) == (0, True)
        refused = shell("deleteledger", ledger, uri=cluster.uri)
        assert refused.returncode == 1
        assert "setarchived" in refused.stderr
        archived = shell("setarchived", ledger, uri=cluster.uri)
        assert archived.stdout.strip() == f"ledger {ledger} is now archived"
        deleted = shell("deleteledger", ledger, uri=cluster.uri)
        assert deleted.returncode == 0, deleted.stderr
        assert "tombstone is written" in deleted.stdout
        gone, late = shells(("ledgermetadata", ledger), ("undeleteledger", ledger), uri=cluster.uri)
        assert (gone.returncode, late.returncode) == (3, 3)
        assert "past its retention" in late.stderr
        bad = cluster_command("settings", "--set", "tombstone_retention=soon", uri=cluster.uri)
        assert bad.returncode == 1
        assert "tombstone_retention" in bad.stderr
        assert "Traceback" not in bad.stderr
    finally:
        restored = cluster_command(
            "settings",
            "--set",
            "ledger_delete_retention=86400",
            "--set",
            "delete_requires_archival=false",
            uri=cluster.uri,
        )
        assert restored.returncode == 0, restored.stderr


# --- auto-recovery settings -----------------------------------------------------------------


def test_whoisauditor_names_the_elected_candidate(cluster: Cluster) -> None:
    candidate = cluster.bookies[2].address

    async def ask_before_and_while_elected() -> tuple[Any, Any]:
        before = await asyncio.to_thread(ok, "whoisauditor", uri=cluster.uri)
        async with open_store(cluster.uri) as store:
            election = AuditorElection(store, candidate)
            await election.start()
            try:
                assert election.elected.is_set()
                return before, await asyncio.to_thread(ok, "whoisauditor", uri=cluster.uri)
            finally:
                await election.stop()

    before, during = asyncio.run(ask_before_and_while_elected())
    assert before == {"auditor": None}
    assert during == {"auditor": candidate}


def test_listunderreplicated_and_lostbookierecoverydelay(cluster: Cluster) -> None:
    lost, other = cluster.bookies[0].address, cluster.bookies[1].address
    empty, unset, negative = shells(
        ("listunderreplicated", "--json"),
        ("lostbookierecoverydelay", "get", "--json"),
        ("lostbookierecoverydelay", "set", "--metadata", cluster.uri, "--", "-1"),
        uri=cluster.uri,
    )
    assert (empty.returncode, empty.stdout.strip()) == (0, "[]")
    assert parsed(unset) == {"seconds": None}
    assert negative.returncode == 2
    assert "greater than or equal to 0" in negative.stderr

    async def mark() -> int | None:
        async with open_store(cluster.uri) as store:
            manager = UnderReplicationManager(store)
            await manager.mark_under_replicated(cluster.closed, [lost])
            return await manager.lost_bookie_recovery_delay()

    changed = shell("lostbookierecoverydelay", "set", "45", uri=cluster.uri)
    assert changed.returncode == 0, changed.stderr
    assert asyncio.run(mark()) == 45
    marked, mine, others, delay = shells(
        ("listunderreplicated", "--json"),
        ("listunderreplicated", "--missing-bookie", lost, "--json"),
        ("listunderreplicated", "--missing-bookie", other, "--json"),
        ("lostbookierecoverydelay", "get", "--json"),
        uri=cluster.uri,
    )
    (mark_view,) = parsed(marked)
    assert mark_view["ledger_id"] == str(cluster.closed)
    assert mark_view["missing_bookies"] == [lost]
    assert parsed(mine) == [mark_view]
    assert parsed(others) == []
    assert parsed(delay) == {"seconds": 45}


def test_triggeraudit_needs_an_auditor_then_requests_an_audit(cluster: Cluster) -> None:
    refused = shell("triggeraudit", uri=cluster.uri)
    assert refused.returncode == 4
    assert "no auditor is elected" in refused.stderr

    async def trigger_while_elected() -> tuple[Any, int | None]:
        async with open_store(cluster.uri) as store:
            election = AuditorElection(store, "auditor-under-test")
            await election.start()
            try:
                answer = await asyncio.to_thread(ok, "triggeraudit", uri=cluster.uri)
                requested = await _requested_ms(store)
                return answer, requested
            finally:
                await election.stop()

    answer, requested = asyncio.run(trigger_while_elected())
    assert answer["auditor"] == "auditor-under-test"
    assert requested == answer["requested_ms"]


async def _requested_ms(store: Any) -> int | None:
    requests: list[int | None] = []
    watcher = await UnderReplicationManager(store).watch_audit_requests(requests.append)
    watcher.cancel()
    return requests[0]


def test_listunderreplicated_lost_shows_the_lost_entries_list(cluster: Cluster) -> None:
    empty = shell("listunderreplicated", "--lost", "--json", uri=cluster.uri)
    assert (empty.returncode, empty.stdout.strip()) == (0, "[]")

    async def record() -> None:
        async with open_store(cluster.uri) as store:
            await UnderReplicationManager(store).record_lost_entries(
                cluster.closed, [(2, 4)], "no copy of 2-4 anywhere", mark_version=0, now_ms=7
            )

    asyncio.run(record())
    listed, table = shells(
        ("listunderreplicated", "--lost", "--json"),
        ("listunderreplicated", "--lost"),
        uri=cluster.uri,
    )
    assert parsed(listed) == [
        {
            "ledger_id": str(cluster.closed),
            "qualified_name": cluster.closed.qualified_name,
            "entries": [[2, 4]],
            "reason": "no copy of 2-4 anywhere",
            "recorded_ms": 7,
        }
    ]
    assert table.returncode == 0
    assert "2-4" in table.stdout
    assert "no copy of 2-4 anywhere" in table.stdout
